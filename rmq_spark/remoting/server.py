"""The remoting TCP server: one asyncio event loop on one thread serves every connection of the
broker's remoting port and of its NameServer (a connection costs a buffer, not a thread).

- A :class:`Processor` maps request codes to handlers.  A handler gets the :class:`Connection` and
  the request and returns the response, ``None`` (nothing to answer yet, or a oneway request), or
  an awaitable of either.  Handlers that may block (a send waiting for its fdatasync) are named in
  ``Processor.blocking`` and run on a small thread pool; :meth:`Connection.run_blocking` runs other
  slow work there (an SQL92 parse).
- Bad input never stops the loop: a frame over 16 MiB, an unknown serialize type or a header
  that does not decode (not JSON, nested too deeply, fields of the wrong type) closes that
  connection with one WARNING line; an unknown code is answered ``REQUEST_CODE_NOT_SUPPORTED``
  (counted in ``unsupported_requests``, logged at most once per 10 s); a missing or malformed
  header field ``SYSTEM_ERROR`` naming it; running out of descriptors ``SERVICE_NOT_AVAILABLE``;
  any other fault of a handler ``SYSTEM_ERROR`` with a generic text (the fault is logged, not sent).
- The limits of :mod:`rmq_spark.remoting.limits`: connections past the limit are closed as they
  are accepted (:mod:`rmq_spark.remoting.accept`); a connection with too much queued blocking
  work, or whose answers are not read, is not read until it drains; past the total, blocking
  requests are answered ``SYSTEM_BUSY``; one idle for ``idle_timeout_s`` (RocketMQ's
  ``serverChannelMaxIdleTimeSeconds``, 120 s) is closed.
- ``tls``: the port serves TLS (:mod:`rmq_spark.remoting.tls`), the handshake in the accepted
  connection's own task (a failed or stalled one closes that connection only).
- :meth:`Connection.send_oneway` sends the client requests from any thread (CHECK_TRANSACTION_STATE,
  NOTIFY_CONSUMER_IDS_CHANGED).  Stopping cancels the handlers' tasks still running.
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

from rmq_spark.remoting import limits as lim
from rmq_spark.remoting.accept import Acceptor
from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.remoting.command import (
    FLAG_ONEWAY,
    FrameError,
    RemotingCommand,
    decode_frame,
    split_frame,
)
from rmq_spark.remoting.faults import ServerBusy, failure_answer
from rmq_spark.remoting.loop import EventLoopThread, bind
from rmq_spark.remoting.processor import Handler, Processor
from rmq_spark.remoting.tls import ServerTls, connect_accepted
from rmq_spark.remoting.work import ConnectionWork, WorkQueue

__all__ = [
    "Connection",
    "EventLoopThread",
    "Handler",
    "Processor",
    "RemotingServer",
    "ServerBusy",
    "bind",
]

log = logging.getLogger("rmq_spark.remoting")

IDLE_TIMEOUT_S = 120.0
# pause reading a connection whose answers are not being read (bytes queued for it)
WRITE_HIGH_WATER_BYTES = 8 << 20
# requests of one connection served in one turn of the event loop
FRAMES_PER_TURN = 4


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
        self._admitted = False
        self._paused_writing = False
        self._reading_paused = False
        self._processing = False
        self._backlog = False  # whole frames left in the buffer for a later turn of the loop
        self._close_callbacks: list[Callable[[Connection], None]] = []
        # blocking requests queued or running for this connection (rmq_spark.remoting.work)
        self.work = ConnectionWork()
        self.last_active = time.monotonic()

    @property
    def admitted(self) -> bool:
        """Made and counted, until its connection is lost."""
        return self._admitted

    # --- asyncio.Protocol -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        sock = transport.get_extra_info("socket")
        # admitted (and counted) by the server's accept, before this protocol was made
        self._admitted = True
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
        if not self._admitted:
            return
        self._admitted = False
        self.server.connections.discard(self)
        self.server.release()
        WorkQueue.drop(self.work)
        if self.server.activity is not None:
            self.server.activity.end()
        for cb in [*self._close_callbacks, *self.server.processor.on_close]:
            try:
                cb(self)
            except Exception:
                log.exception("connection close hook failed")

    def pause_writing(self) -> None:
        self._paused_writing = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._paused_writing = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        self._buf += data
        self._process()

    # --- reading frames ---------------------------------------------------------------------------
    def _held(self) -> bool:
        """Whether this connection must not be read: its answers are not being read, or it has
        as much queued blocking work as one connection may."""
        server = self.server
        work = self.work
        return (self._paused_writing or work.inflight >= server.conn_inflight_max
                or work.inflight_bytes >= server.conn_inflight_max_bytes)  # fmt: skip

    def _update_reading(self) -> None:
        held = self._held() or self._backlog
        if held == self._reading_paused or self.transport is None or self._closed:
            return
        self._reading_paused = held
        if held:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()
            if self._buf:  # frames that arrived before the pause
                self.loop.call_soon(self._process)

    def _process(self) -> None:
        """Serve the whole frames in the buffer, stopping while the connection is held, and
        after FRAMES_PER_TURN of them (the rest after the loop's other work, this connection not
        read meanwhile): a client pipelining thousands of requests shares the loop."""
        if self._processing:
            return
        self._processing = True
        self._backlog = False
        buf = self._buf
        max_bytes = self.server.frame_max_bytes
        start = 0
        budget = FRAMES_PER_TURN
        try:
            while not self._closed and not self._held():
                n = split_frame(memoryview(buf)[start:], max_bytes)
                if n == 0:
                    break
                if budget == 0:
                    self._backlog = True
                    self.loop.call_soon(self._process)
                    break
                budget -= 1
                frame = bytes(buf[start + 4 : start + n])
                start += n
                try:
                    cmd = decode_frame(frame)
                except FrameError:
                    raise
                except Exception as e:  # noqa: BLE001 - RecursionError...: a header it cannot read
                    raise FrameError(f"the header does not decode ({type(e).__name__})") from None
                try:
                    self._on_frame(cmd, n)
                except Exception as e:  # noqa: BLE001 - a fault of the server itself: logged, connection closed
                    self.server.limited_log.log(("frame-fault", type(e).__name__), logging.ERROR,
                                                "remoting request %d from %s failed: closing the connection",
                                                cmd.code, self.peer, exc_info=e)  # fmt: skip
                    self.close()
        except FrameError as e:
            self.server.limited_log.log(
                "bad-frame",
                logging.WARNING,
                "remoting connection %s sent a bad frame (%s): closing it",
                self.peer,
                e,
            )
            self.close()
        finally:
            self._processing = False
            if start:
                del buf[:start]
        self._update_reading()

    # --- requests -------------------------------------------------------------------------------
    def _on_frame(self, cmd: RemotingCommand, frame_bytes: int) -> None:
        if cmd.is_response:
            return  # answers to the broker's oneway requests: nothing waits for them
        server = self.server
        if server.processor.observe is not None:
            cmd.received_s = time.perf_counter()  # type: ignore[attr-defined]
        handler = server.processor.handlers.get(cmd.code)
        if handler is None:
            server.unsupported_requests += 1
            server.limited_log.log("unsupported", logging.INFO,
                                   "remoting request code %d from %s is not supported (%d such requests so far)",
                                   cmd.code, self.peer, server.unsupported_requests)  # fmt: skip
            self.reply(cmd, cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                         f" request type {cmd.code} not supported"))  # fmt: skip
            return
        before = server.processor.before
        if before is not None:
            try:
                refused = before(self, cmd)
            except Exception as e:  # noqa: BLE001 - answered (and logged when a fault) by failure()
                refused = self.failure(cmd, e)
            if refused is not None:
                self.reply(cmd, refused)
                return
        if cmd.code in server.processor.blocking:
            self._run_blocking_handler(handler, cmd, frame_bytes)
            return
        result = self._call(handler, cmd)
        if inspect.isawaitable(result):
            self._await(cmd, result)
        elif result is not None:
            self.reply(cmd, result)

    def _run_blocking_handler(
        self, handler: Handler, cmd: RemotingCommand, frame_bytes: int
    ) -> None:
        try:
            fut = self._submit(frame_bytes, self._call_blocking, handler, cmd)
        except ServerBusy as e:
            self.reply(cmd, cmd.response(ResponseCode.SYSTEM_BUSY, str(e)))
            return
        fut.add_done_callback(lambda f: self._answer(cmd, f))

    def _submit(self, nbytes: int, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """``fn(*args)`` on the server's pool, counted as this connection's queued work."""
        fut = self.server.work_queue.submit(
            self.work, nbytes, fn, *args, on_done=self._update_reading
        )
        self._update_reading()
        return fut

    async def run_blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Await ``fn(*args)`` run on the server's pool (slow work kept off the event loop);
        raises :class:`ServerBusy` when the pool's queue is full."""
        return await self._submit(0, fn, *args)

    def _await(self, cmd: RemotingCommand, result: Any) -> None:
        fut = asyncio.ensure_future(result)
        if isinstance(fut, asyncio.Task):
            self.server.tasks.add(fut)
            fut.add_done_callback(self.server.tasks.discard)
        fut.add_done_callback(lambda t: self._answer(cmd, t))

    def _call_blocking(self, handler: Handler, cmd: RemotingCommand) -> Any:
        """(on the pool) ``Processor.before_blocking``, then the handler."""
        before = self.server.processor.before_blocking
        refused = None if before is None else self._call(before, cmd)
        return refused if refused is not None else self._call(handler, cmd)

    def _call(self, handler: Handler, cmd: RemotingCommand) -> Any:
        try:
            return handler(self, cmd)
        except Exception as e:  # noqa: BLE001 - answered (and logged when a fault) by failure()
            return self.failure(cmd, e)

    def failure(self, cmd: RemotingCommand, exc: BaseException) -> RemotingCommand:
        """The answer to a request whose handler raised ``exc`` (logged when it is a fault of the
        broker, never sent: the client gets a text that names the problem or a generic one)."""
        return self.server.failure_answer(self, cmd, exc)

    def _answer(self, cmd: RemotingCommand, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        result: Any = self.failure(cmd, exc) if exc is not None else fut.result()
        if inspect.isawaitable(result):
            self._await(cmd, result)
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
        try:
            data = response.encode()
        except FrameError as e:  # a header over 16 MiB
            log.error(
                "remoting answer to request %d from %s cannot be encoded: %s",
                request.code,
                self.peer,
                e,
            )
            data = response.__class__(ResponseCode.SYSTEM_ERROR, {}, b"", response.opaque, response.flag,
                                      "the answer does not fit a frame", response.version, response.language,
                                      response.serialize_type).encode()  # fmt: skip
        self.write(data)

    def write(self, data: bytes) -> None:
        if not self._closed and self.transport is not None:
            self.transport.write(data)

    @property
    def closed(self) -> bool:
        return self._closed

    def on_close(self, callback: Callable[[Connection], None]) -> None:
        """Call ``callback(self)`` on the loop when this connection closes (at once if it has)."""
        if self._closed and not self._admitted:
            callback(self)
            return
        self._close_callbacks.append(callback)

    def close(self) -> None:
        if not self._closed and self.transport is not None:
            self._closed = True
            self.transport.close()

    def send_oneway(self, cmd: RemotingCommand) -> bool:
        """Send a oneway request to the client, from any thread; False if the connection is gone."""
        return self.send_oneway_many([cmd])

    def send_oneway_many(self, cmds: list[RemotingCommand]) -> bool:
        """:meth:`send_oneway` of each of ``cmds``, encoded on the calling thread and written in
        one turn of the loop (a heartbeat naming 1,000 groups: one callback, not 1,000)."""
        if self._closed:
            return False
        for cmd in cmds:
            cmd.flag |= FLAG_ONEWAY
            cmd.opaque = self.server.next_opaque()
        data = b"".join([cmd.encode() for cmd in cmds])
        if threading.get_ident() == self.server.loop_thread.thread_id:
            self.write(data)
        else:
            self.loop.call_soon_threadsafe(self.write, data)
        return True


class RemotingServer:
    """Serves ``processor`` on the listening socket ``sock`` on the event loop of ``loop_thread``.

    The limits (:mod:`rmq_spark.remoting.limits`) are attributes, read at each use."""

    def __init__(self, sock: socket.socket, processor: Processor, loop_thread: EventLoopThread, *,
                 executor: concurrent.futures.Executor | None = None, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 frame_max_bytes: int | None = None, activity: Any = None,
                 max_connections: int = lim.MAX_CONNECTIONS, tls: ServerTls | None = None) -> None:  # fmt: skip
        from rmq_spark.remoting.command import FRAME_MAX_BYTES

        self.sock = sock
        self.host, self.port = sock.getsockname()[:2]
        self.processor = processor
        self.loop_thread = loop_thread
        self.executor = executor or concurrent.futures.ThreadPoolExecutor(
            8, thread_name_prefix="rmq-remoting"
        )
        self.idle_timeout_s = idle_timeout_s
        self.frame_max_bytes = frame_max_bytes or FRAME_MAX_BYTES
        self.max_connections = max_connections
        self.tls = tls  # TLS on this port (rmq_spark.remoting.tls: disabled/permissive/enforcing)
        self.conn_inflight_max = lim.CONN_INFLIGHT_MAX
        self.conn_inflight_max_bytes = lim.CONN_INFLIGHT_MAX_BYTES
        self.total_inflight_max = lim.TOTAL_INFLIGHT_MAX
        self.total_inflight_max_bytes = lim.TOTAL_INFLIGHT_MAX_BYTES
        self.connections: set[Connection] = set()
        self.tasks: set[asyncio.Task[Any]] = set()
        # blocking requests queued or running, and their frames' bytes (touched on the loop only)
        self.inflight = 0
        self.inflight_bytes = 0
        self.work_queue = WorkQueue(self)
        # counters: requests of unknown codes, blocking requests answered SYSTEM_BUSY, connections
        # closed at accept
        self.unsupported_requests = 0
        self.busy_answers = 0
        self.refused_connections = 0
        self.limited_log = lim.RateLimitedLog(log)
        # an object with begin() / end(): an open connection counts as a call in progress (the
        # broker's --idle-exit-s)
        self.activity = activity
        self._opaque = itertools.count(1)
        self._acceptor: Acceptor | None = None
        self._reaper: asyncio.TimerHandle | None = None
        loop_thread.call(self._start)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def next_opaque(self) -> int:
        return next(self._opaque) & 0x7FFFFFFF

    # --- connections ----------------------------------------------------------------------------
    def admit(self, fileno: int) -> str | None:
        """None when a new connection may stay (and it is counted), else why it may not."""
        return lim.PROCESS_CONNECTIONS.admit(len(self.connections), self.max_connections, fileno)

    def release(self) -> None:
        lim.PROCESS_CONNECTIONS.release()

    def failure_answer(
        self, conn: Connection, cmd: RemotingCommand, exc: BaseException
    ) -> RemotingCommand:
        """The answer to a request that raised ``exc`` (any thread)."""
        return failure_answer(self.limited_log, conn.peer, cmd, exc)

    # --- lifecycle --------------------------------------------------------------------------------
    async def _start(self) -> None:
        self._acceptor = Acceptor(self.sock, self.loop_thread.loop, self.admit, self._admitted,
                                  self._refused, self.limited_log)  # fmt: skip
        self._acceptor.start()
        self._schedule_reap()

    def _refused(self, _peer: str, _why: str) -> None:  # the acceptor logged it
        self.refused_connections += 1

    def _admitted(self, csock: socket.socket) -> None:
        task = self.loop_thread.loop.create_task(self._connect(csock))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _connect(self, csock: socket.socket) -> None:
        """Make the admitted connection on ``csock`` a transport with its :class:`Connection`."""
        made: list[Connection] = []

        def factory() -> Connection:
            conn = Connection(self)
            made.append(conn)
            return conn

        try:  # TLS: the handshake runs here, in this connection's task (a stalled one times out)
            await connect_accepted(
                self.loop_thread.loop, factory, csock, self.tls, self.idle_timeout_s
            )
        except BaseException as exc:
            if not made or not made[0].admitted:  # never counted by connection_lost
                self.release()
            csock.close()
            if isinstance(exc, asyncio.CancelledError):
                raise
            self.limited_log.log("connect", logging.WARNING,
                                 "remoting connection on %s failed as it was made: %s",
                                 self.endpoint, exc)  # fmt: skip

    def _schedule_reap(self) -> None:
        loop = self.loop_thread.loop
        self._reaper = loop.call_later(min(self.idle_timeout_s, 10.0), self._reap)

    def _reap(self) -> None:
        now = time.monotonic()
        for conn in list(self.connections):
            if now - conn.last_active > self.idle_timeout_s:
                log.info(
                    "remoting connection %s idle for %.0fs: closing it",
                    conn.peer,
                    self.idle_timeout_s,
                )
                conn.close()
        self._schedule_reap()

    def stop(self) -> None:
        async def close() -> None:
            if self._reaper is not None:
                self._reaper.cancel()
            if self._acceptor is not None:
                self._acceptor.stop()
            else:
                self.sock.close()
            for conn in list(self.connections):
                conn.close()
                if self.tls is not None and conn.transport is not None:
                    conn.transport.abort()  # no close_notify exchange on the way out
            await asyncio.sleep(0)  # the transports' closing callbacks run
            tasks = list(self.tasks)
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=5)

        if not self.loop_thread.loop.is_closed():
            self.loop_thread.call(close)
        self.executor.shutdown(wait=False)
