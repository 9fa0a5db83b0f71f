"""Long polling of PULL_MESSAGE (RocketMQ's ``PullRequestHoldService``): a pull that found nothing
new is parked until a message reaches its queue or its time is up, then run again and answered.

- Parked pulls are indexed by (topic, queue id), each queue's in a heap by offset: a dispatch
  wakes only the queues it wrote (:meth:`LongPollHold.notify`), and in them only the pulls whose
  offset it passed, each in O(log n).  Nothing walks every parked pull.
- Deadlines are kept in one heap under one timer (the earliest): pulls expiring together are
  popped in O(log n) each and answered at most :data:`RELEASE_BATCH` per turn of the event loop,
  so a mass expiry (20,000 at once) leaves the loop to other connections between batches.
- At most ``max_per_connection`` parked pulls per connection and ``max_total`` in all: a pull
  past a bound is not parked (:meth:`LongPollHold.park` returns False and the caller answers it
  at once: PULL_NOT_FOUND, nothing new).
- A connection that closes drops its parked pulls; :meth:`LongPollHold.release_all` answers every
  parked pull (the broker stopping), so none is left behind.
Everything runs on the event loop, except :meth:`LongPollHold.notify` (any thread).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from rmq_spark.remoting.command import RemotingCommand

__all__ = ["MAX_PARKED_PER_CONNECTION", "MAX_PARKED_TOTAL", "RELEASE_BATCH", "LongPollHold"]

log = logging.getLogger("rmq_spark.remoting.pull")

MAX_PARKED_PER_CONNECTION = 4_096  # a client instance shares one connection for all its queues
MAX_PARKED_TOTAL = 20_000
RELEASE_BATCH = 256  # parked pulls answered per turn of the event loop

QueueKey = tuple[str, int]


class Parked:
    """One parked pull: ``run()`` reads the queue again and gives the answer."""

    __slots__ = ("conn", "deadline", "done", "key", "offset", "request", "run")

    def __init__(self, conn: Any, request: RemotingCommand, key: QueueKey, offset: int, deadline: float,
                 run: Callable[[], RemotingCommand]) -> None:  # fmt: skip
        self.conn = conn
        self.request = request
        self.key = key
        self.offset = offset
        self.deadline = deadline
        self.run = run
        self.done = False


class LongPollHold:
    def __init__(self, loop: asyncio.AbstractEventLoop, max_offset: Callable[[str, int], int], *,
                 max_per_connection: int = MAX_PARKED_PER_CONNECTION,
                 max_total: int = MAX_PARKED_TOTAL) -> None:  # fmt: skip
        self.loop = loop
        self.max_offset = max_offset
        self.max_per_connection = max_per_connection
        self.max_total = max_total
        # (topic, queue) -> heap of (offset, seq, pull); pulls already answered are dropped lazily
        self._queues: dict[QueueKey, list[tuple[int, int, Parked]]] = {}
        self._live: dict[QueueKey, int] = {}
        self._deadlines: list[tuple[float, int, Parked]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._ready: deque[Parked] = deque()
        self._turn_scheduled = False
        self._by_conn: dict[int, set[Parked]] = {}
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._woken: set[QueueKey] = set()
        self._wake_scheduled = False
        self.parked = 0  # pulls parked now
        self.refused = 0  # pulls answered at once because a bound was reached
        self.answered = 0  # parked pulls answered (woken, expired or released)

    # --- parking ----------------------------------------------------------------------------------
    def park(self, conn: Any, request: RemotingCommand, key: QueueKey, offset: int, timeout_s: float,
             run: Callable[[], RemotingCommand]) -> bool:  # fmt: skip
        """Park a pull of ``key`` waiting for a message past ``offset``; False (not parked) when
        a bound is reached."""
        if conn.closed:  # nobody to answer: the caller's answer is dropped as well
            return False
        mine = self._by_conn.get(conn.id)
        if self.parked >= self.max_total or (
            mine is not None and len(mine) >= self.max_per_connection
        ):
            self.refused += 1
            return False
        if mine is None:
            mine = self._by_conn[conn.id] = set()
            conn.on_close(self._connection_closed)
        request.body = b""  # a pull's body means nothing: not kept while it waits
        entry = Parked(conn, request, key, offset, self.loop.time() + timeout_s, run)
        seq = next(self._seq)
        mine.add(entry)
        self.parked += 1
        heapq.heappush(self._queues.setdefault(key, []), (offset, seq, entry))
        self._live[key] = self._live.get(key, 0) + 1
        heapq.heappush(self._deadlines, (entry.deadline, seq, entry))
        self._compact_deadlines()
        self._arm_timer()
        # a message stored between the read and the parking woke nobody: look again
        if self.max_offset(*key) > offset:
            self._wake(key)
        return True

    def _retire(self, entry: Parked) -> None:
        entry.done = True
        self.parked -= 1
        key = entry.key
        self._live[key] -= 1
        mine = self._by_conn.get(entry.conn.id)
        if mine is not None:
            mine.discard(entry)
        heap = self._queues.get(key)
        if heap is not None:
            live = self._live[key]
            if live == 0:
                del self._queues[key], self._live[key]
            elif len(heap) > 2 * live + 16:  # mostly answered pulls: rebuild (amortized O(1))
                heap[:] = [item for item in heap if not item[2].done]
                heapq.heapify(heap)

    def _compact_deadlines(self) -> None:
        heap = self._deadlines
        if len(heap) > 2 * self.parked + 64:
            heap[:] = [item for item in heap if not item[2].done]
            heapq.heapify(heap)

    # --- waking -----------------------------------------------------------------------------------
    def notify(self, topics: Iterable[str], queue_ids: Iterable[int]) -> None:
        """Messages were dispatched to these (topic, queue id) pairs (any thread)."""
        if not self._queues:
            return
        queues = self._queues
        keys = {key for key in zip(topics, queue_ids, strict=True) if key in queues}
        if not keys:
            return
        with self._lock:
            self._woken |= keys
            if self._wake_scheduled:
                return
            self._wake_scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._wake_pending)
        except RuntimeError:  # the loop is closed: the broker is stopping
            pass

    def _wake_pending(self) -> None:
        with self._lock:
            keys, self._woken = self._woken, set()
            self._wake_scheduled = False
        for key in keys:
            self._wake(key)

    def _wake(self, key: QueueKey) -> None:
        heap = self._queues.get(key)
        if not heap:
            return
        hi = self.max_offset(*key)
        while heap and heap[0][0] < hi:
            _, _, entry = heapq.heappop(heap)
            if not entry.done:
                self._retire(entry)
                self._ready.append(entry)
        if key in self._queues and not self._queues[key]:
            del self._queues[key], self._live[key]
        self._schedule_turn()

    # --- expiring ---------------------------------------------------------------------------------
    def _arm_timer(self) -> None:
        heap = self._deadlines
        while heap and heap[0][2].done:
            heapq.heappop(heap)
        if not heap:
            return
        at = heap[0][0]
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._schedule_turn()

    def _schedule_turn(self) -> None:
        if not self._turn_scheduled:
            self._turn_scheduled = True
            self.loop.call_soon(self._turn)

    def _turn(self) -> None:
        """Answer at most RELEASE_BATCH pulls (woken first, then expired); come back for more
        after the loop has served the other connections."""
        self._turn_scheduled = False
        budget = RELEASE_BATCH
        heap, now = self._deadlines, self.loop.time() + 0.001  # the timer may fire a hair early
        while heap and len(self._ready) < budget and heap[0][0] <= now:
            _, _, entry = heapq.heappop(heap)
            if not entry.done:
                self._retire(entry)
                self._ready.append(entry)
        while self._ready and budget > 0:
            self._answer(self._ready.popleft())
            budget -= 1
        if self._ready or (heap and heap[0][0] <= now):
            self._schedule_turn()
        else:
            self._arm_timer()

    def _answer(self, entry: Parked) -> None:
        conn = entry.conn
        if conn.closed:
            return
        try:
            answer = entry.run()
        except Exception as e:  # noqa: BLE001 - answered and logged by the connection's failure()
            answer = conn.failure(entry.request, e)
        self.answered += 1
        conn.reply(entry.request, answer)

    # --- connections and stopping -----------------------------------------------------------------
    def _connection_closed(self, conn: Any) -> None:
        for entry in list(self._by_conn.pop(conn.id, ())):
            if not entry.done:
                self._retire(entry)
        self._compact_deadlines()

    def release_all(self) -> int:
        """Answer every parked pull now (the broker is stopping); how many were answered."""
        entries = [e for mine in self._by_conn.values() for e in mine if not e.done]
        for entry in entries:
            self._retire(entry)
            self._ready.append(entry)
        n = len(self._ready)
        while self._ready:
            self._answer(self._ready.popleft())
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._deadlines.clear()
        return n
