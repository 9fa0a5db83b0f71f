"""Consumer offsets (group -> topic -> queue -> next offset to consume), persisted as RocketMQ's
``config/consumerOffset.json`` (``offsetTable`` keyed ``topic@group``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from rmq_spark.store import layout as L
from rmq_spark.store.jsonfile import JsonObject, write_json_atomic


class ConsumerOffsetManager:
    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, L.CONFIG_DIR, L.CONSUMER_OFFSET_FILE)
        self._lock = threading.Lock()
        self._table: dict[str, dict[int, int]] = {}
        self._dirty = False
        data = JsonObject.load(self.path)
        if data is not None:
            table = data.obj("offsetTable")
            for key, _queues in table.items():
                if "@" not in key:
                    raise table.error(key, "is not 'topic@group'")
                queues = table.obj(key)
                offsets = {}
                for q, _o in queues.items():
                    if not q.isdigit():
                        raise queues.error(q, "is not a queue id")
                    offsets[int(q)] = queues.int(q, 0, -1)
                self._table[key] = offsets

    @staticmethod
    def _key(group: str, topic: str) -> str:
        return f"{topic}@{group}"

    def commit(self, group: str, topic: str, queue_id: int, offset: int, persist: bool = False) -> None:
        with self._lock:
            self._table.setdefault(self._key(group, topic), {})[queue_id] = offset
            self._dirty = True
        if persist:
            self.persist()

    def commit_many(self, group: str, offsets: dict[str, dict[int, int]], persist: bool = True) -> None:
        with self._lock:
            for topic, queues in offsets.items():
                t = self._table.setdefault(self._key(group, topic), {})
                for q, o in queues.items():
                    t[int(q)] = int(o)
            self._dirty = True
        if persist:
            self.persist()

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed next offset, or -1 when the group has none for the queue."""
        with self._lock:
            return self._table.get(self._key(group, topic), {}).get(queue_id, -1)

    def query_topic(self, group: str, topic: str) -> dict[int, int]:
        with self._lock:
            return dict(self._table.get(self._key(group, topic), {}))

    def groups(self) -> list[str]:
        with self._lock:
            return sorted({k.split("@", 1)[1] for k in self._table})

    def remove_group(self, group: str) -> None:
        self._remove(lambda k: k.split("@", 1)[1] == group)

    def remove_topic(self, topic: str) -> None:
        """Every group's offsets of ``topic`` go (the topic was deleted)."""
        self._remove(lambda k: k.rsplit("@", 1)[0] == topic)

    def _remove(self, which: Callable[[str], bool]) -> None:
        with self._lock:
            for k in [k for k in self._table if which(k)]:
                del self._table[k]
            self._dirty = True
        self.persist()

    def persist(self) -> None:
        with self._lock:
            if not self._dirty and os.path.exists(self.path):
                return
            snapshot = {
                "offsetTable": {
                    k: {str(q): o for q, o in sorted(v.items())} for k, v in sorted(self._table.items())
                }
            }
            self._dirty = False
        write_json_atomic(self.path, snapshot)
