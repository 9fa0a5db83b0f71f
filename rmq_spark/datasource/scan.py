"""Reading one planned range of one queue: the InputPartition and the executor's ``read()``.

A :class:`QueueRange` is ``[start, end)`` of one ConsumeQueue plus a :class:`ReadContext` (all
``read()`` needs, picklable).  ``read()`` depends on nothing else, so a replayed micro-batch
returns the same rows.  Where the rows come from:

* the store files, straight through :class:`rmq_spark.store.reader.StoreReader` (vectorized,
  large Arrow batches), when this machine holds the broker's store directory;
* else RocketMQ 5 ``PullMessage`` over gRPC (any compatible broker), or the broker's own bulk
  read shipped as Arrow IPC (``readPath=arrow``).

A gap left by a filter is not data loss; data loss is a planned start below the queue's first
offset (``failOnDataLoss``).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import InputPartition

from rmq_spark.datasource.options import Connection, ReadPath
from rmq_spark.errors import StoreError

# batches handed to Spark: big enough to amortize per-batch costs, small enough to stay in cache
# and far below Arrow's 2 GiB per binary column whatever the message size
READ_CHUNK_ROWS = 65_536
READ_CHUNK_BYTES = 32 << 20

_readers: dict[str, Any] = {}  # store root -> StoreReader, per executor process
_readers_lock = threading.Lock()
_filters: dict[tuple[str | None, str | None], tuple[Any, Any]] = {}


class DataLossError(StoreError):
    """Planned offsets are no longer in the store (and ``failOnDataLoss`` is true)."""


@dataclass(frozen=True)
class ReadContext:
    connection: Connection
    store_root: str | None  # the broker's store directory
    store_host: str | None  # the machine that holds it
    read_path: ReadPath = ReadPath.AUTO
    tags: str | None = None
    sql: str | None = None
    fail_on_data_loss: bool = True
    avro_schema: str | None = None
    pull_group: str = "rmq-spark-reader"


@dataclass(frozen=True)
class RowBounds:
    """Exact row predicates pushed down by a batch read (``None``: unbounded)."""

    store_ts_min_us: int | None = None
    store_ts_min_inclusive: bool = True
    store_ts_max_us: int | None = None
    store_ts_max_inclusive: bool = True
    tags_in: tuple[str, ...] | None = None
    empty: bool = False

    @property
    def trivial(self) -> bool:
        return self.store_ts_min_us is None and self.store_ts_max_us is None and self.tags_in is None


@dataclass
class QueueRange(InputPartition):
    topic: str
    queue_id: int
    start: int
    end: int
    ctx: ReadContext
    bounds: RowBounds = field(default_factory=RowBounds)


def split_range(topic: str, queue_id: int, start: int, end: int, ctx: ReadContext, max_rows: int, bounds: RowBounds | None = None) -> list[QueueRange]:
    """``[start, end)`` as partitions of at most ``max_rows`` offsets (empty -> none)."""
    out = []
    pos = start
    while pos < end:
        stop = min(end, pos + max_rows)
        out.append(QueueRange(topic, queue_id, pos, stop, ctx, bounds or RowBounds()))
        pos = stop
    return out


def files_readable(ctx: ReadContext) -> bool:
    """Can this process open the broker's store files?"""
    root = ctx.store_root
    if root is None:
        return False
    if ctx.store_host is not None and ctx.store_host != socket.gethostname():
        return False
    return os.path.isdir(os.path.join(root, "commitlog")) and os.access(root, os.R_OK)


def broker_endpoint(ctx: ReadContext) -> str:
    """The broker an executor asks (PullMessage, bulk read).  An embedded broker listens on
    127.0.0.1 of the driver's machine: it is found (or started again) through the store there,
    never on another machine."""
    conn = ctx.connection
    if conn.endpoints:
        return conn.endpoints.split(",")[0].strip()
    if ctx.store_host is not None and ctx.store_host != socket.gethostname():
        raise StoreError(
            f"the embedded broker of {conn.path} runs on {ctx.store_host}, not on {socket.gethostname()}: "
            "on a cluster, start rmq-broker and pass option 'endpoints'"
        )
    from rmq_spark.datasource.embedded import endpoint_of

    return endpoint_of(conn)


def store_reader(root: str) -> Any:
    from rmq_spark.store.reader import StoreReader

    with _readers_lock:
        r = _readers.get(root)
        if r is None:
            r = StoreReader(root)
            _readers[root] = r
        return r


def filters_for(tags: str | None, sql: str | None) -> tuple[Any, Any]:
    key = (tags, sql)
    f = _filters.get(key)
    if f is None:
        from rmq_spark.filter.options import make_filters

        f = make_filters(tags, sql)
        _filters[key] = f
    return f


def read_range(p: QueueRange, arrow_schema: Any) -> Iterator[Any]:
    """The rows of ``p`` as Arrow record batches of ``arrow_schema`` (the Spark schema)."""
    if p.end <= p.start or p.bounds.empty:
        return
    ctx = p.ctx
    path = ctx.read_path
    if path in (ReadPath.AUTO, ReadPath.FILES) and files_readable(ctx):
        batches = _read_files(p)
    elif path is ReadPath.FILES:
        raise StoreError(
            f"readPath=files, but this machine ({socket.gethostname()}) cannot open the store "
            f"{ctx.store_root} of host {ctx.store_host}"
        )
    elif path is ReadPath.ARROW:
        batches = _read_arrow_rpc(p)
    else:
        from rmq_spark.datasource.pull import read_pull

        batches = read_pull(p)
    avro = None
    if ctx.avro_schema is not None:
        from rmq_spark.datasource.avro import parse_avro_schema

        avro = parse_avro_schema(ctx.avro_schema)
    for batch in batches:
        if not p.bounds.trivial:
            batch = _apply_bounds(batch, p.bounds)
        if batch.num_rows == 0:
            continue
        yield _conform(batch, arrow_schema, avro, f"{p.topic}/{p.queue_id}")


def _check_loss(p: QueueRange, first_offset: int) -> int:
    if p.start >= first_offset:
        return p.start
    if p.ctx.fail_on_data_loss:
        raise DataLossError(
            f"offsets {p.start}..{first_offset - 1} of queue {p.topic}/{p.queue_id} are no longer in "
            f"the store (it starts at {first_offset}); set failOnDataLoss=false to skip them"
        )
    return first_offset


def _read_files(p: QueueRange) -> Iterator[Any]:
    reader = store_reader(p.ctx.store_root)  # type: ignore[arg-type]
    start = _check_loss(p, reader.min_offset(p.topic, p.queue_id))
    tag_filter, sql_filter = filters_for(p.ctx.tags, p.ctx.sql)
    if p.bounds.tags_in is not None and tag_filter is None:
        from rmq_spark.filter import TagFilter

        tag_filter = TagFilter.parse(" || ".join(p.bounds.tags_in)) if p.bounds.tags_in else None
    yield from reader.read_chunks(
        p.topic, p.queue_id, start, p.end, tag_filter, sql_filter, READ_CHUNK_ROWS, READ_CHUNK_BYTES
    )


def _read_arrow_rpc(p: QueueRange) -> Iterator[Any]:
    from rmq_spark.broker.connector.client import InternalClient

    client = InternalClient(broker_endpoint(p.ctx))
    try:
        _, mins = client.offsets([p.topic])
        first = int(mins.get(p.topic, {}).get(str(p.queue_id), 0))
        start = _check_loss(p, first)
        yield from client.read_arrow(p.topic, p.queue_id, start, p.end, p.ctx.tags, p.ctx.sql)
    finally:
        client.close()


def _apply_bounds(batch: Any, b: RowBounds) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    mask = None

    def both(m: Any) -> Any:
        return m if mask is None else pc.and_(mask, m)

    ts = batch.column("storeTimestamp")
    if b.store_ts_min_us is not None:
        lo = pa.scalar(b.store_ts_min_us, type=ts.type)
        mask = both(pc.greater_equal(ts, lo) if b.store_ts_min_inclusive else pc.greater(ts, lo))
    if b.store_ts_max_us is not None:
        hi = pa.scalar(b.store_ts_max_us, type=ts.type)
        mask = both(pc.less_equal(ts, hi) if b.store_ts_max_inclusive else pc.less(ts, hi))
    if b.tags_in is not None:
        mask = both(pc.fill_null(pc.is_in(batch.column("tags"), value_set=pa.array(list(b.tags_in), pa.string())), False))
    return batch if mask is None else batch.filter(mask)


def _conform(batch: Any, arrow_schema: Any, avro: Any, where: str) -> Any:
    """The batch in exactly the Spark schema: the ``value`` column added for Avro, types cast."""
    import pyarrow as pa

    if avro is not None:
        from rmq_spark.datasource.avro import decode_bodies

        vtype = arrow_schema.field("value").type
        value = decode_bodies(batch.column("body"), avro, vtype, where)
        batch = pa.RecordBatch.from_arrays([*batch.columns, value], names=[*batch.schema.names, "value"])
    if not batch.schema.equals(arrow_schema):
        batch = batch.cast(arrow_schema)
    return batch
