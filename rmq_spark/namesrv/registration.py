"""Reading a REGISTER_BROKER request's body (``RegisterBrokerBody``) into a topic table, every
value held to :class:`~rmq_spark.namesrv.limits.NamesrvLimits`.  A body that breaks a rule raises
:class:`~rmq_spark.namesrv.limits.RegistrationError` naming what is wrong.  The header was decoded
and checked before, by the request table's row (:mod:`rmq_spark.remoting.namesrv_requests`):
:class:`RegisterHeader` is that decoded header as the body's reader uses it.

The body comes in two forms:

- JSON (``RegisterBrokerBody.encode(false)``): ``{"topicConfigSerializeWrapper": {"topicConfigTable":
  {name: TopicConfig}, "dataVersion": ...}, "filterServerList": [...]}``;
- compressed (``RegisterBrokerBody.encode(true)``, a broker's ``compressedRegister=true``): zlib
  deflate of::

      int32 len + DataVersion JSON | int32 topics | per topic: int32 len + TopicConfig.encode()
      (``name read write perm filterType [attributes]``, space-separated) | filter servers | ...

  5.x brokers deflate it but send ``compressed=false``: a zlib stream starts with 0x78, a JSON
  document with ``{``.

Reading a body is linear in its size, so the processor runs :func:`read_topics` off the event
loop; the size is bounded before (``body_max_bytes``, ``inflated_max_bytes``), and the topic count
is checked before any topic is read.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rmq_spark.namesrv.limits import (
    DEFAULT_LIMITS,
    NamesrvLimits,
    RegistrationError,
    check_queue_counts,
    check_topic_name,
    shown,
)
from rmq_spark.namesrv.routes import BROKER_TIMEOUT_MS, QueueData, queue_data
from rmq_spark.remoting import jsonbody
from rmq_spark.store.inflate import InflateError, inflate

__all__ = [
    "RegisterHeader",
    "compressed_topic_table",
    "json_topic_table",
    "read_topics",
]

_LEN = struct.Struct(">i")
_SMALL_INT = re.compile(r"\d{1,10}")


@dataclass(frozen=True)
class RegisterHeader:
    """REGISTER_BROKER's ``RegisterBrokerRequestHeader``, as its row decoded it."""

    cluster: str
    broker_name: str
    broker_addr: str
    broker_id: int
    timeout_ms: int  # as asked; the registry clamps it
    compressed: bool
    body_crc32: int

    @classmethod
    def of(cls, header: Mapping[str, Any]) -> RegisterHeader:
        """From ``req.header``, decoded and checked by REGISTER_BROKER's row."""
        return cls(cluster=header["clusterName"], broker_name=header["brokerName"],
                   broker_addr=header["brokerAddr"], broker_id=header["brokerId"],
                   timeout_ms=header.get("heartbeatTimeoutMillis", BROKER_TIMEOUT_MS),
                   compressed=header.get("compressed", False),
                   body_crc32=header.get("bodyCrc32", 0))  # fmt: skip


def read_topics(
    header: RegisterHeader, body: bytes, limits: NamesrvLimits = DEFAULT_LIMITS
) -> dict[str, QueueData]:
    """The topic table of a REGISTER_BROKER body, or RegistrationError."""
    if len(body) > limits.body_max_bytes:
        raise RegistrationError(
            f"REGISTER_BROKER body is {len(body)} bytes; the limit is {limits.body_max_bytes}"
        )
    if not body:
        return {}
    if (
        header.body_crc32 != 0 and header.body_crc32 != zlib.crc32(body) & 0x7FFFFFFF
    ):  # UtilAll.crc32
        raise RegistrationError(
            "receive registerBroker request,crc32 not match"
        )  # RocketMQ's words
    if header.compressed or body[:1] == b"\x78":
        return compressed_topic_table(body, limits)
    return json_topic_table(body, limits)


def compressed_topic_table(
    body: bytes, limits: NamesrvLimits = DEFAULT_LIMITS
) -> dict[str, QueueData]:
    """topic -> QueueData of a compressed registration body, or RegistrationError."""
    try:
        data = inflate(body, limits.inflated_max_bytes, "REGISTER_BROKER's compressed body")
    except InflateError as e:
        raise RegistrationError(str(e)) from None

    def chunk(pos: int) -> tuple[bytes, int]:
        if pos + 4 > len(data):
            raise RegistrationError(f"compressed REGISTER_BROKER body is truncated at byte {pos}")
        (n,) = _LEN.unpack_from(data, pos)
        if n < 0 or pos + 4 + n > len(data):
            raise RegistrationError(
                f"compressed REGISTER_BROKER body: a length of {n} at byte {pos} runs past its end"
            )
        return data[pos + 4 : pos + 4 + n], pos + 4 + n

    _version, pos = chunk(0)
    if pos + 4 > len(data):
        raise RegistrationError("compressed REGISTER_BROKER body has no topic count")
    (count,) = _LEN.unpack_from(data, pos)
    pos += 4
    if not 0 <= count <= limits.max_topics_per_broker:
        raise RegistrationError(f"compressed REGISTER_BROKER body lists {count} topics; the limit is "
                                f"{limits.max_topics_per_broker}")  # fmt: skip
    out = {}
    for _ in range(count):
        raw, pos = chunk(pos)
        try:
            fields = raw.decode("utf-8").split(" ")
        except UnicodeDecodeError:
            raise RegistrationError(
                f"compressed REGISTER_BROKER body: topic config {raw[:80]!r} is not UTF-8"
            ) from None
        if len(fields) < 4:
            raise RegistrationError(f"compressed REGISTER_BROKER body: topic config {raw[:80]!r} has {len(fields)} "
                                    "fields, not name read write perm filterType")  # fmt: skip
        name = check_topic_name(fields[0])
        numbers: list[object] = [int(x) if _SMALL_INT.fullmatch(x) else x for x in fields[1:4]]
        read_n, write_n, perm_n = numbers[:3]
        read, write, perm, _flag = check_queue_counts(name, read_n, write_n, perm_n, 0, limits)
        out[name] = queue_data(read, write, perm)
    return out


def json_topic_table(body: bytes, limits: NamesrvLimits = DEFAULT_LIMITS) -> dict[str, QueueData]:
    """topic -> QueueData of a JSON registration body, or RegistrationError."""
    try:
        doc = jsonbody.loads(body)
    except RecursionError:
        raise RegistrationError(
            "REGISTER_BROKER body is JSON nested too deeply to be a RegisterBrokerBody"
        ) from None
    except UnicodeDecodeError as e:
        raise RegistrationError(
            f"REGISTER_BROKER body is not UTF-8 text (byte {e.start})"
        ) from None
    except json.JSONDecodeError as e:
        raise RegistrationError(
            f"REGISTER_BROKER body is neither JSON nor deflated: {e.msg} at byte {e.pos}"
        ) from None
    except ValueError:  # Python's limit on the digits of an int
        raise RegistrationError("REGISTER_BROKER body holds a number too long to be one") from None
    if not isinstance(doc, dict):
        raise RegistrationError(
            f"REGISTER_BROKER body is a JSON {type(doc).__name__}, not a RegisterBrokerBody object"
        )
    wrapper = doc.get("topicConfigSerializeWrapper")
    if wrapper is None:
        return {}
    if not isinstance(wrapper, dict):
        raise RegistrationError(
            "REGISTER_BROKER body: topicConfigSerializeWrapper is not an object"
        )
    table = wrapper.get("topicConfigTable")
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise RegistrationError("REGISTER_BROKER body: topicConfigTable is not an object")
    if len(table) > limits.max_topics_per_broker:
        raise RegistrationError(f"REGISTER_BROKER body lists {len(table)} topics; the limit is "
                                f"{limits.max_topics_per_broker}")  # fmt: skip
    out = {}
    for key, config in table.items():
        if not isinstance(config, dict):
            raise RegistrationError(
                f"REGISTER_BROKER body: topicConfigTable[{shown(key)}] is not a TopicConfig object"
            )
        name = check_topic_name(config.get("topicName", key))
        read, write, perm, flag = check_queue_counts(name, config.get("readQueueNums", 0),
                                                     config.get("writeQueueNums", 0), config.get("perm", 6),
                                                     config.get("topicSysFlag", 0), limits)  # fmt: skip
        out[name] = queue_data(read, write, perm, flag)
    return out
