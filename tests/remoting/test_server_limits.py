"""Issue 28 items 17 and 19: one client cannot take the remoting server's memory or descriptors.

- Queued blocking work (sends waiting for their fdatasync with ``--flush sync``) is bounded per
  connection (the connection is no longer read) and in total (past it: SYSTEM_BUSY at once).
- Connections are limited (closed as they are accepted), with descriptors kept for the store: at
  a low descriptor limit a crowd of connections leaves sends served, never ``OSError: [Errno 24]``.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
import time

import pytest

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.broker.testing import BrokerProcess
from rmq_spark.remoting.client import RemotingClient, request
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand, decode_frame
from rmq_spark.remoting.work import RUNNING_PER_CONNECTION
from rmq_spark.services.config import BrokerConfig
from rmq_spark.store.store import StoreConfig


@pytest.fixture
def sync_broker(tmp_path):
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen=None)
    cfg = BrokerConfig(store=StoreConfig(flush="sync"))
    with Broker(str(tmp_path / "store"), config=cfg, options=opts) as b:
        yield b


def _send(topic: str, opaque: int, body: bytes = b"x") -> bytes:
    fields = {"a": "pg", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0", "i": "",
              "j": "0", "k": "false"}  # fmt: skip
    return RemotingCommand(RequestCode.SEND_MESSAGE_V2, fields, body, opaque, version=409).encode()


def _read_answers(s: socket.socket, n: int, timeout_s: float = 30) -> list[RemotingCommand]:
    s.settimeout(timeout_s)
    buf, out = b"", []
    while len(out) < n:
        chunk = s.recv(1 << 16)
        assert chunk, "the server closed the connection"
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">i", buf[:4])[0]:
            size = struct.unpack(">i", buf[:4])[0]
            out.append(decode_frame(buf[4 : 4 + size]))
            buf = buf[4 + size :]
    return out


def _wait_for(cond, timeout_s: float = 20, what: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class _HeldSends:
    """``core.send`` that waits for ``release`` (an fdatasync that takes its time)."""

    def __init__(self, broker: Broker) -> None:
        self.release = threading.Event()
        self.started = 0
        self._real = broker.core.send

    def __call__(self, *a, **k):  # type: ignore[no-untyped-def]
        self.started += 1
        assert self.release.wait(60)
        return self._real(*a, **k)


def test_a_connection_pipelining_sends_is_not_read_past_its_bound(sync_broker, monkeypatch):
    """500 pipelined sends whose answers are not read: the server takes 64 of them (the per
    connection bound) and then stops reading the connection; nothing else queues in memory.
    Once the sends complete, every one is answered and stored."""
    server = sync_broker.remoting.broker_server
    held = _HeldSends(sync_broker)
    monkeypatch.setattr(sync_broker.core, "send", held)
    frames = b"".join(_send("Pipe", i) for i in range(1, 501))
    with socket.create_connection((server.host, server.port), timeout=30) as s:
        s.sendall(frames)
        _wait_for(lambda: server.inflight == server.conn_inflight_max, what="64 queued sends")
        # another client is answered meanwhile (the loop turned since), and the pipelining
        # connection still holds exactly its bound: the rest of its frames were not read
        probe = request(
            server.endpoint, RequestCode.GET_MAX_OFFSET, {"topic": "Pipe", "queueId": "0"}
        )
        assert probe.code == ResponseCode.SUCCESS
        (conn,) = [c for c in server.connections if c.work.inflight]
        assert conn.work.inflight == server.conn_inflight_max == server.inflight
        assert (
            conn.work.running == RUNNING_PER_CONNECTION
        )  # the rest wait in the connection's queue
        assert conn._reading_paused
        held.release.set()
        answers = _read_answers(s, 500)
    assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 500
    assert sorted(a.opaque for a in answers) == list(range(1, 501))
    assert sync_broker.store.max_offset("Pipe", 0) == 500
    assert server.inflight == 0 and server.inflight_bytes == 0


def test_another_clients_send_does_not_wait_behind_a_pipelining_connection(
    sync_broker, monkeypatch
):
    """A connection has at most RUNNING_PER_CONNECTION requests on the pool; the rest wait in its
    own queue.  With a pipelining connection's 64 sends held (two of them on the pool, blocked),
    another client's send enters the pool at once and is answered."""
    server = sync_broker.remoting.broker_server
    real = sync_broker.core.send
    release = threading.Event()
    calls: list[int] = []

    def held_first_two(*a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) <= RUNNING_PER_CONNECTION:  # the pipelining connection's running sends
            assert release.wait(60)
        return real(*a, **k)

    monkeypatch.setattr(sync_broker.core, "send", held_first_two)
    with socket.create_connection((server.host, server.port), timeout=30) as s:
        s.sendall(b"".join(_send("Pipe", i) for i in range(1, 101)))
        _wait_for(lambda: server.inflight == server.conn_inflight_max, what="64 queued sends")
        (pipelining,) = [c for c in server.connections if c.work.inflight]
        assert pipelining.work.running == RUNNING_PER_CONNECTION
        assert len(pipelining.work.pending) == server.conn_inflight_max - RUNNING_PER_CONNECTION
        with RemotingClient(server.endpoint, timeout_s=10) as other:
            fields = {"a": "pg", "b": "Other", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0",
                      "i": "", "j": "0", "k": "false"}  # fmt: skip
            answer = other.request(
                RemotingCommand(RequestCode.SEND_MESSAGE_V2, fields, b"y", version=409)
            )
        assert answer.code == ResponseCode.SUCCESS
        assert (
            len(calls) == RUNNING_PER_CONNECTION + 1
        )  # the pipelining connection's others still wait
        release.set()
        answers = _read_answers(s, 100)
    assert all(a.code == ResponseCode.SUCCESS for a in answers)
    assert sync_broker.store.max_offset("Pipe", 0) == 100


def test_past_the_total_bound_blocking_requests_are_answered_system_busy(sync_broker, monkeypatch):
    server = sync_broker.remoting.broker_server
    monkeypatch.setattr(server, "total_inflight_max", 10)
    held = _HeldSends(sync_broker)
    monkeypatch.setattr(sync_broker.core, "send", held)
    with socket.create_connection((server.host, server.port), timeout=30) as s:
        s.sendall(b"".join(_send("Busy", i) for i in range(1, 21)))
        busy = _read_answers(s, 10)  # answered at once, while the first 10 wait
        assert {a.opaque for a in busy} == set(range(11, 21))
        assert all(a.code == ResponseCode.SYSTEM_BUSY and "system busy" in a.remark for a in busy)
        assert server.busy_answers == 10
        held.release.set()
        done = _read_answers(s, 10)
    assert {a.opaque for a in done} == set(range(1, 11)) and all(
        a.code == ResponseCode.SUCCESS for a in done
    )
    assert (
        sync_broker.store.max_offset("Busy", 0) == 10
    )  # what was answered SYSTEM_BUSY was not stored


def test_connections_over_the_limit_are_closed_at_accept(tmp_path, monkeypatch):
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen=None)
    with Broker(str(tmp_path / "store"), options=opts) as b:
        server = b.remoting.broker_server
        monkeypatch.setattr(server, "max_connections", 5)
        kept = [socket.create_connection((server.host, server.port), timeout=10) for _ in range(5)]
        try:
            _wait_for(lambda: len(server.connections) == 5, what="5 connections")
            extra = socket.create_connection((server.host, server.port), timeout=10)
            extra.settimeout(10)
            try:
                assert extra.recv(1) == b""  # closed by the server at once
            except ConnectionResetError:
                pass
            extra.close()
            assert server.refused_connections == 1 and len(server.connections) == 5
        finally:
            for s in kept:
                s.close()
        _wait_for(lambda: not server.connections, what="the connections to close")
        assert (
            request(
                server.endpoint, RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": "0"}
            ).code
            == 0
        )


FD_LIMIT = 512
_LOW_FD_BROKER = (
    "import resource, sys\n"
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({FD_LIMIT}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
    "from rmq_spark.broker.__main__ import main\n"
    "sys.exit(main())\n"
)


def test_at_a_low_descriptor_limit_connections_are_refused_and_sends_still_served(tmp_path):
    """A broker limited to 512 descriptors, offered 600 connections: it keeps descriptors for
    the store, so sends to new topics (new ConsumeQueue files) are stored, never answered
    ``SYSTEM_ERROR OSError: [Errno 24] Too many open files``."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 600 + 256
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.fail(
                f"the descriptor limit ({hard}) is below the {need} this test needs: raise it (ulimit -Hn)"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    b = BrokerProcess(str(tmp_path / "store"), program=[sys.executable, "-c", _LOW_FD_BROKER])
    assert b.remoting_endpoint
    host, _, port = b.remoting_endpoint.rpartition(":")
    crowd: list[socket.socket] = []
    try:
        with RemotingClient(
            b.remoting_endpoint, timeout_s=30
        ) as producer:  # connected before the crowd
            for _ in range(600):
                crowd.append(socket.create_connection((host, int(port)), timeout=10))
            for s in crowd:
                s.setblocking(False)
            # past the limit (at most 512 - 256 connections) the broker closes them as it accepts them
            _wait_for(
                lambda: sum(map(_is_closed, crowd)) >= 600 - (FD_LIMIT - 256),
                what="refused connections",
            )
            for i in range(20):  # each a new topic: new ConsumeQueue files, new descriptors
                r = producer.request(RemotingCommand(RequestCode.SEND_MESSAGE_V2, {
                    "a": "pg", "b": f"NewTopic{i}", "c": "TBW102", "d": "4", "e": str(i % 4), "f": "0", "g": "1",
                    "h": "0", "i": "", "j": "0", "k": "false"}, b"x", version=409))  # fmt: skip
                assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
    finally:
        for s in crowd:
            s.close()
        assert b.stop() == 0
    assert "Errno 24" not in b.log_tail(100_000)


def _is_closed(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
