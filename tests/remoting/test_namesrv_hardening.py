"""The NameServer held to what it accepts (issue 28, items 9, 10, 15, 20): no peer replaces the
local broker's route, registrations can be turned off and need an admin signature with ``--acl``,
timeouts are clamped, the registry and every registration are bounded, a compressed body is
inflated within a limit and off the event loop, and a malformed body gets an answer naming the
problem.  Each test failed before the fix it names; the fuzz test at the end throws every
NameServer code at it and checks that the local broker's routes are intact afterwards."""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import struct
import threading
import time
import zlib

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rmq_spark.broker.options import BrokerOptions, parse_args
from rmq_spark.broker.server import Broker
from rmq_spark.namesrv import processor as ns_processor
from rmq_spark.namesrv.limits import NamesrvLimits, RegistrationError
from rmq_spark.namesrv.registration import (
    RegisterHeader,
    compressed_topic_table,
    json_topic_table,
    read_topics,
)
from rmq_spark.namesrv.routes import BrokerEntry, LocalBroker, QueueData, RouteInfoManager
from rmq_spark.remoting import jsonbody
from rmq_spark.remoting.acl import ACCESS_KEY, SIGNATURE, sign
from rmq_spark.remoting.client import RemotingClient, request
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand, SerializeType
from rmq_spark.remoting.namesrv_requests import NAMESRV_REQUESTS, OTHER_BODY_MAX_BYTES
from rmq_spark.remoting.requests import RequestGate

R, C = RequestCode, ResponseCode
LOCAL_TOPIC = "LocalOrders"
ACL = {"accounts": [
    {"accessKey": "root", "secretKey": "root-secret", "admin": True},
    {"accessKey": "alice", "secretKey": "alice-secret", "defaultTopicPerm": "PUB|SUB"},
]}  # fmt: skip
SECRETS = {a["accessKey"]: a["secretKey"] for a in ACL["accounts"]}
# what a remark must never hold: Python's own exception texts
PYTHON_TEXTS = ("Error:", "Traceback", "object has no attribute", "invalid literal", "not subscriptable",
                "unhashable", "codec can't", "Exceeds the limit")  # fmt: skip


def _broker(tmp_path, name: str = "store", **opts) -> Broker:
    options = BrokerOptions(
        listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen="127.0.0.1:0", **opts
    )
    b = Broker(str(tmp_path / name), options=options)
    b.store.topics.get_or_create(LOCAL_TOPIC)
    return b


@pytest.fixture
def broker(tmp_path):
    with _broker(tmp_path) as b:
        yield b


@pytest.fixture
def acl_broker(tmp_path):
    (tmp_path / "acl.json").write_text(json.dumps(ACL))
    with _broker(tmp_path, acl_path=str(tmp_path / "acl.json")) as b:
        yield b


def _header(
    name: str, addr: str, broker_id: int = 0, cluster: str = "Peers", **extra: str
) -> dict[str, str]:
    return {
        "brokerName": name,
        "brokerAddr": addr,
        "clusterName": cluster,
        "haServerAddr": addr,
        "brokerId": str(broker_id),
        "heartbeatTimeoutMillis": "120000",
        "compressed": "false",
        **extra,
    }


def _body(topics: dict[str, int]) -> bytes:
    table = {
        t: {"topicName": t, "readQueueNums": n, "writeQueueNums": n, "perm": 6}
        for t, n in topics.items()
    }
    return json.dumps(
        {"topicConfigSerializeWrapper": {"topicConfigTable": table}, "filterServerList": []}
    ).encode()


def _signed(ext: dict[str, str], body: bytes, ak: str | None) -> dict[str, str]:
    ext = dict(ext)
    if ak is not None:
        ext[ACCESS_KEY] = ak
        ext[SIGNATURE] = sign(ext, body, SECRETS[ak])
    return ext


def _local_route_intact(b: Broker) -> None:
    """The local broker's topic routes to the local broker's address, and cluster info agrees."""
    name, addr = b.remoting.broker_name, b.remoting.broker_addr
    answer = request(
        b.namesrv_endpoint, R.GET_ROUTEINFO_BY_TOPIC, {"topic": LOCAL_TOPIC}, timeout_s=10
    )
    assert answer.code == C.SUCCESS, answer.remark
    route = jsonbody.loads(answer.body)
    assert name in {q["brokerName"] for q in route["queueDatas"]}  # peers may serve it too
    assert [d["brokerAddrs"] for d in route["brokerDatas"] if d["brokerName"] == name] == [
        {"0": addr}
    ]
    info = jsonbody.loads(request(b.namesrv_endpoint, R.GET_BROKER_CLUSTER_INFO, timeout_s=10).body)
    assert info["brokerAddrTable"][name]["brokerAddrs"] == {"0": addr}


def _clear(remark: str | None) -> str:
    assert remark, "a refusal names its reason"
    assert not any(t in remark for t in PYTHON_TEXTS), remark
    return remark


# --- item 9: the local broker's entry -------------------------------------------------------------
@pytest.mark.parametrize("who", ["same name, brokerId 0", "same name, brokerId 1", "same address"])
def test_a_peer_cannot_replace_the_local_brokers_route(broker, who):
    """Before: REGISTER_BROKER under the local broker's name with brokerId=0 replaced its address
    in every route and in cluster info."""
    name, addr = broker.remoting.broker_name, broker.remoting.broker_addr
    header = {"same name, brokerId 0": _header(name, "10.6.6.6:10911"),
              "same name, brokerId 1": _header(name, "10.6.6.6:10911", broker_id=1),
              "same address": _header("evil", addr)}[who]  # fmt: skip
    answer = request(broker.namesrv_endpoint, R.REGISTER_BROKER, header, _body({LOCAL_TOPIC: 8}))
    assert answer.code == C.NO_PERMISSION and "own broker" in _clear(answer.remark)
    _local_route_intact(broker)
    gone = request(
        broker.namesrv_endpoint,
        R.UNREGISTER_BROKER,
        {"brokerName": name, "brokerAddr": addr, "clusterName": "DefaultCluster", "brokerId": "0"},
    )
    assert gone.code == C.NO_PERMISSION and "own broker" in _clear(gone.remark)
    assert broker.remoting.routes.size == (0, 0)


def test_not_even_an_admin_replaces_the_local_broker(acl_broker):
    name = acl_broker.remoting.broker_name
    body = _body({LOCAL_TOPIC: 8})
    answer = request(acl_broker.namesrv_endpoint, R.REGISTER_BROKER, _signed(_header(name, "10.6.6.6:1"), body, "root"),
                     body)  # fmt: skip
    assert answer.code == C.NO_PERMISSION and "own broker" in _clear(answer.remark)
    _local_route_intact(acl_broker)


def test_registrations_can_be_turned_off(tmp_path):
    assert (
        parse_args(
            ["--store", str(tmp_path), "--no-namesrv-registrations"]
        ).options.namesrv_accept_brokers
        is False
    )
    assert parse_args(["--store", str(tmp_path)]).options.namesrv_accept_brokers is True
    with _broker(tmp_path, namesrv_accept_brokers=False) as b:
        for code in (R.REGISTER_BROKER, R.UNREGISTER_BROKER):
            answer = request(
                b.namesrv_endpoint, code, _header("peer", "10.0.0.9:10911"), _body({"T": 1})
            )
            assert answer.code == C.NO_PERMISSION and "--no-namesrv-registrations" in _clear(
                answer.remark
            )
        assert b.remoting.routes.size == (0, 0)
        _local_route_intact(b)


@pytest.mark.parametrize(
    ("ak", "expected"),
    [
        (None, C.NO_PERMISSION),
        ("alice", C.NO_PERMISSION),
        ("bad-signature", C.NO_PERMISSION),
        ("root", C.SUCCESS),
    ],
)
def test_with_acl_the_namesrvs_writes_need_an_admin_signature(acl_broker, ak, expected):
    """Before: with --acl, REGISTER_BROKER needed no signature at all."""
    body = _body({"OnPeer": 2})
    if ak == "bad-signature":
        ext = {**_header("peer", "10.0.0.9:10911"), ACCESS_KEY: "root", SIGNATURE: "AAAA"}
    else:
        ext = _signed(_header("peer", "10.0.0.9:10911"), body, ak)
    with RemotingClient(acl_broker.namesrv_endpoint) as c:
        answer = c.request(RemotingCommand(R.REGISTER_BROKER, ext, body))
        assert answer.code == expected, answer.remark
        if expected != C.SUCCESS:
            _clear(answer.remark)
        assert acl_broker.remoting.routes.size == ((1, 1) if expected == C.SUCCESS else (0, 0))
        for code, fields in ((R.UNREGISTER_BROKER, {"brokerAddr": "10.0.0.9:10911", "brokerName": "peer"}),
                             (R.DELETE_TOPIC_IN_NAMESRV, {"topic": "OnPeer"})):  # fmt: skip
            fields = (
                _signed(fields, b"", ak)
                if ak != "bad-signature"
                else {**fields, ACCESS_KEY: "root", SIGNATURE: "x"}
            )
            assert c.request(RemotingCommand(code, fields)).code == expected
    # reads stay open to unsigned clients, as RocketMQ's NameServer serves them
    _local_route_intact(acl_broker)


# --- item 9: timeouts and bounds -------------------------------------------------------------------
def _manager(now: list[int], limits: NamesrvLimits | None = None) -> RouteInfoManager:
    local = LocalBroker("DefaultCluster", "local", "127.0.0.1:10911", lambda: {"L": QueueData(4, 4, 6)},
                        lambda t: None)  # fmt: skip
    return RouteInfoManager(local, now_ms=lambda: now[0], limits=limits or NamesrvLimits())


@pytest.mark.parametrize(
    ("asked_ms", "lives_ms"), [(2**62, 600_000), (1, 10_000), (-5, 10_000), (30_000, 30_000)]
)
def test_heartbeat_timeout_is_clamped(asked_ms, lives_ms):
    """Before: heartbeatTimeoutMillis was taken as given (2^62: registered for ever)."""
    now = [0]
    m = _manager(now)
    m.register(BrokerEntry("C", "b", "10.0.0.2:10911", 0, {}, timeout_ms=asked_ms))
    now[0] = lives_ms
    assert m.size == (1, 0)
    now[0] = lives_ms + 1
    assert (
        m.size == (1, 0) and "b" not in m.cluster_info()["brokerAddrTable"]
    )  # expired at the next look
    assert m.size == (0, 0)


def test_the_registry_is_bounded():
    limits = NamesrvLimits(max_brokers=3, max_topics_per_broker=4, max_topics_total=6)
    m = _manager([0], limits)
    topics = {f"T{i}": QueueData(1, 1, 6) for i in range(4)}
    for i in range(3):
        m.register(
            BrokerEntry(
                "C", f"b{i}", f"10.0.0.{i}:1", 0, dict(list(topics.items())[: 2 if i < 2 else 1])
            )
        )
    assert m.size == (3, 5)
    with pytest.raises(RegistrationError, match="holds 3 brokers, its limit"):
        m.register(BrokerEntry("C", "b9", "10.0.0.9:1", 0, {}))
    with pytest.raises(RegistrationError, match="lists 5 topics; the limit is 4"):
        m.register(BrokerEntry("C", "b0", "10.0.0.0:1", 0, {**topics, "T9": QueueData(1, 1, 6)}))
    with pytest.raises(RegistrationError, match="past 6 topic entries"):
        m.register(BrokerEntry("C", "b2", "10.0.0.2:1", 0, topics))  # 2 + 2 + 4
    m.register(
        BrokerEntry("C", "b2", "10.0.0.2:1", 0, dict(list(topics.items())[:2]))
    )  # a refresh fits
    m.register(BrokerEntry("C", "b1", "10.0.0.7:1", 0, {}))  # b1 moved: replaces its old address
    assert m.size == (3, 4)
    m.delete_topic("T0")
    assert m.size == (3, 2)
    m.connection_closed(12345)
    m.unregister("10.0.0.7:1", "b1")
    assert m.size == (2, 2)


@pytest.mark.parametrize(("header", "remark"), [
    (_header("x" * 128, "10.0.0.1:1"), "the custom header's field 'brokerName' is 128 characters; the limit is 127"),
    (_header("b", "10.0.0.1:1", cluster="a b"), "clusterName 'a b' holds characters other than printable ASCII"),
    (_header("b", "nohost"), "brokerAddr 'nohost' is not HOST:PORT"),
    (_header("b", "h:70000"), "brokerAddr 'h:70000' is not HOST:PORT"),
    (_header("b", "h:1", broker_id=-1), "the custom header's field 'brokerId' is -1: it must be in [0, 2147483647]"),
    (_header("b", "h" * 300 + ":1"), "the custom header's field 'brokerAddr' is 302 characters; the limit is 255"),
    ({**_header("b", "h:1"), "clusterName": ""}, "clusterName is missing or empty"),
    ({k: v for k, v in _header("b", "h:1").items() if k != "brokerAddr"},
     "the custom header's field 'brokerAddr' is missing"),
])  # fmt: skip
def test_broker_identity_is_checked_by_the_request_table(header, remark):
    """REGISTER_BROKER's row decodes and checks the header before any handler runs (the registry
    checks the same rules again: check_identity)."""
    answer = RequestGate(NAMESRV_REQUESTS, None)(None, RemotingCommand(R.REGISTER_BROKER, header))
    assert answer is not None and (answer.code, answer.remark) == (C.SYSTEM_ERROR, remark)


def test_the_registry_checks_identity_at_its_own_boundary():
    m = _manager([0])
    with pytest.raises(RegistrationError) as e:
        m.register(BrokerEntry("C", "b", "nohost", 0, {}))
    assert str(e.value) == "brokerAddr 'nohost' is not HOST:PORT"
    with pytest.raises(RegistrationError) as e:
        m.register(BrokerEntry("C", "b", "h:1", -1, {}))
    assert str(e.value) == "brokerId -1 is not between 0 and 2147483647"
    assert m.size == (0, 0)


def test_every_namesrv_code_has_a_row_and_a_handler_without_one_fails_at_start(broker, monkeypatch):
    """The NameServer's processor installs the request table's gate over NAMESRV_REQUESTS; a
    handler registered without a row fails when the processor is built, not when it is called."""
    processor = broker.remoting.namesrv_server.processor
    assert isinstance(processor.before, RequestGate) and processor.before.table is NAMESRV_REQUESTS
    assert set(processor.handlers) == set(NAMESRV_REQUESTS)
    assert {c for c, s in NAMESRV_REQUESTS.items() if s.body_max != OTHER_BODY_MAX_BYTES} == {
        R.REGISTER_BROKER
    }
    original = ns_processor.Processor.register

    def register_one_more(self, code, handler, **kw):
        original(self, code, handler, **kw)
        if code == R.REGISTER_BROKER:
            original(self, 99999, handler)

    monkeypatch.setattr(ns_processor.Processor, "register", register_one_more)
    with pytest.raises(AssertionError, match=r"without a row in the request table: \[99999\]"):
        ns_processor.namesrv_processor(broker.remoting.routes)


def test_handlers_read_only_the_decoded_header(broker):
    """What a handler executes is what the row decoded: undeclared ext fields are dropped, and a
    number is read in its canonical form."""
    with RemotingClient(broker.namesrv_endpoint) as c:
        answer = c.request(
            RemotingCommand(
                R.REGISTER_BROKER,
                {**_header("peer", "10.0.0.9:10911", broker_id=0), "brokerId": " 1", "extra": "x"},
                _body({"T": 1}),
            )
        )
        assert answer.code == C.SUCCESS, answer.remark
        info = jsonbody.loads(c.request(RemotingCommand(R.GET_BROKER_CLUSTER_INFO)).body)
        assert info["brokerAddrTable"]["peer"]["brokerAddrs"] == {"1": "10.0.0.9:10911"}


@pytest.mark.parametrize(("table", "match"), [
    ({"../x": {"topicName": "../x"}}, "contains characters outside"),
    ({"T": {"topicName": "T", "readQueueNums": 2**31}}, "readQueueNums 2147483648 is not a number between 0 and 1024"),
    ({"T": {"topicName": "T", "writeQueueNums": "8"}}, "writeQueueNums '8' is not a number"),
    ({"T": {"topicName": "T", "perm": 99}}, "perm 99 is not a number between 0 and 15"),
    ({"T": {"topicName": "T", "perm": True}}, "perm True is not a number"),
    ({"T": {"topicName": 5}}, "a topic name is int, not a string"),
    ({"T": "not an object"}, "topicConfigTable\\['T'\\] is not a TopicConfig object"),
])  # fmt: skip
def test_registered_topics_are_checked(table, match):
    body = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": table}}).encode()
    with pytest.raises(RegistrationError, match=match):
        json_topic_table(body)


def test_five_thousand_fake_brokers_in_a_second_do_not_grow_the_registry(broker):
    """Before: every one of them joined the routes (5,000 in one second)."""
    limit = NamesrvLimits().max_brokers
    codes, remarks = [], set()
    with RemotingClient(broker.namesrv_endpoint, timeout_s=30) as c:
        for i in range(5000):
            answer = c.request(RemotingCommand(R.REGISTER_BROKER, _header(f"fake{i}", f"10.{i // 250}.{i % 250}.1:1"),
                                               _body({LOCAL_TOPIC: 8, f"Fake{i}": 1})))  # fmt: skip
            codes.append(answer.code)
            if answer.code != C.SUCCESS:
                remarks.add(_clear(answer.remark))
        assert codes[:limit] == [C.SUCCESS] * limit and set(codes[limit:]) == {C.SYSTEM_ERROR}
        assert remarks == {f"REGISTER_BROKER of fake{i} (10.{i // 250}.{i % 250}.1:1): this NameServer holds {limit} "
                           "brokers, its limit" for i in range(limit, 5000)}  # fmt: skip
        assert broker.remoting.routes.size == (limit, 2 * limit)
        route = jsonbody.loads(
            request(broker.namesrv_endpoint, R.GET_ROUTEINFO_BY_TOPIC, {"topic": LOCAL_TOPIC}).body
        )
        assert len(route["brokerDatas"]) == limit + 1
        _local_route_intact(broker)
    # the connection they came on closed: they are gone
    _wait(lambda: broker.remoting.routes.size == (0, 0))


def _wait(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


# --- item 10: compressed bodies ---------------------------------------------------------------------
def _bomb(inflated_bytes: int) -> bytes:
    z, zeros = zlib.compressobj(9), bytes(1 << 20)
    return b"".join(z.compress(zeros) for _ in range(inflated_bytes >> 20)) + z.flush()


def test_a_compressed_bomb_is_refused_within_the_inflation_limit(broker):
    """Before: 1 MiB of deflate was inflated whole on the event loop (+2 GB, clients frozen 4-7 s).
    Here 512 MiB of zeros (about 0.5 MiB deflated): refused, and the broker's peak memory does
    not grow by anything like it."""
    bomb = _bomb(512 << 20)
    peak_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    answer = request(broker.namesrv_endpoint, R.REGISTER_BROKER, _header("peer", "10.0.0.9:1", compressed="true"),
                     bomb, timeout_s=30)  # fmt: skip
    assert answer.code == C.SYSTEM_ERROR and "inflates to more than 8388608 bytes" in _clear(
        answer.remark
    )
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before_kib) / 1024
    assert grown_mib < 200, f"peak memory grew by {grown_mib:.0f} MiB"
    _local_route_intact(broker)


def test_a_registration_body_over_the_limit_is_refused_before_it_is_read(broker):
    """Before: any body up to the 16 MiB frame was read (9 MiB of JSON here was accepted)."""
    body = _body({"T": 1})[:-1] + b" " * (9 << 20) + b"}"
    answer = request(
        broker.namesrv_endpoint,
        R.REGISTER_BROKER,
        _header("peer", "10.0.0.9:1"),
        body,
        timeout_s=30,
    )
    assert answer.code == C.SYSTEM_ERROR
    assert _clear(answer.remark) == (f"the request body is {len(body)} bytes; request code 103 takes at most "
                                     "8388608")  # fmt: skip
    assert broker.remoting.routes.size == (0, 0)


def test_registrations_are_read_off_the_event_loop_and_bounded_in_flight(broker, monkeypatch):
    """Before: a registration's body was inflated and parsed on the loop every client shares, so
    while one was read no route was served.  Now a blocked read holds no client up, and past
    ``registrations_in_flight`` a registration is answered SYSTEM_BUSY."""
    release, started = threading.Event(), threading.Semaphore(0)

    def slow_read(header, body, limits):
        started.release()
        release.wait(30)
        return {}

    monkeypatch.setattr(ns_processor, "read_topics", slow_read)
    in_flight = NamesrvLimits().registrations_in_flight
    clients = [RemotingClient(broker.namesrv_endpoint, timeout_s=30) for _ in range(in_flight + 1)]
    results: dict[int, RemotingCommand] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(
        i, clients[i].request(RemotingCommand(R.REGISTER_BROKER, _header(f"p{i}", f"10.0.0.{i}:1"))))) for i in
        range(in_flight)]  # fmt: skip
    try:
        for t in threads:
            t.start()
        for _ in range(in_flight):
            assert started.acquire(timeout=10), "a registration never reached its reader"
        t0 = time.monotonic()
        _local_route_intact(broker)  # the loop serves while every reader is blocked
        assert time.monotonic() - t0 < 5
        busy = clients[-1].request(
            RemotingCommand(R.REGISTER_BROKER, _header("late", "10.0.1.1:1"))
        )
        assert busy.code == C.SYSTEM_BUSY and "try again" in _clear(busy.remark)
        release.set()
        for t in threads:
            t.join(30)
        assert [results[i].code for i in range(in_flight)] == [C.SUCCESS] * in_flight
        assert broker.remoting.routes.size == (in_flight, 0)
    finally:
        release.set()
        for c in clients:
            c.close()


def test_other_requests_bodies_and_echoed_names_are_bounded(broker):
    """Before: any NameServer code took a body up to the 16 MiB frame (with --acl, signed over on
    the loop), and an unknown topic of 100,000 characters was echoed whole in the answer."""
    big = request(
        broker.namesrv_endpoint,
        R.GET_ROUTEINFO_BY_TOPIC,
        {"topic": LOCAL_TOPIC},
        b"x" * (100 << 10),
    )
    assert big.code == C.SYSTEM_ERROR
    assert (
        _clear(big.remark)
        == "the request body is 102400 bytes; request code 105 takes at most 65536"
    )
    missing = request(broker.namesrv_endpoint, R.GET_ROUTEINFO_BY_TOPIC, {"topic": "T" * 100_000})
    assert missing.code == C.TOPIC_NOT_EXIST and len(_clear(missing.remark)) < 200


@pytest.mark.parametrize(("topic", "remark"), [
    ("NoSuchTopic", None),
    ("../commitlog", "No topic route info in name server: topic '../commitlog' contains characters outside "
                     "[%|a-zA-Z0-9_-]"),
    ("", "No topic route info in name server: topic is empty"),
])  # fmt: skip
def test_a_route_query_names_a_topic_no_broker_can_hold_as_not_existing(broker, topic, remark):
    """A topic name validated by the same rules as every other way in; one no broker can hold has
    no route (TOPIC_NOT_EXIST, as a NameServer answers any topic it does not know)."""
    broker.store.topics.auto_create = False  # a valid name gets no auto-creation route either
    answer = request(broker.namesrv_endpoint, R.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    assert answer.code == C.TOPIC_NOT_EXIST
    assert answer.remark == (remark or f"No topic route info in name server for the topic: {topic}")


def test_a_registration_read_after_its_connection_closed_does_not_linger(broker, monkeypatch):
    """A broker leaves with its connection; one whose registration was still being read (off the
    loop) when it closed must leave too, not stay until its heartbeat timeout."""
    release, started, registered = threading.Event(), threading.Event(), threading.Event()
    routes = broker.remoting.routes
    real_register = routes.register

    def slow_read(header, body, limits):
        started.set()
        release.wait(30)
        return {}

    def register(entry):
        try:
            real_register(entry)
        finally:
            registered.set()

    monkeypatch.setattr(ns_processor, "read_topics", slow_read)
    monkeypatch.setattr(routes, "register", register)
    with RemotingClient(broker.namesrv_endpoint) as c:
        c.oneway(RemotingCommand(R.REGISTER_BROKER, _header("gone", "10.0.0.8:1")))
        assert started.wait(10)
    _wait(lambda: not broker.remoting.namesrv_server.connections)  # the server saw it close
    release.set()
    assert registered.wait(10)
    _wait(lambda: routes.size == (0, 0))


# --- item 20: malformed bodies get a clear answer ---------------------------------------------------
@pytest.mark.parametrize(("body", "extra", "match"), [
    (b"not json at all", {}, "neither JSON nor deflated"),
    (b"[" * 200_000 + b"]" * 200_000, {}, "nested too deeply"),
    (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, {}, "nested too deeply"),
    (b'"a string"', {}, "is a JSON str, not a RegisterBrokerBody object"),
    (b'{"topicConfigSerializeWrapper": "x"}', {}, "topicConfigSerializeWrapper is not an object"),
    (b'{"topicConfigSerializeWrapper": {"topicConfigTable": []}}', {}, "topicConfigTable is not an object"),
    (b'{"topicConfigSerializeWrapper": {"topicConfigTable": {"T": {"readQueueNums": "x"}}}}', {},
     "readQueueNums 'x' is not a number"),
    (b'{"a":"\xc3\x28"}', {}, "not UTF-8 text"),
    (b'{"a":%s}' % (b"9" * 5000), {}, "a number too long to be one"),
    (zlib.compress(b"\x00\x00\x00\x02{}\x00\x00\x00\x01\x00\x00\x00\x07T 1 x 6"), {},
     "topic 'T': writeQueueNums 'x' is not a number between 0 and 1024"),
    (zlib.compress(b"\x00\x00\x00\x02{}\x00\x00\x00\x01\x00\x00\x00\x05T 1 1"), {}, "has 3 fields"),
    (zlib.compress(b"\x00\x00\x00\x02{}\x7f\xff\xff\xff"), {}, "lists 2147483647 topics; the limit is 16384"),
    (zlib.compress(b"{}")[:-3], {"compressed": "true"}, "compressed body is not valid zlib data \\(incomplete or truncated"),
    (b"\x78garbage", {}, "compressed body is not valid zlib data"),
    (b"{}", {"bodyCrc32": "12345"}, "crc32 not match"),
])  # fmt: skip
def test_malformed_registration_bodies_get_a_clear_error(broker, caplog, body, extra, match):
    """Before: deep nesting answered ``RecursionError: ...`` (and logged a traceback), wrong types
    ``'str' object has no attribute 'get'``, queue counts ``invalid literal for int()``."""
    with caplog.at_level(logging.ERROR):
        answer = request(
            broker.namesrv_endpoint, R.REGISTER_BROKER, _header("peer", "10.0.0.9:1", **extra), body
        )
    assert answer.code == C.SYSTEM_ERROR
    assert re.search(match, _clear(answer.remark)), answer.remark
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert broker.remoting.routes.size == (0, 0)
    _local_route_intact(broker)


def test_a_good_registration_still_registers_in_both_forms(broker):
    body = _body({"OnPeer": 3})
    with RemotingClient(broker.namesrv_endpoint) as c:  # a broker stays registered while connected
        for i, (payload, compressed) in enumerate(
            ((body, "false"), (zlib.compress(_compact({"OnPeer": 3})), "true"))
        ):
            answer = c.request(RemotingCommand(R.REGISTER_BROKER, _header(
                f"peer{i}", f"10.0.0.{i}:1", compressed=compressed, bodyCrc32=str(zlib.crc32(payload) & 0x7FFFFFFF)),
                payload))  # fmt: skip
            assert answer.code == C.SUCCESS, answer.remark
        route = jsonbody.loads(
            request(broker.namesrv_endpoint, R.GET_ROUTEINFO_BY_TOPIC, {"topic": "OnPeer"}).body
        )
        assert sorted(q["brokerName"] for q in route["queueDatas"]) == ["peer0", "peer1"]
        assert {q["writeQueueNums"] for q in route["queueDatas"]} == {3}


def _compact(topics: dict[str, int]) -> bytes:
    def chunk(b: bytes) -> bytes:
        return struct.pack(">i", len(b)) + b

    lines = [f"{t} {n} {n} 6 SINGLE_TAG".encode() for t, n in topics.items()]
    return (
        chunk(b'{"counter":1}')
        + struct.pack(">i", len(lines))
        + b"".join(map(chunk, lines))
        + chunk(b"[]")
    )


def test_read_topics_holds_both_forms_to_the_same_table():
    header = RegisterHeader("C", "b", "h:1", 0, 120_000, False, 0)
    topics = {"A": 2, "%RETRY%g": 1, "RMQ_SYS_TRANS_HALF_TOPIC": 1}
    assert read_topics(header, _body(topics)) == compressed_topic_table(
        zlib.compress(_compact(topics))
    )
    assert read_topics(header, _body(topics)) == {t: QueueData(n, n, 6) for t, n in topics.items()}


# --- the fuzz test ---------------------------------------------------------------------------------
_HUNT = int(os.environ.get("RMQ_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_HUNT or 60, derandomize=not _HUNT, database=None, deadline=None, print_blob=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])  # fmt: skip
NAMESRV_CODES = [R.GET_ROUTEINFO_BY_TOPIC, R.REGISTER_BROKER, R.UNREGISTER_BROKER, R.GET_BROKER_CLUSTER_INFO,
                 R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, R.GET_TOPICS_BY_CLUSTER, R.DELETE_TOPIC_IN_NAMESRV, 322, 100,
                 101, 0, 99999]  # fmt: skip
FIELDS = ["topic", "brokerName", "brokerAddr", "clusterName", "cluster", "haServerAddr", "brokerId",
          "heartbeatTimeoutMillis", "compressed", "bodyCrc32", "enableActingMaster", "acceptStandardJsonOnly",
          ACCESS_KEY, SIGNATURE]  # fmt: skip
_numbers = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([0, 1, -1, 2**31, 2**62, 2**63]))
HUGE_NUMBER = "9" * 5000  # past Python's 4300 digits of int()
_values = st.one_of(
    st.sampled_from([LOCAL_TOPIC, "local", "rmq-spark-broker", "DefaultCluster", "true", "false", "", " ", "../x",
                     "10.0.0.1:10911", "127.0.0.1:0", "h:99999", "x" * 300, "\x00", "TBW102", "%RETRY%g", "\ud800",
                     "a\udfffb"]),
    _numbers.map(str), st.just(HUGE_NUMBER), st.text(max_size=40), st.text(max_size=5000).map(lambda s: s * 3))  # fmt: skip
_json = st.recursive(st.one_of(st.none(), st.booleans(), _numbers, st.floats(), st.text(max_size=20)),
                     lambda inner: st.one_of(st.lists(inner, max_size=4),
                                             st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                     max_leaves=20)  # fmt: skip
_topic_config = st.fixed_dictionaries({}, optional={k: st.one_of(_json, _numbers, st.sampled_from(["T", LOCAL_TOPIC]))
                                                    for k in ("topicName", "readQueueNums", "writeQueueNums", "perm",
                                                              "topicSysFlag")})  # fmt: skip
_registration = st.dictionaries(st.sampled_from(["T", LOCAL_TOPIC, "A", "../b", ""]), _topic_config, max_size=4).map(
    lambda t: json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": t}}).encode())  # fmt: skip
_bodies = st.one_of(st.just(b""), st.binary(max_size=200), _json.map(lambda d: json.dumps(d).encode()), _registration,
                    _registration.map(zlib.compress), st.binary(max_size=300).map(zlib.compress),
                    st.integers(1, 64).map(lambda n: b"[" * (n * 1000)),
                    st.sampled_from([_bomb(64 << 20), zlib.compress(_compact({"T": 1, LOCAL_TOPIC: 4})),
                                     b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"perm":%s}}}}'
                                     % HUGE_NUMBER.encode()]))  # fmt: skip


# a REGISTER_BROKER / UNREGISTER_BROKER header that mostly passes the identity checks (so bodies
# are read), with any field replaced or added
_register_header = st.builds(
    lambda name, host, port, broker_id, timeout, compressed, extra: {
        "brokerName": name, "brokerAddr": f"{host}:{port}", "clusterName": "FuzzCluster", "brokerId": broker_id,
        "heartbeatTimeoutMillis": timeout, "compressed": compressed, **extra},
    st.sampled_from(["peer-a"] * 4 + ["peer-b"] * 4 + ["rmq-spark-broker", "x" * 128, "a b"]),
    st.sampled_from(["10.0.0.1"] * 4 + ["10.0.0.2"] * 4 + ["127.0.0.1", "[::1]", ""]),
    st.sampled_from(["10911"] * 8 + ["0", "65536", "x"]),
    st.sampled_from(["0"] * 4 + ["1"] * 4 + ["-1", "2147483648", "x"]),
    st.sampled_from(["120000"] * 6 + ["1", "-1", str(2**62), str(2**63), HUGE_NUMBER, "x"]),
    st.sampled_from(["true", "false", "false", "TRUE", ""]),
    st.one_of(st.just({}), st.just({}), st.just({}), st.dictionaries(st.sampled_from(FIELDS), _values, max_size=2)),
)  # fmt: skip


@pytest.fixture(scope="module", params=["open", "acl"])
def fuzz_broker(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("namesrv-fuzz")
    (d / "acl.json").write_text(json.dumps(ACL))
    opts = {"acl_path": str(d / "acl.json")} if request.param == "acl" else {}
    with _broker(d, **opts) as b:
        yield b


@FUZZ
@given(code=st.sampled_from(NAMESRV_CODES + [R.REGISTER_BROKER] * 6 + [R.UNREGISTER_BROKER] * 2),
       fields=st.one_of(st.dictionaries(st.sampled_from(FIELDS), _values, max_size=10), _register_header),
       body=_bodies, binary=st.booleans())  # fmt: skip
def test_fuzz_every_namesrv_code(fuzz_broker, caplog, code, fields, body, binary):
    """Any header and body on any NameServer code: an answer (never a dropped connection, never a
    Python exception text, nothing logged at ERROR), and the local broker's routes intact."""
    b = fuzz_broker
    stype = SerializeType.ROCKETMQ if binary else SerializeType.JSON
    if binary:  # the binary codec writes UTF-8: a lone surrogate cannot be sent that way
        fields = {k: v.encode("utf-8", "replace").decode() for k, v in fields.items()}
    with caplog.at_level(logging.ERROR):
        answer = request(b.namesrv_endpoint, code, fields, body, serialize_type=stype, timeout_s=30)
    assert answer.is_response
    event(f"request {code} -> {answer.code}")
    if answer.code != C.SUCCESS and answer.remark:
        _clear(answer.remark)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [
        r.getMessage() for r in caplog.records
    ]
    brokers, topics = b.remoting.routes.size
    assert brokers <= NamesrvLimits().max_brokers and topics <= NamesrvLimits().max_topics_total
    _local_route_intact(b)
