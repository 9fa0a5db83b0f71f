"""Fuzzing every method on the broker's port (issue 17: "a fuzz test of every gRPC method and of
the connector service").

The methods are enumerated from the services' descriptors: ``apache.rocketmq.v2.MessagingService``
from its protobuf descriptor, ``rmq_spark.internal.Connector`` from its protocol's method table.
Each method gets, from hypothesis with a fixed derandomized seed (no example database):

- random bytes as the request body (for Telemetry, a request stream of them);
- well-formed requests with random field values: every field of the protobuf request (nested
  messages, maps, repeated fields, unknown enum values, timestamps and durations of any size),
  every field of the connector's JSON document (right and wrong JSON types, fields left out) and
  ``Send`` frames with random Arrow rows; names are drawn among legal, system, retry, dead-letter
  and malformed topic and group names, so requests get past the checks as well as into them;
- random metadata: client id, date, ``authorization`` (garbage, and valid admin signatures on
  the broker with an ACL), namespace, unknown headers.

Every call must be answered within its deadline: on the MessagingService a parseable response
with a non-zero RocketMQ status (never INTERNAL_SERVER_ERROR, the status of a fault no check
caught), or, for bytes that do not parse, gRPC's INTERNAL; on the connector, a document that
decodes or a gRPC error status, never UNKNOWN (an exception that escaped its seam).  After each
example's batch of calls a normal send and receive still work.  The tally of answers: ``-s``.  Two brokers serve: one without
an ACL (requests reach the handlers) and one with (requests reach the authentication first).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import fields
from typing import Any

import grpc
import pyarrow as pa
import pytest
from google.protobuf import descriptor as pbd
from google.protobuf import message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocketmq.grpc_protocol import definition_pb2 as D
from rocketmq.grpc_protocol import service_pb2 as S
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from rmq_spark.access.auth import signed_headers
from rmq_spark.broker.connector import codec
from rmq_spark.broker.connector import protocol as P
from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker

C = D.Code
SC = grpc.StatusCode
SERVICE = S.DESCRIPTOR.services_by_name["MessagingService"]
RMQ_METHODS = list(SERVICE.methods)
CALL_TIMEOUT_S = 10.0
HEALTH_TOPIC, HEALTH_GROUP = "FuzzHealth", "fuzz-health"
ACL = {
    "accounts": [
        {"accessKey": "root", "secretKey": "root-secret", "admin": True},
        {
            "accessKey": "app",
            "secretKey": "app-secret",
            "defaultTopicPerm": "PUB|SUB",
            "defaultGroupPerm": "SUB",
        },
    ]
}
# CI: 30 examples a method, a fixed seed (~15 s for both services).  A longer hunt with fresh seeds:
# RMQ_FUZZ_EXAMPLES=500 pytest tests/broker/test_broker_fuzz.py
_HUNT = int(os.environ.get("RMQ_FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=_HUNT or 30,
    derandomize=not _HUNT,
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)


# --- the brokers ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def brokers(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    (d / "acl.json").write_text(json.dumps(ACL))
    opts = {"long_polling_max_ms": 200, "min_invisible_ms": 1000, "workers": 8}
    open_ = Broker(str(d / "open"), listen="127.0.0.1:0", options=BrokerOptions(**opts))
    try:
        guarded = Broker(
            str(d / "guarded"),
            listen="127.0.0.1:0",
            options=BrokerOptions(acl_path=str(d / "acl.json"), **opts),
        )
    except BaseException:
        open_.stop()
        raise
    try:
        for b in (open_, guarded):
            for t in ("FuzzTopic", HEALTH_TOPIC):
                b.store.topics.get_or_create(t)
        chans = {
            name: grpc.insecure_channel(b.endpoints)
            for name, b in (("open", open_), ("guarded", guarded))
        }
        yield {"open": (open_, chans["open"]), "guarded": (guarded, chans["guarded"])}
        for ch in chans.values():
            ch.close()
    finally:
        open_.stop()
        guarded.stop()


def _admin_headers() -> list[tuple[str, str]]:
    return [("x-mq-client-id", "fuzz-health"), *signed_headers("root", "root-secret")]


def assert_still_serving(broker: Broker, channel: grpc.Channel) -> None:
    """A normal send, then a receive that gets it (and acks it)."""
    stub = MessagingServiceStub(channel)
    md = _admin_headers()
    mid = f"FUZZ{time.monotonic_ns():028d}"
    m = D.Message(topic=D.Resource(name=HEALTH_TOPIC), body=b"still here")
    m.system_properties.message_id = mid
    m.system_properties.message_type = D.MessageType.NORMAL
    m.system_properties.body_encoding = D.Encoding.IDENTITY
    sent = stub.SendMessage(S.SendMessageRequest(messages=[m]), metadata=md, timeout=CALL_TIMEOUT_S)
    assert sent.status.code == C.OK, sent.status
    req = S.ReceiveMessageRequest(batch_size=32)
    req.group.name = HEALTH_GROUP
    req.message_queue.topic.name = HEALTH_TOPIC
    req.filter_expression.type = D.FilterType.TAG
    req.filter_expression.expression = "*"
    req.invisible_duration.FromSeconds(60)
    req.long_polling_timeout.FromMilliseconds(150)
    seen = []
    for _ in range(5):
        got = [
            r.message
            for r in stub.ReceiveMessage(req, metadata=md, timeout=CALL_TIMEOUT_S)
            if r.HasField("message")
        ]
        if got:
            ack = S.AckMessageRequest(
                group=D.Resource(name=HEALTH_GROUP),
                topic=D.Resource(name=HEALTH_TOPIC),
                entries=[
                    S.AckMessageEntry(
                        message_id=g.system_properties.message_id,
                        receipt_handle=g.system_properties.receipt_handle,
                    )
                    for g in got
                ],
            )
            assert stub.AckMessage(ack, metadata=md, timeout=CALL_TIMEOUT_S).status.code == C.OK
        seen += [g.system_properties.message_id for g in got]
        if mid in seen:
            return
    raise AssertionError(
        f"the message sent after the batch was not received ({len(seen)} others were)"
    )


# --- strategies ---------------------------------------------------------------------------------------
NAMES = [
    "FuzzTopic",
    "FuzzGroup",
    HEALTH_TOPIC,
    "%RETRY%FuzzGroup",
    "%DLQ%FuzzGroup",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "SCHEDULE_TOPIC_XXXX",
    "TBW102",
    "",
    " ",
    "a" * 200,
    "../../etc",
    "Fuzz|Topic",
    "TagA",
    "*",
    "TagA || TagB",
    "a > 5 AND b = 'x'",
    "0",
    "-1",
]
_valid = st.sampled_from(["FuzzTopic", "FuzzGroup", HEALTH_TOPIC])
names = st.one_of(
    _valid, _valid, _valid, st.sampled_from(NAMES), st.text(max_size=24)
)  # mostly legal: past the checks
ascii_values = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=48)
garbage_auth = (
    st.sampled_from(
        [
            "MQv2-HMAC-SHA1 Credential=root, SignedHeaders=x-mq-date-time, Signature=00",
            "MQv2-HMAC-SHA1 Credential=, Signature=",
            "MQv2-HMAC-SHA1",
            "Basic abc",
            "MQv2-HMAC-SHA1 ,,,,=,=",
        ]
    )
    | ascii_values
)


@st.composite
def metadata(draw: st.DrawFn) -> list[tuple[str, str]]:
    md: list[tuple[str, str]] = []
    if draw(st.integers(0, 9)) > 0:
        md.append(
            ("x-mq-client-id", draw(st.sampled_from(["fuzz-client", "fuzz@1@2@3"]) | ascii_values))
        )
    if draw(st.booleans()):
        md += signed_headers(
            "root", "root-secret"
        )  # a valid signature (admin on the guarded broker)
    else:
        if draw(st.booleans()):
            md.append(
                (
                    "x-mq-date-time",
                    draw(st.sampled_from(["20250101T000000Z", "19700101T000000Z"]) | ascii_values),
                )
            )
        if draw(st.booleans()):
            md.append(("authorization", draw(garbage_auth)))
    for _ in range(draw(st.integers(0, 3))):
        key = draw(
            st.sampled_from(
                ["x-mq-namespace", "x-mq-language", "x-mq-request-id", "x-mq-client-id"]
            )
            | st.from_regex(r"x-[a-z0-9-]{1,12}", fullmatch=True)
        )
        md.append((key, draw(ascii_values)))
    return md


_INT_RANGES = {
    pbd.FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    pbd.FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    pbd.FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    pbd.FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    pbd.FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    pbd.FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    pbd.FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    pbd.FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    pbd.FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    pbd.FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    small = st.integers(max(lo, -3), min(hi, 40))
    return (
        small
        | st.sampled_from([lo, hi, 0, 1, 1000, 10_000]).filter(lambda v: lo <= v <= hi)
        | st.integers(lo, hi)
    )


def _scalar(f: pbd.FieldDescriptor) -> st.SearchStrategy[Any]:
    t = f.type
    if t == f.TYPE_STRING:
        return names
    if t == f.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == f.TYPE_BOOL:
        return st.booleans()
    if t in (f.TYPE_FLOAT, f.TYPE_DOUBLE):
        return st.floats(width=32 if t == f.TYPE_FLOAT else 64)
    if t == f.TYPE_ENUM:
        return st.sampled_from([v.number for v in f.enum_type.values]) | st.integers(-2, 40)
    return _ints(*_INT_RANGES[t])


# what the methods read first: mostly set, so that requests get past the first checks
_USUALLY_SET = frozenset(
    {
        "topic",
        "group",
        "message_queue",
        "name",
        "messages",
        "entries",
        "body",
        "message_id",
        "system_properties",
        "filter_expression",
        "batch_size",
        "invisible_duration",
        "settings",
        "receipt_handle",
        "query_offset_policy",
        "resolution",
    }
)


@st.composite
def proto_message(draw: st.DrawFn, desc: pbd.Descriptor, depth: int = 0) -> Any:
    """A message of type ``desc`` with some of its fields set to random values."""
    msg = message_factory.GetMessageClass(desc)()
    if desc.full_name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
        msg.seconds = draw(_ints(-(2**40), 2**40))
        msg.nanos = draw(_ints(-(10**9), 10**9))
        return msg
    skipped = set()
    for oneof in desc.oneofs:  # one member of each real oneof (setting several keeps only the last)
        members = list(oneof.fields)
        if len(members) > 1:
            keep = draw(
                st.just(members[0]) | st.sampled_from([None, *members])
            )  # the first (settings) often
            skipped.update(f.name for f in members if f is not keep)
    for f in desc.fields:
        if f.name in skipped or not draw(
            st.integers(0, 15 if f.name in _USUALLY_SET else 3)
        ):  # some left unset
            continue
        repeated = f.is_repeated
        if f.type == f.TYPE_MESSAGE:
            if f.message_type.GetOptions().map_entry:
                kf, vf = (
                    f.message_type.fields_by_name["key"],
                    f.message_type.fields_by_name["value"],
                )
                if vf.type != vf.TYPE_MESSAGE:
                    getattr(msg, f.name).update(
                        draw(st.dictionaries(_scalar(kf), _scalar(vf), max_size=3))
                    )
                continue
            if depth >= 3:
                continue
            if repeated:
                for sub in draw(st.lists(proto_message(f.message_type, depth + 1), max_size=3)):
                    getattr(msg, f.name).add().CopyFrom(sub)
            else:
                getattr(msg, f.name).CopyFrom(draw(proto_message(f.message_type, depth + 1)))
        elif repeated:
            getattr(msg, f.name).extend(draw(st.lists(_scalar(f), max_size=3)))
        else:
            setattr(msg, f.name, draw(_scalar(f)))
    return msg


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | names,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=8,
)
ints = _ints(-(2**63), 2**63 - 1)
_CONNECTOR_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "topic": names,
    "topics": st.lists(names, max_size=3),
    "group": names,
    "query_id": names,
    "attempt": names,
    "queue_id": ints,
    "start": ints,
    "end": ints,
    "batch_id": ints,
    "timestamp_ms": ints,
    "tags": st.none() | names,
    "sql": st.none() | names,
    "queues": st.dictionaries(names, st.lists(ints, max_size=3), max_size=3),
    "offsets": st.lists(names, max_size=3)
    | st.dictionaries(
        names,
        st.dictionaries(names | st.sampled_from(["0", "1", "-1"]), ints, max_size=3),
        max_size=3,
    ),
    "mode": st.sampled_from(["normal", "half", "other", ""]),
}


@st.composite
def connector_document(draw: st.DrawFn, doc: type[P.Document]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(doc):
        pick = draw(st.integers(0, 5))
        if pick == 0:
            continue  # left out (a required one: the request does not decode)
        typed = _CONNECTOR_FIELDS.get(f.name, json_values)
        out[f.name] = draw(json_values if pick == 1 else typed)
    if draw(st.integers(0, 5)) == 0:
        out[draw(names)] = draw(json_values)  # an unknown key
    return out


@st.composite
def arrow_rows(draw: st.DrawFn) -> pa.Table | None:
    if not draw(st.integers(0, 4)):
        return None
    n = draw(st.integers(0, 4))
    cols: dict[str, pa.Array] = {}
    if draw(st.integers(0, 5)):
        cols["topic"] = pa.array(
            draw(st.lists(st.none() | names, min_size=n, max_size=n)), pa.string()
        )
    if draw(st.integers(0, 5)):
        if draw(st.booleans()):
            cols["body"] = pa.array(
                draw(st.lists(st.none() | st.binary(max_size=32), min_size=n, max_size=n)),
                pa.binary(),
            )
        else:
            cols["body"] = pa.array(
                draw(st.lists(st.integers(-5, 5), min_size=n, max_size=n)), pa.int64()
            )
    for name in ("tags", "keys", "messageGroup"):
        if not draw(st.integers(0, 2)):
            cols[name] = pa.array(
                draw(st.lists(st.none() | names, min_size=n, max_size=n)), pa.string()
            )
    for name in ("queueId", "delayLevel"):
        if not draw(st.integers(0, 3)):
            cols[name] = pa.array(
                draw(
                    st.lists(st.none() | st.integers(-(2**31), 2**31 - 1), min_size=n, max_size=n)
                ),
                pa.int32(),
            )
    if not draw(st.integers(0, 3)):
        cols["properties"] = pa.array(
            draw(
                st.lists(
                    st.none() | st.lists(st.tuples(names, names), max_size=2),
                    min_size=n,
                    max_size=n,
                )
            ),
            pa.map_(pa.string(), pa.string()),
        )
    if not draw(st.integers(0, 4)):
        cols["deliverTimestamp"] = pa.array(
            draw(st.lists(st.none() | st.integers(-(2**40), 2**50), min_size=n, max_size=n)),
            pa.timestamp("ms"),
        )
    return pa.table(cols) if cols else pa.table({"x": pa.array([None] * n, pa.null())})


@st.composite
def connector_request(draw: st.DrawFn, method: P.Method) -> bytes:
    if method.frame:
        header = draw(connector_document(method.request))
        if draw(st.integers(0, 5)) == 0:
            return codec.dump_frame(codec.Frame(header, None))[
                : draw(st.integers(0, 12))
            ]  # cut short
        return codec.dump_frame(codec.Frame(header, draw(arrow_rows())))
    return codec.dump_json(draw(connector_document(method.request)))


# --- calling a method with bytes ------------------------------------------------------------------------------
def _rmq_call(
    channel: grpc.Channel, m: pbd.MethodDescriptor, requests: list[bytes], md: list[tuple[str, str]]
) -> list[bytes]:
    path = f"/{SERVICE.full_name}/{m.name}"
    if m.client_streaming:
        return list(
            channel.stream_stream(path)(iter(requests), metadata=md, timeout=CALL_TIMEOUT_S)
        )
    if m.server_streaming:
        return list(channel.unary_stream(path)(requests[0], metadata=md, timeout=CALL_TIMEOUT_S))
    return [channel.unary_unary(path)(requests[0], metadata=md, timeout=CALL_TIMEOUT_S)]


def check_rmq_answer(
    channel: grpc.Channel,
    m: pbd.MethodDescriptor,
    requests: list[bytes],
    md: list[tuple[str, str]],
    parseable: bool,
) -> str:
    """Call, and check the answer (see the module docstring); returns what it was, for the tally."""
    out_cls = message_factory.GetMessageClass(m.output_type)
    try:
        answers = [out_cls.FromString(raw) for raw in _rmq_call(channel, m, requests, md)]
    except grpc.RpcError as e:
        # only bytes that do not parse may get a gRPC error: INTERNAL, as grpc's own servers answer
        assert (
            not parseable and e.code() == SC.INTERNAL and "deserializing" in (e.details() or "")
        ), f"{m.name}: {e.code()} {e.details()!r}"
        return "INTERNAL (undecodable)"
    if m.client_streaming:  # Telemetry: any settings answered, each with a status
        assert all(a.HasField("status") and a.status.code != 0 for a in answers), answers
        codes = [a.status.code for a in answers]
    else:
        assert answers and answers[0].HasField("status"), (
            f"{m.name}: first answer {answers[:1]} has no status"
        )
        codes = [answers[0].status.code]
    for code in codes:
        assert code != 0, f"{m.name}: status code 0"
        assert code != C.INTERNAL_SERVER_ERROR, (
            f"{m.name}: a fault no check caught: {answers[0].status.message!r}"
        )
    return C.Name(codes[0]) if codes else "stream ended"


def check_connector_answer(
    channel: grpc.Channel, method: P.Method, request: bytes, md: list[tuple[str, str]]
) -> str:
    ident = {"request_serializer": codec.identity, "response_deserializer": codec.identity}
    try:
        if method.response is None:
            chunks = list(
                channel.unary_stream(method.path, **ident)(
                    request, metadata=md, timeout=CALL_TIMEOUT_S
                )
            )
            for chunk in chunks:
                codec.load_batch(chunk)
        else:
            method.response.decode(
                channel.unary_unary(method.path, **ident)(
                    request, metadata=md, timeout=CALL_TIMEOUT_S
                )
            )
        return "OK"
    except grpc.RpcError as e:
        assert e.code() not in (SC.UNKNOWN, SC.DEADLINE_EXCEEDED, SC.UNAVAILABLE, SC.OK), (
            f"{method.name}: {e.code()} {e.details()!r}"
        )
        return e.code().name


TALLY: dict[str, int] = {}


def _count(key: str) -> None:
    TALLY[key] = TALLY.get(key, 0) + 1


# --- the tests ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("m", RMQ_METHODS, ids=[m.name for m in RMQ_METHODS])
@FUZZ
@given(data=st.data())
def test_rocketmq_method_fuzz(brokers, m, data):
    """Each MessagingService method: random bytes, then well-formed requests of random values."""
    target = data.draw(st.sampled_from(["open", "guarded"]), label="broker")
    broker, channel = brokers[target]
    n = data.draw(st.integers(1, 3), label="calls")
    for _ in range(n):
        md = data.draw(metadata(), label="metadata")
        if data.draw(st.integers(0, 3), label="bytes?") == 0:
            raw = data.draw(st.lists(st.binary(max_size=96), min_size=1, max_size=3), label="bytes")
            _count(f"{m.name} bytes -> " + check_rmq_answer(channel, m, raw, md, parseable=False))
        else:
            msgs = data.draw(
                st.lists(proto_message(m.input_type), min_size=1, max_size=3), label="requests"
            )
            _count(
                f"{m.name} typed -> "
                + check_rmq_answer(
                    channel, m, [x.SerializeToString() for x in msgs], md, parseable=True
                )
            )
    assert_still_serving(broker, channel)


@pytest.mark.parametrize("method", P.METHODS, ids=[m.name for m in P.METHODS])
@FUZZ
@given(data=st.data())
def test_connector_method_fuzz(brokers, method, data):
    """Each connector method: random bytes, then documents (and Send frames) of random values."""
    target = data.draw(st.sampled_from(["open", "guarded"]), label="broker")
    broker, channel = brokers[target]
    for _ in range(data.draw(st.integers(1, 3), label="calls")):
        md = data.draw(metadata(), label="metadata")
        if data.draw(st.integers(0, 3), label="bytes?") == 0:
            request = data.draw(st.binary(max_size=128), label="bytes")
            _count(
                f"{method.name} bytes -> " + check_connector_answer(channel, method, request, md)
            )
        else:
            request = data.draw(connector_request(method), label="request")
            _count(
                f"{method.name} typed -> " + check_connector_answer(channel, method, request, md)
            )
    assert_still_serving(broker, channel)


def test_every_method_was_fuzzed():
    """Runs last in this module: the tally names every method of both services (with ``-s``, the
    answers each got)."""
    assert TALLY, (
        "the tally is filled by this module's fuzz tests: run it with them (the whole module)"
    )
    tried = {k.split(" ", 1)[0] for k in TALLY}
    assert tried == {m.name for m in RMQ_METHODS} | {m.name for m in P.METHODS}
    print(f"\n{sum(TALLY.values())} calls:")
    for k, v in sorted(TALLY.items()):
        print(f"  {v:5d}  {k}")
