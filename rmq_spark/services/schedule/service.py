"""ScheduleService: RocketMQ's delay levels, delivered exactly once across crashes.

A message with property ``DELAY=n`` (n > 0) is stored in ``SCHEDULE_TOPIC_XXXX`` queue ``n - 1``
(a level above the maximum is clamped to it) with ``REAL_TOPIC``/``REAL_QID``; the store gives its
ConsumeQueue unit tagsCode = store time + the level's delay.  One cursor per level walks that queue
in order and re-writes every due message to its real topic and queue, as one CommitLog write per
batch (:mod:`rmq_spark.services.redelivery.rewrite`).  The copy stores the properties of its
schedule record unchanged, ``DELAY``, ``REAL_TOPIC`` and ``REAL_QID`` included, as Apache's
``ScheduleMessageService.messageTimeUp`` stores them (the tags code computed from ``TAGS`` again).

Exactly once: progress is saved to ``config/delayOffset.json`` (atomically, once the CommitLog is
durable up to it) with the CommitLog end at the time.  On start the CommitLog is scanned from
there for delivered copies -- records outside the system topics that keep ``DELAY`` -- and each
level's cursor moves past the sources they match, in order (:meth:`ScheduleService._reconcile`),
so a crash at any moment neither loses nor repeats a delivery (Apache saves progress every 10 s
and redelivers after a crash).  No property of this broker's own is stored (``docs/semantics.md``).
A failed write leaves the cursor where it was and is retried after a
back-off (100 ms doubling to 10 s); a message whose real topic cannot take it (topic missing with
auto-creation off) holds back its own level only.

``config/delayOffset.json`` (RocketMQ's ``DelayOffsetSerializeWrapper`` plus two keys)::

    ┌───────────────────┬────────────────────────────────────────────────────────────────┐
    │ offsetTable       │ {"level": next ConsumeQueue offset to deliver, ...}           │
    │ commitLogOffset   │ CommitLog end when the table was taken: every delivery not    │
    │                   │ counted in the table lies at or after it (recovery scans here) │
    │ dataVersion       │ {"counter": n, "stateVersion": 0, "timestamp": ms}             │
    │ version           │ 1                                                              │
    └───────────────────┴────────────────────────────────────────────────────────────────┘

How a due record is re-written lives in :mod:`rmq_spark.services.redelivery.rewrite`; the checkpoint writer,
service thread and lifecycle the timer service shares, in :mod:`rmq_spark.services.redelivery.delivery`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from rmq_spark.errors import MessageIllegalError, RmqError
from rmq_spark.services.redelivery.delivery import (
    DeliveryLifecycle,
    ServiceThread,
    StagedCheckpoint,
    backoff_ms,
)
from rmq_spark.services.redelivery.patch import PATCH_MIN_MSGS, patch_redelivery
from rmq_spark.services.redelivery.records import (
    DELIVERY_DROP,
    DELIVERY_KEYS,
    StoredRecords,
    read_records,
)
from rmq_spark.services.redelivery.recovery import same_message, scan_copies
from rmq_spark.services.redelivery.rewrite import encode_redelivered, resolve_queue
from rmq_spark.store import layout as L
from rmq_spark.store.clock import Clock
from rmq_spark.store.encoded import EncodedBatch
from rmq_spark.store.jsonfile import JsonObject
from rmq_spark.store.message import Message

if TYPE_CHECKING:
    from rmq_spark.services.config import BrokerConfig
    from rmq_spark.store.store import MessageStore, TagsCodeRule

__all__ = ["ScheduleService", "ScheduleStats", "delivery_time_rule", "store_rules"]

logger = logging.getLogger(__name__)

_TIMER_PROPS = (L.P_TIMER_DELIVER_MS, L.P_TIMER_DELAY_SEC, L.P_TIMER_DELAY_MS)
_UNCONSUMABLE = (L.TRANSACTION_PREPARED_TYPE, L.TRANSACTION_ROLLBACK_TYPE)
_SCHEDULE_KEYS = DELIVERY_KEYS
_SCHEDULE_DROP = DELIVERY_DROP
_RECONCILE_READ = 1024  # schedule records read at a time while matching copies


# --- the service ----------------------------------------------------------------------------------
@dataclass
class ScheduleStats:
    delivered: int = 0
    discarded: int = 0  # real topic is the transaction half topic, or no REAL_TOPIC at all
    failed_puts: int = 0
    reconciled: int = 0  # sources found already delivered at start or after a failed put
    patched: int = 0  # delivered through the byte-patching path (the rest: decoded, encoded)
    busy_s: float = 0.0  # CPU time (this thread) of rounds that delivered something
    per_level: dict[int, int] = field(default_factory=dict)


# the schedule topic's queues, as RocketMQ creates it (queue = delay level - 1)
SCHEDULE_QUEUES = 18


def delivery_time_rule(levels_ms: list[int]) -> TagsCodeRule:
    """The schedule topic's tagsCode rule for the store: a record's delivery time, its store time
    plus the delay of its ``DELAY`` level (clamped to the levels; 1 s when not a number), as
    RocketMQ's ``CommitLog.checkMessageAndReturnSize`` computes it."""

    def rule(props: dict[str, str], store_ts: int) -> int | None:
        raw = props.get(L.P_DELAY)
        if raw is None:
            return None
        try:
            level = int(raw)
        except ValueError:
            return store_ts + 1000
        return store_ts + levels_ms[min(max(level, 1), len(levels_ms)) - 1]

    return rule


def store_rules(config: BrokerConfig) -> dict[str, TagsCodeRule]:
    """The tagsCode rules to open the store with (``MessageStore(..., tags_code_rules=...)``)."""
    return {L.SCHEDULE_TOPIC: delivery_time_rule(config.delay_levels_ms)}


class ScheduleService(DeliveryLifecycle):
    """Delay levels (see the module docstring).  ``run_once`` delivers what is due at
    ``clock.now_ms()``; ``start`` runs it on a thread woken by new schedule messages.

    ``batch_max_msgs``: messages per CommitLog write; ``checkpoint_interval_ms``: how often
    progress is saved; ``round_gap_ms``: least time between the thread's rounds."""

    TOPIC = L.SCHEDULE_TOPIC
    CHECKPOINT_THREAD = "rmq-schedule-checkpoint"

    def __init__(
        self,
        store: MessageStore,
        config: BrokerConfig,
        clock: Clock,
        *,
        batch_max_msgs: int = 1024,
        checkpoint_interval_ms: int = 1000,
        round_gap_ms: int = 5,
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.levels_ms: list[int] = list(config.delay_levels_ms)
        if L.SCHEDULE_TOPIC not in store.tags_code_rules:
            raise ValueError(
                "the store must be opened with the schedule topic's tagsCode rule (store_rules)"
            )
        store.topics.register_system_topic(L.SCHEDULE_TOPIC, SCHEDULE_QUEUES)
        self.batch_max_msgs = batch_max_msgs
        self.patch_min_msgs = PATCH_MIN_MSGS
        self.wait_max_ms = max(10, int(config.timer_precision_ms))
        self.stats = ScheduleStats()
        self.last_error: BaseException | None = None
        self.offsets: dict[int, int] = {}  # schedule queueId (level - 1) -> next queue offset
        self._retry_at_ms: dict[int, int] = {}
        self._backoff_ms: dict[int, int] = {}
        self._lock = threading.RLock()
        path = os.path.join(store.root, L.CONFIG_DIR, L.DELAY_OFFSET_FILE)
        self._checkpoint = StagedCheckpoint(
            store, path, checkpoint_interval_ms, self._locked_snapshot
        )
        self._thread = ServiceThread(
            "rmq-schedule", self.run_once, self.next_wait_ms, lambda: store.closed, round_gap_ms
        )
        store.add_listener(self._on_dispatch, self.TOPIC)
        data = JsonObject.load(path) or JsonObject(path, {})
        self._load(data)
        pending = any(off < self._queue_end(q) for q, off in self.offsets.items())
        if pending:  # else no delivery can be missing from the saved progress
            self.stats.reconciled += self._reconcile(data.int("commitLogOffset", 0, 0))

    # --- put hook ---------------------------------------------------------------------------------
    def transform(self, msg: Message) -> Message:
        """A message with ``DELAY=n > 0`` goes to the schedule topic, queue ``min(n, max) - 1``.
        Timer properties on it are dropped: the level wins (as ``HookUtils``)."""
        p = msg.properties
        raw = p.get(L.P_DELAY)
        if raw is None or msg.topic in (L.SCHEDULE_TOPIC, L.TIMER_TOPIC):
            return msg
        if msg.sys_flag & L.TRANSACTION_MASK in _UNCONSUMABLE:
            return msg  # a half message is delayed when it is committed
        try:
            level = int(raw)
        except ValueError:
            raise MessageIllegalError(
                f"property DELAY={raw!r} is not an integer delay level"
            ) from None
        if level <= 0:
            return msg
        level = min(level, len(self.levels_ms))
        props = {k: v for k, v in p.items() if k not in _TIMER_PROPS}
        props[L.P_DELAY] = str(level)
        props[L.P_REAL_TOPIC] = msg.topic
        props[L.P_REAL_QID] = str(msg.queue_id)
        return replace(msg, topic=L.SCHEDULE_TOPIC, queue_id=level - 1, properties=props)

    # --- state ------------------------------------------------------------------------------------
    def _load(self, data: JsonObject) -> None:
        table = data.obj("offsetTable")
        for q in range(len(self.levels_ms)):
            cq = self.store.consume_queue(L.SCHEDULE_TOPIC, q)
            lo, hi = (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)
            saved = table.int(str(q + 1), lo)  # out of the queue: clamped (correctDelayOffset)
            self.offsets[q] = min(max(saved, lo), hi)  # correctDelayOffset

    def _queue_end(self, q: int) -> int:
        cq = self.store.consume_queue(L.SCHEDULE_TOPIC, q)
        return cq.max_offset if cq is not None else 0

    def _reconcile(self, start: int) -> int:
        """Move each cursor past the sources delivered at CommitLog offset >= ``start``.

        Every copy written from ``start`` on lies after the cursors' saved place, and a level
        delivers its records in queue order, skipping only those it discards (no real topic, or
        the half topic): so the copies of level ``n`` (``DELAY=n``, outside the system topics),
        in CommitLog order, are the level's next records that are not discarded.  Each one moves
        the cursor past the record it matches (unique id, born time, body); a record that does
        not match (a copy older than the cursor, on a store another broker wrote) moves
        nothing."""
        by_level: dict[int, list[Any]] = {}
        for copy in scan_copies(self.store, start, L.P_DELAY):
            raw = copy.properties.get(L.P_DELAY, "")
            if raw.isdigit() and int(raw) - 1 in self.offsets:
                by_level.setdefault(int(raw) - 1, []).append(copy)
        moved = 0
        for q, copies in by_level.items():
            cq = self.store.consume_queue(L.SCHEDULE_TOPIC, q)
            if cq is None:
                continue
            cursor = max(self.offsets[q], cq.min_offset)
            hi = cq.max_offset
            window: tuple[int, StoredRecords] | None = None
            for copy in copies:
                j = cursor
                while j < hi:
                    if window is None or not window[0] <= j < window[0] + len(window[1]):
                        units = cq.units(j, min(hi, j + _RECONCILE_READ))
                        window = (j, read_records(self.store, units["offset"], units["size"]))
                    src, i = window[1], j - window[0]
                    real = src.properties[i].get(L.P_REAL_TOPIC)
                    if real is None or real == L.TRANS_HALF_TOPIC:
                        j += 1  # discarded when it came due: no copy
                        continue
                    if same_message(
                        copy,
                        src.properties[i].get(L.P_UNIQ_KEY),
                        int(src.born_timestamps[i]),
                        src.bodies[i],
                    ):
                        moved += j + 1 - cursor
                        cursor = j + 1
                    break
            self.offsets[q] = cursor
        return moved

    def _locked_snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        return {
            "offsetTable": {str(q + 1): off for q, off in sorted(self.offsets.items())},
            "commitLogOffset": self.store.commitlog.max_offset,
            "version": 1,
        }

    # --- delivery ---------------------------------------------------------------------------------
    def run_once(self) -> int:
        """Deliver every message due at ``clock.now_ms()``; returns how many were delivered."""
        with self._lock:
            began = time.thread_time()
            now = self.clock.now_ms()
            total = 0
            while True:
                plan = self._plan(now)
                if not plan:
                    break
                n, more = self._deliver(plan, now)
                total += n
                if not more:
                    break
            self._checkpoint.tick(now)
            if total:
                self.stats.busy_s += time.thread_time() - began
            return total

    def _plan(self, now: int) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
        """Per level: (queueId, first offset, units, deliver times) of the due prefix."""
        plan = []
        budget = self.batch_max_msgs
        for q, delay in enumerate(self.levels_ms):
            if budget <= 0:
                break
            retry_at = self._retry_at_ms.get(q)
            if retry_at is not None:
                if retry_at > now:
                    continue
                del self._retry_at_ms[q]
            cq = self.store.consume_queue(L.SCHEDULE_TOPIC, q)
            if cq is None:
                continue
            start = max(self.offsets.get(q, 0), cq.min_offset)
            hi = cq.max_offset
            if start >= hi:
                continue
            units = cq.units(start, min(hi, start + budget))
            ts = units["tags_code"].astype(np.int64)
            late = ts > now + delay  # the clock went back: deliver now (correctDeliverTimestamp)
            not_due = (ts > now) & ~late
            k = int(np.argmax(not_due)) if not_due.any() else len(units)
            if k == 0:
                continue
            plan.append((q, start, units[:k], np.where(late[:k], now, ts[:k])))
            budget -= k
        return plan

    def _deliver(
        self, plan: list[tuple[int, int, np.ndarray, np.ndarray]], now: int
    ) -> tuple[int, bool]:
        """Deliver the planned prefixes as one write.  Returns (delivered, maybe more due)."""
        phys = np.concatenate([u["offset"] for _, _, u, _ in plan]).astype(np.int64)
        sizes = np.concatenate([u["size"] for _, _, u, _ in plan]).astype(np.int64)
        taken = len(phys)
        batch = self._fast_batch(plan, phys, sizes)
        if batch is not None:  # every planned message goes
            ends = {q: start + len(units) for q, start, units, _ in plan}
            counts = {q: len(units) for q, _, units, _ in plan}
            return self._write(plan, batch, None, ends, counts, now, taken)
        src = read_records(self.store, phys, sizes)
        rows: list[int] = []
        topics: list[str] = []
        qids: list[int] = []
        props: list[dict[str, str]] = []
        ends = {}
        counts = {}
        cache: dict[str, int] = {}
        row = 0
        for q, start, units, _deliver in plan:
            end = start
            for j in range(len(units)):
                i = row + j
                p = src.properties[i]
                real = p.get(L.P_REAL_TOPIC)
                if real is None or real == L.TRANS_HALF_TOPIC:
                    logger.warning(
                        "schedule queue %d offset %d: discarded (real topic %r)", q, start + j, real
                    )
                    self.stats.discarded += 1
                    end = start + j + 1
                    continue
                try:
                    qid = resolve_queue(self.store, real, p.get(L.P_REAL_QID), cache)
                except RmqError as e:
                    self._hold(q, now, e)  # this level waits; the others go on
                    break
                p = {k: v for k, v in p.items() if k not in _SCHEDULE_DROP}  # stored as it was
                rows.append(i)
                topics.append(real)
                qids.append(qid)
                props.append(p)
                counts[q] = counts.get(q, 0) + 1
                end = start + j + 1
            ends[q] = end
            row += len(units)
        general = (src, rows, topics, qids, props) if rows else None
        return self._write(plan, None, general, ends, counts, now, taken)

    def _write(
        self,
        plan: list[tuple[int, int, np.ndarray, np.ndarray]],
        batch: EncodedBatch | None,
        general: tuple[StoredRecords, list[int], list[str], list[int], list[dict[str, str]]] | None,
        ends: dict[int, int],
        counts: dict[int, int],
        now: int,
        taken: int,
    ) -> tuple[int, bool]:
        """Write ``batch`` (or encode ``general``) and move the cursors to ``ends``.  Returns
        (delivered, maybe more due); a failed write holds every planned level."""
        if batch is not None or general is not None:
            before = self.store.commitlog.max_offset
            try:
                if batch is None:
                    assert general is not None
                    batch = encode_redelivered(self.store, *general)
                self._put(batch)
            except Exception as e:  # noqa: BLE001 - retried after a back-off, never skipped
                self.stats.failed_puts += 1
                for q, _, _, _ in plan:
                    self._hold(q, now, e)
                self.stats.reconciled += self._reconcile(before)  # part of it may have landed
                return 0, False
        for q, end in ends.items():
            self.offsets[q] = max(self.offsets.get(q, 0), end)
            if counts.get(q) and q not in self._retry_at_ms:
                self._backoff_ms.pop(q, None)
        for q, c in counts.items():
            self.stats.per_level[q + 1] = self.stats.per_level.get(q + 1, 0) + c
        n = len(batch) if batch is not None else 0
        self.stats.delivered += n
        self.stats.patched += n if general is None else 0
        return n, taken >= self.batch_max_msgs

    def _fast_batch(
        self,
        plan: list[tuple[int, int, np.ndarray, np.ndarray]],
        phys: np.ndarray,
        sizes: np.ndarray,
    ) -> EncodedBatch | None:
        """The planned messages re-written by patching their bytes (:func:`encode_redelivery`),
        or None when one of them needs the general path (discarded, held, unusual bytes)."""
        if len(phys) < self.patch_min_msgs:
            return None
        return patch_redelivery(
            self.store, phys, sizes, _SCHEDULE_KEYS, _SCHEDULE_DROP, lambda rec: [b""] * len(rec)
        )

    def _put(self, batch: EncodedBatch) -> None:
        self.store.put_encoded(batch)

    def _hold(self, q: int, now: int, error: BaseException) -> None:
        wait = self._backoff_ms[q] = backoff_ms(self._backoff_ms.get(q, 0))
        self._retry_at_ms[q] = now + wait
        self.last_error = error
        logger.warning(
            "delay level %d: delivery failed (%s); retrying in %d ms", q + 1, error, wait
        )

    def next_due_ms(self) -> int | None:
        """When the next delivery is due (a retry time counts), None when nothing is waiting."""
        with self._lock:
            best: int | None = None
            now = self.clock.now_ms()
            for q, delay in enumerate(self.levels_ms):
                cq = self.store.consume_queue(L.SCHEDULE_TOPIC, q)
                if cq is None:
                    continue
                off = max(self.offsets.get(q, 0), cq.min_offset)
                if off >= cq.max_offset:
                    continue
                ts = int(cq.units(off, off + 1)["tags_code"][0])
                due = now if ts > now + delay else ts
                due = max(due, self._retry_at_ms.get(q, 0))
                best = due if best is None else min(best, due)
            return best

    def next_wait_ms(self) -> int:
        due = self.next_due_ms()
        if due is None:
            return self.wait_max_ms
        return max(0, min(self.wait_max_ms, due - self.clock.now_ms()))
