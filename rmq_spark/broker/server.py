"""The broker: a store directory, its services, and a gRPC server speaking RocketMQ 5's protocol.

    with Broker("/tmp/store", listen="127.0.0.1:0") as broker:
        producer = Producer(ClientConfiguration(broker.endpoints), ...)

``Broker`` opens the store (one process per directory: a second broker on it fails with
:class:`rmq_spark.errors.StoreLockedError`), starts the services and serves on ``listen``
(``127.0.0.1`` unless told otherwise; port 0 picks a free port, ``.endpoints`` says which).  It
also mounts the Spark connector's private service (``rmq_spark.broker.connector``) when installed.
Every call on the port, to either service, passes the one access seam
(:class:`rmq_spark.broker.access.AccessInterceptor`): ``--acl`` applies to both alike.
:meth:`stop` ends streams, stops the server, flushes and marks the store cleanly shut down.

How calls are served (issue 17 item 12: a broker serves thousands of connected clients, each with
a Telemetry stream open and long polls parked): the server is ``grpc.aio``'s, on an event loop in
a thread of its own.  What may wait for long is served on that loop and holds no thread: the
Telemetry streams (:func:`rmq_spark.broker.telemetry.serve_telemetry`), and ReceiveMessage and
PullMessage, whose long polls park by topic (:mod:`rmq_spark.broker.wakeups`) until a write to
their topics, the broker's stop or their time is up.  What blocks, the store work, runs on a
bounded pool of worker threads (``--workers``): the other methods are the same threaded handlers
as before (grpc.aio runs them on the pool), and the loop's handlers hand their store calls to it
(:meth:`MessagingService.run`).  A worker is held only while it works, never while a call waits.
Handlers that only touch memory, and sends under asynchronous flush, run on the loop itself
(:data:`ON_THE_LOOP`): handing them to a worker and back would cost more than they do.  The loop
is uvloop's when it is installed (a dependency on Linux and macOS): grpc.aio's machinery per call
then costs what the threaded server's did.  Every handler is reached through the server's one
generic handler, which passes it through the access seam (:class:`_Mounted`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
import time
from collections.abc import Coroutine
from concurrent import futures
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import grpc.aio
from rocketmq.grpc_protocol.service_pb2_grpc import add_MessagingServiceServicer_to_server

from rmq_spark.access.auth import AccessControl
from rmq_spark.broker.access import AccessInterceptor
from rmq_spark.broker.handler import Activity
from rmq_spark.broker.options import BrokerOptions, split_listen
from rmq_spark.broker.service import MessagingService
from rmq_spark.errors import RmqError
from rmq_spark.remoting.tls import add_grpc_port
from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.core import BrokerCore
from rmq_spark.services.traffic import Traffic
from rmq_spark.store.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Broker", "ListenError"]

log = logging.getLogger("rmq_spark.broker")

T = TypeVar("T")


class ListenError(RmqError):
    """The broker cannot serve on the address it was given (taken, or not an address of this
    host)."""


SERVER_OPTIONS = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5000),
)


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when it is installed (each call costs less of it), asyncio's otherwise;
    RMQ_BROKER_LOOP=asyncio asks for asyncio's."""
    if os.environ.get("RMQ_BROKER_LOOP", "") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class _LoopThread:
    """The event loop the gRPC server runs on, in a thread of its own (the broker is used from
    plain threads: tests, ``__main__``)."""

    def __init__(self) -> None:
        self.loop = _new_loop()
        self._thread = threading.Thread(target=self._run, name="rmq-grpc-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            # closed by its own thread once it stops, even when close() gave up waiting for it
            if not self.loop.is_closed():
                self.loop.close()

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = 60.0) -> T:
        """Run ``coro`` on the loop and wait for its result."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout_s)
        except futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"the server's event loop did not answer in {timeout_s}s") from None

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


_UNDECODABLE = object()  # what a request that does not parse becomes
_UNDECODABLE_DETAILS = "Exception deserializing request!"  # grpc's threaded server's words


def _lenient(deserializer: Any) -> Any:
    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw) if deserializer is not None else raw
        except Exception:  # noqa: BLE001 - an undecodable request is answered by its handler
            return _UNDECODABLE

    return deserialize


def _undecodable_checked(handler: Any) -> Any:
    """``handler`` answering a request that does not parse INTERNAL, as grpc's threaded server
    does (``grpc.aio`` would answer UNKNOWN and log the parser's traceback); like there, neither the
    access check nor the handler runs for it.  A request stream ends with that status at its bad
    message."""
    kind = next(
        k
        for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
        if getattr(handler, k) is not None
    )
    inner = getattr(handler, kind)
    wrap = _checked_stream_request if handler.request_streaming else _checked_request
    return handler._replace(
        request_deserializer=_lenient(handler.request_deserializer), **{kind: wrap(inner)}
    )


def _checked_request(inner: Any) -> Any:
    if inspect.isasyncgenfunction(inner):

        async def agen(request: Any, context: Any) -> Any:
            if request is _UNDECODABLE:
                await context.abort(grpc.StatusCode.INTERNAL, _UNDECODABLE_DETAILS)
            async for response in inner(request, context):
                yield response

        return agen
    if inspect.iscoroutinefunction(inner):

        async def coro(request: Any, context: Any) -> Any:
            if request is _UNDECODABLE:
                await context.abort(grpc.StatusCode.INTERNAL, _UNDECODABLE_DETAILS)
            return await inner(request, context)

        return coro

    def threaded(
        request: Any, context: Any
    ) -> Any:  # on a worker thread: abort has sent the status on return
        if request is _UNDECODABLE:
            context.abort(grpc.StatusCode.INTERNAL, _UNDECODABLE_DETAILS)
            return iter(()) if inspect.isgeneratorfunction(inner) else None
        return inner(request, context)

    return threaded


def _checked_stream_request(inner: Any) -> Any:
    async def checked(requests: Any, context: Any) -> Any:
        async for request in requests:
            if request is _UNDECODABLE:
                await context.abort(grpc.StatusCode.INTERNAL, _UNDECODABLE_DETAILS)
            yield request

    if inspect.isasyncgenfunction(inner):

        async def agen(requests: Any, context: Any) -> Any:
            async for response in inner(checked(requests, context), context):
                yield response

        return agen
    if inspect.iscoroutinefunction(inner):

        async def coro(requests: Any, context: Any) -> Any:
            return await inner(checked(requests, context), context)

        return coro
    return inner  # a threaded handler of a request stream: none is mounted on the broker


# what runs on the event loop itself: handlers that touch memory only, never a file or a lock held
# across I/O (a hop to a worker thread and back costs more than they do); with asynchronous flush
# a send too (a store write never waits for the disk then).  The rest run on the worker threads.
ON_THE_LOOP = (
    "Heartbeat",
    "AckMessage",
    "ChangeInvisibleDuration",
    "NotifyClientTermination",
    "QueryAssignment",
    "GetOffset",
    "SyncLiteSubscription",
)


class _LoopServed:
    """The MessagingService as mounted: ``methods`` served on the event loop (the same handlers,
    called there), every other attribute the service's own."""

    def __init__(self, service: MessagingService, methods: tuple[str, ...]) -> None:
        self._service = service
        for name in methods:
            setattr(self, name, _on_the_loop(getattr(service, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)


def _on_the_loop(fn: Any) -> Any:
    async def served(request: Any, context: Any) -> Any:
        return fn(request, context)

    return served


class _Mounted(grpc.GenericRpcHandler):
    """Every method the server serves: found in ``handlers`` (the services' generic handlers),
    passed through the access seam and the undecodable-request check, made once per method.  The
    one generic handler of the server, so no handler is served unguarded; a method no service has
    stays UNIMPLEMENTED."""

    def __init__(self, access: AccessInterceptor) -> None:
        self.access = access
        self.handlers: list[grpc.GenericRpcHandler] = []
        self._served: dict[str, Any] = {}

    def add_generic_rpc_handlers(
        self, handlers: Any
    ) -> None:  # what the generated add_..._to_server calls
        self.handlers.extend(handlers)

    def service(self, details: grpc.HandlerCallDetails) -> Any:
        served = self._served.get(details.method)
        if served is None:
            for h in self.handlers:
                found = h.service(details)
                if found is not None:
                    break
            else:
                return None
            served = _undecodable_checked(self.access.guard(found, details))
            self._served[details.method] = served
        return served


class _Counted(grpc.GenericRpcHandler):
    """Another service mounted on the broker, its calls counted as activity."""

    def __init__(self, inner: grpc.GenericRpcHandler, activity: Activity) -> None:
        self.inner = inner
        self.activity = activity

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        return self.activity.wrap(self.inner.service(handler_call_details))


def _read_workers(n: int) -> int:
    if n >= 0:
        return n
    from rmq_spark.broker.connector.readers import default_workers

    return default_workers()


def _internal_handler(core: BrokerCore, read_workers: int) -> Any:
    try:
        from rmq_spark.broker.connector.server import make_internal_handler
    except ModuleNotFoundError as e:
        if e.name in ("rmq_spark.broker.connector", "rmq_spark.broker.connector.server"):
            return None
        raise
    return make_internal_handler(core, read_workers)


class Broker:
    """A running broker (see the module docstring).  ``config`` holds the store and services'
    settings, ``options`` the gRPC side's; ``listen`` overrides ``options.listen``."""

    def __init__(
        self,
        path: str,
        listen: str | None = None,
        config: BrokerConfig | None = None,
        options: BrokerOptions | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.options = options or BrokerOptions()
        if listen is not None:
            self.options.listen = listen
        host, port = split_listen(self.options.listen)
        config = config or BrokerConfig()
        self.remoting: Any = None
        self.metrics: Any = None
        sockets = self._bind_remoting(config)
        try:
            self.core = BrokerCore(path, config, clock)
        except BaseException:
            if sockets is not None:
                sockets.close()
            raise
        if self.options.metrics_listen:
            self.core.traffic = (
                Traffic()
            )  # counted from the first call on (rmq_spark.broker.metrics)
        self._stopped = False
        self._stop_lock = threading.Lock()
        try:
            acl = None
            if self.options.acl_path:
                acl = AccessControl.load(self.options.acl_path, clock, self.options.acl_window_ms)
            self.service = MessagingService(self.core, self.options, (host, port))
            self.activity = self.service.activity
            internal = self.internal_handler = _internal_handler(
                self.core, _read_workers(self.options.read_workers)
            )
            services = [self.service.access()]
            if internal is not None:
                services.append(internal.connector.access())
            self.access = AccessInterceptor(acl, services)  # every call on the port passes it
            # store work runs on these threads; streams and long polls wait on the event loop
            self._executor = futures.ThreadPoolExecutor(
                max_workers=self.options.workers, thread_name_prefix="rmq-grpc"
            )
            self.service.executor = self._executor
            self._loop = _LoopThread()
            self._server, bound = self._loop.call(self._serve(internal))
            self.host, self.port = host, bound
            self.service.set_endpoint(host, bound)
            self.service.start()
            self._loop.call(self._server.start())
            if sockets is not None:
                from rmq_spark.broker.remoting import RemotingService

                self.remoting = RemotingService(self.core, sockets, broker_name=config.broker_name,
                                                cluster=self.options.cluster_name,
                                                namesrv_addrs=list(self.options.namesrv_addrs),
                                                activity=self.activity, access_control=acl,
                                                namesrv_accept_brokers=self.options.namesrv_accept_brokers,
                                                namesrv_credentials=self.options.namesrv_credentials, tls=self.options.tls)  # fmt: skip
                self.remoting.admin.on_reset = (
                    self.service.pop.reset
                )  # its pop state forgets the queue
                self.remoting.admin.on_delete = self.service.pop.forget_topic
            if self.options.metrics_listen:
                from rmq_spark.broker.metrics import start_metrics

                try:
                    self.metrics = start_metrics(self)
                except OSError as e:
                    raise ListenError(
                        f"cannot serve metrics on {self.options.metrics_listen}: {e}"
                    ) from None
        except BaseException:
            if self.remoting is not None:
                self.remoting.stop()
            elif sockets is not None:
                sockets.close()
            server = getattr(self, "_server", None)
            if server is not None:  # bound, maybe started: let the port go
                try:
                    self._loop.call(server.stop(None), timeout_s=5)
                except Exception:
                    log.exception("the gRPC server did not stop")
            self._close_loop()
            self.core.shutdown()
            raise

    def _bind_remoting(self, config: BrokerConfig) -> Any:
        """The remoting and NameServer sockets, bound before the store opens: the remoting port
        is the store port of every record written (offsetMsgIds name it)."""
        opts = self.options
        if not opts.remoting_listen:
            return None
        from rmq_spark.broker.remoting import RemotingSockets

        try:
            sockets = RemotingSockets.bind(opts.remoting_listen, opts.namesrv_listen)
        except OSError as e:
            raise ListenError(
                f"cannot listen on {opts.remoting_listen} / {opts.namesrv_listen}: {e}"
            ) from None
        config.store.store_port = sockets.broker_port
        return sockets

    async def _serve(self, internal: grpc.GenericRpcHandler | None) -> tuple[grpc.aio.Server, int]:
        """The server, made on the loop it runs on, bound to ``listen`` (not started)."""
        server = grpc.aio.server(migration_thread_pool=self._executor, options=SERVER_OPTIONS)
        mounted = _Mounted(self.access)  # every call passes the access seam (see _Mounted)
        on_the_loop = ON_THE_LOOP + (
            ("SendMessage",) if self.core.store.config.flush == "async" else ()
        )
        # duck-typed, both: _LoopServed serves the servicer's methods, _Mounted collects handlers
        add_MessagingServiceServicer_to_server(_LoopServed(self.service, on_the_loop), mounted)  # type: ignore[arg-type]
        if internal is not None:
            mounted.add_generic_rpc_handlers((_Counted(internal, self.activity),))
        server.add_generic_rpc_handlers((mounted,))
        try:
            bound = add_grpc_port(server, self.options.listen, self.options.tls)
        except RuntimeError as e:
            raise ListenError(f"cannot listen on {self.options.listen}: {e}") from None
        if bound == 0:
            raise ListenError(f"cannot listen on {self.options.listen}")
        return server, bound

    def _close_loop(self, wait_s: float = 10.0) -> None:
        """Stop the event loop, and the worker threads once the work they are doing is done (the
        store is flushed and closed after this), waiting ``wait_s`` at most."""
        loop = getattr(self, "_loop", None)
        if loop is not None:
            loop.close()
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
            deadline = time.monotonic() + wait_s
            for t in list(getattr(executor, "_threads", ())):
                t.join(max(0.0, deadline - time.monotonic()))

    @property
    def endpoints(self) -> str:
        """``host:port`` for ``ClientConfiguration``."""
        return f"{self.host}:{self.port}"

    @property
    def remoting_endpoint(self) -> str | None:
        """``host:port`` of the remoting protocol (None when it is off)."""
        return self.remoting.remoting_endpoint if self.remoting is not None else None

    @property
    def namesrv_endpoint(self) -> str | None:
        """``host:port`` of this broker's NameServer (None when it runs none)."""
        return self.remoting.namesrv_endpoint if self.remoting is not None else None

    def ready_line(self) -> str:
        """``rmq-broker listening on HOST:PORT store=DIR`` and, when they run,
        `` remoting=HOST:PORT namesrv=HOST:PORT``."""
        line = f"rmq-broker listening on {self.endpoints} store={self.core.store.root}"
        if self.remoting_endpoint:
            line += f" remoting={self.remoting_endpoint}"
        if self.namesrv_endpoint:
            line += f" namesrv={self.namesrv_endpoint}"
        if self.metrics is not None:
            line += f" metrics={self.metrics.endpoint}"
        line += f" tls={self.options.tls.mode.value}" if self.options.tls is not None else ""
        return line

    @property
    def store(self) -> Any:
        return self.core.store

    def idle_s(self) -> float:
        """Seconds since the last call ended (0 while a call or stream is open)."""
        return self.activity.idle_s()

    def stop(self, grace_s: float = 2.0) -> None:
        """Stop accepting calls, end streams, flush, and mark the store cleanly shut down."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        self.service.close()
        if self.metrics is not None:
            self.metrics.stop()
        if self.remoting is not None:
            self.remoting.stop()
        try:
            self._loop.call(self._server.stop(grace_s), timeout_s=grace_s + 5)
        except TimeoutError:
            log.warning("the gRPC server did not stop in %.1fs", grace_s + 5)
        finally:
            self._close_loop()
        try:
            if self.internal_handler is not None:
                self.internal_handler.connector.close()  # the sink's queued group commits
            self.service.shutdown()
        finally:
            self.core.shutdown()

    close = stop

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Broker({self.core.store.root!r}, endpoints={self.endpoints!r})"
