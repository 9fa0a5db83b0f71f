"""Access control over every service on the broker's port (``broker/access.py``).

The matrix: every method of ``apache.rocketmq.v2.MessagingService`` (enumerated from its protobuf
descriptor) and of the connector service ``rmq_spark.internal.Connector`` (from its protocol's
method table), each called with no credentials, a bad signature, a stale date, an account without
the permission, an account with it, and an admin account, and its exact answer asserted.  A method
added to either service without a row here fails :func:`test_every_method_on_the_port_has_a_row`.
Then the faults found against the ACL, each one a test.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import grpc
import pyarrow as pa
import pytest
from rocketmq.grpc_protocol import definition_pb2 as D
from rocketmq.grpc_protocol import service_pb2 as S
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from rmq_spark.access.auth import AccessControl, signed_headers
from rmq_spark.broker.connector import codec
from rmq_spark.broker.connector import protocol as P
from rmq_spark.broker.connector.client import InternalClient
from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.errors import AuthenticationError, IllegalTopicError, PermissionDeniedError
from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock

C = D.Code
SC = grpc.StatusCode
TOPIC, EMPTY, GROUP, FRESH_GROUP = "Orders", "Quiet", "billing", "auditors"
ACL = {
    "accounts": [
        # the permission every row needs, and no more
        {
            "accessKey": "app",
            "secretKey": "app-secret",
            "defaultTopicPerm": "DENY",
            "defaultGroupPerm": "DENY",
            "topicPerms": [f"{TOPIC}=PUB|SUB", f"{EMPTY}=SUB"],
            "groupPerms": [f"{GROUP}=SUB", f"{FRESH_GROUP}=SUB"],
        },
        # signed, but allowed nothing
        {
            "accessKey": "nobody",
            "secretKey": "nobody-secret",
            "defaultTopicPerm": "DENY",
            "defaultGroupPerm": "DENY",
        },
        {"accessKey": "root", "secretKey": "root-secret", "admin": True},
        # may use every topic it is given, system topics never
        {
            "accessKey": "wide",
            "secretKey": "wide-secret",
            "defaultTopicPerm": "PUB|SUB",
            "defaultGroupPerm": "SUB",
        },
    ]
}
YEARS_AGO_S = 2 * 365 * 86400


def headers(
    access_key: str = "", secret_key: str = "", now_s: float | None = None
) -> list[tuple[str, str]]:
    md = [("x-mq-client-id", "rmq-access-test"), ("x-mq-request-id", "1")]
    if access_key:
        md += signed_headers(access_key, secret_key, now_s)
    else:
        md.append(("x-mq-date-time", time.strftime("%Y%m%dT%H%M%SZ")))
    return md


CREDENTIALS: dict[str, list[tuple[str, str]] | Callable[[], list[tuple[str, str]]]] = {
    "none": lambda: headers(),
    "bad signature": lambda: headers("app", "not-the-secret"),
    "stale date": lambda: headers("app", "app-secret", time.time() - YEARS_AGO_S),
    "no permission": lambda: headers("nobody", "nobody-secret"),
    "permitted": lambda: headers("app", "app-secret"),
    "admin": lambda: headers("root", "root-secret"),
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    d = tmp_path_factory.mktemp("access")
    (d / "acl.json").write_text(json.dumps(ACL))
    b = Broker(
        str(d / "store"), listen="127.0.0.1:0", options=BrokerOptions(acl_path=str(d / "acl.json"))
    )
    store = b.store
    for t in (TOPIC, EMPTY):
        store.topics.get_or_create(t)
    from rmq_spark.store.message import Message

    assert store.put_message(Message(TOPIC, b"first", {}, queue_id=0)).ok
    yield b
    b.stop()


@pytest.fixture(scope="module")
def channel(broker):
    with grpc.insecure_channel(broker.endpoints) as ch:
        yield ch


# --- the MessagingService's rows: (call, exact code for an account allowed to make it, does the
# --- rule need a permission) ---------------------------------------------------------------------
def mq(topic: str = TOPIC, qid: int = 0) -> D.MessageQueue:
    return D.MessageQueue(topic=D.Resource(name=topic), id=qid)


def _receive() -> S.ReceiveMessageRequest:
    r = S.ReceiveMessageRequest(
        group=D.Resource(name=GROUP),
        message_queue=mq(EMPTY, -1),
        batch_size=1,
        filter_expression=D.FilterExpression(type=D.FilterType.TAG, expression="*"),
    )
    r.invisible_duration.FromSeconds(30)
    r.long_polling_timeout.FromMilliseconds(0)
    return r


def _pull() -> S.PullMessageRequest:
    r = S.PullMessageRequest(
        group=D.Resource(name=GROUP),
        message_queue=mq(),
        offset=0,
        batch_size=1,
        filter_expression=D.FilterExpression(type=D.FilterType.TAG, expression="*"),
    )
    r.long_polling_timeout.FromMilliseconds(0)
    return r


def _send() -> S.SendMessageRequest:
    m = D.Message(topic=D.Resource(name=TOPIC), body=b"matrix")
    m.system_properties.message_id = "01MATRIX"
    m.system_properties.body_encoding = D.Encoding.IDENTITY
    m.system_properties.message_type = D.MessageType.NORMAL
    m.system_properties.born_host = "127.0.0.1"
    m.system_properties.born_timestamp.GetCurrentTime()
    return S.SendMessageRequest(messages=[m])


def _settings() -> S.TelemetryCommand:
    s = D.Settings(client_type=D.ClientType.PRODUCER)
    s.publishing.topics.add(name=TOPIC)
    return S.TelemetryCommand(settings=s)


def _change_invisible() -> S.ChangeInvisibleDurationRequest:
    r = S.ChangeInvisibleDurationRequest(
        group=D.Resource(name=GROUP),
        topic=D.Resource(name=TOPIC),
        receipt_handle="not-a-handle",
        message_id="01X",
    )
    r.invisible_duration.FromSeconds(30)
    return r


BAD_HANDLE = [S.AckMessageEntry(message_id="01X", receipt_handle="not-a-handle")]
MESSAGING: dict[str, tuple[Callable[[], Any], int, bool]] = {
    "QueryRoute": (lambda: S.QueryRouteRequest(topic=D.Resource(name=TOPIC)), C.OK, True),
    "Heartbeat": (
        lambda: S.HeartbeatRequest(
            group=D.Resource(name=GROUP), client_type=D.ClientType.SIMPLE_CONSUMER
        ),
        C.OK,
        True,
    ),
    "SendMessage": (_send, C.OK, True),
    "QueryAssignment": (
        lambda: S.QueryAssignmentRequest(
            topic=D.Resource(name=TOPIC), group=D.Resource(name=GROUP)
        ),
        C.OK,
        True,
    ),
    "ReceiveMessage": (_receive, C.MESSAGE_NOT_FOUND, True),
    "AckMessage": (
        lambda: S.AckMessageRequest(
            group=D.Resource(name=GROUP), topic=D.Resource(name=TOPIC), entries=BAD_HANDLE
        ),
        C.INVALID_RECEIPT_HANDLE,
        True,
    ),
    "ForwardMessageToDeadLetterQueue": (
        lambda: S.ForwardMessageToDeadLetterQueueRequest(
            group=D.Resource(name=GROUP),
            topic=D.Resource(name=TOPIC),
            receipt_handle="not-a-handle",
            message_id="01X",
        ),
        C.INVALID_RECEIPT_HANDLE,
        True,
    ),
    "PullMessage": (_pull, C.OK, True),
    "UpdateOffset": (
        lambda: S.UpdateOffsetRequest(group=D.Resource(name=GROUP), message_queue=mq(), offset=0),
        C.OK,
        True,
    ),
    "GetOffset": (
        lambda: S.GetOffsetRequest(group=D.Resource(name=FRESH_GROUP), message_queue=mq()),
        C.OFFSET_NOT_FOUND,
        True,
    ),
    "QueryOffset": (
        lambda: S.QueryOffsetRequest(
            message_queue=mq(), query_offset_policy=D.QueryOffsetPolicy.END
        ),
        C.OK,
        True,
    ),
    "EndTransaction": (
        lambda: S.EndTransactionRequest(
            topic=D.Resource(name=TOPIC),
            message_id="01X",
            transaction_id="not-a-transaction",
            resolution=D.TransactionResolution.COMMIT,
        ),
        C.INVALID_TRANSACTION_ID,
        True,
    ),
    "Telemetry": (_settings, C.OK, False),
    "NotifyClientTermination": (
        lambda: S.NotifyClientTerminationRequest(group=D.Resource(name=GROUP)),
        C.OK,
        True,
    ),
    "ChangeInvisibleDuration": (_change_invisible, C.INVALID_RECEIPT_HANDLE, True),
    "RecallMessage": (
        lambda: S.RecallMessageRequest(topic=D.Resource(name=TOPIC), recall_handle="not-a-handle"),
        C.BAD_REQUEST,
        True,
    ),
    "SyncLiteSubscription": (lambda: S.SyncLiteSubscriptionRequest(), C.NOT_IMPLEMENTED, False),
}
MESSAGING_METHODS = S.DESCRIPTOR.services_by_name["MessagingService"].methods


def messaging_code(
    channel: grpc.Channel, method: Any, request: Any, md: list[tuple[str, str]]
) -> int:
    """The status code the MessagingService answers (the first status of a stream)."""
    stub = MessagingServiceStub(channel)
    fn = getattr(stub, method.name)
    if method.client_streaming:
        call = fn(iter([request]), metadata=md, timeout=10)
        try:
            return next(call).status.code
        finally:
            call.cancel()
    if method.server_streaming:
        for r in fn(request, metadata=md, timeout=10):
            if r.HasField("status"):
                return r.status.code
        raise AssertionError(f"{method.name} answered no status")
    return fn(request, metadata=md, timeout=10).status.code


# --- the connector service's rows: (request bytes, gRPC status for an allowed account, does the rule
# --- need a permission) ------------------------------------------------------------------------------
def _frame(topic: str = TOPIC) -> bytes:
    table = pa.table({"topic": [topic], "body": [b"from the sink"]})
    return codec.dump_frame(codec.Frame(P.SendHeader(mode="normal").to_json(), table))


CONNECTOR: dict[str, tuple[Callable[[], bytes], SC, bool]] = {
    "Ping": (lambda: P.Empty().encode(), SC.OK, False),
    "Info": (lambda: P.Empty().encode(), SC.OK, False),
    "Topics": (lambda: P.Empty().encode(), SC.OK, False),
    "Offsets": (lambda: P.OffsetsRequest(topics=[TOPIC]).encode(), SC.OK, True),
    "OffsetsForTimes": (
        lambda: P.OffsetsForTimesRequest(queues={TOPIC: [0]}, timestamp_ms=0).encode(),
        SC.OK,
        True,
    ),
    "ReadArrow": (
        lambda: P.ReadArrowRequest(topic=TOPIC, queue_id=0, start=0, end=1).encode(),
        SC.OK,
        True,
    ),
    "Send": (_frame, SC.OK, True),
    "CommitBatch": (
        lambda: P.SinkBatchRequest(query_id="q", batch_id=0, attempt="a0").encode(),
        SC.OK,
        False,
    ),
    "AbortBatch": (
        lambda: P.SinkBatchRequest(query_id="q", batch_id=1, attempt="a1").encode(),
        SC.OK,
        False,
    ),
    "CommitOffsets": (
        lambda: P.CommitOffsetsRequest(group=GROUP, offsets={TOPIC: {"0": 0}}).encode(),
        SC.OK,
        True,
    ),
    "QueryOffsets": (
        lambda: P.QueryOffsetsRequest(group=GROUP, topics=[TOPIC]).encode(),
        SC.OK,
        True,
    ),
    "SinkStatus": (lambda: P.SinkStatusRequest(query_id="q").encode(), SC.OK, False),
}


def connector_status(
    channel: grpc.Channel, name: str, request: bytes, md: list[tuple[str, str]]
) -> tuple[SC, str]:
    method = next(m for m in P.METHODS if m.name == name)
    ident = codec.identity
    try:
        if method.response is None:
            list(
                channel.unary_stream(
                    method.path, request_serializer=ident, response_deserializer=ident
                )(request, metadata=md, timeout=10)
            )
        else:
            channel.unary_unary(method.path, request_serializer=ident, response_deserializer=ident)(
                request, metadata=md, timeout=10
            )
    except grpc.RpcError as e:
        trailer = dict(e.trailing_metadata() or ()).get(P.ERROR_METADATA_KEY, "")
        return e.code(), trailer
    return SC.OK, ""


# --- the matrix ----------------------------------------------------------------------------------------
def test_every_method_on_the_port_has_a_row(broker):
    assert {m.name for m in MESSAGING_METHODS} == set(MESSAGING)
    assert {m.name for m in P.METHODS} == set(CONNECTOR)
    # and these two are every service the port serves
    assert set(broker.access.services) == {"apache.rocketmq.v2.MessagingService", P.SERVICE}


REFUSED_UNSIGNED = ("none", "bad signature", "stale date")


@pytest.mark.parametrize("who", list(CREDENTIALS))
@pytest.mark.parametrize("method", list(MESSAGING_METHODS), ids=lambda m: m.name)
def test_messaging_service_matrix(channel, method, who):
    make, allowed_code, needs_permission = MESSAGING[method.name]
    code = messaging_code(channel, method, make(), CREDENTIALS[who]())
    if who in REFUSED_UNSIGNED:
        expected = C.UNAUTHORIZED
    elif who == "no permission" and needs_permission:
        expected = C.FORBIDDEN
    else:
        expected = allowed_code
    assert code == expected, f"{method.name} as {who}: {C.Name(code)}, expected {C.Name(expected)}"


@pytest.mark.parametrize("who", list(CREDENTIALS))
@pytest.mark.parametrize("name", [m.name for m in P.METHODS])
def test_connector_service_matrix(channel, name, who):
    make, allowed_status, needs_permission = CONNECTOR[name]
    status, trailer = connector_status(channel, name, make(), CREDENTIALS[who]())
    if who in REFUSED_UNSIGNED:
        expected = (SC.UNAUTHENTICATED, "AuthenticationError")
    elif who == "no permission" and needs_permission:
        expected = (SC.PERMISSION_DENIED, "PermissionDeniedError")
    else:
        expected = (allowed_status, "")
    assert (status, trailer) == expected, f"{name} as {who}"


# --- the faults, one test each -----------------------------------------------------------------------------
def test_the_connector_service_is_behind_the_acl(broker, channel):
    """Issue 17 item 1: without credentials the connector read every topic, half messages of
    open transactions included, and wrote to any; non-admins never read a system topic."""
    half = P.ReadArrowRequest(topic=L.TRANS_HALF_TOPIC, queue_id=0, start=0, end=0).encode()
    assert connector_status(channel, "ReadArrow", half, headers())[0] == SC.UNAUTHENTICATED
    assert connector_status(channel, "ReadArrow", half, headers("wide", "wide-secret")) == (
        SC.PERMISSION_DENIED,
        "PermissionDeniedError",
    )
    assert connector_status(channel, "ReadArrow", half, headers("root", "root-secret"))[0] == SC.OK
    with InternalClient(broker.endpoints) as anonymous:
        with pytest.raises(AuthenticationError, match="not signed"):
            anonymous.send(pa.table({"topic": ["Anything"], "body": [b"x"]}), {"mode": "normal"})
    with InternalClient(
        broker.endpoints, access_key="nobody", secret_key="nobody-secret"
    ) as nobody:
        with pytest.raises(PermissionDeniedError, match="may not publish to topic 'Orders'"):
            nobody.send(pa.table({"topic": [TOPIC], "body": [b"x"]}), {"mode": "normal"})
        with pytest.raises(PermissionDeniedError, match="may not use group 'billing'"):
            nobody.commit_offsets(GROUP, {TOPIC: {"0": 0}})


def test_store_path_host_and_pid_are_for_admins(broker):
    with InternalClient(broker.endpoints, access_key="app", secret_key="app-secret") as app:
        info = app.info()
        assert (info["store_root"], info["host"], info["pid"]) == ("", "", 0)
        assert app.ping()["pid"] == 0
        assert set(app.topics()) == {TOPIC, EMPTY}  # only the topics it has a permission on
    with InternalClient(broker.endpoints, access_key="root", secret_key="root-secret") as root:
        info = root.info()
        assert info["store_root"] == broker.store.root and info["pid"] > 0 and info["host"]


def test_an_unsigned_pull_learns_nothing_about_topics(channel):
    """Issue 17 item 2: a pull without credentials answered TOPIC_NOT_FOUND for a missing topic
    and UNAUTHORIZED for an existing one."""
    stub = MessagingServiceStub(channel)
    for topic in (TOPIC, "NoSuchTopic"):
        req = _pull()
        req.message_queue.topic.name = topic
        (first, *_rest) = list(stub.PullMessage(req, metadata=headers(), timeout=10))
        assert first.status.code == C.UNAUTHORIZED, topic


def test_a_replayed_signature_is_refused(channel):
    """Issue 17 item 2: a signature over a date years old was accepted (replay for ever)."""
    stub = MessagingServiceStub(channel)
    req = S.QueryRouteRequest(topic=D.Resource(name=TOPIC))
    old = stub.QueryRoute(
        req, metadata=headers("root", "root-secret", time.time() - YEARS_AGO_S), timeout=10
    )
    assert (
        old.status.code == C.UNAUTHORIZED and "away from the broker's clock" in old.status.message
    )
    assert (
        stub.QueryRoute(req, metadata=headers("root", "root-secret"), timeout=10).status.code
        == C.OK
    )


def test_the_date_window_follows_the_injected_clock():
    clock = FakeClock(start_ms=1_800_000_000_000)
    acl = AccessControl.from_dict(ACL, clock=clock)
    signed_at = clock.now_ms() / 1000
    md = dict(signed_headers("app", "app-secret", signed_at))
    assert acl.authenticate(md).access_key == "app"  # the client's local time, as the clients sign
    utc = dict(signed_headers("app", "app-secret", signed_at))
    utc["x-mq-date-time"] = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(signed_at))
    import hashlib
    import hmac

    sig = hmac.new(b"app-secret", utc["x-mq-date-time"].encode(), hashlib.sha1).hexdigest()
    utc["authorization"] = (
        f"MQv2-HMAC-SHA1 Credential=app, SignedHeaders=x-mq-date-time, Signature={sig}"
    )
    assert acl.authenticate(utc).access_key == "app"  # a UTC date is as good
    clock.advance(14 * 60 * 1000)
    acl.authenticate(md)
    clock.advance(2 * 60 * 1000)  # 16 minutes after the signature
    with pytest.raises(AuthenticationError, match="more than 15 minutes away"):
        acl.authenticate(md)
    clock.set(1_800_000_000_000 - 16 * 60 * 1000)  # a date from the future is no better
    with pytest.raises(AuthenticationError):
        acl.authenticate(md)
    broken = dict(md, **{"x-mq-date-time": "yesterday"})
    with pytest.raises(AuthenticationError):
        acl.authenticate(broken)


def test_producers_cannot_send_to_retry_or_dead_letter_topics(broker, channel):
    """Issue 17 item 3: sends to %RETRY% / %DLQ% topics were accepted from any producer."""
    stub = MessagingServiceStub(channel)
    for topic in (f"%RETRY%{GROUP}", f"%DLQ%{GROUP}", L.TRANS_HALF_TOPIC):
        req = _send()
        req.messages[0].topic.name = topic
        r = stub.SendMessage(req, metadata=headers("root", "root-secret"), timeout=10)
        assert r.status.code == C.ILLEGAL_TOPIC, topic
        assert "cannot send to it" in r.status.message or "system topic" in r.status.message
        with InternalClient(broker.endpoints, access_key="root", secret_key="root-secret") as root:
            with pytest.raises(IllegalTopicError):
                root.send(pa.table({"topic": [topic], "body": [b"x"]}), {"mode": "normal"})


def test_a_route_query_never_creates_a_retry_or_dead_letter_topic(broker, channel):
    """Issue 17 item 3: routes for %RETRY% / %DLQ% topics were created on a query."""
    stub = MessagingServiceStub(channel)
    for topic in ("%RETRY%neverused", "%DLQ%neverused"):
        r = stub.QueryRoute(
            S.QueryRouteRequest(topic=D.Resource(name=topic)),
            metadata=headers("root", "root-secret"),
            timeout=10,
        )
        assert r.status.code == C.TOPIC_NOT_FOUND, topic
        assert broker.store.topics.get(topic) is None


def test_consumer_offsets_take_legal_names_only(broker):
    """Issue 17 item 3: the connector's offset commit stored a topic named ``../../etc``."""
    with InternalClient(broker.endpoints, access_key="root", secret_key="root-secret") as root:
        with pytest.raises(IllegalTopicError, match="outside"):
            root.commit_offsets(GROUP, {"../../etc": {"0": 1}})
        with pytest.raises(Exception, match="outside"):
            root.commit_offsets("../../etc", {TOPIC: {"0": 1}})
    assert broker.store.offsets.query_topic(GROUP, "../../etc") == {}


def test_a_sink_attempt_ends_only_its_own_halves(broker):
    """CommitBatch / AbortBatch name halves by CommitLog offset: another attempt's halves, or a
    client's transaction, are refused (nothing ends, no commit record), the attempt's own commit."""
    rows = pa.table({"topic": [TOPIC, TOPIC], "body": [b"h1", b"h2"]})
    with InternalClient(broker.endpoints, access_key="app", secret_key="app-secret") as app:
        sent = app.send(rows, P.SendHeader(mode="half", query_id="qx", batch_id=7, attempt="mine"))
        for call in (app.commit_batch, app.abort_batch):
            with pytest.raises(PermissionDeniedError, match="not halves of this sink attempt"):
                call("qx", 7, "thief", [sent["offsets"]])
        assert app.sink_status("qx")["batches"] == {}  # no commit record was written
        assert app.commit_batch("qx", 7, "mine", [sent["offsets"]])["outcome"] == "COMMITTED"


@pytest.mark.parametrize("read_path", ["arrow", "pull"])
def test_the_data_source_reads_with_its_credentials(broker, read_path):
    """accessKey / secretKey of the data source sign its calls: the planner's, and each read
    path's on the executors (the connector's bulk read, RocketMQ's PullMessage)."""
    from rmq_spark.datasource.embedded import client_for
    from rmq_spark.datasource.options import Connection, ReadPath
    from rmq_spark.datasource.read.arrow import read_arrow
    from rmq_spark.datasource.read.partition import QueueRange, ReadContext
    from rmq_spark.datasource.read.pull import read_pull

    read = {"arrow": read_arrow, "pull": read_pull}[read_path]

    def rows(connection: Connection) -> int:
        ctx = ReadContext(
            connection=connection,
            store_root=None,
            store_host=None,
            read_path=ReadPath(read_path),
            pull_group=GROUP,
        )
        return sum(b.num_rows for b in read(QueueRange(TOPIC, 0, 0, 1, ctx)))

    signed = Connection(endpoints=broker.endpoints, access_key="app", secret_key="app-secret")
    assert rows(signed) == 1
    assert client_for(signed).offsets([TOPIC])[0][TOPIC]["0"] >= 1
    with pytest.raises(Exception, match=r"(?i)unauthori|not signed"):
        rows(Connection(endpoints=broker.endpoints))
    with pytest.raises(Exception, match=r"(?i)forbidden|may not"):
        rows(
            Connection(endpoints=broker.endpoints, access_key="nobody", secret_key="nobody-secret")
        )


def test_a_method_without_a_rule_is_refused():
    """Fail closed: a method mounted on the server that no service gave a rule is refused, so a
    method added without one cannot skip the check."""
    from concurrent import futures

    from rmq_spark.broker.access import AccessInterceptor, ServiceAccess

    served = grpc.method_handlers_generic_handler(
        "demo.Service",
        {
            "Ruled": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"ok"),
            "Forgotten": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"ok"),
        },
    )
    access = ServiceAccess("demo.Service", {"Ruled": None}, refuse=lambda m, exc, ctx: [b"refused"])
    server = grpc.server(
        futures.ThreadPoolExecutor(2), interceptors=(AccessInterceptor(None, [access]),)
    )
    server.add_generic_rpc_handlers((served,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            assert ch.unary_unary("/demo.Service/Ruled")(b"", timeout=10) == b"ok"
            with pytest.raises(grpc.RpcError) as e:
                ch.unary_unary("/demo.Service/Forgotten")(b"", timeout=10)
            assert e.value.code() == SC.PERMISSION_DENIED and "no access rule" in e.value.details()
    finally:
        server.stop(0)


def test_a_method_without_a_rule_is_refused_on_the_aio_server():
    """The same on the broker's grpc.aio server, where the seam guards every handler the server's
    one generic handler finds (threaded handlers and ones served on the event loop alike)."""
    import asyncio

    from rmq_spark.broker.access import AccessInterceptor, ServiceAccess
    from rmq_spark.broker.server import _Mounted

    async def on_the_loop(req, ctx):
        return b"ok"

    async def streamed(req, ctx):
        yield b"ok"

    served = grpc.method_handlers_generic_handler(
        "demo.Service",
        {
            "Ruled": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"ok"),
            "RuledOnTheLoop": grpc.unary_unary_rpc_method_handler(on_the_loop),
            "Forgotten": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"ok"),
            "ForgottenOnTheLoop": grpc.unary_unary_rpc_method_handler(on_the_loop),
            "ForgottenStream": grpc.unary_stream_rpc_method_handler(streamed),
        },
    )
    access = ServiceAccess(
        "demo.Service",
        {"Ruled": None, "RuledOnTheLoop": None},
        refuse=lambda m, exc, ctx: [b"refused"],
    )

    async def scenario() -> None:
        from concurrent import futures

        mounted = _Mounted(AccessInterceptor(None, [access]))
        mounted.add_generic_rpc_handlers((served,))
        server = grpc.aio.server(migration_thread_pool=futures.ThreadPoolExecutor(2))
        server.add_generic_rpc_handlers((mounted,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                for ok in ("Ruled", "RuledOnTheLoop"):
                    assert await ch.unary_unary(f"/demo.Service/{ok}")(b"", timeout=10) == b"ok"
                for refused in ("Forgotten", "ForgottenOnTheLoop"):
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await ch.unary_unary(f"/demo.Service/{refused}")(b"", timeout=10)
                    assert (
                        e.value.code() == SC.PERMISSION_DENIED
                        and "no access rule" in e.value.details()
                    )
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await ch.unary_stream("/demo.Service/ForgottenStream")(b"", timeout=10).read()
                assert e.value.code() == SC.PERMISSION_DENIED
        finally:
            await server.stop(0)

    asyncio.run(scenario())
