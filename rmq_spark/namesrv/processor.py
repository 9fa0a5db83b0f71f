"""The NameServer's request handlers (``DefaultRequestProcessor`` / ``ClientRequestProcessor`` of
apache/rocketmq): routes and cluster info for clients and mqadmin, REGISTER_BROKER /
UNREGISTER_BROKER from brokers."""

from __future__ import annotations

import logging
import zlib

from rmq_spark.namesrv.routes import (
    BROKER_TIMEOUT_MS,
    BrokerEntry,
    RouteInfoManager,
    compressed_topic_table,
    queue_data_table,
)
from rmq_spark.remoting import jsonbody
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.headers import HeaderError, fields_of
from rmq_spark.remoting.server import Connection, Processor

__all__ = ["namesrv_processor"]

log = logging.getLogger("rmq_spark.namesrv")


def namesrv_processor(routes: RouteInfoManager) -> Processor:
    p = Processor()

    def route_by_topic(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        topic = fields_of(req.ext_fields).str("topic")
        route = routes.topic_route(topic)
        if route is None:
            return req.response(ResponseCode.TOPIC_NOT_EXIST,
                                f"No topic route info in name server for the topic: {topic}")  # fmt: skip
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps(route))

    def cluster_info(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps(routes.cluster_info()))

    def topic_list(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps({"topicList": routes.topic_list()}))

    def topics_by_cluster(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        cluster = fields_of(req.ext_fields).str("cluster")
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps({"topicList": routes.topics_of_cluster(cluster)}))

    def register_broker(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        f = fields_of(req.ext_fields)
        entry = BrokerEntry(
            cluster=f.str("clusterName"), broker_name=f.str("brokerName"), broker_addr=f.str("brokerAddr"),
            broker_id=f.long("brokerId"), timeout_ms=f.long("heartbeatTimeoutMillis", BROKER_TIMEOUT_MS),
            connection_id=conn.id,
        )  # fmt: skip
        body = req.body
        if body:
            crc = f.long("bodyCrc32", 0)
            if crc != 0 and crc != zlib.crc32(body) & 0x7FFFFFFF:  # UtilAll.crc32
                return req.response(ResponseCode.SYSTEM_ERROR, "receive registerBroker request,crc32 not match")
            try:
                # 5.x brokers with compressedRegister=true deflate the body but send compressed=false:
                # a zlib stream starts with 0x78, a JSON document with "{"
                if f.bool("compressed") or body[:1] == b"\x78":
                    entry.topics = compressed_topic_table(body)
                else:
                    doc = jsonbody.loads(body)
                    table = ((doc.get("topicConfigSerializeWrapper") or {}).get("topicConfigTable") or {})
                    entry.topics = queue_data_table(table.values())
            except (ValueError, AttributeError, TypeError) as e:
                raise HeaderError(f"REGISTER_BROKER body is not a RegisterBrokerBody: {e}") from None
        routes.register(entry)
        return req.response(ResponseCode.SUCCESS, ext_fields={}, body=jsonbody.dumps({"table": {}}))

    def unregister_broker(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        f = fields_of(req.ext_fields)
        routes.unregister(f.str("brokerAddr"), f.opt("brokerName"))
        return req.response(ResponseCode.SUCCESS)

    def query_data_version(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """QUERY_DATA_VERSION (a broker asking whether to register again): always "changed"."""
        return req.response(ResponseCode.SUCCESS, None, {"changed": "true"}, jsonbody.dumps({"counter": 0, "timestamp": 0}))

    def kv_config(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.response(ResponseCode.QUERY_NOT_FOUND, "No config item")

    def put_kv(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.response(ResponseCode.SUCCESS)

    def delete_topic(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        f = fields_of(req.ext_fields)
        routes.delete_topic(f.str("topic"), f.opt("clusterName") or None)
        return req.response(ResponseCode.SUCCESS)

    p.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, route_by_topic)
    p.register(RequestCode.DELETE_TOPIC_IN_NAMESRV, delete_topic)
    p.register(RequestCode.GET_BROKER_CLUSTER_INFO, cluster_info)
    p.register(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, topic_list)
    p.register(RequestCode.GET_TOPICS_BY_CLUSTER, topics_by_cluster)
    p.register(RequestCode.REGISTER_BROKER, register_broker)
    p.register(RequestCode.UNREGISTER_BROKER, unregister_broker)
    p.register(322, query_data_version)  # QUERY_DATA_VERSION
    p.register(101, kv_config)  # GET_KV_CONFIG: no order-topic configs are kept
    p.register(100, put_kv)  # PUT_KV_CONFIG (mqadmin updateTopic -o true): accepted, not kept
    p.on_close.append(lambda conn: routes.connection_closed(conn.id))
    return p
