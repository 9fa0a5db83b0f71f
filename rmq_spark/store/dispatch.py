"""Dispatch: appended CommitLog records become ConsumeQueue units (and index entries, and whatever
else joins) through one small interface.

Records are dispatched in whole batches: a :class:`DispatchBatch` is a set of columns, built by the
put path straight from the encoder (no re-parse) and by recovery from a scan of the CommitLog.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from rmq_spark.store import layout as L


@dataclass
class DispatchBatch:
    phys: np.ndarray  # int64 CommitLog offsets
    sizes: np.ndarray  # int32 record sizes
    topics: list[str]
    queue_ids: np.ndarray  # int32
    queue_offsets: np.ndarray  # int64
    tags_codes: np.ndarray  # int64
    sys_flags: np.ndarray  # int32
    store_timestamps: np.ndarray  # int64 ms
    keys: list[str | None] = field(default_factory=list)
    uniq_keys: list[str | None] = field(default_factory=list)
    properties: list[dict[str, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.phys)

    @property
    def end_offset(self) -> int:
        return int(self.phys[-1]) + int(self.sizes[-1]) if len(self.phys) else 0

    def consumable(self) -> np.ndarray:
        """Mask of records that get a ConsumeQueue unit (not PREPARED / ROLLBACK)."""
        t = self.sys_flags & L.TRANSACTION_MASK
        return (t == L.TRANSACTION_NOT_TYPE) | (t == L.TRANSACTION_COMMIT_TYPE)

    def groups(self) -> dict[tuple[str, int], np.ndarray]:
        """Record indexes per (topic, queueId), in CommitLog order."""
        return group_by_queue(self.topics, self.queue_ids)


def group_by_queue(topics: list[str], queue_ids: np.ndarray) -> dict[tuple[str, int], np.ndarray]:
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
            (topics[0], int(q)): order[bounds[k] : bounds[k + 1]] for k, q in enumerate(uniq.tolist())
        }
    out: dict[tuple[str, int], list[int]] = {}
    for i, (t, q) in enumerate(zip(topics, np.asarray(queue_ids).tolist())):
        out.setdefault((t, q), []).append(i)
    return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}


class Dispatcher(Protocol):
    """Something built from the CommitLog. ``dispatch`` must be idempotent: after a crash the
    same records can be dispatched again."""

    def dispatch(self, batch: DispatchBatch) -> None: ...


# batches up to this many records are dispatched record by record
SMALL_DISPATCH = 4


class ConsumeQueueDispatcher:
    """Builds ConsumeQueue units; half (PREPARED) and ROLLBACK records get none."""

    def __init__(self, store) -> None:  # type: ignore[no-untyped-def]
        self._store = store

    def dispatch(self, batch: DispatchBatch) -> None:
        if len(batch.phys) <= SMALL_DISPATCH:
            self._dispatch_small(batch)
            return
        mask = batch.consumable()
        if mask.all():
            idx_groups = batch.groups()
        else:
            idx_groups = {
                k: v[mask[v]] for k, v in batch.groups().items() if mask[v].any()
            }
        for (topic, qid), idx in idx_groups.items():
            cq = self._store.consume_queue(topic, qid, create=True)
            cq.put_units(
                int(batch.queue_offsets[idx[0]]),
                batch.phys[idx],
                batch.sizes[idx],
                batch.tags_codes[idx],
            )

    def _dispatch_small(self, batch: DispatchBatch) -> None:
        """A few records, unit by unit (numpy's per-call cost dominates there)."""
        phys, sizes, tags = batch.phys, batch.sizes, batch.tags_codes
        qoffs = batch.queue_offsets.tolist()
        for i, (topic, qid, sf) in enumerate(zip(batch.topics, batch.queue_ids.tolist(), batch.sys_flags.tolist())):
            tran = sf & L.TRANSACTION_MASK
            if tran != L.TRANSACTION_NOT_TYPE and tran != L.TRANSACTION_COMMIT_TYPE:
                continue
            cq = self._store.consume_queue(topic, qid, create=True)
            cq.put_units(qoffs[i], phys[i : i + 1], sizes[i : i + 1], tags[i : i + 1])
