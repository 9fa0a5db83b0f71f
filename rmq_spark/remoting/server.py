"""The remoting TCP server: one asyncio event loop on one thread serves every connection of the
broker's remoting port and of its NameServer (a connection costs a buffer, not a thread).

- A :class:`Processor` maps request codes to handlers.  A handler gets the :class:`Connection` and
  the request and returns the response, ``None`` (nothing to answer, or a oneway request), or an
  awaitable of either (long polling waits without a thread).  Handlers that may block (a send
  waiting for its fdatasync) are named in ``Processor.blocking`` and run on a small thread pool.
- Bad input never stops the loop: a frame over 16 MiB, an unknown serialize type or a header
  that does not parse closes that connection; an unknown code is answered
  ``REQUEST_CODE_NOT_SUPPORTED``; a missing or malformed header field ``SYSTEM_ERROR`` naming it;
  any other fault of a handler ``SYSTEM_ERROR`` (and is logged).
- A connection idle for ``idle_timeout_s`` (RocketMQ's ``serverChannelMaxIdleTimeSeconds``, 120 s)
  is closed.
- The broker can send requests to a client over its connection (CHECK_TRANSACTION_STATE,
  NOTIFY_CONSUMER_IDS_CHANGED): :meth:`Connection.send_oneway` from any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.remoting.command import FLAG_ONEWAY, FrameError, RemotingCommand, decode_frame, split_frame
from rmq_spark.remoting.headers import HeaderError

__all__ = ["Connection", "EventLoopThread", "Handler", "Processor", "RemotingServer", "bind"]

log = logging.getLogger("rmq_spark.remoting")

# a handler answers with a command, None (nothing to answer), or an awaitable of either
Handler = Callable[["Connection", RemotingCommand], Any]
IDLE_TIMEOUT_S = 120.0
# pause reading a connection whose answers are not being read (bytes queued for it)
WRITE_HIGH_WATER_BYTES = 8 << 20


class Processor:
    """Request code -> handler.  ``blocking`` codes run on the server's thread pool."""

    def __init__(self) -> None:
        self.handlers: dict[int, Handler] = {}
        self.blocking: set[int] = set()
        self.on_close: list[Callable[[Connection], None]] = []
        # checked before every handler (access control): None lets the request through, an
        # answer refuses it
        self.before: Callable[[Connection, RemotingCommand], RemotingCommand | None] | None = None
        # told of every answer (the metrics' rpc latency): (request code, response code, ms)
        self.observe: Callable[[int, int, float], None] | None = None

    def register(self, code: int, handler: Handler, *, blocking: bool = False) -> None:
        self.handlers[int(code)] = handler
        if blocking:
            self.blocking.add(int(code))


class Connection(asyncio.Protocol):
    """One client connection.  ``attrs`` holds what handlers remember about it (its client id)."""

    _ids = itertools.count(1)

    def __init__(self, server: RemotingServer) -> None:
        self.server = server
        self.loop = server.loop_thread.loop
        self.id = next(self._ids)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.attrs: dict[str, Any] = {}
        self._buf = bytearray()
        self._closed = False
        self._paused_writing = False
        self.last_active = time.monotonic()

    # --- asyncio.Protocol -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover - not a TCP socket
                pass
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)
        self.server.connections.add(self)
        if self.server.activity is not None:
            self.server.activity.begin()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.connections.discard(self)
        if self.server.activity is not None:
            self.server.activity.end()
        for cb in self.server.processor.on_close:
            try:
                cb(self)
            except Exception:
                log.exception("connection close hook failed")

    def pause_writing(self) -> None:
        self._paused_writing = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused_writing = False
        if self.transport is not None and not self._closed:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        buf = self._buf
        buf += data
        max_bytes = self.server.frame_max_bytes
        start = 0
        try:
            while True:
                n = split_frame(memoryview(buf)[start:], max_bytes)
                if n == 0:
                    break
                frame = bytes(buf[start + 4 : start + n])
                start += n
                self._on_frame(decode_frame(frame))
                if self._closed:
                    return
        except FrameError as e:
            log.warning("remoting connection %s sent a bad frame (%s): closing it", self.peer, e)
            self.close()
            return
        finally:
            if start:
                del buf[:start]

    # --- requests -------------------------------------------------------------------------------
    def _on_frame(self, cmd: RemotingCommand) -> None:
        if cmd.is_response:
            return  # answers to the broker's oneway requests: nothing waits for them
        server = self.server
        if server.processor.observe is not None:
            cmd.received_s = time.perf_counter()  # type: ignore[attr-defined]
        handler = server.processor.handlers.get(cmd.code)
        if handler is None:
            log.info("remoting request code %d from %s is not supported", cmd.code, self.peer)
            self.reply(cmd, cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                         f" request type {cmd.code} not supported"))  # fmt: skip
            return
        before = server.processor.before
        if before is not None:
            refused = before(self, cmd)
            if refused is not None:
                self.reply(cmd, refused)
                return
        if cmd.code in server.processor.blocking:
            fut = self.loop.run_in_executor(server.executor, self._call, handler, cmd)
            fut.add_done_callback(lambda f: self._answer(cmd, f))
            return
        result = self._call(handler, cmd)
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            task.add_done_callback(lambda t: self._answer(cmd, t))
        elif result is not None:
            self.reply(cmd, result)

    def _call(self, handler: Handler, cmd: RemotingCommand) -> Any:
        try:
            return handler(self, cmd)
        except HeaderError as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        except Exception as e:
            log.exception("remoting request %d from %s failed", cmd.code, self.peer)
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")

    def _answer(self, cmd: RemotingCommand, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            log.error("remoting request %d from %s failed", cmd.code, self.peer, exc_info=exc)
            result: Any = cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        else:
            result = fut.result()
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            task.add_done_callback(lambda t: self._answer(cmd, t))
        elif result is not None:
            self.reply(cmd, result)

    def reply(self, request: RemotingCommand, response: RemotingCommand) -> None:
        observe = self.server.processor.observe
        if observe is not None:
            began = getattr(request, "received_s", None)
            if began is not None:
                observe(request.code, response.code, (time.perf_counter() - began) * 1000)
        if request.flag & FLAG_ONEWAY:
            return
        self.write(response.encode())

    def write(self, data: bytes) -> None:
        if not self._closed and self.transport is not None:
            self.transport.write(data)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if not self._closed and self.transport is not None:
            self._closed = True
            self.transport.close()

    def send_oneway(self, cmd: RemotingCommand) -> bool:
        """Send a oneway request to the client, from any thread; False if the connection is gone."""
        if self._closed:
            return False
        cmd.flag |= FLAG_ONEWAY
        cmd.opaque = self.server.next_opaque()
        data = cmd.encode()
        if threading.get_ident() == self.server.loop_thread.thread_id:
            self.write(data)
        else:
            self.loop.call_soon_threadsafe(self.write, data)
        return True


class EventLoopThread:
    """An asyncio event loop running on its own daemon thread."""

    def __init__(self, name: str = "rmq-remoting") -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.thread_id = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        self.thread_id = threading.get_ident()
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` (a coroutine function or a plain one) on the loop and wait for it."""

        async def run() -> Any:
            result = fn(*args)
            return await result if inspect.isawaitable(result) else result

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result()

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


def bind(listen: str) -> socket.socket:
    """A listening TCP socket on ``HOST:PORT`` (port 0: a free port)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class RemotingServer:
    """Serves ``processor`` on the listening socket ``sock`` on the event loop of ``loop_thread``."""

    def __init__(self, sock: socket.socket, processor: Processor, loop_thread: EventLoopThread, *,
                 executor: concurrent.futures.Executor | None = None, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 frame_max_bytes: int | None = None, activity: Any = None) -> None:  # fmt: skip
        from rmq_spark.remoting.command import FRAME_MAX_BYTES

        self.sock = sock
        self.host, self.port = sock.getsockname()[:2]
        self.processor = processor
        self.loop_thread = loop_thread
        self.executor = executor or concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="rmq-remoting")
        self.idle_timeout_s = idle_timeout_s
        self.frame_max_bytes = frame_max_bytes or FRAME_MAX_BYTES
        self.connections: set[Connection] = set()
        # an object with begin() / end(): an open connection counts as a call in progress (the
        # broker's --idle-exit-s)
        self.activity = activity
        self._opaque = itertools.count(1)
        self._server: asyncio.base_events.Server | None = None
        self._reaper: asyncio.TimerHandle | None = None
        loop_thread.call(self._start)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def next_opaque(self) -> int:
        return next(self._opaque) & 0x7FFFFFFF

    async def _start(self) -> None:
        loop = self.loop_thread.loop
        self._server = await loop.create_server(lambda: Connection(self), sock=self.sock)
        self._schedule_reap()

    def _schedule_reap(self) -> None:
        loop = self.loop_thread.loop
        self._reaper = loop.call_later(min(self.idle_timeout_s, 10.0), self._reap)

    def _reap(self) -> None:
        now = time.monotonic()
        for conn in list(self.connections):
            if now - conn.last_active > self.idle_timeout_s:
                log.info("remoting connection %s idle for %.0fs: closing it", conn.peer, self.idle_timeout_s)
                conn.close()
        self._schedule_reap()

    def stop(self) -> None:
        async def close() -> None:
            if self._reaper is not None:
                self._reaper.cancel()
            if self._server is not None:
                self._server.close()
            for conn in list(self.connections):
                conn.close()

        if not self.loop_thread.loop.is_closed():
            self.loop_thread.call(close)
        self.executor.shutdown(wait=False)
