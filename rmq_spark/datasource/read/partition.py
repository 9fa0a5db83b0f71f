"""One planned range of one queue, the InputPartition, and what every read path needs with it.

A :class:`QueueRange` is ``[start, end)`` of one ConsumeQueue plus a :class:`ReadContext` (all
``read()`` needs, picklable).  ``read()`` depends on nothing else, so a replayed micro-batch
returns the same rows.  A gap left by a filter is not data loss; data loss is a planned start
below the queue's first offset (``failOnDataLoss``, :func:`check_loss`).  The broker an executor
asks is found by :func:`rmq_spark.datasource.embedded.broker_endpoint`: this module imports
nothing of the embedded broker's, so the read paths sit below it (no import cycle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import InputPartition

from rmq_spark.datasource.options import Connection, ReadPath
from rmq_spark.errors import StoreError

__all__ = [
    "DataLossError",
    "QueueRange",
    "ReadContext",
    "RowBounds",
    "check_loss",
    "filters_for",
    "split_range",
]

_filters: dict[tuple[str | None, str | None], tuple[Any, Any]] = {}  # per executor process


class DataLossError(StoreError):
    """Planned offsets are no longer in the store (and ``failOnDataLoss`` is true)."""


@dataclass(frozen=True)
class ReadContext:
    connection: Connection
    store_root: str | None  # the broker's store directory
    store_host: str | None  # the machine that holds it
    read_path: ReadPath = ReadPath.AUTO
    read_compression: str = "lz4"
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
        return (
            self.store_ts_min_us is None and self.store_ts_max_us is None and self.tags_in is None
        )


@dataclass
class QueueRange(InputPartition):
    topic: str
    queue_id: int
    start: int
    end: int
    ctx: ReadContext
    bounds: RowBounds = field(default_factory=RowBounds)


def split_range(
    topic: str,
    queue_id: int,
    start: int,
    end: int,
    ctx: ReadContext,
    max_rows: int,
    bounds: RowBounds | None = None,
) -> list[QueueRange]:
    """``[start, end)`` as partitions of at most ``max_rows`` offsets (empty -> none)."""
    out = []
    pos = start
    while pos < end:
        stop = min(end, pos + max_rows)
        out.append(QueueRange(topic, queue_id, pos, stop, ctx, bounds or RowBounds()))
        pos = stop
    return out


def check_loss(p: QueueRange, first_offset: int) -> int:
    """Where to start reading ``p`` when its queue begins at ``first_offset``."""
    if p.start >= first_offset:
        return p.start
    if p.ctx.fail_on_data_loss:
        raise DataLossError(
            f"offsets {p.start}..{first_offset - 1} of queue {p.topic}/{p.queue_id} are no longer in "
            f"the store (it starts at {first_offset}); set failOnDataLoss=false to skip them"
        )
    return first_offset


def filters_for(tags: str | None, sql: str | None) -> tuple[Any, Any]:
    """The (tag, SQL92) filters of the options, made once per executor process."""
    key = (tags, sql)
    f = _filters.get(key)
    if f is None:
        from rmq_spark.filter.options import make_filters

        f = make_filters(tags, sql)
        _filters[key] = f
    return f
