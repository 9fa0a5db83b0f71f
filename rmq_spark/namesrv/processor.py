"""The NameServer's request handlers (``DefaultRequestProcessor`` / ``ClientRequestProcessor`` of
apache/rocketmq): routes and cluster info for clients and mqadmin, REGISTER_BROKER /
UNREGISTER_BROKER from brokers.

    namesrv_processor(routes, access=NamesrvAcl(access_control), accept_brokers=True)

- Before every handler, on the event loop (``Processor.before``): when ``accept_brokers`` is off,
  REGISTER_BROKER and UNREGISTER_BROKER are refused (NO_PERMISSION); a registration body over
  ``body_max_bytes``, or another request's over ``other_body_max_bytes``, is refused; then
  ``access`` (None: no access control) may refuse the request with its answer (its HMAC over the
  body is thereby bounded).
- REGISTER_BROKER reads and checks its header on the loop (it names the local broker: refused),
  then reads its body off the loop, on the server's thread pool, at most
  ``registrations_in_flight`` at once (more: SYSTEM_BUSY); the registry refuses what is past its
  bounds (:mod:`rmq_spark.namesrv.limits`).  Every refusal names its reason.
- GET_ROUTEINFO_BY_TOPIC costs a look-up per broker and runs on the loop; the answers that walk
  every topic (topic lists, cluster info) run on the pool.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from rmq_spark.namesrv.acl import PUT_KV_CONFIG
from rmq_spark.namesrv.limits import (
    NamesrvLimits,
    RegistrationError,
    check_topic_name,
    shown,
)
from rmq_spark.namesrv.registration import RegisterHeader, UnregisterHeader, read_topics
from rmq_spark.namesrv.routes import BrokerEntry, RouteInfoManager
from rmq_spark.remoting import jsonbody
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.headers import fields_of
from rmq_spark.remoting.server import Connection, Processor

__all__ = ["Access", "namesrv_processor"]

log = logging.getLogger("rmq_spark.namesrv")

# an access check: None lets the request through, an answer refuses it
Access = Callable[[Connection, RemotingCommand], "RemotingCommand | None"]
QUERY_DATA_VERSION, GET_KV_CONFIG = 322, 101
_BROKER_CODES = (RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER)
REGISTRATIONS_OFF = ("this NameServer does not accept brokers' registrations (rmq-broker "
                     "--no-namesrv-registrations); it serves its own broker's routes only")  # fmt: skip


class _Gate:
    """At most ``n`` registrations being read at once."""

    def __init__(self, n: int) -> None:
        self._free = n
        self._lock = threading.Lock()

    def enter(self) -> bool:
        with self._lock:
            if self._free <= 0:
                return False
            self._free -= 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._free += 1


def namesrv_processor(routes: RouteInfoManager, *, access: Access | None = None, accept_brokers: bool = True,
                      limits: NamesrvLimits | None = None) -> Processor:  # fmt: skip
    limits = limits or routes.limits
    gate = _Gate(limits.registrations_in_flight)
    p = Processor()

    def before(conn: Connection, req: RemotingCommand) -> RemotingCommand | None:
        if req.code in _BROKER_CODES and not accept_brokers:
            return req.response(ResponseCode.NO_PERMISSION, REGISTRATIONS_OFF)
        size = len(req.body or b"")
        if req.code == RequestCode.REGISTER_BROKER:
            if size > limits.body_max_bytes:
                return req.response(ResponseCode.SYSTEM_ERROR, f"REGISTER_BROKER body is {size} bytes; "
                                                               f"the limit is {limits.body_max_bytes}")  # fmt: skip
        elif size > limits.other_body_max_bytes:
            return req.response(ResponseCode.SYSTEM_ERROR, f"request code {req.code} takes at most "
                                                           f"{limits.other_body_max_bytes} bytes of body, not {size}")  # fmt: skip
        return access(conn, req) if access is not None else None

    def route_by_topic(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        topic = fields_of(req.ext_fields).str("topic")
        route = routes.topic_route(topic)
        if route is None:
            name = topic if len(topic) <= 255 and topic.isprintable() else shown(topic)
            return req.response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {name}",
            )
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps(route))

    def cluster_info(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps(routes.cluster_info()))

    def topic_list(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.response(
            ResponseCode.SUCCESS, body=jsonbody.dumps({"topicList": routes.topic_list()})
        )

    def topics_by_cluster(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        cluster = fields_of(req.ext_fields).str("cluster")
        return req.response(
            ResponseCode.SUCCESS,
            body=jsonbody.dumps({"topicList": routes.topics_of_cluster(cluster)}),
        )

    def register_broker(conn: Connection, req: RemotingCommand) -> Any:
        try:
            header = RegisterHeader.read(req.ext_fields, limits)
            routes.check_not_local(header.broker_name, header.broker_addr, "REGISTER_BROKER")
        except RegistrationError as e:
            return req.response(e.code, str(e))
        if not gate.enter():
            return req.response(ResponseCode.SYSTEM_BUSY, f"the NameServer is reading {limits.registrations_in_flight} "
                                                          "other registrations; try again")  # fmt: skip
        try:
            return conn.loop.run_in_executor(
                conn.server.executor, register_off_loop, conn, header, req
            )
        except RuntimeError:  # the server is stopping: its pool takes no more work
            gate.leave()
            return req.response(ResponseCode.SYSTEM_BUSY, "the NameServer is stopping")

    def register_off_loop(
        conn: Connection, header: RegisterHeader, req: RemotingCommand
    ) -> RemotingCommand:
        try:
            topics = read_topics(header, req.body, limits)
            routes.register(BrokerEntry(header.cluster, header.broker_name, header.broker_addr, header.broker_id,
                                        topics, timeout_ms=header.timeout_ms, connection_id=conn.id))  # fmt: skip
            # it closed while the body was read: its close hook may have run already
            if conn.closed:
                routes.connection_closed(conn.id)
        except RegistrationError as e:
            return req.response(e.code, str(e))
        except Exception:
            log.exception(
                "REGISTER_BROKER of %s (%s) failed", header.broker_name, header.broker_addr
            )
            return req.response(
                ResponseCode.SYSTEM_ERROR, "REGISTER_BROKER failed inside the NameServer (logged)"
            )
        finally:
            gate.leave()
        return req.response(ResponseCode.SUCCESS, ext_fields={}, body=jsonbody.dumps({"table": {}}))

    def unregister_broker(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        try:
            header = UnregisterHeader.read(req.ext_fields, limits)
            routes.unregister(header.broker_addr, header.broker_name)
        except RegistrationError as e:
            return req.response(e.code, str(e))
        return req.response(ResponseCode.SUCCESS)

    def query_data_version(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """QUERY_DATA_VERSION (a broker asking whether to register again): always "changed"."""
        return req.response(
            ResponseCode.SUCCESS,
            None,
            {"changed": "true"},
            jsonbody.dumps({"counter": 0, "timestamp": 0}),
        )

    def kv_config(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.response(ResponseCode.QUERY_NOT_FOUND, "No config item")

    def put_kv(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.response(ResponseCode.SUCCESS)

    def delete_topic(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        f = fields_of(req.ext_fields)
        try:
            topic = check_topic_name(f.str("topic"))
        except RegistrationError as e:
            return req.response(ResponseCode.SYSTEM_ERROR, f"DELETE_TOPIC_IN_NAMESRV: {e}")
        routes.delete_topic(topic, f.opt("clusterName") or None)
        return req.response(ResponseCode.SUCCESS)

    p.before = before
    p.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, route_by_topic)
    p.register(RequestCode.DELETE_TOPIC_IN_NAMESRV, delete_topic)
    p.register(RequestCode.GET_BROKER_CLUSTER_INFO, cluster_info, blocking=True)
    p.register(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, topic_list, blocking=True)
    p.register(RequestCode.GET_TOPICS_BY_CLUSTER, topics_by_cluster, blocking=True)
    p.register(RequestCode.REGISTER_BROKER, register_broker)
    p.register(RequestCode.UNREGISTER_BROKER, unregister_broker)
    p.register(QUERY_DATA_VERSION, query_data_version)
    p.register(GET_KV_CONFIG, kv_config)  # no order-topic configs are kept
    p.register(PUT_KV_CONFIG, put_kv)  # mqadmin updateTopic -o true: accepted, not kept
    p.on_close.append(lambda conn: routes.connection_closed(conn.id))
    return p
