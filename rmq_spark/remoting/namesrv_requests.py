"""The NameServer's rows of the one table of remoting request codes
(:mod:`rmq_spark.remoting.requests`): each code's header fields with their types and ranges, its
body bound, and who may call it.  The NameServer's processor
(:func:`rmq_spark.namesrv.processor.namesrv_processor`) installs the same
:class:`~rmq_spark.remoting.requests.RequestGate` over these rows as the broker's remoting port
over its own, so a code without a row is refused, every header is decoded once (topic names by the
same validation as every other way in), and a handler reads only ``req.header``.

Who may call what (with ``--acl``; without it, anyone):

- the reads -- routes, cluster info, topic lists, kv config, QUERY_DATA_VERSION -- are served to
  anyone, signed or not, as RocketMQ's NameServer serves them (clients look routes up before they
  know any broker; the Go and C++ clients sign nothing there): their rows are ``open``;
- the writes -- REGISTER_BROKER, UNREGISTER_BROKER, DELETE_TOPIC_IN_NAMESRV, PUT_KV_CONFIG -- need
  the signature of an admin account (RocketMQ's ``AclClientRPCHook`` signature, checked by
  :meth:`rmq_spark.access.auth.AccessControl.authenticate_remoting`); anything else is answered
  ``NO_PERMISSION`` naming the reason.  ``rmq-broker --namesrv-access-key`` signs a broker's own.

A broker's identity (REGISTER_BROKER): cluster and broker names of at most
:data:`NAME_MAX_CHARS` printable ASCII characters, ``brokerAddr`` ``HOST:PORT`` of at most
:data:`ADDR_MAX_CHARS`, ``brokerId`` 0 to 2^31-1.  The registry checks the same rules again at its
own boundary (:func:`rmq_spark.namesrv.limits.check_identity` calls :func:`broker_word` and
:func:`broker_addr`).  A REGISTER_BROKER body (the topic table) is read off the event loop by its
handler, within :data:`REGISTER_BODY_MAX_BYTES`; every other NameServer request's body is held to
64 KiB.
"""

from __future__ import annotations

import re

from rmq_spark.errors import MessageIllegalError
from rmq_spark.remoting.codes import RequestCode as R
from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.remoting.command import FRAME_MAX_BYTES
from rmq_spark.remoting.requests import F, HeaderProblem, Spec, need_admin
from rmq_spark.store.validation import check_topic_cached

__all__ = [
    "ADDR_MAX_CHARS",
    "GET_KV_CONFIG",
    "MAX_BROKER_ID",
    "NAMESRV_REQUESTS",
    "NAME_MAX_CHARS",
    "OTHER_BODY_MAX_BYTES",
    "PUT_KV_CONFIG",
    "QUERY_DATA_VERSION",
    "REGISTER_BODY_MAX_BYTES",
    "broker_addr",
    "broker_word",
    "shown",
]

PUT_KV_CONFIG, GET_KV_CONFIG, QUERY_DATA_VERSION = 100, 101, 322
NAME_MAX_CHARS = 127  # brokerName, clusterName
ADDR_MAX_CHARS = 255  # brokerAddr (HOST:PORT)
MAX_BROKER_ID = (1 << 31) - 1
REGISTER_BODY_MAX_BYTES = 8 << 20  # a REGISTER_BROKER body as received
OTHER_BODY_MAX_BYTES = 64 << 10  # any other NameServer request's (QUERY_DATA_VERSION's DataVersion)
_PRINTABLE = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces


def shown(value: object) -> str:
    """``value`` as a refusal names it: its repr, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def broker_word(value: object, name: str, most: int = NAME_MAX_CHARS) -> str:
    """A broker's or cluster's name: 1 to ``most`` printable ASCII characters, no spaces."""
    if not isinstance(value, str) or not value:
        raise HeaderProblem(f"{name} is missing or empty")
    if len(value) > most:
        raise HeaderProblem(f"{name} is {len(value)} characters; the limit is {most}")
    if not _PRINTABLE.fullmatch(value):
        raise HeaderProblem(f"{name} {shown(value)} holds characters other than printable ASCII")
    return value


def broker_addr(value: object, name: str, most: int = ADDR_MAX_CHARS) -> str:
    """A broker's address: ``HOST:PORT`` (port 1 to 65535), printable ASCII."""
    addr = broker_word(value, name, most)
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise HeaderProblem(f"{name} {shown(addr)} is not HOST:PORT")
    return addr


def route_topic(value: str, name: str) -> str:
    """A route query's topic: a name no broker can hold has no route (TOPIC_NOT_EXIST, as a
    NameServer answers any topic it does not know), the reason named."""
    try:
        check_topic_cached(value, allow_system=True)
    except MessageIllegalError as e:
        why = f"No topic route info in name server: {e}"
        raise HeaderProblem(why, ResponseCode.TOPIC_NOT_EXIST) from None
    return value


def _name(field: str, required: bool = False) -> F:
    """A broker's or cluster's name: checked by :func:`broker_word` when it is required."""
    check = broker_word if required else None
    return F(field, "str", required, max_chars=NAME_MAX_CHARS, check=check)


def _addr(field: str, required: bool = False) -> F:
    check = broker_addr if required else None
    return F(field, "str", required, max_chars=ADDR_MAX_CHARS, check=check)


_BROKER = (_name("brokerName"), _addr("brokerAddr"), _name("clusterName"), F("brokerId", "long"))
_KV = (F("namespace"), F("key"))
_ROUTE_TOPIC = F("topic", "str", True, max_chars=FRAME_MAX_BYTES, check=route_topic)
_REGISTER = (
    _name("clusterName", True), _name("brokerName", True), _addr("brokerAddr", True),
    F("haServerAddr", max_chars=ADDR_MAX_CHARS), F("brokerId", "long", True, (0, MAX_BROKER_ID)),
    F("heartbeatTimeoutMillis", "long"),  # clamped by the registry
    F("enableActingMaster", "bool"), F("compressed", "bool"), F("bodyCrc32", "int"),
)  # fmt: skip

# fmt: off
NAMESRV_REQUESTS: dict[int, Spec] = {int(s.code): s for s in (
    Spec(R.GET_ROUTEINFO_BY_TOPIC, (_ROUTE_TOPIC, F("acceptStandardJsonOnly", "bool")), open=True),
    Spec(R.GET_BROKER_CLUSTER_INFO, open=True),
    Spec(R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, open=True),
    Spec(R.GET_TOPICS_BY_CLUSTER, (F("cluster", "str", True),), open=True),
    Spec(QUERY_DATA_VERSION, _BROKER, open=True),  # a broker asking whether to register again
    Spec(GET_KV_CONFIG, _KV, open=True),
    # the body (the topic table) is read off the event loop by the handler
    Spec(R.REGISTER_BROKER, _REGISTER, need_admin, body_max=REGISTER_BODY_MAX_BYTES),
    Spec(R.UNREGISTER_BROKER, (F("brokerAddr", "str", True, max_chars=ADDR_MAX_CHARS),
                               _name("brokerName"), _name("clusterName"), F("brokerId", "long")),
         need_admin),
    Spec(R.DELETE_TOPIC_IN_NAMESRV, (F("topic", "topic", True), _name("clusterName")), need_admin),
    Spec(PUT_KV_CONFIG, (*_KV, F("value")), need_admin),  # mqadmin updateTopic -o true
)}
# fmt: on
