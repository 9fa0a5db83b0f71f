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

Progress is kept as Apache RocketMQ keeps it (:mod:`.progress`): ``config/timercheck``,
``timerlog/`` and ``timerwheel``, written every ``checkpoint_interval_ms`` when something changed
and at a clean stop.  Restart (:func:`~rmq_spark.store.timerfiles.recover`, the same files
whichever broker wrote them): pending = the units Apache's dequeue would still deliver, plus the
records from the next queue offset on; when the checkpoint is rmq-broker's own (its tail names a
CommitLog offset D), those delivered from D on are dropped: a copy in the CommitLog from D
(outside the system topics, with ``TIMER_DEQUEUE_MS``) with the record's ``TIMER_OUT_MS``, store
time as ``TIMER_ENQUEUE_MS``, unique id, born time and body (:meth:`TimerService._delivered`).
No property of this broker's own is stored (``docs/semantics.md``).  A store of an older
rmq-broker keeps ``config/timercheck.json`` (W/M/T/D, :meth:`TimerService._rebuild_legacy`): read
once, then replaced by Apache's files.

Why this module is long: the put hook, recall, restart and the delivery round all read and move
one state (the wheel, the pending deletes and the progress) under one lock; the recall
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
from rmq_spark.services.redelivery.delivery import DeliveryLifecycle, ServiceThread, backoff_ms
from rmq_spark.services.redelivery.patch import PATCH_MIN_MSGS, patch_redelivery
from rmq_spark.services.redelivery.records import (
    DELIVERY_DROP,
    DELIVERY_KEYS,
    read_records,
)
from rmq_spark.services.redelivery.recovery import timer_copies_of
from rmq_spark.services.redelivery.rewrite import encode_redelivered, resolve_queue
from rmq_spark.services.timer.progress import ProgressSnapshot, TimerCheckpoint
from rmq_spark.services.timer.recall import (
    RecallError,
    RecallFailure,
    RecallHandle,
    build_recall_handle,
    parse_recall_handle,
)
from rmq_spark.services.timer.wheel import ENTRY, KIND_DELETE, KIND_MESSAGE, TimerWheel
from rmq_spark.store import layout as L
from rmq_spark.store import timerfiles
from rmq_spark.store.clock import Clock
from rmq_spark.store.encoded import EncodedBatch
from rmq_spark.store.jsonfile import JsonObject
from rmq_spark.store.message import Message, new_uniq_id, tags_code
from rmq_spark.store.reader import read_units_arrow

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

TIMER_CHECK_FILE = "timercheck.json"  # an older rmq-broker's progress (read once)
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
        self._changes = 0  # counts changes of the pending set (a new checkpoint is due)
        self._snap: dict[str, Any] | None = None
        self._checkpoint = TimerCheckpoint(store, checkpoint_interval_ms, self._locked_snapshot)
        self._thread = ServiceThread(
            "rmq-timer", self.run_once, self.next_wait_ms, lambda: store.closed, round_gap_ms
        )
        store.add_listener(self._on_dispatch, self.TOPIC)
        legacy = os.path.join(store.root, L.CONFIG_DIR, TIMER_CHECK_FILE)
        recovered = timerfiles.recover(store.root, clock.now_ms())
        if recovered is not None:
            self._rebuild(recovered)
        else:
            self._rebuild_legacy(JsonObject.load(legacy) or JsonObject(legacy, {}))
        self._checkpoint.legacy = legacy

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

    def _rebuild(self, rec: timerfiles.Recovered) -> None:
        """Resume from Apache's timer files (``TimerMessageStore.recover``): the pending units'
        records, and every record from the next queue offset on."""
        lo, hi = self._bounds()
        cq = self.store.consume_queue(L.TIMER_TOPIC, 0)
        pending = np.unique(rec.pending["phys"].astype(np.int64))
        last_phys = int(rec.last_unit["phys"]) if rec.last_unit is not None else None
        low, cur = hi, None
        for start in range(lo, hi if cq is not None else lo, _READ_UNITS):
            assert cq is not None
            phys = cq.units(start, min(hi, start + _READ_UNITS))["offset"].astype(np.int64)
            at = np.flatnonzero(np.isin(phys, pending))
            if len(at):
                low = min(low, start + int(at[0]))
            if last_phys is not None:
                hit = np.flatnonzero(phys == last_phys)
                if len(hit):
                    cur = start + int(hit[-1]) + 1
        if cur is None:
            cur = rec.check.queue_offset
        cur = min(max(min(cur, rec.check.master_offset), lo), hi)
        self._collect(
            min(low, cur),
            hi,
            lambda e: (e["offset"] >= cur) | np.isin(e["phys"], pending),
            rec.check.rmq_commitlog_offset,
        )

    def _rebuild_legacy(self, data: JsonObject) -> None:
        """Resume from an older rmq-broker's ``config/timercheck.json``: the records of
        ``[W, max)``, except those of ``[W, M)`` due at or before T, and those delivered from D
        on."""
        lo, hi = self._bounds()
        w = min(max(data.int("queueOffset", lo), lo), hi)
        m = min(max(data.int("doneQueueOffset", w), lo), hi)
        t = data.int("doneTimeMs", -1)
        d = data.int("commitLogOffset", 0, 0)
        self._collect(w, hi, lambda e: (e["offset"] >= m) | (e["deliver_ms"] > t), d)

    def _collect(self, start: int, hi: int, keep: Any, delivered_from: int | None) -> None:
        """Put the records of ``[start, hi)`` that ``keep`` keeps, less those with a delivered
        copy from CommitLog offset ``delivered_from`` on, into the wheel."""
        parts: list[np.ndarray] = []
        keys: dict[int, str] = {}
        cq = self.store.consume_queue(L.TIMER_TOPIC, 0)
        for a in range(start, hi, _READ_UNITS):
            e, k = self._read_entries(cq, a, min(hi, a + _READ_UNITS))
            e = e[keep(e)]
            parts.append(e)
            if k:
                kept = set(e["phys"].tolist())
                keys.update((p, key) for p, key in k.items() if p in kept)
        entries = np.concatenate(parts) if parts else np.zeros(0, ENTRY)
        if len(entries) and delivered_from is not None:
            delivered = self._delivered(entries, delivered_from)
            if delivered.any():
                self.stats.reconciled += int(delivered.sum())
                entries = entries[~delivered]
        self._register_deletes(keys)
        self._wheel.add(entries)
        self._enqueued = hi

    def _delivered(self, entries: np.ndarray, start: int) -> np.ndarray:
        """Which of ``entries`` have a delivered copy at CommitLog offset >= ``start``."""
        messages = entries["kind"] == KIND_MESSAGE
        return messages & timer_copies_of(
            self.store, entries["phys"], entries["size"], entries["deliver_ms"], start
        )

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
            for i, p in zip(maybe.tolist(), src.properties, strict=True):
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
            self._changes += 1
            start = end
        self._enqueued = max(self._enqueued, start)

    def _locked_snapshot(self) -> dict[str, Any]:
        """The progress to write (the last one again when nothing changed since)."""
        with self._lock:
            self._enqueue_new()
            token = (self._enqueued, self._changes)
            if self._snap is not None and self._snap["progress"].token == token:
                return self._snap
            hi = self._enqueued
            tail = None
            cq = self.store.consume_queue(L.TIMER_TOPIC, 0)
            if hi > 0 and cq is not None and cq.min_offset < hi:
                u = cq.units(hi - 1, hi)
                if len(u):
                    tail = (int(u["offset"][0]), int(u["size"][0]))
            entries = [self._wheel.entries()] + [e for _, e in self._held]
            d = self.store.commitlog.max_offset
            now = self.clock.now_ms()
            snap = ProgressSnapshot(token, now, hi, tail, d, np.concatenate(entries))
            self._snap = {"commitLogOffset": d, "progress": snap}
            return self._snap

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
            if ready or len(due):
                self._changes += 1
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
                        if named is not None and key is not None:
                            named.discard(phys)
                            if not named:
                                del self._cancelled[key]
                else:
                    self._wheel.add(deletes)
            if ok and not self._held:
                self._backoff_ms = 0
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
        self._hold(chunk[np.asarray(not_done, dtype=np.int64)], now)

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
