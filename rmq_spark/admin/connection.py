"""rmq-admin's connection to a NameServer or a broker: one kept socket, and a **deadline per
request**: connecting, sending and reading the whole answer share ``timeout_s``, so a server that
trickles a byte a second cannot hold rmq-admin past it (a timeout per read could: each byte
restarts it).  What the server answers is read as a hostile peer's bytes: a frame length outside
``[4, FRAME_MAX_BYTES]``, a header that does not decode or nests without end, is a
:class:`BadAnswer` naming the problem, never a Python exception text.
"""

from __future__ import annotations

import itertools
import math
import re
import socket
import time

from rmq_spark.remoting.command import FRAME_MAX_BYTES, FrameError, RemotingCommand, decode_frame

__all__ = ["BadAnswer", "Closed", "Connection", "DeadlineExceeded", "parse_addr"]

_opaques = itertools.count(1)
_PORT = re.compile(r"[0-9]{1,5}")


class DeadlineExceeded(Exception):
    """No whole answer within the request's deadline."""


class Closed(ConnectionError):
    """The server closed the connection before the whole answer came."""


class BadAnswer(Exception):
    """The server answered bytes that are no RocketMQ remoting frame (the text says why)."""


def parse_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); ValueError naming what is wrong."""
    host, sep, port = addr.strip().rpartition(":")
    host = host.strip("[]") if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or any(c.isspace() for c in host) or not _PORT.fullmatch(port):
        raise ValueError(f"{addr!r} is not HOST:PORT")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"{addr!r}: port {int(port)} is not between 1 and 65535")
    return host, int(port)


class Connection:
    """Requests to ``addr`` over one kept connection, each within ``timeout_s`` in total."""

    def __init__(self, addr: str, timeout_s: float) -> None:
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout {timeout_s!r} is not a positive number of seconds")
        self.addr = addr
        self.host, self.port = parse_addr(addr)
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None

    def request(self, cmd: RemotingCommand) -> RemotingCommand:
        """Send ``cmd`` and return the answer with its opaque (others, and the server's own
        requests, are skipped), all before the deadline.  OSError when the connection fails,
        :class:`DeadlineExceeded`, :class:`BadAnswer`; the connection is then closed."""
        deadline = time.monotonic() + self.timeout_s
        cmd.opaque = next(_opaques) & 0x7FFFFFFF
        try:
            sock = self._connect(deadline)
            sock.settimeout(self._left(deadline))
            sock.sendall(cmd.encode())  # its timeout bounds the whole send (Python >= 3.5)
            while True:
                answer = self._read(sock, deadline)
                if answer.is_response and answer.opaque == cmd.opaque:
                    return answer
        except TimeoutError:
            self.close()
            raise DeadlineExceeded(
                f"{self.addr} did not answer within {self.timeout_s:g} s"
            ) from None
        except BaseException:
            self.close()
            raise

    def _connect(self, deadline: float) -> socket.socket:
        if self._sock is None:
            self._sock = socket.create_connection(
                (self.host, self.port), timeout=self._left(deadline)
            )
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self._sock

    @staticmethod
    def _left(deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return left

    def _read(self, sock: socket.socket, deadline: float) -> RemotingCommand:
        length = int.from_bytes(self._exact(sock, 4, deadline), "big", signed=True)
        if not 4 <= length <= FRAME_MAX_BYTES:
            raise BadAnswer(f"{self.addr} answered a frame length of {length} (a RocketMQ frame has 4 to "
                            f"{FRAME_MAX_BYTES} bytes)")  # fmt: skip
        frame = self._exact(sock, length, deadline)
        try:
            return decode_frame(frame)
        except RecursionError:
            raise BadAnswer(
                f"{self.addr} answered a frame whose header is nested too deeply"
            ) from None
        except FrameError as e:
            raise BadAnswer(f"{self.addr} answered a frame that does not decode: {e}") from None
        except (ValueError, TypeError, KeyError, AttributeError, IndexError):
            raise BadAnswer(
                f"{self.addr} answered a frame that is no RocketMQ remoting command"
            ) from None

    def _exact(self, sock: socket.socket, n: int, deadline: float) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            sock.settimeout(self._left(deadline))
            chunk = sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise Closed(f"{self.addr} closed the connection before answering")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
