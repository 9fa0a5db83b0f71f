"""Issue 28 item 23: a pull whose batch reaches a record with a bad body CRC serves the records
before it and ends there (nextBeginOffset = the bad record's offset); the pull that starts at it
is answered with the corruption, naming the CommitLog file and position (as Kafka's fetch does),
so a consumer stops exactly at the bad record; a pull past it is served.  At the store API
(``MessageStore.get_messages``, the gRPC pull's and POP's read) and over remoting PULL_MESSAGE
(plain, tag-filtered and SQL-filtered)."""

from __future__ import annotations

import pytest

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.errors import CorruptStoreError
from rmq_spark.remoting.client import RemotingClient
from rmq_spark.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.store.pulled import records_arrow
from rmq_spark.store.record import POS_BODY_V4

TOPIC = "CrcT"
N = 300
BAD = 25


def _fill(store) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    """N messages on queue 0; the body of record BAD damaged in place: (its file, position)."""
    from rmq_spark.store.message import Message

    store.put_messages([Message(TOPIC, b"body-%03d" % i, {"TAGS": "even" if i % 2 == 0 else "odd", "n": str(i)})
                        for i in range(N)])  # fmt: skip
    phys = store.consume_queue(TOPIC, 0).unit(BAD)[0]
    mf = store.commitlog.mfq.find(phys)
    pos = phys - mf.from_offset
    at = pos + POS_BODY_V4 + 2
    mf.mm[at] ^= 0x20  # "body-025" -> "boDy-025": a body CRC mismatch
    return mf.path, pos


def test_store_get_messages_serves_up_to_the_bad_record_then_reports_it(store_dir):
    from rmq_spark.store.clock import FakeClock
    from rmq_spark.store.store import MessageStore, StoreConfig

    with MessageStore(
        store_dir, StoreConfig(commitlog_segment_bytes=1 << 20), clock=FakeClock()
    ) as s:
        path, pos = _fill(s)
        r = s.get_messages(TOPIC, 0, 0, max_msgs=256)
        assert [m.queue_offset for m in r.messages] == list(range(BAD))
        assert r.next_begin_offset == BAD
        with pytest.raises(CorruptStoreError, match="body CRC mismatch") as e:
            s.get_messages(TOPIC, 0, BAD, max_msgs=256)
        assert (
            e.value.path == path and e.value.position == pos and f"position {pos}" in str(e.value)
        )
        r = s.get_messages(TOPIC, 0, BAD + 1, max_msgs=256)
        assert [m.queue_offset for m in r.messages] == list(range(BAD + 1, BAD + 257))

        class Odd:  # a filter that skips the records before the bad one: nothing served, ends at it
            def matches_message(self, m):  # type: ignore[no-untyped-def]
                return int(m.properties["n"]) > BAD

        r = s.get_messages(TOPIC, 0, 10, max_msgs=256, message_filter=Odd())
        assert r.messages == [] and r.next_begin_offset == BAD


@pytest.fixture
def broker(tmp_path):
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen=None)
    with Broker(str(tmp_path / "store"), options=opts) as b:
        yield b


def _pull(
    c: RemotingClient, offset: int, max_msgs: int = 256, expr: str = "*", expr_type: str = "TAG"
):  # type: ignore[no-untyped-def]
    return c.request(RemotingCommand(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "g", "topic": TOPIC, "queueId": "0", "queueOffset": str(offset),
        "maxMsgNums": str(max_msgs), "sysFlag": str(int(PullSysFlag.SUBSCRIPTION)), "commitOffset": "0",
        "suspendTimeoutMillis": "0", "subscription": expr, "subVersion": "0", "expressionType": expr_type},
        version=409))  # fmt: skip


def _offsets(answer) -> list[int]:  # type: ignore[no-untyped-def]
    return records_arrow(answer.body).column("queueOffset").to_pylist()


@pytest.mark.parametrize("expr, expr_type, want", [
    ("*", "TAG", list(range(BAD))),
    ("even || odd", "TAG", list(range(BAD))),
    ("odd", "TAG", list(range(1, BAD, 2))),
    ("n > 10", "SQL92", list(range(11, BAD))),
])  # fmt: skip
def test_remoting_pull_serves_up_to_the_bad_record_then_reports_it(broker, expr, expr_type, want):
    path, pos = _fill(broker.store)
    with RemotingClient(broker.remoting_endpoint) as c:
        first = _pull(c, 0, expr=expr, expr_type=expr_type)
        assert first.code == ResponseCode.SUCCESS
        assert _offsets(first) == want
        assert first.ext_fields["nextBeginOffset"] == str(BAD)
        at = _pull(c, BAD, expr=expr, expr_type=expr_type)
        assert at.code == ResponseCode.SYSTEM_ERROR and at.body == b""
        assert f"{path}: corrupt CommitLog record at position {pos}" in at.remark
        assert f"unit {BAD} of {TOPIC}/0" in at.remark and "body CRC mismatch" in at.remark
        assert "Error:" not in at.remark  # not a Python exception's text
        past = _pull(c, BAD + 1, expr=expr, expr_type=expr_type)
        assert past.code == ResponseCode.SUCCESS and _offsets(past)[0] >= BAD + 1


def test_remoting_pull_whose_filter_skips_everything_before_the_bad_record_ends_at_it(broker):
    _fill(broker.store)
    with RemotingClient(broker.remoting_endpoint) as c:
        skipped = _pull(c, BAD - 1, expr="odd")  # BAD - 1 is even: skipped by its tag code
        assert skipped.code == ResponseCode.PULL_RETRY_IMMEDIATELY
        assert skipped.ext_fields["nextBeginOffset"] == str(BAD)
        assert _pull(c, BAD, expr="odd").code == ResponseCode.SYSTEM_ERROR
        sql = _pull(
            c, 10, expr="n < 5", expr_type="SQL92"
        )  # reads each record: none matches before BAD
        assert sql.code == ResponseCode.PULL_RETRY_IMMEDIATELY and sql.ext_fields[
            "nextBeginOffset"
        ] == str(BAD)


def test_a_damaged_header_is_found_without_a_filter_too(broker):
    """Not only the body CRC: a record whose queue offset field was overwritten (it would be served
    as another offset's) ends the batch the same way."""
    store = broker.store
    from rmq_spark.store.message import Message
    from rmq_spark.store.record import POS_QUEUE_OFFSET

    store.put_messages([Message(TOPIC, b"m%d" % i, {}) for i in range(40)])
    phys = store.consume_queue(TOPIC, 0).unit(30)[0]
    mf = store.commitlog.mfq.find(phys)
    mf.mm[phys - mf.from_offset + POS_QUEUE_OFFSET + 7] ^= 1
    with RemotingClient(broker.remoting_endpoint) as c:
        first = _pull(c, 0)
        assert _offsets(first) == list(range(30)) and first.ext_fields["nextBeginOffset"] == "30"
        assert _pull(c, 30).code == ResponseCode.SYSTEM_ERROR
