"""The producer's requests (``SendMessageProcessor``): SEND_MESSAGE, SEND_MESSAGE_V2 (the same
header under one-letter names), SEND_BATCH_MESSAGE, and the consumer's CONSUMER_SEND_MSG_BACK.

Messages go through :meth:`BrokerCore.send`, so a delay level (``DELAY``), a delivery time or a
transactional half (``TRAN_MSG``) is handled by the same services as a gRPC send.  The answer
(``SendMessageResponseHeader``) names the stored record: ``msgId`` is its offsetMsgId (store host
and CommitLog offset), ``queueId`` / ``queueOffset`` its place; a batch's ``msgId`` lists every
record's, comma-separated.

A message sent to ``%RETRY%group`` that has been reconsumed ``maxReconsumeTimes`` times goes to
``%DLQ%group`` instead, and so does a message sent back by CONSUMER_SEND_MSG_BACK; otherwise a
sent-back message is stored in ``%RETRY%group`` on delay level ``delayLevel`` (0: ``3 +
reconsumeTimes``), carrying ``RETRY_TOPIC`` (its first topic), ``ORIGIN_MESSAGE_ID`` and its
reconsume count plus one.
"""

from __future__ import annotations

import logging
import random
import struct
from typing import Any

from rmq_spark.errors import ConfigError, DiskFullError, MessageIllegalError, RmqError
from rmq_spark.remoting.codes import RequestCode as R
from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.headers import Fields, HeaderError, fields_of
from rmq_spark.remoting.requests import may_read
from rmq_spark.remoting.server import Connection
from rmq_spark.services.core import DEFAULT_CLUSTER, HOOK_KEYS, stamp_send
from rmq_spark.store import layout as L
from rmq_spark.store.inflate import check_compressed_body
from rmq_spark.store.message import Message, offset_msg_id, tags_code
from rmq_spark.store.properties import decode_properties, encode_properties
from rmq_spark.store.status import PutStatus
from rmq_spark.store.validation import check_topic_cached

__all__ = ["SendProcessor", "decode_batch_body"]

log = logging.getLogger("rmq_spark.remoting")

DEFAULT_MAX_RECONSUME_TIMES = 16  # SubscriptionGroupConfig.retryMaxTimes
RETRY_PREFIX = L.RETRY_GROUP_TOPIC_PREFIX
DLQ_PREFIX = L.DLQ_GROUP_TOPIC_PREFIX
P_CRC = "__CRC32#"

# One message of a SEND_BATCH_MESSAGE body (MessageDecoder.encodeMessage):
#   +-----------+-------+---------+------+---------+------+-----------+------------+
#   | totalSize | magic | bodyCRC | flag | bodyLen | body | propsLen  | properties |
#   | int32     | int32 | int32   | int32| int32   |      | int16     |            |
#   +-----------+-------+---------+------+---------+------+-----------+------------+
_BATCH_HEAD = struct.Struct(">iiiii")
_PROPS_LEN = struct.Struct(">h")

_PUT_CODES = {
    PutStatus.PUT_OK: ResponseCode.SUCCESS,
    PutStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
}


def decode_batch_body(
    body: bytes, body_max_bytes: int = L.BODY_MAX_BYTES
) -> list[tuple[int, bytes, dict[str, str]]]:
    """(flag, body, properties) of each message of a batch; HeaderError naming the message and
    its fault when it does not parse: sizes that overrun the message or the request, an empty
    body, a negative properties length, properties that are not text."""
    out = []
    pos, n = 0, len(body)
    while pos < n:
        if n - pos < _BATCH_HEAD.size + 2:
            raise HeaderError(f"batch message at byte {pos} is truncated ({n - pos} bytes left)")
        total, _magic, _crc, flag, blen = _BATCH_HEAD.unpack_from(body, pos)
        end = pos + total
        if total < _BATCH_HEAD.size + 2 or end > n:
            raise HeaderError(
                f"batch message at byte {pos} has a bad size ({total}; {n - pos} bytes left)"
            )
        p = pos + _BATCH_HEAD.size
        if blen <= 0 or p + blen + 2 > end:
            raise HeaderError(f"batch message at byte {pos} has a bad body length ({blen}; its size is {total})"
                              if blen else f"batch message at byte {pos} has an empty body")  # fmt: skip
        if blen > body_max_bytes:
            raise HeaderError(
                f"batch message at byte {pos} has a body of {blen} bytes; the limit is {body_max_bytes}"
            )
        mbody = body[p : p + blen]
        (plen,) = _PROPS_LEN.unpack_from(body, p + blen)
        q = p + blen + 2
        if plen < 0 or q + plen != end:
            raise HeaderError(f"batch message at byte {pos} has a bad properties length ({plen}; "
                              f"{end - q} bytes left in the message)")  # fmt: skip
        try:
            props = decode_properties(body[q : q + plen]) if plen else {}
        except (UnicodeDecodeError, ValueError) as e:
            raise HeaderError(
                f"batch message at byte {pos} has properties that do not decode: {e}"
            ) from None
        out.append((flag, mbody, props))
        pos = end
    return out


def _peer(conn: Connection) -> tuple[str, int]:
    host, _, port = conn.peer.rpartition(":")
    try:
        return host or "127.0.0.1", int(port)
    except ValueError:
        return "127.0.0.1", 0


class SendProcessor:
    def __init__(self, core: Any, broker_name: str, cluster: str = DEFAULT_CLUSTER) -> None:
        self.core = core
        self.store = core.store
        self.broker_name = broker_name
        self.cluster = cluster

    # --- helpers --------------------------------------------------------------------------------
    def _topic_config(self, req: RemotingCommand, topic: str) -> tuple[Any, RemotingCommand | None]:
        try:
            check_topic_cached(topic, allow_system=topic.startswith((RETRY_PREFIX, DLQ_PREFIX)))
        except MessageIllegalError as e:
            code = (
                ResponseCode.NO_PERMISSION
                if L.is_system_topic(topic)
                else ResponseCode.SYSTEM_ERROR
            )
            return None, req.response(
                code, f"Sending message to topic[{topic}] is forbidden or invalid: {e}"
            )
        try:
            cfg = self.store.topics.get_or_create(topic)
        except ConfigError:
            return None, req.response(ResponseCode.TOPIC_NOT_EXIST,
                                      f"topic[{topic}] not exist, apply first please!")  # fmt: skip
        if not cfg.writable:
            return None, req.response(ResponseCode.NO_PERMISSION,
                                      f"the topic[{topic}] sending message is forbidden")  # fmt: skip
        return cfg, None

    def _store(self, req: RemotingCommand, items: list[Any]) -> tuple[Any, RemotingCommand | None]:
        try:
            put = self.core.send(items)
        except MessageIllegalError as e:
            return None, req.response(ResponseCode.MESSAGE_ILLEGAL, str(e))
        except DiskFullError as e:  # RocketMQ's answer when its disk is full; reads go on
            return None, req.response(
                ResponseCode.SERVICE_NOT_AVAILABLE, f"service not available now: {e}"
            )
        except RmqError as e:
            return None, req.response(ResponseCode.SYSTEM_ERROR, str(e))
        code = _PUT_CODES.get(put.status, ResponseCode.SYSTEM_ERROR)
        if put.append is None or code not in (
            ResponseCode.SUCCESS,
            ResponseCode.FLUSH_DISK_TIMEOUT,
        ):
            return None, req.response(code, f"put failed: {put.status.value}")
        return put, None

    def _answer(
        self, req: RemotingCommand, put: Any, queue_id: int, uniq_key: str | None = None
    ) -> RemotingCommand:
        a = put.append
        code = _PUT_CODES[put.status]
        phys = a.phys_list()
        msg_id = (
            offset_msg_id(a.store_host, a.store_port, phys[0])
            if len(phys) == 1
            else ",".join(a.msg_ids)
        )
        header = {"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(a.queue_list()[0]),
                  "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}  # fmt: skip
        if uniq_key:
            # a TransactionMQProducer's TransactionSendResult.transactionId is this field
            header["transactionId"] = uniq_key
        return req.response(code, None, header)

    def _item(self, msg: Message) -> Any:
        """A row (the store's fast path) for a message no put hook acts on, else the message."""
        props = msg.properties
        if HOOK_KEYS.isdisjoint(props):
            tags = props.get(L.P_TAGS)
            return (msg.topic, msg.queue_id, msg.body, props, encode_properties(props), tags_code(tags) if tags else 0,
                    msg.flag, msg.sys_flag, msg.born_timestamp_ms, msg.born_host, msg.born_port,
                    msg.reconsume_times, 0)  # fmt: skip
        return msg

    def _retry_or_dlq(self, f: Fields, topic: str, reconsume_times: int) -> tuple[str, bool]:
        """(topic to store in, whether it became the DLQ) for a message sent to a retry topic."""
        if not topic.startswith(RETRY_PREFIX):
            return topic, False
        max_times = f.int("maxReconsumeTimes", DEFAULT_MAX_RECONSUME_TIMES)
        if reconsume_times >= max_times:
            return DLQ_PREFIX + topic[len(RETRY_PREFIX) :], True
        return topic, False

    def _compressed_problem(
        self, req: RemotingCommand, bodies: list[bytes], sys_flag: int
    ) -> RemotingCommand | None:
        """MESSAGE_ILLEGAL when a body flagged COMPRESSED does not inflate within the body limit
        (the readers could never serve it: refused here rather than stored as a poison record)."""
        if not sys_flag & L.FLAG_COMPRESSED:
            return None
        try:
            for body in bodies:
                check_compressed_body(body, sys_flag, self.store.config.body_max_bytes)
        except MessageIllegalError as e:
            return req.response(ResponseCode.MESSAGE_ILLEGAL, str(e))
        return None

    # --- SEND_MESSAGE / SEND_MESSAGE_V2 ---------------------------------------------------------
    def send(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        # the ext fields are the request table's canonical header (long names, decoded once)
        f = fields_of(req.ext_fields)
        topic = f.str("topic")
        f.str("producerGroup")
        queue_id = f.int("queueId")
        sys_flag = f.int("sysFlag")
        born_ms = f.long("bornTimestamp")
        flag = f.int("flag")
        reconsume_times = f.int("reconsumeTimes", 0)
        if (
            f.bool("batch") or req.code == R.SEND_BATCH_MESSAGE
        ):  # code 320 is a batch, flagged or not
            return self._send_batch(conn, req, f)
        refused = self._compressed_problem(req, [req.body], sys_flag)
        if refused is not None:
            return refused
        props = stamp_send(
            decode_properties(f.str("properties", "")), self.cluster
        )  # as Apache 5.x
        props.pop(P_CRC, None)
        topic, to_dlq = self._retry_or_dlq(f, topic, reconsume_times)
        cfg, error = self._topic_config(req, topic)
        if error is not None:
            return error
        if to_dlq:
            props.pop(L.P_DELAY, None)
            queue_id = 0
        queue_id = self._queue(cfg, queue_id)
        if queue_id < 0:
            return req.response(ResponseCode.SYSTEM_ERROR,
                                f"request queueId[{f.int('queueId')}] is illegal, topic {topic} has "
                                f"{cfg.write_queue_nums} write queues")  # fmt: skip
        host, port = _peer(conn)
        msg = Message(
            topic, req.body, props, queue_id, flag, sys_flag, born_ms, host, port, reconsume_times
        )
        put, error = self._store(req, [self._item(msg)])
        if error is not None:
            return error
        if to_dlq:
            self._dead(
                topic, props.get(L.P_RETRY_TOPIC, topic), "reconsumed maxReconsumeTimes times"
            )
        return self._answer(req, put, queue_id, props.get(L.P_UNIQ_KEY))

    @staticmethod
    def _queue(cfg: Any, queue_id: int) -> int:
        n = max(1, cfg.write_queue_nums)
        if queue_id < 0:
            return random.randrange(n)
        return queue_id if queue_id < n else -1

    def _send_batch(self, conn: Connection, req: RemotingCommand, f: Fields) -> RemotingCommand:
        topic = f.str("topic")
        cfg, error = self._topic_config(req, topic)
        if error is not None:
            return error
        queue_id = self._queue(cfg, f.int("queueId"))
        if queue_id < 0:
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"request queueId[{f.int('queueId')}] is illegal"
            )
        if topic.startswith(RETRY_PREFIX):
            return req.response(
                ResponseCode.MESSAGE_ILLEGAL, "batch request does not support retry group"
            )
        parts = decode_batch_body(req.body, self.store.config.body_max_bytes)
        if not parts:
            return req.response(ResponseCode.MESSAGE_ILLEGAL, "the batch is empty")
        host, port = _peer(conn)
        sys_flag, born_ms = f.int("sysFlag"), f.long("bornTimestamp")
        refused = self._compressed_problem(req, [body for _flag, body, _props in parts], sys_flag)
        if refused is not None:
            return refused
        items = []
        for flag, body, props in parts:
            if L.P_DELAY in props or L.P_TRAN_MSG in props:
                return req.response(ResponseCode.MESSAGE_ILLEGAL,
                                    "a batch holds neither delayed nor transactional messages")  # fmt: skip
            items.append(
                self._item(
                    Message(topic, body, props, queue_id, flag, sys_flag, born_ms, host, port)
                )
            )
        put, error = self._store(req, items)
        if error is not None:
            return error
        return self._answer(req, put, queue_id)

    # --- CONSUMER_SEND_MSG_BACK -----------------------------------------------------------------
    def send_back(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        f = fields_of(req.ext_fields)
        offset, group = f.long("offset"), f.str("group")
        delay_level = f.int("delayLevel")
        max_times = f.int("maxReconsumeTimes", DEFAULT_MAX_RECONSUME_TIMES)
        msg = self.store.look_message_by_offset(offset)
        if msg is None:
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}"
            )
        if not may_read(req.account, msg.topic):
            # only a message the caller could consume goes to its retry topic (which it may read)
            return req.response(ResponseCode.NO_PERMISSION, f"No SUB permission for the topic of the message at "
                                                            f"offset {offset} (accessKey {req.account.access_key})")  # fmt: skip
        # stored as Apache's consumerSendMsgBack stores it: the original's properties with
        # RETRY_TOPIC, WAIT=false, DELAY (0 for the DLQ) and ORIGIN_MESSAGE_ID = the existing one
        # else the original's offsetMsgId (the request's originMsgId is not used); REAL_TOPIC /
        # REAL_QID kept (a retry's are set again on its way through the schedule topic);
        # SYSFLAG as the original's (a committed message stays COMMIT, its TRAN_MSG kept)
        props = dict(msg.properties)
        props.pop(P_CRC, None)
        props.setdefault(L.P_RETRY_TOPIC, msg.topic)
        props[L.P_WAIT] = "false"
        if not props.get(L.P_ORIGIN_MESSAGE_ID):
            props[L.P_ORIGIN_MESSAGE_ID] = msg.msg_id
        if msg.reconsume_times >= max_times or delay_level < 0:
            topic = DLQ_PREFIX + group
            props[L.P_DELAY] = "0"
        else:
            topic = RETRY_PREFIX + group
            props[L.P_DELAY] = str(delay_level or 3 + msg.reconsume_times)
        _cfg, error = self._topic_config(req, topic)
        if error is not None:
            return error
        new = Message(topic, msg.body, props, 0, msg.flag, msg.sys_flag,
                      msg.born_timestamp_ms, msg.born_host, msg.born_port, msg.reconsume_times + 1)  # fmt: skip
        _put, error = self._store(req, [self._item(new)])
        if error is not None:
            return error
        if topic.startswith(DLQ_PREFIX):
            self._dead(
                topic,
                msg.topic if not msg.topic.startswith(RETRY_PREFIX) else props[L.P_RETRY_TOPIC],
                "the consumer gave up on it"
                if delay_level < 0
                else f"reconsumed {max_times} times",
            )
        return req.response(ResponseCode.SUCCESS)

    def _dead(self, dlq: str, origin: str, why: str) -> None:
        group = dlq[len(DLQ_PREFIX) :]
        log.info("DLQ: a message of topic %s moved to %s (%s)", origin, dlq, why)
        traffic = getattr(self.core, "traffic", None)
        if traffic is not None:
            traffic.to_dlq(origin, group)
