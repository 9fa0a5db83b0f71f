"""Client and consumer-group requests (``ClientManageProcessor``, ``ConsumerManageProcessor``):
HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, QUERY_CONSUMER_OFFSET,
UPDATE_CONSUMER_OFFSET, LOCK_BATCH_MQ, UNLOCK_BATCH_MQ.

Offsets are the store's consumer offsets (``config/consumerOffset.json``), the same table the gRPC
side and the Spark source commit to: a group's progress is one whatever protocol moved it.
"""

from __future__ import annotations

from typing import Any

from rmq_spark.errors import MessageIllegalError, RmqError
from rmq_spark.remoting import jsonbody
from rmq_spark.remoting.clients import ClientManager, MessageQueueKey
from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.headers import HeaderError, fields_of
from rmq_spark.remoting.server import Connection
from rmq_spark.store import layout as L
from rmq_spark.store.validation import check_topic

__all__ = ["ConsumerProcessor"]


def _body(req: RemotingCommand) -> dict[str, Any]:
    if isinstance(req.decoded_body, dict):  # parsed and checked once, by the request table's gate
        return req.decoded_body
    try:
        doc = jsonbody.loads(req.body)
    except ValueError as e:
        raise HeaderError(f"the request body is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise HeaderError("the request body is not a JSON object")
    return doc


def _is_topic(name: str) -> bool:
    try:
        check_topic(name, allow_system=True)
    except MessageIllegalError:
        return False
    return True


def _queues(doc: dict[str, Any]) -> list[MessageQueueKey]:
    out = []
    for mq in doc.get("mqSet") or []:
        if isinstance(mq, dict):
            out.append(
                (str(mq.get("topic", "")), str(mq.get("brokerName", "")), int(mq.get("queueId", 0)))
            )
    return out


class ConsumerProcessor:
    def __init__(self, store: Any, clients: ClientManager) -> None:
        self.store = store
        self.clients = clients

    def heartbeat(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """HEART_BEAT: each consumer group's retry topic exists from its first heartbeat (as
        RocketMQ's subscription group and retry topic do): all the new ones with one write of
        topics.json (one each was quadratic: 1,000 groups, 29.6 s).  How many heartbeats may
        create is bounded (the topic table's ``retry_topics_auto_max``): a new group past it is
        not registered, and the answer (SUBSCRIPTION_GROUP_NOT_EXIST) names it; the rest of the
        heartbeat (its producers, its known groups) is registered."""
        doc = _body(req)
        consumers = [c for c in doc.get("consumerDataSet") or []
                     if isinstance(c, dict) and c.get("groupName")]  # fmt: skip
        groups = [str(c["groupName"]) for c in consumers]
        retry = {L.RETRY_GROUP_TOPIC_PREFIX + g: g for g in groups}
        refused: list[str] = []
        try:
            made = self.store.topics.get_or_create_many(retry, skip_invalid=True, bounded=True)
            refused = [g for t, g in retry.items() if t not in made and _is_topic(t)]
        except RmqError:  # not written (a full disk): the next heartbeat asks again
            pass
        if refused:
            gone = set(refused)
            kept = [c for c in consumers if str(c["groupName"]) not in gone]
            doc = {**doc, "consumerDataSet": kept}
        try:
            changed = self.clients.heartbeat(conn, doc, req.language.name, req.version)
        except (ValueError, TypeError, AttributeError) as e:
            raise HeaderError(f"HeartbeatData: {e}") from None
        self.clients.notify_many(changed)
        if refused:
            shown = ", ".join(refused[:3]) + (" ..." if len(refused) > 3 else "")
            limit = self.store.topics.retry_topics_auto_max
            remark = (f"subscription group not exist: {len(refused)} new consumer group(s) not "
                      f"created ({shown}): the broker holds {limit} groups' retry topics, the most "
                      "that heartbeats may create")  # fmt: skip
            return req.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, remark)
        return req.response(ResponseCode.SUCCESS)

    def unregister(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        f = fields_of(req.ext_fields)
        changed = self.clients.unregister(
            conn, f.str("clientID"), f.opt("producerGroup"), f.opt("consumerGroup")
        )
        for group in changed:
            self.clients.notify_ids_changed(group)
        return req.response(ResponseCode.SUCCESS)

    def check_client_config(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """CHECK_CLIENT_CONFIG: a consumer starting with an SQL92 selector asks whether the broker
        can filter with it (and whether it parses)."""
        from rmq_spark.errors import FilterExpressionError
        from rmq_spark.filter import make_filter

        sub = _body(req).get("subscriptionData") or {}
        try:
            make_filter(str(sub.get("expressionType") or "TAG"), str(sub.get("subString") or "*"))
        except FilterExpressionError as e:
            return req.response(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"Parse the consumer's subscription failed: {e}",
            )
        return req.response(ResponseCode.SUCCESS)

    def connection_closed(self, conn: Connection) -> None:
        self.clients.notify_many(self.clients.connection_closed(conn))

    def consumer_list(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        group = fields_of(req.ext_fields).str("consumerGroup")
        ids = self.clients.consumer_ids(group)
        if not ids:
            return req.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps({"consumerIdList": ids}))

    # --- offsets --------------------------------------------------------------------------------
    def query_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        f = fields_of(req.ext_fields)
        group, topic, queue_id = f.str("consumerGroup"), f.str("topic"), f.int("queueId")
        offset = self.store.offsets.query(group, topic, queue_id)
        if offset >= 0:
            return req.response(ResponseCode.SUCCESS, None, {"offset": str(offset)})
        zero_if_not_found = f.opt("setZeroIfNotFound")
        if zero_if_not_found is not None and zero_if_not_found.strip().lower() == "false":
            return req.response(
                ResponseCode.QUERY_NOT_FOUND,
                "Not found, do not set to zero, maybe this group boot first",
            )
        # a new group on a queue that still starts at 0: read it from the beginning (RocketMQ does
        # when offset 0 is still in memory; everything is, here)
        if self.store.min_offset(topic, queue_id) <= 0:
            return req.response(ResponseCode.SUCCESS, None, {"offset": "0"})
        return req.response(
            ResponseCode.QUERY_NOT_FOUND,
            "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
        )

    def update_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        f = fields_of(req.ext_fields)
        group, topic = f.str("consumerGroup"), f.str("topic")
        queue_id, offset = f.int("queueId"), f.long("commitOffset")
        if self.store.topics.get(topic) is None:
            return req.response(ResponseCode.TOPIC_NOT_EXIST, f"Topic {topic} not exist!")
        self.store.offsets.commit(group, topic, queue_id, offset)
        return req.response(ResponseCode.SUCCESS)

    # --- orderly consumption's locks ------------------------------------------------------------
    @staticmethod
    def _client_id(conn: Connection, doc: dict[str, Any]) -> str | None:
        """The body's clientId, when it is the connection's own (or the connection has sent no
        heartbeat yet); None when it names another client (a lock is not another's to take or free)."""
        given = str(doc.get("clientId", ""))
        own = conn.attrs.get("client_id")
        return given if own is None or own == given else None

    def lock(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        doc = _body(req)
        client_id = self._client_id(conn, doc)
        if client_id is None:
            return req.response(
                ResponseCode.SYSTEM_ERROR, "clientId is not the client of this connection"
            )
        locked = self.clients.try_lock(str(doc.get("consumerGroup", "")), client_id, _queues(doc))
        body = {"lockOKMQSet": [{"topic": t, "brokerName": b, "queueId": q} for t, b, q in locked]}
        return req.response(ResponseCode.SUCCESS, body=jsonbody.dumps(body))

    def unlock(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        doc = _body(req)
        client_id = self._client_id(conn, doc)
        if client_id is None:
            return req.response(
                ResponseCode.SYSTEM_ERROR, "clientId is not the client of this connection"
            )
        self.clients.unlock(str(doc.get("consumerGroup", "")), client_id, _queues(doc))
        return req.response(ResponseCode.SUCCESS)
