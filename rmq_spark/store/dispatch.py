"""Dispatch: appended CommitLog records become ConsumeQueue units (and index entries, and whatever
else joins) through one small interface.

Records are dispatched in whole batches: a :class:`DispatchBatch` is a set of columns, built by the
put path straight from the encoder (no re-parse) and by recovery from a scan of the CommitLog.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from rmq_spark.store import layout as L


class Column:
    """A numpy column of a batch that may be given as a plain list (a put of a few records: numpy's
    per-call cost would dominate there); it becomes an array of ``dtype`` on first read.  Stored in
    the owner's ``_<name>`` slot."""

    __slots__ = ("dtype", "slot")

    def __init__(self, dtype: type) -> None:
        self.dtype = dtype
        self.slot = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, obj: object, owner: type | None = None):  # type: ignore[no-untyped-def]
        if obj is None:
            return self
        value = getattr(obj, self.slot)
        if value.__class__ is not np.ndarray and not isinstance(value, np.ndarray):
            value = np.array(value, dtype=self.dtype)
            setattr(obj, self.slot, value)
        return value

    def __set__(self, obj: object, value: object) -> None:
        setattr(obj, self.slot, value)


def as_list(value: Any) -> list[Any]:
    """A column's values as a list of Python ints (no copy when it is still a list)."""
    if value.__class__ is list:
        return value
    return value.tolist() if isinstance(value, np.ndarray) else list(value)


class DispatchBatch:
    """Columns of appended records, in CommitLog order (numpy columns; lists are accepted and
    converted when first read)."""

    __slots__ = (
        "_end",
        "_phys",
        "_queue_ids",
        "_queue_offsets",
        "_sizes",
        "_store_timestamps",
        "_sys_flags",
        "_tags_codes",
        "keys",
        "properties",
        "topics",
        "uniq_keys",
    )  # fmt: skip
    phys = Column(np.int64)  # CommitLog offsets
    sizes = Column(np.int32)  # record sizes
    queue_ids = Column(np.int32)
    queue_offsets = Column(np.int64)
    tags_codes = Column(np.int64)
    sys_flags = Column(np.int32)
    store_timestamps = Column(np.int64)  # ms

    def __init__(
        self,
        phys: np.ndarray | list[int],
        sizes: np.ndarray | list[int],
        topics: Sequence[str],
        queue_ids: np.ndarray | list[int],
        queue_offsets: np.ndarray | list[int],
        tags_codes: np.ndarray | Sequence[int],
        sys_flags: np.ndarray | list[int],
        store_timestamps: np.ndarray | list[int],
        keys: Sequence[str | None] | None = None,
        uniq_keys: Sequence[str | None] | None = None,
        properties: Sequence[dict[str, str]] | None = None,
        end_offset: int | None = None,
    ) -> None:
        self._phys = phys
        self._sizes = sizes
        self.topics = topics
        self._queue_ids = queue_ids
        self._queue_offsets = queue_offsets
        self._tags_codes = tags_codes
        self._sys_flags = sys_flags
        self._store_timestamps = store_timestamps
        self.keys = [] if keys is None else keys
        self.uniq_keys = [] if uniq_keys is None else uniq_keys
        self.properties = [] if properties is None else properties
        self._end = end_offset  # CommitLog end of the last record, when the builder knows it

    def __len__(self) -> int:
        return len(self._phys)

    def __repr__(self) -> str:
        return f"DispatchBatch({len(self)} records, {self.topics[:3]}...)"

    @property
    def end_offset(self) -> int:
        if self._end is not None:
            return self._end
        phys, sizes = self._phys, self._sizes
        return int(phys[-1]) + int(sizes[-1]) if len(phys) else 0

    def consumable(self) -> np.ndarray:
        """Mask of records that get a ConsumeQueue unit (not PREPARED / ROLLBACK)."""
        t = self.sys_flags & L.TRANSACTION_MASK
        return (t == L.TRANSACTION_NOT_TYPE) | (t == L.TRANSACTION_COMMIT_TYPE)

    def take(self, idx: np.ndarray) -> DispatchBatch:
        """The records at ``idx`` (ascending), as a batch of their own."""
        at = idx.tolist()

        def pick(values: Any) -> Any:  # a list, or an IdColumn
            if not values:
                return values
            take = getattr(values, "take", None)  # an IdColumn takes its rows of digits
            return take(idx) if take is not None else [values[i] for i in at]

        return DispatchBatch(
            self.phys[idx], self.sizes[idx], pick(self.topics), self.queue_ids[idx], self.queue_offsets[idx],
            self.tags_codes[idx], self.sys_flags[idx], self.store_timestamps[idx],
            pick(self.keys), pick(self.uniq_keys), pick(self.properties),
        )  # fmt: skip

    def groups(self) -> dict[tuple[str, int], np.ndarray]:
        """Record indexes per (topic, queueId), in CommitLog order."""
        return group_by_queue(self.topics, self.queue_ids)

    def column_list(self, name: str) -> list[int]:
        """One numpy column (``"phys"``, ``"store_timestamps"``, ...) as a list of Python ints,
        without building the array when the batch still holds a list."""
        return as_list(getattr(self, "_" + name))

    def lists(self) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
        """(phys, sizes, tags_codes, queue_offsets, queue_ids, sys_flags) as lists of Python ints
        (no numpy round trip for a batch built from lists)."""
        cols = (
            self._phys,
            self._sizes,
            self._tags_codes,
            self._queue_offsets,
            self._queue_ids,
            self._sys_flags,
        )
        phys, sizes, tags, qoffs, qids, flags = cols
        if (
            phys.__class__ is list
            and sizes.__class__ is list
            and tags.__class__ is list
            and qoffs.__class__ is list
            and qids.__class__ is list
            and flags.__class__ is list
        ):
            return cols  # type: ignore[return-value]  # a put of a few records: the usual case (lists)
        return tuple(map(as_list, cols))  # type: ignore[return-value]


# batches up to this many records are dispatched record by record
SMALL_DISPATCH = 128
GROUP_TOPICS_VECTORISED = 8  # group_by_queue of a large batch of up to this many topics: numpy


def group_by_queue(
    topics: Sequence[str], queue_ids: np.ndarray
) -> dict[tuple[str, int], np.ndarray]:
    """Record indexes per (topic, queueId), in order (one pass in numpy when a batch is for one
    topic, the common case)."""
    n = len(topics)
    if n == 0:
        return {}
    if topics.count(topics[0]) == n:
        qids = np.asarray(queue_ids)
        if (qids == qids[0]).all():
            return {(topics[0], int(qids[0])): np.arange(n, dtype=np.int64)}
        uniq, inverse = np.unique(qids, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(len(uniq) + 1))
        return {
            (topics[0], int(q)): order[bounds[k] : bounds[k + 1]]
            for k, q in enumerate(uniq.tolist())
        }
    names = list(dict.fromkeys(topics))
    if len(names) <= GROUP_TOPICS_VECTORISED and n > SMALL_DISPATCH:
        # a few topics (a group commit: its op message and the real messages): codes by numpy
        tarr = np.array(topics, dtype=object)
        code = np.zeros(n, dtype=np.int64)
        for k, t in enumerate(names[1:], 1):
            code[tarr == t] = k
        key = (code << 32) | np.asarray(queue_ids, dtype=np.int64)
        uniq, inverse = np.unique(key, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(len(uniq) + 1))
        return {
            (names[int(u) >> 32], int(u) & 0xFFFFFFFF): order[bounds[k] : bounds[k + 1]]
            for k, u in enumerate(uniq.tolist())
        }
    out: dict[tuple[str, int], list[int]] = {}
    for i, (t, q) in enumerate(zip(topics, np.asarray(queue_ids).tolist(), strict=True)):
        out.setdefault((t, q), []).append(i)
    return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}


class Dispatcher(Protocol):
    """Something built from the CommitLog. ``dispatch`` must be idempotent: after a crash the
    same records can be dispatched again.  A dispatcher may also take single records by
    ``dispatch_one(phys, size, topic, queue_id, queue_offset, tags_code, sys_flag, store_ts_ms,
    keys, uniq_key, end_offset)``, the same as a batch of that one record; the store then hands
    a one-record put to it that way (no batch object)."""

    def dispatch(self, batch: DispatchBatch) -> None: ...


class ConsumeQueueDispatcher:
    """Builds ConsumeQueue units; half (PREPARED) and ROLLBACK records get none."""

    def __init__(self, store) -> None:  # type: ignore[no-untyped-def]
        self._store = store

    def dispatch(self, batch: DispatchBatch) -> None:
        if len(batch) <= SMALL_DISPATCH:
            self._dispatch_small(batch)
            return
        mask = batch.consumable()
        if mask.all():
            idx_groups = batch.groups()
        else:
            idx_groups = {k: v[mask[v]] for k, v in batch.groups().items() if mask[v].any()}
        for (topic, qid), idx in idx_groups.items():
            cq = self._store.consume_queue(topic, qid, create=True)
            cq.put_units(
                int(batch.queue_offsets[idx[0]]),
                batch.phys[idx],
                batch.sizes[idx],
                batch.tags_codes[idx],
            )

    def dispatch_one(  # type: ignore[no-untyped-def]
        self,
        phys: int,
        size: int,
        topic: str,
        queue_id: int,
        queue_offset: int,
        tags_code: int,
        sys_flag: int,
        *_,
    ) -> None:
        tran = sys_flag & L.TRANSACTION_MASK
        if tran != L.TRANSACTION_NOT_TYPE and tran != L.TRANSACTION_COMMIT_TYPE:
            return
        store = self._store
        cq = store._cqs.get((topic, queue_id)) or store.consume_queue(topic, queue_id, create=True)  # noqa: SLF001
        cq.put_unit(queue_offset, phys, size, tags_code)

    def _dispatch_small(self, batch: DispatchBatch) -> None:
        """A few records, unit by unit (numpy's per-call cost dominates there)."""
        store = self._store
        cqs = store._cqs  # noqa: SLF001 - the dispatcher is the store's own
        phys, sizes, tags, qoffs, qids, sflags = batch.lists()
        for i, topic in enumerate(batch.topics):
            tran = sflags[i] & L.TRANSACTION_MASK
            if tran != L.TRANSACTION_NOT_TYPE and tran != L.TRANSACTION_COMMIT_TYPE:
                continue
            cq = cqs.get((topic, qids[i])) or store.consume_queue(topic, qids[i], create=True)
            cq.put_unit(qoffs[i], phys[i], sizes[i], tags[i])
