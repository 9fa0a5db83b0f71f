"""A minimal remoting client: one request, one answer, over a short-lived or kept connection.

    with RemotingClient("127.0.0.1:9876") as c:
        answer = c.request(RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO))

Blocking sockets on the caller's thread: the broker uses it off its event loop (the NameServer
heartbeats of ``--namesrv``), tests use it directly.
"""

from __future__ import annotations

import itertools
import socket
import threading
from typing import TYPE_CHECKING

from rmq_spark.remoting.command import (
    FLAG_ONEWAY,
    FrameError,
    RemotingCommand,
    SerializeType,
    decode_frame,
)

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["RemotingClient", "request"]

_opaques = itertools.count(1)


class RemotingClient:
    def __init__(self, addr: str, timeout_s: float = 3.0) -> None:
        host, _, port = addr.rpartition(":")
        self.addr = addr
        self.timeout_s = timeout_s
        self._sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lock = threading.Lock()

    def request(self, cmd: RemotingCommand) -> RemotingCommand:
        """Send ``cmd`` and return the response with its opaque (answers to other opaques, and the
        server's own requests, are skipped)."""
        cmd.opaque = next(_opaques) & 0x7FFFFFFF
        with self._lock:
            self._sock.sendall(cmd.encode())
            while True:
                answer = self._read()
                if answer.is_response and answer.opaque == cmd.opaque:
                    return answer

    def oneway(self, cmd: RemotingCommand) -> None:
        cmd.opaque = next(_opaques) & 0x7FFFFFFF
        cmd.flag |= FLAG_ONEWAY
        with self._lock:
            self._sock.sendall(cmd.encode())

    def _read(self) -> RemotingCommand:
        head = self._exact(4)
        length = int.from_bytes(head, "big", signed=True)
        if length < 4:
            raise FrameError(f"frame length {length}")
        return decode_frame(self._exact(length))

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"{self.addr} closed the connection")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def request(addr: str, code: int, ext_fields: dict[str, str] | None = None, body: bytes = b"", *,
            serialize_type: SerializeType = SerializeType.JSON, version: int = 0,
            timeout_s: float = 3.0) -> RemotingCommand:  # fmt: skip
    """One request on a new connection."""
    with RemotingClient(addr, timeout_s) as c:
        return c.request(RemotingCommand(code, dict(ext_fields or {}), body, version=version,
                                         serialize_type=serialize_type))  # fmt: skip
