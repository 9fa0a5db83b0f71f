"""Flush services: async (interval + least pages, a thorough flush now and then) and sync with
group commit (concurrent puts share one fdatasync; a put returns once its bytes are durable)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rmq_spark.store import layout as L


class AsyncFlushService(threading.Thread):
    def __init__(
        self,
        flush: Callable[[bool], None],
        dirty_bytes: Callable[[], int],
        interval_ms: int = 500,
        least_pages: int = 4,
        thorough_interval_ms: int = 10_000,
    ) -> None:
        super().__init__(name="rmq-flush", daemon=True)
        self._flush = flush
        self._dirty_bytes = dirty_bytes
        self.interval_ms = interval_ms
        self.least_pages = least_pages
        self.thorough_interval_ms = thorough_interval_ms
        self._stop_event = threading.Event()
        self._last_thorough = time.monotonic()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_ms / 1000):
            now = time.monotonic()
            thorough = (now - self._last_thorough) * 1000 >= self.thorough_interval_ms
            if thorough or self._dirty_bytes() >= self.least_pages * L.OS_PAGE_BYTES:
                self._flush(thorough)
                if thorough:
                    self._last_thorough = now

    def shutdown(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join()


class _Waiter:
    __slots__ = ("lead", "lock", "offset")

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.lock = threading.Lock()
        self.lock.acquire()
        self.lead = False  # set when handed the next flush


class GroupCommitService:
    """Puts wait until the CommitLog offset they wrote is durable; one fdatasync serves every put
    that arrived while the previous one ran.

    Leader/follower: a put that finds no flush running flushes itself (no hand-off to another
    thread and back: an uncontended sync put costs one fdatasync, like a plain write+fdatasync);
    puts arriving meanwhile wait, each on a lock of its own.  The leader releases those its flush
    covered and hands the next flush to the oldest of the rest."""

    def __init__(self, flush: Callable[[], int], timeout_ms: int = 5000) -> None:
        self._flush = flush
        self.timeout_ms = timeout_ms
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a flush round ends
        self._waiters: list[_Waiter] = []
        self._flushing = False
        self._flushed = 0
        self._stopped = False
        self._error: BaseException | None = None
        self.flushes = 0  # statistics: fdatasync rounds and the puts they made durable
        self.served = 0

    def start(self) -> None:
        """Nothing to start: flushes run in the waiting threads."""

    @property
    def waiting(self) -> int:
        """Puts waiting for a flush round other than their own."""
        return len(self._waiters)

    def wait_durable(self, offset: int) -> bool:
        """Block until ``offset`` is durable; False on timeout (or after shutdown)."""
        if self._flushed >= offset:
            return True
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._flushed >= offset:
                return True
            if self._stopped and not self._flushing:
                return False
            waiter = None
            if self._flushing:
                waiter = _Waiter(offset)
                self._waiters.append(waiter)
            else:
                self._flushing = True
        if waiter is not None:
            released = waiter.lock.acquire(timeout=self.timeout_ms / 1000)
            with self._lock:
                if not waiter.lead:
                    if not released and waiter in self._waiters:
                        self._waiters.remove(waiter)
                    if self._error is not None:
                        raise self._error
                    return self._flushed >= offset
        return self._lead(offset)

    def _lead(self, offset: int) -> bool:
        try:
            flushed = self._flush()
        except BaseException as e:
            with self._lock:
                self._error = e
                self._flushing = False
                ready, self._waiters = self._waiters, []
                self._idle.notify_all()
            for w in ready:
                w.lock.release()
            raise
        with self._lock:
            self.flushes += 1
            if flushed > self._flushed:
                self._flushed = flushed
            done = self._flushed
            ready = [w for w in self._waiters if w.offset <= done]
            rest = [w for w in self._waiters if w.offset > done]
            self.served += 1 + len(ready)
            if rest:  # written after this flush began: the oldest leads the next round
                nxt = rest.pop(0)
                nxt.lead = True
                ready.append(nxt)
            else:
                self._flushing = False
                self._idle.notify_all()
            self._waiters = rest
        for w in ready:
            w.lock.release()
        return done >= offset

    def shutdown(self) -> None:
        """Refuse new waits; return once the flush round in progress (if any) has ended."""
        with self._lock:
            self._stopped = True
            while self._flushing:
                self._idle.wait(0.1)
