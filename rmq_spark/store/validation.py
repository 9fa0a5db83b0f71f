"""What the store checks of a record before it writes it: topic and group names, body size,
properties size, queue id; each failure names the problem.

The names are also the store's boundary: every store method that builds a path or a config file
entry from a topic or group name (a ConsumeQueue's directory, a topic delete, topics.json,
consumerOffset.json, deletedTopics.json) checks it here first, so a name such as ``../commitlog``,
``/any/dir`` or ``""`` never reaches the file system, whichever front let it in.  The rules of a
producer's message are the broker's (:mod:`rmq_spark.access.rules`)."""

from __future__ import annotations

import operator
import re

from rmq_spark.errors import MessageIllegalError
from rmq_spark.store import layout as L

_NAME = re.compile(
    r"[%|a-zA-Z0-9_-]+"
)  # whole names only (fullmatch: "$" would let a final "\n" by)


def check_topic(topic: str, allow_system: bool = False) -> None:
    if not isinstance(topic, str):
        raise MessageIllegalError(f"topic must be a string, not {type(topic).__name__}")
    if not topic:
        raise MessageIllegalError("topic is empty")
    if not _NAME.fullmatch(topic):
        raise MessageIllegalError(
            f"topic {topic[:200]!r} contains characters outside [%|a-zA-Z0-9_-]"
        )
    limit = (
        L.RETRY_TOPIC_MAX_CHARS
        if topic.startswith((L.RETRY_GROUP_TOPIC_PREFIX, L.DLQ_GROUP_TOPIC_PREFIX))
        else L.TOPIC_MAX_CHARS
    )
    if len(topic) > limit:
        raise MessageIllegalError(
            f"topic {topic[:40]!r}... is {len(topic)} characters; the limit is {limit}"
        )
    if not allow_system and L.is_system_topic(topic):
        raise MessageIllegalError(f"topic {topic!r} is a system topic; producers cannot send to it")


_CHECKED_TOPICS: set[tuple[str, bool]] = set()


def check_topic_cached(topic: str, allow_system: bool = False) -> None:
    """:func:`check_topic`, remembering names that passed (a put checks the same few topics)."""
    if topic.__class__ is str and (topic, allow_system) in _CHECKED_TOPICS:
        return
    check_topic(topic, allow_system)
    if len(_CHECKED_TOPICS) < 65536:
        _CHECKED_TOPICS.add((topic, allow_system))


def check_group(group: str) -> None:
    if not isinstance(group, str):
        raise MessageIllegalError(f"group must be a string, not {type(group).__name__}")
    if not group:
        raise MessageIllegalError("group is empty")
    if not _NAME.fullmatch(group):
        raise MessageIllegalError(
            f"group {group[:200]!r} contains characters outside [%|a-zA-Z0-9_-]"
        )
    if len(group) > L.GROUP_MAX_CHARS:
        raise MessageIllegalError(
            f"group {group[:40]!r}... is {len(group)} characters; the limit is {L.GROUP_MAX_CHARS}"
        )


_CHECKED_GROUPS: set[str] = set()


def check_group_cached(group: str) -> None:
    """:func:`check_group`, remembering names that passed (offset commits name the same groups)."""
    if group.__class__ is str and group in _CHECKED_GROUPS:
        return
    check_group(group)
    if len(_CHECKED_GROUPS) < 65536:
        _CHECKED_GROUPS.add(group)


def check_queue_id_value(queue_id: object, what: str = "queueId") -> int:
    """``queue_id`` as an int if it can name a queue of some topic (0 to QUEUE_NUMS_MAX - 1), else
    MessageIllegalError naming ``what``; a bool or a float is not a queue id."""
    try:
        if isinstance(queue_id, bool):
            raise TypeError
        q = operator.index(queue_id)  # type: ignore[arg-type]  # any object: TypeError says why not
    except TypeError:
        raise MessageIllegalError(f"{what} {queue_id!r} is not an integer") from None
    if not 0 <= q < L.QUEUE_NUMS_MAX:
        raise MessageIllegalError(f"{what} {q} is not between 0 and {L.QUEUE_NUMS_MAX - 1}")
    return q


def check_bodies(bodies, body_max_bytes: int = L.BODY_MAX_BYTES):  # type: ignore[no-untyped-def]
    """:func:`check_body` of every one of ``bodies`` -- a sequence, or an Arrow binary column (its
    lengths read in one pass, a null refused) -- and the bodies to store: as given, or a list of
    bytes when a sequence held bytearrays or memoryviews."""
    if isinstance(bodies, (list, tuple)):
        if any(b.__class__ is not bytes for b in bodies) or max(map(len, bodies)) > body_max_bytes:
            for b in bodies:
                check_body(b, body_max_bytes)
            return [bytes(b) for b in bodies]
        return bodies
    import pyarrow.compute as pc

    if bodies.null_count:
        raise MessageIllegalError("message body is null")
    lengths = pc.binary_length(bodies).to_numpy(zero_copy_only=False)
    longest = int(lengths.argmax())
    if int(lengths[longest]) > body_max_bytes:
        check_body(bodies[longest].as_py(), body_max_bytes)
    return bodies


def check_body(body: object, body_max_bytes: int = L.BODY_MAX_BYTES) -> None:
    if body is None:
        raise MessageIllegalError("message body is null")
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise MessageIllegalError(f"message body must be bytes, not {type(body).__name__}")
    if len(body) > body_max_bytes:
        raise MessageIllegalError(
            f"message body is {len(body)} bytes; the limit is {body_max_bytes} bytes"
        )


def check_properties_size(encoded: bytes) -> None:
    if len(encoded) > L.PROPERTY_MAX_BYTES:
        raise MessageIllegalError(
            f"message properties are {len(encoded)} bytes encoded; the limit is {L.PROPERTY_MAX_BYTES}"
        )


def check_queue_id(queue_id: int, queue_nums: int, topic: str) -> None:
    if not 0 <= queue_id < queue_nums:
        raise MessageIllegalError(
            f"queueId {queue_id} is out of range for topic {topic!r} ({queue_nums} queues)"
        )
