"""Reading one planned range of one queue of a RocketMQ cluster on an executor: PULL_MESSAGE by
offset in large pulls, each answer's body (CommitLog records) turned into Arrow by the store's
vectorized record reader (:func:`rmq_spark.store.pulled.records_arrow`).

* Filters: ``tags`` are filtered by the broker (the subscription expression) and checked again
  here on the tag strings (the broker compares tag hash codes, as the Java client re-checks);
  ``sql`` by the broker when it has SQL92 filtering on (Apache's ``enablePropertyFilter``),
  else here on the properties column.
* Data loss (``failOnDataLoss``): a range that starts below the queue's first offset, or ends
  past its last, fails naming the queue; with false, what is gone is skipped.
* A broker that does not answer is asked again with backoff (its address taken from the routes
  again, it may have come back elsewhere) until ``brokerUnavailableTimeout``, then the error
  names the broker, its address and the range.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

from rmq_spark.cluster import BrokerUnreachableError, ClusterClient, ClusterError, Credentials
from rmq_spark.cluster.namespace import unwrap
from rmq_spark.cluster.tls import TlsConfig
from rmq_spark.datasource.read.partition import DataLossError, filters_for
from rmq_spark.remoting.codes import ResponseCode

log = logging.getLogger("rmq_spark.datasource.cluster")

_clients: dict[tuple[str, Credentials | None, TlsConfig | None], ClusterClient] = {}  # per process
_no_sql92: set[str] = set()  # brokers (by address) that refused SQL92 filtering


@dataclass(frozen=True)
class ClusterReadContext:
    namesrv_addr: str
    group: str
    tags: str | None = None
    sql: str | None = None
    fail_on_data_loss: bool = True
    avro_schema: str | None = None
    pull_batch_size: int = 1024
    unavailable_timeout_ms: int = 300_000
    credentials: Credentials | None = None  # every request signed (accessKey / secretKey)
    namespace: str | None = None  # topics are read as ``namespace%topic``; rows show ``topic``
    tls: TlsConfig | None = None  # every connection speaks TLS (option tls=true)


@dataclass
class ClusterRange(InputPartition):
    topic: str
    broker: str
    queue_id: int
    start: int
    end: int
    ctx: ClusterReadContext


def split_cluster_range(
    topic: str,
    broker: str,
    queue_id: int,
    start: int,
    end: int,
    ctx: ClusterReadContext,
    max_rows: int,
) -> list[ClusterRange]:
    out = []
    pos = start
    while pos < end:
        stop = min(end, pos + max_rows)
        out.append(ClusterRange(topic, broker, queue_id, pos, stop, ctx))
        pos = stop
    return out


def client_for(
    namesrv_addr: str, credentials: Credentials | None = None, tls: TlsConfig | None = None
) -> ClusterClient:
    """This process's client of a cluster, one per NameServer list, credentials and TLS."""
    key = (namesrv_addr, credentials, tls)
    c = _clients.get(key)
    if c is None:
        c = _clients[key] = ClusterClient(namesrv_addr, credentials=credentials, tls=tls)
    return c


def _sql92_refused(e: ClusterError) -> bool:
    return (e.code == ResponseCode.SYSTEM_ERROR and "SQL92" in (e.remark or "")) or (
        e.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        and "not support" in (e.remark or "").lower()
    )


class _Reader:
    """The pulls of one range: sequential where the broker filters (offsets have gaps), else
    pipelined (``PIPELINE_DEPTH`` pulls in flight on the broker's connection, each asking the
    window the one before ends at); either way the bodies come out in offset order."""

    def __init__(self, p: ClusterRange) -> None:
        self.p = p
        self.ctx = p.ctx
        self.client = client_for(p.ctx.namesrv_addr, p.ctx.credentials, p.ctx.tls)
        self.where = f"queue {p.topic}/{p.broker}/{p.queue_id}"
        self.sql_on_broker = False

    def _expression(self) -> tuple[str, str]:
        ctx = self.ctx
        self.sql_on_broker = (
            ctx.sql is not None
            and (self.client.broker_addr_or_none(self.p.broker) or "") not in _no_sql92
        )
        if self.sql_on_broker:
            return ctx.sql or "", "SQL92"
        return ctx.tags or "*", "TAG"

    def sequential(self, offset: int, end: int) -> Iterator[bytes]:
        """Bodies of ``[offset, end)``, one pull after the other, with the retries and checks."""
        p, ctx, client = self.p, self.ctx, self.client
        down_since: float | None = None
        behind_since: float | None = None  # reading a slave that is behind the planned end
        delay = 0.2
        while offset < end:
            expr, etype = self._expression()
            try:
                r = client.pull(
                    p.broker,
                    p.topic,
                    p.queue_id,
                    offset,
                    min(ctx.pull_batch_size, end - offset),
                    ctx.group,
                    expression=expr or "*",
                    expression_type=etype,
                )
            except ClusterError as e:
                # no answer; or SYSTEM_BUSY: the broker's flow control, or a slave that does not
                # serve reads (Apache's slaveReadEnable=false) while its master is down
                if isinstance(e, BrokerUnreachableError) or e.code == ResponseCode.SYSTEM_BUSY:
                    now = time.monotonic()
                    down_since = down_since or now
                    if now - down_since > ctx.unavailable_timeout_ms / 1000:
                        what = "answer" if isinstance(e, BrokerUnreachableError) else "serve reads"
                        raise ClusterError(
                            f"broker {p.broker} did not {what} for {ctx.unavailable_timeout_ms / 1000:g}s "
                            f"(option brokerUnavailableTimeout) while reading offsets {offset}..{end - 1} of "
                            f"{self.where}: {e}",
                            broker=p.broker,
                            addr=e.addr,
                            request=e.request,
                        ) from None
                    if e.code == ResponseCode.SYSTEM_BUSY and client.reads_from_slave(p.broker):
                        client.forget_broker(p.broker)  # the master may be back: routes again
                    time.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                if self.sql_on_broker and _sql92_refused(e):
                    _no_sql92.add(client.broker_addr_or_none(p.broker) or p.broker)
                    log.info(
                        "broker %s does not filter by SQL92: filtering on the executor", p.broker
                    )
                    continue
                raise
            down_since, delay = None, 0.2
            if r.code in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY):
                if r.next_begin_offset <= offset:
                    raise ClusterError(
                        f"PULL_MESSAGE of {self.where} at {offset} made no progress "
                        f"(nextBeginOffset {r.next_begin_offset})",
                        broker=p.broker,
                    )
                offset = r.next_begin_offset
                if r.body:
                    yield r.body
            elif offset < r.min_offset:  # PULL_OFFSET_MOVED below the queue's start: deleted
                if ctx.fail_on_data_loss:
                    raise DataLossError(
                        f"offsets {offset}..{r.min_offset - 1} of {self.where} are no longer on broker {p.broker} "
                        f"(the queue now starts at {r.min_offset}); set failOnDataLoss=false to skip them"
                    )
                offset = r.min_offset
            else:  # PULL_NOT_FOUND / PULL_OFFSET_MOVED at or past the queue's end
                if r.max_offset >= end:
                    time.sleep(0.05)  # not visible yet (a ConsumeQueue being dispatched): ask again
                    continue
                if client.reads_from_slave(p.broker):
                    # a slave behind the end its master gave the plan: wait for it to catch up,
                    # or for the master to be back in the routes
                    now = time.monotonic()
                    behind_since = behind_since or now
                    if now - behind_since <= ctx.unavailable_timeout_ms / 1000:
                        client.forget_broker(p.broker)
                        time.sleep(delay)
                        delay = min(delay * 2, 5.0)
                        continue
                if ctx.fail_on_data_loss:
                    raise DataLossError(
                        f"{self.where} ends at offset {r.max_offset} on broker {p.broker}, below the planned {end}: "
                        "the broker lost messages (or was replaced); set failOnDataLoss=false to continue"
                    )
                return

    def pipelined(self) -> Iterator[bytes]:
        """Bodies of the whole range with ``PIPELINE_DEPTH`` pulls in flight on a channel of this
        reader's own; an answer short of its window has the rest read by :meth:`sequential`, and
        a channel that fails hands the window to :meth:`sequential` (its retries) and is opened
        again for the rest."""
        from collections import deque

        from rmq_spark.cluster.channel import PullChannel

        p, ctx, client = self.p, self.ctx, self.client
        offset, end = p.start, p.end
        step = ctx.pull_batch_size
        learned = False
        while offset < end:
            try:
                ch = PullChannel(
                    client.read_addr(p.broker, p.topic),
                    p.broker,
                    p.topic,
                    p.queue_id,
                    ctx.group,
                    timeout_s=client.timeout_s,
                    credentials=ctx.credentials,
                    tls=ctx.tls,
                )
            except ClusterError:
                stop = min(end, offset + step)
                yield from self.sequential(offset, stop)  # waits for the broker, or fails naming it
                offset = stop
                continue
            pending: deque[tuple[int, int, int]] = deque()
            issue = offset
            try:
                while offset < end:
                    depth = (
                        PIPELINE_DEPTH if learned else 1
                    )  # the first answer tells the broker's cap
                    while issue < end and len(pending) < depth:
                        stop = min(end, issue + step)
                        pending.append((issue, stop, ch.send(issue, stop - issue)))
                        issue = stop
                    a, b, ticket = pending.popleft()
                    r = ch.result(ticket)
                    if r.code == ResponseCode.SUCCESS and r.next_begin_offset > a:
                        if not learned:
                            learned = True
                            step = (
                                min(step, r.next_begin_offset - a)
                                if r.next_begin_offset < b
                                else step
                            )
                        yield r.body
                        if r.next_begin_offset < b:
                            yield from self.sequential(r.next_begin_offset, b)
                    else:
                        yield from self.sequential(a, b)
                    offset = b
            except ClusterError:
                pass  # the window at ``offset`` and later: read again, sequentially first
            finally:
                ch.close()
            if offset < end:
                stop = min(end, offset + step)
                yield from self.sequential(offset, stop)
                offset = stop


PIPELINE_DEPTH = 32
COALESCE_BYTES = 4 << 20  # bodies parsed together: one Arrow batch per ~4 MiB


def read_cluster_range(p: ClusterRange) -> Iterator[Any]:
    """The rows of ``p`` as Arrow record batches of the store's MESSAGE_SCHEMA (no brokerName)."""
    import pyarrow.compute as pc

    from rmq_spark.store.pulled import records_arrow

    if p.end <= p.start:
        return
    ctx = p.ctx
    tag_filter, sql_filter = filters_for(ctx.tags, ctx.sql) if ctx.tags or ctx.sql else (None, None)
    reader = _Reader(p)
    bodies = reader.sequential(p.start, p.end) if ctx.tags or ctx.sql else reader.pipelined()

    def parse(chunks: list[bytes]) -> Any:
        batch = records_arrow(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        qo = batch.column("queueOffset")
        if batch.num_rows and int(pc.max(qo).as_py()) >= p.end:
            batch = batch.filter(pc.less(qo, p.end))
        if tag_filter is not None:  # the broker compared hash codes: check the tags themselves
            batch = batch.filter(tag_filter.mask(batch.column("tags")))
        if sql_filter is not None and not reader.sql_on_broker:
            batch = batch.filter(sql_filter.mask(batch.column("properties")))
        return batch

    chunks: list[bytes] = []
    size = 0
    for body in bodies:
        chunks.append(body)
        size += len(body)
        if size >= COALESCE_BYTES:
            batch = parse(chunks)
            chunks, size = [], 0
            if batch.num_rows:
                yield batch
    if chunks:
        batch = parse(chunks)
        if batch.num_rows:
            yield batch


def read_rows(p: ClusterRange, arrow_schema: Any) -> Iterator[Any]:
    """The rows of ``p`` in exactly the Spark schema: ``brokerName`` added (and Avro's ``value``)."""
    import pyarrow as pa

    if p.end <= p.start:
        return
    avro = None
    if p.ctx.avro_schema is not None:
        from rmq_spark.datasource.avro import decode_bodies, parse_avro_schema

        avro = parse_avro_schema(p.ctx.avro_schema)
    shown = unwrap(p.ctx.namespace, p.topic)  # the topic as the application names it
    for batch in read_cluster_range(p):
        broker = pa.repeat(pa.scalar(p.broker, pa.string()), batch.num_rows)
        columns, names = [*batch.columns, broker], [*batch.schema.names, "brokerName"]
        if shown != p.topic:
            i = names.index("topic")
            columns[i] = pa.repeat(pa.scalar(shown, pa.string()), batch.num_rows)
        if avro is not None:
            value = decode_bodies(
                batch.column("body"),
                avro,
                arrow_schema.field("value").type,
                f"{p.topic}/{p.broker}/{p.queue_id}",
            )
            columns, names = [*columns, value], [*names, "value"]
        out = pa.RecordBatch.from_arrays(columns, names=names)
        yield out if out.schema.equals(arrow_schema) else out.cast(arrow_schema)
