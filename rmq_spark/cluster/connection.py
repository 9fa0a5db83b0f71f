"""One multiplexed remoting connection to a broker or NameServer, and a pool of them per address.

A :class:`Connection` writes requests from any thread and reads every frame on its own reader
thread: a response completes the waiting request with its opaque; a request the server sends
(``CHECK_TRANSACTION_STATE`` over a producer's connection, ``NOTIFY_CONSUMER_IDS_CHANGED``) goes
to the ``on_request`` hook, run on a small shared thread pool (so it may itself send requests and
wait for their answers), whose answer (if any) is written back with the request's opaque.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from rmq_spark.cluster.tls import TlsConfig, open_socket, plain_refusal_hint
from rmq_spark.remoting.command import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FrameError,
    RemotingCommand,
    decode_frame,
)

__all__ = ["Connection", "ConnectionPool", "RequestSigner", "ServerRequestHook"]

log = logging.getLogger("rmq_spark.cluster.connection")

# (connection, request from the server) -> the response to write back, or None for no answer
ServerRequestHook = Callable[["Connection", RemotingCommand], "RemotingCommand | None"]
# called on every request this side writes, just before it is encoded (ACL signing)
RequestSigner = Callable[[RemotingCommand], None]

_opaques = itertools.count(1)
_hooks: ThreadPoolExecutor | None = None
_hooks_lock = threading.Lock()


def _hook_pool() -> ThreadPoolExecutor:
    """The threads that run ``on_request`` hooks (shared by every connection of the process)."""
    global _hooks
    with _hooks_lock:
        if _hooks is None:
            _hooks = ThreadPoolExecutor(4, thread_name_prefix="rmq-server-request")
        return _hooks


REMOTING_VERSION = 401  # V4_9_4: NameServers answer routes in standard JSON from here on


class Connection:
    def __init__(
        self,
        addr: str,
        connect_timeout_s: float = 3.0,
        on_request: ServerRequestHook | None = None,
        signer: RequestSigner | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.addr = addr
        self.on_request = on_request
        self.signer = signer
        self.tls = tls
        self._sock = open_socket(addr, connect_timeout_s, tls)  # TLS: the handshake is done
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._write_lock = threading.Lock()
        self._pending: dict[int, Future[RemotingCommand]] = {}
        self._pending_lock = threading.Lock()
        self.closed: BaseException | None = None
        self._reader = threading.Thread(
            target=self._read_loop, name=f"rmq-conn-{addr}", daemon=True
        )
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self.closed is None

    def submit(self, cmd: RemotingCommand) -> Future[RemotingCommand]:
        """Send ``cmd`` now; the future completes with its response (or ``ConnectionError``).
        Many requests may be in flight on one connection: the broker answers each by opaque."""
        cmd.opaque = opaque = next(_opaques) & 0x7FFFFFFF
        if not cmd.version:
            cmd.version = REMOTING_VERSION
        if self.signer is not None:
            self.signer(cmd)
        fut: Future[RemotingCommand] = Future()
        with self._pending_lock:
            if self.closed is not None:
                raise ConnectionError(f"connection to {self.addr} is closed: {self.closed}")
            self._pending[opaque] = fut
        fut.add_done_callback(lambda _f: self._forget(opaque))
        try:
            self._send(cmd)
        except ConnectionError:
            self._forget(opaque)
            raise
        return fut

    def _forget(self, opaque: int) -> None:
        with self._pending_lock:
            self._pending.pop(opaque, None)

    def request(self, cmd: RemotingCommand, timeout_s: float) -> RemotingCommand:
        """Send ``cmd``; its response, or ``TimeoutError`` / ``ConnectionError``."""
        fut = self.submit(cmd)
        try:
            return fut.result(timeout_s)
        except FutureTimeout:
            self._forget(cmd.opaque)
            fut.cancel()
            raise TimeoutError(f"no answer from {self.addr} in {timeout_s:g}s") from None

    def oneway(self, cmd: RemotingCommand) -> None:
        cmd.opaque = next(_opaques) & 0x7FFFFFFF
        cmd.flag |= FLAG_ONEWAY
        if not cmd.version:
            cmd.version = REMOTING_VERSION
        if self.signer is not None:
            self.signer(cmd)
        self._send(cmd)

    def _send(self, cmd: RemotingCommand) -> None:
        data = cmd.encode()
        try:
            with self._write_lock:
                self._sock.sendall(data)
        except OSError as e:
            self._fail(ConnectionError(f"writing to {self.addr} failed: {e}"))
            raise ConnectionError(f"writing to {self.addr} failed: {e}") from None

    def _read_loop(self) -> None:
        f = self._sock.makefile("rb", buffering=1 << 20)
        frames = 0
        try:
            while True:
                head = f.read(4)
                if len(head) < 4:
                    # closed before any answer: how a server enforcing TLS drops a plain client
                    hint = plain_refusal_hint(self.tls) if frames == 0 else ""
                    raise ConnectionError(
                        f"{self.addr} closed the connection"
                        + (" before answering" + hint if frames == 0 else "")
                    )
                length = int.from_bytes(head, "big", signed=True)
                if length < 4:
                    raise FrameError(f"frame length {length} from {self.addr}")
                frame = f.read(length)
                if len(frame) < length:
                    raise ConnectionError(f"{self.addr} closed the connection mid-frame")
                cmd = decode_frame(frame)
                frames += 1
                if cmd.flag & FLAG_RESPONSE:
                    with self._pending_lock:
                        fut = self._pending.get(cmd.opaque)
                    if fut is not None and not fut.done():
                        fut.set_result(cmd)
                else:
                    self._serve(cmd)
        except ConnectionResetError as e:  # a reset before any answer: as a close, above
            hint = plain_refusal_hint(self.tls) if frames == 0 else ""
            self._fail(ConnectionError(f"{self.addr} reset the connection{hint}: {e}"))
        except (OSError, FrameError, ConnectionError, ValueError) as e:
            self._fail(
                e if isinstance(e, ConnectionError) else ConnectionError(f"{self.addr}: {e}")
            )
        finally:
            f.close()

    def _serve(self, cmd: RemotingCommand) -> None:
        if self.on_request is not None:  # off the reader thread: the hook may send and wait itself
            _hook_pool().submit(self._run_hook, cmd)

    def _run_hook(self, cmd: RemotingCommand) -> None:
        hook = self.on_request
        assert hook is not None
        try:
            answer = hook(self, cmd)
        except Exception:  # a failing hook must not kill the connection (logged below)
            log.exception("handling request code %s from %s failed", cmd.code, self.addr)
            return
        if answer is not None and not cmd.flag & FLAG_ONEWAY:
            answer.opaque = cmd.opaque
            answer.flag |= FLAG_RESPONSE
            try:
                self._send(answer)
            except ConnectionError:
                pass

    def _fail(self, error: BaseException) -> None:
        with self._pending_lock:
            if self.closed is None:
                self.closed = error
            pending = list(self._pending.values())
        for fut in pending:
            if not fut.done():
                fut.set_exception(ConnectionError(str(self.closed)))
        try:
            self._sock.close()
        except OSError:
            pass

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._fail(ConnectionError(f"connection to {self.addr} closed by this client"))


class ConnectionPool:
    """Connections by address, ``size`` per address used round robin (one is enough for most
    work: requests are multiplexed), re-opened when one died."""

    def __init__(
        self,
        size: int = 1,
        connect_timeout_s: float = 3.0,
        on_request: ServerRequestHook | None = None,
        signer: RequestSigner | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.size = max(1, size)
        self.tls = tls
        self.connect_timeout_s = connect_timeout_s
        self.on_request = on_request
        self.signer = signer
        self._conns: dict[str, list[Connection | None]] = {}
        self._next: dict[str, int] = {}
        self._opening: dict[tuple[str, int], threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, addr: str) -> Connection:
        with self._lock:
            slots = self._conns.setdefault(addr, [None] * self.size)
            i = self._next.get(addr, 0)
            self._next[addr] = (i + 1) % self.size
            conn = slots[i]
            if conn is not None and conn.alive:
                return conn
            opening = self._opening.setdefault((addr, i), threading.Lock())
        with opening:  # one connect per slot; others wait for it
            with self._lock:
                conn = self._conns.get(addr, slots)[i]
                if conn is not None and conn.alive:
                    return conn
            conn = Connection(addr, self.connect_timeout_s, self.on_request, self.signer, self.tls)
            with self._lock:
                self._conns.setdefault(addr, slots)[i] = conn
        return conn

    def drop_dead(self, addr: str) -> None:
        """Forget the connections to ``addr`` that failed (the live ones stay in use)."""
        with self._lock:
            slots = self._conns.get(addr, [])
            for i, c in enumerate(slots):
                if c is not None and not c.alive:
                    slots[i] = None

    def drop(self, addr: str) -> None:
        with self._lock:
            slots = self._conns.pop(addr, [])
        for c in slots:
            if c is not None:
                c.close()

    def close(self) -> None:
        with self._lock:
            addrs = list(self._conns)
        for a in addrs:
            self.drop(a)
