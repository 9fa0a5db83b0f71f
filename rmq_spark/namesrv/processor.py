"""The NameServer's request handlers (``DefaultRequestProcessor`` / ``ClientRequestProcessor`` of
apache/rocketmq): routes and cluster info for clients and mqadmin, REGISTER_BROKER /
UNREGISTER_BROKER from brokers.

    namesrv_processor(routes, access_control=AccessControl.load(path), accept_brokers=True)

- Before every handler, on the event loop (``Processor.before``): the request table's gate
  (:class:`~rmq_spark.remoting.requests.RequestGate` over
  :data:`~rmq_spark.remoting.namesrv_requests.NAMESRV_REQUESTS`, as on the broker's remoting port):
  a code without a row is refused, the body held to its row's bound, with ``access_control`` the
  writes' admin signature checked, and the header decoded once into ``req.header``, which is all a
  handler reads.
- When ``accept_brokers`` is off, REGISTER_BROKER and UNREGISTER_BROKER are refused
  (NO_PERMISSION); one naming the local broker is refused too.
- REGISTER_BROKER reads its body off the loop, on the server's thread pool, at most
  ``registrations_in_flight`` at once (more: SYSTEM_BUSY); the registry refuses what is past its
  bounds (:mod:`rmq_spark.namesrv.limits`).  Every refusal names its reason.
- GET_ROUTEINFO_BY_TOPIC costs a look-up per broker and runs on the loop; the answers that walk
  every topic (topic lists, cluster info) run on the pool.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from rmq_spark.access.auth import AccessControl
from rmq_spark.namesrv.limits import NamesrvLimits, RegistrationError
from rmq_spark.namesrv.registration import RegisterHeader, read_topics
from rmq_spark.namesrv.routes import BrokerEntry, RouteInfoManager
from rmq_spark.remoting import jsonbody
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.namesrv_requests import (
    GET_KV_CONFIG,
    NAMESRV_REQUESTS,
    PUT_KV_CONFIG,
    QUERY_DATA_VERSION,
)
from rmq_spark.remoting.requests import RequestGate
from rmq_spark.remoting.server import Connection, Processor

__all__ = ["REGISTRATIONS_OFF", "namesrv_processor"]

log = logging.getLogger("rmq_spark.namesrv")

REGISTRATIONS_OFF = ("this NameServer does not accept brokers' registrations (rmq-broker "
                     "--no-namesrv-registrations); it serves its own broker's routes only")  # fmt: skip


class _InFlight:
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


def _header(req: RemotingCommand) -> Mapping[str, Any]:
    """The request's header as its row decoded it (the gate has run: never the raw ext fields)."""
    assert req.header is not None, "the request table's gate did not run"
    return req.header


def namesrv_processor(routes: RouteInfoManager, *, access_control: AccessControl | None = None,
                      accept_brokers: bool = True,
                      limits: NamesrvLimits | None = None) -> Processor:  # fmt: skip
    """The NameServer's processor over ``routes``; ``access_control`` (None: no ACL) guards its
    writes (:mod:`rmq_spark.remoting.namesrv_requests`)."""
    limits = limits or routes.limits
    reading = _InFlight(limits.registrations_in_flight)
    p = Processor()

    def registrations_off(req: RemotingCommand) -> RemotingCommand | None:
        if accept_brokers:
            return None
        return req.response(ResponseCode.NO_PERMISSION, REGISTRATIONS_OFF)

    def route_by_topic(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        topic = _header(req)["topic"]  # a valid name (its row): at most 255 plain characters
        route = routes.topic_route(topic)
        if route is None:
            return req.response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {topic}",
            )
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps(route))

    def cluster_info(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps(routes.cluster_info()))

    def topic_list(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.response(
            ResponseCode.SUCCESS, body=jsonbody.dumps({"topicList": routes.topic_list()})
        )

    def topics_by_cluster(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        cluster = _header(req)["cluster"]
        return req.response(
            ResponseCode.SUCCESS,
            body=jsonbody.dumps({"topicList": routes.topics_of_cluster(cluster)}),
        )

    def register_broker(conn: Connection, req: RemotingCommand) -> Any:
        refused = registrations_off(req)
        if refused is not None:
            return refused
        header = RegisterHeader.of(_header(req))
        try:
            routes.check_not_local(header.broker_name, header.broker_addr, "REGISTER_BROKER")
        except RegistrationError as e:
            return req.response(e.code, str(e))
        if not reading.enter():
            return req.response(ResponseCode.SYSTEM_BUSY, f"the NameServer is reading {limits.registrations_in_flight} "
                                                          "other registrations; try again")  # fmt: skip
        try:
            return conn.loop.run_in_executor(
                conn.server.executor, register_off_loop, conn, header, req
            )
        except RuntimeError:  # the server is stopping: its pool takes no more work
            reading.leave()
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
            reading.leave()
        return req.response(ResponseCode.SUCCESS, ext_fields={}, body=jsonbody.dumps({"table": {}}))

    def unregister_broker(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        refused = registrations_off(req)
        if refused is not None:
            return refused
        try:
            h = _header(req)
            routes.unregister(h["brokerAddr"], h.get("brokerName") or None)
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
        h = _header(req)
        routes.delete_topic(h["topic"], h.get("clusterName") or None)
        return req.response(ResponseCode.SUCCESS)

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
    # every request passes the request table's gate; a code registered here without a row there
    # fails now, not when a client sends it
    gate = RequestGate(NAMESRV_REQUESTS, access_control)
    gate.check_covers(p.handlers)
    p.before = gate
    return p
