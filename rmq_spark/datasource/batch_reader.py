"""The batch source: ``[startingOffsets, endingOffsets)`` of every subscribed queue, planned once.

With ``spark.sql.python.filterPushdown.enabled`` on, predicates on ``topic``, ``queueId``,
``queueOffset``, ``storeTimestamp`` and ``tags`` (``=``, ``IN``, ``<``, ``<=``, ``>``, ``>=``,
``IS NOT NULL``) are pushed down: topics and queues not asked for are not read, offset and
timestamp bounds narrow each queue's range (store timestamps via the store's time search), tags
use the ConsumeQueue tag codes; every pushed predicate is then applied exactly to the rows, so
Spark need not re-check it.  Other predicates are left to Spark.

Spark refuses a reader that implements ``pushFilters`` while pushdown is off, so the reader
class is chosen by whether Spark is planning through its pushdown worker (pyspark 4.0 has none:
its reads plan every subscribed queue's range and Spark applies every predicate).
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from rmq_spark.datasource import offsets as O
from rmq_spark.datasource.options import SourceOptions, StartKind
from rmq_spark.datasource.planning import Planner
from rmq_spark.datasource.read.partition import DataLossError, QueueRange, RowBounds, split_range
from rmq_spark.datasource.releases import FILTER_PUSHDOWN, arrow_schema
from rmq_spark.datasource.scan import read_range
from rmq_spark.datasource.tasks import task_started
from rmq_spark.errors import ConfigError

if TYPE_CHECKING or FILTER_PUSHDOWN:  # pyspark 4.0 has no filter classes, and never pushes
    from pyspark.sql.datasource import (
        EqualTo,
        Filter,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        IsNotNull,
        LessThan,
        LessThanOrEqual,
    )

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
NEVER_NULL = (
    "topic",
    "queueId",
    "queueOffset",
    "storeTimestamp",
    "body",
    "msgId",
    "commitLogOffset",
    "bornTimestamp",
    "properties",
)


@dataclass(frozen=True)
class Pushed:
    """The pushed-down predicates, intersected."""

    topics: frozenset[str] | None = None
    queues: frozenset[int] | None = None
    queue_min: int | None = None  # inclusive
    queue_max: int | None = None  # inclusive
    offset_min: int | None = None  # inclusive
    offset_max: int | None = None  # inclusive
    bounds: RowBounds = RowBounds()  # noqa: RUF009 - frozen: one shared value is safe


def _us(value: Any) -> int:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return (value - _EPOCH) // dt.timedelta(microseconds=1)
    raise TypeError(value)


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(value)
    return value


def _tighten_min(cur: int | None, new: int) -> int:
    return new if cur is None else max(cur, new)


def _tighten_max(cur: int | None, new: int) -> int:
    return new if cur is None else min(cur, new)


def push(p: Pushed, f: Filter) -> Pushed | None:
    """``p`` with ``f`` added, or None when ``f`` is not one this source applies exactly."""
    attr = getattr(f, "attribute", None)
    if not (isinstance(attr, tuple) and len(attr) == 1):
        return None
    col = attr[0]
    try:
        if isinstance(f, IsNotNull):
            return p if col in NEVER_NULL else None
        if col == "topic" and isinstance(f, (EqualTo, In)):
            vals = frozenset([f.value] if isinstance(f, EqualTo) else f.value)
            if not all(isinstance(v, str) for v in vals):
                return None
            return replace(p, topics=vals if p.topics is None else p.topics & vals)
        if col in ("queueId", "queueOffset"):
            if isinstance(f, (EqualTo, In)):
                vals = frozenset(
                    _int(v) for v in ([f.value] if isinstance(f, EqualTo) else f.value)
                )
                if col == "queueId":
                    return replace(p, queues=vals if p.queues is None else p.queues & vals)
                if not vals:
                    return replace(p, bounds=replace(p.bounds, empty=True))
                # an offset set: read the range spanning it; Spark keeps nothing to re-check, so
                # only a single value (an exact range) is taken
                if len(vals) != 1:
                    return None
                v = next(iter(vals))
                return replace(
                    p,
                    offset_min=_tighten_min(p.offset_min, v),
                    offset_max=_tighten_max(p.offset_max, v),
                )
            v = _int(f.value)  # type: ignore[attr-defined]  # a comparison: the filters left
            lo_attr, hi_attr = (
                ("queue_min", "queue_max") if col == "queueId" else ("offset_min", "offset_max")
            )
            if isinstance(f, GreaterThan):
                return replace(p, **{lo_attr: _tighten_min(getattr(p, lo_attr), v + 1)})  # type: ignore[arg-type]  # an int field
            if isinstance(f, GreaterThanOrEqual):
                return replace(p, **{lo_attr: _tighten_min(getattr(p, lo_attr), v)})  # type: ignore[arg-type]  # an int field
            if isinstance(f, LessThan):
                return replace(p, **{hi_attr: _tighten_max(getattr(p, hi_attr), v - 1)})  # type: ignore[arg-type]  # an int field
            if isinstance(f, LessThanOrEqual):
                return replace(p, **{hi_attr: _tighten_max(getattr(p, hi_attr), v)})  # type: ignore[arg-type]  # an int field
            return None
        if col == "storeTimestamp":
            b = p.bounds
            if isinstance(f, EqualTo):
                v = _us(f.value)
                b = _ts_min(_ts_max(b, v, True), v, True)
            elif isinstance(f, GreaterThan):
                b = _ts_min(b, _us(f.value), False)
            elif isinstance(f, GreaterThanOrEqual):
                b = _ts_min(b, _us(f.value), True)
            elif isinstance(f, LessThan):
                b = _ts_max(b, _us(f.value), False)
            elif isinstance(f, LessThanOrEqual):
                b = _ts_max(b, _us(f.value), True)
            else:
                return None
            return replace(p, bounds=b)
        if col == "tags" and isinstance(f, (EqualTo, In)):
            tags = tuple(
                sorted(
                    {
                        v
                        for v in ([f.value] if isinstance(f, EqualTo) else f.value)
                        if isinstance(v, str)
                    }
                )
            )
            cur = p.bounds.tags_in
            new = tags if cur is None else tuple(sorted(set(cur) & set(tags)))
            return replace(
                p, bounds=replace(p.bounds, tags_in=new, empty=p.bounds.empty or not new)
            )
    except TypeError:
        return None
    return None


def check_named_queues(
    option: str, given: O.QueueMap, subscribed: list[str], hi: O.Offsets, subscription: str
) -> None:
    """Every queue an offsets option names is one this read subscribes to (topics left out by a
    pushed-down filter are not checked: they are subscribed, only not read)."""
    for topic, queues in given.items():
        if topic not in subscribed:
            raise ConfigError(
                f"option {option!r} names topic {topic!r}, which this read does not subscribe to ({subscription})"
            )
        have = hi.get(topic)
        if have is None:
            continue
        for q in queues:
            if str(q) not in have:
                which = _queue_names(sorted(int(x) for x in have))
                raise ConfigError(
                    f"option {option!r} names queue {topic}/{q}, which is not subscribed: this read has {which} of "
                    f"topic {topic!r} ({subscription})"
                )


def _queue_names(ids: list[int]) -> str:
    if not ids:
        return "no queue"
    if len(ids) == 1:
        return f"only queue {ids[0]}"
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"queues {ids[0]}-{ids[-1]}"
    return "queues " + ", ".join(map(str, ids))


def check_range(
    topic: str,
    queue_id: int,
    start: int,
    end: int,
    max_offset: int,
    given_start: int | None,
    given_end: int | None,
) -> None:
    """A queue's planned ``[start, end)`` is one the user can have meant: offsets given past the
    queue's end, or a start after the end, are errors (as Spark's Kafka source words them)."""
    if given_start is not None and given_start >= 0 and given_start > max_offset:
        raise ConfigError(
            f"option 'startingOffsets': offset {given_start} of topic {topic} queue {queue_id} is past the end of "
            f"the queue, whose next offset is {max_offset}"
        )
    if given_end is not None and given_end >= 0 and given_end > max_offset:
        raise ConfigError(
            f"option 'endingOffsets': offset {given_end} of topic {topic} queue {queue_id} is past the end of "
            f"the queue, whose next offset is {max_offset}"
        )
    if start > end:
        raise ConfigError(
            f"Beginning offset {start} is after the ending offset {end} for topic {topic} queue {queue_id}: "
            "give a startingOffsets (or startingTimestamp) before the endingOffsets (or endingTimestamp)"
        )


def _ts_min(b: RowBounds, v: int, inclusive: bool) -> RowBounds:
    cur = b.store_ts_min_us
    if cur is None or v > cur or (v == cur and not inclusive):
        return replace(b, store_ts_min_us=v, store_ts_min_inclusive=inclusive)
    return b


def _ts_max(b: RowBounds, v: int, inclusive: bool) -> RowBounds:
    cur = b.store_ts_max_us
    if cur is None or v < cur or (v == cur and not inclusive):
        return replace(b, store_ts_max_us=v, store_ts_max_inclusive=inclusive)
    return b


class RmqBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self.planner = Planner(opts)
        self.pushed = Pushed()
        self._arrow_schema: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_arrow_schema"] = None
        return state

    def partitions(self) -> list[InputPartition]:
        o, p = self.opts, self.pushed
        subscribed = self.planner.topics()
        topics = [t for t in subscribed if p.topics is None or t in p.topics]
        hi, lo = self.planner.snapshot(topics)
        given_start = o.starting.offsets if o.starting.kind is StartKind.JSON else {}
        given_end = o.ending.offsets if not o.ending.latest else {}
        for name, given in (("startingOffsets", given_start), ("endingOffsets", given_end)):
            check_named_queues(name, given, subscribed, hi, self.opts.subscription.describe())
        start = self.planner.resolve_start(o.starting, hi, lo)
        if o.ending.timestamp_ms is not None:
            end = self.planner.offsets_at(o.ending.timestamp_ms, hi)
        elif not o.ending.latest:
            end = dict(O.canonical(hi))
            for t, qs in O.resolve(o.ending.offsets, lo, hi).items():
                if t in end:
                    end[t].update(qs)
            end = O.canonical(end)
        else:
            end = hi
        bounds = p.bounds
        # ranges a little wider than the bounds (ms resolution); the rows are then masked exactly
        lo_ts = self._ts_offsets(
            None if bounds.store_ts_min_us is None else bounds.store_ts_min_us // 1000, hi
        )
        hi_ts = self._ts_offsets(
            None if bounds.store_ts_max_us is None else bounds.store_ts_max_us // 1000 + 1, hi
        )
        ctx = self.planner.read_context()
        out: list[InputPartition] = []
        for t, q, e in O.queue_list(end):
            if p.queues is not None and q not in p.queues:
                continue
            if (p.queue_min is not None and q < p.queue_min) or (
                p.queue_max is not None and q > p.queue_max
            ):
                continue
            s = O.get(start, t, q, 0) or 0
            check_range(
                t,
                q,
                s,
                e,
                O.get(hi, t, q, 0) or 0,
                O.get(given_start, t, q),
                O.get(given_end, t, q),
            )
            first = O.get(lo, t, q, 0) or 0
            if s < first:
                if o.fail_on_data_loss:
                    raise DataLossError(
                        f"startingOffsets asks for offset {s} of queue {t}/{q}, which now starts at {first}; "
                        "set failOnDataLoss=false to read from there"
                    )
                s = first
            e = min(e, O.get(hi, t, q, e) or 0)
            if p.offset_min is not None:
                s = max(s, p.offset_min)
            if p.offset_max is not None:
                e = min(e, p.offset_max + 1)
            if lo_ts is not None:
                s = max(s, O.get(lo_ts, t, q, s) or 0)
            if hi_ts is not None:
                e = min(e, O.get(hi_ts, t, q, e) or 0)
            out.extend(split_range(t, q, s, e, ctx, o.max_records_per_partition, bounds))
        return out

    def _ts_offsets(self, ts_ms: int | None, hi: O.Offsets) -> O.Offsets | None:
        """Per queue, the first offset stored at or after ``ts_ms``."""
        if ts_ms is None:
            return None
        return self.planner.offsets_at(ts_ms, hi)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        task_started()
        if self._arrow_schema is None:
            self._arrow_schema = arrow_schema(self.schema)
        if not isinstance(partition, QueueRange):
            return iter(())  # Spark's stand-in partition when there is nothing to read
        return read_range(partition, self._arrow_schema)


class RmqPushdownBatchReader(RmqBatchReader):
    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            pushed = push(self.pushed, f)
            if pushed is None:
                yield f
            else:
                self.pushed = pushed


def pushdown_enabled() -> bool:
    """Is Spark planning this read through its filter-pushdown worker?  (It calls ``reader()``
    from ``pyspark.sql.worker.data_source_pushdown_filters`` exactly when
    ``spark.sql.python.filterPushdown.enabled`` is on.)"""
    frame = sys._getframe(1)  # noqa: SLF001 - the caller's frame: no public API
    while frame is not None:
        if frame.f_globals.get("__name__", "").endswith("data_source_pushdown_filters"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False
