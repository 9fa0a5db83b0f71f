"""Issue 28 item 15: HEART_BEATs naming many new consumer groups neither stall other clients nor
grow the broker without bound.

- The request table's gate parses a HEART_BEAT's body (and authorizes on it) on the pool, with
  its handler: on the event loop it is only authenticated and its header decoded.
- Heartbeats create retry topics (Apache's auto-created subscription groups) up to the topic
  table's ``retry_topics_auto_max``: a new group past it is not registered, its retry topic not
  created, and the answer (SUBSCRIPTION_GROUP_NOT_EXIST) names it; the heartbeat's other groups
  and its producers are registered.
- The groups a heartbeat adds are logged in a few lines, not one a group, and their members are
  told (NOTIFY_CONSUMER_IDS_CHANGED) with one write per connection.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import replace
from typing import Any

import pytest

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.remoting import clients as clients_module
from rmq_spark.remoting.client import RemotingClient
from rmq_spark.remoting.clients import ClientManager
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.requests import heartbeat_body
from rmq_spark.services.config import BrokerConfig
from rmq_spark.store.store import StoreConfig


@pytest.fixture
def broker(tmp_path):
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen=None)
    cfg = BrokerConfig(store=StoreConfig())
    with Broker(str(tmp_path / "store"), config=cfg, options=opts) as b:
        yield b


def _heartbeat(client: str, groups: list[str], producers: tuple[str, ...] = ()) -> RemotingCommand:
    doc = {
        "clientID": client,
        "producerDataSet": [{"groupName": p} for p in producers],
        "consumerDataSet": [
            {"groupName": g, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
             "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
             "subscriptionDataSet": [{"topic": "T", "subString": "*", "subVersion": 0}]}
            for g in groups
        ],
    }  # fmt: skip
    return RemotingCommand(RequestCode.HEART_BEAT, {}, json.dumps(doc).encode(), version=409)


def test_a_heartbeat_s_body_is_parsed_on_the_pool_not_on_the_event_loop(broker):
    service = broker.remoting
    gate = service.broker_server.processor.before
    assert RequestCode.HEART_BEAT in gate.deferred
    parsed_on: list[int] = []

    def recording(body: bytes) -> Any:
        parsed_on.append(threading.get_ident())
        return heartbeat_body(body)

    spec = gate.table[RequestCode.HEART_BEAT]
    gate.table = {**gate.table, int(RequestCode.HEART_BEAT): replace(spec, body=recording)}
    with RemotingClient(broker.remoting_endpoint, 30) as c:
        answer = c.request(_heartbeat("c1", [f"g{i}" for i in range(50)]))
        assert answer.code == ResponseCode.SUCCESS
        assert service.clients.consumer_ids("g49") == ["c1"]
        # a body the table refuses is still refused, naming the problem
        body = b'{"clientID": "c1", "consumerDataSet": 5}'
        answer = c.request(RemotingCommand(RequestCode.HEART_BEAT, {}, body))
        assert answer.code == ResponseCode.SYSTEM_ERROR
        assert answer.remark == "HeartbeatData.consumerDataSet is not a list of objects"
    assert len(parsed_on) == 2
    assert service.loop_thread.thread_id not in parsed_on


def test_heartbeats_create_groups_up_to_the_bound_and_name_the_rest(broker, caplog):
    topics = broker.core.store.topics
    topics.retry_topics_auto_max = 5
    clients = broker.remoting.clients
    with RemotingClient(broker.remoting_endpoint, 30) as c:
        assert c.request(_heartbeat("c1", ["a", "b", "c"])).code == ResponseCode.SUCCESS
        with caplog.at_level(logging.WARNING, logger="rmq_spark.store"):
            answer = c.request(_heartbeat("c2", ["a", "d", "e", "f", "g"], producers=("pg",)))
            assert answer.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
            assert answer.remark == (
                "subscription group not exist: 2 new consumer group(s) not created (f, g): the "
                "broker holds 5 groups' retry topics, the most that heartbeats may create"
            )
            answer = c.request(_heartbeat("c3", ["h"]))
            assert answer.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
        assert sum("retry topics are not created" in r.getMessage() for r in caplog.records) == 1
        # the groups that fit, and the heartbeat's producers, are registered; the others are not
        assert clients.consumer_ids("a") == ["c1", "c2"] and clients.consumer_ids("e") == ["c2"]
        assert clients.consumer_ids("f") == [] and clients.consumer_ids("h") == []
        assert "c2" in clients.producers["pg"]
        retry = sorted(t for t in topics.topics if t.startswith("%RETRY%"))
        assert retry == ["%RETRY%a", "%RETRY%b", "%RETRY%c", "%RETRY%d", "%RETRY%e"]
        # known groups keep beating
        assert c.request(_heartbeat("c4", ["a", "e"])).code == ResponseCode.SUCCESS


class _Conn:
    peer = "127.0.0.1:1"
    closed = False

    def __init__(self) -> None:
        self.attrs: dict[str, Any] = {}
        self.batches: list[list[RemotingCommand]] = []

    def send_oneway_many(self, cmds: list[RemotingCommand]) -> bool:
        self.batches.append(cmds)
        return True


def test_a_heartbeat_of_many_groups_is_a_few_log_lines_and_one_notice_write(caplog):
    clients = ClientManager()
    conn = _Conn()
    doc = {"clientID": "c1", "consumerDataSet": [{"groupName": f"g{i}"} for i in range(1000)]}
    with caplog.at_level(logging.INFO, logger="rmq_spark.remoting.clients"):
        changed = clients.heartbeat(conn, doc)  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records]
    assert len(changed) == 1000 and len(lines) == clients_module.JOINED_LOGGED + 1
    assert lines[-1] == "995 more consumer groups (g5, g6, g7 ...): client c1 joined (127.0.0.1:1)"
    clients.notify_many(changed)
    assert len(conn.batches) == 1
    notices = conn.batches[0]
    assert [n.ext_fields["consumerGroup"] for n in notices] == [f"g{i}" for i in range(1000)]
    assert {n.code for n in notices} == {RequestCode.NOTIFY_CONSUMER_IDS_CHANGED}


def test_a_client_of_many_groups_leaving_is_a_few_log_lines_and_one_notice_write(caplog):
    """Its connection closing (or the client falling silent) logged one line a group, 1,000 on
    the event loop: the one ~100 ms stall of the other clients beside a HEART_BEAT burst."""
    now = [1_000_000]
    clients = ClientManager(now_ms=lambda: now[0])
    leaving, staying = _Conn(), _Conn()
    groups = [f"g{i}" for i in range(1000)]
    clients.heartbeat(
        leaving, {"clientID": "c1", "consumerDataSet": [{"groupName": g} for g in groups]}
    )  # type: ignore[arg-type]
    clients.heartbeat(
        staying, {"clientID": "c2", "consumerDataSet": [{"groupName": g} for g in groups]}
    )  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="rmq_spark.remoting.clients"):
        changed = clients.connection_closed(leaving)  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records]
    assert changed == groups and len(lines) == clients_module.JOINED_LOGGED + 1, lines[:8]
    assert (
        lines[-1]
        == "995 more consumer groups (g5, g6, g7 ...): their clients left (connection closed)"
    )
    assert clients.consumer_ids("g999") == ["c2"]
    clients.notify_many(changed)  # what the broker's close hook does: one write to who stays
    assert len(staying.batches) == 1 and len(staying.batches[0]) == 1000
    caplog.clear()
    now[0] += 10**9  # everyone silent for long
    with caplog.at_level(logging.INFO, logger="rmq_spark.remoting.clients"):
        assert clients.expire() == groups
    assert len(caplog.records) == clients_module.JOINED_LOGGED + 1


def test_the_broker_process_keeps_what_its_start_allocated_out_of_full_collections(
    tmp_path, monkeypatch, capsys
):
    """A full collection walked every object of the start (~90,000: ~130 ms holding the GIL, a
    stall of every client whenever heartbeats' allocations set one off); the process freezes them
    once started, before it says it is ready."""
    from rmq_spark.broker import __main__ as broker_main

    frozen: list[str] = []
    monkeypatch.setattr(broker_main.gc, "freeze", lambda: frozen.append(capsys.readouterr().out))
    flags = ["--store", str(tmp_path / "s"), "--listen", "127.0.0.1:0", "--idle-exit-s", "0.2"]
    assert broker_main.main(flags) == 0
    assert frozen == [""]  # once, before the ready line
    assert capsys.readouterr().out.startswith("rmq-broker listening on 127.0.0.1:")
