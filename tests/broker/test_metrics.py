"""``--metrics-listen``: the broker's Prometheus metrics under RocketMQ's names and labels, read
over HTTP as Prometheus reads them, after real clients (the official Python client over gRPC, the
remoting protocol) produced and consumed."""

from __future__ import annotations

import os
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rocketmq import FilterExpression, Message, Producer, SimpleConsumer

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.broker.testing import BrokerProcess, client_configuration
from rmq_spark.broker.__main__ import main
from rmq_spark.remoting.client import request
from rmq_spark.remoting.codes import RequestCode, ResponseCode

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
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen="127.0.0.1:0",
                         metrics_listen="127.0.0.1:0")
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

    consumer = SimpleConsumer(client_configuration(broker.endpoints), "Readers", {"Metered": FilterExpression()},
                              await_duration=1)
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
    answer = request(broker.remoting_endpoint, RequestCode.CONSUMER_SEND_MSG_BACK,
                     {"offset": str(phys), "group": "Readers", "delayLevel": "-1", "maxReconsumeTimes": "16"})
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert request(broker.remoting_endpoint, RequestCode.GET_BROKER_RUNTIME_INFO).code == ResponseCode.SUCCESS

    got_metrics = scrape(broker.metrics.endpoint)

    assert value(got_metrics, "rocketmq_messages_in_total", topic="Metered", message_type="Normal") == len(bodies)
    assert value(got_metrics, "rocketmq_throughput_in_total", topic="Metered", message_type="Normal") == sum(map(len, bodies))
    assert value(got_metrics, "rocketmq_messages_in_total", topic="Ordered", message_type="FIFO") == 1
    small = sum(len(b) <= 1024 for b in bodies)
    assert value(got_metrics, "rocketmq_message_size_bucket", topic="Metered", message_type="Normal", le="1024.0") == small
    assert value(got_metrics, "rocketmq_message_size_bucket", topic="Metered", message_type="Normal", le="4096.0") == len(bodies)
    assert value(got_metrics, "rocketmq_message_size_count", topic="Metered", message_type="Normal") == len(bodies)

    assert value(got_metrics, "rocketmq_messages_out_total", topic="Metered", consumer_group="Readers") == len(got)
    out_bytes = value(got_metrics, "rocketmq_throughput_out_total", topic="Metered", consumer_group="Readers")
    assert out_bytes > sum(map(len, bodies))  # whole stored records: bodies and their headers
    assert value(got_metrics, "rocketmq_consumer_inflight_messages", topic="Metered", consumer_group="Readers") == 1
    assert value(got_metrics, "rocketmq_consumer_lag_messages", topic="Metered", consumer_group="Readers") == 1
    assert value(got_metrics, "rocketmq_consumer_ready_messages", topic="Metered", consumer_group="Readers") == 0
    assert value(got_metrics, "rocketmq_consumer_lag_latency", topic="Metered", consumer_group="Readers") >= 0
    assert value(got_metrics, "rocketmq_send_to_dlq_messages_total", topic="Metered", consumer_group="Readers") == 1

    assert value(got_metrics, "rocketmq_rpc_latency_count", protocol_type="remoting",
                 request_code=str(int(RequestCode.GET_BROKER_RUNTIME_INFO)), response_code="0") == 1
    # gRPC calls too, by method and the name of the response's status code
    assert value(got_metrics, "rocketmq_rpc_latency_count", protocol_type="grpc", request_code="SendMessage",
                 response_code="OK") == len(bodies) + 1
    assert value(got_metrics, "rocketmq_rpc_latency_count", protocol_type="grpc", request_code="AckMessage",
                 response_code="OK") == len(got) - 1
    assert value(got_metrics, "rocketmq_rpc_latency_count", protocol_type="grpc", request_code="ReceiveMessage",
                 response_code="OK") >= 1
    assert value(got_metrics, "rocketmq_rpc_latency_sum", protocol_type="grpc", request_code="SendMessage",
                 response_code="OK") > 0
    segments = [f for f in os.listdir(os.path.join(broker.store.root, "commitlog"))]
    assert value(got_metrics, "rmq_spark_commitlog_segments") == len(segments)
    assert value(got_metrics, "rocketmq_storage_size", storage_type="local", storage_medium="disk") > 0
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
        answer = request(proc.remoting_endpoint, RequestCode.UPDATE_AND_CREATE_TOPIC,
                         {"topic": "Made", "readQueueNums": "2", "writeQueueNums": "2", "perm": "6"})
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
        (["--log-level", "loud"], "--log-level must be one of DEBUG, INFO, WARNING, ERROR, not 'loud'"),
    ],
)
def test_bad_metrics_and_log_flags_exit_2(tmp_path, capsys, flags, message):
    assert main(["--store", str(tmp_path / "s"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
