"""What a remoting server serves: request code -> handler, and the hooks around every request
(:class:`Processor`); the server (:mod:`rmq_spark.remoting.server`) calls them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rmq_spark.remoting.command import RemotingCommand

# the server's Connection (rmq_spark.remoting.server, which imports this module)
Connection = Any

__all__ = ["Handler", "Processor"]

# a handler answers with a command, None (nothing to answer), or an awaitable of either
Handler = Callable[[Connection, RemotingCommand], Any]


class Processor:
    """Request code -> handler.  ``blocking`` codes run on the server's thread pool."""

    def __init__(self) -> None:
        self.handlers: dict[int, Handler] = {}
        self.blocking: set[int] = set()
        self.on_close: list[Callable[[Connection], None]] = []
        # checked before every handler (access control): None lets the request through, an
        # answer refuses it
        self.before: Callable[[Connection, RemotingCommand], RemotingCommand | None] | None = None
        # the same, on the pool before a blocking handler (what grows with the request, kept off
        # the loop: the request table's gate parses big bodies here)
        self.before_blocking: Callable[[Connection, RemotingCommand], RemotingCommand | None] | None
        self.before_blocking = None
        # told of every answer (the metrics' rpc latency): (request code, response code, ms)
        self.observe: Callable[[int, int, float], None] | None = None

    def register(self, code: int, handler: Handler, *, blocking: bool = False) -> None:
        self.handlers[int(code)] = handler
        if blocking:
            self.blocking.add(int(code))
