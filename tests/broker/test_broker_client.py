"""The official ``rocketmq-python-client`` (5.1.2) against a real ``rmq-broker`` process.

One broker process serves the module (each test has its own topics and groups); times are
shortened by flags: invisible times of 1 s are allowed, delay levels (the push consumer's retry
backoff) are 1 s, three deliveries before the DLQ, transaction checks every 0.5 s.
"""

from __future__ import annotations

import threading
import time
import uuid

import grpc
import pytest
from rocketmq import (
    ConsumeResult,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import FilterType
from rocketmq.grpc_protocol import definition_pb2 as D
from rocketmq.grpc_protocol import service_pb2 as S
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from rmq_spark.broker.testing import BrokerProcess, client_configuration, metadata

FLAGS = (
    "--min-invisible-s",
    "1",
    "--delay-levels",
    "1s 1s 1s",
    "--max-delivery-attempts",
    "3",
    "--transaction-timeout",
    "1",
    "--transaction-check-interval",
    "0.5",
    "--long-polling-max-s",
    "3",
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(str(tmp_path_factory.mktemp("client") / "store"), *FLAGS)
    yield b
    assert b.stop() == 0


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def message(
    topic: str,
    body: bytes,
    tag: str | None = None,
    keys: tuple[str, ...] = (),
    group: str | None = None,
    props: dict[str, str] | None = None,
    deliver_at_s: int | None = None,
) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    for k in keys:
        m.keys = k  # the setter adds one key
    if group:
        m.message_group = group
    for k, v in (props or {}).items():
        m.add_property(k, v)
    if deliver_at_s:
        m.delivery_timestamp = deliver_at_s
    return m


class Clients:
    """Starts clients and shuts them all down at the end of a test."""

    def __init__(self, endpoints: str) -> None:
        self.endpoints = endpoints
        self.started: list = []

    def producer(self, *topics: str, checker=None, **cred) -> Producer:
        p = Producer(client_configuration(self.endpoints, **cred), topics, checker=checker)
        p.startup()
        self.started.append(p)
        return p

    def simple(
        self, group: str, topic: str, expr: FilterExpression | None = None, await_s: int = 2
    ) -> SimpleConsumer:
        c = SimpleConsumer(
            client_configuration(self.endpoints),
            group,
            {topic: expr or FilterExpression()},
            await_duration=await_s,
        )
        c.startup()
        self.started.append(c)
        return c

    def push(self, group: str, topic: str, listener: MessageListener) -> PushConsumer:
        c = PushConsumer(
            client_configuration(self.endpoints), group, listener, {topic: FilterExpression()}
        )
        c.startup()
        self.started.append(c)
        return c

    def close(self) -> None:
        for c in reversed(self.started):
            c.shutdown()


@pytest.fixture
def clients(broker):
    c = Clients(broker.endpoints)
    yield c
    c.close()


def receive_all(
    consumer: SimpleConsumer, n: int, invisible_s: int = 10, ack: bool = True, timeout_s: float = 20
) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        for m in consumer.receive(min(32, n - len(got)), invisible_s):
            got.append(m)
            if ack:
                consumer.ack(m)
    return got


def test_send_receive_ack(clients):
    topic, group = name("Normal"), name("g")
    p = clients.producer(topic)
    receipts = [
        p.send(message(topic, b"body-%d" % i, tag="t", keys=(f"k{i}",), props={"n": str(i)}))
        for i in range(5)
    ]
    assert all(r.transaction_id == r.message_id and r.offset >= 0 for r in receipts)
    c = clients.simple(group, topic)
    got = receive_all(c, 5)
    assert sorted(m.body for m in got) == [b"body-%d" % i for i in range(5)]
    by_id = {m.message_id: m for m in got}
    assert set(by_id) == {r.message_id for r in receipts}
    m0 = by_id[receipts[0].message_id]
    assert (m0.topic, m0.tag, m0.keys, m0.properties) == (topic, "t", {"k0"}, {"n": "0"})
    assert m0.delivery_attempt == 1 and not m0.corrupted and m0.born_timestamp > 0
    assert c.receive(32, 10) == []  # all acked


def test_tag_and_sql_filters(clients):
    topic = name("Filtered")
    p = clients.producer(topic)
    for i in range(6):
        p.send(message(topic, b"%d" % i, tag="even" if i % 2 == 0 else "odd", props={"n": str(i)}))
    tags = receive_all(clients.simple(name("g"), topic, FilterExpression("odd || none")), 3)
    assert sorted(m.body for m in tags) == [b"1", b"3", b"5"]
    sql = receive_all(
        clients.simple(name("g"), topic, FilterExpression("n >= 4", FilterType.SQL)), 2
    )
    assert sorted(m.body for m in sql) == [b"4", b"5"]


def test_fifo_order_within_a_message_group(clients):
    topic, group = name("Fifo"), name("g")
    p = clients.producer(topic)
    sent = {g: [] for g in ("A", "B", "C")}
    for i in range(6):
        for g in sent:
            body = f"{g}{i}".encode()
            p.send(message(topic, body, group=g))
            sent[g].append(body)
    c = clients.simple(group, topic)
    (first,) = c.receive(1, 10)
    blocked = first.message_group
    assert first.body == sent[blocked][0] and first.properties.get("__SHARDINGKEY") == blocked
    others = receive_all(c, 12, ack=False, timeout_s=5)
    assert all(m.message_group != blocked for m in others)  # its group waits for the first
    for g in sent:
        if g != blocked:
            assert [m.body for m in others if m.message_group == g] == sent[g]
    for m in others:
        c.ack(m)
    c.ack(first)
    rest = receive_all(c, 5)
    assert [m.body for m in rest] == sent[blocked][1:]


def test_change_invisible_duration_and_redelivery(clients):
    topic, group = name("Redeliver"), name("g")
    p = clients.producer(topic)
    r = p.send(message(topic, b"again"))
    c = clients.simple(group, topic)
    (m,) = receive_all(c, 1, invisible_s=1, ack=False)
    assert m.delivery_attempt == 1
    (m2,) = receive_all(c, 1, invisible_s=2, ack=False)  # comes back after 1 s
    assert m2.message_id == r.message_id and m2.delivery_attempt == 2
    old = m2.receipt_handle
    c.change_invisible_duration(m2, 4)
    assert m2.receipt_handle != old
    t0 = time.monotonic()
    assert c.receive(1, 1) == [] and time.monotonic() - t0 >= 1.5  # still invisible
    c.ack(m2)
    m.receipt_handle  # noqa: B018 - the first handle is stale now
    with pytest.raises(Exception, match="receipt handle"):
        c.ack(m)


def _queue_end(endpoints: str, topic: str, queue_id: int) -> int:
    with grpc.insecure_channel(endpoints) as ch:
        mq = D.MessageQueue(topic=D.Resource(name=topic), id=queue_id)
        r = MessagingServiceStub(ch).QueryOffset(
            S.QueryOffsetRequest(message_queue=mq, query_offset_policy=D.QueryOffsetPolicy.END),
            metadata=metadata(),
            timeout=10,
        )
        return r.offset


def test_dead_letter_queue_after_max_attempts(broker, clients):
    topic, group = name("Dlq"), name("g")
    p = clients.producer(topic)
    r = p.send(message(topic, b"poison"))
    c = clients.simple(group, topic)
    attempts = []
    for _ in range(3):
        (m,) = receive_all(c, 1, invisible_s=1, ack=False)
        attempts.append(m.delivery_attempt)
    assert attempts == [1, 2, 3]
    # the broker creates the DLQ topic with its first message, once the third invisible time is
    # over (a route query never creates it): subscribe when it exists
    deadline = time.monotonic() + 30
    while _queue_end(broker.endpoints, f"%DLQ%{group}", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    dlq = clients.simple(name("reader"), f"%DLQ%{group}")
    got = receive_all(dlq, 1)
    # (this failed twice in many runs, under load; what the broker holds tells where it stuck)
    assert len(got) == 1, (f"DLQ queue end {_queue_end(broker.endpoints, f'%DLQ%{group}', 0)}, "
                           f"retry queue end {_queue_end(broker.endpoints, f'%RETRY%{group}', 0)}; "
                           f"broker log: {broker.log_tail()}")  # fmt: skip
    (d,) = got
    assert d.body == b"poison" and d.message_id == r.message_id
    assert c.receive(1, 1) == []  # and the group does not see it again


def test_transactions_commit_rollback_and_orphan(clients):
    topic = name("Txn")
    asked = []

    class Checker(TransactionChecker):
        def check(self, msg: Message) -> TransactionResolution:
            asked.append(msg.body)
            return TransactionResolution.COMMIT

    p = clients.producer(topic, checker=Checker())
    receipts = {}
    for what in ("commit", "rollback", "orphan"):
        tx = p.begin_transaction()
        receipts[what] = p.send(message(topic, what.encode()), tx)
        if what == "commit":
            tx.commit()
        elif what == "rollback":
            tx.rollback()
    c = clients.simple(name("g"), topic)
    got = receive_all(c, 2, timeout_s=15)
    assert sorted(m.body for m in got) == [b"commit", b"orphan"]
    assert asked == [b"orphan"]  # the check-back asked the producer about the orphan only
    for m in got:
        assert m.properties["__transactionId__"] == receipts[m.body.decode()].transaction_id
    assert c.receive(32, 10) == []


def test_push_consumer_consumes_and_retries(clients):
    topic, group = name("Push"), name("g")
    p = clients.producer(topic)
    for i in range(10):
        p.send(message(topic, b"%d" % i))
    seen: list[tuple[bytes, int]] = []
    done = threading.Event()

    class Listener(MessageListener):
        def consume(self, msg: Message) -> ConsumeResult:
            seen.append((msg.body, msg.delivery_attempt))
            if len({b for b, _ in seen}) == 10 and (b"3", 2) in seen:
                done.set()
            return (
                ConsumeResult.FAILURE
                if msg.body == b"3" and msg.delivery_attempt == 1
                else ConsumeResult.SUCCESS
            )

    clients.push(group, topic, Listener())
    assert done.wait(30), seen
    assert sorted({b for b, _ in seen}) == sorted(b"%d" % i for i in range(10))
    assert (b"3", 1) in seen and (b"3", 2) in seen


def test_everything_sent_and_acked_survives_a_restart(tmp_path):
    store = str(tmp_path / "store")
    topic, group = name("Durable"), name("g")
    with BrokerProcess(store, *FLAGS) as b:
        c = Clients(b.endpoints)
        try:
            p = c.producer(topic)
            ids = [p.send(message(topic, b"%d" % i)).message_id for i in range(20)]
            consumer = c.simple(group, topic)
            acked = receive_all(consumer, 8)
            held = receive_all(consumer, 4, invisible_s=60, ack=False)
        finally:
            c.close()
        assert b.stop() == 0
    assert len(acked) == 8 and len(held) == 4
    acked_ids = {m.message_id for m in acked}
    with BrokerProcess(store, *FLAGS) as b:
        c = Clients(b.endpoints)
        try:
            rest = receive_all(c.simple(group, topic), 20 - len(acked_ids), timeout_s=10)
            assert {m.message_id for m in rest} == set(ids) - acked_ids
            assert {m.message_id for m in held} <= {m.message_id for m in rest}
            with grpc.insecure_channel(b.endpoints) as ch:
                stub = MessagingServiceStub(ch)
                total = 0
                for q in range(4):
                    mq = D.MessageQueue(topic=D.Resource(name=topic), id=q)
                    req = S.PullMessageRequest(
                        group=D.Resource(name="audit"), message_queue=mq, offset=0, batch_size=100
                    )
                    total += sum(
                        1
                        for r in stub.PullMessage(req, metadata=metadata(), timeout=10)
                        if r.HasField("message")
                    )
            assert total == 20
        finally:
            c.close()


def test_delay_by_delivery_timestamp_and_recall(clients):
    topic, group = name("Delay"), name("g")
    p = clients.producer(topic)
    c = clients.simple(group, topic, await_s=1)
    due_s = int(time.time()) + 3
    kept = p.send(message(topic, b"later", deliver_at_s=due_s))
    recalled = p.send(message(topic, b"never", deliver_at_s=due_s))
    assert kept.recall_handle and recalled.recall_handle
    assert p.recall_message(topic, recalled.recall_handle) == recalled.message_id
    with pytest.raises(Exception, match="recall"):
        p.recall_message(topic, recalled.recall_handle)  # once only
    assert c.receive(8, 10) == []  # not due yet
    got = receive_all(c, 1, timeout_s=10)
    assert [m.body for m in got] == [b"later"] and time.time() >= due_s - 0.1
    assert got[0].delivery_timestamp == due_s * 1000
    assert c.receive(8, 10) == []  # the recalled one never comes
    with pytest.raises(Exception, match="recall"):
        p.recall_message(topic, kept.recall_handle)  # delivered: too late
