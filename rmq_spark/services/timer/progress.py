"""The timer's progress kept where and as Apache RocketMQ keeps it (``docs/apache_store.md`` 3.4):
``config/timercheck``, ``timerlog/`` and ``timerwheel``, so that whichever broker opens the store
next delivers each pending timer message once and each delivered one never again.

Each checkpoint writes the pending set (the wheel and the held entries) as a new generation of
timerlog units, one per pending record in queue-offset order, chained per slot; then a unit for
the record at ``queueOffset - 1`` when it is not pending, in a slot three days before the read
time (Apache takes the next queue offset from the last unit, and never reads a slot that old);
``lastReadTimeMs`` = the first pending slot (or now), ``lastTimerQueueOffset`` =
``masterTimerQueueOffset`` = every record below it enqueued.  The order makes every crash point
safe: new timerlog files (at offsets never used before) are written and synced, then the old ones
removed, then the wheel, then the checkpoint replaced atomically.  A crash before the checkpoint
leaves Apache (and :func:`~rmq_spark.store.timerfiles.recover`) either the old generation whole
(the new files lie past the old log's end, which the recovery cuts) or the new one with the old
checkpoint (the records enqueued in the last interval are read again: at least once, as Apache
after kill -9).  The CommitLog offset from which rmq-broker's deliveries are not counted yet goes
into the checkpoint's tail, which Apache ignores (:class:`~rmq_spark.store.timerfiles.RmqTail`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rmq_spark.services.redelivery.delivery import StagedCheckpoint
from rmq_spark.services.timer.wheel import ENTRY, KIND_DELETE
from rmq_spark.store import timerfiles as tf

if TYPE_CHECKING:
    from collections.abc import Callable

    from rmq_spark.store.store import MessageStore

__all__ = [
    "SENTINEL_BEFORE_MS",
    "ApacheProgress",
    "ProgressSnapshot",
    "TimerCheckpoint",
    "build_units",
]

SENTINEL_BEFORE_MS = 3 * 86_400_000
_P = tf.PRECISION_MS
_ROLL_MS = tf.ROLL_WINDOW_SLOTS * _P


@dataclass(eq=False)
class ProgressSnapshot:
    """The timer's state at one moment: pending entries, every record below ``hi`` enqueued,
    and the CommitLog offset before which every delivery counted here was written."""

    token: tuple[int, ...]  # equal tokens: nothing changed
    now_ms: int
    hi: int
    tail: tuple[int, int] | None  # (phys, size) of the record at hi - 1
    commitlog_offset: int
    entries: np.ndarray = field(default_factory=lambda: np.zeros(0, ENTRY))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProgressSnapshot) and self.token == other.token

    __hash__ = None  # type: ignore[assignment]


def build_units(snap: ProgressSnapshot, start: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The timerlog units (``UNIT`` rows written from ``start``), the wheel slots they use, and
    ``lastReadTimeMs``, as Apache's ``doEnqueue`` would have written them at ``snap.now_ms``."""
    e = snap.entries[np.argsort(snap.entries["offset"], kind="stable")]
    write = snap.now_ms // _P * _P
    delayed = e["deliver_ms"].astype(np.int64)
    magic = np.full(len(e), tf.MAGIC_DEFAULT, np.int32)
    ahead = delayed - write
    roll = ahead >= _ROLL_MS
    soon = roll & (ahead - _ROLL_MS < (tf.ROLL_WINDOW_SLOTS // 3) * _P)
    delayed = np.where(roll, write + _ROLL_MS, delayed)
    delayed = np.where(soon, write + (tf.ROLL_WINDOW_SLOTS // 2) * _P, delayed)
    magic[roll] |= tf.MAGIC_ROLL
    magic[e["kind"] == KIND_DELETE] |= tf.MAGIC_DELETE
    last_read = min(write, int(delayed.min()) // _P * _P) if len(e) else write
    phys, size = e["phys"].astype(np.int64), e["size"].astype(np.int64)
    if snap.tail is not None and (len(e) == 0 or int(e["offset"][-1]) != snap.hi - 1):
        delayed = np.r_[delayed, last_read - SENTINEL_BEFORE_MS]
        magic = np.r_[magic, np.int32(tf.MAGIC_DEFAULT)]
        phys = np.r_[phys, snap.tail[0]]
        size = np.r_[size, snap.tail[1]]
    n = len(delayed)
    pos = tf.unit_positions(start, n)
    q = delayed // _P
    order = np.lexsort((pos, q))
    prev = np.full(n, -1, np.int64)
    if n > 1:
        same = q[order][1:] == q[order][:-1]
        prev[order[1:][same]] = pos[order[:-1][same]]
    units = np.zeros(n, tf.UNIT)
    units["size"] = tf.UNIT_SIZE
    units["prev"] = prev
    units["magic"] = magic
    units["write_ms"] = write
    units["delta"] = np.clip(delayed - write, -(2**31), 2**31 - 1)
    units["phys"] = phys
    units["size_py"] = size
    # one slot per quotient: first and last unit, and Apache's count (a delete counts -1)
    qs = q[order]
    cut = np.flatnonzero(np.r_[True, qs[1:] != qs[:-1]]) if n else np.zeros(0, np.int64)
    slots = np.zeros(len(cut), tf.SLOT)
    slots["q"] = qs[cut]
    slots["first"] = pos[order][cut]
    slots["last"] = pos[order][np.r_[cut[1:], n] - 1] if n else pos[:0]
    count = np.where((magic & tf.MAGIC_DELETE) != 0, -1, 1)[order]
    slots["num"] = np.add.reduceat(count, cut) if n else count[:0]
    return units, slots, last_read


class ApacheProgress:
    """Writes :class:`ProgressSnapshot` s as Apache's timer files under ``root``."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._next_start = 0
        self._slot_idx: np.ndarray | None = None  # wheel slots of the current generation
        self._counter = 0
        self.writes = 0

    def write(self, snap: ProgressSnapshot) -> None:
        d = tf.timerlog_dir(self.root)
        names = os.listdir(d) if os.path.isdir(d) else []
        old = sorted(n for n in names if len(n) == 20 and n.isdigit())
        if snap.hi == 0 and not len(snap.entries) and not old:
            if not os.path.exists(tf.check_path(self.root)):
                return  # no timer message ever: no files (Apache makes its own when it opens one)
        start = max(self._next_start, int(old[-1]) + tf.TIMERLOG_FILE_SIZE if old else 0)
        units, slots, last_read = build_units(snap, start)
        # the next generation starts past this one even if this write fails half-way
        files = max(1, -(-len(units) // tf.UNITS_PER_FILE))
        self._next_start = start + files * tf.TIMERLOG_FILE_SIZE
        try:
            end = tf.write_timerlog(self.root, start, units)
            for name in old:
                os.unlink(os.path.join(d, name))
            idx = slots["q"] % tf.WHEEL_SLOTS
            clear = None if self._slot_idx is None else np.setdiff1d(self._slot_idx, idx)
            tf.write_wheel(self.root, clear, slots)
            self._slot_idx = idx
            self._counter += 1
            header = (last_read, end if len(units) else 0, snap.hi, snap.hi)
            tf.write_check(
                self.root,
                tf.TimerCheck(*header, 0, snap.now_ms, self._counter,
                              rmq=tf.RmqTail(snap.commitlog_offset, header)),
            )  # fmt: skip
        except BaseException:
            self._slot_idx = None  # which slots a failed write left is unknown: clear them all next
            raise
        self.writes += 1


class TimerCheckpoint(StagedCheckpoint):
    """The timer's staged checkpoint, written as Apache's files once the deliveries it counts
    are durable.  A write costs time in proportion to the pending set (some 3 s for a million
    pending messages), so the next one waits at least ``THROTTLE`` times as long as the last took:
    the files lag at most that much (the at-least-once window for another broker after a crash;
    this broker's own restart counts the deliveries since from the CommitLog).  A stop writes at
    once."""

    THROTTLE = 4

    def __init__(
        self, store: MessageStore, interval_ms: int, snapshot: Callable[[], dict[str, Any]]
    ) -> None:
        self._raw_snapshot = snapshot
        super().__init__(store, tf.check_path(store.root), interval_ms, self._throttled)
        self.files = ApacheProgress(store.root)
        self.legacy: str | None = None  # an older rmq-broker's progress file, removed once replaced
        self._next_at = 0.0

    def _throttled(self) -> dict[str, Any]:
        if self._written is not None and time.monotonic() < self._next_at:
            return self._written  # unchanged: nothing is written yet
        return self._raw_snapshot()

    def write_now(self) -> None:
        self._staged = None
        self._write(self._raw_snapshot())

    def _write(self, snap: dict[str, Any]) -> None:
        with self._write_lock:
            if self.store.commitlog.flushed_offset < snap["commitLogOffset"]:
                self.store.commitlog.flush()
            began = time.monotonic()
            self.files.write(snap["progress"])
            self._written = snap
            self._next_at = time.monotonic() + self.THROTTLE * (time.monotonic() - began)
            if self.legacy is not None:
                for path in (self.legacy, self.legacy + ".bak"):
                    if os.path.exists(path):
                        os.unlink(path)
                self.legacy = None
