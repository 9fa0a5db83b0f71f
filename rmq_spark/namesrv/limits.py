"""What the NameServer accepts from other brokers, and its bounds: one place for the rules a
REGISTER_BROKER / UNREGISTER_BROKER request is held to before it touches the registry.

=============================  =========  ==========================================================
limit                          default    why
=============================  =========  ==========================================================
``max_brokers``                128        registered broker addresses (the local broker not counted):
                                          5,000 fake brokers a second cannot grow the registry
``max_topics_per_broker``      16,384     topics in one registration
``max_topics_total``           65,536     topic entries over every registered broker (about 16 MB)
``max_queue_nums``             1,024      read / write queue counts of a topic (``MAX_QUEUE_NUMS``)
``max_name_chars``             127        brokerName and clusterName (printable ASCII, no spaces)
``max_addr_chars``             255        brokerAddr (``HOST:PORT``)
``body_max_bytes``             8 MiB      a REGISTER_BROKER body as received
``inflated_max_bytes``         8 MiB      a compressed body once inflated (16,384 topics in JSON
                                          take about 4 MB, compressed about 1 MB)
``heartbeat_timeout_ms``       10 s-10 m  ``heartbeatTimeoutMillis`` is clamped into this range
                                          (RocketMQ's default: 120 s)
``registrations_in_flight``    4          bodies being read at once (off the event loop); more
                                          are answered SYSTEM_BUSY
=============================  =========  ==========================================================

The header's own rules (names, address, brokerId, body sizes: 8 MiB for REGISTER_BROKER, 64 KiB
for every other NameServer request, none of which needs one but QUERY_DATA_VERSION's small
DataVersion) are the request table's rows
(:mod:`rmq_spark.remoting.namesrv_requests`), checked before any handler runs; the registry holds
every entry to the same rules again (:func:`check_identity`).  A request that breaks a rule gets
an answer naming the field and the limit (``SYSTEM_ERROR``, or ``NO_PERMISSION`` when it names the
local broker or registrations are off), never a Python exception text.
"""

from __future__ import annotations

from dataclasses import dataclass

from rmq_spark.errors import MessageIllegalError
from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.remoting.headers import HeaderError
from rmq_spark.remoting.namesrv_requests import (
    ADDR_MAX_CHARS,
    MAX_BROKER_ID,
    NAME_MAX_CHARS,
    REGISTER_BODY_MAX_BYTES,
    broker_addr,
    broker_word,
    shown,
)
from rmq_spark.remoting.requests import HeaderProblem
from rmq_spark.store.config import MAX_QUEUE_NUMS
from rmq_spark.store.validation import check_topic_cached

__all__ = [
    "NamesrvLimits",
    "RegistrationError",
    "check_identity",
    "check_queue_counts",
    "check_topic_name",
    "clamp_timeout_ms",
    "shown",
]  # fmt: skip

PERM_MAX = 15  # PermName: PRIORITY 8 | READ 4 | WRITE 2 | INHERIT 1


@dataclass(frozen=True)
class NamesrvLimits:
    max_brokers: int = 128
    max_topics_per_broker: int = 16_384
    max_topics_total: int = 65_536
    max_queue_nums: int = MAX_QUEUE_NUMS
    max_name_chars: int = NAME_MAX_CHARS
    max_addr_chars: int = ADDR_MAX_CHARS
    body_max_bytes: int = REGISTER_BODY_MAX_BYTES
    inflated_max_bytes: int = 8 << 20
    heartbeat_timeout_min_ms: int = 10_000
    heartbeat_timeout_max_ms: int = 600_000
    registrations_in_flight: int = 4


DEFAULT_LIMITS = NamesrvLimits()


class RegistrationError(HeaderError):
    """A REGISTER_BROKER / UNREGISTER_BROKER request the NameServer refuses; ``code`` is the
    answer's response code."""

    def __init__(self, message: str, code: int = ResponseCode.SYSTEM_ERROR) -> None:
        super().__init__(message)
        self.code = int(code)


def check_identity(cluster: object, broker_name: object, addr: object, broker_id: object,
                   limits: NamesrvLimits = DEFAULT_LIMITS) -> None:  # fmt: skip
    """A broker's cluster, name, address and id, or RegistrationError naming the one at fault:
    the request table's rules (:func:`broker_word`, :func:`broker_addr`), at the registry's own
    boundary."""
    try:
        broker_word(cluster, "clusterName", limits.max_name_chars)
        broker_word(broker_name, "brokerName", limits.max_name_chars)
        broker_addr(addr, "brokerAddr", limits.max_addr_chars)
    except HeaderProblem as e:
        raise RegistrationError(str(e)) from None
    if (
        not isinstance(broker_id, int)
        or isinstance(broker_id, bool)
        or not 0 <= broker_id <= MAX_BROKER_ID
    ):
        raise RegistrationError(f"brokerId {shown(broker_id)} is not between 0 and {MAX_BROKER_ID}")


def clamp_timeout_ms(timeout_ms: int, limits: NamesrvLimits = DEFAULT_LIMITS) -> int:
    """``heartbeatTimeoutMillis`` held to [10 s, 10 min] (a broker cannot stay forever)."""
    return max(limits.heartbeat_timeout_min_ms, min(limits.heartbeat_timeout_max_ms, timeout_ms))


def check_topic_name(name: object) -> str:
    """A registered topic's name: what a RocketMQ broker may hold (system topics included)."""
    if not isinstance(name, str):
        raise RegistrationError(f"a topic name is {type(name).__name__}, not a string")
    try:
        check_topic_cached(name, allow_system=True)
    except MessageIllegalError as e:
        raise RegistrationError(f"registered topic: {e}") from None
    return name


def check_queue_counts(topic: str, read: object, write: object, perm: object, sys_flag: object,
                       limits: NamesrvLimits = DEFAULT_LIMITS) -> tuple[int, int, int, int]:  # fmt: skip
    """A topic's queue counts, perm and topicSysFlag as ints in range, or RegistrationError."""
    out = []
    for field, value, most in (("readQueueNums", read, limits.max_queue_nums),
                               ("writeQueueNums", write, limits.max_queue_nums),
                               ("perm", perm, PERM_MAX), ("topicSysFlag", sys_flag, MAX_BROKER_ID)):  # fmt: skip
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most:
            raise RegistrationError(
                f"topic {topic!r}: {field} {shown(value)} is not a number between 0 and {most}"
            )
        out.append(value)
    return out[0], out[1], out[2], out[3]
