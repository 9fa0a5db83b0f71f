"""The MessagingService RPCs with raw stubs: status codes for bad and hostile requests, the
Telemetry settings handshake, QueryAssignment and the offset RPCs (PullMessage, GetOffset,
QueryOffset, UpdateOffset).  An in-process broker serves the module."""

from __future__ import annotations

import gzip
import threading
import time

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocketmq.grpc_protocol import definition_pb2 as D
from rocketmq.grpc_protocol import service_pb2 as S
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from rmq_spark.broker import Broker, BrokerOptions
from rmq_spark.broker.testing import metadata
from rmq_spark.services.config import BrokerConfig
from rmq_spark.store.config import TopicConfig
from rmq_spark.store.message import Message
from rmq_spark.store.store import StoreConfig

C = D.Code
MD = metadata()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    opts = BrokerOptions(min_invisible_ms=1000, long_polling_max_ms=2000)
    with Broker(
        str(tmp_path_factory.mktemp("rpc") / "store"), listen="127.0.0.1:0", options=opts
    ) as b:
        b.core.store.topics.create(TopicConfig("FifoOnly", message_type="FIFO"))
        yield b


@pytest.fixture(scope="module")
def stub(broker):
    with grpc.insecure_channel(broker.endpoints) as ch:
        yield MessagingServiceStub(ch)


def res(topic: str) -> D.Resource:
    return D.Resource(name=topic)


def send_request(
    topic: str = "Rpc", body: bytes = b"x", mid: str = "ID-1", **sp
) -> S.SendMessageRequest:
    m = D.Message(topic=res(topic), body=body)
    m.system_properties.message_id = mid
    m.system_properties.message_type = D.MessageType.NORMAL
    m.system_properties.body_encoding = D.Encoding.IDENTITY
    for k, v in sp.items():
        if k == "user":
            m.user_properties.update(v)
        elif k == "keys":
            m.system_properties.keys.extend(v)
        elif k == "deliver_ms":
            m.system_properties.delivery_timestamp.FromMilliseconds(v)
        else:
            setattr(m.system_properties, k, v)
    return S.SendMessageRequest(messages=[m])


def test_client_id_is_required(stub):
    r = stub.QueryRoute(S.QueryRouteRequest(topic=res("T")), timeout=10)
    assert r.status.code == C.CLIENT_ID_REQUIRED
    (cmd,) = list(stub.Telemetry(iter([S.TelemetryCommand()]), timeout=10))
    assert cmd.status.code == C.CLIENT_ID_REQUIRED


def test_route_topic_names_and_auto_create_off(stub, tmp_path):
    for bad in ("a b", "x" * 200, "SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer", ""):
        assert (
            stub.QueryRoute(
                S.QueryRouteRequest(topic=res(bad)), metadata=MD, timeout=10
            ).status.code
            == C.ILLEGAL_TOPIC
        )
    cfg = BrokerConfig(store=StoreConfig(auto_create_topics=False))
    with (
        Broker(str(tmp_path / "s"), listen="127.0.0.1:0", config=cfg) as b,
        grpc.insecure_channel(b.endpoints) as ch,
    ):
        r = MessagingServiceStub(ch).QueryRoute(
            S.QueryRouteRequest(topic=res("Nope")), metadata=MD, timeout=10
        )
        assert r.status.code == C.TOPIC_NOT_FOUND
        assert "No topic route info in name server for the topic: Nope" in r.status.message
        r = MessagingServiceStub(ch).SendMessage(send_request("Nope"), metadata=MD, timeout=10)
        assert r.status.code == C.TOPIC_NOT_FOUND


def test_route_echoes_the_requested_endpoints(stub):
    ep = D.Endpoints(
        scheme=D.AddressScheme.DOMAIN_NAME, addresses=[D.Address(host="broker.local", port=9876)]
    )
    r = stub.QueryRoute(
        S.QueryRouteRequest(topic=res("Echo"), endpoints=ep), metadata=MD, timeout=10
    )
    assert r.status.code == C.OK and all(q.broker.endpoints == ep for q in r.message_queues)
    r = stub.QueryRoute(S.QueryRouteRequest(topic=res("FifoOnly")), metadata=MD, timeout=10)
    assert list(r.message_queues[0].accept_message_types) == [D.MessageType.FIFO]


@pytest.mark.parametrize(
    "req, code",
    [
        (S.SendMessageRequest(), C.BAD_REQUEST),
        (send_request(body=b""), C.MESSAGE_BODY_EMPTY),
        (send_request(body=b"x" * (4 * 1024 * 1024 + 1)), C.MESSAGE_BODY_TOO_LARGE),
        (send_request(tag="a|b"), C.ILLEGAL_MESSAGE_TAG),
        (send_request(tag=" "), C.ILLEGAL_MESSAGE_TAG),
        (send_request(keys=["ok", " "]), C.ILLEGAL_MESSAGE_KEY),
        (send_request(user={"UNIQ_KEY": "mine"}), C.ILLEGAL_MESSAGE_PROPERTY_KEY),
        (send_request(user={"a": "x\x01y"}), C.BAD_REQUEST),
        (send_request(mid=""), C.ILLEGAL_MESSAGE_ID),
        (send_request(mid="ID 1"), C.ILLEGAL_MESSAGE_ID),
        (send_request(mid="ID\x001"), C.ILLEGAL_MESSAGE_ID),
        (send_request(message_type=99), C.BAD_REQUEST),
        (send_request(message_type=D.MessageType.LITE), C.UNSUPPORTED),
        (send_request(message_type=D.MessageType.DELAY), C.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (send_request(message_group=""), C.ILLEGAL_MESSAGE_GROUP),
        (send_request(message_group="g" * 65), C.ILLEGAL_MESSAGE_GROUP),
        (
            send_request(message_type=D.MessageType.TRANSACTION, message_group="g"),
            C.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        ),
        (send_request(message_type=D.MessageType.FIFO), C.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (send_request("FifoOnly"), C.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (
            send_request(
                message_type=D.MessageType.DELAY,
                deliver_ms=int(time.time() * 1000) + 10 * 86_400_000,
            ),
            C.ILLEGAL_DELIVERY_TIME,
        ),
        (send_request("%DLQ%x"), C.ILLEGAL_TOPIC),  # the broker writes retry and dead-letter topics
        (send_request("%RETRY%x"), C.ILLEGAL_TOPIC),
        (send_request("RMQ_SYS_TRANS_HALF_TOPIC"), C.ILLEGAL_TOPIC),
        (send_request(body=b"not gzip", body_encoding=D.Encoding.GZIP), C.MESSAGE_CORRUPTED),
        (send_request(body=gzip.compress(b"zipped"), body_encoding=D.Encoding.GZIP), C.OK),
        (send_request(user={"n": "1", "__SHARDINGKEY": "g"}, tag="t", keys=["k"]), C.OK),
    ],
)
def test_send_validation(stub, req, code):
    r = stub.SendMessage(req, metadata=MD, timeout=10)
    assert r.status.code == code, r.status.message
    assert r.status.message
    assert len(r.entries) == (1 if code == C.OK else 0)


def test_a_request_of_several_messages(stub, broker):
    req = S.SendMessageRequest(
        messages=[
            *send_request("Multi-A", body=b"a1", mid="MA1").messages,
            *send_request("Multi-B", body=b"b1", mid="MB1", tag="t").messages,
            *send_request("Multi-A", body=b"a2", mid="MA2").messages,
        ]
    )
    r = stub.SendMessage(req, metadata=MD, timeout=10)
    assert r.status.code == C.OK, r.status.message
    assert [(e.status.code, e.message_id, e.transaction_id) for e in r.entries] == [
        (C.OK, "MA1", "MA1"),
        (C.OK, "MB1", "MB1"),
        (C.OK, "MA2", "MA2"),
    ]
    store = broker.core.store
    stored = {
        (t, m.client_msg_id): (m.body, m.queue_offset, m.tags)
        for t in ("Multi-A", "Multi-B")
        for q in range(4)
        for m in store.get_messages(t, q, 0).messages
    }
    assert stored == {
        ("Multi-A", "MA1"): (b"a1", r.entries[0].offset, None),
        ("Multi-B", "MB1"): (b"b1", r.entries[1].offset, "t"),
        ("Multi-A", "MA2"): (b"a2", r.entries[2].offset, None),
    }
    # one bad topic fails the whole request: nothing of it is stored
    bad = S.SendMessageRequest(
        messages=[
            *send_request("Multi-C", mid="MC1").messages,
            *send_request("bad topic", mid="MC2").messages,
        ]
    )
    assert stub.SendMessage(bad, metadata=MD, timeout=10).status.code == C.ILLEGAL_TOPIC
    assert all(not store.get_messages("Multi-C", q, 0).messages for q in range(4))


def test_a_gzip_body_is_stored_decompressed(stub, broker):
    r = stub.SendMessage(
        send_request("Zip", body=gzip.compress(b"zipped"), mid="Z1", body_encoding=D.Encoding.GZIP),
        metadata=MD,
        timeout=10,
    )
    assert r.entries[0].message_id == "Z1" and r.entries[0].transaction_id == "Z1"
    msgs = [m for q in range(4) for m in broker.core.store.get_messages("Zip", q, 0).messages]
    assert [m.body for m in msgs] == [b"zipped"]


def receive(stub, **kw) -> list[S.ReceiveMessageResponse]:
    req = S.ReceiveMessageRequest(group=res(kw.pop("group", "rg")), batch_size=kw.pop("batch", 8))
    req.message_queue.topic.name = kw.pop("topic", "Rpc")
    if "invisible_ms" in kw:
        req.invisible_duration.FromMilliseconds(kw.pop("invisible_ms"))
    if "sql" in kw:
        req.filter_expression.type = D.FilterType.SQL
        req.filter_expression.expression = kw.pop("sql")
    req.long_polling_timeout.FromMilliseconds(kw.pop("wait_ms", 0))
    return list(stub.ReceiveMessage(req, metadata=MD, timeout=10))


@pytest.mark.parametrize(
    "kw, code",
    [
        ({}, C.ILLEGAL_INVISIBLE_TIME),
        ({"invisible_ms": 10}, C.ILLEGAL_INVISIBLE_TIME),
        ({"invisible_ms": 13 * 3600 * 1000}, C.ILLEGAL_INVISIBLE_TIME),
        ({"invisible_ms": 5000, "sql": "a >"}, C.ILLEGAL_FILTER_EXPRESSION),
        ({"invisible_ms": 5000, "batch": 0}, C.BAD_REQUEST),
        ({"invisible_ms": 5000, "group": "bad group"}, C.ILLEGAL_CONSUMER_GROUP),
        ({"invisible_ms": 5000, "topic": "NeverSeen"}, C.TOPIC_NOT_FOUND),
        ({"invisible_ms": 5000, "topic": "Empty-1", "group": "g-empty"}, C.MESSAGE_NOT_FOUND),
    ],
)
def test_receive_errors_end_with_a_status_and_a_timestamp(stub, broker, kw, code):
    broker.core.store.topics.get_or_create("Empty-1")
    out = receive(stub, **kw)
    assert [r.WhichOneof("content") for r in out] == ["status", "delivery_timestamp"]
    assert out[0].status.code == code


def test_receive_long_polls_until_a_message_arrives(stub, broker):
    broker.core.store.topics.get_or_create("LongPoll")
    threading.Timer(
        0.3, lambda: stub.SendMessage(send_request("LongPoll", mid="LP"), metadata=MD, timeout=10)
    ).start()
    t0 = time.monotonic()
    out = receive(stub, topic="LongPoll", group="lp", invisible_ms=5000, wait_ms=1800)
    assert time.monotonic() - t0 < 1.5
    assert [r.WhichOneof("content") for r in out] == ["status", "message", "delivery_timestamp"]
    sp = out[1].message.system_properties
    assert sp.message_id == "LP" and sp.delivery_attempt == 1 and sp.receipt_handle
    assert sp.body_encoding == D.Encoding.IDENTITY and sp.body_digest.type == D.DigestType.MD5


def test_ack_and_change_invisible_with_bad_handles(stub):
    stub.SendMessage(send_request("AckT", mid="A1"), metadata=MD, timeout=10)
    out = receive(stub, topic="AckT", group="ag", invisible_ms=5000)
    handle = out[1].message.system_properties.receipt_handle
    entries = [
        S.AckMessageEntry(message_id="A1", receipt_handle=h)
        for h in (handle, "garbage", "1 2 3 4 5 6 7", "")
    ]
    r = stub.AckMessage(
        S.AckMessageRequest(group=res("ag"), topic=res("AckT"), entries=entries),
        metadata=MD,
        timeout=10,
    )
    assert r.status.code == C.MULTIPLE_RESULTS
    assert [e.status.code for e in r.entries] == [C.OK] + [C.INVALID_RECEIPT_HANDLE] * 3
    r = stub.AckMessage(
        S.AckMessageRequest(group=res("ag"), topic=res("AckT")), metadata=MD, timeout=10
    )
    assert r.status.code == C.BAD_REQUEST
    req = S.ChangeInvisibleDurationRequest(
        group=res("ag"), topic=res("AckT"), receipt_handle=handle
    )
    req.invisible_duration.FromSeconds(5)
    r = stub.ChangeInvisibleDuration(req, metadata=MD, timeout=10)
    assert r.status.code == C.INVALID_RECEIPT_HANDLE and r.receipt_handle == handle
    r = stub.ForwardMessageToDeadLetterQueue(
        S.ForwardMessageToDeadLetterQueueRequest(
            group=res("ag"), topic=res("AckT"), receipt_handle="nonsense"
        ),
        metadata=MD,
        timeout=10,
    )
    assert r.status.code == C.INVALID_RECEIPT_HANDLE


def test_query_assignment(stub):
    stub.QueryRoute(S.QueryRouteRequest(topic=res("Assign")), metadata=MD, timeout=10)
    r = stub.QueryAssignment(
        S.QueryAssignmentRequest(topic=res("Assign"), group=res("pg")), metadata=MD, timeout=10
    )
    assert r.status.code == C.OK
    (a,) = r.assignments
    assert a.message_queue.id == -1 and a.message_queue.broker.endpoints.addresses
    assert a.message_queue.permission == D.Permission.READ_WRITE


def telemetry(
    stub, *commands: S.TelemetryCommand, client_id: str = "tele"
) -> list[S.TelemetryCommand]:
    """Write the commands, collect one reply each, then close the stream."""
    replies: list[S.TelemetryCommand] = []
    done = threading.Event()

    def requests():
        yield from commands
        done.wait(10)

    call = stub.Telemetry(requests(), metadata=metadata(client_id), timeout=20)
    for reply in call:
        replies.append(reply)
        if len(replies) == len(commands):
            break
    done.set()
    call.cancel()
    return replies


def test_telemetry_settings_handshake(stub, broker):
    prod = S.TelemetryCommand(
        settings=D.Settings(
            client_type=D.ClientType.PRODUCER,
            publishing=D.Publishing(topics=[res("T")], max_body_size=1 << 27),
        )
    )
    sub = D.Subscription(
        group=res("sg"), subscriptions=[D.SubscriptionEntry(topic=res("FifoOnly"))]
    )
    cons = S.TelemetryCommand(
        settings=D.Settings(client_type=D.ClientType.PUSH_CONSUMER, subscription=sub)
    )
    empty = S.TelemetryCommand(settings=D.Settings(client_type=D.ClientType.PRODUCER))
    r_empty, r_prod, r_cons = telemetry(stub, empty, prod, cons)
    assert r_empty.status.code == C.BAD_REQUEST  # and the stream went on
    assert r_prod.status.code == C.OK
    s = r_prod.settings
    assert s.publishing.max_body_size == 4 * 1024 * 1024 and s.publishing.validate_message_type
    assert (
        s.backoff_policy.WhichOneof("strategy") == "exponential_backoff"
        and s.backoff_policy.max_attempts == 3
    )
    c = r_cons.settings
    assert (
        r_cons.status.code == C.OK
        and c.subscription.fifo
        and c.subscription.receive_batch_size == 32
    )
    assert c.subscription.long_polling_timeout.ToMilliseconds() == 2000
    assert c.backoff_policy.max_attempts == 17
    assert [d.ToMilliseconds() for d in c.backoff_policy.customized_backoff.next][:3] == [
        1000,
        5000,
        10000,
    ]


def test_offset_rpcs(stub, broker):
    store = broker.core.store
    for i in range(10):
        store.put_message(
            Message(
                "Offs", b"%d" % i, {"TAGS": "odd" if i % 2 else "even", "n": str(i)}, queue_id=1
            )
        )
    mq = D.MessageQueue(topic=res("Offs"), id=1)

    def pull(offset, batch=4, wait_ms=0, sql=None):
        req = S.PullMessageRequest(
            group=res("pull"), message_queue=mq, offset=offset, batch_size=batch
        )
        if sql:
            req.filter_expression.type = D.FilterType.SQL
            req.filter_expression.expression = sql
        req.long_polling_timeout.FromMilliseconds(wait_ms)
        out = list(stub.PullMessage(req, metadata=MD, timeout=10))
        msgs = [r.message for r in out if r.HasField("message")]
        return out[0].status.code, [m.body for m in msgs], out[-1].next_offset

    def q(policy, **kw):
        return stub.QueryOffset(
            S.QueryOffsetRequest(message_queue=mq, query_offset_policy=policy, **kw),
            metadata=MD,
            timeout=10,
        )

    assert q(D.QueryOffsetPolicy.BEGINNING).offset == 0 and q(D.QueryOffsetPolicy.END).offset == 10
    ts = q(
        D.QueryOffsetPolicy.TIMESTAMP,
        timestamp=D.google_dot_protobuf_dot_timestamp__pb2.Timestamp(seconds=0),
    )
    assert ts.status.code == C.OK and ts.offset == 0
    assert q(D.QueryOffsetPolicy.TIMESTAMP).status.code == C.BAD_REQUEST
    assert pull(0) == (C.OK, [b"0", b"1", b"2", b"3"], 4)
    assert pull(4, batch=100, sql="n > 7") == (C.OK, [b"8", b"9"], 10)
    assert pull(-1)[0] == C.ILLEGAL_OFFSET
    assert pull(50)[0::2] == (C.ILLEGAL_OFFSET, 10)
    t0 = time.monotonic()
    assert pull(10, wait_ms=300) == (C.MESSAGE_NOT_FOUND, [], 10)
    assert time.monotonic() - t0 >= 0.25
    threading.Timer(
        0.2, lambda: store.put_message(Message("Offs", b"late", {}, queue_id=1))
    ).start()
    assert pull(10, wait_ms=1500)[:2] == (C.OK, [b"late"])
    bad_q = D.MessageQueue(topic=res("Offs"), id=99)
    assert (
        stub.QueryOffset(
            S.QueryOffsetRequest(message_queue=bad_q), metadata=MD, timeout=10
        ).status.code
        == C.BAD_REQUEST
    )
    get = S.GetOffsetRequest(group=res("og"), message_queue=mq)
    assert stub.GetOffset(get, metadata=MD, timeout=10).status.code == C.OFFSET_NOT_FOUND
    up = stub.UpdateOffset(
        S.UpdateOffsetRequest(group=res("og"), message_queue=mq, offset=5), metadata=MD, timeout=10
    )
    assert up.status.code == C.OK
    assert stub.GetOffset(get, metadata=MD, timeout=10).offset == 5
    up = stub.UpdateOffset(
        S.UpdateOffsetRequest(group=res("og"), message_queue=mq, offset=99), metadata=MD, timeout=10
    )
    assert up.status.code == C.ILLEGAL_OFFSET
    # a pop group whose offset was set from outside resumes there
    stub.UpdateOffset(
        S.UpdateOffsetRequest(group=res("og"), message_queue=mq, offset=9), metadata=MD, timeout=10
    )
    out = receive(stub, topic="Offs", group="og", invisible_ms=5000, batch=32)
    assert sorted(r.message.body for r in out if r.HasField("message")) == [b"9", b"late"]


def test_malformed_bytes_get_a_grpc_error_and_the_broker_goes_on(broker, stub):
    with grpc.insecure_channel(broker.endpoints) as ch:
        raw = ch.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage")
        with pytest.raises(grpc.RpcError) as e:
            raw(b"\xff\xff\xff\x0f garbage", metadata=MD, timeout=10)
        assert e.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
    assert (
        stub.QueryRoute(
            S.QueryRouteRequest(topic=res("Alive")), metadata=MD, timeout=10
        ).status.code
        == C.OK
    )


text = st.text(st.characters(codec="utf-8"), max_size=40)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    topic=text,
    body=st.binary(max_size=64),
    mid=text,
    tag=st.none() | text,
    group=st.none() | text,
    props=st.dictionaries(text, text, max_size=3),
    mtype=st.integers(0, 7),
    enc=st.integers(0, 3),
    handle=text,
)
def test_hostile_requests_get_a_status(
    stub, topic, body, mid, tag, group, props, mtype, enc, handle
):
    kw: dict = {"message_type": mtype, "body_encoding": enc, "user": props}
    if tag is not None:
        kw["tag"] = tag
    if group is not None:
        kw["message_group"] = group
    r = stub.SendMessage(send_request(topic, body, mid, **kw), metadata=MD, timeout=10)
    assert r.status.code != C.CODE_UNSPECIFIED and r.status.code != C.INTERNAL_SERVER_ERROR, (
        r.status.message
    )
    ack = S.AckMessageRequest(
        group=res(group or "g"),
        topic=res(topic),
        entries=[S.AckMessageEntry(message_id=mid, receipt_handle=handle)],
    )
    r = stub.AckMessage(ack, metadata=MD, timeout=10)
    assert r.status.code in (C.INVALID_RECEIPT_HANDLE, C.ILLEGAL_TOPIC, C.ILLEGAL_CONSUMER_GROUP)
