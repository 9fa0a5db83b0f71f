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


class GroupCommitService(threading.Thread):
    """Waiters register the CommitLog offset they need durable; one fdatasync serves all the
    requests gathered while the previous one ran."""

    def __init__(self, flush: Callable[[], int], timeout_ms: int = 5000) -> None:
        super().__init__(name="rmq-group-commit", daemon=True)
        self._flush = flush
        self.timeout_ms = timeout_ms
        self._cond = threading.Condition()
        self._wanted = 0
        self._flushed = 0
        self._stopped = False
        self._error: BaseException | None = None

    def wait_durable(self, offset: int) -> bool:
        """Block until ``offset`` is durable; False on timeout."""
        deadline = time.monotonic() + self.timeout_ms / 1000
        with self._cond:
            if offset > self._wanted:
                self._wanted = offset
                self._cond.notify_all()
            while self._flushed < offset:
                if self._error is not None:
                    raise self._error
                left = deadline - time.monotonic()
                if left <= 0 or self._stopped:
                    return self._flushed >= offset
                self._cond.wait(left)
        return True

    def run(self) -> None:
        while True:
            with self._cond:
                while self._wanted <= self._flushed and not self._stopped:
                    self._cond.wait(0.01)
                if self._stopped and self._wanted <= self._flushed:
                    return
            try:
                flushed = self._flush()
            except BaseException as e:  # noqa: BLE001 - handed to the waiters
                with self._cond:
                    self._error = e
                    self._cond.notify_all()
                return
            with self._cond:
                self._flushed = max(self._flushed, flushed)
                self._cond.notify_all()

    def shutdown(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self.is_alive():
            self.join()
