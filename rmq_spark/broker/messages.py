"""Messages between the gRPC protocol and the store: validating what producers send and building
what consumers receive (``apache.rocketmq.v2.Message``).

Send rules follow the Apache proxy (reference ``grpc_protocol.md`` section 3); each failure is an
:class:`RpcStatusError` with the proxy's code.  On the way out, properties the broker keeps for
itself (:data:`SYSTEM_PROPERTIES`) are hidden; ``__SHARDINGKEY`` and ``__transactionId__`` are not,
as with the proxy.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from google.protobuf import timestamp_pb2
from rocketmq.grpc_protocol import definition_pb2 as D

from rmq_spark.access import rules as V
from rmq_spark.broker.codes import Code, RpcStatusError
from rmq_spark.services.core import DEFAULT_CLUSTER, stamp_send
from rmq_spark.store import layout as L
from rmq_spark.store.config import TopicConfig
from rmq_spark.store.encode import Row
from rmq_spark.store.inflate import CodecUnavailableError, InflateError, inflate_body, inflate_gzip
from rmq_spark.store.message import Message, MessageExt, tags_code
from rmq_spark.store.properties import encode_properties

log = logging.getLogger("rmq_spark.broker")

__all__ = [
    "SYSTEM_PROPERTIES",
    "MessageType",
    "Outgoing",
    "checked_group",
    "checked_topic",
    "message_type_of",
    "parse_send",
    "timestamp_ms",
    "to_proto",
]


class MessageType:
    """``apache.rocketmq.v2.MessageType`` as plain ints (protobuf's enum wrapper is slow): every
    value, spelled out for a type checker (tests/broker/test_broker_codes.py holds the list to the
    enum)."""

    MESSAGE_TYPE_UNSPECIFIED = D.MessageType.MESSAGE_TYPE_UNSPECIFIED
    NORMAL = D.MessageType.NORMAL
    FIFO = D.MessageType.FIFO
    DELAY = D.MessageType.DELAY
    TRANSACTION = D.MessageType.TRANSACTION
    LITE = D.MessageType.LITE
    PRIORITY = D.MessageType.PRIORITY


_IDENTITY, _GZIP, _UNSPECIFIED = (
    D.Encoding.IDENTITY,
    D.Encoding.GZIP,
    D.Encoding.ENCODING_UNSPECIFIED,
)
_MD5 = D.DigestType.MD5

# never shown to clients as user properties, never accepted from them: one definition, with the
# sink's (rmq_spark.store.validation)
SYSTEM_PROPERTIES = V.RESERVED_PROPERTIES

MAX_MESSAGE_ID_CHARS = 128
_TYPE_NAMES = {
    MessageType.NORMAL: "NORMAL",
    MessageType.FIFO: "FIFO",
    MessageType.DELAY: "DELAY",
    MessageType.TRANSACTION: "TRANSACTION",
    MessageType.PRIORITY: "NORMAL",  # priorities are not kept apart: stored as normal messages
}


@dataclass(slots=True)
class Outgoing:
    """A validated message of a SendMessage request (its queue chosen later)."""

    message_id: str
    type: int
    topic: TopicConfig
    body: bytes
    properties: dict[str, str]  # with UNIQ_KEY
    sys_flag: int
    born_ms: int
    born_host: str
    deliver_ms: int = 0  # a delayed message's delivery time, else 0
    queue_id: int = 0
    _message: Message | None = None

    @property
    def message(self) -> Message:
        """The store message (made once: the put hooks and the recall handle read the same one)."""
        if self._message is None:
            self._message = Message(
                topic=self.topic.topic_name, body=self.body, properties=self.properties, queue_id=self.queue_id,
                sys_flag=self.sys_flag, born_timestamp_ms=self.born_ms, born_host=self.born_host,
            )  # fmt: skip
        return self._message

    def row(self) -> Row:
        """The record to store, for a message no put hook acts on (``BrokerCore.send``)."""
        p = self.properties
        tags = p.get(L.P_TAGS)
        return (
            self.topic.topic_name, self.queue_id, self.body, p, encode_properties(p), tags_code(tags) if tags else 0,
            0, self.sys_flag, self.born_ms, self.born_host, 0, 0, 0,
        )  # fmt: skip


_CONTROL_OR_SPACE = re.compile(r"[\x00-\x20\x7f]")  # message ids: no control characters, no space


def checked_topic(name: str, allow_system: bool = False) -> str:
    """``name`` if it is a legal topic to read (:func:`rmq_spark.broker.access.topic_name`)."""
    from rmq_spark.broker.access import Use, topic_name

    return topic_name(name, Use.READ, system_reads=allow_system)


def checked_group(name: str) -> str:
    """``name`` if it is a legal consumer group (:func:`rmq_spark.broker.access.group_name`)."""
    from rmq_spark.broker.access import group_name

    return group_name(name)


def timestamp_ms(ts: timestamp_pb2.Timestamp) -> int:
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def _set_ms(ts: timestamp_pb2.Timestamp, ms: int) -> None:
    ts.seconds, ts.nanos = divmod(int(ms), 1000)
    ts.nanos *= 1_000_000


def _decoded_body(body: bytes, enc: int, body_max_bytes: int) -> bytes:
    """A body sent with a non-identity encoding, decoded (bounded: a zip bomb stops at the limit;
    a truncated stream is refused, not stored as its prefix)."""
    if enc == _GZIP:
        try:
            return inflate_gzip(body, body_max_bytes, "the gzip message body")
        except InflateError as e:
            over = "more than" in str(e)
            raise RpcStatusError(
                Code.MESSAGE_BODY_TOO_LARGE if over else Code.MESSAGE_CORRUPTED, str(e)
            ) from None
    raise RpcStatusError(Code.BAD_REQUEST, f"unsupported body encoding {enc}")


@functools.lru_cache(maxsize=1024)
def _ip_literal(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def parse_send(
    pm: D.Message,
    topic: TopicConfig,
    *,
    now_ms: int,
    body_max_bytes: int,
    max_delay_ms: int,
    peer_host: Callable[[], str] = lambda: "127.0.0.1",
    cluster: str = DEFAULT_CLUSTER,
) -> Outgoing:
    """Validate one message of a SendMessage request against ``topic`` and build the store
    message (queue chosen later).  Raises :class:`RpcStatusError` naming the problem.  Stored
    with ``CLUSTER`` (``cluster``), ``MSG_REGION`` and ``TRACE_ON``, as the Apache proxy's sends
    are (its broker's SendMessageProcessor adds them, in local and cluster mode alike)."""
    sp = pm.system_properties
    body = pm.body
    enc = sp.body_encoding
    if enc != _IDENTITY and enc != _UNSPECIFIED:
        body = _decoded_body(body, enc, body_max_bytes)
    if not body or len(body) > body_max_bytes:
        code, problem = V.body_problem(len(body), body_max_bytes)  # type: ignore[misc]
        raise RpcStatusError(getattr(Code, code), problem)
    mid = sp.message_id
    if not mid or len(mid) > MAX_MESSAGE_ID_CHARS or _CONTROL_OR_SPACE.search(mid) is not None:
        raise RpcStatusError(
            Code.ILLEGAL_MESSAGE_ID, f"message id {mid[:40]!r} is empty or malformed"
        )
    user = pm.user_properties
    props = _user_properties(user) if user else {}
    if sp.HasField("tag"):
        tag = sp.tag
        problem = V.tag_problem(tag)
        if problem is not None:
            raise RpcStatusError(Code.ILLEGAL_MESSAGE_TAG, problem)
        props[L.P_TAGS] = tag
    if sp.keys:
        keys = list(sp.keys)
        for key in keys:
            problem = V.key_problem(key)
            if problem is not None:
                raise RpcStatusError(Code.ILLEGAL_MESSAGE_KEY, problem)
        props[L.P_KEYS] = L.KEY_SEPARATOR.join(keys)
    group = sp.message_group if sp.HasField("message_group") else None
    deliver_ms = timestamp_ms(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else 0
    mtype = sp.message_type
    if mtype != MessageType.NORMAL or group is not None or deliver_ms:  # the plain case skips these
        mtype = _checked_type(mtype, group, deliver_ms)
    if not topic.accepts(_TYPE_NAMES[mtype]):
        raise RpcStatusError(
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"topic {topic.topic_name!r} accepts {topic.message_type} messages, not {_TYPE_NAMES[mtype]}",
        )
    if deliver_ms:
        problem = V.delivery_problem(deliver_ms, now_ms, max_delay_ms)
        if problem is not None:
            raise RpcStatusError(Code.ILLEGAL_DELIVERY_TIME, problem)
        if deliver_ms > now_ms:
            props[L.P_TIMER_DELIVER_MS] = str(deliver_ms)
        else:
            deliver_ms = 0  # already due: an ordinary message
    if group is not None:
        props[L.P_SHARDING_KEY] = group
    props[L.P_UNIQ_KEY] = mid
    stamp_send(props, cluster)
    sys_flag = 0
    if mtype == MessageType.TRANSACTION:
        props[L.P_TRAN_MSG] = "true"
        props[L.P_PGROUP] = (
            topic.topic_name
        )  # gRPC producers have no group: the proxy uses the topic
        props[L.P_TRANSACTION_ID] = mid
        sys_flag = L.TRANSACTION_PREPARED_TYPE
    born = sp.born_timestamp  # unset: zero
    born_ms = born.seconds * 1000 + born.nanos // 1_000_000
    return Outgoing(
        mid, mtype, topic, body, props, sys_flag, born_ms if born_ms > 0 else now_ms,
        _ip_literal(sp.born_host) or peer_host(), deliver_ms,  # never resolve names a client sends
    )  # fmt: skip


def _user_properties(user: Mapping[str, str]) -> dict[str, str]:
    props: dict[str, str] = {}
    size = 0
    for k, v in user.items():
        problem = V.property_key_problem(k)
        if problem is not None:
            raise RpcStatusError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, problem)
        problem = V.property_value_problem(k, v)
        if problem is not None:
            raise RpcStatusError(Code.BAD_REQUEST, problem)
        props[k] = v
        size += len(k.encode()) + len(v.encode())
    problem = V.properties_size_problem(len(props), size)
    if problem is not None:
        raise RpcStatusError(Code.MESSAGE_PROPERTIES_TOO_LARGE, problem)
    return props


def _checked_type(
    mtype: D.MessageType.ValueType, group: str | None, deliver_ms: int
) -> D.MessageType.ValueType:
    """The message type (inferred when unset), checked against the group and delivery time."""
    if group is not None:
        problem = V.group_problem(group)
        if problem is not None:
            raise RpcStatusError(Code.ILLEGAL_MESSAGE_GROUP, problem)
    mtype = mtype or _infer_type(group, deliver_ms)
    if mtype == MessageType.LITE:
        raise RpcStatusError(Code.UNSUPPORTED, "lite topics are not supported by this broker")
    if mtype not in _TYPE_NAMES:
        raise RpcStatusError(Code.BAD_REQUEST, f"unknown message type {mtype}")
    if mtype == MessageType.TRANSACTION and (group is not None or deliver_ms):
        raise RpcStatusError(
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            "a transactional message cannot have a message group or delivery time",
        )
    if mtype == MessageType.FIFO and group is None:
        raise RpcStatusError(
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a FIFO message needs a message group"
        )
    if mtype == MessageType.DELAY and not deliver_ms:
        raise RpcStatusError(
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a DELAY message needs a delivery timestamp"
        )
    return mtype


def _infer_type(group: str | None, deliver_ms: int) -> D.MessageType.ValueType:
    if group is not None:
        return MessageType.FIFO
    if deliver_ms:
        return MessageType.DELAY
    return MessageType.NORMAL


def message_type_of(ext: MessageExt) -> D.MessageType.ValueType:
    p = ext.properties
    if ext.sys_flag & L.TRANSACTION_MASK == L.TRANSACTION_COMMIT_TYPE or L.P_TRAN_MSG in p:
        return MessageType.TRANSACTION
    if L.P_SHARDING_KEY in p:
        return MessageType.FIFO
    if L.P_TIMER_OUT_MS in p or L.P_TIMER_DELIVER_MS in p or L.P_DELAY in p:
        return MessageType.DELAY
    return MessageType.NORMAL


def _deliver_ms(p: dict[str, str]) -> int:
    for key in (L.P_TIMER_OUT_MS, L.P_TIMER_DELIVER_MS):
        v = p.get(key)
        if v and v.isdigit():
            return int(v)
    return 0


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _delivered_body(ext: MessageExt) -> bytes:
    """The body a gRPC consumer gets: a record a remoting producer compressed (sysflag COMPRESSED)
    inflated, as the proxy's client-side decoding does (it is sent as IDENTITY); a body that does
    not inflate within the limit (a poison record) as stored, with a warning naming it."""
    if not ext.sys_flag & L.FLAG_COMPRESSED:
        return ext.body
    try:
        return inflate_body(ext.body, ext.sys_flag, what="the stored body")
    except (InflateError, CodecUnavailableError) as e:
        log.warning("message at CommitLog offset %d (topic %s) delivered as stored: %s", ext.commitlog_offset,
                    ext.topic, e)  # fmt: skip
        return ext.body


def to_proto(
    ext: MessageExt,
    *,
    topic: str | None = None,
    namespace: str = "",
    receipt_handle: str | None = None,
    delivery_attempt: int | None = None,
    invisible_ms: int | None = None,
) -> D.Message:
    """The protocol form of a stored message.  ``topic`` overrides the name shown (a retry copy is
    shown under its original topic)."""
    p = ext.properties
    body = _delivered_body(ext)
    out = D.Message(body=body)
    out.topic.name = topic or ext.topic
    out.topic.resource_namespace = namespace
    user = out.user_properties
    for k, v in p.items():
        if k not in SYSTEM_PROPERTIES:
            user[k] = v
    sp = out.system_properties
    tag = p.get(L.P_TAGS)
    if tag:
        sp.tag = tag
    keys = p.get(L.P_KEYS)
    if keys:
        sp.keys.extend(k for k in keys.split(L.KEY_SEPARATOR) if k)
    sp.message_id = ext.client_msg_id
    sp.body_digest.type = _MD5
    sp.body_digest.checksum = hashlib.md5(body).hexdigest().upper()
    sp.body_encoding = _IDENTITY
    sp.message_type = message_type_of(ext)
    _set_ms(sp.born_timestamp, ext.born_timestamp_ms)
    sp.born_host = ext.born_host
    _set_ms(sp.store_timestamp, ext.store_timestamp_ms)
    sp.store_host = _host_port(ext.store_host, ext.store_port)
    deliver = _deliver_ms(p)
    if deliver:
        _set_ms(sp.delivery_timestamp, deliver)
    group = p.get(L.P_SHARDING_KEY)
    if group:
        sp.message_group = group
    sp.queue_id = ext.queue_id
    sp.queue_offset = ext.queue_offset
    sp.delivery_attempt = (
        delivery_attempt if delivery_attempt is not None else ext.reconsume_times + 1
    )
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if invisible_ms is not None:
        sp.invisible_duration.FromMilliseconds(invisible_ms)
    if ext.topic.startswith(L.DLQ_GROUP_TOPIC_PREFIX):
        sp.dead_letter_queue.topic = p.get(L.P_DLQ_ORIGIN_TOPIC, "")
        sp.dead_letter_queue.message_id = p.get(L.P_DLQ_ORIGIN_MESSAGE_ID, ext.client_msg_id)
    return out
