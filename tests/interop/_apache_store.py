"""Messages written to a real Apache RocketMQ broker over the remoting protocol, and what was
written, so that tests can read the broker's store directory offline and compare.

:func:`fill` sends, to one broker address, through ``SEND_MESSAGE_V2`` (one message) and
``SEND_BATCH_MESSAGE`` (a ``MessageBatch`` body), the kinds of message whose records differ in a
store: tags, keys, user properties, several queues, a body above 4 KiB stored zlib-compressed with
the COMPRESSED sysflag (as the Java client sends it), a delay level (stored first in
``SCHEDULE_TOPIC_XXXX``, later copied to the topic) and a RocketMQ 5 timer message
(``TIMER_DELIVER_MS``: stored first in ``rmq_sys_wheel_timer``).  It returns the expected rows of
the topic, keyed by the message's ``UNIQ_KEY``.
"""

from __future__ import annotations

import os
import struct
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from rmq_spark.remoting.client import RemotingClient  # noqa: E402
from rmq_spark.remoting.command import RemotingCommand  # noqa: E402

SEND_MESSAGE_V2 = 310
SEND_BATCH_MESSAGE = 320
UPDATE_AND_CREATE_TOPIC = 17
COMPRESSED_FLAG = 0x1
_BATCH_HEAD = struct.Struct(">iiiii")


@dataclass
class Sent:
    """A message as sent: what a reader of the topic must show."""

    body: bytes
    tags: str | None
    keys: str | None
    properties: dict[str, str]
    queue_id: int
    uniq: str
    delayed: bool = False
    queue_offset: int = -1


@dataclass
class Filled:
    topic: str
    queues: int
    sent: list[Sent] = field(default_factory=list)

    def by_uniq(self) -> dict[str, Sent]:
        return {s.uniq: s for s in self.sent}


def properties_string(props: dict[str, str]) -> str:
    return "".join(f"{k}\x01{v}\x02" for k, v in props.items())


def _uniq(i: int, salt: str) -> str:
    # 32 hex characters, like MessageClientIDSetter's (IPv4): unique per test run and message
    return (salt + f"{i:08X}").rjust(32, "0")[-32:]


def create_topic(broker_addr: str, topic: str, queues: int, attributes: str | None = None) -> None:
    """UPDATE_AND_CREATE_TOPIC on one broker (``attributes``: e.g. ``+queue.type=BatchCQ``)."""
    ext = {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": str(queues),
        "writeQueueNums": str(queues),
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": "0",
        "order": "false",
    }
    if attributes:
        ext["attributes"] = attributes
    with RemotingClient(broker_addr, 10.0) as c:
        r = c.request(RemotingCommand(UPDATE_AND_CREATE_TOPIC, ext))
    if r.code != 0:
        raise RuntimeError(f"UPDATE_AND_CREATE_TOPIC {topic}: {r.code} {r.remark}")


def send_one(
    c: RemotingClient,
    topic: str,
    queue_id: int,
    body: bytes,
    props: dict[str, str],
    sys_flag: int = 0,
) -> dict[str, str]:
    ext = {
        "a": "interop-store-producer",
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": str(queue_id),
        "f": str(sys_flag),
        "g": str(int(time.time() * 1000)),
        "h": "0",
        "i": properties_string(props),
        "j": "0",
        "k": "false",
        "m": "false",
    }
    r = c.request(RemotingCommand(SEND_MESSAGE_V2, ext, body))
    if r.code != 0:
        raise RuntimeError(f"SEND_MESSAGE_V2 to {topic}/{queue_id}: {r.code} {r.remark}")
    return r.ext_fields


def batch_body(messages: list[tuple[bytes, dict[str, str]]]) -> bytes:
    """``MessageBatch.encode``: per message TOTALSIZE, MAGIC 0, BODYCRC 0, FLAG, BODYLEN, BODY,
    PROPSLEN (short), PROPS."""
    out = bytearray()
    for body, props in messages:
        p = properties_string(props).encode()
        out += _BATCH_HEAD.pack(4 * 5 + len(body) + 2 + len(p), 0, 0, 0, len(body)) + body
        out += struct.pack(">h", len(p)) + p
    return bytes(out)


def send_batch(
    c: RemotingClient, topic: str, queue_id: int, messages: list[tuple[bytes, dict[str, str]]]
) -> dict:
    ext = {
        "a": "interop-store-producer",
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": str(queue_id),
        "f": "0",
        "g": str(int(time.time() * 1000)),
        "h": "0",
        "i": "",
        "j": "0",
        "k": "false",
        "m": "true",
    }
    r = c.request(RemotingCommand(SEND_BATCH_MESSAGE, ext, batch_body(messages)))
    if r.code != 0:
        raise RuntimeError(f"SEND_BATCH_MESSAGE to {topic}/{queue_id}: {r.code} {r.remark}")
    return r.ext_fields


def fill(
    broker_addr: str,
    topic: str,
    *,
    queues: int = 4,
    batches: int = 3,
    batch_size: int = 50,
    delayed: bool = True,
    timer: bool = True,
) -> Filled:
    """Creates ``topic`` with ``queues`` queues on the broker and writes: per queue ``batches``
    batches of ``batch_size`` messages (tags, keys, properties); single sends of small, empty-tag
    and compressed big bodies; a delay-level-1 message and a timer message due in 2 s."""
    create_topic(broker_addr, topic, queues)
    salt = os.urandom(6).hex().upper()
    out = Filled(topic, queues)
    n = 0
    with RemotingClient(broker_addr, 10.0) as c:
        for _b in range(batches):
            for q in range(queues):
                msgs = []
                for _ in range(batch_size):
                    uniq = _uniq(n, salt)
                    props = {
                        "TAGS": f"Tag{n % 3}",
                        "KEYS": f"k{n} order-{n % 7}",
                        "i": str(n),
                        "UNIQ_KEY": uniq,
                        "WAIT": "true",
                    }
                    body = f"batch body {n} ".encode() * (1 + n % 5)
                    msgs.append((body, props))
                    out.sent.append(
                        Sent(body, props["TAGS"], props["KEYS"], {"i": str(n)}, q, uniq)
                    )
                    n += 1
                send_batch(c, topic, q, msgs)
        for q in range(queues):  # single sends: no tags and no keys; a user property with unicode
            uniq = _uniq(n, salt)
            body = f"single {n}".encode()
            send_one(c, topic, q, body, {"UNIQ_KEY": uniq, "WAIT": "true", "city": "Zürich"})
            out.sent.append(Sent(body, None, None, {"city": "Zürich"}, q, uniq))
            n += 1
        big = bytes(range(256)) * 64 + b"compressed!"  # 16 KiB: the Java client would zlib it
        uniq = _uniq(n, salt)
        send_one(
            c,
            topic,
            0,
            zlib.compress(big, 5),
            {"UNIQ_KEY": uniq, "TAGS": "Big", "WAIT": "true"},
            sys_flag=COMPRESSED_FLAG,
        )
        out.sent.append(Sent(big, "Big", None, {}, 0, uniq))
        n += 1
        if delayed:
            uniq = _uniq(n, salt)
            body = b"delayed by level 1"
            send_one(
                c, topic, 1, body, {"UNIQ_KEY": uniq, "DELAY": "1", "TAGS": "Late", "WAIT": "true"}
            )
            out.sent.append(Sent(body, "Late", None, {}, 1, uniq, delayed=True))
            n += 1
        if timer:
            uniq = _uniq(n, salt)
            body = b"timer message"
            due = int(time.time() * 1000) + 2000
            send_one(
                c,
                topic,
                2,
                body,
                {"UNIQ_KEY": uniq, "TIMER_DELIVER_MS": str(due), "TAGS": "Timer", "WAIT": "true"},
            )
            out.sent.append(Sent(body, "Timer", None, {}, 2, uniq, delayed=True))
            n += 1
    return out
