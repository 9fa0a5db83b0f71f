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

from rmq_spark.cluster import BrokerUnreachableError, ClusterClient, ClusterError
from rmq_spark.datasource.read.partition import DataLossError, filters_for
from rmq_spark.remoting.codes import ResponseCode

log = logging.getLogger("rmq_spark.datasource.cluster")

_clients: dict[str, ClusterClient] = {}  # per executor process, by NameServer list
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


@dataclass
class ClusterRange(InputPartition):
    topic: str
    broker: str
    queue_id: int
    start: int
    end: int
    ctx: ClusterReadContext


def split_cluster_range(topic: str, broker: str, queue_id: int, start: int, end: int, ctx: ClusterReadContext,
                        max_rows: int) -> list[ClusterRange]:
    out = []
    pos = start
    while pos < end:
        stop = min(end, pos + max_rows)
        out.append(ClusterRange(topic, broker, queue_id, pos, stop, ctx))
        pos = stop
    return out


def client_for(namesrv_addr: str) -> ClusterClient:
    c = _clients.get(namesrv_addr)
    if c is None:
        c = _clients[namesrv_addr] = ClusterClient(namesrv_addr)
    return c


def _sql92_refused(e: ClusterError) -> bool:
    return e.code == ResponseCode.SYSTEM_ERROR and "SQL92" in (e.remark or "") or \
        e.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "not support" in (e.remark or "").lower()


def read_cluster_range(p: ClusterRange) -> Iterator[Any]:
    """The rows of ``p`` as Arrow record batches of the store's MESSAGE_SCHEMA (no brokerName)."""
    import pyarrow.compute as pc

    from rmq_spark.store.pulled import records_arrow

    ctx = p.ctx
    client = client_for(ctx.namesrv_addr)
    tag_filter, sql_filter = filters_for(ctx.tags, ctx.sql)
    where = f"queue {p.topic}/{p.broker}/{p.queue_id}"
    offset = p.start
    down_since: float | None = None
    delay = 0.2
    while offset < p.end:
        on_broker_sql = ctx.sql is not None and client.broker_addr_or_none(p.broker) not in _no_sql92
        if on_broker_sql:
            expr, etype = ctx.sql, "SQL92"
        else:
            expr, etype = ctx.tags or "*", "TAG"
        try:
            r = client.pull(p.broker, p.topic, p.queue_id, offset, min(ctx.pull_batch_size, p.end - offset), ctx.group,
                            expression=expr or "*", expression_type=etype)
        except BrokerUnreachableError as e:
            now = time.monotonic()
            down_since = down_since or now
            if now - down_since > ctx.unavailable_timeout_ms / 1000:
                raise ClusterError(
                    f"broker {p.broker} did not answer for {ctx.unavailable_timeout_ms / 1000:g}s (option "
                    f"brokerUnavailableTimeout) while reading offsets {offset}..{p.end - 1} of {where}: {e}",
                    broker=p.broker, addr=e.addr, request=e.request) from None
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
            continue
        except ClusterError as e:
            if on_broker_sql and _sql92_refused(e):
                _no_sql92.add(client.broker_addr_or_none(p.broker) or p.broker)
                log.info("broker %s does not filter by SQL92: filtering on the executor", p.broker)
                continue
            raise
        down_since, delay = None, 0.2
        if r.code == ResponseCode.SUCCESS:
            batch = records_arrow(r.body)
            qo = batch.column("queueOffset")
            if batch.num_rows and int(pc.max(qo).as_py()) >= p.end:
                batch = batch.filter(pc.less(qo, p.end))
            if tag_filter is not None:
                batch = batch.filter(tag_filter.mask(batch.column("tags")))
            if sql_filter is not None and not on_broker_sql:
                batch = batch.filter(sql_filter.mask(batch.column("properties")))
            if r.next_begin_offset <= offset:
                raise ClusterError(f"PULL_MESSAGE of {where} at {offset} made no progress "
                                   f"(nextBeginOffset {r.next_begin_offset})", broker=p.broker)
            offset = r.next_begin_offset
            if batch.num_rows:
                yield batch
        elif r.code == ResponseCode.PULL_RETRY_IMMEDIATELY:  # all filtered out: the broker moved on
            if r.next_begin_offset <= offset:
                raise ClusterError(f"PULL_MESSAGE of {where} at {offset} made no progress", broker=p.broker)
            offset = r.next_begin_offset
        elif offset < r.min_offset:  # PULL_OFFSET_MOVED below the queue's start: deleted
            if ctx.fail_on_data_loss:
                raise DataLossError(
                    f"offsets {offset}..{r.min_offset - 1} of {where} are no longer on broker {p.broker} (the queue "
                    f"now starts at {r.min_offset}); set failOnDataLoss=false to skip them")
            offset = r.min_offset
        else:  # PULL_NOT_FOUND / PULL_OFFSET_MOVED at or past the queue's end: planned offsets are gone
            if r.max_offset >= p.end:
                continue  # not visible yet (a ConsumeQueue being dispatched): ask again
            if ctx.fail_on_data_loss:
                raise DataLossError(
                    f"{where} ends at offset {r.max_offset} on broker {p.broker}, below the planned {p.end}: the "
                    "broker lost messages (or was replaced); set failOnDataLoss=false to continue")
            return


def read_rows(p: ClusterRange, arrow_schema: Any) -> Iterator[Any]:
    """The rows of ``p`` in exactly the Spark schema: ``brokerName`` added (and Avro's ``value``)."""
    import pyarrow as pa

    if p.end <= p.start:
        return
    avro = None
    if p.ctx.avro_schema is not None:
        from rmq_spark.datasource.avro import decode_bodies, parse_avro_schema

        avro = parse_avro_schema(p.ctx.avro_schema)
    for batch in read_cluster_range(p):
        broker = pa.repeat(pa.scalar(p.broker, pa.string()), batch.num_rows)
        columns, names = [*batch.columns, broker], [*batch.schema.names, "brokerName"]
        if avro is not None:
            value = decode_bodies(batch.column("body"), avro, arrow_schema.field("value").type,
                                  f"{p.topic}/{p.broker}/{p.queue_id}")
            columns, names = [*columns, value], [*names, "value"]
        out = pa.RecordBatch.from_arrays(columns, names=names)
        yield out if out.schema.equals(arrow_schema) else out.cast(arrow_schema)
