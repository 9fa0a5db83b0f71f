"""The sink writing to a RocketMQ cluster: ``df.write`` / ``df.writeStream`` with ``namesrvAddr``.

Works with Apache RocketMQ (NameServers and brokers) and with rmq-broker's remoting port and
NameServer: routes from the NameServers, ``SEND_BATCH_MESSAGE`` in batches of up to
:data:`BATCH_BODY_BYTES`, ``SEND_MESSAGE_V2`` for delayed and timer rows (a MessageBatch carries
no delay).  Each task checks every row of its partition first (:func:`check_rows`: a bad row
fails the task with nothing sent), then sends, the whole encoding column-wise with Arrow and
numpy (:func:`encode_rows`: one binary array of MessageBatch records whose values buffer is cut
into request bodies without a copy per message).

Where a row goes, as the Java producer's selectors do:

* ``messageGroup``: ``abs(group.hashCode() % n)`` of the topic's ``n`` write queues (brokers in
  name order, then queue ids): ``SelectMessageQueueByHash``; the same group always lands on the
  same queue, in order;
* ``queueId``: that index in the same list (with one broker: that queue);
* otherwise round robin over the write queues from a random start, in blocks, and a failed send
  is retried on a queue of *another* broker (``retryTimesWhenSendFailed``, option
  ``sendRetries``, default 2), as ``DefaultMQProducer`` does; rows with a fixed queue are retried
  on the same queue (their order matters).

A topic the NameServers have no route for is sent through ``TBW102``'s route with
``defaultTopic=TBW102`` (the broker creates it when ``autoCreateTopicEnable``), as Java does.

The guarantee is at-least-once with a deterministic message key per row (see
:func:`row_keys`): ``UNIQ_KEY`` -- the message id every client shows -- is
``hash(queryId, batchId, partition)`` + the row's index, so a replayed micro-batch or a retried
task resends the same rows with the same ids and a consumer drops duplicates by id.  Why
exactly-once is not offered on Apache RocketMQ: README, "Reading and writing an Apache RocketMQ
cluster", "Writing".

Why this module is long: the queue selectors, the column-wise encoding and a task's retry loop are
one send path: a retry re-cuts the request bodies the encoding made.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyspark.sql import types as T
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    WriterCommitMessage,
)

from rmq_spark.access.rules import SendLimits
from rmq_spark.datasource.options import SinkOptions
from rmq_spark.datasource.releases import StreamArrowWriterBase
from rmq_spark.datasource.tasks import task_started
from rmq_spark.datasource.writer import PartitionRows, SinkLayout, _now_ms, to_rows
from rmq_spark.errors import ConfigError, StoreError

__all__ = [
    "BATCH_BODY_BYTES",
    "ClusterBatchWriter",
    "ClusterCommit",
    "ClusterStreamWriter",
    "encode_rows",
    "row_keys",
]

# a MessageBatch body is at most the broker's maxMessageSize (4 MiB by default)
BATCH_BODY_BYTES = 4 * 1024 * 1024 - 64 * 1024
AUTO_CREATE_TOPIC = "TBW102"  # TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC
DEFAULT_TOPIC_QUEUES = 4  # DefaultMQProducer.defaultTopicQueueNums
RR_BLOCK_ROWS = 256
SEND_THREADS = 4  # queues sent to at once by one task
BUSY_WAIT_S = 60.0  # a broker answering SYSTEM_BUSY (flow control) is waited for this long  # round robin: consecutive rows to one queue, so batches stay large
# answers after which the Java producer tries again (DefaultMQProducer.retryResponseCodes), and
# SYSTEM_BUSY (a broker's flow control)
RETRY_CODES = frozenset({1, 2, 14, 16, 17, 19, 20})
_HEADER = np.dtype(
    [("total", ">i4"), ("magic", ">i4"), ("crc", ">i4"), ("flag", ">i4"), ("body_len", ">i4")]
)


@dataclass
class ClusterCommit(WriterCommitMessage):
    """What one task sent (rows; the key prefix of its partition, for the record)."""

    query_id: str
    batch_id: int
    partition_id: int
    rows: int
    key_prefix: str


def key_prefix(query_id: str, batch_id: int, partition_id: int) -> str:
    """20 hex digits naming (query, micro-batch, partition): the first part of every row key."""
    return (
        hashlib.blake2b(f"{query_id}/{batch_id}/{partition_id}".encode(), digest_size=10)
        .hexdigest()
        .upper()
    )


def row_keys(prefix: str, first_row: int, n: int) -> Any:
    """``prefix`` + the row index in 12 hex digits, for rows ``first_row ..``: 32 hex digits like
    a Java client's message id, the same for the same row of a replayed batch."""
    import pyarrow as pa

    from rmq_spark.store.views import _fixed_strings

    idx = np.arange(first_row, first_row + n, dtype=np.uint64)
    shifts = np.arange(44, -1, -4, dtype=np.uint64)
    digits = (idx[:, None] >> shifts[None, :]) & np.uint64(0xF)
    hexed = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)[digits.astype(np.intp)]
    head = np.frombuffer(prefix.encode("ascii"), dtype=np.uint8)
    block = np.concatenate([np.broadcast_to(head, (n, len(head))), hexed], axis=1)
    return _fixed_strings(block, pa.string())


def _prop(name: str, values: Any) -> Any:
    """``name\\x01value\\x02`` per row, "" where the value is null or empty."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = values.cast(pa.string())
    joined = pc.binary_join_element_wise(name + "\x01", values, "\x02", "")
    return pc.if_else(pc.fill_null(pc.greater(pc.binary_length(values), 0), False), joined, "")


def _user_props(props: Any) -> Any:
    """A map<string,string> column as ``k\\x01v\\x02...`` per row ("" for null or empty)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(props, pa.ChunkedArray):
        props = props.combine_chunks()
    n = len(props)
    if props.null_count == n:
        return pa.array([""] * n, pa.string())
    props = props.cast(
        pa.list_(pa.struct([props.type.key_field, props.type.item_field]))
    )  # map -> list
    flat = pc.list_flatten(props)  # the entries of every row, in order (slices respected)
    parents = pc.list_parent_indices(props).to_numpy(zero_copy_only=False)
    pairs = pc.binary_join_element_wise(flat.field(0), "\x01", flat.field(1), "\x02", "")
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(parents, minlength=n), out=offsets[1:])
    lists = pa.ListArray.from_arrays(pa.array(offsets), pairs)
    joined = pc.binary_join(lists, "")
    return pc.fill_null(joined, "")


def properties_column(table: Any, keys: Any) -> Any:
    """Each row's properties string: TAGS, KEYS, DELAY, TIMER_DELIVER_MS, the user's properties,
    UNIQ_KEY (``keys``) and WAIT=true, column-wise."""
    import pyarrow as pa
    import pyarrow.compute as pc

    cols = set(table.column_names)
    parts = []
    if "tags" in cols:
        parts.append(_prop("TAGS", table.column("tags")))
    if "keys" in cols:
        parts.append(_prop("KEYS", table.column("keys")))
    if "delayLevel" in cols:
        level = table.column("delayLevel")
        parts.append(
            _prop("DELAY", pc.if_else(pc.greater(level, 0), level, pa.scalar(None, level.type)))
        )
    if "deliverTimeMs" in cols:
        parts.append(_prop("TIMER_DELIVER_MS", pc.cast(table.column("deliverTimeMs"), pa.int64())))
    if "properties" in cols:
        parts.append(_user_props(table.column("properties")))
    parts.append(pc.binary_join_element_wise("UNIQ_KEY\x01", keys, "\x02WAIT\x01true\x02", ""))
    return pc.binary_join_element_wise(*parts, "") if len(parts) > 1 else parts[0]


def encode_rows(bodies: Any, props: Any) -> Any:
    """Every row as a MessageBatch record (``MessageDecoder.encodeMessage``: TOTALSIZE, MAGIC 0,
    BODYCRC 0, FLAG 0, BODYLEN, BODY, PROPERTIESLEN, PROPERTIES), as ONE binary array: a batch of
    rows ``[a, b)`` is the bytes ``values[offsets[a]:offsets[b]]``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from rmq_spark.store.views import _fixed_strings

    props = props.cast(pa.binary())
    n = len(bodies)
    body_len = pc.binary_length(bodies).to_numpy(zero_copy_only=False).astype(np.int64)
    prop_len = pc.binary_length(props).to_numpy(zero_copy_only=False).astype(np.int64)
    if n and int(prop_len.max()) > 32767:
        row = int(np.argmax(prop_len > 32767))
        raise ConfigError(
            f"row {row}: its properties take {int(prop_len[row])} bytes, over RocketMQ's 32767"
        )
    head = np.zeros(n, dtype=_HEADER)
    head["total"] = 20 + body_len + 2 + prop_len
    head["body_len"] = body_len
    plen = prop_len.astype(">u2")
    return pc.binary_join_element_wise(
        _fixed_strings(head.view(np.uint8).reshape(n, 20), pa.binary()),
        bodies,
        _fixed_strings(plen.view(np.uint8).reshape(n, 2), pa.binary()),
        props,
        b"",
    )


def _batches(records: Any, rows: np.ndarray) -> Iterator[tuple[np.ndarray, bytes]]:
    """``rows`` (indices into ``records``) in consecutive runs of at most BATCH_BODY_BYTES: the
    rows of each run and its request body."""
    offs = np.frombuffer(
        records.buffers()[1], dtype=np.int32, count=len(records) + 1, offset=records.offset * 4
    )
    data = records.buffers()[2]
    if len(rows) == 0:
        return
    # runs of consecutive row indices are contiguous bytes
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    for run in np.split(rows, breaks):
        start = 0
        sizes = (offs[run + 1] - offs[run]).astype(np.int64)
        ends = np.cumsum(sizes)
        while start < len(run):
            base = ends[start - 1] if start else 0
            stop = int(np.searchsorted(ends, base + BATCH_BODY_BYTES, side="right"))
            stop = max(stop, start + 1)
            sel = run[start:stop]
            yield sel, data[int(offs[sel[0]]) : int(offs[sel[-1] + 1])].to_pybytes()
            start = stop


class _Sender:
    """One task's sends: routes, queue choice, batches, retries."""

    def __init__(self, opts: SinkOptions) -> None:
        from rmq_spark.cluster import ClusterClient
        from rmq_spark.cluster.namespace import wrap

        self.opts = opts
        self.client = ClusterClient(
            opts.namesrv_addr or "",
            timeout_s=opts.send_timeout_s,
            credentials=opts.connection.cluster_credentials(),
            tls=opts.connection.tls,
        )
        # topics and the producer group as the brokers know them (``namespace%name``)
        self.wrap: Callable[[str], str] = lambda name: wrap(opts.connection.namespace, name)
        self.group = self.wrap(opts.producer_group)
        self.rr = random.randrange(1 << 16)  # DefaultMQProducer starts its round robin at random
        self.pool = ThreadPoolExecutor(SEND_THREADS, thread_name_prefix="rmq-cluster-send")
        self._routes: dict[str, tuple[list[tuple[str, int]], bool]] = {}

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.client.close()

    def queues(self, topic: str, refresh: bool = False) -> tuple[list[tuple[str, int]], bool]:
        """The topic's write queues (brokers by name, then queue ids), and whether they are
        TBW102's (the topic does not exist yet: the broker creates it on the first send)."""
        from rmq_spark.cluster import ClusterError
        from rmq_spark.remoting.codes import ResponseCode

        if not refresh and topic in self._routes:
            return self._routes[topic]
        auto = False
        try:
            queues = self.client.route(topic, refresh=True).write_queues()
        except ClusterError as e:
            if e.code != ResponseCode.TOPIC_NOT_EXIST:
                raise
            auto = True
            template = self.client.route(AUTO_CREATE_TOPIC, refresh=True)
            queues = [(b, q) for b, q in template.write_queues() if q < DEFAULT_TOPIC_QUEUES]
        if not queues:
            raise StoreError(
                f"topic {topic!r} has no writable queue on a broker with a master in the routes of the NameServers "
                f"{self.opts.namesrv_addr} (create it, or enable autoCreateTopicEnable on the brokers)"
            )
        self._routes[topic] = (queues, auto)
        return queues, auto

    def targets(self, table: Any, n_queues: int, first_row: int) -> np.ndarray:
        """Per row: the index of its write queue, -1 where round robin decides."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from rmq_spark.store.hashing import java_string_hashes

        n = table.num_rows
        out = np.full(n, -1, dtype=np.int64)
        cols = set(table.column_names)
        if "messageGroup" in cols:
            groups = table.column("messageGroup")
            if groups.null_count < n:
                enc = (
                    pc.dictionary_encode(groups).combine_chunks()
                    if isinstance(groups, pa.ChunkedArray)
                    else pc.dictionary_encode(groups)
                )
                h = java_string_hashes(enc.dictionary.to_pylist()).astype(np.int64)
                per_group = np.abs(np.fmod(h, n_queues))  # SelectMessageQueueByHash
                idx = enc.indices.to_numpy(zero_copy_only=False)
                valid = ~np.asarray(
                    pc.is_null(enc.indices).to_numpy(zero_copy_only=False), dtype=bool
                )
                out[valid] = per_group[idx[valid].astype(np.int64)]
        if "queueId" in cols:
            qid = table.column("queueId")
            if qid.null_count < n:
                q = pc.fill_null(qid, -1).to_numpy(zero_copy_only=False).astype(np.int64)
                bad = np.flatnonzero(
                    (q < -1) | (q >= n_queues) | ((q == -1) & ~np.asarray(pc.is_null(qid)))
                )
                if len(bad):
                    i = int(bad[0])
                    raise ConfigError(
                        f"column 'queueId', row {first_row + i}: queue {int(q[i])} does not exist: the topic has "
                        f"{n_queues} write queues (0-{n_queues - 1}, brokers in name order)"
                    )
                out = np.where(q >= 0, q, out)
        return out

    def round_robin(self, free: np.ndarray, n_queues: int) -> np.ndarray:
        """Queue indices for the ``free`` rows: the chunk cut into one contiguous block per queue
        (at least RR_BLOCK_ROWS rows each), blocks to consecutive queues: each block is sent as
        few large batches."""
        size = max(RR_BLOCK_ROWS, -(-len(free) // n_queues))
        blocks = np.arange(len(free), dtype=np.int64) // size
        out = (self.rr + blocks) % n_queues
        self.rr += int(blocks[-1]) + 1 if len(free) else 0
        return out

    def send(
        self, topic: str, qidx: int, body: bytes, count: int, fixed: bool, props: str | None = None
    ) -> None:
        """One SEND_BATCH_MESSAGE (or, with ``props``, one SEND_MESSAGE_V2) to write queue
        ``qidx``; failures retried up to ``sendRetries`` times: on the same queue when ``fixed``,
        else on a queue of another broker."""
        from rmq_spark.cluster import BrokerUnreachableError, ClusterError
        from rmq_spark.remoting.codes import RequestCode, ResponseCode

        queues, auto = self.queues(topic)
        last: Exception | None = None
        failed: set[str] = set()
        busy_until = time.monotonic() + BUSY_WAIT_S
        attempt = busy = 0
        while attempt <= self.opts.send_retries:
            broker, qid = queues[qidx % len(queues)]
            # the cluster client's own header builder (the SEND frame this writer batches)
            send_header = self.client._send_header  # noqa: SLF001
            ext = send_header(
                broker, self.group, topic, qid, {}, 0, 0, 0, props is None, DEFAULT_TOPIC_QUEUES
            )
            if props is not None:
                ext["i"] = props
            code = (
                RequestCode.SEND_MESSAGE_V2 if props is not None else RequestCode.SEND_BATCH_MESSAGE
            )
            try:
                self.client.invoke(
                    broker,
                    code,
                    ext,
                    body,
                    topic=None if auto else topic,
                    ok=(0, 10, 11, 12),
                    what=f" of {count} message(s) to {topic}/{qid}",
                )
                return
            except ClusterError as e:
                if not isinstance(e, BrokerUnreachableError) and e.code not in RETRY_CODES:
                    raise
                last = e
                if e.code == ResponseCode.SYSTEM_BUSY and time.monotonic() < busy_until:
                    # the broker's flow control: wait and send to the same queue again
                    busy += 1
                    time.sleep(min(1.0, 0.02 * 2 ** min(busy, 6)))
                    continue
                failed.add(broker)
            attempt += 1
            time.sleep(min(1.0, 0.1 * attempt))
            queues, auto = self.queues(topic, refresh=True)
            if not fixed:  # as DefaultMQProducer: the next queue, on a broker that did not fail
                others = [i for i, (b, _) in enumerate(queues) if b not in failed]
                qidx = others[(qidx + 1) % len(others)] if others else qidx + 1
        raise StoreError(
            f"sending {count} message(s) to topic {topic!r} failed after "
            f"{self.opts.send_retries + 1} tries: {last}"
        )

    def send_chunk(self, table: Any, prefix: str, first_row: int) -> int:
        """Every row of ``table`` (rows ``first_row ..`` of the partition); returns the count."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n = table.num_rows
        keys = row_keys(prefix, first_row, n)
        records = encode_rows(
            table.column("body").combine_chunks()
            if isinstance(table.column("body"), pa.ChunkedArray)
            else table.column("body"),
            properties_column(table, keys),
        )
        if isinstance(records, pa.ChunkedArray):
            records = records.combine_chunks()
        delayed = np.zeros(n, dtype=bool)
        if "delayLevel" in table.column_names:
            delayed |= pc.fill_null(pc.greater(table.column("delayLevel"), 0), False).to_numpy(
                zero_copy_only=False
            )
        if "deliverTimeMs" in table.column_names:
            delayed |= np.asarray(
                pc.is_valid(table.column("deliverTimeMs")).to_numpy(zero_copy_only=False),
                dtype=bool,
            )
        topics = table.column("topic")
        for topic in pc.unique(topics).to_pylist():
            in_topic = np.asarray(
                pc.equal(topics, topic).to_numpy(zero_copy_only=False), dtype=bool
            )
            topic = self.wrap(topic)  # the name the brokers know
            queues, _ = self.queues(topic)
            target = self.targets(table, len(queues), first_row)
            fixed = target >= 0
            free = np.flatnonzero(in_topic & ~fixed)
            target[free] = self.round_robin(free, len(queues))

            # this topic's arrays bound now (each queue's future is awaited below, in this round)
            def one_queue(
                q: int,
                topic: str = topic,
                in_topic: np.ndarray = in_topic,
                target: np.ndarray = target,
                fixed: np.ndarray = fixed,
            ) -> None:
                # a queue's batches one after the other: a message group keeps its order
                for sel, body in _batches(
                    records, np.flatnonzero(in_topic & ~delayed & (target == q))
                ):
                    self.send(topic, q, body, len(sel), bool(fixed[sel[0]]))

            # the queues side by side: requests in flight on every broker at once (the
            # connections are multiplexed), as a producer's several threads would
            for f in [
                self.pool.submit(one_queue, q)
                for q in np.unique(target[in_topic & ~delayed]).tolist()
            ]:
                f.result()
            for i in np.flatnonzero(in_topic & delayed).tolist():  # a MessageBatch carries no delay
                props = properties_column(table.slice(i, 1), keys.slice(i, 1))[0].as_py()
                self.send(
                    topic, int(target[i]), table.column("body")[i].as_py(), 1, bool(fixed[i]), props
                )
        return n


class _ClusterWriter:
    """What the streaming and the batch writer share."""

    def __init__(self, opts: SinkOptions, schema: T.StructType) -> None:
        import uuid

        self.opts = opts
        self.layout = SinkLayout.of(schema, opts)
        self.write_id = uuid.uuid4().hex  # a batch write's keys; a task retry of it keeps them

    def _send_all(
        self, iterator: Iterator[Any], query_id: str, batch_id: int, partition_id: int
    ) -> ClusterCommit:
        avro = None
        if self.opts.avro_schema is not None:
            from rmq_spark.datasource.avro import parse_avro_schema

            avro = parse_avro_schema(self.opts.avro_schema)
        prefix = key_prefix(query_id, batch_id, partition_id)
        done = ClusterCommit(query_id, batch_id, partition_id, 0, prefix)
        rows = PartitionRows(
            lambda: SendLimits(now_ms=_now_ms()), partition_id, self.layout.user_names
        )
        sender = None
        try:
            for batch in iterator:
                rows.add(to_rows(batch, self.layout, self.opts, avro))
            for chunk in rows.chunks():
                if sender is None:
                    sender = _Sender(self.opts)
                done.rows += sender.send_chunk(chunk, prefix, done.rows)
        finally:
            rows.close()
            if sender is not None:
                sender.close()
        return done


class ClusterStreamWriter(_ClusterWriter, StreamArrowWriterBase):
    def write(self, iterator: Iterator[Any]) -> ClusterCommit:
        task_started()
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query_id = (
            ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
        ) or "unknown-query"
        batch_id = int((ctx.getLocalProperty("streaming.sql.batchId") if ctx else None) or -1)
        return self._send_all(iterator, query_id, batch_id, ctx.partitionId() if ctx else 0)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: every row was stored by its task (at-least-once)."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing can be taken back: a replay resends the rows with the same keys."""


class ClusterBatchWriter(_ClusterWriter, DataSourceArrowWriter):
    def write(self, iterator: Iterator[Any]) -> ClusterCommit:
        task_started()
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return self._send_all(
            iterator, f"batch-{self.write_id}", 0, ctx.partitionId() if ctx else 0
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to do: every row was stored by its task (at-least-once)."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing can be taken back: rows some tasks stored stay (their keys tell them)."""
