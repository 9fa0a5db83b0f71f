"""rmq-admin against a real Apache RocketMQ cluster (a NameServer and two brokers from Maven
Central's jars, the session's ``_apache`` target), through its NameServer as mqadmin goes: topics
made and deleted on both brokers, messages of the Java client looked up, a group's lag and resets,
a DLQ message sent again, the brokers' status."""

from __future__ import annotations

import json
import time

import pytest

from rmq_spark.admin.__main__ import main
from rmq_spark.remoting.client import request
from rmq_spark.remoting.codes import RequestCode, ResponseCode


@pytest.fixture
def apache(_apache):
    return _apache


def admin(capsys, namesrv: str, *argv: str):
    capsys.readouterr()
    code = main(["-n", namesrv, "--json", *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def _until(check, what: str, timeout_s: float = 30.0):
    """Poll ``check`` until it returns something true (a broker's NameServer registration and
    its consumers' offset commits take their seconds); fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            assert got, f"{what} did not happen in {timeout_s}s"
            return got
        time.sleep(0.5)


def test_admin_commands_against_apache_rocketmq(capsys, apache, apache_java, names):
    ns = apache.namesrv_addr
    topic, group = f"{names}_T"[:60], f"{names}_G"[:60]
    made = admin(capsys, ns, "topics", "create", topic, "-q", "2")
    assert sorted(m["broker"] for m in made) == sorted(apache.broker_names)
    apache.wait_route(topic)
    (listed,) = [t for t in admin(capsys, ns, "topics", "list") if t["topic"] == topic]
    assert (listed["write_queues"], sorted(listed["brokers"])) == (
        2 * len(apache.broker_names),
        sorted(apache.broker_names),
    )

    sent = apache_java.run(
        "producer", group=f"{group}_p", topic=topic, count=4, key_prefix="adm"
    ).events("sent")
    assert [e["status"] for e in sent] == ["SEND_OK"] * 4
    queues = admin(capsys, ns, "topics", "queues", topic)
    assert sum(q["max_offset"] - q["min_offset"] for q in queues) == 4
    assert {q["broker"] for q in queues} == set(apache.broker_names)

    (by_key,) = admin(capsys, ns, "messages", "key", topic, "adm-1")
    assert (by_key["body"], by_key["msg_id"]) == ("msg 1", sent[1]["msgId"])
    by_offset = admin(capsys, ns, "messages", "id", sent[2]["offsetMsgId"])
    by_uniq = admin(capsys, ns, "messages", "id", sent[2]["msgId"], "-t", topic)
    assert by_offset["body"] == by_uniq["body"] == "msg 2"

    # kept up until its offsets are committed: at shutdown the client commits with a one-way
    # request that may not reach the broker
    with apache_java.held("seed001-push-consumer", group=group, topic=topic, expect=4) as consumer:
        lag = _until(lambda: (lambda r: r if r["total_lag"] == 0 and len(r["queues"]) == 4 else None)(
            admin(capsys, ns, "groups", "lag", group, "-t", topic)), "the consumer's offset commit")  # fmt: skip
    got = consumer.result.events("received")
    assert sorted(e["body"] for e in got) == [f"msg {i}" for i in range(4)]
    assert {r["broker"] for r in lag["queues"]} == set(apache.broker_names)
    assert group in {g["group"] for g in admin(capsys, ns, "groups", "list")}

    reset = admin(capsys, ns, "groups", "reset", group, topic, "--to", "earliest")
    assert len(reset) == 4 and {r["offset"] for r in reset} == {0}
    assert admin(capsys, ns, "groups", "lag", group, "-t", topic)["total_lag"] == 4

    # the group gives up on "msg 1": CONSUMER_SEND_MSG_BACK with delay level -1 -> %DLQ%group
    addr = next(b["addr"] for b in admin(capsys, ns, "cluster") if b["broker"] == by_key["broker"])
    answer = request(addr, RequestCode.CONSUMER_SEND_MSG_BACK,
                     {"offset": str(by_key["commitlog_offset"]), "group": group, "delayLevel": "-1",
                      "originMsgId": sent[1]["msgId"], "originTopic": topic, "maxReconsumeTimes": "16",
                      "unitMode": "false"}, version=415)  # fmt: skip
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    dead = _until(
        lambda: _find(capsys, ns, sent[1]["msgId"], f"%DLQ%{group}"), "the DLQ copy's indexing"
    )
    assert dead["body"] == "msg 1"
    done = admin(capsys, ns, "messages", "resend-dlq", group, sent[1]["msgId"])
    assert done["to"] == f"%RETRY%{group}"
    retried = _until(
        lambda: _find(capsys, ns, sent[1]["msgId"], f"%RETRY%{group}"), "the resent copy's indexing"
    )
    assert (retried["body"], retried["properties"]["RETRY_TOPIC"]) == ("msg 1", topic)

    status = admin(capsys, ns, "broker", "status")
    assert sorted(s["broker"] for s in status) == sorted(apache.broker_names)
    assert all(s["status"]["brokerVersionDesc"].startswith("V5_") for s in status)

    deleted = admin(capsys, ns, "topics", "delete", topic)
    assert sorted(d["broker"] for d in deleted) == sorted(apache.broker_names)
    assert topic not in {t["topic"] for t in admin(capsys, ns, "topics", "list")}
    capsys.readouterr()
    assert main(["-n", ns, "topics", "queues", topic]) == 1
    assert f"topic {topic!r} does not exist" in capsys.readouterr().err


def _find(capsys, ns: str, msg_id: str, topic: str):
    capsys.readouterr()
    if main(["-n", ns, "--json", "messages", "id", msg_id, "-t", topic]) != 0:
        return None
    return json.loads(capsys.readouterr().out)
