"""Format rmq against a broker group with a master and a slave (issue 31, item 5), on a real Apache
RocketMQ 5.5.0: a NameServer, ``broker-a`` (an ASYNC_MASTER with a SLAVE, brokerId 1) and
``broker-b`` (a master alone).

While broker-a's master is down (killed), its queues are read from its slave (as the Java consumer pulls
from a slave when the master is gone: the NameServer's route then lists the slave only), a stream
goes on over both broker groups, and writes go to broker-b, the only group with a master (as
``DefaultMQProducer`` does).  Once the master is back, the stream reads its new messages from it.
Every message exactly once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from _apache import ApacheRocketMQ
from test_cluster_read import make_topic, reader, send

from rmq_spark.cluster import ClusterClient, ClusterError
from rmq_spark.remoting.codes import RequestCode

pytestmark = [pytest.mark.spark, pytest.mark.interop]

QUEUES = 2


def _wait(condition, what: str, timeout_s: float = 180.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.3)


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory):
    cluster = ApacheRocketMQ(
        tmp_path_factory.mktemp("apache-replicas"),
        brokers=("broker-a", "broker-b"),
        slaves=("broker-a",),
        heap="200m",
        # a slave serves pulls only with slaveReadEnable (Apache's default false: SYSTEM_BUSY)
        broker_config={"slaveReadEnable": "true"},
    ).start()
    try:
        yield cluster
    finally:
        cluster.close()


def _max_offsets(c: ClusterClient, addr: str, topic: str) -> list[int] | None:
    """GET_MAX_OFFSET of every queue of ``topic`` on the broker at ``addr`` (None: refused)."""
    out = []
    for q in range(QUEUES):
        a = c.invoke(
            addr,  # an address: asked as given
            RequestCode.GET_MAX_OFFSET,
            {"topic": topic, "queueId": str(q), "bname": "broker-a"},
            ok=range(-1, 300),
        )
        if a.code != 0:
            return None
        out.append(int(a.ext_fields.get("offset", 0)))
    return out


def _slave_caught_up(cluster: ApacheRocketMQ, topic: str) -> bool:
    """The slave holds what its master does, and serves pulls of the topic (it has synchronised
    the topic's config, which Apache's slave does every 10 s)."""
    slave = cluster.broker_addr("broker-a-slave")
    with ClusterClient(cluster.namesrv_addr, timeout_s=5) as c:
        master_hi = _max_offsets(c, cluster.broker_addr("broker-a"), topic)
        if master_hi is None or _max_offsets(c, slave, topic) != master_hi:
            return False
        try:
            r = c.pull(slave, topic, 0, 0, 1, "ReplicaProbe")
        except ClusterError:  # TOPIC_NOT_EXIST until the slave synchronised the topic
            return False
        return r.code == 0 and bool(r.body)


class _Target:
    def __init__(self, cluster: ApacheRocketMQ) -> None:
        self.cluster = cluster
        self.namesrv_addr = cluster.namesrv_addr

    def wait_route(self, topic: str) -> None:
        self.cluster.wait_route(topic, ("broker-a", "broker-b"))


def _route_addrs(cluster: ApacheRocketMQ, topic: str) -> dict[int, str]:
    with ClusterClient(cluster.namesrv_addr) as c:
        return dict(c.route(topic, refresh=True).brokers["broker-a"].addrs)


def test_reads_go_on_from_the_slave_while_the_master_is_down(spark, replicated, tmp_path: Path):
    cluster = replicated
    target = _Target(cluster)
    topic = "ReplicaT"
    make_topic(target, topic, queues=QUEUES)
    sent = send(target, topic, [f"one-{i}" for i in range(120)], queues=QUEUES)
    assert sorted(sent) == ["broker-a", "broker-b"]
    _wait(lambda: _slave_caught_up(cluster, topic), "broker-a's slave caught up with its master")

    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def collect(batch_df, _id: int) -> None:  # type: ignore[no-untyped-def]
        rows = [
            (r.brokerName, r.body.decode()) for r in batch_df.select("brokerName", "body").collect()
        ]
        with lock:
            seen.extend(rows)

    def count(prefix: str) -> int:
        with lock:
            return sum(1 for _, b in seen if b.startswith(prefix))

    cluster.stop_broker("broker-a", kill=True)  # the master crashes; its slave stays
    _wait(lambda: set(_route_addrs(cluster, topic)) == {1}, "the route lists broker-a's slave only")

    # a batch read of everything: broker-a's queues from its slave
    rows = reader(spark, target, topic).select("brokerName", "body").collect()
    got = sorted((r.brokerName, r.body.decode()) for r in rows)
    assert got == sorted((b, x) for b, xs in sent.items() for x in xs)

    q = (
        reader(
            spark,
            target,
            topic,
            stream=True,
            startingOffsets="earliest",
            brokerUnavailableTimeout="10m",
        )
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        _wait(lambda: count("one-") >= 120 or q.exception() is not None, "the first 120 (slave)")
        # writes while broker-a has no master: every row to broker-b, as DefaultMQProducer
        spark.createDataFrame(
            [(f"two-{i}".encode(),) for i in range(60)], "body binary"
        ).write.format("rmq").option("namesrvAddr", cluster.namesrv_addr).option(
            "topic", topic
        ).mode("append").save()
        _wait(
            lambda: count("two-") >= 60 or q.exception() is not None, "the rows written meanwhile"
        )

        cluster.start_broker("broker-a")
        _wait(lambda: 0 in _route_addrs(cluster, topic), "broker-a's master back in the route")
        send(target, topic, [f"three-{i}" for i in range(40)], brokers=["broker-a"], queues=QUEUES)
        _wait(
            lambda: count("three-") >= 40 or q.exception() is not None, "the master's new messages"
        )
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    bodies = sorted(b for _, b in seen)
    assert bodies == sorted(
        [f"one-{i}" for i in range(120)]
        + [f"two-{i}" for i in range(60)]
        + [f"three-{i}" for i in range(40)]
    )
    assert {b for b, x in seen if x.startswith("one-")} == {"broker-a", "broker-b"}
    assert {b for b, x in seen if x.startswith("two-")} == {"broker-b"}
    assert {b for b, x in seen if x.startswith("three-")} == {"broker-a"}
