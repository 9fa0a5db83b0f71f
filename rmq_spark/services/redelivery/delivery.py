"""What the delay-level and timer services share: a progress file written only once the
deliveries it counts are durable (:class:`StagedCheckpoint`), the delivery thread
(:class:`ServiceThread`), the back-off after a failed write, and start/stop/checkpoint
(:class:`DeliveryLifecycle`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rmq_spark.store.dispatch import DispatchBatch
from rmq_spark.store.jsonfile import write_json_atomic

if TYPE_CHECKING:
    from rmq_spark.store.store import MessageStore

__all__ = ["DeliveryLifecycle", "ServiceThread", "StagedCheckpoint", "backoff_ms"]

logger = logging.getLogger(__name__)

BACKOFF_FIRST_MS = 100  # DELAY_FOR_A_WHILE
BACKOFF_MAX_MS = 10_000  # DELAY_FOR_A_PERIOD


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
            except Exception:
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
            except Exception:
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
        """A batch holding a record of :attr:`TOPIC` was stored (the store filters by topic)."""
        self._thread.wake()
