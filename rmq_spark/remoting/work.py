"""Blocking work of the remoting connections on the server's thread pool, shared fairly.

A blocking request (a send waiting for its fdatasync with ``--flush sync``) runs on the pool.
Each connection has at most :data:`RUNNING_PER_CONNECTION` of its requests on the pool at once;
the rest wait in the connection's own queue, in order, and enter the pool as its earlier ones
finish.  A connection pipelining hundreds of sends so holds a few of the pool's places, and
another client's send waits behind those few, not behind all of them.

The counts (per connection and in all, requests and frame bytes) feed the limits of
:mod:`rmq_spark.remoting.limits`: a connection at its bound is not read until its work drains;
past the total, a new blocking request is refused with :class:`ServerBusy` (``SYSTEM_BUSY``).
Work still waiting when its connection closes is dropped (never run, never answered: nothing
was acknowledged).  Everything here runs on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from rmq_spark.remoting import limits as lim
from rmq_spark.remoting.faults import ServerBusy

__all__ = ["RUNNING_PER_CONNECTION", "ConnectionWork", "WorkQueue"]

RUNNING_PER_CONNECTION = 2


class ConnectionWork:
    """One connection's blocking work: counted, running and waiting."""

    __slots__ = ("inflight", "inflight_bytes", "pending", "running")

    def __init__(self) -> None:
        self.inflight = 0  # requests accepted and not yet done (running or waiting)
        self.inflight_bytes = 0
        self.running = 0
        self.pending: deque[tuple[asyncio.Future[Any], Callable[..., Any], tuple[Any, ...]]] = (
            deque()
        )


class WorkQueue:
    """The server's blocking work: ``server`` holds the pool, the limits and the totals."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def submit(self, work: ConnectionWork, nbytes: int, fn: Callable[..., Any], *args: Any,
               on_done: Callable[[], None]) -> asyncio.Future[Any]:  # fmt: skip
        """A future of ``fn(*args)`` run on the pool in ``work``'s turn; ``on_done()`` after it
        (and its counts) are done.  Raises ServerBusy past the total bound."""
        server = self.server
        if server.inflight >= server.total_inflight_max or (
                server.inflight and server.inflight_bytes + nbytes > server.total_inflight_max_bytes):  # fmt: skip
            server.busy_answers += 1
            server.limited_log.log("busy", logging.WARNING,
                                   "remoting: %d blocking requests (%d bytes) are queued: answering SYSTEM_BUSY",
                                   server.inflight, server.inflight_bytes)  # fmt: skip
            raise ServerBusy(lim.SYSTEM_BUSY_REMARK)
        fut: asyncio.Future[Any] = server.loop_thread.loop.create_future()
        work.inflight += 1
        work.inflight_bytes += nbytes
        server.inflight += 1
        server.inflight_bytes += nbytes

        def counted(_f: asyncio.Future[Any]) -> None:
            work.inflight -= 1
            work.inflight_bytes -= nbytes
            server.inflight -= 1
            server.inflight_bytes -= nbytes
            on_done()

        fut.add_done_callback(counted)
        work.pending.append((fut, fn, args))
        self._pump(work)
        return fut

    def _pump(self, work: ConnectionWork) -> None:
        loop = self.server.loop_thread.loop
        while work.running < RUNNING_PER_CONNECTION and work.pending:
            fut, fn, args = work.pending.popleft()
            if fut.done():  # dropped
                continue
            try:
                ran = loop.run_in_executor(self.server.executor, fn, *args)
            except RuntimeError:  # the pool is shut down: the server is stopping
                fut.set_exception(ServerBusy("the broker is stopping"))
                continue
            work.running += 1
            ran.add_done_callback(functools.partial(self._finished, work, fut))

    def _finished(
        self, work: ConnectionWork, fut: asyncio.Future[Any], ran: asyncio.Future[Any]
    ) -> None:
        work.running -= 1
        if not fut.done():
            if ran.cancelled():
                fut.cancel()
            elif ran.exception() is not None:
                fut.set_exception(ran.exception())  # type: ignore[arg-type]
            else:
                fut.set_result(ran.result())
        self._pump(work)

    @staticmethod
    def drop(work: ConnectionWork) -> None:
        """The connection closed: its waiting work is never run."""
        while work.pending:
            fut, _fn, _args = work.pending.popleft()
            fut.cancel()
