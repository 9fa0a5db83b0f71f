"""Consumer offsets (group -> topic -> queue -> next offset to consume), persisted as RocketMQ's
``config/consumerOffset.json`` (``offsetTable`` keyed ``topic@group``).

:func:`check_offset` is the one rule of an entry: every commit (remoting's UPDATE_CONSUMER_OFFSET
and resets, gRPC's UpdateOffset, the connector's CommitOffsets, pulls) passes it before anything
is changed, and the loader holds the file to it at start, so nothing a request can write leaves
the broker unable to start."""

from __future__ import annotations

import logging
import operator
import os
import re
import threading
from collections.abc import Callable, Mapping

from rmq_spark.errors import MessageIllegalError
from rmq_spark.store import layout as L
from rmq_spark.store.jsonfile import JsonObject, write_json_atomic
from rmq_spark.store.validation import (
    check_group,
    check_group_cached,
    check_queue_id_value,
    check_topic_cached,
)

__all__ = ["ConsumerOffsetManager", "check_offset"]

log = logging.getLogger("rmq_spark.store")
_QUEUE_KEY = re.compile(r"[0-9]+")


def check_offset(group: str, topic: str, queue_id: int, offset: int) -> None:
    """The one rule of a consumer offset entry, for commits and for the loader alike: a valid group
    and topic name (any topic: retry, dead-letter and system ones too), a queue id between 0 and
    QUEUE_NUMS_MAX - 1, an offset between -1 (none) and a Java long's maximum.
    MessageIllegalError naming what is wrong."""
    check_group_cached(group)
    check_topic_cached(topic, allow_system=True)
    check_queue_id_value(queue_id)
    try:
        if isinstance(offset, bool):
            raise TypeError
        offset = operator.index(offset)
    except TypeError:
        raise MessageIllegalError(
            f"commitOffset {offset!r} of {topic}@{group} queue {queue_id} is not an integer"
        ) from None
    if offset < L.OFFSET_MIN:
        raise MessageIllegalError(
            f"commitOffset {offset} is not at least {L.OFFSET_MIN} ({topic}@{group} queue {queue_id})"
        )
    if offset > L.OFFSET_MAX:
        raise MessageIllegalError(
            f"commitOffset {offset} is more than {L.OFFSET_MAX} ({topic}@{group} queue {queue_id})"
        )


class ConsumerOffsetManager:
    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, L.CONFIG_DIR, L.CONSUMER_OFFSET_FILE)
        self._lock = threading.Lock()
        self._table: dict[str, dict[int, int]] = {}
        self._dirty = False
        data = JsonObject.load(self.path)
        if data is not None:
            self._load(data.obj("offsetTable"))

    def _load(self, table: JsonObject) -> None:
        """The file's entries, each held to :func:`check_offset` (ConfigError naming the key).  An
        entry whose topic or group is no valid name (an older version let one in over remoting) is
        dropped with a log line: no request can name it, so it could never be read or changed."""
        for key in table.data:
            if "@" not in key:
                raise table.error(key, "is not 'topic@group'")
            topic, group = key.split("@", 1)
            try:
                check_topic_cached(topic, allow_system=True)
                check_group(group)
            except MessageIllegalError as e:
                log.error("config file %s: entry %r dropped: %s", self.path, key[:200], e)
                continue
            queues = table.obj(key)
            offsets = {}
            for q in queues.data:
                if not _QUEUE_KEY.fullmatch(q):
                    raise queues.error(q, "is not a queue id")
                offset = queues.int(q, 0)
                try:
                    check_offset(group, topic, int(q), offset)
                except MessageIllegalError as e:
                    raise queues.error(q, str(e)) from None
                offsets[int(q)] = offset
            self._table[key] = offsets

    @staticmethod
    def _key(group: str, topic: str) -> str:
        return f"{topic}@{group}"

    def commit(
        self, group: str, topic: str, queue_id: int, offset: int, persist: bool = False
    ) -> None:
        """The group's next offset of the queue; an entry :func:`check_offset` refuses raises
        MessageIllegalError, nothing changed."""
        check_offset(group, topic, queue_id, offset)
        with self._lock:
            self._table.setdefault(self._key(group, topic), {})[int(queue_id)] = int(offset)
            self._dirty = True
        if persist:
            self.persist()

    def commit_many(
        self, group: str, offsets: Mapping[str, Mapping[int, int]], persist: bool = True
    ) -> None:
        """Many of :meth:`commit` as one change: every entry is checked first, so one that is
        refused leaves every offset as it was."""
        checked = []
        for topic, queues in offsets.items():
            for q, o in queues.items():
                check_offset(group, topic, q, o)
                checked.append((self._key(group, topic), int(q), int(o)))
        with self._lock:
            for key, q, o in checked:
                self._table.setdefault(key, {})[q] = o
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

    def pairs(self) -> list[tuple[str, str]]:
        """Every (group, topic) with committed offsets, sorted (one pass: no groups x topics walk)."""
        with self._lock:
            keys = list(self._table)
        return sorted((k.split("@", 1)[1], k.split("@", 1)[0]) for k in keys)

    def remove_group(self, group: str) -> None:
        check_group(group)
        self._remove(lambda k: k.split("@", 1)[1] == group)

    def remove_topic(self, topic: str) -> None:
        """Every group's offsets of ``topic`` go (the topic was deleted)."""
        check_topic_cached(topic, allow_system=True)
        self._remove(lambda k: k.split("@", 1)[0] == topic)

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
                    k: {str(q): o for q, o in sorted(v.items())}
                    for k, v in sorted(self._table.items())
                }
            }
            self._dirty = False
        write_json_atomic(self.path, snapshot)
