"""rmq-admin against rmq-broker: through its NameServer (``-n``) and its remoting port (``-b``), with
real clients (the official Python client over gRPC, remoting requests) producing and consuming,
and the effects of each command checked on the broker."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from rocketmq import FilterExpression, Message, Producer, SimpleConsumer

from rmq_spark.admin.__main__ import build_parser, main
from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.broker.testing import client_configuration
from rmq_spark.remoting.client import request
from rmq_spark.remoting.codes import RequestCode, ResponseCode


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    opts = BrokerOptions(
        listen="127.0.0.1:0",
        remoting_listen="127.0.0.1:0",
        namesrv_listen="127.0.0.1:0",
        min_invisible_ms=1000,
    )
    b = Broker(str(tmp_path_factory.mktemp("admin") / "store"), options=opts)
    yield b
    b.stop()


def admin(capsys, broker, *argv: str, via: str = "namesrv") -> tuple[int, str, str]:
    target = (
        ["-n", broker.namesrv_endpoint] if via == "namesrv" else ["-b", broker.remoting_endpoint]
    )
    capsys.readouterr()
    code = main([*target, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def admin_json(capsys, broker, *argv: str, via: str = "namesrv"):
    code, out, err = admin(capsys, broker, "--json", *argv, via=via)
    assert code == 0, err
    return json.loads(out)


def produce(broker, topic: str, keys: list[str]) -> list[str]:
    p = Producer(client_configuration(broker.endpoints), (topic,))
    p.startup()
    try:
        ids = []
        for k in keys:
            m = Message()
            m.topic, m.body, m.keys = topic, f"body of {k}".encode(), k
            ids.append(p.send(m).message_id)
        return ids
    finally:
        p.shutdown()


def consume(broker, group: str, topic: str, n: int, ack: bool = True) -> list:
    c = SimpleConsumer(
        client_configuration(broker.endpoints), group, {topic: FilterExpression()}, await_duration=1
    )
    c.startup()
    try:
        got: list = []
        for _ in range(20):
            if len(got) >= n:
                break
            got += c.receive(32, 1)
        if ack:
            for m in got:
                c.ack(m)
        return got
    finally:
        c.shutdown()
        broker.service.pop.persist()  # what the pop service does every second: the acks' offsets


def _subcommands(parser, prefix=()):
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _subcommands(sub, (*prefix, name))


def test_help_on_every_command(capsys):
    commands = list(_subcommands(build_parser()))
    assert ("topics", "create") in commands and ("messages", "resend-dlq") in commands
    for cmd in [(), *commands]:
        with pytest.raises(SystemExit) as e:
            main([*cmd, "--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: rmq-admin {' '.join(cmd)}".rstrip()), (cmd, out[:200])


def test_topic_lifecycle_through_the_namesrv_and_the_broker(capsys, broker):
    made = admin_json(
        capsys, broker, "topics", "create", "Lifecycle", "-r", "2", "-w", "3", "--perm", "r"
    )
    assert [(m["read_queues"], m["write_queues"], m["perm"]) for m in made] == [(2, 3, 4)]
    cfg = broker.store.topics.get("Lifecycle")
    assert (cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm) == (2, 3, 4)
    listed = {t["topic"]: t for t in admin_json(capsys, broker, "topics", "list", via="broker")}
    assert (listed["Lifecycle"]["read_queues"], listed["Lifecycle"]["perm"]) == (2, 4)
    assert not any(name.startswith(("%", "rmq_sys_", "SCHEDULE_TOPIC")) for name in listed)

    admin_json(capsys, broker, "topics", "update", "Lifecycle", "-q", "4", "--perm", "rw")
    cfg = broker.store.topics.get("Lifecycle")
    assert (cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm) == (4, 4, 6)
    code, out, _ = admin(capsys, broker, "topics", "list")
    assert code == 0 and out.splitlines()[0].split() == [
        "TOPIC",
        "READ_QUEUES",
        "WRITE_QUEUES",
        "PERM",
        "BROKERS",
    ]

    admin_json(capsys, broker, "topics", "delete", "Lifecycle")
    assert broker.store.topics.get("Lifecycle") is None
    assert "Lifecycle" not in {t["topic"] for t in admin_json(capsys, broker, "topics", "list")}


def test_a_deleted_topic_created_again_starts_empty(capsys, broker):
    """As on Apache RocketMQ: the delete takes the topic's queues and its groups' offsets along, so
    the topic made again under the name holds only what is sent to it afterwards."""
    admin_json(capsys, broker, "topics", "create", "Reborn", "-q", "2")
    produce(broker, "Reborn", ["old-1", "old-2", "old-3"])
    assert len(consume(broker, "RebornGroup", "Reborn", 3)) == 3
    lag = admin_json(capsys, broker, "groups", "lag", "RebornGroup", "-t", "Reborn")
    assert sum(q["consumer_offset"] for q in lag["queues"]) == 3

    admin_json(capsys, broker, "topics", "delete", "Reborn")
    admin_json(capsys, broker, "topics", "create", "Reborn", "-q", "2")
    assert [(q["min_offset"], q["max_offset"]) for q in admin_json(capsys, broker, "topics", "queues", "Reborn")] == [
        (0, 0), (0, 0)]  # fmt: skip
    code, _, err = admin(capsys, broker, "messages", "key", "Reborn", "old-1")
    assert code == 1 and "no message of topic 'Reborn' has key 'old-1'" in err
    produce(broker, "Reborn", ["new-1", "new-2"])
    assert [
        m["keys"] for m in admin_json(capsys, broker, "messages", "key", "Reborn", "new-2")
    ] == ["new-2"]
    lag = admin_json(capsys, broker, "groups", "lag", "RebornGroup", "-t", "Reborn")
    # the offsets went too
    assert (sum(q["consumer_offset"] for q in lag["queues"]), lag["total_lag"]) == (0, 2)
    got = consume(broker, "RebornGroup", "Reborn", 2)
    assert sorted(m.body for m in got) == [b"body of new-1", b"body of new-2"]


def test_queues_and_message_lookups(capsys, broker):
    keys = ["order-1", "order-2", "order-3"]
    ids = produce(broker, "Lookups", keys)
    queues = admin_json(capsys, broker, "topics", "queues", "Lookups")
    assert sum(q["max_offset"] - q["min_offset"] for q in queues) == len(keys)
    store = broker.store
    for q in queues:
        assert q["max_offset"] == store.max_offset("Lookups", q["queue"])
        assert (q["last_store_time"] > 0) == (q["max_offset"] > 0)

    found = admin_json(capsys, broker, "messages", "key", "Lookups", "order-2")
    assert [(m["keys"], m["body"], m["msg_id"]) for m in found] == [
        ("order-2", "body of order-2", ids[1])
    ]
    by_uniq = admin_json(capsys, broker, "messages", "id", ids[2], "-t", "Lookups")
    assert (by_uniq["msg_id"], by_uniq["keys"]) == (ids[2], "order-3")
    by_offset = admin_json(capsys, broker, "messages", "id", by_uniq["offset_msg_id"])
    assert (
        by_offset["commitlog_offset"] == by_uniq["commitlog_offset"]
        and by_offset["msg_id"] == ids[2]
    )


def test_group_lag_and_reset(capsys, broker):
    keys = ["r1", "r2", "r3"]
    produce(broker, "Resets", keys)
    assert len(consume(broker, "resetters", "Resets", len(keys))) == len(keys)
    lag = admin_json(capsys, broker, "groups", "lag", "resetters")
    assert lag["total_lag"] == 0 and {r["topic"] for r in lag["queues"]} == {"Resets"}
    assert "resetters" in {g["group"] for g in admin_json(capsys, broker, "groups", "list")}

    admin_json(capsys, broker, "groups", "reset", "resetters", "Resets", "--to", "earliest")
    assert admin_json(capsys, broker, "groups", "lag", "resetters", "-t", "Resets")[
        "total_lag"
    ] == len(keys)
    # the consumer really reads them again
    again = consume(broker, "resetters", "Resets", len(keys))
    assert sorted(k for m in again for k in m.keys) == keys

    (second,) = admin_json(capsys, broker, "messages", "key", "Resets", "r2")
    at = second["store_time"]
    every = [
        m["store_time"]
        for k in keys
        for m in admin_json(capsys, broker, "messages", "key", "Resets", k)
    ]
    rows = admin_json(capsys, broker, "groups", "reset", "resetters", "Resets", "--to", str(at))
    assert {r["how"] for r in rows} == {"INVOKE_BROKER_TO_RESET_OFFSET"}
    assert admin_json(capsys, broker, "groups", "lag", "resetters")["total_lag"] == sum(
        t >= at for t in every
    )

    admin_json(capsys, broker, "groups", "reset", "resetters", "Resets", "--to", "latest")
    assert admin_json(capsys, broker, "groups", "lag", "resetters")["total_lag"] == 0
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(0))
    admin_json(capsys, broker, "groups", "reset", "resetters", "Resets", "--to", iso)
    assert admin_json(capsys, broker, "groups", "lag", "resetters")["total_lag"] == len(keys)


def test_resend_a_dlq_message(capsys, broker):
    (msg_id,) = produce(broker, "Doomed", ["doomed-1"])
    got = consume(broker, "doomers", "Doomed", 1, ack=False)
    assert [m.message_id for m in got] == [msg_id]
    # the consumer gives up on it: CONSUMER_SEND_MSG_BACK with delay level -1 sends it to the DLQ
    offset = admin_json(capsys, broker, "messages", "id", msg_id, "-t", "Doomed")[
        "commitlog_offset"
    ]
    answer = request(
        broker.remoting_endpoint,
        RequestCode.CONSUMER_SEND_MSG_BACK,
        {"offset": str(offset), "group": "doomers", "delayLevel": "-1", "maxReconsumeTimes": "16"},
    )
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    in_dlq = admin_json(capsys, broker, "messages", "id", msg_id, "-t", "%DLQ%doomers")
    assert in_dlq["topic"] == "%DLQ%doomers" and in_dlq["body"] == "body of doomed-1"

    done = admin_json(capsys, broker, "messages", "resend-dlq", "doomers", msg_id)
    assert (done["from"], done["to"]) == ("%DLQ%doomers", "%RETRY%doomers")
    again = []
    for _ in range(3):  # the first delivery's invisibility (1 s) may still hold the original
        again = [m for m in consume(broker, "doomers", "Doomed", 1) if "doomed-1" in m.keys]
        if again:
            break
    assert again and again[0].topic == "Doomed" and again[0].body == b"body of doomed-1"

    code, _out, err = admin(capsys, broker, "messages", "resend-dlq", "nobody", msg_id)
    assert code == 1 and "no message has id" in err and "%DLQ%nobody" in err


def test_broker_status_and_cluster(capsys, broker):
    (status,) = admin_json(capsys, broker, "broker", "status")
    assert status["status"]["brokerName"] == "rmq-spark-broker"
    assert int(status["status"]["commitLogMaxOffset"]) == broker.store.commitlog.max_offset
    (via_broker,) = admin_json(capsys, broker, "broker", "status", via="broker")
    assert via_broker["addr"] == broker.remoting_endpoint
    assert admin_json(capsys, broker, "cluster") == [
        {
            "cluster": "DefaultCluster",
            "broker": "rmq-spark-broker",
            "addr": broker.remoting_endpoint,
        }
    ]


@pytest.mark.parametrize(
    "argv, code, message",
    [
        (["topics", "queues", "NoSuchTopic"], 1, "NoSuchTopic"),
        (
            ["messages", "key", "Lookups", "no-such-key"],
            1,
            "no message of topic 'Lookups' has key 'no-such-key'",
        ),
        (["messages", "id", "not-an-id"], 1, "no message has id 'not-an-id'"),
        (
            ["groups", "lag", "no-such-group"],
            1,
            "consumer group 'no-such-group' has no consume progress",
        ),
        (
            ["broker", "status", "elsewhere"],
            1,
            "no master broker is named or addressed 'elsewhere'",
        ),
        (
            ["groups", "reset", "g", "Lookups", "--to", "yesterday"],
            2,
            "'yesterday' is not earliest, latest",
        ),
        (["topics", "create", "T", "--perm", "x"], 2, "'x' is not a permission"),
        (["topics", "create", "T", "-q", "0"], 2, "'0' is not a queue count"),
        (["topics", "create", "bad name"], 1, "topic name 'bad name' is not valid"),
        (["topics", "frobnicate"], 2, "invalid choice: 'frobnicate'"),
    ],
)
def test_errors_exit_codes_and_messages(capsys, broker, argv, code, message):
    try:
        got, _out, err = admin(capsys, broker, *argv)
    except SystemExit as e:
        got, err = e.code, capsys.readouterr().err
    assert got == code
    assert message in err and "Traceback" not in err


def test_the_module_runs_as_a_program_with_exit_codes(broker, tmp_path):
    run = [sys.executable, "-m", "rmq_spark.admin"]
    ok = subprocess.run([*run, "-n", broker.namesrv_endpoint, "--json", "cluster"], check=False, capture_output=True,
                        text=True, timeout=60)  # fmt: skip
    assert ok.returncode == 0 and json.loads(ok.stdout)[0]["broker"] == "rmq-spark-broker"
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    down = subprocess.run(
        [*run, "-n", dead, "topics", "list"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        down.returncode == 1
        and f"cannot reach {dead}" in down.stderr
        and "Traceback" not in down.stderr
    )
    nowhere = subprocess.run([*run, "topics", "list"], check=False, capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})  # fmt: skip
    assert nowhere.returncode == 1 and "give a NameServer" in nowhere.stderr
