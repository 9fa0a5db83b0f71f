"""TimerService: RocketMQ 5 timer messages -- any delivery time up to a maximum -- delivered
exactly once across crashes, with recall.

Put hook (``HookUtils.transformTimerMessage``): the delivery time comes from ``TIMER_DELAY_SEC``,
else ``TIMER_DELAY_MS`` (both relative to now), else ``TIMER_DELIVER_MS`` (absolute ms).  A message
with a delay level (``DELAY > 0``) loses its timer properties and takes the level path.  A time
that does not parse, or lies more than ``timer_max_delay_s`` ahead, is rejected with
:class:`MessageIllegalError` (RocketMQ's WHEEL_TIMER_MSG_ILLEGAL); a time already reached leaves the
message a normal one.  Otherwise it is stored in ``rmq_sys_wheel_timer`` queue 0 with
``TIMER_OUT_MS`` (the exact time: no rounding to a precision), ``REAL_TOPIC`` and ``REAL_QID``.

Scheduling: the timer topic's ConsumeQueue is the log.  Pending entries live in memory in a
:class:`TimerWheel` (slots of ``timer_precision_ms``, an ordered heap of slot numbers), fed from
the ConsumeQueue as messages arrive and rebuilt from it at start.  A round delivers every entry
due at ``clock.now_ms()`` in batches, one CommitLog write each.  A delivered message stores what
Apache's ``TimerMessageStore.convertMessage`` stores: every property of its timer record
(``REAL_TOPIC``, ``REAL_QID``, ``TIMER_OUT_MS``, the client's ``TIMER_*``) plus
``TIMER_ENQUEUE_MS`` (the timer record's store time) and ``TIMER_DEQUEUE_MS`` (the delivery time).

Recall: the send of a timer message yields a handle (:meth:`TimerService.recall_handle`,
URL-safe Base64 of ``"v1 {realTopic} {brokerName} {TIMER_OUT_MS + 1} {UNIQ_KEY}"``);
:meth:`TimerService.recall` writes a delete record to the timer topic (tag ``_RECALL_TAG_``,
``TIMER_DEL_UNIQKEY = realTopic + "+" + UNIQ_KEY``, due with its target) so the cancellation
survives a restart, or raises :class:`RecallError` when nothing is pending for the handle.

``config/timercheck.json``::

    ┌──────────────────┬────────────────────────────────────────────────────────────────────┐
    │ queueOffset      │ W: every timer record below it is done (delivered, recalled, ...)  │
    │ doneQueueOffset  │ M: with doneTimeMs T, every record in [W, M) due at or before T    │
    │ doneTimeMs       │    is done, and no record due after T had been delivered ...       │
    │ commitLogOffset  │ D: ... before CommitLog offset D; later deliveries lie at/after it  │
    │ dataVersion      │ {"counter": n, "stateVersion": 0, "timestamp": ms}                 │
    │ version          │ 1                                                                  │
    └──────────────────┴────────────────────────────────────────────────────────────────────┘

Restart: read the records of ``[W, max)``, keep those at or above M or due after T, drop those
delivered from D on: a copy in the CommitLog from D (outside the system topics, with
``TIMER_DEQUEUE_MS``) with the record's ``TIMER_OUT_MS``, store time as ``TIMER_ENQUEUE_MS``,
unique id, born time and body (:meth:`TimerService._delivered`).  No property of this broker's
own is stored (``docs/semantics.md``).

Why this module is long: the put hook, recall, restart and the delivery round all read and move
one state (the wheel, the pending deletes and the checkpoint W/M/T/D) under one lock; the recall
handles and the wheel itself are in :mod:`.recall` and :mod:`.wheel`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq_spark.errors import MessageIllegalError, RmqError
from rmq_spark.store import layout as L
from rmq_spark.store.clock import Clock
from rmq_spark.services.redelivery.delivery import DeliveryLifecycle, ServiceThread, StagedCheckpoint, backoff_ms
from rmq_spark.store.jsonfile import JsonObject
from rmq_spark.store.message import Message, new_uniq_id, tags_code
from rmq_spark.store.reader import read_units_arrow
from rmq_spark.store.encoded import EncodedBatch
from rmq_spark.services.redelivery.patch import PATCH_MIN_MSGS, patch_redelivery
from rmq_spark.services.redelivery.records import (
    DELIVERY_DROP,
    DELIVERY_KEYS,
    read_records,
)
from rmq_spark.services.redelivery.recovery import timer_copies_of
from rmq_spark.services.redelivery.rewrite import encode_redelivered, resolve_queue

from rmq_spark.services.timer.recall import (
    RecallError,
    RecallFailure,
    RecallHandle,
    build_recall_handle,
    parse_recall_handle,
)
from rmq_spark.services.timer.wheel import ENTRY, KIND_DELETE, KIND_MESSAGE, TimerWheel

if TYPE_CHECKING:
    from rmq_spark.services.config import BrokerConfig
    from rmq_spark.store.store import MessageStore

__all__ = [
    "TIMER_CHECK_FILE",
    "RecallError",
    "RecallFailure",
    "RecallHandle",
    "TimerService",
    "TimerWheel",
    "build_recall_handle",
    "parse_recall_handle",
]

logger = logging.getLogger(__name__)

TIMER_CHECK_FILE = "timercheck.json"
RECALL_TAG = "_RECALL_TAG_"
RECALL_TAG_CODE = tags_code(RECALL_TAG)
_READ_UNITS = 65536
_UNCONSUMABLE = (L.TRANSACTION_PREPARED_TYPE, L.TRANSACTION_ROLLBACK_TYPE)
_TIMER_PROPS = (L.P_TIMER_DELAY_SEC, L.P_TIMER_DELAY_MS, L.P_TIMER_DELIVER_MS)

# a delivery replaces TIMER_ENQUEUE_MS / TIMER_DEQUEUE_MS (Apache's putProperty on the map)
_STAMPS = (L.P_TIMER_ENQUEUE_MS, L.P_TIMER_DEQUEUE_MS)
_KEYS = DELIVERY_KEYS + _STAMPS
_DROP = DELIVERY_DROP + _STAMPS
_EXTRA = f"{L.P_TIMER_ENQUEUE_MS}\x01%d\x02{L.P_TIMER_DEQUEUE_MS}\x01%d\x02".encode()


# --- the service ----------------------------------------------------------------------------------
@dataclass
class TimerStats:
    delivered: int = 0
    recalled: int = 0  # dropped at their time because a delete record named them
    discarded: int = 0  # no REAL_TOPIC, or the transaction half topic
    failed_puts: int = 0
    reconciled: int = 0  # pending records found already delivered (restart or failed put)
    held: int = 0  # entries put aside after a failure, to retry
    patched: int = 0  # delivered through the byte-patching path (the rest: decoded, encoded)
    rounds: int = 0
    busy_s: float = 0.0  # CPU time (this thread) of rounds that delivered something


class TimerService(DeliveryLifecycle):
    """Timer messages (see the module docstring).  ``run_once`` delivers what is due at
    ``clock.now_ms()``; ``start`` runs it on a thread woken when a timer message arrives.
    Options as :class:`~rmq_spark.services.schedule.service.ScheduleService`.  Pending messages are held
    in memory (about 30 bytes each), rebuilt from the timer queue at start."""

    TOPIC = L.TIMER_TOPIC
    CHECKPOINT_THREAD = "rmq-timer-checkpoint"

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
        self.max_delay_ms = int(config.timer_max_delay_s) * 1000
        self.broker_name = config.broker_name
        self.batch_max_msgs = batch_max_msgs
        self.patch_min_msgs = PATCH_MIN_MSGS
        self.wait_max_ms = max(1, int(config.timer_precision_ms))
        self.stats = TimerStats()
        self.last_error: BaseException | None = None
        self._wheel = TimerWheel(self.wait_max_ms)
        self._held: list[tuple[int, np.ndarray]] = []  # (retry at ms, entries)
        self._backoff_ms = 0
        self._cancelled: dict[str, set[int]] = {}  # realTopic+uniqKey -> delete records naming it
        self._delete_keys: dict[int, str] = {}  # delete record's CommitLog offset -> key
        self._lock = threading.RLock()
        path = os.path.join(store.root, L.CONFIG_DIR, TIMER_CHECK_FILE)
        self._checkpoint = StagedCheckpoint(
            store, path, checkpoint_interval_ms, self._locked_snapshot
        )
        self._thread = ServiceThread(
            "rmq-timer", self.run_once, self.next_wait_ms, lambda: store.closed, round_gap_ms
        )
        store.add_listener(self._on_dispatch, self.TOPIC)
        self._rebuild(JsonObject.load(path) or JsonObject(path, {}))

    # --- put hook ---------------------------------------------------------------------------------
    def transform(self, msg: Message) -> Message:
        p = msg.properties
        if not (L.P_TIMER_DELAY_SEC in p or L.P_TIMER_DELAY_MS in p or L.P_TIMER_DELIVER_MS in p):
            return msg
        if (
            msg.topic in (L.TIMER_TOPIC, L.SCHEDULE_TOPIC)
            or msg.sys_flag & L.TRANSACTION_MASK in _UNCONSUMABLE
        ):
            return msg
        level = p.get(L.P_DELAY)
        if level is not None and level.strip().lstrip("-").isdigit() and int(level) > 0:
            return replace(msg, properties={k: v for k, v in p.items() if k not in _TIMER_PROPS})
        now = self.clock.now_ms()
        deliver_ms = self._deliver_ms(p, now)
        if deliver_ms <= now:
            return msg  # already due: a normal message
        if deliver_ms - now > self.max_delay_ms:
            raise MessageIllegalError(
                f"WHEEL_TIMER_MSG_ILLEGAL: delivery time {deliver_ms} is "
                f"{(deliver_ms - now) / 1000:.3f}s ahead; "
                f"the maximum is {self.max_delay_ms // 1000}s (timer_max_delay_s)"
            )
        props = dict(p)
        props[L.P_TIMER_OUT_MS] = str(deliver_ms)
        props[L.P_REAL_TOPIC] = msg.topic
        props[L.P_REAL_QID] = str(msg.queue_id)
        props.setdefault(L.P_UNIQ_KEY, new_uniq_id())  # the recall handle names it
        return replace(msg, topic=L.TIMER_TOPIC, queue_id=0, properties=props)

    @staticmethod
    def _deliver_ms(p: dict[str, str], now: int) -> int:
        for key, scale, relative in (
            (L.P_TIMER_DELAY_SEC, 1000, True),
            (L.P_TIMER_DELAY_MS, 1, True),
            (L.P_TIMER_DELIVER_MS, 1, False),
        ):
            raw = p.get(key)
            if raw is None:
                continue
            try:
                value = int(raw.strip())
            except ValueError:
                raise MessageIllegalError(
                    f"WHEEL_TIMER_MSG_ILLEGAL: property {key}={raw!r} is not an integer"
                ) from None
            return now + value * scale if relative else value
        raise AssertionError("no timer property")  # pragma: no cover - checked by the caller

    def recall_handle(self, msg: Message) -> str | None:
        """The recall handle of a timer message as ``transform`` returned it (None for any other
        message, and for retry topics, as RocketMQ)."""
        p = msg.properties
        real, out, uniq = p.get(L.P_REAL_TOPIC), p.get(L.P_TIMER_OUT_MS), p.get(L.P_UNIQ_KEY)
        if msg.topic != L.TIMER_TOPIC or not (real and out and uniq) or L.P_TIMER_DEL_UNIQKEY in p:
            return None
        if real.startswith(L.RETRY_GROUP_TOPIC_PREFIX):
            return None
        return build_recall_handle(real, self.broker_name, int(out) + 1, uniq)

    # --- recall -----------------------------------------------------------------------------------
    def recall(self, topic: str, handle: str) -> str:
        """Cancel the pending timer message named by ``handle``; returns its message id.  The
        cancellation is a delete record in the timer topic, so it holds across restarts."""
        h = parse_recall_handle(handle)
        if h.topic != topic:
            raise RecallError(
                RecallFailure.TOPIC_MISMATCH,
                f"recall handle is for topic {h.topic!r}, not {topic!r}",
            )
        if h.broker_name != self.broker_name:
            raise RecallError(
                RecallFailure.BROKER_MISMATCH,
                f"recall handle is for broker {h.broker_name!r}, not {self.broker_name!r}",
            )
        with self._lock:
            now = self.clock.now_ms()
            left = h.timestamp_ms - now
            if left <= 0:
                raise RecallError(
                    RecallFailure.TIMESTAMP_INVALID,
                    "the message is already due (delivered): too late to recall",
                )
            if left >= self.max_delay_ms:
                raise RecallError(
                    RecallFailure.TIMESTAMP_INVALID,
                    "recall handle timestamp is beyond the maximum delay",
                )
            self._enqueue_new()
            key = f"{topic}+{h.message_id}"
            if self._cancelled.get(key):
                raise RecallError(
                    RecallFailure.NOT_FOUND, f"message {h.message_id} is already recalled"
                )
            if not self._pending(h.timestamp_ms - 1, topic, h.message_id):
                raise RecallError(
                    RecallFailure.NOT_FOUND,
                    f"no pending timer message {h.message_id} in topic {topic!r} "
                    "(delivered, or never sent)",
                )
            props = {
                L.P_TAGS: RECALL_TAG,
                L.P_TIMER_DEL_UNIQKEY: key,
                L.P_TIMER_DELIVER_MS: str(h.timestamp_ms),
                L.P_TIMER_OUT_MS: str(h.timestamp_ms - 1),
                L.P_REAL_TOPIC: topic,
                L.P_REAL_QID: "0",
            }
            result = self.store.put_messages(
                [Message(L.TIMER_TOPIC, b"0", props, born_timestamp_ms=now)]
            )
            assert result.append is not None
            self._register_deletes({int(result.append.phys_offsets[0]): key})
            self._enqueue_new()
            return h.message_id

    def _pending(self, deliver_ms: int, topic: str, uniq: str) -> bool:
        cands = [self._wheel.find(deliver_ms)] + [
            e[e["deliver_ms"] == deliver_ms] for _, e in self._held
        ]
        c = np.concatenate(cands)
        c = c[c["kind"] == KIND_MESSAGE]
        if len(c) == 0:
            return False
        src = read_records(self.store, c["phys"], c["size"])
        return any(
            p.get(L.P_REAL_TOPIC) == topic and p.get(L.P_UNIQ_KEY) == uniq for p in src.properties
        )

    def _register_deletes(self, keys: dict[int, str]) -> None:
        for phys, key in keys.items():
            self._delete_keys[phys] = key
            self._cancelled.setdefault(key, set()).add(phys)

    @property
    def pending_count(self) -> int:
        return len(self._wheel) + sum(len(e) for _, e in self._held)

    # --- state ------------------------------------------------------------------------------------
    def _bounds(self) -> tuple[int, int]:
        cq = self.store.consume_queue(L.TIMER_TOPIC, 0)
        return (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)

    def _rebuild(self, data: JsonObject) -> None:
        lo, hi = self._bounds()
        w = min(max(data.int("queueOffset", lo), lo), hi)
        m = min(max(data.int("doneQueueOffset", w), lo), hi)
        t = data.int("doneTimeMs", -1)
        d = data.int("commitLogOffset", 0, 0)
        self._done = (m, t, d)
        self._max_done_ms = t
        self._enqueued = w
        parts, keys = [], {}
        cq = self.store.consume_queue(L.TIMER_TOPIC, 0)
        for start in range(w, hi, _READ_UNITS):
            e, k = self._read_entries(cq, start, min(hi, start + _READ_UNITS))
            e = e[(e["offset"] >= m) | (e["deliver_ms"] > t)]
            parts.append(e)
            if k:
                kept = set(e["phys"].tolist())
                keys.update((p, key) for p, key in k.items() if p in kept)
        entries = np.concatenate(parts) if parts else np.zeros(0, ENTRY)
        if len(entries):
            delivered = self._delivered(entries, d)
            if delivered.any():
                self.stats.reconciled += int(delivered.sum())
                self._note_done(entries[delivered])
                entries = entries[~delivered]
        self._register_deletes(keys)
        self._wheel.add(entries)
        self._enqueued = hi

    def _delivered(self, entries: np.ndarray, start: int) -> np.ndarray:
        """Which of ``entries`` have a delivered copy at CommitLog offset >= ``start``."""
        messages = entries["kind"] == KIND_MESSAGE
        return messages & timer_copies_of(self.store, entries["phys"], entries["size"], entries["deliver_ms"], start)

    def _read_entries(self, cq: Any, start: int, end: int) -> tuple[np.ndarray, dict[int, str]]:
        units = cq.units(start, end)
        n = len(units)
        e = np.zeros(n, ENTRY)
        if n == 0:
            return e, {}
        e["offset"] = np.arange(start, start + n)
        e["phys"] = units["offset"]
        e["size"] = units["size"]
        col = read_units_arrow(
            self.store.commitlog.mfq, units, L.TIMER_TOPIC, 0, start, columns=["deliverTimestamp"]
        ).column(0)
        us = pc.fill_null(pc.cast(col, pa.int64()), 0).to_numpy(zero_copy_only=False)
        e["deliver_ms"] = us // 1000
        keys: dict[int, str] = {}
        maybe = np.flatnonzero(units["tags_code"] == RECALL_TAG_CODE)
        if len(maybe):
            src = read_records(self.store, e["phys"][maybe], e["size"][maybe])
            for i, p in zip(maybe.tolist(), src.properties):
                key = p.get(L.P_TIMER_DEL_UNIQKEY)
                if key:
                    e["kind"][i] = KIND_DELETE
                    keys[int(e["phys"][i])] = key
        return e, keys

    def _enqueue_new(self) -> None:
        lo, hi = self._bounds()
        start = max(self._enqueued, lo)
        cq = self.store.consume_queue(L.TIMER_TOPIC, 0)
        while start < hi:
            end = min(hi, start + _READ_UNITS)
            entries, keys = self._read_entries(cq, start, end)
            self._register_deletes(keys)
            self._wheel.add(entries)
            start = end
        self._enqueued = max(self._enqueued, start)

    def _low_watermark(self) -> int:
        lows = [self._enqueued]
        w = self._wheel.min_offset()
        if w is not None:
            lows.append(w)
        lows.extend(int(e["offset"].min()) for _, e in self._held if len(e))
        return min(lows)

    def _locked_snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        m, t, d = self._done
        return {
            "queueOffset": self._low_watermark(),
            "doneQueueOffset": m,
            "doneTimeMs": t,
            "commitLogOffset": d,
            "version": 1,
        }

    def _note_done(self, entries: np.ndarray) -> None:
        if len(entries):
            self._max_done_ms = max(self._max_done_ms, int(entries["deliver_ms"].max()))

    def _advance_done(self) -> None:
        """Move (M, T, D) forward when it stays true: T covers every record done so far, and no
        pending record is due at or before T.  (An older triple stays true forever.)"""
        t = max(self._done[1], self._max_done_ms)
        due = [int(e["deliver_ms"].min()) for _, e in self._held if len(e)]
        nxt = self._wheel.next_ms()
        if nxt is not None:
            due.append(nxt)
        if not due or min(due) > t:
            self._done = (self._enqueued, t, self.store.commitlog.max_offset)

    # --- delivery ---------------------------------------------------------------------------------
    def run_once(self) -> int:
        """Deliver every timer message due at ``clock.now_ms()``; returns how many."""
        with self._lock:
            began = time.thread_time()
            now = self.clock.now_ms()
            self.stats.rounds += 1
            self._enqueue_new()
            ready = [e for t, e in self._held if t <= now]
            if ready:
                self._held = [(t, e) for t, e in self._held if t > now]
                for e in ready:
                    self._wheel.add(e)
            due = self._wheel.pop_due(now)
            delivered = 0
            ok = True
            if len(due):
                deletes = due[due["kind"] == KIND_DELETE]
                msgs = due[due["kind"] == KIND_MESSAGE]
                for a in range(0, len(msgs), self.batch_max_msgs):
                    chunk = msgs[a : a + self.batch_max_msgs]
                    if not ok:
                        self._hold(chunk, now)
                        continue
                    n, ok = self._deliver(chunk, now)
                    delivered += n
                if ok and not self._held:
                    for phys in deletes["phys"].tolist():
                        key = self._delete_keys.pop(phys, None)
                        named = self._cancelled.get(key) if key is not None else None
                        if named is not None:
                            named.discard(phys)
                            if not named:
                                del self._cancelled[key]
                    self._note_done(deletes)
                else:
                    self._wheel.add(deletes)
            if ok and not self._held:
                self._backoff_ms = 0
            self._advance_done()
            self._checkpoint.tick(now)
            if delivered:
                self.stats.busy_s += time.thread_time() - began
            return delivered

    def _deliver(self, chunk: np.ndarray, now: int) -> tuple[int, bool]:
        """Deliver ``chunk`` as one write.  Returns (delivered, everything done)."""
        phys_list = chunk["phys"].tolist()
        rows: list[int] = []
        held: list[int] = []
        batch = None if self._cancelled else self._fast_batch(chunk, now)
        if batch is not None:
            rows = list(range(len(chunk)))
            fast = len(rows)
        else:
            fast = 0
            rows, held, general = self._general(chunk, phys_list, now)
        if rows:
            before = self.store.commitlog.max_offset
            try:
                if batch is None:
                    batch = encode_redelivered(self.store, *general)
                self._put(batch)
            except Exception as e:  # noqa: BLE001 - held and retried, never skipped
                self.last_error = e
                self.stats.failed_puts += 1
                landed = self._delivered(chunk, before)  # part of it may have landed
                self.stats.reconciled += int(landed[rows].sum())
                rest = [i for i in rows if not landed[i]]
                self._settle(chunk, held + rest, now)
                logger.warning(
                    "timer delivery failed (%s); %d messages retried later",
                    e,
                    len(held) + len(rest),
                )
                self.stats.delivered += len(rows) - len(rest)
                return len(rows) - len(rest), False
        self._settle(chunk, held, now)
        self.stats.patched += fast
        if held:
            logger.warning("timer delivery: %d messages held back (%s)", len(held), self.last_error)
        self.stats.delivered += len(rows)
        return len(rows), not held

    def _general(
        self, chunk: np.ndarray, phys_list: list[int], now: int
    ) -> tuple[list[int], list[int], tuple[Any, ...]]:
        """Rows to deliver, rows held back, and the arguments of :func:`encode_redelivered`:
        the general path (recalls, discarded records, topics that cannot take a message)."""
        src = read_records(self.store, chunk["phys"], chunk["size"])
        rows: list[int] = []
        topics: list[str] = []
        qids: list[int] = []
        props: list[dict[str, str]] = []
        held: list[int] = []
        cache: dict[str, int] = {}
        for i, p in enumerate(src.properties):
            real = p.get(L.P_REAL_TOPIC)
            if real is None or real == L.TRANS_HALF_TOPIC:
                logger.warning("timer record at %d discarded (real topic %r)", phys_list[i], real)
                self.stats.discarded += 1
                continue
            if self._cancelled and self._cancelled.get(f"{real}+{p.get(L.P_UNIQ_KEY, '')}"):
                self.stats.recalled += 1
                continue
            try:
                qid = resolve_queue(self.store, real, p.get(L.P_REAL_QID), cache)
            except RmqError as e:
                self.last_error = e
                held.append(i)
                continue
            out = {k: v for k, v in p.items() if k not in _DROP}  # stored as it was, and
            out[L.P_TIMER_ENQUEUE_MS] = str(int(src.store_timestamps[i]))
            out[L.P_TIMER_DEQUEUE_MS] = str(now)
            rows.append(i)
            topics.append(real)
            qids.append(qid)
            props.append(out)
        return rows, held, (src, rows, topics, qids, props)

    def _fast_batch(self, chunk: np.ndarray, now: int) -> EncodedBatch | None:
        """``chunk`` re-written by patching its bytes, or None when the general path must."""
        if len(chunk) < self.patch_min_msgs:
            return None
        return patch_redelivery(
            self.store, chunk["phys"], chunk["size"], _KEYS, _DROP,
            lambda rec: [_EXTRA % (ts, now) for ts in rec.head["store_timestamp"].tolist()],
        )  # fmt: skip

    def _put(self, batch: EncodedBatch) -> None:
        self.store.put_encoded(batch)

    def _settle(self, chunk: np.ndarray, not_done: list[int], now: int) -> None:
        """Rows ``not_done`` of ``chunk`` wait for a retry; the others are done."""
        done = np.ones(len(chunk), dtype=bool)
        done[np.asarray(not_done, dtype=np.int64)] = False
        self._note_done(chunk[done])
        self._hold(chunk[~done], now)

    def _hold(self, entries: np.ndarray, now: int) -> None:
        if len(entries) == 0:
            return
        self._backoff_ms = backoff_ms(self._backoff_ms)
        self._held.append((now + self._backoff_ms, entries))
        self.stats.held += len(entries)

    def next_due_ms(self) -> int | None:
        with self._lock:
            times = [t for t, _ in self._held]
            nxt = self._wheel.next_ms()
            if nxt is not None:
                times.append(nxt)
            return min(times) if times else None

    def next_wait_ms(self) -> int:
        due = self.next_due_ms()
        if due is None:
            return self.wait_max_ms
        return max(0, min(self.wait_max_ms, due - self.clock.now_ms()))
