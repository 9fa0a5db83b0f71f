"""The rules of a producer's message, as the broker's SendMessage applies them (RocketMQ's
``AbstractSendMessageProcessor.msgCheck`` and the client's ``Validators``); each failure names the
problem.

The rules of a producer's message -- property keys, tags, keys, message group, body, delivery
time -- are defined here once and checked two ways: one message at a time (``*_problem``, what
the broker's SendMessage asks of each message it parses) and column-wise over a whole Arrow table
of rows (:func:`check_rows`, what the Spark sink asks of a partition before it sends any of it,
and the broker's connector of every Send).  ``tests/broker/test_rules.py`` holds the two to
the same verdict on every case.  A failure names the RocketMQ ``Code`` the broker answers with
(:data:`RULE_CODES`).

=================================  ===============================================================
code                               rule
=================================  ===============================================================
ILLEGAL_TOPIC                      topic missing, malformed, too long, or a system topic
MESSAGE_BODY_EMPTY                 body null or empty
MESSAGE_BODY_TOO_LARGE             body over the broker's limit (4 MiB by default)
ILLEGAL_MESSAGE_PROPERTY_KEY       a user property key empty, with control characters, reserved
                                   (:data:`RESERVED_PROPERTIES`) or with the transient prefix
BAD_REQUEST                        a user property value holding the store's separators
MESSAGE_PROPERTIES_TOO_LARGE       more than 128 user properties, or over 16 KiB of them
ILLEGAL_MESSAGE_TAG                a tag blank, with ``|`` or control characters
ILLEGAL_MESSAGE_KEY                a key blank or with control characters
ILLEGAL_MESSAGE_GROUP              a message group blank, over 64 characters or with control chars
ILLEGAL_DELIVERY_TIME              a delivery time further ahead than the timer allows
=================================  ===============================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rmq_spark.errors import MessageIllegalError
from rmq_spark.store import layout as L
from rmq_spark.store.validation import check_topic_cached


def check_batch(
    topics: list[str],
    properties: list[dict[str, str]],
    body_lens: list[int],
    body_max_bytes: int = L.BODY_MAX_BYTES,
) -> None:
    """RocketMQ's rules for a producer batch (``MessageBatch.generateFromList``): one topic, no
    delayed messages, no retry topic, and the bodies together within the size limit."""
    if not topics:
        raise MessageIllegalError("a batch needs at least one message")
    if any(t != topics[0] for t in topics):
        raise MessageIllegalError(f"a batch must have one topic; it has {sorted(set(topics))[:5]}")
    if topics[0].startswith(L.RETRY_GROUP_TOPIC_PREFIX):
        raise MessageIllegalError("a batch cannot be sent to a retry topic")
    for p in properties:
        if (
            L.P_DELAY in p
            or L.P_TIMER_DELIVER_MS in p
            or L.P_TIMER_DELAY_MS in p
            or L.P_TIMER_DELAY_SEC in p
        ):
            raise MessageIllegalError("a batch cannot hold delayed messages")
    if sum(body_lens) > body_max_bytes:
        raise MessageIllegalError(
            f"a batch's bodies total {sum(body_lens)} bytes; the limit is {body_max_bytes} bytes"
        )


# the connector's sink marks every half it writes with <queryId>|<batchId>|<attempt> under this key
P_SINK_KEY = "__RMQ_SPARK_SINK"


# --- the rules of a producer's message ------------------------------------------------------------

# MessageConst.STRING_HASH_SET, the timer / pop keys and this broker's own markers: never shown to
# clients as user properties, never accepted from them (SendMessage or the Spark sink)
RESERVED_PROPERTIES = frozenset(
    {
        L.P_TAGS,
        L.P_KEYS,
        L.P_WAIT,
        L.P_DELAY,
        L.P_RETRY_TOPIC,
        L.P_REAL_TOPIC,
        L.P_REAL_QID,
        L.P_TRAN_MSG,
        L.P_PGROUP,
        L.P_UNIQ_KEY,
        L.P_RECONSUME_TIME,
        L.P_MAX_RECONSUME_TIMES,
        L.P_ORIGIN_MESSAGE_ID,
        L.P_TRANSACTION_CHECK_TIMES,
        L.P_CHECK_IMMUNITY_TIME_IN_SECONDS,
        L.P_TRAN_PREPARED_QUEUE_OFFSET,
        L.P_TIMER_DELAY_SEC,
        L.P_TIMER_DELAY_MS,
        L.P_TIMER_DELIVER_MS,
        L.P_TIMER_OUT_MS,
        L.P_TIMER_ENQUEUE_MS,
        L.P_TIMER_DEQUEUE_MS,
        L.P_TIMER_DEL_UNIQKEY,
        L.P_DLQ_ORIGIN_TOPIC,
        L.P_DLQ_ORIGIN_MESSAGE_ID,
        "MIN_OFFSET",
        "MAX_OFFSET",
        "BUYER_ID",
        "TRANSFER_FLAG",
        "CORRECTION_FLAG",
        "MQ2_FLAG",
        "CONSUME_START_TIME",
        "POP_CK",
        "POP_CK_OFFSET",
        "1ST_POP_TIME",
        "DUP_INFO",
        "EXTEND_UNIQ_INFO",
        "INSTANCE_ID",
        "CORRELATION_ID",
        "REPLY_TO_CLIENT",
        "TTL",
        "ARRIVE_TIME",
        "PUSH_REPLY_TIME",
        "CLUSTER",
        "MSG_TYPE",
        "INNER_MULTI_QUEUE_OFFSET",
        "INNER_MULTI_DISPATCH",
        "INNER_NUM",
        "INNER_BASE",
        "TIMER_ROLL_TIMES",
        "TIMER_DELAY_LEVEL",
        "__BORNHOST",
        "BORN_TIMESTAMP",
        "TRACE_ON",
        "MSG_REGION",
        "__CRC32#",
        L.P_TRAN_CHECK_SOURCE,
        P_SINK_KEY,
    }
)
MAX_MESSAGE_GROUP_CHARS = 64
MAX_USER_PROPERTIES = 128
MAX_USER_PROPERTIES_BYTES = 16 * 1024
# one pattern for Python's re and for Arrow's RE2 (pyarrow.compute.match_substring_regex)
CONTROL_CHARS = r"[\x00-\x1f\x7f]"
PROPERTY_SEPARATORS = r"[\x01\x02]"  # L.NAME_VALUE_SEPARATOR, L.PROPERTY_SEPARATOR
_CONTROL = re.compile(CONTROL_CHARS)
_SEPARATOR = re.compile(PROPERTY_SEPARATORS)

# the RocketMQ Code (apache.rocketmq.v2.Code, by name) each rule's failure is answered with
RULE_CODES = (
    "ILLEGAL_TOPIC", "MESSAGE_BODY_EMPTY", "MESSAGE_BODY_TOO_LARGE", "ILLEGAL_MESSAGE_PROPERTY_KEY",
    "BAD_REQUEST", "MESSAGE_PROPERTIES_TOO_LARGE", "ILLEGAL_MESSAGE_TAG", "ILLEGAL_MESSAGE_KEY",
    "ILLEGAL_MESSAGE_GROUP", "ILLEGAL_DELIVERY_TIME",
)  # fmt: skip


def property_key_problem(key: str) -> str | None:
    if not key or _CONTROL.search(key) is not None:
        return f"property key {key[:40]!r} is empty or holds control characters"
    if key in RESERVED_PROPERTIES:
        return f"property key {key!r} is reserved by the broker"
    if key.startswith(L.TRANSIENT_PREFIX):
        return f"property key {key[:40]!r} starts with the reserved prefix {L.TRANSIENT_PREFIX!r}"
    return None


def property_value_problem(key: str, value: str) -> str | None:
    if _SEPARATOR.search(value) is not None:
        return f"property {key[:40]!r} holds a control character (\\x01 or \\x02)"
    return None


def properties_size_problem(count: int, size_bytes: int) -> str | None:
    if count > MAX_USER_PROPERTIES:
        return f"{count} user properties; the limit is {MAX_USER_PROPERTIES}"
    if size_bytes > MAX_USER_PROPERTIES_BYTES:
        return f"user properties are {size_bytes} bytes; the limit is {MAX_USER_PROPERTIES_BYTES}"
    return None


def tag_problem(tag: str) -> str | None:
    if not tag.strip() or "|" in tag or _CONTROL.search(tag) is not None:
        return f"tag {tag[:40]!r} is blank or holds '|' or control characters"
    return None


def key_problem(key: str) -> str | None:
    if not key.strip() or _CONTROL.search(key) is not None:
        return f"key {key[:40]!r} is blank or holds control characters"
    return None


def group_problem(group: str) -> str | None:
    if (
        not group.strip()
        or len(group) > MAX_MESSAGE_GROUP_CHARS
        or _CONTROL.search(group) is not None
    ):
        return (
            f"message group {group[:40]!r} is blank, longer than {MAX_MESSAGE_GROUP_CHARS} characters "
            "or holds control characters"
        )
    return None


def body_problem(size_bytes: int, body_max_bytes: int) -> tuple[str, str] | None:
    """(code, problem) of a body of ``size_bytes``."""
    if size_bytes == 0:
        return "MESSAGE_BODY_EMPTY", "message body is empty"
    if size_bytes > body_max_bytes:
        return (
            "MESSAGE_BODY_TOO_LARGE",
            f"message body is {size_bytes} bytes; the limit is {body_max_bytes}",
        )
    return None


def delivery_problem(deliver_ms: int, now_ms: int, max_delay_ms: int | None) -> str | None:
    """A delivery time ``max_delay_ms`` or less ahead is fine (``None``: no timer service)."""
    if deliver_ms <= now_ms:
        return None
    if max_delay_ms is None:
        return "delayed delivery needs the timer service, which this broker does not run"
    if deliver_ms - now_ms > max_delay_ms:
        return (
            f"delivery time {_iso_ms(deliver_ms)} is {(deliver_ms - now_ms) / 1000:.0f}s ahead; the limit is "
            f"{max_delay_ms // 1000}s (the broker's timer_max_delay_s)"
        )
    return None


def _iso_ms(ms: int) -> str:
    import datetime as dt

    try:
        return (
            dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z")
        )
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms since the epoch"


@dataclass(frozen=True)
class SendLimits:
    """What a broker allows a message (its configuration) and its clock, for :func:`check_rows`."""

    body_max_bytes: int = L.BODY_MAX_BYTES
    max_delay_ms: int | None = 3 * 24 * 3600 * 1000  # None: no timer service
    now_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "body_max_bytes": self.body_max_bytes,
            "max_delay_ms": self.max_delay_ms,
            "now_ms": self.now_ms,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SendLimits:
        delay = doc.get("max_delay_ms")
        return cls(
            int(doc["body_max_bytes"]), None if delay is None else int(delay), int(doc["now_ms"])
        )


def rule_error(
    code: str, column: str, row: int, problem: str, where: str = ""
) -> MessageIllegalError:
    """The error of one failed rule: ``CODE: column 'c', row N<where>: problem``; the code,
    column and row are also attributes."""
    err = MessageIllegalError(f"{code}: column {column!r}, row {row}{where}: {problem}")
    err.code, err.column, err.row = code, column, row  # type: ignore[attr-defined]
    return err


# the user's name of each row column (the sink's input names them so)
ROW_COLUMN_NAMES = {"deliverTimeMs": "deliverTimestamp"}


def check_rows(
    table: Any,
    limits: SendLimits,
    *,
    first_row: int = 0,
    where: str = "",
    names: dict[str, str] | None = None,
    distinct_topics: Any = None,
) -> None:
    """Every rule above over a table of message rows (``topic``, ``body``, and optionally
    ``tags``, ``keys``, ``properties`` map<string,string>, ``messageGroup``, ``deliverTimeMs``),
    column-wise: the first failing row raises :func:`rule_error` (row numbers start at
    ``first_row``; ``where`` follows the row number, e.g. " of partition 3").
    ``distinct_topics``: ``pc.unique`` of the topic column when the caller has it already."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = {**ROW_COLUMN_NAMES, **(names or {})}
    n = table.num_rows
    if n == 0:
        return
    cols = set(table.column_names)
    failures: list[
        tuple[int, str, str, str]
    ] = []  # (row, code, column, problem): the first row wins

    def first(mask: Any) -> int:
        """Index of the first true of a boolean array (nulls false), or -1."""
        return int(pc.index(pc.fill_null(mask, False), True).as_py())

    def fail(row: int, code: str, column: str, problem: str) -> None:
        failures.append((row, code, names.get(column, column), problem))

    if "topic" in cols:
        topics = table.column("topic")
        i = first(pc.is_null(topics))
        if i >= 0:
            fail(
                i,
                "ILLEGAL_TOPIC",
                "topic",
                "the row has no topic: set option 'topic' or the 'topic' column",
            )
        distinct = pc.unique(topics) if distinct_topics is None else distinct_topics
        for t in pc.drop_null(distinct).to_pylist():
            try:
                check_topic_cached(t)
            except MessageIllegalError as e:
                fail(first(pc.equal(topics, t)), "ILLEGAL_TOPIC", "topic", str(e))
    body = table.column("body")
    i = first(pc.is_null(body))
    if i >= 0:
        fail(i, "MESSAGE_BODY_EMPTY", "body", "message body is null")
    sizes = pc.binary_length(body)
    i = first(pc.equal(sizes, 0))
    if i >= 0:
        fail(i, "MESSAGE_BODY_EMPTY", "body", "message body is empty")
    i = first(pc.greater(sizes, limits.body_max_bytes))
    if i >= 0:
        code, problem = body_problem(int(sizes[i].as_py()), limits.body_max_bytes)  # type: ignore[misc]
        fail(i, code, "body", problem)
    if "tags" in cols:
        tags = table.column("tags")
        given = pc.not_equal(pc.binary_length(tags), 0)  # an empty string is no tag
        bad = pc.and_(given, pc.or_(
            pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(tags)), 0),
            pc.or_(pc.match_substring(tags, "|"), pc.match_substring_regex(tags, CONTROL_CHARS)),
        ))  # fmt: skip
        i = first(bad)
        if i >= 0:
            fail(i, "ILLEGAL_MESSAGE_TAG", "tags", tag_problem(tags[i].as_py()) or "")
    if "keys" in cols:
        keys = table.column("keys")  # keys joined by spaces; an empty string is no key
        i = first(pc.match_substring_regex(keys, CONTROL_CHARS))
        if i >= 0:
            fail(
                i,
                "ILLEGAL_MESSAGE_KEY",
                "keys",
                f"keys {keys[i].as_py()[:40]!r} hold control characters",
            )
    if "messageGroup" in cols:
        groups = table.column("messageGroup")
        bad = pc.or_(
            pc.or_(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(groups)), 0),
                   pc.greater(pc.utf8_length(groups), MAX_MESSAGE_GROUP_CHARS)),
            pc.match_substring_regex(groups, CONTROL_CHARS),
        )  # fmt: skip
        i = first(bad)
        if i >= 0:
            fail(i, "ILLEGAL_MESSAGE_GROUP", "messageGroup", group_problem(groups[i].as_py()) or "")
    if "deliverTimeMs" in cols:
        deliver = table.column("deliverTimeMs")
        if deliver.null_count < n:
            if limits.max_delay_ms is None:
                i = first(pc.greater(deliver, limits.now_ms))
            else:
                i = first(pc.greater(pc.subtract(deliver, limits.now_ms), limits.max_delay_ms))
            if i >= 0:
                problem = (
                    delivery_problem(int(deliver[i].as_py()), limits.now_ms, limits.max_delay_ms)
                    or ""
                )
                fail(i, "ILLEGAL_DELIVERY_TIME", "deliverTimeMs", problem)
    if "properties" in cols:
        props = table.column("properties")
        if props.null_count < n:
            props = props.combine_chunks() if isinstance(props, pa.ChunkedArray) else props
            _check_properties(props, n, first, fail)
    if failures:
        row, code, column, problem = min(failures, key=lambda f: f[0])
        raise rule_error(code, column, first_row + row, problem, where)


def _check_properties(props: Any, n: int, first: Any, fail: Any) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    as_list = pa.ListArray.from_arrays(props.offsets, props.values)  # the map's entries, slice kept
    entries = as_list.flatten()
    if len(entries) == 0:
        return
    parent = pc.list_parent_indices(as_list).to_numpy(zero_copy_only=False)
    keys = entries.field("key")
    values = entries.field("value")
    bad_key = pc.or_(
        pc.or_(pc.equal(pc.binary_length(keys), 0), pc.match_substring_regex(keys, CONTROL_CHARS)),
        pc.or_(pc.is_in(keys, value_set=_reserved_array()), pc.starts_with(keys, L.TRANSIENT_PREFIX)),
    )  # fmt: skip
    i = first(bad_key)
    if i >= 0:
        fail(
            int(parent[i]),
            "ILLEGAL_MESSAGE_PROPERTY_KEY",
            "properties",
            property_key_problem(keys[i].as_py()) or "",
        )
    i = first(pc.match_substring_regex(values, PROPERTY_SEPARATORS))
    if i >= 0:
        fail(int(parent[i]), "BAD_REQUEST", "properties",
             property_value_problem(keys[i].as_py(), values[i].as_py()) or "")  # fmt: skip
    given = pc.is_valid(values)  # a null value is no property
    counts = np.bincount(
        parent, weights=pc.cast(given, pa.int64()).to_numpy(zero_copy_only=False), minlength=n
    )
    size = pc.fill_null(pc.add(pc.binary_length(keys), pc.binary_length(values)), 0)
    sizes = np.bincount(
        parent, weights=pc.cast(size, pa.int64()).to_numpy(zero_copy_only=False), minlength=n
    )
    over = (counts > MAX_USER_PROPERTIES) | (sizes > MAX_USER_PROPERTIES_BYTES)
    if over.any():
        row = int(np.flatnonzero(over)[0])
        fail(row, "MESSAGE_PROPERTIES_TOO_LARGE", "properties",
             properties_size_problem(int(counts[row]), int(sizes[row])) or "")  # fmt: skip


_RESERVED_ARRAY: Any = None


def _reserved_array() -> Any:
    global _RESERVED_ARRAY
    if _RESERVED_ARRAY is None:
        import pyarrow as pa

        _RESERVED_ARRAY = pa.array(sorted(RESERVED_PROPERTIES), pa.string())
    return _RESERVED_ARRAY
