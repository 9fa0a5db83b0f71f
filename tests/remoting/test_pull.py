"""PULL_MESSAGE over the remoting server: the body is the CommitLog records byte for byte, each
outcome has its RocketMQ code, filters skip what they must, and a long poll waits without a
thread and answers as soon as a message arrives."""

from __future__ import annotations

import threading
import time

import pytest

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.remoting.client import RemotingClient
from rmq_spark.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.lookup import raw_record
from rmq_spark.store.message import Message

TOPIC = "PullT"


@pytest.fixture
def broker(tmp_path):
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen=None)
    with Broker(str(tmp_path / "store"), options=opts) as b:
        yield b


def _pull(c: RemotingClient, offset: int, *, max_msgs: int = 32, suspend_ms: int = 0, expr: str = "*",
          expr_type: str = "TAG", queue_id: int = 0) -> RemotingCommand:  # fmt: skip
    flag = PullSysFlag.SUBSCRIPTION | (PullSysFlag.SUSPEND if suspend_ms else 0)
    return c.request(RemotingCommand(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "g", "topic": TOPIC, "queueId": str(queue_id), "queueOffset": str(offset),
        "maxMsgNums": str(max_msgs), "sysFlag": str(int(flag)), "commitOffset": "0",
        "suspendTimeoutMillis": str(suspend_ms), "subscription": expr, "subVersion": "0",
        "expressionType": expr_type}, version=409))  # fmt: skip


def _put(broker: Broker, n: int, start: int = 0) -> None:
    broker.store.put_messages([Message(TOPIC, b"m%d" % i, {"TAGS": "even" if i % 2 == 0 else "odd", "n": str(i)})
                               for i in range(start, start + n)])  # fmt: skip


def test_pull_body_is_the_commitlog_records_and_codes(broker):
    _put(broker, 5)
    with RemotingClient(broker.remoting_endpoint) as c:
        found = _pull(c, 1, max_msgs=3)
        assert found.code == ResponseCode.SUCCESS
        assert found.ext_fields == {"suggestWhichBrokerId": "0", "nextBeginOffset": "4", "minOffset": "0",
                                    "maxOffset": "5"}  # fmt: skip
        cq = broker.store.consume_queue(TOPIC, 0)
        records = [raw_record(broker.store, cq.unit(q)[0]) for q in (1, 2, 3)]
        assert found.body == b"".join(records)
        assert _pull(c, 5).code == ResponseCode.PULL_NOT_FOUND
        moved = _pull(c, 9)
        assert moved.code == ResponseCode.PULL_OFFSET_MOVED and moved.ext_fields["nextBeginOffset"] == "0"
        assert _pull(c, 0, queue_id=1).code == ResponseCode.PULL_NOT_FOUND  # an empty queue, offset 0
        assert _pull(c, 0, queue_id=99).code == ResponseCode.SYSTEM_ERROR


def test_filters_and_retry_immediately(broker):
    _put(broker, 6)
    with RemotingClient(broker.remoting_endpoint) as c:
        odd = _pull(c, 0, expr="odd")
        assert odd.code == ResponseCode.SUCCESS and odd.body.count(b"TAGS\x01odd") == 3
        sql = _pull(c, 0, expr="n >= 4", expr_type="SQL92")
        assert sql.body.count(b"TAGS") == 2 and sql.ext_fields["nextBeginOffset"] == "6"
        none = _pull(c, 0, expr="nothing")
        assert none.code == ResponseCode.PULL_RETRY_IMMEDIATELY and none.ext_fields["nextBeginOffset"] == "6"
        bad = _pull(c, 0, expr="n >>> 4", expr_type="SQL92")
        assert bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED


def test_long_poll_answers_when_a_message_arrives_and_times_out_otherwise(broker):
    _put(broker, 1)
    threads_before = threading.active_count()
    with RemotingClient(broker.remoting_endpoint, timeout_s=10) as c, \
            RemotingClient(broker.remoting_endpoint, timeout_s=10) as idle:  # fmt: skip
        t0 = time.monotonic()
        assert _pull(idle, 1, suspend_ms=600).code == ResponseCode.PULL_NOT_FOUND
        assert 0.5 <= time.monotonic() - t0 < 3
        timer = threading.Timer(0.5, _put, (broker, 1, 1))
        timer.start()
        t0 = time.monotonic()
        woken = _pull(c, 1, suspend_ms=8000)
        waited = time.monotonic() - t0
        timer.join()
    assert woken.code == ResponseCode.SUCCESS and b"m1" in woken.body
    assert 0.4 <= waited < 2.5
    assert threading.active_count() <= threads_before + 1  # the timer's own thread, now done


def test_a_full_disk_answers_sends_service_not_available_while_pulls_go_on(broker, monkeypatch):
    """RocketMQ's answer to a send when its disk is full; the messages already stored are read."""
    from rmq_spark.errors import DiskFullError

    _put(broker, 3)

    def full(*_a, **_k):  # type: ignore[no-untyped-def]
        raise DiskFullError("no space left on device writing commitlog/00000000000000000000")

    monkeypatch.setattr(broker.core, "send", full)
    send = {"a": "pg", "b": TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0", "i": "",
            "j": "0", "k": "false"}  # fmt: skip
    with RemotingClient(broker.remoting_endpoint) as c:
        r = c.request(RemotingCommand(RequestCode.SEND_MESSAGE_V2, send, b"x", version=409))
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and "no space left" in (r.remark or "")
        assert _pull(c, 0).code == ResponseCode.SUCCESS
