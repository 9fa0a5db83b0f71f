"""ScheduleService: RocketMQ's delay levels, delivered exactly once across crashes.

A message with property ``DELAY=n`` (n > 0) is stored in ``SCHEDULE_TOPIC_XXXX`` queue ``n - 1``
(a level above the maximum is clamped to it) with ``REAL_TOPIC``/``REAL_QID``; the store gives its
ConsumeQueue unit tagsCode = store time + the level's delay.  One cursor per level walks that queue
in order and re-writes every due message to its real topic and queue (``DELAY`` and ``REAL_*``
removed, ``TIMER_OUT_MS`` = its delivery time, the tags code computed from ``TAGS`` again), as one
CommitLog write per batch (:func:`put_redelivered`).

Exactly once: every delivered message carries ``DELAY_SOURCE = "{queueId}:{queueOffset}"`` of the
schedule record it came from.  Progress is saved to ``config/delayOffset.json`` (atomically) with
the CommitLog end at the time; on start the CommitLog is scanned from there
(:func:`scan_sources`) and each cursor moves past every source already delivered, so a crash at
any moment neither loses nor repeats a delivery (RocketMQ 4.x saved progress every 10 s and
redelivered after a crash).  A failed write leaves the cursor where it was and is retried after a
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

The module also holds what the timer service shares: reading stored records in bulk
(:func:`read_records`), writing redelivered ones (:func:`put_redelivered`), the recovery scan,
the staged checkpoint writer and the service thread.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from rmq_spark.errors import MessageIllegalError, RmqError, StoreError
from rmq_spark.store import layout as L
from rmq_spark.store.clock import Clock
from rmq_spark.store.dispatch import DispatchBatch
from rmq_spark.store.jsonfile import read_json, write_json_atomic
from rmq_spark.store.message import (
    Message,
    encode_properties,
    host_bytes,
    new_uniq_ids,
)
from rmq_spark.store.record import (
    HEADER_V4,
    PROP_CRC_BYTES,
    PROP_CRC_PREFIX,
    decode_record,
    encode_batch,
)
from rmq_spark.store.validation import check_topic

if TYPE_CHECKING:
    from rmq_spark.core import BrokerConfig
    from rmq_spark.store.store import MessageStore, PutResult

__all__ = [
    "P_DELAY_SOURCE",
    "ScheduleService",
    "StoredRecords",
    "put_redelivered",
    "read_records",
    "resolve_queue",
    "scan_sources",
]

logger = logging.getLogger(__name__)

P_DELAY_SOURCE = "DELAY_SOURCE"  # "{scheduleQueueId}:{queueOffset}" of the record delivered
# what a delivered message loses: routing of the system topic and the client's delay request
DROPPED_ON_DELIVERY = (
    L.P_DELAY,
    L.P_REAL_TOPIC,
    L.P_REAL_QID,
    L.P_TIMER_DELIVER_MS,
    L.P_TIMER_DELAY_SEC,
    L.P_TIMER_DELAY_MS,
)
_TIMER_PROPS = (L.P_TIMER_DELIVER_MS, L.P_TIMER_DELAY_SEC, L.P_TIMER_DELAY_MS)
_UNCONSUMABLE = (L.TRANSACTION_PREPARED_TYPE, L.TRANSACTION_ROLLBACK_TYPE)
BACKOFF_FIRST_MS = 100  # DELAY_FOR_A_WHILE
BACKOFF_MAX_MS = 10_000  # DELAY_FOR_A_PERIOD
_HOSTS_V6 = L.FLAG_BORNHOST_V6 | L.FLAG_STOREHOST_V6
_STRUCT_CODES = {"i4": "i", "u4": "I", "i8": "q", "V4": "4s"}
_HEADER = struct.Struct(">" + "".join(_STRUCT_CODES[t[-2:]] for _, t in HEADER_V4.descr))
assert _HEADER.size == HEADER_V4.itemsize
_H = {name: i for i, (name, _) in enumerate(HEADER_V4.descr)}
_H_MAGIC, _H_FLAG, _H_SYS_FLAG, _H_BORN_TS = (
    _H["magic"],
    _H["flag"],
    _H["sys_flag"],
    _H["born_timestamp"],
)
_H_BORN_HOST, _H_BORN_PORT, _H_RECONSUME = _H["born_host"], _H["born_port"], _H["reconsume_times"]
_H_PREPARED, _H_BODY_LEN = _H["prepared_offset"], _H["body_len"]
_CRC_KEY = PROP_CRC_PREFIX[:-1].decode()
_RECORD_HEAD = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE (record.py's diagram)


# --- reading stored records in bulk ---------------------------------------------------------------
@dataclass
class StoredRecords:
    """What it takes to write stored records again, one entry per record, in request order."""

    bodies: list[bytes]
    properties: list[dict[str, str]]
    flags: np.ndarray
    sys_flags: np.ndarray
    born_timestamps: np.ndarray
    born_hosts: list[bytes]
    born_ports: np.ndarray
    reconsume_times: np.ndarray
    prepared_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.bodies)


def read_records(store: MessageStore, phys: np.ndarray, sizes: np.ndarray) -> StoredRecords:
    """The records at CommitLog offsets ``phys`` (``sizes`` long), in that order.  One ``struct``
    unpack of the fixed header per record (its format derived from ``record.HEADER_V4``, the one
    definition): cheaper than numpy gathers for the few dozen records of a typical round."""
    n = len(phys)
    bodies: list[bytes] = []
    props: list[dict[str, str]] = []
    heads: list[tuple] = []  # one HEADER_V4 tuple per record
    mfq = store.commitlog.mfq
    unpack = _HEADER.unpack_from
    mf = None
    for offset in np.asarray(phys, dtype=np.int64).tolist():
        if mf is None or not mf.from_offset <= offset < mf.end_offset:
            mf = mfq.find(offset)
            if mf is None:
                raise StoreError(f"CommitLog offset {offset} is outside the log")
            mm = mf.mm
        pos = offset - mf.from_offset
        h = unpack(mm, pos)
        if h[_H_SYS_FLAG] & _HOSTS_V6:  # IPv6 hosts move the later fields: rare, decoded in full
            m = decode_record(mm, pos)
            bodies.append(m.body)
            props.append(m.properties)
            v = list(h)
            v[_H_FLAG], v[_H_SYS_FLAG], v[_H_BORN_TS] = m.flag, m.sys_flag, m.born_timestamp_ms
            v[_H_BORN_HOST], v[_H_BORN_PORT] = host_bytes(m.born_host), m.born_port
            v[_H_RECONSUME], v[_H_PREPARED] = m.reconsume_times, m.prepared_transaction_offset
            heads.append(tuple(v))
            continue
        heads.append(h)
        p = pos + _HEADER.size
        q = p + h[_H_BODY_LEN]
        bodies.append(mm[p:q])
        if h[_H_MAGIC] == L.MAGIC_V2:
            q += 2 + ((mm[q] << 8) | mm[q + 1])
        else:
            q += 1 + mm[q]
        props.append(_decode_props(mm[q + 2 : q + 2 + ((mm[q] << 8) | mm[q + 1])]))
    cols = list(zip(*heads)) if heads else [()] * len(_H)

    def col(i: int, dtype: type) -> np.ndarray:
        return np.array(cols[i], dtype=dtype).reshape(n)

    return StoredRecords(
        bodies=bodies,
        properties=props,
        flags=col(_H_FLAG, np.int32),
        sys_flags=col(_H_SYS_FLAG, np.int32),
        born_timestamps=col(_H_BORN_TS, np.int64),
        born_hosts=list(cols[_H_BORN_HOST]),
        born_ports=col(_H_BORN_PORT, np.int32),
        reconsume_times=col(_H_RECONSUME, np.int32),
        prepared_offsets=col(_H_PREPARED, np.int64),
    )


def _decode_props(raw: bytes) -> dict[str, str]:
    """``message.decode_properties``'s rule (a segment counts with a non-empty key before its
    first \\x01 and a non-empty value after it; the record CRC is no property), twice as fast."""
    out: dict[str, str] = {}
    for seg in raw.decode("utf-8", "replace").split(L.PROPERTY_SEPARATOR):
        k, _, v = seg.partition(L.NAME_VALUE_SEPARATOR)
        if k and v:
            out[k] = v
    out.pop(_CRC_KEY, None)
    return out


# --- writing redelivered records ------------------------------------------------------------------
def resolve_queue(
    store: MessageStore, topic: str, queue_id: str | int | None, cache: dict[str, int]
) -> int:
    """The queue a redelivered message goes to: its ``REAL_QID``, folded into the topic's queue
    count when the topic shrank.  Raises an :class:`RmqError` when the topic cannot take it
    (invalid name, missing with auto-creation off)."""
    nq = cache.get(topic)
    if nq is None:
        check_topic(topic, allow_system=True)
        cfg = store.topics.get_or_create(topic)
        nq = cache[topic] = max(cfg.write_queue_nums, cfg.read_queue_nums, 1)
    try:
        qid = int(queue_id) if queue_id is not None else 0
    except ValueError:
        qid = 0
    return qid if 0 <= qid < nq else qid % nq


def put_redelivered(
    store: MessageStore,
    src: StoredRecords,
    rows: list[int],
    topics: list[str],
    queue_ids: list[int],
    properties: list[dict[str, str]],
) -> PutResult:
    """Write records ``rows`` of ``src`` again, to ``topics``/``queue_ids`` with ``properties``, as
    ONE CommitLog write (one batch: visible together).  Topics must have been resolved with
    :func:`resolve_queue`."""
    encoded = [encode_properties(p) for p in properties]
    limit = L.PROPERTY_MAX_BYTES - (PROP_CRC_BYTES if store.config.append_prop_crc else 0)
    for i, e in enumerate(encoded):
        if len(e) > limit:
            raise MessageIllegalError(
                f"redelivered message properties are {len(e)} bytes; the limit is {limit}"
            )
    missing = [i for i, p in enumerate(properties) if L.P_UNIQ_KEY not in p]
    if missing:
        for i, uid in zip(missing, new_uniq_ids(len(missing))):
            properties[i][L.P_UNIQ_KEY] = uid
            encoded[i] = encode_properties(properties[i])
    idx = np.asarray(rows, dtype=np.int64)
    shared = topics[0] if topics.count(topics[0]) == len(topics) else None
    batch = encode_batch(
        shared if shared is not None else topics,
        queue_ids,
        [src.bodies[i] for i in rows],
        properties,
        encoded,
        flags=src.flags[idx],
        sys_flags=src.sys_flags[idx],
        born_timestamps=src.born_timestamps[idx],
        born_hosts=[src.born_hosts[i] for i in rows],
        born_ports=src.born_ports[idx],
        reconsume_times=src.reconsume_times[idx],
        prepared_offsets=src.prepared_offsets[idx],
        store_host=host_bytes(store.config.store_host),
        store_port=store.config.store_port,
        prop_crc=store.config.append_prop_crc,
    )
    return store.put_encoded(batch)


# --- recovery: which sources were already delivered -----------------------------------------------
def scan_sources(store: MessageStore, start: int, key: str) -> list[str]:
    """Values of property ``key`` in every delivered record from CommitLog offset ``start`` (a
    record boundary).  Segments are searched for the key with ``mmap.find`` first; records are
    walked only where it occurs.  Records still routed through a system topic (they carry
    ``REAL_TOPIC``, which delivery removes) do not count."""
    marker = key.encode() + b"\x01"
    mfq = store.commitlog.mfq
    start = max(start, mfq.min_offset)
    hits_phys: list[int] = []
    hits_size: list[int] = []
    for mf in list(mfq.files):
        if mf.end_offset <= start:
            continue
        pos = max(0, start - mf.from_offset)
        limit = mf.wrote_position
        mm = mf.mm
        last = mm.rfind(marker, pos, limit)
        if last < 0:
            continue
        while pos + 8 <= limit and pos <= last:
            size, magic = _RECORD_HEAD.unpack_from(mm, pos)
            if magic not in (L.MAGIC_V1, L.MAGIC_V2) or size <= 0 or pos + size > limit:
                break  # a BLANK filler or the end of the written bytes
            if mm.find(marker, pos, pos + size) >= 0:
                hits_phys.append(mf.from_offset + pos)
                hits_size.append(size)
            pos += size
    if not hits_phys:
        return []
    src = read_records(store, np.asarray(hits_phys), np.asarray(hits_size))
    # a key found only in a body has no value here
    return [p[key] for p in src.properties if key in p and L.P_REAL_TOPIC not in p]


# --- checkpoints and the service thread -----------------------------------------------------------
class StagedCheckpoint:
    """Writes a service's progress file every ``interval_ms`` when it changed, and only once the
    CommitLog is durable up to the snapshot's ``commitLogOffset`` (so the deliveries it counts
    survive an OS crash): the write waits for the store's flush, and forces one only after three
    intervals.  Driven by ``tick`` from the service's rounds (tests, FakeClock), or by its own
    thread once ``start`` is called, so that fsyncs never stall a delivery round."""

    def __init__(
        self,
        store: MessageStore,
        path: str,
        interval_ms: int,
        snapshot: Callable[[], dict[str, Any]],
    ) -> None:
        self.store = store
        self.path = path
        self.interval_ms = interval_ms
        self._snapshot = snapshot  # takes the service's lock
        self._staged: dict[str, Any] | None = None
        self._staged_ms = 0
        self._offered_ms: int | None = None
        self._written: dict[str, Any] | None = None
        self._version = 0
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self, now_ms: int) -> None:
        """One step without a thread: write what is staged and durable, stage a new snapshot."""
        if self._thread is not None:
            return
        if self._staged is not None:
            durable = self.store.commitlog.flushed_offset >= self._staged["commitLogOffset"]
            if durable or now_ms - self._staged_ms >= 3 * self.interval_ms:
                self._write(self._staged)
                self._staged = None
        if self._staged is None and (
            self._offered_ms is None or now_ms - self._offered_ms >= self.interval_ms
        ):
            self._offered_ms = now_ms
            snap = self._snapshot()
            if snap != self._written:
                self._staged, self._staged_ms = snap, now_ms

    def start(self, name: str) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._thread = None

    def _run(self) -> None:
        interval_s = self.interval_ms / 1000
        while not self._stop.wait(interval_s):
            if self.store.closed:
                return
            try:
                snap = self._snapshot()
                if snap == self._written:
                    continue
                waited = 0.0
                while (
                    self.store.commitlog.flushed_offset < snap["commitLogOffset"]
                    and waited < 3 * interval_s
                ):
                    if self._stop.wait(0.05):
                        return
                    waited += 0.05
                self._write(snap)
            except Exception:  # noqa: BLE001 - the next interval tries again
                if self.store.closed:
                    return
                logger.exception("checkpoint %s not written", self.path)

    def write_now(self) -> None:
        self._staged = None
        self._write(self._snapshot())

    def _write(self, snap: dict[str, Any]) -> None:
        with self._write_lock:
            if self.store.commitlog.flushed_offset < snap["commitLogOffset"]:
                self.store.commitlog.flush()
            self._version += 1
            data = dict(snap)
            data["dataVersion"] = {
                "counter": self._version,
                "stateVersion": 0,
                "timestamp": self.store.clock.now_ms(),
            }
            write_json_atomic(self.path, data)
            self._written = snap


class ServiceThread:
    """Runs ``round_fn`` now and again: after each round it sleeps ``wait_fn()`` ms or until
    :meth:`wake` (a new message arrived).  Rounds start at least ``min_gap_ms`` apart, so that
    a steady trickle of due messages is written a few ms' worth at a time rather than one
    write each (a write has a fixed cost of some hundred microseconds)."""

    def __init__(
        self,
        name: str,
        round_fn: Callable[[], object],
        wait_fn: Callable[[], int],
        closed: Callable[[], bool],
        min_gap_ms: int = 0,
    ) -> None:
        self.name = name
        self.min_gap_s = min_gap_ms / 1000
        self._round = round_fn
        self._wait = wait_fn
        self._closed = closed
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set() and not self._closed():
            self._wake.clear()
            started = time.monotonic()
            try:
                self._round()
                wait_ms = self._wait()
            except Exception:  # noqa: BLE001 - a service thread must survive a bad round
                if self._closed():
                    return
                logger.exception("%s: delivery round failed", self.name)
                wait_ms = 1000
            if wait_ms > 0:
                self._wake.wait(wait_ms / 1000)
            gap_s = started + self.min_gap_s - time.monotonic()
            if gap_s > 0:
                self._stop.wait(gap_s)


def backoff_ms(previous_ms: int) -> int:
    return min(BACKOFF_MAX_MS, previous_ms * 2) if previous_ms else BACKOFF_FIRST_MS


# --- the service ----------------------------------------------------------------------------------
@dataclass
class ScheduleStats:
    delivered: int = 0
    discarded: int = 0  # real topic is the transaction half topic, or no REAL_TOPIC at all
    failed_puts: int = 0
    reconciled: int = 0  # sources found already delivered at start or after a failed put
    busy_s: float = 0.0  # CPU time (this thread) of rounds that delivered something
    per_level: dict[int, int] = field(default_factory=dict)


class DeliveryLifecycle:
    """Start, stop and checkpoint of a delivery service (delay levels, timer): a delivery thread
    woken when a message of ``TOPIC`` is stored, and a staged checkpoint on its own thread."""

    TOPIC: str = ""
    CHECKPOINT_THREAD = ""
    _thread: ServiceThread
    _checkpoint: StagedCheckpoint
    store: MessageStore

    def start(self) -> None:
        self._thread.start()
        self._checkpoint.start(self.CHECKPOINT_THREAD)

    def shutdown(self) -> None:
        """Stop the threads and save progress (a final checkpoint)."""
        self._thread.stop()
        self._checkpoint.stop()
        if not self.store.closed:
            self._checkpoint.write_now()

    def crash(self) -> None:
        """Tests: stop as kill -9 would (no final checkpoint)."""
        self._thread.stop()
        self._checkpoint.stop()

    def checkpoint(self) -> None:
        """Save progress now."""
        self._checkpoint.write_now()

    def _on_dispatch(self, batch: DispatchBatch) -> None:
        if self.TOPIC in batch.topics:
            self._thread.wake()


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
        self.levels_ms: list[int] = list(config.store.delay_levels_ms)
        self.batch_max_msgs = batch_max_msgs
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
        store.add_listener(self._on_dispatch)
        data = read_json(path) or {}
        self._load(data)
        pending = any(off < self._queue_end(q) for q, off in self.offsets.items())
        if pending:  # else no delivery can be missing from the saved progress
            self.stats.reconciled += self._reconcile(int(data.get("commitLogOffset", 0)))

    # --- put hook ---------------------------------------------------------------------------------
    def transform(self, msg: Message) -> Message:
        """A message with ``DELAY=n > 0`` goes to the schedule topic, queue ``min(n, max) - 1``.
        Timer properties on it are dropped: the level wins (as ``HookUtils``)."""
        p = msg.properties
        if P_DELAY_SOURCE in p:  # only the service may claim a delivery
            p = {k: v for k, v in p.items() if k != P_DELAY_SOURCE}
            msg = replace(msg, properties=p)
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
    def _load(self, data: dict[str, Any]) -> None:
        table = data.get("offsetTable") or {}
        for q in range(len(self.levels_ms)):
            cq = self.store.consume_queue(L.SCHEDULE_TOPIC, q)
            lo, hi = (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)
            saved = int(table.get(str(q + 1), lo))
            self.offsets[q] = min(max(saved, lo), hi)  # correctDelayOffset

    def _queue_end(self, q: int) -> int:
        cq = self.store.consume_queue(L.SCHEDULE_TOPIC, q)
        return cq.max_offset if cq is not None else 0

    def _reconcile(self, start: int) -> int:
        """Move each cursor past the sources delivered at CommitLog offset >= ``start``."""
        moved = 0
        for value in scan_sources(self.store, start, P_DELAY_SOURCE):
            q_text, _, off_text = value.partition(":")
            if not (q_text.isdigit() and off_text.isdigit()):
                continue
            q, off = int(q_text), int(off_text)
            if q in self.offsets and off >= self.offsets[q]:
                moved += off + 1 - self.offsets[q]
                self.offsets[q] = off + 1
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
        src = read_records(self.store, phys, sizes)
        rows: list[int] = []
        topics: list[str] = []
        qids: list[int] = []
        props: list[dict[str, str]] = []
        ends: dict[int, int] = {}
        counts: dict[int, int] = {}
        cache: dict[str, int] = {}
        row = 0
        taken = 0
        for q, start, units, deliver in plan:
            taken += len(units)
            end = start
            for j, deliver_ms in enumerate(deliver.tolist()):
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
                p = {k: v for k, v in p.items() if k not in DROPPED_ON_DELIVERY}
                p[L.P_TIMER_OUT_MS] = str(deliver_ms)
                p[P_DELAY_SOURCE] = f"{q}:{start + j}"
                rows.append(i)
                topics.append(real)
                qids.append(qid)
                props.append(p)
                counts[q] = counts.get(q, 0) + 1
                end = start + j + 1
            ends[q] = end
            row += len(units)
        if rows:
            before = self.store.commitlog.max_offset
            try:
                self._put(src, rows, topics, qids, props)
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
        self.stats.delivered += len(rows)
        return len(rows), taken >= self.batch_max_msgs

    def _put(
        self,
        src: StoredRecords,
        rows: list[int],
        topics: list[str],
        qids: list[int],
        props: list[dict[str, str]],
    ) -> None:
        put_redelivered(self.store, src, rows, topics, qids, props)

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
