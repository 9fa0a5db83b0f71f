"""TLS on the broker's ports, server side: Apache RocketMQ's ``tls.server.*`` settings.

Remoting (and the NameServer) speak plain TLS on the same port, as Apache's Netty servers do;
``mode`` is ``tls.server.mode``:

=============  ==========================================================================
disabled       plain only (no TLS settings needed)
permissive     both on one port: a connection whose first byte is 0x16 (a TLS handshake
               record) is served TLS, any other plain (Apache's ``HandshakeHandler``)
enforcing      TLS only: a plain connection fails its handshake and is closed
=============  ==========================================================================

``client_auth`` is ``tls.server.need.client.auth`` (none / optional / require), checked against
``ca_file`` (``tls.server.trustCertPath``).  The gRPC port cannot tell the two apart on one
port: it serves TLS in permissive and enforcing mode alike (:meth:`ServerTls.grpc_credentials`).

A handshake that does not finish in ``TLS_HANDSHAKE_TIMEOUT_S`` (a client that sent half a
hello, or garbage) fails; the connection is closed and the server goes on.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rmq_spark.errors import ConfigError

__all__ = [
    "TLS_HANDSHAKE_TIMEOUT_S",
    "TLS_SHUTDOWN_TIMEOUT_S",
    "ClientAuth",
    "ServerTls",
    "TlsMode",
]

TLS_HANDSHAKE_BYTE = 0x16  # a TLS record's content type: handshake (the ClientHello's)
TLS_HANDSHAKE_TIMEOUT_S = 10.0
# a closing connection waits this long for the peer's close_notify (asyncio's default is 30 s, the
# connection's slot held all that time)
TLS_SHUTDOWN_TIMEOUT_S = 2.0


class TlsMode(Enum):
    DISABLED = "disabled"
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"


class ClientAuth(Enum):
    NONE = "none"
    OPTIONAL = "optional"
    REQUIRE = "require"


_VERIFY = {
    ClientAuth.NONE: ssl.CERT_NONE,
    ClientAuth.OPTIONAL: ssl.CERT_OPTIONAL,
    ClientAuth.REQUIRE: ssl.CERT_REQUIRED,
}


@dataclass(frozen=True)
class ServerTls:
    """The certificate and key a server shows, and how it treats clients (see the module)."""

    cert_file: str
    key_file: str
    ca_file: str | None = None
    mode: TlsMode = TlsMode.ENFORCING
    client_auth: ClientAuth = ClientAuth.NONE
    _context: list[ssl.SSLContext] = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.client_auth is not ClientAuth.NONE and self.ca_file is None:
            raise ConfigError(
                f"--tls-client-auth {self.client_auth.value} needs --tls-ca (the CA client "
                "certificates are checked against)"
            )

    @property
    def context(self) -> ssl.SSLContext:
        """The remoting ports' SSLContext (made once; loading fails with the flag named)."""
        if not self._context:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as e:
                raise ConfigError(
                    f"--tls-cert {self.cert_file} / --tls-key {self.key_file}: cannot load the "
                    f"certificate and its key: {e}"
                ) from None
            if self.ca_file is not None:
                try:
                    ctx.load_verify_locations(cafile=self.ca_file)
                except (OSError, ssl.SSLError) as e:
                    raise ConfigError(f"--tls-ca {self.ca_file}: cannot load it: {e}") from None
            ctx.verify_mode = _VERIFY[self.client_auth]
            self._context.append(ctx)
        return self._context[0]

    def grpc_credentials(self) -> Any:
        """``grpc.ssl_server_credentials`` of the same files (the gRPC port)."""
        import grpc

        self.context  # noqa: B018 -- loads the files once, failing with the flags named
        with open(self.cert_file, "rb") as f:
            cert = f.read()
        with open(self.key_file, "rb") as f:
            key = f.read()
        roots = None
        if self.ca_file is not None:
            with open(self.ca_file, "rb") as f:
                roots = f.read()
        return grpc.ssl_server_credentials(
            [(key, cert)],
            root_certificates=roots,
            require_client_auth=self.client_auth is ClientAuth.REQUIRE,
        )

    async def context_for(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, wait_s: float
    ) -> ssl.SSLContext | None:
        """The SSLContext to serve the accepted ``sock`` with, None for plain: enforcing, always
        TLS; permissive, TLS when the first byte (peeked, not read) starts a handshake.  A peer
        that sends nothing in ``wait_s``, or closes, raises ``ConnectionError``."""
        if self.mode is TlsMode.ENFORCING:
            return self.context
        if self.mode is TlsMode.DISABLED:
            return None
        first = await _peek_byte(loop, sock, wait_s)
        return self.context if first == TLS_HANDSHAKE_BYTE else None


async def connect_accepted(
    loop: asyncio.AbstractEventLoop,
    factory: Callable[[], asyncio.Protocol],
    sock: socket.socket,
    tls: ServerTls | None,
    wait_s: float,
) -> None:
    """``loop.connect_accepted_socket`` of an accepted ``sock``: plain, or TLS as ``tls`` says
    (the protocol is made once the handshake is done; a handshake that fails or stalls past
    ``TLS_HANDSHAKE_TIMEOUT_S`` raises, for the caller to close ``sock``)."""
    ctx = None if tls is None else await tls.context_for(loop, sock, wait_s)
    if ctx is None:
        await loop.connect_accepted_socket(factory, sock)
        return
    # 3.11+: a close waits for the peer's close_notify this long at most
    shutdown = (
        {"ssl_shutdown_timeout": TLS_SHUTDOWN_TIMEOUT_S} if sys.version_info >= (3, 11) else {}
    )
    await loop.connect_accepted_socket(factory, sock, ssl=ctx,
                                       ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S, **shutdown)  # fmt: skip


def add_grpc_port(server: Any, listen: str, tls: ServerTls | None) -> int:
    """``server.add_secure_port`` with ``tls`` (in permissive mode too: a gRPC port cannot serve
    both), else ``add_insecure_port``; the port bound (0: none)."""
    if tls is None:
        return int(server.add_insecure_port(listen))
    return int(server.add_secure_port(listen, tls.grpc_credentials()))


async def _peek_byte(loop: asyncio.AbstractEventLoop, sock: socket.socket, wait_s: float) -> int:
    deadline = loop.time() + wait_s
    while True:
        try:
            data = sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            pass
        else:
            if not data:
                raise ConnectionError("closed before its first byte")
            return data[0]
        ready: asyncio.Future[None] = loop.create_future()
        fd = sock.fileno()
        loop.add_reader(fd, _wake, ready)
        try:
            await asyncio.wait_for(ready, max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            raise ConnectionError(f"sent nothing in {wait_s:g}s") from None
        finally:
            loop.remove_reader(fd)


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)
