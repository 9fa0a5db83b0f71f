"""The rules of a producer's message, defined once (``rmq_spark.access.rules``): the
column-wise check of a table of rows (the Spark sink, every connector Send) gives the same verdict
as the broker's SendMessage (``parse_send``) on every case, and its errors name the code, the
column and the row."""

from __future__ import annotations

import pyarrow as pa
import pytest
from rocketmq.grpc_protocol import definition_pb2 as D

from rmq_spark.access.rules import P_SINK_KEY, RESERVED_PROPERTIES, SendLimits, check_rows
from rmq_spark.broker.codes import Code, RpcStatusError
from rmq_spark.broker.messages import SYSTEM_PROPERTIES, parse_send
from rmq_spark.errors import MessageIllegalError
from rmq_spark.store import layout as L
from rmq_spark.store.config import TopicConfig

NOW_MS = 1_700_000_000_000
LIMITS = SendLimits(body_max_bytes=64, max_delay_ms=3_600_000, now_ms=NOW_MS)

# (body, properties, tag, keys, message group, deliver ms): one message per case
OK = (b"x", None, None, None, None, None)
CASES = [
    OK,
    (b"", None, None, None, None, None),
    (b"y" * 64, None, None, None, None, None),
    (b"y" * 65, None, None, None, None, None),
    *[(b"x", {k: "v"}, None, None, None, None) for k in sorted(RESERVED_PROPERTIES)],
    (b"x", {"a": "1", "b": "2"}, None, None, None, None),
    (b"x", {"": "v"}, None, None, None, None),
    (b"x", {"a\x05b": "v"}, None, None, None, None),
    (b"x", {L.TRANSIENT_PREFIX + "x": "v"}, None, None, None, None),
    (b"x", {"TAGSX": "v", "uniq_key": "v"}, None, None, None, None),
    (b"x", {"a": "v\x01w"}, None, None, None, None),
    (b"x", {"a": "v\x02"}, None, None, None, None),
    (b"x", {"a": "tab\tok"}, None, None, None, None),
    (b"x", {f"k{i}": "v" for i in range(128)}, None, None, None, None),
    (b"x", {f"k{i}": "v" for i in range(129)}, None, None, None, None),
    (b"x", {"a": "v" * (16 * 1024 - 1)}, None, None, None, None),
    (b"x", {"a": "v" * (16 * 1024)}, None, None, None, None),
    (b"x", {"a": "\u00e9" * 8192}, None, None, None, None),
    (b"x", None, "TagA", None, None, None),
    (b"x", None, " ", None, None, None),
    (b"x", None, "a|b", None, None, None),
    (b"x", None, "a\nb", None, None, None),
    (b"x", None, None, "k1", None, None),
    (b"x", None, None, "k\x00", None, None),
    (b"x", None, None, None, "g", None),
    (b"x", None, None, None, " ", None),
    (b"x", None, None, None, "g" * 64, None),
    (b"x", None, None, None, "g" * 65, None),
    (b"x", None, None, None, "g\x7f", None),
    (b"x", None, None, None, None, NOW_MS + 1000),
    (b"x", None, None, None, None, NOW_MS + 3_600_000),
    (b"x", None, None, None, None, NOW_MS + 3_600_001),
    (b"x", None, None, None, None, NOW_MS - 5000),
]


def send_verdict(case) -> str | None:  # type: ignore[no-untyped-def]
    body, props, tag, keys, group, deliver = case
    pm = D.Message(body=body)
    pm.topic.name = "T"
    pm.system_properties.message_id = "01ABC"
    pm.system_properties.body_encoding = D.Encoding.IDENTITY
    for k, v in (props or {}).items():
        pm.user_properties[k] = v
    if tag is not None:
        pm.system_properties.tag = tag
    if keys is not None:
        pm.system_properties.keys.append(keys)
    if group is not None:
        pm.system_properties.message_group = group
    if deliver is not None:
        pm.system_properties.delivery_timestamp.FromMilliseconds(deliver)
    cfg = TopicConfig("T", message_type="MIXED")
    try:
        parse_send(
            pm,
            cfg,
            now_ms=NOW_MS,
            body_max_bytes=LIMITS.body_max_bytes,
            max_delay_ms=LIMITS.max_delay_ms,
        )
    except RpcStatusError as e:
        return Code.Name(e.code)
    return None


def rows_of(cases) -> pa.Table:  # type: ignore[no-untyped-def]
    return pa.table({
        "topic": pa.array(["T"] * len(cases), pa.string()),
        "body": pa.array([c[0] for c in cases], pa.binary()),
        "properties": pa.array([list(c[1].items()) if c[1] is not None else None for c in cases],
                               pa.map_(pa.string(), pa.string())),
        "tags": pa.array([c[2] for c in cases], pa.string()),
        "keys": pa.array([c[3] for c in cases], pa.string()),
        "messageGroup": pa.array([c[4] for c in cases], pa.string()),
        "deliverTimeMs": pa.array([c[5] for c in cases], pa.int64()),
    })  # fmt: skip


def rows_verdict(table: pa.Table) -> tuple[str, int] | None:
    try:
        check_rows(table, LIMITS)
    except MessageIllegalError as e:
        return e.code, e.row  # type: ignore[attr-defined]
    return None


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_rows_and_send_message_give_the_same_verdict(case):
    expected = send_verdict(case)
    # the case alone, and as the third row behind two good ones (the row is named)
    assert rows_verdict(rows_of([case])) == (None if expected is None else (expected, 0))
    assert rows_verdict(rows_of([OK, OK, case])) == (None if expected is None else (expected, 2))


def test_send_message_hides_and_refuses_the_same_keys():
    assert SYSTEM_PROPERTIES is RESERVED_PROPERTIES
    assert {"UNIQ_KEY", "DELAY", "TIMER_DELIVER_MS", P_SINK_KEY} <= RESERVED_PROPERTIES


def test_the_first_bad_row_is_named_with_its_column_and_the_limit():
    good = [OK] * 5
    cases = [
        *good,
        (b"x", None, None, None, None, NOW_MS + 7_200_000),
        *good,
        (b"", None, None, None, None, None),
    ]
    with pytest.raises(MessageIllegalError) as e:
        check_rows(rows_of(cases), LIMITS, first_row=1000, where=" of partition 3")
    text = str(e.value)
    assert text.startswith(
        "ILLEGAL_DELIVERY_TIME: column 'deliverTimestamp', row 1005 of partition 3:"
    ), text
    assert "the limit is 3600s" in text
    with pytest.raises(
        MessageIllegalError,
        match=r"MESSAGE_BODY_EMPTY: column 'body', row 1: message body is empty",
    ):
        check_rows(rows_of([OK, (b"", None, None, None, None, None)]), LIMITS)
    body_null = pa.table({"topic": ["T", "T"], "body": pa.array([b"x", None], pa.binary())})
    with pytest.raises(
        MessageIllegalError, match=r"MESSAGE_BODY_EMPTY: column 'body', row 1: message body is null"
    ):
        check_rows(body_null, LIMITS)
    no_timer = SendLimits(body_max_bytes=64, max_delay_ms=None, now_ms=NOW_MS)
    with pytest.raises(MessageIllegalError, match="needs the timer service"):
        check_rows(rows_of([(b"x", None, None, None, None, NOW_MS + 10)]), no_timer)
    check_rows(rows_of([(b"x", None, None, None, None, NOW_MS - 10)]), no_timer)  # already due


def test_topics_are_checked_and_sliced_or_chunked_tables_name_their_own_rows():
    t = pa.table({"topic": ["T", "bad topic", "T"], "body": [b"a", b"b", b"c"]})
    with pytest.raises(
        MessageIllegalError, match=r"ILLEGAL_TOPIC: column 'topic', row 1: topic 'bad topic'"
    ):
        check_rows(t, LIMITS)
    with pytest.raises(
        MessageIllegalError, match=r"ILLEGAL_TOPIC: column 'topic', row 0: .*system topic"
    ):
        check_rows(pa.table({"topic": [L.TRANS_HALF_TOPIC], "body": [b"a"]}), LIMITS)
    table = rows_of(
        [
            OK,
            (b"x", {"UNIQ_KEY": "u"}, None, None, None, None),
            OK,
            (b"x", {"DELAY": "1"}, None, None, None, None),
        ]
    )
    assert rows_verdict(table.slice(2)) == ("ILLEGAL_MESSAGE_PROPERTY_KEY", 1)
    assert rows_verdict(pa.concat_tables([table.slice(2, 1), table.slice(0, 2)])) == (
        "ILLEGAL_MESSAGE_PROPERTY_KEY",
        2,
    )
    assert rows_verdict(table.slice(2, 1)) is None


def test_producer_batch_rules():
    from rmq_spark.access.rules import check_batch

    check_batch(["T", "T"], [{}, {"TAGS": "a"}], [10, 20])
    with pytest.raises(MessageIllegalError, match="one topic"):
        check_batch(["T", "U"], [{}, {}], [1, 1])
    with pytest.raises(MessageIllegalError, match="delayed"):
        check_batch(["T"], [{"DELAY": "3"}], [1])
    with pytest.raises(MessageIllegalError, match="retry topic"):
        check_batch(["%RETRY%g"], [{}], [1])
    with pytest.raises(MessageIllegalError, match="total 11 bytes; the limit is 10"):
        check_batch(["T", "T"], [{}, {}], [5, 6], body_max_bytes=10)
    with pytest.raises(MessageIllegalError, match="at least one"):
        check_batch([], [], [])
