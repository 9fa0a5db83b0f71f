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
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from typing import Any

import grpc
from rocketmq.grpc_protocol.service_pb2_grpc import add_MessagingServiceServicer_to_server

from rmq_spark.broker.access import AccessInterceptor
from rmq_spark.broker.auth import AccessControl
from rmq_spark.broker.options import BrokerOptions, split_listen
from rmq_spark.broker.handler import Activity
from rmq_spark.broker.service import MessagingService
from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.core import BrokerCore
from rmq_spark.errors import RmqError
from rmq_spark.store.clock import SYSTEM_CLOCK, Clock

__all__ = ["Broker", "ListenError"]

log = logging.getLogger("rmq_spark.broker")

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


class _Counted(grpc.GenericRpcHandler):
    """Another service mounted on the broker, its calls counted as activity."""

    def __init__(self, inner: grpc.GenericRpcHandler, activity: Activity) -> None:
        self.inner = inner
        self.activity = activity

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        return self.activity.wrap(self.inner.service(handler_call_details))


def _internal_handler(core: BrokerCore) -> grpc.GenericRpcHandler | None:
    try:
        from rmq_spark.broker.connector.server import make_internal_handler
    except ModuleNotFoundError as e:
        if e.name in ("rmq_spark.broker.connector", "rmq_spark.broker.connector.server"):
            return None
        raise
    return make_internal_handler(core)


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
        sockets = self._bind_remoting(config)
        try:
            self.core = BrokerCore(path, config, clock)
        except BaseException:
            if sockets is not None:
                sockets.close()
            raise
        self._stopped = False
        self._stop_lock = threading.Lock()
        try:
            acl = None
            if self.options.acl_path:
                acl = AccessControl.load(self.options.acl_path, clock, self.options.acl_window_ms)
            self.service = MessagingService(self.core, self.options, (host, port))
            self.activity = self.service.activity
            internal = self.internal_handler = _internal_handler(self.core)
            services = [self.service.access()]
            if internal is not None:
                services.append(internal.connector.access())
            self.access = AccessInterceptor(acl, services)  # every call on the port passes it
            self._server = grpc.server(
                futures.ThreadPoolExecutor(max_workers=self.options.workers, thread_name_prefix="rmq-grpc"),
                options=SERVER_OPTIONS,
                interceptors=(self.access,),
            )
            add_MessagingServiceServicer_to_server(self.service, self._server)
            if internal is not None:
                self._server.add_generic_rpc_handlers((_Counted(internal, self.activity),))
            try:
                bound = self._server.add_insecure_port(self.options.listen)
            except RuntimeError as e:
                raise ListenError(f"cannot listen on {self.options.listen}: {e}") from None
            if bound == 0:
                raise ListenError(f"cannot listen on {self.options.listen}")
            self.host, self.port = host, bound
            self.service.set_endpoint(host, bound)
            self.service.start()
            self._server.start()
            if sockets is not None:
                from rmq_spark.broker.remoting import RemotingService

                self.remoting = RemotingService(self.core, sockets, broker_name=config.broker_name,
                                                cluster=self.options.cluster_name,
                                                namesrv_addrs=list(self.options.namesrv_addrs),
                                                activity=self.activity, access_control=acl)  # fmt: skip
        except BaseException:
            if self.remoting is not None:
                self.remoting.stop()
            elif sockets is not None:
                sockets.close()
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
            raise ListenError(f"cannot listen on {opts.remoting_listen} / {opts.namesrv_listen}: {e}") from None
        config.store.store_port = sockets.broker_port
        return sockets

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
        if self.remoting is not None:
            self.remoting.stop()
        self._server.stop(grace_s).wait(grace_s + 5)
        try:
            self.service.shutdown()
        finally:
            self.core.shutdown()

    close = stop

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Broker({self.core.store.root!r}, endpoints={self.endpoints!r})"
