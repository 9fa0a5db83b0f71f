"""Format rmq with ``namesrvAddr`` against rmq-broker's NameServer and remoting port (a real
peer, in-process): stream and batch reads, offsets naming the broker, replays, filters, consumer
group commits, options."""

from __future__ import annotations

import json

import pytest

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.cluster import ClusterClient

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    opts = BrokerOptions(
        listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen="127.0.0.1:0"
    )
    with Broker(str(tmp_path_factory.mktemp("store")), options=opts) as b:
        yield b


def send(addr: str, topic: str, bodies: list[str], queues: int = 4, **props: list[str]) -> str:
    """Sends ``bodies`` round robin over the topic's queues; returns the broker's name."""
    with ClusterClient(addr) as c:
        (name,) = c.route(topic).brokers
        for i, b in enumerate(bodies):
            p = {k: v[i] for k, v in props.items()}
            c.send_message(name, "pg", topic, i % queues, b.encode(), p)
    return name


def run_batches(df, checkpoint: str, select: str = "body") -> dict[int, list]:
    got: dict[int, list] = {}

    def collect(batch_df, batch_id: int) -> None:
        got[batch_id] = sorted(tuple(r) for r in batch_df.selectExpr(*select.split(",")).collect())

    q = (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    return got


def test_batch_and_stream_read_with_broker_named_offsets(spark, broker, tmp_path):
    ns = broker.namesrv_endpoint
    name = send(ns, "CT1", [f"m{i}" for i in range(40)])
    df = spark.read.format("rmq").option("namesrvAddr", ns).option("topics", "CT1").load()
    rows = df.select("body", "brokerName", "queueId", "queueOffset").collect()
    assert sorted(r.body for r in rows) == sorted(f"m{i}".encode() for i in range(40))
    assert {r.brokerName for r in rows} == {name}
    again = (
        spark.read.format("rmq").option("namesrvAddr", ns).option("topics", "CT1").load().collect()
    )
    assert sorted(tuple(r) for r in again) == sorted(tuple(r) for r in df.collect())
    start = json.dumps({"CT1": {name: {"0": 5}}})
    end = json.dumps({"CT1": {name: {"0": 8, "1": 1}}})
    part = (
        spark.read.format("rmq")
        .option("namesrvAddr", ns)
        .option("topics", "CT1")
        .option("startingOffsets", start)
        .option("endingOffsets", end)
        .load()
        .select("queueId", "queueOffset")
        .collect()
    )
    assert sorted(tuple(r) for r in part) == [(0, 5), (0, 6), (0, 7), (1, 0)] + [
        (q, o) for q in (2, 3) for o in range(10)
    ]
    ck = str(tmp_path / "ck")
    s = (
        spark.readStream.format("rmq")
        .option("namesrvAddr", ns)
        .option("topics", "CT1")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "15")
        .load()
    )
    first = run_batches(s, ck, "brokerName,queueId,queueOffset,body")
    assert sorted(r[3] for b in first.values() for r in b) == sorted(
        f"m{i}".encode() for i in range(40)
    )
    assert len(first) >= 3
    send(ns, "CT1", [f"n{i}" for i in range(6)])
    second = run_batches(s, ck, "body")
    assert sorted(r[0] for b in second.values() for r in b) == sorted(
        f"n{i}".encode() for i in range(6)
    )
    offsets = json.loads(
        (tmp_path / "ck" / "offsets" / str(max(second))).read_text().splitlines()[-1]
    )
    assert offsets["CT1"][name] == {"0": 12, "1": 12, "2": 11, "3": 11}


def test_filters_and_consumer_group(spark, broker, tmp_path):
    ns = broker.namesrv_endpoint
    n = 24
    name = send(
        ns,
        "CT2",
        [f"m{i}" for i in range(n)],
        TAGS=["A" if i % 3 == 0 else "B" for i in range(n)],
        n=[str(i) for i in range(n)],
    )
    base = spark.read.format("rmq").option("namesrvAddr", ns).option("topics", "CT2")
    tagged = base.option("tags", "A").load().select("body").collect()
    assert sorted(r.body for r in tagged) == sorted(f"m{i}".encode() for i in range(0, n, 3))
    sql = (
        spark.read.format("rmq")
        .option("namesrvAddr", ns)
        .option("topics", "CT2")
        .option("sql", "n >= 20")
        .load()
    )
    assert sorted(r.body for r in sql.select("body").collect()) == [
        f"m{i}".encode() for i in range(20, 24)
    ]
    s = (
        spark.readStream.format("rmq")
        .option("namesrvAddr", ns)
        .option("topics", "CT2")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "8")
        .option("consumerGroup", "cg-spark")
        .load()
    )
    run_batches(s, str(tmp_path / "ck"))
    with ClusterClient(ns) as c:
        committed = sum(c.query_consumer_offset(name, "cg-spark", "CT2", q) or 0 for q in range(4))
    assert 0 < committed < n  # Spark commits batch N-1 while planning batch N


def test_cluster_option_errors(spark, broker):
    ns = broker.namesrv_endpoint
    with pytest.raises(Exception, match=r"namesrvAddr.*endpoints|endpoints.*namesrvAddr"):
        spark.read.format("rmq").option("namesrvAddr", ns).option("endpoints", "h:1").option(
            "topics", "T"
        ).load().collect()
    with pytest.raises(Exception, match="must map broker names"):
        (
            spark.read.format("rmq")
            .option("namesrvAddr", ns)
            .option("topics", "CT1")
            .option("startingOffsets", '{"CT1": {"0": 1}}')
            .load()
            .collect()
        )
    with pytest.raises(Exception, match="pullBatchSize"):
        spark.read.format("rmq").option("path", "/nonexistent").option("topics", "T").option(
            "pullBatchSize", "5"
        ).load().collect()


def test_queues_added_between_micro_batches_are_read(spark, broker, tmp_path):
    ns = broker.namesrv_endpoint
    name = send(ns, "CT3", [f"m{i}" for i in range(8)])
    ck = str(tmp_path / "ck")
    s = (
        spark.readStream.format("rmq")
        .option("namesrvAddr", ns)
        .option("topics", "CT3")
        .option("startingOffsets", "earliest")
        .load()
    )
    first = run_batches(s, ck, "queueId,body")
    assert sorted(r[1] for b in first.values() for r in b) == sorted(
        f"m{i}".encode() for i in range(8)
    )
    with ClusterClient(ns) as c:
        c.create_topic(name, "CT3", 6)  # two more queues, as mqadmin updateTopic -r 6 -w 6
        c.route("CT3", refresh=True)
        c.send_message(name, "pg", "CT3", 5, b"in-new-queue", {})
        c.send_message(name, "pg", "CT3", 0, b"in-old-queue", {})
    second = run_batches(s, ck, "queueId,body")
    assert sorted(r for b in second.values() for r in b) == [
        (0, b"in-old-queue"),
        (5, b"in-new-queue"),
    ]


def test_topics_matching_the_pattern_added_between_micro_batches_are_read(spark, broker, tmp_path):
    """``topicPattern`` with ``namesrvAddr``: the NameServer's topic list is asked at every
    micro-batch, so a topic created after the query started is read from its first offset, as
    Kafka's source subscribes to new topics of a ``subscribePattern``."""
    ns = broker.namesrv_endpoint
    send(ns, "PatA1", [f"a{i}" for i in range(6)])
    send(ns, "OtherPat", ["not-matched"])
    ck = str(tmp_path / "ck")
    s = (
        spark.readStream.format("rmq")
        .option("namesrvAddr", ns)
        .option("topicPattern", "PatA[0-9]+")
        .option("startingOffsets", "latest")
        .load()
    )
    first = run_batches(s, ck, "topic,body")
    assert [r for b in first.values() for r in b] == []  # latest: nothing yet
    send(ns, "PatA1", ["a-after"])
    send(ns, "PatA22", ["new-0", "new-1"])  # a topic the query has not seen
    send(ns, "OtherPat", ["still-not-matched"])
    second = run_batches(s, ck, "topic,body")
    assert sorted(r for b in second.values() for r in b) == [
        ("PatA1", b"a-after"),
        ("PatA22", b"new-0"),
        ("PatA22", b"new-1"),
    ]


def _free_port() -> int:
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def test_fail_on_data_loss_when_a_broker_comes_back_with_less(spark, tmp_path):
    import shutil

    ports = [_free_port() for _ in range(3)]

    def opts():
        return BrokerOptions(
            listen=f"127.0.0.1:{ports[0]}",
            remoting_listen=f"127.0.0.1:{ports[1]}",
            namesrv_listen=f"127.0.0.1:{ports[2]}",
        )

    store = tmp_path / "store"
    ns = f"127.0.0.1:{ports[2]}"
    ck = str(tmp_path / "ck")

    def query(**options: str):
        r = spark.readStream.format("rmq").option("namesrvAddr", ns).option("topics", "LossT")
        for k, v in {"startingOffsets": "earliest", **options}.items():
            r = r.option(k, v)
        return r.load()

    with Broker(str(store), options=opts()):
        send(ns, "LossT", [f"m{i}" for i in range(8)], queues=1)
        run_batches(query(), ck, "body")
    shutil.rmtree(store)  # the broker's store is lost: it comes back with less than was read
    with Broker(str(store), options=opts()):
        send(ns, "LossT", ["n0"], queues=1)
        q = (
            query()
            .writeStream.format("noop")
            .option("checkpointLocation", ck)
            .trigger(availableNow=True)
            .start()
        )
        with pytest.raises(Exception, match="failOnDataLoss"):
            q.awaitTermination(300)
        send(ns, "LossT", [f"k{i}" for i in range(9)], queues=1)
        lenient = run_batches(query(failOnDataLoss="false"), ck, "body")
        assert sorted(r[0] for b in lenient.values() for r in b) == [b"k7", b"k8"]
