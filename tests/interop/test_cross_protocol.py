"""One store, two protocols: the Java remoting clients and the official Python gRPC client
(``rocketmq-python-client``) against the same rmq-broker.  A message sent through either is
consumed through the other with the same message id, queue offset, tag, keys and properties; a
delayed message waits its delay whichever side sent it; a consumer group's committed offsets are
the same through both."""

from __future__ import annotations

import time

import pytest
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)
from rocketmq.grpc_protocol import definition_pb2 as D
from rocketmq.grpc_protocol import service_pb2 as S
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub


def _config(endpoint: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials("", ""), request_timeout=5)


def _metadata() -> list[tuple[str, str]]:
    from rmq_spark.broker.testing import metadata

    return metadata()


@pytest.fixture
def grpc_producer(rmq_java):
    producers = []

    def make(topic: str) -> Producer:
        p = Producer(_config(rmq_java.target.grpc_endpoint), (topic,))
        p.startup()
        producers.append(p)
        return p

    yield make
    for p in producers:
        p.shutdown()


def _receive(endpoint: str, group: str, topic: str, n: int, timeout_s: float = 30) -> list:
    consumer = SimpleConsumer(
        _config(endpoint), group, {topic: FilterExpression()}, await_duration=2
    )
    consumer.startup()
    got: list = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(got) < n and time.monotonic() < deadline:
            for m in consumer.receive(32, 20):
                got.append(m)
                consumer.ack(m)
    finally:
        consumer.shutdown()
    return got


def test_java_remoting_producer_to_python_grpc_consumer(rmq_java, names):
    topic, group = f"{names}_T", f"{names}_G"
    rmq_java.create_topic(topic, queues=2)
    sent = rmq_java.run(
        "producer",
        group=f"{group}_p",
        topic=topic,
        count=6,
        tags="TagA,TagB",
        key_prefix="k",
        props="color=red",
    ).events("sent")
    got = _receive(rmq_java.target.grpc_endpoint, group, topic, 6)
    assert sorted(m.body for m in got) == sorted(f"msg {i}".encode() for i in range(6))
    by_id = {e["msgId"]: e for e in sent}
    assert {m.message_id for m in got} == set(by_id)
    for m in got:
        i = int(m.properties["i"])
        assert (m.topic, m.tag, m.keys) == (topic, ("TagA", "TagB")[i % 2], {f"k-{i}"})
        assert m.properties["color"] == "red"


def test_python_grpc_producer_to_java_remoting_consumers(rmq_java, names, grpc_producer):
    topic, group = f"{names}_T", f"{names}_G"
    rmq_java.create_topic(topic, queues=2)
    p = grpc_producer(topic)
    receipts = {}
    for i in range(6):
        m = Message()
        m.topic, m.body, m.tag = topic, f"grpc {i}".encode(), "TagG"
        m.keys = f"gk-{i}"
        m.add_property("i", str(i))
        receipts[i] = p.send(m)
    got = rmq_java.run(
        "lite-pull-consumer", group=group, topic=topic, expect=6, settle_ms=1000
    ).events("received")
    assert sorted(e["body"] for e in got) == [f"grpc {i}" for i in range(6)]
    for e in got:
        r = receipts[int(e["properties"]["i"])]
        assert e["msgId"] == r.message_id and e["queueOffset"] == r.offset
        assert (e["tags"], e["keys"], e["topic"]) == ("TagG", f"gk-{e['properties']['i']}", topic)
    pushed = rmq_java.run(
        "seed001-push-consumer",
        group=f"{group}_push",
        topic=topic,
        tag_expr="TagG",
        expect=6,
        settle_ms=1000,
    ).events("received")
    assert {e["msgId"] for e in pushed} == {r.message_id for r in receipts.values()}


def test_delay_sent_through_grpc_waits_for_the_java_consumer(rmq_java, names, grpc_producer):
    topic, group = f"{names}_T", f"{names}_G"
    rmq_java.create_topic(topic, queues=2)
    p = grpc_producer(topic)
    m = Message()
    m.topic, m.body = topic, b"later"
    deliver_at_s = int(time.time()) + 5  # the Python client takes whole seconds
    m.delivery_timestamp = deliver_at_s
    receipt = p.send(m)
    got = rmq_java.run(
        "seed001-push-consumer", group=group, topic=topic, expect=1, timeout_s=30
    ).events("received")
    assert [e["msgId"] for e in got] == [receipt.message_id]
    assert got[0]["receivedAt"] >= deliver_at_s * 1000 - 200


def test_a_groups_offsets_are_the_same_through_both_protocols(rmq_java, names):
    topic, group = f"{names}_T", f"{names}_G"
    rmq_java.create_topic(topic, queues=2)
    rmq_java.run("producer", group=f"{group}_p", topic=topic, count=10)
    rmq_java.run(
        "seed001-pull-consumer", group=group, topic=topic, commit=True
    )  # commits over remoting
    java_view = rmq_java.run(
        "offsets", group=f"{group}_o", topic=topic, group_offsets=group
    ).events("offsets")
    import grpc

    with grpc.insecure_channel(rmq_java.target.grpc_endpoint) as ch:
        stub = MessagingServiceStub(ch)
        for o in java_view:
            mq = D.MessageQueue(topic=D.Resource(name=topic), id=o["queueId"],
                                broker=D.Broker(name=o["brokerName"]))  # fmt: skip
            got = stub.GetOffset(S.GetOffsetRequest(group=D.Resource(name=group), message_queue=mq),
                                 metadata=_metadata(), timeout=10)  # fmt: skip
            assert got.offset == o["committed"] == o["maxOffset"]
            # and the other way round: an offset committed over gRPC is what remoting reports
            stub.UpdateOffset(S.UpdateOffsetRequest(group=D.Resource(name=group), message_queue=mq, offset=1),
                              metadata=_metadata(), timeout=10)  # fmt: skip
    again = rmq_java.run("offsets", group=f"{group}_o", topic=topic, group_offsets=group).events(
        "offsets"
    )
    assert [o["committed"] for o in again] == [1] * len(again)


def test_java_transaction_producer_to_python_grpc_consumer(rmq_java, names):
    """Seed 002's TransactionMQProducer over remoting (UNKNOW, then the check-back over its
    connection: COMMIT for index % 3 == 1, ROLLBACK for 2): a gRPC consumer gets exactly the
    committed messages, with the transaction's message id."""
    topic, group = f"{names}_T", f"{names}_G"
    rmq_java.create_topic(topic, queues=2)
    result = rmq_java.run(
        "seed002-transaction-producer", group=f"{group}_tx", topic=topic, count=6, timeout_s=60
    )
    committed = {e["transactionId"] for e in result.events("local") if e["status"] == 1}
    got = _receive(rmq_java.target.grpc_endpoint, group, topic, 2)
    time.sleep(2)
    got += _receive(
        rmq_java.target.grpc_endpoint, group, topic, 1, timeout_s=3
    )  # nothing more comes
    assert sorted(m.body for m in got) == [b"hello 1", b"hello 4"]
    assert {m.message_id for m in got} == committed
