"""``--metrics-listen``: the broker's Prometheus metrics under RocketMQ's names and labels, read
over HTTP as Prometheus reads them, after real clients (the official Python client over gRPC, the
remoting protocol) produced and consumed."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rocketmq import FilterExpression, Message, Producer, SimpleConsumer

from rmq_spark.broker.__main__ import main
from rmq_spark.broker.metrics import BoundedTraffic, MetricsServer
from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.broker.testing import BrokerProcess, client_configuration
from rmq_spark.remoting.client import RemotingClient, request
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand, decode_frame, split_frame
from rmq_spark.services.traffic import Traffic

BASE = {"cluster": "DefaultCluster", "node_type": "broker", "node_id": "rmq-spark-broker"}


def scrape(endpoint: str) -> dict[str, dict[tuple, float]]:
    """name of each sample -> {its labels but the base ones, sorted: value}; every sample must
    carry the base labels."""
    text = urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10).read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            for k, v in BASE.items():
                assert s.labels.get(k) == v, (s.name, s.labels)
            rest = tuple(sorted((k, v) for k, v in s.labels.items() if k not in BASE))
            out.setdefault(s.name, {})[rest] = s.value
    return out


def value(metrics: dict, name: str, **labels: str) -> float:
    return metrics[name][tuple(sorted(labels.items()))]


@pytest.fixture
def broker(tmp_path):
    opts = BrokerOptions(
        listen="127.0.0.1:0",
        remoting_listen="127.0.0.1:0",
        namesrv_listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
    )
    b = Broker(str(tmp_path / "store"), options=opts)
    yield b
    b.stop()


def test_traffic_consumers_and_store_metrics(broker):
    bodies = [b"a" * 100, b"b" * 100, b"c" * 100, b"d" * 2000]
    producer = Producer(client_configuration(broker.endpoints), ("Metered", "Ordered"))
    producer.startup()
    try:
        for body in bodies:
            m = Message()
            m.topic, m.body = "Metered", body
            producer.send(m)
        m = Message()
        m.topic, m.body, m.message_group = "Ordered", b"fifo", "g1"
        producer.send(m)
    finally:
        producer.shutdown()

    consumer = SimpleConsumer(
        client_configuration(broker.endpoints),
        "Readers",
        {"Metered": FilterExpression()},
        await_duration=1,
    )
    consumer.startup()
    try:
        got = []
        while len(got) < len(bodies):
            got += consumer.receive(32, 30)
        for m in got[:-1]:
            consumer.ack(m)
    finally:
        consumer.shutdown()
    broker.service.pop.persist()  # the acks' committed offsets (the pop service does it each second)

    # a message the consumer gives up on, by the remoting protocol: to %DLQ%Readers
    phys = None
    for q in range(4):
        cq = broker.store.consume_queue("Metered", q)
        if cq is not None and cq.max_offset:
            phys = cq.unit(cq.min_offset)[0]
            break
    answer = request(
        broker.remoting_endpoint,
        RequestCode.CONSUMER_SEND_MSG_BACK,
        {"offset": str(phys), "group": "Readers", "delayLevel": "-1", "maxReconsumeTimes": "16"},
    )
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert (
        request(broker.remoting_endpoint, RequestCode.GET_BROKER_RUNTIME_INFO).code
        == ResponseCode.SUCCESS
    )

    got_metrics = scrape(broker.metrics.endpoint)

    assert value(
        got_metrics, "rocketmq_messages_in_total", topic="Metered", message_type="Normal"
    ) == len(bodies)
    assert value(
        got_metrics, "rocketmq_throughput_in_total", topic="Metered", message_type="Normal"
    ) == sum(map(len, bodies))
    assert (
        value(got_metrics, "rocketmq_messages_in_total", topic="Ordered", message_type="FIFO") == 1
    )
    small = sum(len(b) <= 1024 for b in bodies)
    assert (
        value(
            got_metrics,
            "rocketmq_message_size_bucket",
            topic="Metered",
            message_type="Normal",
            le="1024.0",
        )
        == small
    )
    assert value(
        got_metrics,
        "rocketmq_message_size_bucket",
        topic="Metered",
        message_type="Normal",
        le="4096.0",
    ) == len(bodies)
    assert value(
        got_metrics, "rocketmq_message_size_count", topic="Metered", message_type="Normal"
    ) == len(bodies)

    assert value(
        got_metrics, "rocketmq_messages_out_total", topic="Metered", consumer_group="Readers"
    ) == len(got)
    out_bytes = value(
        got_metrics, "rocketmq_throughput_out_total", topic="Metered", consumer_group="Readers"
    )
    assert out_bytes > sum(map(len, bodies))  # whole stored records: bodies and their headers
    assert (
        value(
            got_metrics,
            "rocketmq_consumer_inflight_messages",
            topic="Metered",
            consumer_group="Readers",
        )
        == 1
    )
    assert (
        value(
            got_metrics, "rocketmq_consumer_lag_messages", topic="Metered", consumer_group="Readers"
        )
        == 1
    )
    assert (
        value(
            got_metrics,
            "rocketmq_consumer_ready_messages",
            topic="Metered",
            consumer_group="Readers",
        )
        == 0
    )
    assert (
        value(
            got_metrics, "rocketmq_consumer_lag_latency", topic="Metered", consumer_group="Readers"
        )
        >= 0
    )
    assert (
        value(
            got_metrics,
            "rocketmq_send_to_dlq_messages_total",
            topic="Metered",
            consumer_group="Readers",
        )
        == 1
    )

    assert (
        value(
            got_metrics,
            "rocketmq_rpc_latency_count",
            protocol_type="remoting",
            request_code=str(int(RequestCode.GET_BROKER_RUNTIME_INFO)),
            response_code="0",
        )
        == 1
    )
    # gRPC calls too, by method and the name of the response's status code
    assert (
        value(
            got_metrics,
            "rocketmq_rpc_latency_count",
            protocol_type="grpc",
            request_code="SendMessage",
            response_code="OK",
        )
        == len(bodies) + 1
    )
    assert (
        value(
            got_metrics,
            "rocketmq_rpc_latency_count",
            protocol_type="grpc",
            request_code="AckMessage",
            response_code="OK",
        )
        == len(got) - 1
    )
    assert (
        value(
            got_metrics,
            "rocketmq_rpc_latency_count",
            protocol_type="grpc",
            request_code="ReceiveMessage",
            response_code="OK",
        )
        >= 1
    )
    assert (
        value(
            got_metrics,
            "rocketmq_rpc_latency_sum",
            protocol_type="grpc",
            request_code="SendMessage",
            response_code="OK",
        )
        > 0
    )
    segments = list(os.listdir(os.path.join(broker.store.root, "commitlog")))
    assert value(got_metrics, "rmq_spark_commitlog_segments") == len(segments)
    assert (
        value(got_metrics, "rocketmq_storage_size", storage_type="local", storage_medium="disk") > 0
    )
    cl = broker.store.commitlog
    assert 0 <= value(got_metrics, "rocketmq_storage_flush_behind_bytes") <= cl.max_offset
    assert value(got_metrics, "rocketmq_storage_dispatch_behind_bytes") == 0
    assert value(got_metrics, "rocketmq_half_messages") == 0
    assert value(got_metrics, "rocketmq_timing_messages") == 0
    for name in ("rocketmq_storage_message_reserve_time", "rocketmq_producer_connections"):
        assert name in got_metrics


def test_broker_without_the_flag_serves_and_counts_nothing(tmp_path):
    b = Broker(str(tmp_path / "store"), listen="127.0.0.1:0")
    try:
        assert b.metrics is None and b.core.traffic is None
        assert "metrics=" not in b.ready_line()
    finally:
        b.stop()


def test_the_process_flag_serves_metrics_and_logs_events(tmp_path):
    with BrokerProcess(str(tmp_path / "store"), "--metrics-listen", "127.0.0.1:0", "--log-level", "info",
                       "--no-namesrv", log_path=str(tmp_path / "err.log")) as proc:  # fmt: skip
        assert proc.metrics_endpoint is not None
        answer = request(
            proc.remoting_endpoint,
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": "Made", "readQueueNums": "2", "writeQueueNums": "2", "perm": "6"},
        )
        assert answer.code == ResponseCode.SUCCESS
        metrics = scrape(proc.metrics_endpoint)
        assert "rocketmq_storage_size" in metrics
        producer = Producer(client_configuration(proc.endpoints), ("Made",))
        producer.startup()
        m = Message()
        m.topic, m.body = "Made", b"x"
        producer.send(m)
        producer.shutdown()
    with BrokerProcess(str(tmp_path / "store"), "--no-namesrv", log_path=str(tmp_path / "err.log")):
        pass  # the second start recovers what the first wrote
    log = (tmp_path / "err.log").read_text()
    assert "rmq_spark.broker: started: listening on" in log
    assert "topic Made created: 2 read / 2 write queues, perm 6" in log
    assert "stopped: store" in log
    assert "recovery: CommitLog checked from offset" in log
    assert "Traceback" not in log


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--metrics-listen", "nowhere"], "--metrics-listen 'nowhere' is not HOST:PORT"),
        (
            ["--log-level", "loud"],
            "--log-level must be one of DEBUG, INFO, WARNING, ERROR, not 'loud'",
        ),
    ],
)
def test_bad_metrics_and_log_flags_exit_2(tmp_path, capsys, flags, message):
    assert main(["--store", str(tmp_path / "s"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# --- label cardinality and the HTTP server's bounds (issue 28, item 18) ------------------------------
def _pipelined(
    endpoint: str, commands: list[RemotingCommand], chunk: int = 32
) -> list[RemotingCommand]:
    """Each command's answer, sent ``chunk`` at a time on one connection (few enough in flight for
    any per-connection bound the server keeps)."""
    host, _, port = endpoint.rpartition(":")
    answers = []
    with socket.create_connection((host, int(port)), timeout=30) as s:
        buf = b""
        for start in range(0, len(commands), chunk):
            part = commands[start : start + chunk]
            for i, c in enumerate(part):
                c.opaque = start + i + 1
            s.sendall(b"".join(c.encode() for c in part))
            got = 0
            while got < len(part):
                n = split_frame(buf)
                if n == 0:
                    more = s.recv(1 << 16)
                    assert more, "the broker closed the connection"
                    buf += more
                    continue
                answers.append(decode_frame(buf[4:n]))
                buf = buf[n:]
                got += 1
    return answers


def _scrape_text(endpoint: str) -> str:
    return urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=30).read().decode()


def test_client_named_labels_do_not_grow_the_scrape(broker):
    """20,000 request codes RocketMQ does not define and 5,000 made-up consumer groups pulling
    leave /metrics small: one request_code "unknown", no series for a group that does not exist."""
    endpoint = broker.remoting_endpoint
    made = request(endpoint, RequestCode.UPDATE_AND_CREATE_TOPIC,
                   {"topic": "Crowded", "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"})  # fmt: skip
    assert made.code == ResponseCode.SUCCESS, made.remark
    send = {"a": "pg", "b": "Crowded", "c": "TBW102", "d": "1", "e": "0", "f": "0", "g": "1", "h": "0", "i": "",
            "j": "0", "k": "false"}  # fmt: skip
    assert (
        request(endpoint, RequestCode.SEND_MESSAGE_V2, send, b"payload").code
        == ResponseCode.SUCCESS
    )
    known = {int(c) for c in RequestCode}
    unknown = [c for c in range(20_000, 60_000) if c not in known][:20_000]
    answers = _pipelined(endpoint, [RemotingCommand(code, {}) for code in unknown])
    assert {a.code for a in answers} == {ResponseCode.REQUEST_CODE_NOT_SUPPORTED}

    def pull(group: str) -> RemotingCommand:
        return RemotingCommand(RequestCode.PULL_MESSAGE, {
            "consumerGroup": group, "topic": "Crowded", "queueId": "0", "queueOffset": "0", "maxMsgNums": "1",
            "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0",
            "expressionType": "TAG"})  # fmt: skip

    pulled = _pipelined(endpoint, [pull(f"made-up-{i}") for i in range(5_000)] + [pull("real")])
    assert {a.code for a in pulled} == {ResponseCode.SUCCESS}
    commit = {"consumerGroup": "real", "topic": "Crowded", "queueId": "0", "commitOffset": "1"}
    assert (
        request(endpoint, RequestCode.UPDATE_CONSUMER_OFFSET, commit).code == ResponseCode.SUCCESS
    )

    text = _scrape_text(broker.metrics.endpoint)
    families = list(text_string_to_metric_families(text))
    samples = [s for f in families for s in f.samples]
    assert len(text) < 64 * 1024, len(text)
    assert len(samples) < 500, len(samples)
    remoting = {
        s.labels["request_code"] for s in samples if s.labels.get("protocol_type") == "remoting"
    }
    assert remoting == {"unknown", str(int(RequestCode.UPDATE_AND_CREATE_TOPIC)), str(int(RequestCode.SEND_MESSAGE_V2)),
                        str(int(RequestCode.PULL_MESSAGE)), str(int(RequestCode.UPDATE_CONSUMER_OFFSET))}  # fmt: skip
    got = scrape(broker.metrics.endpoint)
    assert value(
        got,
        "rocketmq_rpc_latency_count",
        protocol_type="remoting",
        request_code="unknown",
        response_code=str(int(ResponseCode.REQUEST_CODE_NOT_SUPPORTED)),
    ) == len(unknown)
    # only the group that exists (committed offsets) has series of its own
    groups = {s.labels["consumer_group"] for s in samples if "consumer_group" in s.labels}
    assert groups == {"real"}
    assert value(got, "rocketmq_messages_out_total", topic="Crowded", consumer_group="real") == 1
    # what the broker keeps to count them is bounded too: one key for every unknown code
    assert sum(1 for _p, code, _r in broker.core.traffic.traffic.rpc if code == "unknown") == 1


def test_the_series_of_each_metric_are_capped_and_the_rest_counted(broker):
    """Groups that exist but are too many for one scrape: at most max_series label sets per metric,
    the groups with a connected client first, and rmq_spark_metrics_dropped_series says how many
    were left out."""
    endpoint = broker.remoting_endpoint
    made = request(endpoint, RequestCode.UPDATE_AND_CREATE_TOPIC,
                   {"topic": "Many", "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"})  # fmt: skip
    assert made.code == ResponseCode.SUCCESS
    commits = [RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": f"g{i:03d}", "topic": "Many",
                                                                    "queueId": "0", "commitOffset": "0"})
               for i in range(120)]  # fmt: skip
    assert {a.code for a in _pipelined(endpoint, commits)} == {ResponseCode.SUCCESS}
    heartbeat = {"clientID": "c1", "producerDataSet": [], "consumerDataSet": [{
        "groupName": "g119", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"topic": "Many", "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": 0,
                                 "expressionType": "TAG", "classFilterMode": False}]}]}  # fmt: skip
    with RemotingClient(endpoint) as client:  # the connection stays open: g119 has a client
        answer = client.request(
            RemotingCommand(RequestCode.HEART_BEAT, {}, json.dumps(heartbeat).encode())
        )
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        broker.metrics.collector.max_series = 50
        got = scrape(broker.metrics.endpoint)
    lag = got["rocketmq_consumer_lag_messages"]
    groups = sorted(dict(labels)["consumer_group"] for labels in lag)
    # the connected group first
    assert len(groups) == 50 and groups[0] == "g000" and "g119" in groups
    for name in ("rocketmq_consumer_lag_messages", "rocketmq_consumer_lag_latency", "rocketmq_consumer_ready_messages",
                 "rocketmq_consumer_inflight_messages"):  # fmt: skip
        assert value(got, "rmq_spark_metrics_dropped_series", metric=name) == 120 - 50


def test_bounded_traffic_counts_at_most_max_pairs():
    traffic = BoundedTraffic(Traffic(), max_pairs=10)
    for i in range(100):
        traffic.delivered("T", f"g{i}", 1, 10)
        traffic.to_dlq("T", f"g{i}")
    traffic.delivered("T", "g0", 1, 10)  # a pair already counted still counts
    snap = traffic.snapshot()
    assert len(snap["out"]) == len(snap["dlq"]) == 10 and snap["out"][("T", "g0")] == (2, 20)
    assert traffic.dropped == 2 * 90
    traffic.request("remoting", 987_654, 0, 1.0)
    traffic.request("remoting", -3, 123_456, 1.0)
    traffic.request("remoting", int(RequestCode.PULL_MESSAGE), int(ResponseCode.SUCCESS), 1.0)
    assert set(traffic.snapshot()["rpc"]) == {("remoting", "unknown", "0"), ("remoting", "unknown", "unknown"),
                                               ("remoting", str(int(RequestCode.PULL_MESSAGE)), "0")}  # fmt: skip


def _wait_for(condition, timeout_s: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.02)


def _closed_by_server(s: socket.socket) -> bool:
    """True once the server closed ``s`` (reads end); what it sent before is drained."""
    s.settimeout(20)
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def test_idle_and_trickling_connections_are_closed_at_their_deadline(broker):
    server = MetricsServer(
        "127.0.0.1:0", broker.metrics.collector, timeout_s=0.5, max_connections=4
    )
    try:
        host, port = "127.0.0.1", server.port
        idle = [socket.create_connection((host, port), timeout=20) for _ in range(3)]
        trickler = socket.create_connection((host, port), timeout=20)
        _wait_for(lambda: server.http.active_connections == 4, what="four connections served")
        # a fifth is over max_connections: answered 503 at once, and closed
        with socket.create_connection((host, port), timeout=20) as extra:
            extra.settimeout(20)
            answer = b""
            while chunk := extra.recv(4096):
                answer += chunk
            assert answer.startswith(b"HTTP/1.0 503")
        assert server.http.refused_connections == 1
        # one byte at a time does not keep a connection past its deadline
        started = time.monotonic()
        closed_early = False
        for byte in b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"x" * 1000:
            try:
                trickler.send(bytes([byte]))
            except OSError:
                closed_early = True
                break
            if server.http.active_connections == 0:
                closed_early = True
                break
            time.sleep(0.05)
        assert closed_early and time.monotonic() - started < 10
        for s in [*idle, trickler]:
            assert _closed_by_server(s)
            s.close()
        _wait_for(lambda: server.http.active_connections == 0, what="every connection closed")
        # the trickler at least (an idle one may end at its read timeout first)
        assert server.http.expired_connections >= 1
        # the slots are free again: a scrape is served
        text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=20).read().decode()
        assert "rocketmq_storage_size" in text
    finally:
        server.stop()
