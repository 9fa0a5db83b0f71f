"""The remoting server's accept loop: connections taken from a listening socket on the event loop,
each admitted or refused as it is accepted.

Each connection is admitted (counted against the limits of :mod:`rmq_spark.remoting.limits`) or
refused (closed at once, its descriptor freed) before the next one is accepted.  asyncio's own
server accepts up to a hundred connections per turn of the loop and makes their protocols turns
later, so a crowd could take the descriptors kept for the store before the first was refused.
Out of descriptors (or kernel memory), accepting pauses for a moment, with one warning per
interval, while the store's reserve makes room.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable

from rmq_spark.remoting.limits import RateLimitedLog

__all__ = ["ACCEPTS_PER_TURN", "ACCEPT_RETRY_S", "Acceptor", "peer_text"]

# connections accepted in one turn of the event loop, and the pause when accept runs out of
# descriptors (asyncio's own figures)
ACCEPTS_PER_TURN = 100
ACCEPT_RETRY_S = 1.0
_RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_PEER_ERRNOS = (errno.ECONNABORTED, errno.EPROTO, errno.EPERM)  # the peer went before accept


def peer_text(sock: socket.socket) -> str:
    try:
        peer = sock.getpeername()
    except OSError:
        return "?"
    return f"{peer[0]}:{peer[1]}"


class Acceptor:
    """Accepts on ``sock`` (listening) on ``loop``: ``admit(fileno)`` is None for a connection
    that may stay, else why not (the connection is then closed, logged and ``refused(peer, why)``
    told);
    ``admitted(sock)`` takes the ones that stay.  Runs on the loop's thread only."""

    def __init__(
        self,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        admit: Callable[[int], str | None],
        admitted: Callable[[socket.socket], None],
        refused: Callable[[str, str], None],
        limited_log: RateLimitedLog,
    ) -> None:
        self.sock, self.loop = sock, loop
        self.admit, self.admitted, self.refused = admit, admitted, refused
        self.limited_log = limited_log
        self.endpoint = "{}:{}".format(*sock.getsockname()[:2])
        self._accepting = False
        self._stopped = False

    def start(self) -> None:
        self.sock.setblocking(False)
        self._resume()

    def stop(self) -> None:
        """Stops accepting and closes the listening socket."""
        self._stopped = True
        if self._accepting:
            self._accepting = False
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()

    def _resume(self) -> None:
        if self._stopped or self._accepting:
            return
        self._accepting = True
        self.loop.add_reader(self.sock.fileno(), self._ready)

    def _pause(self, seconds: float) -> None:
        if self._accepting:
            self._accepting = False
            self.loop.remove_reader(self.sock.fileno())
            self.loop.call_later(seconds, self._resume)

    def _ready(self) -> None:
        """Accept what the listening socket holds, a bounded number per turn of the loop."""
        for _ in range(ACCEPTS_PER_TURN):
            try:
                csock, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _PEER_ERRNOS:
                    continue
                if exc.errno in _RESOURCE_ERRNOS:
                    self.limited_log.log("accept", logging.WARNING,
                                         "remoting port %s: out of resources accepting (%s): pausing %.1fs",
                                         self.endpoint, exc, ACCEPT_RETRY_S)  # fmt: skip
                else:
                    self.limited_log.log("accept-error", logging.ERROR,
                                         "remoting port %s: accept failed", self.endpoint,
                                         exc_info=exc)  # fmt: skip
                self._pause(ACCEPT_RETRY_S)
                return
            refusal = self.admit(csock.fileno())
            if refusal is not None:
                peer = peer_text(csock)
                csock.close()
                self.limited_log.log("refused", logging.WARNING,
                                     "remoting connection from %s refused: %s", peer, refusal)  # fmt: skip
                self.refused(peer, refusal)
                continue
            csock.setblocking(False)
            self.admitted(csock)
