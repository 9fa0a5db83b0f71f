"""Long polls parked on the server's event loop, woken by topic.

A ReceiveMessage or PullMessage that finds nothing waits for a change without holding a thread:
it parks an ``asyncio`` future under the topics whose writes could answer it
(:meth:`Wakeups.wait`), and whoever writes a topic (a send, a re-delivery, any thread) calls
:meth:`Wakeups.wake` with the topics written.  A wake from another thread schedules one callback
on the loop, however many writes arrive before it runs (the topics gather in a set), and only
the futures parked under those topics are resolved: a send to a topic nobody waits on costs one
dictionary lookup, and a thousand polls parked on other topics stay asleep.

No wake-up is lost: the caller reads a version before it looks for messages, parks, and then
checks that the version has not moved (``unchanged``); a writer moves the version before it
calls :meth:`wake`, which looks for parked futures after that.  Either the waiter sees the new
version, or the writer sees the parked future.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable

__all__ = ["Wakeups"]


class Wakeups:
    def __init__(self) -> None:
        self._parked: dict[
            str, set[asyncio.Future[None]]
        ] = {}  # read from any thread, changed on the loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._due: set[str] = set()  # topics to wake at the next callback
        self._due_all = False
        self._scheduled = False

    @property
    def parked(self) -> int:
        """Futures parked now (a poll parked under two topics counts once)."""
        return len({id(f) for futs in list(self._parked.values()) for f in list(futs)})

    def wake(self, topics: Iterable[str] | None = None) -> None:
        """Wake the polls parked under ``topics`` (every poll when ``None``); any thread."""
        parked = self._parked
        loop = self._loop
        if not parked or loop is None:
            return
        wanted: list[str] = []
        if topics is not None:
            wanted = [t for t in set(topics) if t in parked]
            if not wanted:
                return
        with self._lock:
            if topics is None:
                self._due_all = True
            else:
                self._due.update(wanted)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            loop.call_soon_threadsafe(self._fire)
        except RuntimeError:  # the loop is closed: nobody is parked any more
            with self._lock:
                self._scheduled = False

    def _fire(self) -> None:
        with self._lock:
            due, every = self._due, self._due_all
            self._due, self._due_all, self._scheduled = set(), False, False
        parked = self._parked
        for topic in list(parked) if every else due:
            for fut in list(parked.get(topic, ())):
                if not fut.done():
                    fut.set_result(None)

    async def wait(
        self, topics: Iterable[str], timeout_s: float, unchanged: Callable[[], bool]
    ) -> None:
        """Park until a write to one of ``topics`` is announced or ``timeout_s`` passes; return at
        once if ``unchanged()`` is false once parked (something changed meanwhile)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        fut: asyncio.Future[None] = loop.create_future()
        keys = tuple(dict.fromkeys(topics))
        parked = self._parked
        for k in keys:
            parked.setdefault(k, set()).add(fut)
        timer = None
        try:
            if not unchanged() or timeout_s <= 0:
                return
            timer = loop.call_later(timeout_s, _settle, fut)
            await fut
        finally:
            if timer is not None:
                timer.cancel()
            for k in keys:
                s = parked.get(k)
                if s is not None:
                    s.discard(fut)
                    if not s:
                        del parked[k]


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
