"""One set of message rules for every way in: what the remoting port refuses of a send, as the
gRPC port and the sink do (issue 28, items 12 and 14), and the header fields the request table
refuses before any handler runs."""

from __future__ import annotations

import struct
import zlib

import pytest

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.remoting.client import RemotingClient
from rmq_spark.remoting.codes import RequestCode as R
from rmq_spark.remoting.codes import ResponseCode as C
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.store import layout as L


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    root = tmp_path_factory.mktemp("send_rules")
    opts = BrokerOptions(
        listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen="127.0.0.1:0"
    )
    with Broker(str(root / "store"), options=opts) as b:
        yield b


def _v2(topic: str = "Rules", sys_flag: int = 0, **extra: str) -> dict[str, str]:
    return {"a": "pg", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": str(sys_flag), "g": "1", "h": "0",
            "i": "", "j": "0", "k": "false", **extra}  # fmt: skip


def _item(
    body: bytes, props: bytes = b"", props_len: int | None = None, total: int | None = None
) -> bytes:
    plen = len(props) if props_len is None else props_len
    size = 20 + len(body) + 2 + len(props) if total is None else total
    return struct.pack(">iiiii", size, 0, 0, 0, len(body)) + body + struct.pack(">h", plen) + props


def _ask(b: Broker, code: int, fields: dict[str, str], body: bytes = b"") -> RemotingCommand:
    with RemotingClient(b.remoting_endpoint, timeout_s=30) as c:
        return c.request(RemotingCommand(code, fields, body, version=409))


def _max_offset(b: Broker, topic: str) -> int:
    return int(
        _ask(b, R.GET_MAX_OFFSET, {"topic": topic, "queueId": "0"}).ext_fields.get("offset", "-1")
    )


def test_compressed_bodies_must_inflate_within_the_limit(broker):
    ok = _ask(
        broker, R.SEND_MESSAGE_V2, _v2(sys_flag=L.FLAG_COMPRESSED), zlib.compress(b"hello" * 100)
    )
    assert ok.code == C.SUCCESS, ok.remark
    before = _max_offset(broker, "Rules")
    not_zlib = _ask(
        broker, R.SEND_MESSAGE_V2, _v2(sys_flag=L.FLAG_COMPRESSED), b"plain text, not zlib"
    )
    assert not_zlib.code == C.MESSAGE_ILLEGAL and "COMPRESSED" in not_zlib.remark, not_zlib.remark
    bomb = zlib.compress(b"\0" * (L.BODY_MAX_BYTES + 1), 9)
    assert len(bomb) < 8192
    refused = _ask(broker, R.SEND_MESSAGE_V2, _v2(sys_flag=L.FLAG_COMPRESSED), bomb)
    assert refused.code == C.MESSAGE_ILLEGAL, refused.remark
    batch = _ask(
        broker, R.SEND_BATCH_MESSAGE, _v2(sys_flag=L.FLAG_COMPRESSED, m="true"), _item(b"nope")
    )
    assert batch.code == C.MESSAGE_ILLEGAL, batch.remark
    assert _max_offset(broker, "Rules") == before


def test_bodies_empty_or_over_the_limit_are_refused(broker):
    before = _max_offset(broker, "Rules")
    empty = _ask(broker, R.SEND_MESSAGE_V2, _v2(), b"")
    assert empty.code == C.MESSAGE_ILLEGAL and "empty" in empty.remark
    for size in (L.BODY_MAX_BYTES + 1, 15 << 20):
        big = _ask(broker, R.SEND_MESSAGE_V2, _v2(), b"x" * size)
        assert big.code == C.MESSAGE_ILLEGAL and "limit" in big.remark, big.remark
    three = b"".join(_item(b"y" * ((4 << 20) - 64)) for _ in range(3))
    assert _ask(broker, R.SEND_BATCH_MESSAGE, _v2(m="true"), three).code == C.MESSAGE_ILLEGAL
    assert _max_offset(broker, "Rules") == before


@pytest.mark.parametrize("body, why", [
    (_item(b"a", props_len=-1), "properties length"),
    (_item(b"a", b"K\x01V\x02", props_len=200), "properties length"),
    (_item(b""), "empty body"),
    (_item(b"a", total=10), "bad size"),
    (_item(b"a", total=1 << 30), "bad size"),
    (_item(b"a")[:-1], "bad size"),
], ids=["negative-propsLen", "overrunning-propsLen", "empty-item", "short-total", "huge-total", "truncated"])  # fmt: skip
def test_malformed_batch_items_are_refused_naming_the_fault(broker, body, why):
    before = _max_offset(broker, "Rules")
    answer = _ask(broker, R.SEND_BATCH_MESSAGE, _v2(m="true"), _item(b"good") + body)
    assert answer.code != C.SUCCESS and why in answer.remark, answer.remark
    assert _max_offset(broker, "Rules") == before


def test_code_320_is_a_batch_with_or_without_its_flag(broker):
    before = _max_offset(broker, "Rules")
    answer = _ask(broker, R.SEND_BATCH_MESSAGE, _v2(), _item(b"one") + _item(b"two"))
    assert answer.code == C.SUCCESS, answer.remark
    assert _max_offset(broker, "Rules") == before + 2


@pytest.mark.parametrize(
    "group", ["../../x", "a\x00b", "g" * 100_000, ""], ids=["path", "nul", "100k", "empty"]
)
def test_group_names_are_validated_on_remoting(broker, group, tmp_path):
    fields = {"consumerGroup": group, "topic": "Rules", "queueId": "0", "commitOffset": "0"}
    answer = _ask(broker, R.UPDATE_CONSUMER_OFFSET, fields)
    assert answer.code == C.SYSTEM_ERROR and "consumerGroup" in answer.remark, answer.remark
    assert len(answer.remark) < 1000
    assert group not in broker.store.offsets.groups() or group == ""


@pytest.mark.parametrize("fields, why", [
    ({"queueId": "-1"}, "queueId"),
    ({"commitOffset": "-5"}, "commitOffset"),
    ({"queueId": "abc"}, "not a number"),
    ({"commitOffset": "9" * 5000}, "not a number"),
], ids=["queue-minus-one", "offset-minus-five", "queue-abc", "offset-5000-digits"])  # fmt: skip
def test_offsets_the_loader_would_refuse_are_refused_on_the_wire(broker, fields, why):
    base = {"consumerGroup": "rules_g", "topic": "Rules", "queueId": "0", "commitOffset": "0"}
    answer = _ask(broker, R.UPDATE_CONSUMER_OFFSET, {**base, **fields})
    assert answer.code == C.SYSTEM_ERROR and why in answer.remark, answer.remark
    assert "ValueError" not in answer.remark and len(answer.remark) < 300


def test_heartbeat_bodies_of_the_wrong_shape_get_a_clear_error(broker):
    for body, why in ((b"[" * 20000 + b"]" * 20000, "JSON"), (b'"just a string"', "not a JSON object"),
                      (b'{"clientID": "c", "consumerDataSet": ["x"]}', "list of objects"),
                      (b'{"clientID": "c", "consumerDataSet": [{"groupName": "../x"}]}', "groupName"),
                      (b'{"consumerDataSet": []}', "clientID")):  # fmt: skip
        answer = _ask(broker, R.HEART_BEAT, {}, body)
        assert answer.code == C.SYSTEM_ERROR and why in answer.remark, (body[:40], answer.remark)
        assert "Error" not in answer.remark.split(":")[0]
