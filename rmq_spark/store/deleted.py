"""Deleted topics: what a topic delete leaves in the CommitLog is never indexed again.

A delete drops the topic's ConsumeQueues and its consumer offsets, as RocketMQ's ``deleteTopics``
does, but the records stay in the CommitLog until their segments expire.  The clean-start check
holds the ConsumeQueues to the CommitLog and rebuilds missing units from it, and a crash makes
recovery dispatch the log's tail again: both would bring the deleted messages back, and a topic
created again under the same name would show them.  So the delete leaves a tombstone, the
CommitLog end at the moment of the delete, persisted in ``config/deletedTopics.json`` before any
file of the topic goes: records of the topic below it get no ConsumeQueue unit, no index hit and
no place in the check; records appended later (the topic created again) are the topic's anew,
from queue offset 0.  A tombstone goes once the CommitLog's first segment starts at or past it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

import numpy as np

from rmq_spark.errors import MessageIllegalError
from rmq_spark.store import layout as L
from rmq_spark.store.dispatch import DispatchBatch
from rmq_spark.store.jsonfile import JsonObject, write_json_atomic
from rmq_spark.store.validation import check_topic

log = logging.getLogger("rmq_spark.store")

__all__ = ["DeletedTopics"]


class DeletedTopics:
    """topic -> the CommitLog offset below which its records are deleted ones."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, L.CONFIG_DIR, L.DELETED_TOPICS_FILE)
        self._lock = threading.Lock()
        self.below: dict[str, int] = {}
        data = JsonObject.load(self.path)
        if data is not None:
            table = data.obj("deletedTopics")
            for t in table.data:
                offset = table.int(t, 0, 0)
                try:
                    check_topic(t, allow_system=True)
                except MessageIllegalError as e:
                    # a tombstone an older version wrote for a name no record can carry: it hides nothing
                    log.warning("config file %s: tombstone %r dropped: %s", self.path, t[:200], e)
                    continue
                self.below[t] = offset

    def __bool__(self) -> bool:
        return bool(self.below)

    def add(self, topic: str, offset: int) -> None:
        """Records of ``topic`` below CommitLog ``offset`` are deleted (durable on return)."""
        check_topic(topic, allow_system=True)
        with self._lock:
            self.below = {**self.below, topic: max(offset, self.below.get(topic, 0))}
            self._persist()

    def prune(self, commitlog_min_offset: int) -> None:
        """Tombstones every record of which has left the CommitLog go."""
        with self._lock:
            kept = {t: o for t, o in self.below.items() if o > commitlog_min_offset}
            if kept != self.below:
                self.below = kept
                self._persist()

    def is_deleted(self, topic: str, phys: int) -> bool:
        return phys < self.below.get(topic, -1)

    def deleted_mask(self, topics: Sequence[str], phys: np.ndarray) -> np.ndarray | None:
        """Mask of the records (``topics``, CommitLog offsets ``phys``) that are deleted ones;
        None when there is none."""
        below = self.below
        hit = [t for t in set(topics) if t in below]
        if not hit:
            return None
        bound = np.fromiter((below.get(t, -1) for t in topics), dtype=np.int64, count=len(topics))
        mask = np.asarray(phys, dtype=np.int64) < bound
        return mask if mask.any() else None

    def live(self, batch: DispatchBatch) -> DispatchBatch:
        """``batch`` without its deleted records."""
        if not self.below or len(batch) == 0:
            return batch
        mask = self.deleted_mask(batch.topics, batch.phys)
        return batch if mask is None else batch.take(np.flatnonzero(~mask))

    def _persist(self) -> None:
        write_json_atomic(self.path, {"deletedTopics": dict(sorted(self.below.items()))})
