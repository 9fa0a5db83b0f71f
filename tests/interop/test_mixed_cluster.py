"""rmq-broker and Apache RocketMQ brokers behind one NameServer, either one's:

- a real Apache RocketMQ 5.5.0 broker registers with rmq-broker's NameServer (REGISTER_BROKER,
  QUERY_DATA_VERSION, UNREGISTER_BROKER at shutdown); a topic mqadmin creates on it is routed to
  it and the Java clients send and consume through rmq-broker's NameServer;
- rmq-broker registers with Apache's NameServer (``--namesrv``); a topic created on it is
  routed to it within seconds, and the Java clients use it through Apache's NameServer.
"""

from __future__ import annotations

import json
import time

import pytest
from _apache import (
    GET_BROKER_CLUSTER_INFO,
    GET_ROUTEINFO_BY_TOPIC,
    ApacheRocketMQ,
    remoting_request,
)
from _targets import cluster_info


def _route_brokers(namesrv: str, topic: str) -> set[str]:
    header, body = remoting_request(
        namesrv, GET_ROUTEINFO_BY_TOPIC, {"topic": topic, "acceptStandardJsonOnly": "true"}
    )
    if header.get("code") != 0:
        return set()
    return {q["brokerName"] for q in json.loads(body)["queueDatas"]}


def _wait(condition, what: str, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.3)


@pytest.mark.parametrize("compressed", [False, True])
def test_apache_broker_registers_with_rmq_broker_namesrv(rmq_java, names, tmp_path, compressed):
    """``compressed``: the broker's ``compressedRegister=true`` (a deflated body of its own layout)."""
    namesrv = rmq_java.target.namesrv_addr
    topic, group = f"{names}_T"[-60:], f"{names}_G"[-60:]
    with ApacheRocketMQ(
        tmp_path / "apache",
        brokers=("broker-x",),
        cluster="ApacheX",
        namesrv_addr=namesrv,
        broker_config={"compressedRegister": str(compressed).lower()},
    ) as apache:
        assert cluster_info(namesrv)["ApacheX"] == ["broker-x"]
        out = rmq_java.mqadmin("updateTopic", "-c", "ApacheX", "-t", topic, "-r", "2", "-w", "2")
        assert apache.broker_addr("broker-x") in out and "success" in out
        _wait(
            lambda: _route_brokers(namesrv, topic) == {"broker-x"}, f"route of {topic} to broker-x"
        )
        sent = rmq_java.run("seed004-producer", group=f"{group}_p", topic=topic, count=8).events(
            "sent"
        )
        assert {(e["brokerName"], e["status"]) for e in sent} == {("broker-x", "SEND_OK")}
        got = rmq_java.run(
            "seed001-push-consumer", group=group, topic=topic, expect=8, settle_ms=500
        ).events("received")
        assert sorted(e["msgId"] for e in got) == sorted(e["msgId"] for e in sent)
    # stopped: it unregistered (or its connection closed)
    assert "ApacheX" not in cluster_info(namesrv)


def test_rmq_broker_registers_with_apache_namesrv(apache_java, apache_cluster, names, tmp_path):
    from rmq_spark.broker.testing import BrokerProcess

    namesrv = apache_cluster.namesrv_addr
    topic, group = f"{names}_T", f"{names}_G"
    (tmp_path / "rmq").mkdir()
    rmq = BrokerProcess(str(tmp_path / "rmq" / "store"), "--namesrv", namesrv, "--no-namesrv",
                        "--broker-name", "rmq-b", "--cluster-name", "RmqCluster")  # fmt: skip
    try:
        assert rmq.namesrv_endpoint is None
        _wait(
            lambda: cluster_info(namesrv).get("RmqCluster") == ["rmq-b"],
            "rmq-b registered with Apache's NameServer",
        )
        out = apache_java.mqadmin(
            "updateTopic", "-b", rmq.remoting_endpoint, "-t", topic, "-r", "2", "-w", "2"
        )
        assert "success" in out
        # registered again within a second of the change, as a RocketMQ broker does
        _wait(
            lambda: _route_brokers(namesrv, topic) == {"rmq-b"},
            f"route of {topic} to rmq-b",
            timeout_s=10,
        )
        sent = apache_java.run("seed004-producer", group=f"{group}_p", topic=topic, count=8).events(
            "sent"
        )
        assert {(e["brokerName"], e["status"]) for e in sent} == {("rmq-b", "SEND_OK")}
        got = apache_java.run("seed001-push-consumer", group=group, topic=topic, expect=8,
                              settle_ms=500).events("received")  # fmt: skip
        assert sorted(e["msgId"] for e in got) == sorted(e["msgId"] for e in sent)
    finally:
        rmq.stop()
    header, body = remoting_request(namesrv, GET_BROKER_CLUSTER_INFO)
    assert header.get("code") == 0 and b"rmq-b" not in body  # UNREGISTER_BROKER at shutdown
