"""A fake remoting server for rmq-admin's tests: it reads each request frame and answers whatever
a test tells it to (a trickle, garbage, a signed request's echo)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from rmq_spark.remoting.command import RemotingCommand, decode_frame

if TYPE_CHECKING:
    from typing_extensions import Self

Reply = Callable[[RemotingCommand, socket.socket, threading.Event], None]


class FakeServer:
    """A TCP server on 127.0.0.1 in threads of its own: it reads each request frame and lets
    ``reply(request, connection, stopping)`` write whatever it likes; ``requests`` keeps them."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.requests: list[RemotingCommand] = []
        self.stopping = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed: stopping
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            try:
                while not self.stopping.is_set():
                    head = _exact(conn, 4)
                    req = decode_frame(_exact(conn, int.from_bytes(head, "big")))
                    self.requests.append(req)
                    self.reply(req, conn, self.stopping)
            except (OSError, ConnectionError):
                return

    def close(self) -> None:
        self.stopping.set()
        try:
            # wakes the blocked accept (close alone does not)
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for t in self._threads:
            t.join(10)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf
