"""Hostile remoting requests sent to both targets, the real Apache RocketMQ and rmq-broker, with
what each must do: never lose stored data, keep serving, and refuse what it cannot do safely.

rmq-broker must refuse each of them with an answer naming the problem; Apache's answer is
recorded beside it (where Apache refuses too, both must), and every message stored before the
requests is still there afterwards on both."""

from __future__ import annotations

import json
import re

import pytest
from _apache import remoting_request

pytestmark = pytest.mark.interop

GET_BROKER_CLUSTER_INFO = 106
SEND_MESSAGE_V2 = 310
GET_MAX_OFFSET = 30
UPDATE_AND_CREATE_TOPIC = 17
DELETE_TOPIC_IN_BROKER = 215
UPDATE_CONSUMER_OFFSET = 15
QUERY_CONSUMER_OFFSET = 14


def _broker_addrs(namesrv: str) -> list[str]:
    header, body = remoting_request(namesrv, GET_BROKER_CLUSTER_INFO)
    assert header["code"] == 0, header
    text = re.sub(r"([{,])(-?\d+):", r'\1"\2":', body.decode())
    table = json.loads(text)["brokerAddrTable"]
    return sorted(b["brokerAddrs"]["0"] for b in table.values())


def _send(addr: str, topic: str, body: bytes = b"") -> dict:
    fields = {"a": "hostile_pg", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0",
              "i": "", "j": "0", "k": "false"}  # fmt: skip
    header, _ = _request(addr, SEND_MESSAGE_V2, fields, body)
    return header


def _request(addr: str, code: int, fields: dict[str, str], body: bytes = b"") -> tuple[dict, bytes]:
    return remoting_request(addr, code, fields, timeout_s=10.0, body=body)


def _max_offset(addr: str, topic: str) -> int:
    header, _ = remoting_request(addr, GET_MAX_OFFSET, {"topic": topic, "queueId": "0"})
    assert header["code"] == 0, header
    return int(header["extFields"]["offset"])


HOSTILE = [
    # (name, code, fields, must Apache refuse too)
    ("delete a path", DELETE_TOPIC_IN_BROKER, {"topic": "../commitlog"}, False),
    ("delete an absolute path", DELETE_TOPIC_IN_BROKER, {"topic": "/tmp"}, False),
    ("delete the empty topic", DELETE_TOPIC_IN_BROKER, {"topic": ""}, False),
    (
        "reconfigure a system topic",
        UPDATE_AND_CREATE_TOPIC,
        {"topic": "SCHEDULE_TOPIC_XXXX", "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"},
        True,
    ),
    (
        "a permission of 16",
        UPDATE_AND_CREATE_TOPIC,
        {"topic": "HostilePerm", "readQueueNums": "1", "writeQueueNums": "1", "perm": "16"},
        False,
    ),
    (
        "a negative queue id",
        UPDATE_CONSUMER_OFFSET,
        {
            "consumerGroup": "hostile_g",
            "topic": "HostileKeep",
            "queueId": "-1",
            "commitOffset": "0",
        },
        False,
    ),
    (
        "a negative offset",
        UPDATE_CONSUMER_OFFSET,
        {
            "consumerGroup": "hostile_g",
            "topic": "HostileKeep",
            "queueId": "0",
            "commitOffset": "-5",
        },
        False,
    ),
    (
        "a group that is a path",
        UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": "../../x", "topic": "HostileKeep", "queueId": "0", "commitOffset": "0"},
        False,
    ),
]


def test_hostile_requests_lose_nothing_on_either_broker(target, programs, java_home):
    target.create_topic(programs, java_home, "HostileKeep", queues=1)
    addrs = _broker_addrs(target.namesrv_addr)
    stored = {}
    for addr in addrs:
        answer = _send(addr, "HostileKeep", b"keep me")
        assert answer["code"] == 0, answer
        stored[addr] = _max_offset(addr, "HostileKeep")
    answers = {}
    for name, code, fields, apache_refuses in HOSTILE:
        for addr in addrs:
            header, _ = _request(addr, code, fields)
            answers[(name, addr)] = (header["code"], header.get("remark"))
            if target.name == "rmq-broker" or apache_refuses:
                assert header["code"] != 0, (name, header)
                assert header.get("remark"), (name, header)
    # an empty body: a message of nothing
    for addr in addrs:
        answer = _send(addr, "HostileKeep", b"")
        if target.name == "rmq-broker":
            assert answer["code"] == 13 and "empty" in answer["remark"], answer  # MESSAGE_ILLEGAL
        stored[addr] += answer["code"] == 0
    # both still serve, and kept exactly what they acknowledged
    for addr in addrs:
        assert _max_offset(addr, "HostileKeep") == stored[addr]
        assert _send(addr, "HostileKeep", b"after")["code"] == 0
        assert _max_offset(addr, "HostileKeep") == stored[addr] + 1
    print(
        f"{target.name}: " + "; ".join(f"{n}: {c}" for (n, _a), (c, _r) in sorted(answers.items()))
    )
