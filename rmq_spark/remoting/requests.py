"""The one table of every remoting request code the broker serves: its header fields (name, type,
range, required), its body, who may call it, and its limits.  The NameServer's codes are rows of
the same kind (:data:`rmq_spark.remoting.namesrv_requests.NAMESRV_REQUESTS`), behind the same gate.

Every request passes :class:`RequestGate` (``Processor.before``) before its handler runs:

1. a code without a row is refused (``REQUEST_CODE_NOT_SUPPORTED``): a new handler cannot skip
   the table;
2. with ``--acl``, the caller is authenticated (RocketMQ's remoting signature over the raw ext
   fields and the body: :meth:`rmq_spark.access.auth.AccessControl.authenticate_remoting`);
3. the header is decoded once, by its row: each field by its type and range, topic and group
   names by the one validation both protocol fronts share (:func:`rmq_spark.access.names`); a
   missing, malformed or out-of-range field is answered ``SYSTEM_ERROR`` naming it, a body over
   the row's limit ``MESSAGE_ILLEGAL`` (sends) or ``SYSTEM_ERROR``;
4. the row's need (:class:`rmq_spark.access.names.Need`) is read from the decoded header -- the
   request as it will be executed -- and authorized (``NO_PERMISSION`` naming what is missing);
   a code run on the pool has its body parsed and step 4 done there (:meth:`RequestGate.finish`);
5. the request's ext fields are replaced by the decoded header in canonical form (long names,
   declared fields only), and ``req.header`` / ``req.account`` are set: a handler reads exactly
   what was authorized.  (SEND_MESSAGE_V2's one-letter fields are read only under their short
   names, so a request naming a topic twice cannot be authorized on one and stored to the other.)

Handlers whose target is only known once a record is read (VIEW_MESSAGE_BY_ID, CONSUMER_SEND_MSG_BACK,
END_TRANSACTION) check the record's topic with :func:`may_read` / :func:`may_publish`.

Why this module is long: it is the table itself, one row per request code, meant to be read whole
beside the gate that enforces it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from rmq_spark.access.auth import AccessControl, Account, Perm
from rmq_spark.access.names import AUTHENTICATED, Need
from rmq_spark.errors import (
    AuthenticationError,
    MessageIllegalError,
    PermissionDeniedError,
    RmqError,
)
from rmq_spark.remoting.codes import RequestCode as R
from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.remoting.command import FRAME_MAX_BYTES, RemotingCommand
from rmq_spark.store import layout as L
from rmq_spark.store.validation import check_group, check_topic_cached

__all__ = [
    "BROKER_REQUESTS",
    "V2_NAMES",
    "F",
    "HeaderProblem",
    "RequestGate",
    "Spec",
    "may_publish",
    "may_read",
]

INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
NONNEG32 = (0, INT32[1])
NONNEG64 = (0, INT64[1])
QUEUE_ID = (0, L.QUEUE_NUMS_MAX - 1)  # a topic has at most 1,024 queues
FIELD_MAX_CHARS = 32 * 1024  # any one string field (properties are bounded by the store's 32 KiB)
JSON_BODY_MAX_BYTES = 4 << 20
HEARTBEAT_MAX_GROUPS = 1024  # groups in one HeartbeatData, and subscriptions of one group


class HeaderProblem(RmqError, ValueError):
    """A request's header or body does not satisfy its row; ``code`` is the answer's code."""

    def __init__(self, message: str, code: int = ResponseCode.SYSTEM_ERROR) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class F:
    """One header field: ``kind`` str, int, long, bool, topic or group; ``bounds`` for numbers."""

    name: str
    kind: str = "str"
    required: bool = False
    bounds: tuple[int, int] | None = None
    max_chars: int = FIELD_MAX_CHARS
    check: Callable[[Any, str], Any] | None = None  # a further rule: (value, name) -> value


def _topic(value: str, name: str) -> str:
    try:
        check_topic_cached(value, allow_system=True)
    except MessageIllegalError as e:
        raise HeaderProblem(f"the custom header's field {name!r}: {e}") from None
    return value


def _group(value: str, name: str) -> str:
    try:
        check_group(value)
    except MessageIllegalError as e:
        raise HeaderProblem(f"the custom header's field {name!r}: {e}") from None
    return value


_NUMBER = re.compile(r"[+-]?[0-9]{1,20}")  # ASCII digits, as Long.parseLong reads a header


def _decode_field(spec: F, raw: str) -> Any:
    if not isinstance(raw, str):
        raise HeaderProblem(f"the custom header's field {spec.name!r} is not a string")
    if spec.kind in ("int", "long"):
        text = raw.strip()
        if not _NUMBER.fullmatch(text):
            raise HeaderProblem(
                f"the custom header's field {spec.name!r} is not a number: {raw[:40]!r}"
            )
        n = int(text)
        lo, hi = spec.bounds or (INT32 if spec.kind == "int" else INT64)
        if not lo <= n <= hi:
            raise HeaderProblem(
                f"the custom header's field {spec.name!r} is {n}: it must be in [{lo}, {hi}]"
            )
        return n
    if spec.kind == "bool":
        text = raw.strip().lower()
        if text not in ("true", "false", ""):
            raise HeaderProblem(
                f"the custom header's field {spec.name!r} is not true or false: {raw[:40]!r}"
            )
        return text == "true"
    if len(raw) > spec.max_chars:
        raise HeaderProblem(f"the custom header's field {spec.name!r} is {len(raw)} characters; "
                            f"the limit is {spec.max_chars}")  # fmt: skip
    if "\x00" in raw:
        raise HeaderProblem(f"the custom header's field {spec.name!r} holds a NUL character")
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise HeaderProblem(
            f"the custom header's field {spec.name!r} is not valid UTF-8 text"
        ) from None
    if spec.kind == "topic":
        return _topic(raw, spec.name)
    if spec.kind == "group":
        return _group(raw, spec.name)
    return raw


def _canonical(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --- needs: what a request touches, read from its decoded header ---------------------------------
NeedFn = Callable[[Mapping[str, Any], Any], Need]


def _read_topic(topic: str) -> tuple[str, Perm]:
    return (topic, Perm.SUB)


def need_topic(perm: Perm, *groups: str) -> NeedFn:
    """The header's ``topic`` with ``perm`` (DENY: any permission) and SUB on each named group field."""

    def need(h: Mapping[str, Any], _body: Any) -> Need:
        gs = tuple(h[g] for g in groups if h.get(g))
        return Need(topics=((h["topic"], perm),) if h.get("topic") else (), groups=gs)

    return need


def need_groups(*names: str) -> NeedFn:
    def need(h: Mapping[str, Any], _body: Any) -> Need:
        return Need(groups=tuple(h[n] for n in names if h.get(n)))

    return need


def need_admin(_h: Mapping[str, Any], _body: Any) -> Need:
    return Need(admin=True)


def need_authenticated(_h: Mapping[str, Any], _body: Any) -> Need:
    return AUTHENTICATED


def need_send(h: Mapping[str, Any], _body: Any) -> Need:
    """A send needs PUB on its topic; a retry topic (a consumer's send-back through its producer)
    its group's permission; a dead-letter or system topic an admin."""
    topic = h["topic"]
    if topic.startswith(L.RETRY_GROUP_TOPIC_PREFIX):
        return Need(groups=(_group(topic[len(L.RETRY_GROUP_TOPIC_PREFIX) :], "topic"),))
    if topic.startswith(L.DLQ_GROUP_TOPIC_PREFIX) or L.is_system_topic(topic):
        return Need(admin=True)
    return Need(topics=((topic, Perm.PUB),))


def need_send_back(h: Mapping[str, Any], _body: Any) -> Need:
    origin = h.get("originTopic")
    return Need(topics=((origin, Perm.SUB),) if origin else (), groups=(h["group"],))


# --- bodies --------------------------------------------------------------------------------------
def json_object(body: bytes, what: str) -> dict[str, Any]:
    """``body`` as a JSON object (fastjson's relaxed form is not needed: clients write JSON);
    HeaderProblem naming ``what`` otherwise.  Its size is the row's bound; its nesting, the
    decoder's (a RecursionError, past about a thousand levels, is a refusal like any other)."""
    if not body:
        raise HeaderProblem(f"the {what} body is empty")
    if len(body) > JSON_BODY_MAX_BYTES:
        raise HeaderProblem(
            f"the {what} body is {len(body)} bytes; the limit is {JSON_BODY_MAX_BYTES}"
        )
    try:
        text = body.decode(
            "utf-8"
        )  # as the Java clients write it (json.loads of bytes would guess UTF-16/32)
    except UnicodeDecodeError as e:
        raise HeaderProblem(f"the {what} body is not UTF-8 text (byte {e.start})") from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise HeaderProblem(
            f"the {what} body is not JSON this broker reads: it nests too deeply"
        ) from None
    except ValueError as e:
        raise HeaderProblem(f"the {what} body is not JSON: {str(e)[:120]}") from None
    if not isinstance(doc, dict):
        raise HeaderProblem(f"the {what} body is not a JSON object")
    return doc


def _str_of(item: Mapping[str, Any], key: str, what: str) -> str:
    value = item.get(key)
    if value is None:
        return ""
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise HeaderProblem(f"{what}.{key} is not a string")
    return str(value)


def _objects(doc: Mapping[str, Any], key: str, what: str) -> list[Mapping[str, Any]]:
    items = doc.get(key)
    if items is None:
        return []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise HeaderProblem(f"{what}.{key} is not a list of objects")
    return items


def heartbeat_body(body: bytes) -> dict[str, Any]:
    """A HeartbeatData checked for shape: clientID, producers' and consumers' group names valid,
    subscriptions' topics valid, expressions within the filter's limits."""
    doc = json_object(body, "HeartbeatData")
    if not _str_of(doc, "clientID", "HeartbeatData"):
        raise HeaderProblem("HeartbeatData has no clientID")
    producers = _objects(doc, "producerDataSet", "HeartbeatData")
    consumers = _objects(doc, "consumerDataSet", "HeartbeatData")
    if len(producers) + len(consumers) > HEARTBEAT_MAX_GROUPS:
        raise HeaderProblem(f"HeartbeatData names {len(producers) + len(consumers)} groups; "
                            f"the limit is {HEARTBEAT_MAX_GROUPS}")  # fmt: skip
    for p in producers:
        _group(_str_of(p, "groupName", "producerData"), "producerDataSet.groupName")
    for c in consumers:
        _group(_str_of(c, "groupName", "consumerData"), "consumerDataSet.groupName")
        subs = _objects(c, "subscriptionDataSet", "consumerData")
        if len(subs) > HEARTBEAT_MAX_GROUPS:
            raise HeaderProblem(f"consumerData {c['groupName']} subscribes to {len(subs)} topics; "
                                f"the limit is {HEARTBEAT_MAX_GROUPS}")  # fmt: skip
        for s in subs:
            _topic(_str_of(s, "topic", "subscriptionData"), "subscriptionData.topic")
            expr = s.get("subString")
            if expr is not None and (not isinstance(expr, str) or len(expr) > FIELD_MAX_CHARS):
                raise HeaderProblem(
                    f"subscriptionData.subString is not a string of at most {FIELD_MAX_CHARS} characters"
                )
            if not isinstance(s.get("subVersion", 0), (int, type(None))) or isinstance(
                s.get("subVersion"), bool
            ):
                raise HeaderProblem("subscriptionData.subVersion is not a number")
    return doc


def need_heartbeat(_h: Mapping[str, Any], doc: Any) -> Need:
    """SUB on every consumer group and every topic it subscribes to (a retry topic: its group's).
    Producer groups need no permission (as in RocketMQ): what a producer receives -- a
    transaction's check-back -- is sent only to producers that may publish to the half's topic."""
    groups: list[str] = []
    topics: list[tuple[str, Perm]] = []
    for c in doc.get("consumerDataSet") or []:
        groups.append(c["groupName"])
        for s in c.get("subscriptionDataSet") or []:
            topics.append(_read_topic(s["topic"]))
    return Need(topics=tuple(topics), groups=tuple(groups))


def lock_body(body: bytes) -> dict[str, Any]:
    doc = json_object(body, "LockBatchRequestBody")
    _group(_str_of(doc, "consumerGroup", "LockBatchRequestBody"), "consumerGroup")
    _str_of(doc, "clientId", "LockBatchRequestBody")
    mqs = _objects(doc, "mqSet", "LockBatchRequestBody")
    if len(mqs) > 4096:
        raise HeaderProblem(
            f"LockBatchRequestBody.mqSet holds {len(mqs)} queues; the limit is 4096"
        )
    for mq in mqs:
        _topic(_str_of(mq, "topic", "mqSet"), "mqSet.topic")
        q = mq.get("queueId", 0)
        if not isinstance(q, int) or isinstance(q, bool) or not QUEUE_ID[0] <= q <= QUEUE_ID[1]:
            raise HeaderProblem(f"mqSet.queueId {q!r} is not a queue id")
    return doc


def need_lock(_h: Mapping[str, Any], doc: Any) -> Need:
    return Need(topics=tuple({(mq["topic"], Perm.SUB) for mq in doc.get("mqSet") or []}),
                groups=(doc["consumerGroup"],))  # fmt: skip


def client_config_body(body: bytes) -> dict[str, Any]:
    doc = json_object(body, "CheckClientRequestBody")
    if doc.get("group"):
        _group(_str_of(doc, "group", "CheckClientRequestBody"), "group")
    sub = doc.get("subscriptionData")
    if sub is not None and not isinstance(sub, dict):
        raise HeaderProblem("CheckClientRequestBody.subscriptionData is not an object")
    return doc


def need_client_config(_h: Mapping[str, Any], doc: Any) -> Need:
    return Need(groups=(doc["group"],) if doc.get("group") else ())


# --- the rows ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """One request code: its header fields, its body (``body``: None = ignored and at most
    ``body_max`` bytes; a function = parsed and checked, its result what the need reads), who may
    call it, and the short names of its fields (SEND_MESSAGE_V2)."""

    code: int
    fields: tuple[F, ...] = ()
    need: NeedFn = need_authenticated
    body: Callable[[bytes], Any] | None = None
    body_max: int = 64 * 1024
    short_names: Mapping[str, str] | None = None
    message_body: bool = False  # the body is a message's (or a batch's): within the store's limit
    open: bool = False  # served to anyone, signed or not (the NameServer's reads): no ACL check


# SendMessageRequestHeaderV2's one-letter fields
V2_NAMES = {
    "a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId",
    "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes",
    "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch", "n": "brokerName",
}  # fmt: skip
_SEND_FIELDS = (
    F("producerGroup", "group", True), F("topic", "topic", True), F("defaultTopic", "str", False, max_chars=255),
    F("defaultTopicQueueNums", "int"), F("queueId", "int", True, (-1, QUEUE_ID[1])), F("sysFlag", "int", True),
    F("bornTimestamp", "long", True), F("flag", "int", True), F("properties", "str", max_chars=L.PROPERTY_MAX_BYTES),
    F("reconsumeTimes", "int", bounds=NONNEG32), F("unitMode", "bool"), F("maxReconsumeTimes", "int", bounds=(-1, INT32[1])),
    F("batch", "bool"), F("brokerName", "str", max_chars=255),
)  # fmt: skip
_TOPIC_QUEUE = (F("topic", "topic", True), F("queueId", "int", True, QUEUE_ID))
_PULL_FIELDS = (
    F("consumerGroup", "group", True), F("topic", "topic", True), F("queueId", "int", True, QUEUE_ID),
    F("queueOffset", "long", True, NONNEG64), F("maxMsgNums", "int", True, NONNEG32), F("sysFlag", "int", True),
    F("commitOffset", "long", True, (-1, INT64[1])), F("suspendTimeoutMillis", "long", True, NONNEG64),
    # the filter bounds an expression's length and answers SUBSCRIPTION_PARSE_FAILED (RocketMQ's code)
    F("subscription", "str", max_chars=FRAME_MAX_BYTES), F("subVersion", "long", True), F("expressionType", "str", max_chars=32),
    F("maxMsgBytes", "int", bounds=NONNEG32), F("brokerName", "str", max_chars=255),
)  # fmt: skip


def _rows(*specs: Spec) -> dict[int, Spec]:
    return {int(s.code): s for s in specs}


# fmt: off
BROKER_REQUESTS: dict[int, Spec] = _rows(
    Spec(R.SEND_MESSAGE, _SEND_FIELDS, need_send, body_max=16 << 20, message_body=True),
    Spec(R.SEND_MESSAGE_V2, _SEND_FIELDS, need_send, body_max=16 << 20, short_names=V2_NAMES, message_body=True),
    Spec(R.SEND_BATCH_MESSAGE, _SEND_FIELDS, need_send, body_max=16 << 20, short_names=V2_NAMES, message_body=True),
    Spec(R.CONSUMER_SEND_MSG_BACK, (F("offset", "long", True, NONNEG64), F("group", "group", True),
                                    F("delayLevel", "int", True), F("originMsgId", "str", max_chars=128),
                                    F("originTopic", "topic"), F("unitMode", "bool"),
                                    F("maxReconsumeTimes", "int", bounds=(-1, INT32[1]))), need_send_back),
    Spec(R.END_TRANSACTION, (F("producerGroup", "group", True), F("tranStateTableOffset", "long", bounds=NONNEG64),
                             F("commitLogOffset", "long", True, NONNEG64), F("commitOrRollback", "int", True),
                             F("fromTransactionCheck", "bool"), F("msgId", "str", max_chars=128),
                             F("transactionId", "str", max_chars=128))),
    Spec(R.HEART_BEAT, (), need_heartbeat, heartbeat_body, body_max=1 << 20),
    Spec(R.UNREGISTER_CLIENT, (F("clientID", "str", True, max_chars=512), F("producerGroup", "group"),
                               F("consumerGroup", "group")), need_groups("consumerGroup")),
    Spec(R.CHECK_CLIENT_CONFIG, (), need_client_config, client_config_body),
    Spec(R.GET_CONSUMER_LIST_BY_GROUP, (F("consumerGroup", "group", True),), need_groups("consumerGroup")),
    Spec(R.QUERY_CONSUMER_OFFSET, (F("consumerGroup", "group", True), *_TOPIC_QUEUE, F("setZeroIfNotFound", "bool")),
         need_topic(Perm.SUB, "consumerGroup")),
    Spec(R.UPDATE_CONSUMER_OFFSET, (F("consumerGroup", "group", True), *_TOPIC_QUEUE,
                                    F("commitOffset", "long", True, (L.OFFSET_MIN, L.OFFSET_MAX))), need_topic(Perm.SUB, "consumerGroup")),
    Spec(R.LOCK_BATCH_MQ, (), need_lock, lock_body, body_max=1 << 20),
    Spec(R.UNLOCK_BATCH_MQ, (), need_lock, lock_body, body_max=1 << 20),
    Spec(R.PULL_MESSAGE, _PULL_FIELDS, need_topic(Perm.SUB, "consumerGroup")),
    Spec(R.LITE_PULL_MESSAGE, _PULL_FIELDS, need_topic(Perm.SUB, "consumerGroup")),
    Spec(R.GET_MAX_OFFSET, _TOPIC_QUEUE, need_topic(Perm.DENY)),
    Spec(R.GET_MIN_OFFSET, _TOPIC_QUEUE, need_topic(Perm.DENY)),
    Spec(R.SEARCH_OFFSET_BY_TIMESTAMP, (*_TOPIC_QUEUE, F("timestamp", "long", True), F("boundaryType", "str", max_chars=16)),
         need_topic(Perm.DENY)),
    Spec(R.GET_EARLIEST_MSG_STORETIME, _TOPIC_QUEUE, need_topic(Perm.DENY)),
    Spec(R.VIEW_MESSAGE_BY_ID, (F("offset", "long", True, NONNEG64),)),
    Spec(R.QUERY_MESSAGE, (F("topic", "topic", True), F("key", "str", True, max_chars=L.PROPERTY_MAX_BYTES),
                           F("maxNum", "int", bounds=NONNEG32), F("beginTimestamp", "long"), F("endTimestamp", "long"),
                           F("_UNIQUE_KEY_QUERY", "bool")), need_topic(Perm.SUB)),
    Spec(R.UPDATE_AND_CREATE_TOPIC, (F("topic", "topic", True), F("defaultTopic", "str", max_chars=255),
                                     F("readQueueNums", "int", True, (1, L.QUEUE_NUMS_MAX)), F("writeQueueNums", "int", True, (1, L.QUEUE_NUMS_MAX)),
                                     F("perm", "int", bounds=(0, 15)), F("topicFilterType", "str", max_chars=32),
                                     F("topicSysFlag", "int"), F("order", "bool"), F("attributes", "str")), need_admin),
    Spec(R.GET_ALL_TOPIC_CONFIG),
    Spec(R.DELETE_TOPIC_IN_BROKER, (F("topic", "topic", True),), need_admin),
    Spec(R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG),
    Spec(R.INVOKE_BROKER_TO_RESET_OFFSET, (F("topic", "topic", True), F("group", "group", True),
                                           F("timestamp", "long", True), F("isForce", "bool"),
                                           F("offset", "long", bounds=NONNEG64), F("queueId", "int", bounds=(-1, QUEUE_ID[1]))),
         need_admin),
    Spec(R.GET_BROKER_RUNTIME_INFO),
    Spec(R.GET_TOPIC_STATS_INFO, (F("topic", "topic", True),), need_topic(Perm.DENY)),
    Spec(R.GET_TOPIC_CONFIG, (F("topic", "topic", True),), need_topic(Perm.DENY)),
    Spec(R.GET_CONSUME_STATS, (F("consumerGroup", "group", True), F("topic", "topic")),
         need_topic(Perm.SUB, "consumerGroup")),
    Spec(R.GET_CONSUMER_CONNECTION_LIST, (F("consumerGroup", "group", True),), need_groups("consumerGroup")),
    Spec(R.GET_PRODUCER_CONNECTION_LIST, (F("producerGroup", "group", True),), need_groups("producerGroup")),
    Spec(R.QUERY_TOPIC_CONSUME_BY_WHO, (F("topic", "topic", True),), need_topic(Perm.DENY)),
    Spec(R.QUERY_TOPICS_BY_CONSUMER, (F("group", "group", True),), need_groups("group")),
    Spec(R.GET_ROUTEINFO_BY_TOPIC, (F("topic", "topic", True),)),
)
# fmt: on


# --- one record's topic, for handlers that read it first -----------------------------------------
def may_read(account: Account | None, topic: str) -> bool:
    """May the caller (None: no ACL) read records of ``topic``?  System topics (halves, delayed
    and timer records): admins only; a retry or dead-letter topic: its group's permission."""
    return account is None or AccessControl.topic_allows(account, topic, Perm.SUB)


def may_publish(account: Account | None, topic: str) -> bool:
    return account is None or AccessControl.topic_allows(account, topic, Perm.PUB)


# --- the gate ------------------------------------------------------------------------------------
class RequestGate:
    """``Processor.before`` of the broker's remoting port (see the module docstring).
    ``body_max_bytes``: the store's message body limit."""

    def __init__(
        self,
        table: Mapping[int, Spec],
        acl: AccessControl | None,
        body_max_bytes: int = L.BODY_MAX_BYTES,
    ) -> None:
        self.table = table
        self.acl = acl
        self.body_max_bytes = body_max_bytes
        # codes run on the pool whose body finish() parses there, then authorizes (on the loop:
        # authenticated, header decoded); a HeartbeatData of 1,000 groups is ~10 ms of parsing
        self.deferred: frozenset[int] = frozenset()

    def check_covers(self, codes: Iterable[int]) -> None:
        """Every code a processor registers has a row (called when the broker starts)."""
        missing = sorted({int(c) for c in codes} - set(self.table))
        if missing:
            raise AssertionError(
                f"remoting request codes without a row in the request table: {missing}"
            )

    def __call__(self, conn: Any, req: RemotingCommand) -> RemotingCommand | None:
        spec = self.table.get(req.code)
        if spec is None:
            return req.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {req.code} not supported"
            )
        account: Account | None = None
        deferred = req.code in self.deferred  # body and need: finish(), on the pool
        try:
            if self.acl is not None and not spec.open:
                account = self.acl.authenticate_remoting(req.ext_fields, req.body)
            header, body = self.decode(replace(spec, body=None) if deferred else spec, req)
            if account is not None and not account.admin and not deferred:
                self._authorize(account, spec.need(header, body), req.code)
        except HeaderProblem as e:
            return req.response(e.code, str(e))
        except (AuthenticationError, PermissionDeniedError) as e:
            return req.response(ResponseCode.NO_PERMISSION, str(e))
        req.ext_fields = {k: _canonical(v) for k, v in header.items()}
        req.header = header
        req.account = account
        req.decoded_body = body
        if account is not None:
            conn.attrs["account"] = account
        return None

    def finish(self, conn: Any, req: RemotingCommand) -> RemotingCommand | None:
        """``Processor.before_blocking``: a :attr:`deferred` code's body parsed, need authorized."""
        spec = self.table.get(req.code) if req.code in self.deferred else None
        if spec is None or spec.body is None or req.decoded_body is not None:
            return None
        try:
            body = spec.body(req.body)
            if req.account is not None and not req.account.admin:
                self._authorize(req.account, spec.need(req.header or {}, body), req.code)
        except HeaderProblem as e:
            return req.response(e.code, str(e))
        except PermissionDeniedError as e:
            return req.response(ResponseCode.NO_PERMISSION, str(e))
        req.decoded_body = body
        return None

    def decode(self, spec: Spec, req: RemotingCommand) -> tuple[dict[str, Any], Any]:
        raw = req.ext_fields
        short = spec.short_names
        if short is not None and (req.code != R.SEND_BATCH_MESSAGE or "b" in raw):
            raw = {short[k]: v for k, v in raw.items() if k in short}
        header: dict[str, Any] = {}
        for f in spec.fields:
            value = raw.get(f.name)
            if value is None or (value == "" and f.kind != "str"):
                if f.required:
                    raise HeaderProblem(f"the custom header's field {f.name!r} is missing")
                continue
            decoded = _decode_field(f, value)
            header[f.name] = decoded if f.check is None else f.check(decoded, f.name)
        body_max = min(spec.body_max, self.body_max_bytes) if spec.message_body else spec.body_max
        size = len(req.body or b"")
        if spec.message_body:
            if size == 0:
                raise HeaderProblem("the message body is empty", ResponseCode.MESSAGE_ILLEGAL)
            if size > body_max:
                raise HeaderProblem(f"the message body is {size} bytes; the limit is {body_max} bytes",
                                    ResponseCode.MESSAGE_ILLEGAL)  # fmt: skip
        elif size > body_max:
            raise HeaderProblem(
                f"the request body is {size} bytes; request code {req.code} takes at most {body_max}"
            )
        body = spec.body(req.body) if spec.body is not None else None
        return header, body

    def _authorize(self, account: Account, need: Need, code: int) -> None:
        if need.admin:
            raise PermissionDeniedError(f"accessKey {account.access_key} is not an admin account: request code "
                                        f"{code} needs one")  # fmt: skip
        assert self.acl is not None
        for group in need.groups:
            self.acl.authorize(account, group=group)
        for topic, perm in need.topics:
            if not AccessControl.topic_allows(account, topic, perm):
                verb = {Perm.PUB: "PUB", Perm.SUB: "SUB"}.get(perm, "any")
                raise PermissionDeniedError(
                    f"No {verb} permission for topic {topic} (accessKey {account.access_key})"
                )
