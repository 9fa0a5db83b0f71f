"""The README's "Operating" section, run: every rmq-admin command of its example block against an
rmq-broker (its addresses put in for the README's), and every metric its queries name found in
the broker's /metrics after traffic."""

from __future__ import annotations

import re
import shlex
import urllib.request
from pathlib import Path

import pytest
from rocketmq import FilterExpression, Message, Producer, SimpleConsumer

from rmq_spark.admin.__main__ import main
from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.broker.testing import client_configuration
from rmq_spark.remoting.client import request
from rmq_spark.remoting.codes import RequestCode, ResponseCode

README = Path(__file__).resolve().parents[2] / "README.md"


def _operating() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("### Operating")
    return text[start : text.index("\n### ", start + 1)]


def _block(lang: str) -> list[str]:
    m = re.search(rf"```{lang}\n(.*?)```", _operating(), re.DOTALL)
    assert m is not None, f"no ```{lang} block in the README's Operating section"
    return [line for line in m.group(1).splitlines() if line.strip() and not line.startswith("#")]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    opts = BrokerOptions(
        listen="127.0.0.1:0",
        remoting_listen="127.0.0.1:0",
        namesrv_listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
    )
    b = Broker(str(tmp_path_factory.mktemp("readme") / "store"), options=opts)
    yield b
    b.stop()


def _seed(broker) -> str:
    """Orders with a message keyed order-42, group billing consuming it, and one message the
    group gave up on in %DLQ%billing: its id."""
    p = Producer(client_configuration(broker.endpoints), ("Orders",))
    p.startup()
    try:
        ids = []
        for key in ("order-41", "order-42"):
            m = Message()
            m.topic, m.body, m.keys = "Orders", key.encode(), key
            ids.append(p.send(m).message_id)
    finally:
        p.shutdown()
    c = SimpleConsumer(
        client_configuration(broker.endpoints),
        "billing",
        {"Orders": FilterExpression()},
        await_duration=1,
    )
    c.startup()
    try:
        got: list = []
        for _ in range(20):
            if len(got) >= 2:
                break
            got += c.receive(32, 30)
        for m in got:
            c.ack(m)
    finally:
        c.shutdown()
    broker.service.pop.persist()
    cq = broker.store.consume_queue
    phys = next(cq("Orders", q).unit(cq("Orders", q).min_offset)[0] for q in range(4)
                if cq("Orders", q) is not None and cq("Orders", q).max_offset)  # fmt: skip
    answer = request(
        broker.remoting_endpoint,
        RequestCode.CONSUMER_SEND_MSG_BACK,
        {"offset": str(phys), "group": "billing", "delayLevel": "-1", "maxReconsumeTimes": "16"},
    )
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    dead = broker.store.look_message_by_offset(phys)
    return dead.properties["UNIQ_KEY"]


def test_the_readme_admin_commands_run(broker, capsys):
    msg_id = _seed(broker)
    commands = _block("sh")
    assert len(commands) >= 10 and all(c.startswith("rmq-admin ") for c in commands)
    ran = []
    for line in commands:
        line = line.replace("127.0.0.1:9876", broker.namesrv_endpoint)
        line = line.replace("127.0.0.1:10911", broker.remoting_endpoint).replace("MSG_ID", msg_id)
        capsys.readouterr()
        code = main(shlex.split(line)[1:])
        out = capsys.readouterr()
        assert code == 0, (line, out.err)
        assert out.out.strip(), line
        ran.append(line)
    assert len(ran) == len(commands)
    assert broker.store.topics.get("Orders") is None  # the last command deleted it


def test_the_readme_queries_name_metrics_the_broker_serves(broker):
    queries = _block("promql")
    named = {n for q in queries for n in re.findall(r"\b(rocketmq_\w+)", q)}
    assert named
    text = (
        urllib.request.urlopen(f"http://{broker.metrics.endpoint}/metrics", timeout=10)
        .read()
        .decode()
    )
    served = set(re.findall(r"^# TYPE (rocketmq_\w+) ", text, re.MULTILINE))
    assert {re.sub(r"_bucket$", "", n) for n in named} <= served
    for name in re.findall(r"`(rocketmq_\w+|rmq_spark_\w+)`", _operating()):
        assert f"# TYPE {name} " in text, name
