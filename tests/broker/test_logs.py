"""The broker's event log lines (issue 21): consumer clients joining and leaving their groups, a
message moved to a DLQ, a topic created, offsets reset, and what recovery found (with the file
and the position of a cut CommitLog tail), each one line, no traceback."""

from __future__ import annotations

import logging
import os

from rocketmq import FilterExpression, Message, Producer, SimpleConsumer

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.broker.testing import client_configuration
from rmq_spark.remoting.client import request
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.services.config import BrokerConfig
from rmq_spark.store.store import StoreConfig


def _options() -> BrokerOptions:
    return BrokerOptions(
        listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen="127.0.0.1:0"
    )


def _lines(caplog, level=logging.INFO) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= level and r.name.startswith("rmq_spark")
    ]


def test_group_topic_dlq_and_reset_events(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rmq_spark")
    with Broker(str(tmp_path / "store"), options=_options()) as b:
        p = Producer(client_configuration(b.endpoints), ("Logged",))
        p.startup()
        m = Message()
        m.topic, m.body = "Logged", b"hello"
        p.send(m)
        p.shutdown()
        c = SimpleConsumer(
            client_configuration(b.endpoints),
            "loggers",
            {"Logged": FilterExpression()},
            await_duration=1,
        )
        c.startup()
        got = []
        for _ in range(20):
            got += c.receive(1, 10)
            if got:
                break
        c.shutdown()
        assert got
        (cq,) = [
            cq
            for q in range(4)
            if (cq := b.store.consume_queue("Logged", q)) is not None and cq.max_offset
        ]
        answer = request(
            b.remoting_endpoint,
            RequestCode.CONSUMER_SEND_MSG_BACK,
            {"offset": str(cq.unit(0)[0]), "group": "loggers", "delayLevel": "-1"},
        )
        assert answer.code == ResponseCode.SUCCESS
        answer = request(
            b.remoting_endpoint,
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            {"topic": "Logged", "group": "loggers", "timestamp": "0", "isForce": "true"},
        )
        assert answer.code == ResponseCode.SUCCESS
    lines = _lines(caplog)
    assert "topic Logged created: 4 read / 4 write queues, perm 6" in lines
    joined = [
        x
        for x in lines
        if x.startswith("consumer group loggers: client ") and x.endswith(" joined")
    ]
    left = [
        x for x in lines if x.startswith("consumer group loggers: client ") and x.endswith(" left")
    ]
    assert len(joined) == 1 and len(left) == 1
    assert any(x.startswith("DLQ: a message of topic Logged moved to %DLQ%loggers") for x in lines)
    assert any(
        x.startswith("offsets of consumer group loggers on topic Logged reset to time 0")
        for x in lines
    )
    assert not [r for r in caplog.records if r.exc_info]


def test_recovery_names_the_file_and_position_it_cut(tmp_path, caplog):
    store = str(tmp_path / "store")
    config = BrokerConfig(store=StoreConfig(truncate_corrupt=True))
    with Broker(store, listen="127.0.0.1:0", config=config) as b:
        p = Producer(client_configuration(b.endpoints), ("Recovered",))
        p.startup()
        for i in range(3):
            m = Message()
            m.topic, m.body = "Recovered", f"m{i}".encode()
            p.send(m)
        p.shutdown()
        end = b.store.commitlog.max_offset
        segment = b.store.commitlog.mfq.files[0].path
    with open(segment, "r+b") as f:  # a torn record after the last one: a size and garbage
        f.seek(end)
        f.write((200).to_bytes(4, "big") + os.urandom(60))
    caplog.set_level(logging.INFO, logger="rmq_spark")
    with Broker(
        store, listen="127.0.0.1:0", config=BrokerConfig(store=StoreConfig(truncate_corrupt=True))
    ) as b:
        assert b.store.commitlog.max_offset == end
    lines = _lines(caplog)
    cut = [x for x in lines if x.startswith("recovery: ") and "CommitLog cut at position" in x]
    assert cut == [
        f"recovery: {segment}: CommitLog cut at position {end} (offset {end}): "
        + cut[0].split("): ", 1)[1]
    ]
    assert any(x.startswith("recovery: CommitLog checked from offset") for x in lines)
    assert not [r for r in caplog.records if r.exc_info]
