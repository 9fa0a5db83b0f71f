"""What mqadmin asks a broker (``AdminBrokerProcessor``): UPDATE_AND_CREATE_TOPIC,
DELETE_TOPIC_IN_BROKER, INVOKE_BROKER_TO_RESET_OFFSET, GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
GET_ALL_TOPIC_CONFIG, GET_BROKER_RUNTIME_INFO (brokerStatus, clusterList), GET_TOPIC_STATS_INFO
(topicStatus), GET_CONSUME_STATS (consumerProgress), GET_CONSUMER_CONNECTION_LIST,
GET_PRODUCER_CONNECTION_LIST, QUERY_TOPIC_CONSUME_BY_WHO, QUERY_TOPICS_BY_CONSUMER.

TopicStatsTable and ConsumeStats are maps keyed by MessageQueue objects, written as fastjson
writes them (:func:`rmq_spark.remoting.jsonbody.object_key_map`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from rmq_spark.access.names import Use, group_name, topic_name
from rmq_spark.errors import IllegalTopicError, MessageIllegalError, RmqError
from rmq_spark.remoting import jsonbody
from rmq_spark.remoting.clients import ClientManager
from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.headers import fields_of
from rmq_spark.remoting.server import Connection
from rmq_spark.store import layout as L
from rmq_spark.store.config import TopicConfig

__all__ = ["BROKER_VERSION", "AdminProcessor"]

log = logging.getLogger("rmq_spark.remoting")
RESET_CONSUMER_CLIENT_OFFSET = 220  # RequestCode: the broker tells a consumer its new offsets

# MQVersion.Version.V4_9_8 (ordinal): what the broker reports as its version
BROKER_VERSION = 415
BROKER_VERSION_DESC = "V4_9_8"


class AdminProcessor:
    def __init__(
        self, core: Any, clients: ClientManager, broker_name: str, started_ms: int
    ) -> None:
        self.core = core
        self.store = core.store
        self.clients = clients
        self.broker_name = broker_name
        self.started_ms = started_ms
        # told of every queue whose committed offset a reset moved: (group, topic, queue id) (the
        # broker's pop state forgets what it held of it)
        self.on_reset: Callable[[str, str, int], None] | None = None
        self.on_delete: Callable[[str], None] | None = None  # told of each deleted topic

    # --- topics ---------------------------------------------------------------------------------
    @staticmethod
    def _refused_topic(req: RemotingCommand, topic: str) -> RemotingCommand | None:
        """RocketMQ's answers to an admin request naming a topic it may not create, update or
        delete: a name that is not a topic's, or one of TopicValidator's system topics
        (retry and dead-letter topics are not: they stay allowed)."""
        try:
            topic_name(topic, Use.ROUTE, system_reads=True)
        except IllegalTopicError as e:
            return req.response(ResponseCode.SYSTEM_ERROR, f"The specified topic is invalid: {e}")
        if L.conflicts_with_system_topic(topic):
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic."
            )
        return None

    def update_topic(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """UPDATE_AND_CREATE_TOPIC: what the store's loader accepts (one rule: the store's
        ``check_topic_config``), never a system topic."""
        f = fields_of(req.ext_fields)
        topic = f.str("topic")
        refused = self._refused_topic(req, topic)
        if refused is not None:
            return refused
        cfg = TopicConfig(topic, f.int("readQueueNums"), f.int("writeQueueNums"), f.int("perm", 6),
                          order=f.bool("order"))  # fmt: skip
        try:
            self.store.topics.create(cfg)
        except RmqError as e:
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is not created: {e}"
            )
        return req.response(ResponseCode.SUCCESS)

    def delete_topic(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """DELETE_TOPIC_IN_BROKER: the topic's config, ConsumeQueues and consumer offsets go (its
        records stay in the CommitLog, hidden, until their segments expire)."""
        topic = fields_of(req.ext_fields).str("topic")
        refused = self._refused_topic(req, topic)
        if refused is not None:
            return refused
        self.store.delete_topic(topic)
        if self.on_delete is not None:
            self.on_delete(topic)
        return req.response(ResponseCode.SUCCESS)

    def all_subscription_groups(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG: every group with committed offsets or a client."""
        names = set(self.store.offsets.groups()) | set(self.clients.consumers)
        table = {n: {"groupName": n, "consumeEnable": True, "consumeFromMinEnable": True,
                     "consumeBroadcastEnable": True, "retryQueueNums": 1, "retryMaxTimes": 16, "brokerId": 0,
                     "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True}
                 for n in sorted(names)}  # fmt: skip
        doc = {
            "subscriptionGroupTable": table,
            "dataVersion": {"counter": len(table), "timestamp": int(time.time() * 1000)},
        }
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps(doc))

    def reset_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """INVOKE_BROKER_TO_RESET_OFFSET: the group's committed offsets of the topic's queues (or
        of ``queueId``) move to ``offset``, or to the first message stored at or after
        ``timestamp`` (-1: the end), as RocketMQ's server-side reset does; online remoting
        consumers of the group are told (RESET_CONSUMER_CLIENT_OFFSET).  The answer is the
        ResetOffsetBody of the new offsets."""
        f = fields_of(req.ext_fields)
        topic, group = f.str("topic"), f.str("group")
        try:  # the names first: a committed offset is a file entry built from them
            group_name(group)
            topic_name(topic, Use.READ, system_reads=True)
        except MessageIllegalError as e:
            return req.response(ResponseCode.SYSTEM_ERROR, f"[reset-offset] {e}")
        when, only = f.long("timestamp"), f.int("queueId", -1)
        given = f.long("offset") if f.opt("offset") not in (None, "") else None
        cfg = self.store.topics.get(topic)
        if cfg is None:
            return req.response(ResponseCode.SYSTEM_ERROR,
                                f"[reset-offset] reset offset failed, no topic in this broker. topic={topic}")  # fmt: skip
        queue_nums = max(cfg.read_queue_nums, cfg.write_queue_nums)
        if not -1 <= only < queue_nums:
            return req.response(ResponseCode.SYSTEM_ERROR,
                                f"[reset-offset] the custom header's field 'queueId' is out of range: {only} "
                                f"(topic {topic} has queues 0 to {queue_nums - 1}; -1: all of them)")  # fmt: skip
        store = self.store
        queues = [only] if only >= 0 else list(range(cfg.write_queue_nums))
        items = []
        for q in queues:
            lo, hi = store.min_offset(topic, q), store.max_offset(topic, q)
            if only >= 0 and given is not None:
                target = min(max(given, lo), hi)
            elif when < 0:
                target = hi
            else:
                target = min(max(store.offset_by_time(topic, q, when), lo), hi)
            store.offsets.commit(group, topic, q, target)
            if self.on_reset is not None:
                self.on_reset(group, topic, q)
            items.append(({"brokerName": self.broker_name, "queueId": q, "topic": topic}, target))
        store.offsets.persist()
        body = ('{"offsetTable":' + jsonbody.object_key_map(items) + "}").encode()
        g = self.clients.consumer_group(group)
        told = 0
        for c, *_rest in list(g.clients.values()) if g is not None else []:
            cmd = RemotingCommand(RESET_CONSUMER_CLIENT_OFFSET, {"topic": topic, "group": group, "timestamp": str(when),
                                                                  "isForce": "true"}, body)  # fmt: skip
            told += bool(c.send_oneway(cmd))
        log.info(
            "offsets of consumer group %s on topic %s reset to %s: %s (%d consumer(s) told)",
            group,
            topic,
            "the end" if when < 0 else f"time {when}",
            {q: o for (_k, o), q in zip(items, queues, strict=True)},
            told,
        )
        return req.response(ResponseCode.SUCCESS, body=body)

    def all_topic_config(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        table = {name: cfg.to_json() for name, cfg in sorted(self.store.topics.topics.items())}
        doc = {
            "topicConfigTable": table,
            "dataVersion": {"counter": len(table), "timestamp": int(time.time() * 1000)},
        }
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps(doc))

    def topic_config(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """GET_TOPIC_CONFIG (5.x mqadmin, before topicStatus): a TopicConfigAndQueueMapping."""
        topic = fields_of(req.ext_fields).str("topic")
        cfg = self.store.topics.get(topic)
        if cfg is None:
            return req.response(
                ResponseCode.TOPIC_NOT_EXIST, f"No topic in this broker. topic: {topic}"
            )
        return req.response(
            ResponseCode.SUCCESS, body=jsonbody.dumps({**cfg.to_json(), "mappingDetail": None})
        )

    def topic_stats(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        topic = fields_of(req.ext_fields).str("topic")
        cfg = self.store.topics.get(topic)
        if cfg is None:
            return req.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        items = []
        for q in range(cfg.write_queue_nums):
            lo, hi = self.store.min_offset(topic, q), self.store.max_offset(topic, q)
            items.append(({"brokerName": self.broker_name, "queueId": q, "topic": topic},
                          {"lastUpdateTimestamp": self._store_time(topic, q, hi - 1), "maxOffset": hi,
                           "minOffset": lo}))  # fmt: skip
        body = '{"offsetTable":' + jsonbody.object_key_map(items) + "}"
        return req.response(ResponseCode.SUCCESS, body=body.encode())

    def _store_time(self, topic: str, queue_id: int, offset: int) -> int:
        cq = self.store.consume_queue(topic, queue_id)
        if cq is None or offset < cq.min_offset or offset >= cq.max_offset:
            return 0
        unit = cq.unit(offset)
        return max(0, self.store.commitlog.store_timestamp(unit[0])) if unit is not None else 0

    # --- consumer groups ------------------------------------------------------------------------
    def _topics_of_group(self, group: str) -> list[str]:
        offsets = self.store.offsets
        out = {t for t in self.store.topics.topics if offsets.query_topic(group, t)}
        g = self.clients.consumer_group(group)
        if g is not None:
            out.update(g.subscriptions)
        return sorted(out)

    def consume_stats(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        f = fields_of(req.ext_fields)
        group = f.str("consumerGroup")
        only = f.opt("topic")
        items = []
        for topic in [only] if only else self._topics_of_group(group):
            cfg = self.store.topics.get(topic)
            if cfg is None:
                continue
            committed = self.store.offsets.query_topic(group, topic)
            for q in range(cfg.read_queue_nums):
                broker_offset = self.store.max_offset(topic, q)
                consumer_offset = max(committed.get(q, 0), 0)
                items.append(({"brokerName": self.broker_name, "queueId": q, "topic": topic},
                              {"brokerOffset": broker_offset, "consumerOffset": consumer_offset,
                               "pullOffset": consumer_offset,
                               "lastTimestamp": self._store_time(topic, q, consumer_offset - 1)}))  # fmt: skip
        body = '{"consumeTps":0.0,"offsetTable":' + jsonbody.object_key_map(items) + "}"
        return req.response(ResponseCode.SUCCESS, body=body.encode())

    def consumer_connections(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        group = fields_of(req.ext_fields).str("consumerGroup")
        g = self.clients.consumer_group(group)
        if g is None or not g.clients:
            return req.response(
                ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online"
            )
        connections = [{"clientId": cid, "clientAddr": c.peer, "language": lang, "version": version}
                       for cid, (c, _t, lang, version) in sorted(g.clients.items())]  # fmt: skip
        subs = {t: {"topic": t, "subString": s.expression, "expressionType": s.expression_type,
                    "subVersion": s.sub_version, "tagsSet": [], "codeSet": [], "classFilterMode": False}
                for t, s in g.subscriptions.items()}  # fmt: skip
        doc = {"connectionSet": connections, "subscriptionTable": subs, "consumeType": g.consume_type,
               "messageModel": g.message_model, "consumeFromWhere": g.consume_from_where}  # fmt: skip
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps(doc))

    def producer_connections(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        group = fields_of(req.ext_fields).str("producerGroup")
        conns = self.clients.producers.get(group) or {}
        if not conns:
            return req.response(ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        doc = {"connectionSet": [{"clientId": cid, "clientAddr": c.peer, "language": "JAVA", "version": 0}
                                 for cid, (c, _t) in sorted(conns.items())]}  # fmt: skip
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps(doc))

    def consumers_of_topic(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        topic = fields_of(req.ext_fields).str("topic")
        groups = {
            g for g in self.store.offsets.groups() if self.store.offsets.query_topic(g, topic)
        }
        groups.update(
            name for name, g in self.clients.consumers.items() if topic in g.subscriptions
        )
        return req.response(
            ResponseCode.SUCCESS, body=jsonbody.dumps({"groupList": sorted(groups)})
        )

    def topics_of_consumer(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        group = fields_of(req.ext_fields).str("group")
        return req.response(
            ResponseCode.SUCCESS, body=jsonbody.dumps({"topicList": self._topics_of_group(group)})
        )

    # --- the broker -----------------------------------------------------------------------------
    def runtime_info(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        store = self.store
        cl = store.commitlog
        now = int(time.time() * 1000)
        put_total = sum(
            store.max_offset(t, q) for t, q in store.queue_keys() if not L.is_system_topic(t)
        )
        earliest = 0
        if cl.max_offset > cl.min_offset:
            earliest = max(0, cl.store_timestamp(cl.min_offset))
        try:
            st = os.statvfs(store.root)
            disk_ratio = 1.0 - st.f_bavail / st.f_blocks if st.f_blocks else 0.0
        except OSError:
            disk_ratio = 0.0
        table = {
            "brokerVersionDesc": BROKER_VERSION_DESC, "brokerVersion": str(BROKER_VERSION),
            "bootTimestamp": str(self.started_ms), "runtime": f"[ {(now - self.started_ms) // 1000} s ]",
            "putTps": "0.0 0.0 0.0", "getTransferedTps": "0.0 0.0 0.0", "getTransferredTps": "0.0 0.0 0.0",
            "getFoundTps": "0.0 0.0 0.0", "getMissTps": "0.0 0.0 0.0", "getTotalTps": "0.0 0.0 0.0",
            "msgPutTotalYesterdayNow": "0", "msgPutTotalTodayMorning": "0", "msgPutTotalTodayNow": str(put_total),
            "msgGetTotalYesterdayNow": "0", "msgGetTotalTodayMorning": "0", "msgGetTotalTodayNow": "0",
            "earliestMessageTimeStamp": str(earliest), "commitLogDiskRatio": f"{disk_ratio:.4f}",
            "commitLogMinOffset": str(cl.min_offset), "commitLogMaxOffset": str(cl.max_offset),
            "dispatchBehindBytes": "0", "pageCacheLockTimeMills": "0", "sendThreadPoolQueueSize": "0",
            "sendThreadPoolQueueCapacity": "10000", "pullThreadPoolQueueSize": "0",
            "pullThreadPoolQueueCapacity": "100000", "remainHowManyDataToFlush": "0 B",
            "msgPutTotalTodayNowRaw": str(put_total), "brokerActive": "true", "brokerName": self.broker_name,
        }  # fmt: skip
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps({"table": table}))
