"""Access control over remoting with the same ACL file as gRPC: requests signed as the Java
clients' AclClientRPCHook signs them pass, unsigned, badly signed or unpermitted ones get
NO_PERMISSION (the Java client itself: tests/interop's ACL test)."""

from __future__ import annotations

import json

import pytest

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.remoting.acl import ACCESS_KEY, SIGNATURE, sign
from rmq_spark.remoting.client import RemotingClient
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand

ACCOUNTS = {"accounts": [
    {"accessKey": "writer", "secretKey": "w-secret", "topicPerms": ["Orders=PUB"], "defaultGroupPerm": "SUB"},
    {"accessKey": "reader", "secretKey": "r-secret", "topicPerms": ["Orders=SUB"], "groupPerms": ["billing=SUB",
                                                                                                   "other=DENY"]},
    {"accessKey": "root", "secretKey": "root-secret", "admin": True},
]}  # fmt: skip
SECRETS = {a["accessKey"]: a["secretKey"] for a in ACCOUNTS["accounts"]}


@pytest.fixture
def broker(tmp_path):
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps(ACCOUNTS))
    opts = BrokerOptions(
        listen="127.0.0.1:0",
        remoting_listen="127.0.0.1:0",
        namesrv_listen="127.0.0.1:0",
        acl_path=str(acl),
    )
    with Broker(str(tmp_path / "store"), options=opts) as b:
        yield b


def _signed(
    code: int, fields: dict[str, str], body: bytes, ak: str | None, secret: str | None = None
) -> RemotingCommand:
    ext = dict(fields)
    if ak is not None:
        ext[ACCESS_KEY] = ak
        ext[SIGNATURE] = sign(ext, body, secret if secret is not None else SECRETS[ak])
    return RemotingCommand(code, ext, body, version=409)


def _send(topic: str) -> dict[str, str]:
    return {
        "a": "pg",
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": "0",
        "f": "0",
        "g": "1",
        "h": "0",
        "i": "",
        "j": "0",
        "k": "false",
    }


def _pull(topic: str, group: str) -> dict[str, str]:
    return {
        "consumerGroup": group,
        "topic": topic,
        "queueId": "0",
        "queueOffset": "0",
        "maxMsgNums": "4",
        "sysFlag": "4",
        "commitOffset": "0",
        "suspendTimeoutMillis": "0",
        "subscription": "*",
        "subVersion": "0",
        "expressionType": "TAG",
    }


def test_signature_matches_rocketmqs_definition():
    # values of the sorted ext fields but Signature, then the body; HmacSHA1, Base64
    import base64
    import hashlib
    import hmac

    ext = {"b": "T", "AccessKey": "ak", "a": "g", "Signature": "ignored"}
    want = base64.b64encode(hmac.new(b"sk", b"akgT" + b"body", hashlib.sha1).digest()).decode()
    assert sign(ext, b"body", "sk") == want


def test_sends_and_pulls_need_a_valid_signature_and_the_permission(broker):
    with RemotingClient(broker.remoting_endpoint) as c:
        ask = c.request
        assert (
            ask(_signed(RequestCode.SEND_MESSAGE_V2, _send("Orders"), b"x", "writer")).code
            == ResponseCode.SUCCESS
        )
        unsigned = ask(_signed(RequestCode.SEND_MESSAGE_V2, _send("Orders"), b"x", None))
        assert unsigned.code == ResponseCode.NO_PERMISSION and "not signed" in unsigned.remark
        forged = ask(_signed(RequestCode.SEND_MESSAGE_V2, _send("Orders"), b"x", "writer", "guess"))
        assert forged.code == ResponseCode.NO_PERMISSION and "signature" in forged.remark
        unknown = ask(_signed(RequestCode.SEND_MESSAGE_V2, _send("Orders"), b"x", "nobody", "s"))
        assert unknown.code == ResponseCode.NO_PERMISSION
        # the body is signed too
        tampered = _signed(RequestCode.SEND_MESSAGE_V2, _send("Orders"), b"x", "writer")
        tampered.body = b"y"
        assert ask(tampered).code == ResponseCode.NO_PERMISSION
        no_pub = ask(_signed(RequestCode.SEND_MESSAGE_V2, _send("Orders"), b"x", "reader"))
        assert no_pub.code == ResponseCode.NO_PERMISSION and "PUB" in no_pub.remark
        other = ask(_signed(RequestCode.SEND_MESSAGE_V2, _send("Audit"), b"x", "writer"))
        assert other.code == ResponseCode.NO_PERMISSION
        assert (
            ask(_signed(RequestCode.PULL_MESSAGE, _pull("Orders", "billing"), b"", "reader")).code
            == ResponseCode.SUCCESS
        )
        denied_group = ask(
            _signed(RequestCode.PULL_MESSAGE, _pull("Orders", "other"), b"", "reader")
        )
        assert denied_group.code == ResponseCode.NO_PERMISSION and "group" in denied_group.remark
        assert (
            ask(_signed(RequestCode.PULL_MESSAGE, _pull("Orders", "billing"), b"", "writer")).code
            == ResponseCode.NO_PERMISSION
        )
        create = {"topic": "New", "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"}
        assert (
            ask(_signed(RequestCode.UPDATE_AND_CREATE_TOPIC, create, b"", "writer")).code
            == ResponseCode.NO_PERMISSION
        )
        assert (
            ask(_signed(RequestCode.UPDATE_AND_CREATE_TOPIC, create, b"", "root")).code
            == ResponseCode.SUCCESS
        )
    # the NameServer stays open, as RocketMQ's
    from rmq_spark.remoting.client import request

    assert (
        request(
            broker.namesrv_endpoint, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"}
        ).code
        == 0
    )
