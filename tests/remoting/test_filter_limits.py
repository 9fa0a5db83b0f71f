"""Issue 28 item 15 (SQL92) and item 20 (filter answers): a subscription expression cannot hold
the broker's event loop.  Expressions are limited in size, their parse outcome is cached (failures
too), an SQL92 expression is parsed off the event loop, and every bad expression is answered
SUBSCRIPTION_PARSE_FAILED naming the problem (never Python's text).  On gRPC a filter of a type
the protocol does not define is refused instead of served as TAG."""

from __future__ import annotations

import threading

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as D
from rocketmq.grpc_protocol import service_pb2 as S
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.broker.testing import metadata
from rmq_spark.errors import FilterExpressionError
from rmq_spark.filter import MAX_EXPRESSION_CHARS, SqlFilter, TagFilter, make_filter, sql_compile
from rmq_spark.remoting.client import RemotingClient
from rmq_spark.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.store.message import Message

TOPIC = "FilterT"


@pytest.fixture
def broker(tmp_path):
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen=None)
    with Broker(str(tmp_path / "store"), options=opts) as b:
        b.store.put_messages([Message(TOPIC, b"m%d" % i, {"n": str(i)}) for i in range(3)])
        yield b


def _pull(c: RemotingClient, expr: str, expr_type: str = "SQL92") -> RemotingCommand:
    return c.request(RemotingCommand(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "g", "topic": TOPIC, "queueId": "0", "queueOffset": "0", "maxMsgNums": "8",
        "sysFlag": str(int(PullSysFlag.SUBSCRIPTION)), "commitOffset": "0", "suspendTimeoutMillis": "0",
        "subscription": expr, "subVersion": "0", "expressionType": expr_type}, version=409))  # fmt: skip


# --- the filter package -------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["SQL92", "TAG"])
def test_an_expression_over_the_limit_is_refused_naming_the_limit(kind):
    body = (
        "a = 1 or " * (MAX_EXPRESSION_CHARS // 9) + "a = 2"
        if kind == "SQL92"
        else "t||" * MAX_EXPRESSION_CHARS
    )
    assert len(body) > MAX_EXPRESSION_CHARS
    with pytest.raises(
        FilterExpressionError, match=f"characters long; the limit is {MAX_EXPRESSION_CHARS}"
    ):
        make_filter(kind, body)
    at_limit = (
        "a = 1" + " " * (MAX_EXPRESSION_CHARS - 5)
        if kind == "SQL92"
        else "t" * MAX_EXPRESSION_CHARS
    )
    assert make_filter(kind, at_limit) is not None


@pytest.mark.parametrize("digits", [20, 4301, 16_000])
def test_a_huge_number_is_out_of_range_not_a_python_error(digits):
    with pytest.raises(FilterExpressionError, match="out of the range of a long") as e:
        SqlFilter.parse("a = " + "9" * digits)
    assert "4300" not in str(e.value) and "ValueError" not in str(e.value)


def test_failed_parses_are_cached_like_successes(monkeypatch):
    calls: list[str] = []
    real = sql_compile._compile_uncached

    def counting(text: str):  # type: ignore[no-untyped-def]
        calls.append(text)
        return real(text)

    monkeypatch.setattr(sql_compile, "_compile_uncached", counting)
    bad = "a = 1 and b >>> 2 -- cached failure"
    for _ in range(5):
        with pytest.raises(FilterExpressionError, match="unexpected"):
            SqlFilter.parse(bad)
    good = "a = 1 -- cached success"
    assert all(SqlFilter.parse(good).matches({"a": "1"}) for _ in range(5))
    assert calls == [bad, good]
    # the cache is bounded: 300 new expressions leave it at its size
    for i in range(300):
        SqlFilter.parse(f"a = {i}")
    assert len(sql_compile._cache) == sql_compile._CACHE_ENTRIES


def test_tag_filter_limit_applies_to_the_tag_path_too():
    assert TagFilter.parse("a || b").tags == frozenset({"a", "b"})
    with pytest.raises(FilterExpressionError, match="TAG filter expression"):
        TagFilter.parse("x" * (MAX_EXPRESSION_CHARS + 1))


# --- over the remoting port ---------------------------------------------------------------------
def test_bad_sql92_subscriptions_are_answered_parse_failed_naming_the_problem(broker):
    with RemotingClient(broker.remoting_endpoint, timeout_s=30) as c:
        ok = _pull(c, "n >= 1")
        assert ok.code == ResponseCode.SUCCESS and b"n\x011" in ok.body and b"n\x010" not in ok.body
        too_long = _pull(c, "n = 1 or " * 2000 + "n = 2")
        assert too_long.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        assert f"the limit is {MAX_EXPRESSION_CHARS}" in too_long.remark
        huge_number = _pull(c, "n = " + "1" * 5000)
        assert huge_number.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        assert (
            "out of the range of a long" in huge_number.remark and "4300" not in huge_number.remark
        )
        syntax = _pull(c, "n >>> 1")
        assert (
            syntax.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
            and "line 1, column" in syntax.remark
        )
        unknown_type = _pull(c, "n = 1", "XPATH")
        assert (
            unknown_type.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
            and "XPATH" in unknown_type.remark
        )
        assert _pull(c, "n >= 1").code == ResponseCode.SUCCESS  # the connection still serves


def test_an_sql92_parse_runs_off_the_event_loop(broker, monkeypatch):
    """While a new expression is being parsed (held here until another client is answered), the
    event loop serves other connections: were the parse on the loop, the other client would
    wait for it and the parse for the other client's answer, and both would time out."""
    import rmq_spark.remoting.pull as pull_module

    other_answered = threading.Event()
    parse_started = threading.Event()
    real = pull_module.make_filter

    def slow_parse(kind, expression):  # type: ignore[no-untyped-def]
        parse_started.set()
        assert other_answered.wait(10), "the event loop did not serve another client during a parse"
        return real(kind, expression)

    monkeypatch.setattr(pull_module, "make_filter", slow_parse)
    result: list[RemotingCommand] = []
    with RemotingClient(broker.remoting_endpoint, timeout_s=30) as c, \
            RemotingClient(broker.remoting_endpoint, timeout_s=5) as other:  # fmt: skip
        t = threading.Thread(target=lambda: result.append(_pull(c, "n >= 2 -- a new expression")))
        t.start()
        assert parse_started.wait(10)
        probe = other.request(
            RemotingCommand(RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": "0"})
        )
        assert probe.code == ResponseCode.SUCCESS
        other_answered.set()
        t.join(30)
    assert result and result[0].code == ResponseCode.SUCCESS
    assert (
        b"n\x012" in result[0].body and b"n\x011" not in result[0].body
    )  # only the message with n = 2


# --- over gRPC ----------------------------------------------------------------------------------
def _receive(endpoints: str, filter_type: int) -> list[S.ReceiveMessageResponse]:
    req = S.ReceiveMessageRequest(batch_size=4)
    req.group.name = "g"
    req.message_queue.topic.name = TOPIC
    req.filter_expression.type = filter_type  # type: ignore[assignment]
    req.filter_expression.expression = "*"
    req.invisible_duration.FromSeconds(30)
    req.long_polling_timeout.FromSeconds(1)
    with grpc.insecure_channel(endpoints) as ch:
        return list(MessagingServiceStub(ch).ReceiveMessage(req, metadata=metadata(), timeout=20))


def test_grpc_refuses_a_filter_type_the_protocol_does_not_define(broker):
    refused = _receive(broker.endpoints, 99)
    assert refused[0].status.code == D.Code.ILLEGAL_FILTER_EXPRESSION
    assert "FilterType 99" in refused[0].status.message
    served = _receive(broker.endpoints, D.FilterType.TAG)
    assert any(r.HasField("message") for r in served)


def test_an_expression_over_the_limit_is_refused_without_being_parsed_or_cached(
    broker, monkeypatch
):
    """A subscription over the limit is answered at once on the loop: no parse, no cache entry
    (256 entries of the 32 KiB a header field may hold would be 8 MiB).  (Past 32 KiB the request
    table refuses the field itself, before the pull is served.)"""
    processor = broker.remoting.pull
    cached = len(processor._filters)
    with RemotingClient(broker.remoting_endpoint, timeout_s=30) as c:
        for valid in (True, False):
            expr = "n = 1 or " * (30_000 // 9) + ("n = 2" if valid else "n >>> 2")
            answer = _pull(c, expr)
            assert answer.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
            assert f"the limit is {MAX_EXPRESSION_CHARS}" in answer.remark
    assert len(processor._filters) == cached
