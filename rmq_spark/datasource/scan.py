"""Reading one planned range of one queue: the executor's ``read()`` chooses a read path.

Where the rows of a :class:`~rmq_spark.datasource.read.partition.QueueRange` come from:

* the store files (:mod:`rmq_spark.datasource.read.files`), when this machine holds the broker's
  store directory;
* else the broker's own bulk read shipped as Arrow IPC (:mod:`rmq_spark.datasource.read.arrow`,
  ``readPath=arrow``, and ``auto`` on executors that cannot open the files: the driver plans
  through the same broker's connector service, so it is always there);
* or RocketMQ 5 ``PullMessage`` over gRPC (:mod:`rmq_spark.datasource.read.pull`,
  ``readPath=pull`` only: one message at a time, for comparison with any RocketMQ 5 broker).

Whatever the path, the batches are then cut to the pushed-down row bounds and conformed to the
Spark schema (the Avro ``value`` column added).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

from rmq_spark.datasource.options import ReadPath
from rmq_spark.datasource.read.arrow import read_arrow
from rmq_spark.datasource.read.files import files_readable, read_files
from rmq_spark.datasource.read.partition import QueueRange, RowBounds
from rmq_spark.datasource.read.pull import read_pull
from rmq_spark.errors import StoreError

__all__ = ["read_range"]


def read_range(p: QueueRange, arrow_schema: Any) -> Iterator[Any]:
    """The rows of ``p`` as Arrow record batches of ``arrow_schema`` (the Spark schema)."""
    if p.end <= p.start or p.bounds.empty:
        return
    ctx = p.ctx
    path = ctx.read_path
    if path in (ReadPath.AUTO, ReadPath.FILES) and files_readable(ctx):
        batches = read_files(p)
    elif path is ReadPath.FILES:
        raise StoreError(
            f"readPath=files, but this machine ({socket.gethostname()}) cannot open the store "
            f"{ctx.store_root} of host {ctx.store_host}"
        )
    elif path is ReadPath.PULL:
        batches = read_pull(p)
    else:  # arrow, and auto where the files are out of reach (executors on other hosts)
        batches = read_arrow(p)
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
        mask = both(
            pc.fill_null(
                pc.is_in(batch.column("tags"), value_set=pa.array(list(b.tags_in), pa.string())),
                False,
            )
        )
    return batch if mask is None else batch.filter(mask)


def _conform(batch: Any, arrow_schema: Any, avro: Any, where: str) -> Any:
    """The batch in exactly the Spark schema: the ``value`` column added for Avro, types cast."""
    import pyarrow as pa

    if avro is not None:
        from rmq_spark.datasource.avro import decode_bodies

        vtype = arrow_schema.field("value").type
        value = decode_bodies(batch.column("body"), avro, vtype, where)
        batch = pa.RecordBatch.from_arrays(
            [*batch.columns, value], names=[*batch.schema.names, "value"]
        )
    if not batch.schema.equals(arrow_schema):
        batch = batch.cast(arrow_schema)
    return batch
