"""Bad input never stops or wedges the broker's remoting server: each case gets an error answer
or a closed connection, and afterwards the broker still answers a good request at once."""

from __future__ import annotations

import json
import logging
import socket
import struct
import time

import pytest

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.remoting import jsonbody
from rmq_spark.remoting.client import RemotingClient, request
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand, SerializeType


@pytest.fixture
def broker(tmp_path):
    opts = BrokerOptions(
        listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen="127.0.0.1:0"
    )
    with Broker(str(tmp_path / "store"), options=opts) as b:
        yield b


def _connect(addr: str) -> socket.socket:
    host, _, port = addr.rpartition(":")
    s = socket.create_connection((host, int(port)), timeout=5)
    return s


def _closed_by_server(s: socket.socket) -> bool:
    s.settimeout(5)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _still_serves(broker: Broker) -> None:
    t0 = time.monotonic()
    answer = request(
        broker.remoting_endpoint, RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": "0"}
    )
    assert answer.code == ResponseCode.SUCCESS and answer.ext_fields["offset"].isdigit()
    assert time.monotonic() - t0 < 2
    route = request(broker.namesrv_endpoint, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    assert route.code == ResponseCode.SUCCESS


def _frame(stype: int, header: bytes, body: bytes = b"") -> bytes:
    return (
        struct.pack(">iI", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body
    )


JSON_HEADER = (
    b'{"code":30,"extFields":{"topic":"T","queueId":"0"},"flag":0,"opaque":1,"version":409}'
)


@pytest.mark.parametrize(("data", "why"), [
    (struct.pack(">i", 16 * 1024 * 1024 + 1) + b"\x00" * 1024, "a frame over 16 MiB"),
    (struct.pack(">i", -1), "a negative length"),
    (_frame(7, JSON_HEADER), "an unknown serialize type"),
    (_frame(0, b'{"code":30,'), "a JSON header that does not parse"),
    (_frame(0, b'"just a string"'), "a JSON header that is not an object"),
    (_frame(1, b"\x00\x1e\x00"), "a truncated binary header"),
    (_frame(1, b"\x00\x1e\x00\x01\x99\x00\x00\x00\x01\x00\x00\x00\x00\x7f\xff\xff\xff"), "a remark past the header"),
    (struct.pack(">iI", 6, 100) + b"{}", "a header length past the frame"),
])  # fmt: skip
@pytest.mark.parametrize("port", ["remoting", "namesrv"])
def test_bad_frames_close_the_connection(broker, data, why, port):
    addr = broker.remoting_endpoint if port == "remoting" else broker.namesrv_endpoint
    with _connect(addr) as s:
        s.sendall(data)
        assert _closed_by_server(s), why
    _still_serves(broker)


def test_truncated_frame_then_hang_up_and_a_silent_client(broker):
    with _connect(broker.remoting_endpoint) as s:
        s.sendall(_frame(0, JSON_HEADER)[:20])  # half a frame, then the client goes away
    silent = _connect(broker.remoting_endpoint)  # connects and sends nothing
    try:
        _still_serves(broker)
    finally:
        silent.close()


def test_a_thousand_idle_connections_cost_no_thread_and_block_nothing(broker):
    import resource
    import threading

    # both ends of every connection live in this process: 2,000 descriptors and some
    need = 2 * 1000 + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.fail(
                f"the descriptor limit ({hard}) is below the {need} this test needs: raise it (ulimit -Hn)"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    threads_before = threading.active_count()
    idle = [_connect(broker.remoting_endpoint) for _ in range(1000)]
    try:
        _still_serves(broker)
        assert threading.active_count() <= threads_before + 2
    finally:
        for s in idle:
            s.close()
    _still_serves(broker)


@pytest.mark.parametrize("stype", list(SerializeType))
def test_unknown_code_missing_and_malformed_fields_get_error_answers(broker, stype):
    with RemotingClient(broker.remoting_endpoint) as c:

        def ask(code: int, fields: dict[str, str], body: bytes = b"") -> RemotingCommand:
            return c.request(RemotingCommand(code, fields, body, serialize_type=stype, version=409))

        unknown = ask(9999, {})
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "9999" in unknown.remark
        assert unknown.serialize_type is stype
        missing = ask(RequestCode.GET_MAX_OFFSET, {"topic": "T"})
        assert missing.code == ResponseCode.SYSTEM_ERROR and "queueId" in missing.remark
        not_a_number = ask(
            RequestCode.PULL_MESSAGE,
            {
                "consumerGroup": "g",
                "topic": "T",
                "queueId": "x",
                "queueOffset": "0",
                "maxMsgNums": "1",
                "sysFlag": "0",
            },
        )
        assert not_a_number.code == ResponseCode.SYSTEM_ERROR and "queueId" in not_a_number.remark
        bad_body = ask(RequestCode.HEART_BEAT, {}, b"{not json")
        assert bad_body.code == ResponseCode.SYSTEM_ERROR
        send = {
            "a": "pg",
            "c": "TBW102",
            "d": "4",
            "e": "0",
            "f": "0",
            "g": "1",
            "h": "0",
            "i": "",
            "j": "0",
            "k": "false",
        }
        invalid = ask(RequestCode.SEND_MESSAGE_V2, {**send, "b": "bad topic!"}, b"x")
        assert invalid.code == ResponseCode.SYSTEM_ERROR
        system = ask(RequestCode.SEND_MESSAGE_V2, {**send, "b": "RMQ_SYS_TRANS_HALF_TOPIC"}, b"x")
        assert system.code == ResponseCode.NO_PERMISSION
        bad_queue = ask(RequestCode.SEND_MESSAGE_V2, {**send, "b": "T", "e": "99"}, b"x")
        assert bad_queue.code == ResponseCode.SYSTEM_ERROR and "queueId" in bad_queue.remark
        bad_batch = ask(
            RequestCode.SEND_BATCH_MESSAGE, {**send, "b": "T", "m": "true"}, b"\x00\x00\x00\x40junk"
        )
        assert bad_batch.code == ResponseCode.SYSTEM_ERROR
        ok = ask(RequestCode.SEND_MESSAGE_V2, {**send, "b": "T"}, b"hello")
        assert ok.code == ResponseCode.SUCCESS and ok.ext_fields["queueOffset"] == "0"
    _still_serves(broker)


def test_another_broker_registers_with_this_namesrv_and_leaves(tmp_path, broker):
    opts = BrokerOptions(
        listen="127.0.0.1:0",
        remoting_listen="127.0.0.1:0",
        namesrv_addrs=(broker.namesrv_endpoint,),
        cluster_name="OtherCluster",
    )
    cfg_name = "broker-b"
    from rmq_spark.services.core import BrokerConfig

    with Broker(str(tmp_path / "b"), config=BrokerConfig(broker_name=cfg_name), options=opts) as b:
        b.store.topics.get_or_create("OnlyOnB")
        assert b.remoting.register_once() == [broker.namesrv_endpoint]
        info = jsonbody.loads(
            request(broker.namesrv_endpoint, RequestCode.GET_BROKER_CLUSTER_INFO).body
        )
        assert info["clusterAddrTable"]["OtherCluster"] == [cfg_name]
        assert info["brokerAddrTable"][cfg_name]["brokerAddrs"] == {"0": b.remoting_endpoint}
        route = json.loads(
            request(
                broker.namesrv_endpoint, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "OnlyOnB"}
            ).body
        )
        # only the broker that has it (the local one would only create a topic nobody has)
        assert [q["brokerName"] for q in route["queueDatas"]] == [cfg_name]
    info = jsonbody.loads(
        request(broker.namesrv_endpoint, RequestCode.GET_BROKER_CLUSTER_INFO).body
    )
    assert "OtherCluster" not in info["clusterAddrTable"]


def test_an_open_remoting_connection_counts_as_activity(broker):
    """--idle-exit-s watches the broker's activity: a remoting client holds a connection open
    (heartbeats every 30 s) and must keep the broker up like an open gRPC stream does."""
    s = _connect(broker.remoting_endpoint)
    try:
        deadline = time.monotonic() + 5
        while broker.idle_s() != 0.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert broker.idle_s() == 0.0
    finally:
        s.close()
    deadline = time.monotonic() + 5
    while broker.idle_s() == 0.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert broker.idle_s() > 0.0


# --- issue 28 item 20: the codec and the log ----------------------------------------------------
def _remoting_records(caplog, level: int) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.levelno >= level and r.name.startswith(("rmq_spark", "asyncio"))
    ]


@pytest.mark.parametrize("nesting", [b"[" * 15_000, b'{"a":' * 3_000, b"[" * 200])
def test_a_deeply_nested_json_header_closes_the_connection_with_one_warning(
    broker, caplog, nesting
):
    """15 KB of nesting made json.loads raise RecursionError past the codec: asyncio logged a
    25-line traceback at ERROR for every such frame.  Now: a bad frame, one WARNING line."""
    caplog.set_level(logging.INFO)
    header = b'{"code":30,"opaque":1,"extFields":{"topic":' + nesting + b"}}"
    with _connect(broker.remoting_endpoint) as s:
        s.sendall(_frame(0, header))
        assert _closed_by_server(s)
    _still_serves(broker)
    assert not _remoting_records(caplog, logging.ERROR)
    warnings = _remoting_records(caplog, logging.WARNING)
    assert (
        len(warnings) == 1 and "bad frame" in warnings[0].getMessage() and not warnings[0].exc_info
    )
    assert "\n" not in warnings[0].getMessage()


def test_unknown_request_codes_are_counted_not_logged_one_line_each(broker, caplog):
    caplog.set_level(logging.DEBUG)
    server = broker.remoting.broker_server
    before = server.unsupported_requests
    with RemotingClient(broker.remoting_endpoint) as c:
        for code in range(5000, 5300):
            answer = c.request(RemotingCommand(code, {}, version=409))
            assert (
                answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
                and str(code) in answer.remark
            )
    assert server.unsupported_requests - before == 300
    lines = [
        r
        for r in caplog.records
        if r.name.startswith("rmq_spark") and "not supported" in r.getMessage()
    ]
    assert 1 <= len(lines) <= 2  # at most one line per 10 s


@pytest.mark.parametrize("stype", list(SerializeType))
def test_a_lone_surrogate_in_properties_gets_a_clear_answer(broker, stype):
    """A JSON header may carry ``\\ud800``, text no UTF-8 file can hold; the answer names the
    problem (not ``UnicodeEncodeError``) and the connection goes on serving."""
    send = {"a": "pg", "b": "T", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0",
            "i": "k\u0001v\ud800\u0002", "j": "0", "k": "false"}  # fmt: skip
    if stype is SerializeType.JSON:
        header = json.dumps(
            {
                "code": 310,
                "opaque": 7,
                "flag": 0,
                "version": 409,
                "language": "JAVA",
                "extFields": send,
            }
        ).encode()  # fmt: skip (ensure_ascii: "\ud800" escaped)
        data = _frame(0, header, b"body")
    else:  # the binary header cannot carry it: its text must be UTF-8, else a bad frame
        data = RemotingCommand(310, {**send, "i": "k\u0001v\u0002"}, b"body", 7, version=409,
                               serialize_type=stype).encode()  # fmt: skip
    with _connect(broker.remoting_endpoint) as s:
        s.sendall(data)
        answer = _read_answer(s)
        assert answer.opaque == 7
        if stype is SerializeType.JSON:
            assert answer.code in (ResponseCode.SYSTEM_ERROR, ResponseCode.MESSAGE_ILLEGAL)
            assert "Error" not in (answer.remark or "") and answer.remark
        else:
            assert answer.code == ResponseCode.SUCCESS
        s.sendall(_frame(0, JSON_HEADER))
        assert _read_answer(s).code == ResponseCode.SUCCESS
    _still_serves(broker)


def _read_answer(s: socket.socket) -> RemotingCommand:
    from rmq_spark.remoting.command import decode_frame

    s.settimeout(10)
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
        chunk = s.recv(65536)
        assert chunk, "the server closed the connection"
        buf += chunk
    n = struct.unpack(">i", buf[:4])[0]
    assert len(buf) == 4 + n
    return decode_frame(buf[4:])


def test_a_handler_fault_is_answered_generically_and_logged_once(broker, caplog):
    """Python's exception text is the broker's business: the client gets a generic SYSTEM_ERROR,
    the log one traceback however often the client repeats the request."""
    caplog.set_level(logging.INFO)
    handlers = broker.remoting.broker_server.processor.handlers

    def broken(conn, req):  # type: ignore[no-untyped-def]
        return int("abc")

    original = handlers[RequestCode.GET_MIN_OFFSET]
    handlers[RequestCode.GET_MIN_OFFSET] = broken
    try:
        with RemotingClient(broker.remoting_endpoint) as c:
            for _ in range(20):
                answer = c.request(RemotingCommand(RequestCode.GET_MIN_OFFSET, {"topic": "T", "queueId": "0"},
                                                   version=409))  # fmt: skip
                assert answer.code == ResponseCode.SYSTEM_ERROR
                assert "invalid literal" not in answer.remark and "ValueError" not in answer.remark
                assert "failed inside the broker" in answer.remark
    finally:
        handlers[RequestCode.GET_MIN_OFFSET] = original
    logged = [r for r in caplog.records if r.exc_info and r.name.startswith("rmq_spark")]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR
    _still_serves(broker)


def test_out_of_descriptors_is_service_not_available(broker, monkeypatch):
    """RocketMQ's answer when the broker cannot open a file; never ``OSError: [Errno 24]``."""
    import errno

    def no_fds(*_a, **_k):  # type: ignore[no-untyped-def]
        raise OSError(errno.EMFILE, "Too many open files", "commitlog/00000000001073741824")

    monkeypatch.setattr(broker.core, "send", no_fds)
    send = {"a": "pg", "b": "T", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0", "i": "",
            "j": "0", "k": "false"}  # fmt: skip
    with RemotingClient(broker.remoting_endpoint) as c:
        r = c.request(RemotingCommand(RequestCode.SEND_MESSAGE_V2, send, b"x", version=409))
    assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "Errno" not in r.remark and "file descriptors" in r.remark


def test_a_client_pipelining_thousands_of_requests_shares_the_loop(broker):
    """20,000 requests in one write are served a few per turn of the event loop: another client's
    request is served among them, not after a whole 256 KiB read of them (about 2,600)."""
    import threading

    handlers = broker.remoting.broker_server.processor.handlers
    served: list[int] = []
    seen_by_probe: list[int] = []
    real_max, real_min = handlers[RequestCode.GET_MAX_OFFSET], handlers[RequestCode.GET_MIN_OFFSET]

    def counted(conn, req):  # type: ignore[no-untyped-def]
        served.append(1)
        return real_max(conn, req)

    def probe(conn, req):  # type: ignore[no-untyped-def]
        seen_by_probe.append(len(served))
        return real_min(conn, req)

    handlers[RequestCode.GET_MAX_OFFSET], handlers[RequestCode.GET_MIN_OFFSET] = counted, probe
    try:
        frames = b"".join(
            RemotingCommand(
                RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": "0"}, opaque=i
            ).encode()
            for i in range(1, 20_001)
        )
        with (
            _connect(broker.remoting_endpoint) as s,
            RemotingClient(broker.remoting_endpoint) as other,
        ):
            drain = threading.Thread(target=lambda: _drain_answers(s, 20_000), daemon=True)
            drain.start()
            s.sendall(frames)
            deadline = time.monotonic() + 30
            while not served:
                assert time.monotonic() < deadline
                time.sleep(0.001)
            answer = other.request(
                RemotingCommand(RequestCode.GET_MIN_OFFSET, {"topic": "T", "queueId": "0"})
            )
            assert answer.code == ResponseCode.SUCCESS
            drain.join(60)
    finally:
        handlers[RequestCode.GET_MAX_OFFSET], handlers[RequestCode.GET_MIN_OFFSET] = (
            real_max,
            real_min,
        )
    assert len(served) == 20_000
    assert seen_by_probe[0] < 1000, seen_by_probe  # 32 to 64 measured; about 1,500 before


def _drain_answers(s: socket.socket, n: int) -> None:
    s.settimeout(60)
    buf = b""
    got = 0
    while got < n:
        chunk = s.recv(1 << 16)
        if not chunk:
            return
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">i", buf[:4])[0]:
            buf = buf[4 + struct.unpack(">i", buf[:4])[0] :]
            got += 1
