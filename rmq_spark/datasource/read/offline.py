"""Planning a batch read of a store directory Apache RocketMQ wrote, from its files alone.

``spark.read.format("rmq").option("path", storeDir)`` on a store that
:func:`rmq_spark.store.apache.is_apache_store` recognises starts nothing: the driver plans with
:class:`OfflineClient` (the planner's calls -- topics, offsets, offsets by time, info -- answered
by a read-only :class:`~rmq_spark.store.reader.StoreReader`) and every executor reads its ranges
with the bulk reader (:mod:`rmq_spark.datasource.read.files`).  The broker may be stopped or
running: nothing is written, no lock is taken, and what a read plans is what the ConsumeQueues
held when it planned.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

from rmq_spark.errors import StoreError
from rmq_spark.store import layout as L
from rmq_spark.store.apache import check_apache_store, topic_queue_nums

__all__ = ["OfflineClient"]

_SYSTEM_PREFIXES = (L.RETRY_GROUP_TOPIC_PREFIX, L.DLQ_GROUP_TOPIC_PREFIX)


class OfflineClient:
    """The planner's broker calls, answered from the store files at ``root``."""

    def __init__(self, root: str) -> None:
        from rmq_spark.datasource.read.files import store_reader

        self.root = os.path.realpath(root)
        check_apache_store(self.root, [])
        self.reader = store_reader(self.root)
        self._configs = topic_queue_nums(self.root)

    def info(self) -> dict[str, Any]:
        return {"store_root": self.root, "host": socket.gethostname(), "offline": True}

    def _queues(self, topic: str) -> list[int]:
        have = set(self.reader.queue_ids(topic))
        cfg = self._configs.get(topic)
        if cfg is not None:
            have.update(range(int(cfg.get("readQueueNums") or 0)))
        return sorted(have)

    def topics(self) -> dict[str, int]:
        """User topics (no system, retry or DLQ topic) and their queue counts."""
        names = set(self.reader.topics()) | set(self._configs)
        # TBW102 and the topics named after the cluster and the broker: templates for
        # auto-created topics (perm INHERIT), never user topics
        inherit = {t for t, c in self._configs.items() if int(c.get("perm") or 0) & L.PERM_INHERIT}
        return {
            t: max(self._queues(t), default=-1) + 1
            for t in sorted(names)
            if not L.is_system_topic(t) and not t.startswith(_SYSTEM_PREFIXES) and t not in inherit
        }

    def offsets(
        self, topics: list[str]
    ) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
        check_apache_store(self.root, topics)
        hi: dict[str, dict[str, int]] = {}
        lo: dict[str, dict[str, int]] = {}
        for t in topics:
            qs = self._queues(t)
            hi[t] = {str(q): self.reader.max_offset(t, q) for q in qs}
            lo[t] = {str(q): min(self.reader.min_offset(t, q), hi[t][str(q)]) for q in qs}
        return hi, lo

    def offsets_for_times(
        self, queues: Mapping[str, list[int]], timestamp_ms: int
    ) -> dict[str, dict[str, int]]:
        return {
            t: {str(q): self.reader.offset_by_time(t, int(q), timestamp_ms) for q in qs}
            for t, qs in queues.items()
        }

    def read_arrow(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreError(
            f"the store {self.root} was written by Apache RocketMQ and is read from its files, which this "
            f"machine ({socket.gethostname()}) cannot open: run the read where the store directory is mounted, "
            "or read the cluster through 'namesrvAddr'"
        )

    def close(self) -> None:
        """The reader stays cached for this process (:func:`store_reader`)."""
