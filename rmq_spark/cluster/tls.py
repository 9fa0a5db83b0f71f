"""TLS on the remoting protocol, client side: what the Java client's ``setUseTLS(true)`` does.

Apache RocketMQ's remoting TLS is plain TLS on the same port (Netty's ``SslHandler`` first in
the pipeline, then the usual frames): no protocol switch, no ALPN.  A :class:`TlsConfig` says
how to check the server and what certificate to show it; :func:`open_socket` connects, shakes
hands, and translates a failed handshake into a :class:`TlsError` naming the address and the
option to look at.

How this differs from the Java client's defaults (``TlsSystemConfig``):

- The chain is always verified: against ``ca_file`` when given, else the system's CAs.  Java
  trusts any certificate unless ``tls.client.authServer=true`` (and ``tls.test.mode.enable``,
  on by default, trusts any too).
- The host name is not checked unless ``hostname_check``: Java's Netty ``SslHandler`` is made
  without a peer host, so it checks none either.
"""

from __future__ import annotations

import io
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any, cast

__all__ = ["TlsConfig", "TlsError", "TlsSocket", "open_socket", "plain_refusal_hint"]


class TlsError(ConnectionError):
    """A TLS handshake failed (or TLS settings could not be loaded); says where and why."""


@dataclass(frozen=True)
class TlsConfig:
    """How a client speaks TLS to NameServers and brokers (hashable: a key of client caches)."""

    ca_file: str | None = None  # PEM CA certificates the server's chain must end at
    cert_file: str | None = None  # PEM client certificate (and its key, unless key_file)
    key_file: str | None = None  # PEM private key of cert_file
    hostname_check: bool = False  # the certificate must name the host dialled

    def context(self) -> ssl.SSLContext:
        """This config's SSLContext, made once per process (it holds the loaded files)."""
        with _contexts_lock:
            ctx = _contexts.get(self)
            if ctx is None:
                ctx = _contexts[self] = self._make_context()
            return ctx

    def _make_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = self.hostname_check
        ctx.verify_mode = ssl.CERT_REQUIRED
        try:
            if self.ca_file is not None:
                ctx.load_verify_locations(cafile=self.ca_file)
            else:
                ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        except (OSError, ssl.SSLError) as e:
            raise TlsError(f"option 'tlsCaFile': cannot load {self.ca_file!r}: {e}") from None
        if self.cert_file is not None:
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as e:
                files = repr(self.cert_file) + (f" / {self.key_file!r}" if self.key_file else "")
                raise TlsError(
                    f"options 'tlsCertFile' / 'tlsKeyFile': cannot load the client certificate "
                    f"and key {files}: {e}"
                ) from None
        return ctx


_contexts: dict[TlsConfig, ssl.SSLContext] = {}
_contexts_lock = threading.Lock()


def _why(e: ssl.SSLError | OSError) -> str:
    """What to look at for a failed handshake."""
    text = str(e)
    if isinstance(e, ssl.SSLCertVerificationError):
        if e.verify_code == 62 or "hostname" in text.lower() or "IP address mismatch" in text:
            return f"{text} (option 'tlsHostnameCheck': the certificate does not name this host)"
        return f"{text} (option 'tlsCaFile': the CA that signed the server's certificate)"
    if isinstance(e, ssl.SSLError):
        return f"{text} (is it serving TLS on this port? does it require a client certificate: options 'tlsCertFile' / 'tlsKeyFile'?)"
    return f"{text or type(e).__name__} (is it serving TLS on this port?)"


class TlsSocket:
    """TLS over a connected socket, for one reader thread and any number of writer threads at
    once: an ``ssl.SSLSocket`` is not safe for that (OpenSSL's SSL object takes one thread at a
    time; a reader blocked in SSL_read beside a writer lost about one request in twenty
    connections, measured).  The SSL object works on memory buffers under a lock, and the
    socket's own recv and send run outside it; encrypted records leave in the order they were
    made (the send lock is taken before the SSL lock is let go)."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, host: str) -> None:
        self._sock = sock
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._obj = ctx.wrap_bio(self._in, self._out, server_hostname=host)
        self._lock = threading.Lock()  # the SSL object and its buffers
        self._send_lock = threading.Lock()  # the socket's send side, records in order
        while True:
            try:
                self._obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush_and_unlock(None)
                if not self._fill():
                    raise ConnectionError(
                        "closed the connection during the TLS handshake"
                    ) from None
        self._flush_and_unlock(None)

    def _flush_and_unlock(self, lock: threading.Lock | None) -> None:
        """Send what the SSL object wrote; ``lock`` (the SSL lock, held) is let go once the
        send lock is held, so the next records cannot overtake these."""
        data = self._out.read()
        if not data:
            if lock is not None:
                lock.release()
            return
        with self._send_lock:
            if lock is not None:
                lock.release()
            self._sock.sendall(data)

    def _fill(self) -> bool:
        """Read what the socket holds into the SSL object; False at the peer's close."""
        data = self._sock.recv(1 << 16)
        if not data:
            return False
        with self._lock:
            self._in.write(data)
        return True

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        self._lock.acquire()
        try:
            self._obj.write(data)
        except BaseException:
            self._lock.release()
            raise
        self._flush_and_unlock(self._lock)

    def recv_into(self, buf: bytearray | memoryview, nbytes: int = 0) -> int:
        n = nbytes or len(buf)
        while True:
            self._lock.acquire()
            try:
                # with a buffer, read returns the count (typeshed says bytes)
                got = int(cast(Any, self._obj).read(n, buf))
            except ssl.SSLWantReadError:
                got = -1
            except ssl.SSLZeroReturnError:  # the peer's close_notify
                got = 0
            except BaseException:
                self._lock.release()
                raise
            self._flush_and_unlock(self._lock)  # a post-handshake answer (KeyUpdate), if any
            if got >= 0:
                return got
            if not self._fill():
                return 0

    def makefile(self, mode: str = "rb", buffering: int = -1) -> io.BufferedReader:
        assert mode == "rb"
        return io.BufferedReader(_TlsReader(self), max(buffering, io.DEFAULT_BUFFER_SIZE))

    def settimeout(self, timeout_s: float | None) -> None:
        self._sock.settimeout(timeout_s)

    def setsockopt(self, level: int, option: int, value: int) -> None:
        self._sock.setsockopt(level, option, value)

    def shutdown(self, how: int) -> None:
        self._sock.shutdown(how)

    def close(self) -> None:
        self._sock.close()


class _TlsReader(io.RawIOBase):
    def __init__(self, sock: TlsSocket) -> None:
        self._tls = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        return self._tls.recv_into(memoryview(buf).cast("B"))


def open_socket(addr: str, timeout_s: float, tls: TlsConfig | None) -> socket.socket | TlsSocket:
    """A connected socket to ``host:port``, through a finished TLS handshake when ``tls``;
    ``OSError`` when the connection fails, :class:`TlsError` when the handshake does."""
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    if tls is None:
        return sock
    try:
        return TlsSocket(sock, tls.context(), host)
    except TlsError:
        sock.close()
        raise
    except (ssl.SSLError, OSError) as e:  # socket.timeout: a server that never answers hello
        sock.close()
        raise TlsError(f"TLS handshake with {addr} failed: {_why(e)}") from None


def plain_refusal_hint(tls: TlsConfig | None) -> str:
    """What to add to "closed the connection before answering": the peer may require TLS."""
    if tls is not None:
        return ""
    return " (the server may require TLS: option 'tls=true')"
