"""Message lookups: by offsetMsgId, by unique id (UNIQ_KEY), by key within a time range, and the
queue offset for a store time.

* **offsetMsgId** (``MessageDecoder.createMessageId``: store IP, port, CommitLog offset in hex) is
  decoded to a CommitLog offset; the record there must be a valid record starting exactly there
  (magic, size, body CRC), otherwise the id is unknown.  The address part is not compared: it names
  the broker that was asked, which a store that changed address would no longer match.
* **unique id**: the index under ``topic#UNIQ_KEY``; records whose UNIQ_KEY or topic differ (hash
  collisions) are dropped; when several records carry the id the earliest stored wins, as in
  RocketMQ's ``MQAdminImpl.queryMessageByUniqKey``.  Without a topic every non-system topic is
  searched.  Records of a deleted topic (:mod:`rmq_spark.store.deleted`) are never found.
* **key**: the index under ``topic#key``; newest first, at most ``limit``; a record matches when one
  of its space-separated KEYS equals ``key`` exactly and its store time (milliseconds, re-read from
  the record) lies in ``[begin_ms, end_ms]``.  Collisions never use up the limit: the index is asked
  again for more candidates until ``limit`` matches or the chain ends.
* **queue offset by time**: a binary search over store times of the ConsumeQueue units.
"""

from __future__ import annotations

import enum

from rmq_spark.errors import RmqError, StoreError
from rmq_spark.store import layout as L
from rmq_spark.store.index.service import IndexService
from rmq_spark.store.message import MessageExt, decode_offset_msg_id

__all__ = ["MAX_TIME_MS", "Boundary", "MessageIdError", "MessageQuery"]

MAX_TIME_MS = 2**63 - 1
DEFAULT_KEY_LIMIT = 64  # maxMsgsNumBatch
_UNIQ_CANDIDATES = 32


class MessageIdError(RmqError, ValueError):
    """A message id is not an offsetMsgId (32 or 56 hexadecimal characters)."""


class Boundary(enum.Enum):
    """Which queue offset :meth:`MessageQuery.offset_by_time` returns for a store time ``t``."""

    LOWER = "LOWER"  # the first offset stored at or after t (bisect left)
    UPPER = "UPPER"  # the first offset stored after t (bisect right)


class MessageQuery:
    """Lookups over a :class:`MessageStore` and its :class:`IndexService` (found among the store's
    dispatchers when not given)."""

    def __init__(  # type: ignore[no-untyped-def]
        self, store, index: IndexService | None = None
    ) -> None:
        self.store = store
        if index is None:
            index = next((d for d in store.dispatchers if isinstance(d, IndexService)), None)
        self.index = index

    def _require_index(self) -> IndexService:
        if self.index is None:
            raise StoreError(
                "this store has no key index: open it with "
                "MessageStore(..., dispatchers=[IndexService])"
            )
        return self.index

    # --- records -----------------------------------------------------------------------------
    def read_at(self, commitlog_offset: int, verify_crc: bool = True) -> MessageExt | None:
        """The record starting at ``commitlog_offset``; None when no record starts there.  A
        record that starts there but is damaged raises :class:`CorruptStoreError` (file and
        position): an index or an id led to it, and it is never served (``verify_crc`` is kept
        for callers; every read checks the CRCs)."""
        cl = self.store.commitlog
        if not cl.min_offset <= commitlog_offset < cl.max_offset:
            return None
        return cl.read_record(commitlog_offset)

    # --- ids ---------------------------------------------------------------------------------
    def by_offset_msg_id(self, msg_id: str) -> MessageExt | None:
        """The message an offsetMsgId names; None if no record starts at its offset."""
        try:
            _host, _port, offset = decode_offset_msg_id(msg_id)
        except ValueError as e:
            raise MessageIdError(str(e)) from e
        return self.read_at(offset, verify_crc=True)

    def by_unique_id(self, uniq_id: str, topic: str | None = None) -> MessageExt | None:
        """The earliest stored message of ``topic`` (any non-system topic if None) whose UNIQ_KEY
        is ``uniq_id``; None if there is none."""
        index = self._require_index()
        if topic is None:
            topics = sorted({t for t, _ in self.store.queue_keys()} | set(self.store.topics.topics))
            topics = [t for t in topics if not L.is_system_topic(t)]
        else:
            topics = [topic]
        best: MessageExt | None = None
        deleted = self.store.deleted.is_deleted
        for t in topics:
            want = _UNIQ_CANDIDATES
            while True:
                offsets = index.query_offsets(t, uniq_id, want)
                for phy in offsets:
                    m = self.read_at(phy)
                    if m is None or m.topic != t or m.uniq_key != uniq_id or deleted(t, phy):
                        continue
                    if best is None or (m.store_timestamp_ms, m.commitlog_offset) < (
                        best.store_timestamp_ms,
                        best.commitlog_offset,
                    ):
                        best = m
                if len(offsets) < want:
                    break
                want *= 4
        return best

    # --- keys --------------------------------------------------------------------------------
    def by_key(
        self,
        topic: str,
        key: str,
        begin_ms: int = 0,
        end_ms: int = MAX_TIME_MS,
        limit: int = DEFAULT_KEY_LIMIT,
    ) -> list[MessageExt]:
        """Messages of ``topic`` with ``key`` among their KEYS, stored in ``[begin_ms, end_ms]``,
        newest first, at most ``limit``."""
        index = self._require_index()
        if limit <= 0 or not key or begin_ms > end_ms:
            return []
        want = limit
        deleted = self.store.deleted.is_deleted
        while True:
            offsets = index.query_offsets(topic, key, want, begin_ms, end_ms)
            out: list[MessageExt] = []
            seen: set[int] = set()
            for phy in offsets:
                if phy in seen:  # a key listed twice in one message
                    continue
                seen.add(phy)
                m = self.read_at(phy)
                if (
                    m is None
                    or deleted(topic, phy)
                    or m.topic != topic
                    or not begin_ms <= m.store_timestamp_ms <= end_ms
                    or key not in (m.keys or "").split(L.KEY_SEPARATOR)
                ):
                    continue
                out.append(m)
                if len(out) >= limit:
                    return out
            if len(offsets) < want:
                return out
            want *= 4

    # --- time --------------------------------------------------------------------------------
    def offset_by_time(
        self, topic: str, queue_id: int, timestamp_ms: int, boundary: Boundary = Boundary.LOWER
    ) -> int:
        """The queue offset at store time ``timestamp_ms`` (see :class:`Boundary`); between the
        queue's min and max offset, 0 for a queue that does not exist.  ``[offset_by_time(a),
        offset_by_time(b, UPPER))`` are the messages stored in ``[a, b]``."""
        cq = self.store.consume_queue(topic, queue_id)
        if cq is None:
            return 0
        store_time = self.store.commitlog.store_timestamp
        lo, hi = cq.min_offset, cq.max_offset
        upper = boundary is Boundary.UPPER
        while lo < hi:
            mid = (lo + hi) // 2
            unit = cq.unit(mid)
            t = store_time(unit[0]) if unit is not None else -1
            if unit is None or t > timestamp_ms or (not upper and t == timestamp_ms):
                hi = mid
            else:
                lo = mid + 1
        return lo
