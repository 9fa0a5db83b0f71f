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
        assert (
            moved.code == ResponseCode.PULL_OFFSET_MOVED
            and moved.ext_fields["nextBeginOffset"] == "0"
        )
        assert (
            _pull(c, 0, queue_id=1).code == ResponseCode.PULL_NOT_FOUND
        )  # an empty queue, offset 0
        assert _pull(c, 0, queue_id=99).code == ResponseCode.SYSTEM_ERROR


def test_filters_and_retry_immediately(broker):
    _put(broker, 6)
    with RemotingClient(broker.remoting_endpoint) as c:
        odd = _pull(c, 0, expr="odd")
        assert odd.code == ResponseCode.SUCCESS and odd.body.count(b"TAGS\x01odd") == 3
        sql = _pull(c, 0, expr="n >= 4", expr_type="SQL92")
        assert sql.body.count(b"TAGS") == 2 and sql.ext_fields["nextBeginOffset"] == "6"
        none = _pull(c, 0, expr="nothing")
        assert (
            none.code == ResponseCode.PULL_RETRY_IMMEDIATELY
            and none.ext_fields["nextBeginOffset"] == "6"
        )
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


# --- issue 28 item 16: parked long polls ----------------------------------------------------------
def _pull_frame(opaque: int, offset: int, suspend_ms: int, queue_id: int = 0) -> bytes:
    flag = PullSysFlag.SUBSCRIPTION | PullSysFlag.SUSPEND
    return RemotingCommand(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "g", "topic": TOPIC, "queueId": str(queue_id), "queueOffset": str(offset),
        "maxMsgNums": "32", "sysFlag": str(int(flag)), "commitOffset": "0", "suspendTimeoutMillis": str(suspend_ms),
        "subscription": "*", "subVersion": "0", "expressionType": "TAG"}, opaque=opaque, version=409).encode()  # fmt: skip


def _wait_for(cond, timeout_s: float = 60, what: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class _Reader(threading.Thread):
    """Reads (and counts) the answers arriving on a raw socket."""

    def __init__(self, sock) -> None:  # type: ignore[no-untyped-def]
        super().__init__(daemon=True)
        self.sock = sock
        self.codes: list[int] = []

    def run(self) -> None:
        import struct

        from rmq_spark.remoting.command import decode_frame

        buf = b""
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">i", buf[:4])[0]:
                n = struct.unpack(">i", buf[:4])[0]
                self.codes.append(decode_frame(buf[4 : 4 + n]).code)
                buf = buf[4 + n :]


def test_twenty_thousand_parked_pulls_expire_while_other_clients_are_served(broker):
    """20,000 parked pulls (20 connections x 1,000) expiring together used to be removed one by
    one in quadratic time (minutes, the broker frozen).  They are released in batches: another
    client's requests are served while the expiry is under way, and all 20,000 are answered."""
    import socket

    broker.store.topics.get_or_create(TOPIC)
    hold = broker.remoting.pull.hold
    handlers = broker.remoting.broker_server.processor.handlers
    seen_during: list[int] = []
    real = handlers[RequestCode.GET_MAX_OFFSET]

    def probe(conn, req):  # type: ignore[no-untyped-def]
        seen_during.append(hold.answered)
        return real(conn, req)

    handlers[RequestCode.GET_MAX_OFFSET] = probe
    host, _, port = broker.remoting_endpoint.rpartition(":")
    socks, readers = [], []
    try:
        for _c in range(20):
            s = socket.create_connection((host, int(port)), timeout=60)
            socks.append(s)
            r = _Reader(s)
            r.start()
            readers.append(r)
            s.sendall(b"".join(_pull_frame(i, 0, 4000) for i in range(1, 1001)))
        _wait_for(lambda: hold.parked + hold.answered >= 20_000, what="20,000 parked pulls")
        assert hold.refused == 0
        with RemotingClient(broker.remoting_endpoint, timeout_s=10) as other:
            while hold.answered < 20_000:
                answer = other.request(
                    RemotingCommand(RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": "1"})
                )
                assert answer.code == ResponseCode.SUCCESS
        _wait_for(lambda: sum(len(r.codes) for r in readers) == 20_000, what="20,000 answers")
    finally:
        handlers[RequestCode.GET_MAX_OFFSET] = real
        for s in socks:
            s.close()
    assert all(code == ResponseCode.PULL_NOT_FOUND for r in readers for code in r.codes)
    assert any(0 < n < 20_000 for n in seen_during), (
        "no other request was served while the pulls expired"
    )
    assert hold.parked == 0


def test_parked_pulls_are_bounded_per_connection_and_in_total(broker, monkeypatch):
    import socket

    broker.store.topics.get_or_create(TOPIC)
    hold = broker.remoting.pull.hold
    monkeypatch.setattr(hold, "max_per_connection", 10)
    monkeypatch.setattr(hold, "max_total", 15)
    host, _, port = broker.remoting_endpoint.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as a, \
            socket.create_connection((host, int(port)), timeout=30) as b:  # fmt: skip
        ra, rb = _Reader(a), _Reader(b)
        ra.start()
        rb.start()
        a.sendall(
            b"".join(_pull_frame(i, 0, 30_000) for i in range(1, 13))
        )  # 2 past its connection's bound
        _wait_for(lambda: len(ra.codes) == 2, what="the pulls past the connection's bound")
        b.sendall(b"".join(_pull_frame(i, 0, 30_000) for i in range(1, 9)))  # 3 past the total
        _wait_for(lambda: len(rb.codes) == 3, what="the pulls past the total bound")
        assert hold.parked == 15 and hold.refused == 5
        # answered at once, SYSTEM_BUSY: the clients wait before pulling again (not a spin)
        assert ra.codes + rb.codes == [ResponseCode.SYSTEM_BUSY] * 5
        _put(broker, 1)  # wakes all 15
        _wait_for(lambda: len(ra.codes) + len(rb.codes) == 20, what="the woken pulls")
        assert (ra.codes + rb.codes).count(ResponseCode.SUCCESS) == 15
        assert hold.parked == 0


def test_a_put_wakes_only_its_own_queue(broker):
    """1,000 pulls parked on queue 0: sends to queue 1 look at none of them (before, every put
    walked every parked pull), and a send to queue 0 wakes them all."""
    import socket

    broker.store.topics.get_or_create(TOPIC)
    hold = broker.remoting.pull.hold
    looked: list[tuple[str, int]] = []
    real = hold.max_offset

    def counting(topic: str, queue_id: int) -> int:
        looked.append((topic, queue_id))
        return real(topic, queue_id)

    hold.max_offset = counting
    host, _, port = broker.remoting_endpoint.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        r = _Reader(s)
        r.start()
        s.sendall(b"".join(_pull_frame(i, 0, 30_000) for i in range(1, 1001)))
        _wait_for(lambda: hold.parked == 1000, what="1,000 parked pulls")
        looked.clear()
        for i in range(100):
            broker.store.put_messages([Message(TOPIC, b"q1-%d" % i, {}, queue_id=1)])
        with RemotingClient(broker.remoting_endpoint) as c:  # the loop has turned since the puts
            assert _pull(c, 0, queue_id=1).code == ResponseCode.SUCCESS
        assert hold.parked == 1000 and not r.codes
        assert (TOPIC, 0) not in looked
        _put(broker, 1)
        _wait_for(lambda: len(r.codes) == 1000, what="the woken pulls")
    assert set(r.codes) == {ResponseCode.SUCCESS}


# --- issue 28 item 21: a clean stop -------------------------------------------------------------
def test_stopping_with_parked_pulls_answers_them_and_logs_no_error(tmp_path, caplog):
    import gc
    import logging
    import socket

    caplog.set_level(logging.INFO)
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen=None)
    b = Broker(str(tmp_path / "store"), options=opts)
    b.store.topics.get_or_create(TOPIC)
    host, _, port = b.remoting_endpoint.rpartition(":")
    socks, readers = [], []
    try:
        for _c in range(3):
            s = socket.create_connection((host, int(port)), timeout=30)
            socks.append(s)
            r = _Reader(s)
            r.start()
            readers.append(r)
            s.sendall(b"".join(_pull_frame(i, 0, 60_000, queue_id=i % 4) for i in range(1, 51)))
        _wait_for(lambda: b.remoting.pull.hold.parked == 150, what="150 parked pulls")
    finally:
        b.close()
    for r in readers:
        r.join(10)
    for s in socks:
        s.close()
    gc.collect()
    assert sum(len(r.codes) for r in readers) == 150  # each answered (nothing new) before the close
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


def test_sigterm_with_parked_pulls_logs_no_error(tmp_path):
    """The broker process stopped by SIGTERM with parked long polls (as an idle push consumer
    leaves them) exits 0 and its log holds no ERROR (before: one "Task was destroyed but it is
    pending!" per parked poll)."""
    import socket

    from rmq_spark.broker.testing import BrokerProcess

    b = BrokerProcess(str(tmp_path / "store"))
    socks = []
    try:
        assert b.remoting_endpoint
        with RemotingClient(b.remoting_endpoint) as c:  # the topic, with one message on queue 0
            send = {"a": "pg", "b": TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0",
                    "i": "", "j": "0", "k": "false"}  # fmt: skip
            assert (
                c.request(
                    RemotingCommand(RequestCode.SEND_MESSAGE_V2, send, b"x", version=409)
                ).code
                == 0
            )
            host, _, port = b.remoting_endpoint.rpartition(":")
            for _ in range(3):
                s = socket.create_connection((host, int(port)), timeout=30)
                s.sendall(b"".join(_pull_frame(i, 1, 60_000) for i in range(1, 21)))
                socks.append(s)
            # a request on another connection answered after the pulls were sent: they are parked
            assert _pull(c, 0).code == ResponseCode.SUCCESS
    finally:
        code = b.stop()
        for s in socks:
            s.close()
    log = b.log_tail(1_000_000)
    assert code == 0
    assert "Task was destroyed" not in log and "ERROR" not in log, log[-2000:]
