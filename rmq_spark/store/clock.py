"""Injectable clocks: time-dependent services take a :class:`Clock` so tests run fast."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time in epoch milliseconds."""
        ...

    def sleep_s(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def sleep_s(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FakeClock:
    """A manual clock for tests: ``advance`` moves time; ``sleep_s`` advances instead of waiting."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now_ms

    def advance(self, ms: int) -> None:
        with self._lock:
            self._now_ms += ms

    def set(self, now_ms: int) -> None:
        with self._lock:
            self._now_ms = now_ms

    def sleep_s(self, seconds: float) -> None:
        self.advance(int(seconds * 1000))


SYSTEM_CLOCK = SystemClock()
