"""RemotingService: the broker's remoting server (:mod:`rmq_spark.remoting`) and NameServer
(:mod:`rmq_spark.namesrv`), beside its gRPC server, over the same
:class:`~rmq_spark.services.core.BrokerCore` (one store, two protocols).

    sockets = RemotingSockets.bind("127.0.0.1:10911", "127.0.0.1:9876")   # before the store opens:
    config.store.store_port = sockets.broker_port                         # offsetMsgIds name it
    service = RemotingService(core, sockets, broker_name=..., namesrv_addrs=[...])
    ...
    service.stop()

- One event loop thread serves both ports; sends run on it (or on a small pool with sync flush).
- The NameServer answers for this broker (its live topic table) and for brokers that register.
- With ``namesrv_addrs`` the broker registers itself (REGISTER_BROKER, every 30 s, and
  UNREGISTER_BROKER when it stops) with NameServers it does not run, signed with
  ``namesrv_credentials`` when given (as Apache RocketMQ's broker signs with its
  ``innerClientAuthenticationCredentials``): a NameServer with ``--acl`` needs an admin's.
- Every 10 s clients silent for 120 s are dropped, and their groups told to rebalance.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any

from rmq_spark.cluster.acl import Credentials
from rmq_spark.errors import MessageIllegalError
from rmq_spark.namesrv.processor import namesrv_processor
from rmq_spark.namesrv.routes import LocalBroker, QueueData, RouteInfoManager
from rmq_spark.remoting import jsonbody
from rmq_spark.remoting.admin import BROKER_VERSION, AdminProcessor
from rmq_spark.remoting.clients import ClientManager
from rmq_spark.remoting.codes import RequestCode as R
from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.consumer import ConsumerProcessor
from rmq_spark.remoting.lookup import LookupProcessor
from rmq_spark.remoting.pull import PullProcessor
from rmq_spark.remoting.requests import BROKER_REQUESTS, RequestGate
from rmq_spark.remoting.send import SendProcessor
from rmq_spark.remoting.server import EventLoopThread, Processor, RemotingServer, bind
from rmq_spark.remoting.tls import ServerTls
from rmq_spark.remoting.transaction import (
    CompositeChecker,
    RemotingTransactionChecker,
    end_transaction_handler,
)
from rmq_spark.store.validation import check_topic_cached

__all__ = ["DEFAULT_CLUSTER", "RemotingService", "RemotingSockets"]

log = logging.getLogger("rmq_spark.remoting")

DEFAULT_CLUSTER = "DefaultCluster"
REGISTER_INTERVAL_S = 30.0  # registerNameServerPeriod
HOUSEKEEPING_INTERVAL_S = 10.0


@dataclass
class RemotingSockets:
    """The listening sockets, bound before the store opens (the remoting port is part of every
    stored record's store host)."""

    broker: socket.socket
    namesrv: socket.socket | None

    @classmethod
    def bind(cls, remoting_listen: str, namesrv_listen: str | None) -> RemotingSockets:
        broker = bind(remoting_listen)
        try:
            namesrv = bind(namesrv_listen) if namesrv_listen else None
        except BaseException:
            broker.close()
            raise
        return cls(broker, namesrv)

    @property
    def broker_port(self) -> int:
        return int(self.broker.getsockname()[1])

    def close(self) -> None:
        self.broker.close()
        if self.namesrv is not None:
            self.namesrv.close()


def advertised(host: str, port: int) -> str:
    """The address clients are told: a wildcard bind is announced as the host's address."""
    if host in ("", "0.0.0.0", "::"):
        try:
            host = socket.gethostbyname(socket.gethostname())
        except OSError:
            host = "127.0.0.1"
    return f"{host}:{port}"


class RemotingService:
    def __init__(self, core: Any, sockets: RemotingSockets, *, broker_name: str, cluster: str = DEFAULT_CLUSTER,
                 namesrv_addrs: list[str] | None = None, activity: Any = None,
                 access_control: Any = None, namesrv_accept_brokers: bool = True,
                 namesrv_credentials: Credentials | None = None, tls: ServerTls | None = None) -> None:  # fmt: skip
        self.core = core
        self.store = core.store
        self.broker_name = broker_name
        self.cluster = cluster
        self.loop_thread = EventLoopThread()
        self.clients = ClientManager()
        self._stopped = threading.Event()
        self.broker_server: RemotingServer | None = None
        self.namesrv_server: RemotingServer | None = None
        try:
            host, port = sockets.broker.getsockname()[:2]
            self.broker_addr = advertised(host, port)
            self.pull = PullProcessor(self.store, self.clients, self.loop_thread)
            processor = self._broker_processor()
            # every request passes the one table of request codes: decoded once, names validated,
            # authorized (with --acl) on what will be executed
            gate = RequestGate(BROKER_REQUESTS, access_control, self.store.config.body_max_bytes)
            gate.check_covers(processor.handlers)
            processor.before = gate
            # the bodies of codes run on the pool are parsed there (gate.finish), not on the loop
            parsed = {c for c in processor.blocking if BROKER_REQUESTS[c].body is not None}
            gate.deferred = frozenset(parsed)
            processor.before_blocking = gate.finish
            self.broker_server = RemotingServer(sockets.broker, processor, self.loop_thread,
                                                activity=activity, tls=tls)  # fmt: skip
            self.routes = RouteInfoManager(LocalBroker(cluster, broker_name, self.broker_addr, self._local_topics,
                                                       self._route_for_new, self._local_topic))  # fmt: skip
            if sockets.namesrv is not None:
                # the request table's gate; --acl: its writes (REGISTER_BROKER, ...) need an admin
                ns_processor = namesrv_processor(self.routes, access_control=access_control,
                                                 accept_brokers=namesrv_accept_brokers)  # fmt: skip
                self.namesrv_server = RemotingServer(sockets.namesrv, ns_processor, self.loop_thread,
                                                     activity=activity, tls=tls)  # fmt: skip
            if core.transactions is not None:
                remoting = RemotingTransactionChecker(self.clients, self.store.config.store_port)
                core.transactions.set_checker(CompositeChecker(remoting, core.transactions.checker))
        except BaseException:
            self.stop()
            raise
        self.loop_thread.loop.call_soon_threadsafe(self._schedule_housekeeping)
        self.namesrv_addrs = [a for a in (namesrv_addrs or []) if a]
        self.namesrv_credentials = namesrv_credentials
        self._refused: dict[str, tuple[int, str]] = {}  # NameServer -> its last refusal, logged
        self._registrar: threading.Thread | None = None
        self._register_lock = threading.Lock()
        self._ns_clients: dict[str, Any] = {}
        if self.namesrv_addrs:
            self._registrar = threading.Thread(
                target=self._register_loop, name="rmq-namesrv-register", daemon=True
            )
            self._registrar.start()

    # --- endpoints ------------------------------------------------------------------------------
    @property
    def remoting_endpoint(self) -> str:
        assert self.broker_server is not None
        return self.broker_server.endpoint

    @property
    def namesrv_endpoint(self) -> str | None:
        return self.namesrv_server.endpoint if self.namesrv_server is not None else None

    # --- the broker's request table -------------------------------------------------------------
    def _broker_processor(self) -> Processor:
        core, store = self.core, self.store
        send = SendProcessor(core, self.broker_name, self.cluster)
        consumer = ConsumerProcessor(store, self.clients)
        lookup = LookupProcessor(store)
        admin = self.admin = AdminProcessor(
            core, self.clients, self.broker_name, int(time.time() * 1000)
        )
        blocking_send = store.config.flush == "sync"
        p = Processor()
        for code in (R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE):
            p.register(code, send.send, blocking=blocking_send)
        p.register(R.CONSUMER_SEND_MSG_BACK, send.send_back, blocking=blocking_send)
        p.register(R.END_TRANSACTION, end_transaction_handler(core), blocking=blocking_send)
        # a heartbeat may create its groups' retry topics (one durable write): off the loop
        p.register(R.HEART_BEAT, consumer.heartbeat, blocking=True)
        p.register(R.UNREGISTER_CLIENT, consumer.unregister)
        p.register(
            R.CHECK_CLIENT_CONFIG, consumer.check_client_config, blocking=True
        )  # parses SQL92
        p.register(R.GET_CONSUMER_LIST_BY_GROUP, consumer.consumer_list)
        p.register(R.QUERY_CONSUMER_OFFSET, consumer.query_offset)
        p.register(R.UPDATE_CONSUMER_OFFSET, consumer.update_offset)
        p.register(R.LOCK_BATCH_MQ, consumer.lock)
        p.register(R.UNLOCK_BATCH_MQ, consumer.unlock)
        p.register(R.PULL_MESSAGE, self.pull.pull)
        p.register(R.LITE_PULL_MESSAGE, self.pull.pull)
        p.register(R.GET_MAX_OFFSET, lookup.max_offset)
        p.register(R.GET_MIN_OFFSET, lookup.min_offset)
        p.register(R.SEARCH_OFFSET_BY_TIMESTAMP, lookup.search_offset)
        p.register(R.GET_EARLIEST_MSG_STORETIME, lookup.earliest_store_time)
        p.register(R.VIEW_MESSAGE_BY_ID, lookup.view_by_id, blocking=True)
        p.register(R.QUERY_MESSAGE, lookup.query_message, blocking=True)
        p.register(R.UPDATE_AND_CREATE_TOPIC, admin.update_topic)
        p.register(R.GET_ALL_TOPIC_CONFIG, admin.all_topic_config)
        p.register(R.DELETE_TOPIC_IN_BROKER, admin.delete_topic)
        p.register(R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, admin.all_subscription_groups)
        p.register(R.INVOKE_BROKER_TO_RESET_OFFSET, admin.reset_offset, blocking=True)
        p.register(R.GET_BROKER_RUNTIME_INFO, admin.runtime_info)
        p.register(R.GET_TOPIC_STATS_INFO, admin.topic_stats)
        p.register(R.GET_TOPIC_CONFIG, admin.topic_config)
        p.register(R.GET_CONSUME_STATS, admin.consume_stats)
        p.register(R.GET_CONSUMER_CONNECTION_LIST, admin.consumer_connections)
        p.register(R.GET_PRODUCER_CONNECTION_LIST, admin.producer_connections)
        p.register(R.QUERY_TOPIC_CONSUME_BY_WHO, admin.consumers_of_topic)
        p.register(R.QUERY_TOPICS_BY_CONSUMER, admin.topics_of_consumer)
        p.register(R.GET_ROUTEINFO_BY_TOPIC, self._route_by_topic)
        p.on_close.append(consumer.connection_closed)
        return p

    def _route_by_topic(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        """GET_ROUTEINFO_BY_TOPIC asked of the broker (admin tools): the NameServer's answer."""
        from rmq_spark.remoting.codes import ResponseCode

        topic = req.ext_fields.get("topic", "")
        route = self.routes.topic_route(topic)
        if route is None:
            return req.response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {topic}",
            )
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps(route))

    # --- the NameServer's view of this broker ---------------------------------------------------
    def _local_topics(self) -> dict[str, QueueData]:
        return {name: QueueData(c.read_queue_nums, c.write_queue_nums, c.perm)
                for name, c in list(self.store.topics.topics.items())}  # fmt: skip

    def _local_topic(self, topic: str) -> QueueData | None:
        c = self.store.topics.topics.get(topic)
        return None if c is None else QueueData(c.read_queue_nums, c.write_queue_nums, c.perm)

    def _route_for_new(self, topic: str) -> QueueData | None:
        topics = self.store.topics
        try:
            check_topic_cached(topic, allow_system=topic.startswith(("%RETRY%", "%DLQ%")))
        except MessageIllegalError:  # what check_topic raises for a name it refuses
            return None
        if topic.startswith(("%RETRY%", "%DLQ%")):
            return QueueData(1, 1, 6)
        if not topics.auto_create:
            return None
        n = topics.default_queue_nums
        return QueueData(n, n, 6)

    # --- housekeeping ---------------------------------------------------------------------------
    def _schedule_housekeeping(self) -> None:
        if self._stopped.is_set():
            return
        self.loop_thread.loop.call_later(HOUSEKEEPING_INTERVAL_S, self._housekeeping)

    def _housekeeping(self) -> None:
        try:
            self.clients.notify_many(self.clients.expire())
        finally:
            self._schedule_housekeeping()

    # --- registration with other NameServers ----------------------------------------------------
    def register_body(self) -> bytes:
        table = {name: c.to_json() for name, c in sorted(self.store.topics.topics.items())}
        now = int(time.time() * 1000)
        return jsonbody.dumps({
            "topicConfigSerializeWrapper": {"topicConfigTable": table,
                                            "dataVersion": {"counter": len(table), "stateVersion": 0, "timestamp": now}},
            "filterServerList": [],
        })  # fmt: skip

    def _register_header(self, body: bytes) -> dict[str, str]:
        return {"brokerName": self.broker_name, "brokerAddr": self.broker_addr, "clusterName": self.cluster,
                "haServerAddr": self.broker_addr, "brokerId": "0", "heartbeatTimeoutMillis": "120000",
                "enableActingMaster": "false", "compressed": "false",
                "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF)}  # fmt: skip

    def register_once(self) -> list[str]:
        """REGISTER_BROKER to every ``--namesrv`` address; the addresses that accepted it.  The
        connections are kept: a NameServer forgets a broker whose connection closes."""
        from rmq_spark.remoting.client import RemotingClient

        body = self.register_body()
        ok = []
        with self._register_lock:
            for addr in self.namesrv_addrs:
                header = self._signed(self._register_header(body), body)
                cmd = RemotingCommand(R.REGISTER_BROKER, header, body, version=BROKER_VERSION)
                try:
                    client = self._ns_clients.get(addr)
                    if client is None:
                        client = self._ns_clients[addr] = RemotingClient(addr)
                    answer = client.request(cmd)
                except (OSError, ValueError) as e:
                    log.warning("cannot register with the NameServer %s: %s", addr, e)
                    dead = self._ns_clients.pop(addr, None)
                    if dead is not None:
                        dead.close()
                    continue
                if answer.code == 0:
                    ok.append(addr)
                    if self._refused.pop(addr, None) is not None:
                        log.info("registered with the NameServer %s", addr)
                else:
                    self._log_refusal(addr, answer)
        return ok

    def _signed(self, ext: dict[str, str], body: bytes = b"") -> dict[str, str]:
        """``ext`` signed as the Java clients' AclClientRPCHook signs (--namesrv-access-key)."""
        if self.namesrv_credentials is None:
            return ext
        return self.namesrv_credentials.sign_fields(ext, body)

    def _log_refusal(self, addr: str, answer: RemotingCommand) -> None:
        """One WARNING per NameServer and refusal (the registration is retried every 30 s)."""
        refusal = (answer.code, answer.remark or "")
        if self._refused.get(addr) == refusal:
            return
        self._refused[addr] = refusal
        hint, remark = "", answer.remark or ""
        # refused for its credentials (not for its name, nor by a NameServer taking no brokers)
        if answer.code == ResponseCode.NO_PERMISSION and not (
            "own broker" in remark or "registrations" in remark
        ):
            if self.namesrv_credentials is not None:
                hint = (f"; this broker signs as {self.namesrv_credentials}, which needs to be an "
                        "admin account of that NameServer's ACL")  # fmt: skip
            else:
                hint = ("; that NameServer's access control needs an admin account's signature: "
                        "give rmq-broker --namesrv-access-key and --namesrv-secret-key (or "
                        "RMQ_NAMESRV_ACCESS_KEY and RMQ_NAMESRV_SECRET_KEY)")  # fmt: skip
        log.warning("the NameServer %s refused the registration of %s (%s): code %s, %s%s", addr,
                    self.broker_name, self.broker_addr, answer.code, remark, hint)  # fmt: skip

    def _register_loop(self) -> None:
        """Registers every 30 s, and within a second of a change of the topic table (a topic
        created by mqadmin or by a first send), as a RocketMQ broker registers a new topic."""
        last_s, last_topics = 0.0, None
        while not self._stopped.is_set():
            topics = self._topic_table_version()
            if topics != last_topics or time.monotonic() - last_s >= REGISTER_INTERVAL_S:
                self.register_once()
                last_s, last_topics = time.monotonic(), topics
            self._stopped.wait(1.0)

    def _topic_table_version(self) -> tuple[int, int]:
        topics = self.store.topics.topics
        return len(topics), sum(
            c.read_queue_nums + c.write_queue_nums * 1024 + c.perm for c in list(topics.values())
        )

    def _unregister_all(self) -> None:
        from rmq_spark.remoting.client import request

        header = {"brokerName": self.broker_name, "brokerAddr": self.broker_addr, "clusterName": self.cluster,
                  "brokerId": "0"}  # fmt: skip
        with self._register_lock:
            for addr in self.namesrv_addrs:
                try:
                    request(addr, R.UNREGISTER_BROKER, self._signed(dict(header)), timeout_s=1.0)
                except (OSError, ValueError):
                    pass
            for client in self._ns_clients.values():
                client.close()
            self._ns_clients.clear()

    # --- lifecycle ------------------------------------------------------------------------------
    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if getattr(self, "namesrv_addrs", None):
            self._unregister_all()
        pull = getattr(self, "pull", None)
        if pull is not None:
            pull.close()
        for server in (self.namesrv_server, self.broker_server):
            if server is not None:
                server.stop()
        self.loop_thread.stop()
