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
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen="127.0.0.1:0")
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

    q = df.writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
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
    again = spark.read.format("rmq").option("namesrvAddr", ns).option("topics", "CT1").load().collect()
    assert sorted(tuple(r) for r in again) == sorted(tuple(r) for r in df.collect())
    start = json.dumps({"CT1": {name: {"0": 5}}})
    end = json.dumps({"CT1": {name: {"0": 8, "1": 1}}})
    part = (spark.read.format("rmq").option("namesrvAddr", ns).option("topics", "CT1")
            .option("startingOffsets", start).option("endingOffsets", end).load()
            .select("queueId", "queueOffset").collect())
    assert sorted(tuple(r) for r in part) == [(0, 5), (0, 6), (0, 7), (1, 0)] + [(q, o) for q in (2, 3) for o in range(10)]
    ck = str(tmp_path / "ck")
    s = (spark.readStream.format("rmq").option("namesrvAddr", ns).option("topics", "CT1")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "15").load())
    first = run_batches(s, ck, "brokerName,queueId,queueOffset,body")
    assert sorted(r[3] for b in first.values() for r in b) == sorted(f"m{i}".encode() for i in range(40))
    assert len(first) >= 3
    send(ns, "CT1", [f"n{i}" for i in range(6)])
    second = run_batches(s, ck, "body")
    assert sorted(r[0] for b in second.values() for r in b) == sorted(f"n{i}".encode() for i in range(6))
    offsets = json.loads((tmp_path / "ck" / "offsets" / str(max(second))).read_text().splitlines()[-1])
    assert offsets["CT1"][name] == {"0": 12, "1": 12, "2": 11, "3": 11}


def test_filters_and_consumer_group(spark, broker, tmp_path):
    ns = broker.namesrv_endpoint
    n = 24
    name = send(ns, "CT2", [f"m{i}" for i in range(n)], TAGS=["A" if i % 3 == 0 else "B" for i in range(n)],
                n=[str(i) for i in range(n)])
    base = spark.read.format("rmq").option("namesrvAddr", ns).option("topics", "CT2")
    tagged = base.option("tags", "A").load().select("body").collect()
    assert sorted(r.body for r in tagged) == sorted(f"m{i}".encode() for i in range(0, n, 3))
    sql = spark.read.format("rmq").option("namesrvAddr", ns).option("topics", "CT2").option("sql", "n >= 20").load()
    assert sorted(r.body for r in sql.select("body").collect()) == [f"m{i}".encode() for i in range(20, 24)]
    s = (spark.readStream.format("rmq").option("namesrvAddr", ns).option("topics", "CT2")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "8").option("consumerGroup", "cg-spark").load())
    run_batches(s, str(tmp_path / "ck"))
    with ClusterClient(ns) as c:
        committed = sum(c.query_consumer_offset(name, "cg-spark", "CT2", q) or 0 for q in range(4))
    assert 0 < committed < n  # Spark commits batch N-1 while planning batch N


def test_cluster_option_errors(spark, broker):
    ns = broker.namesrv_endpoint
    with pytest.raises(Exception, match="namesrvAddr.*endpoints|endpoints.*namesrvAddr"):
        spark.read.format("rmq").option("namesrvAddr", ns).option("endpoints", "h:1").option("topics", "T").load().collect()
    with pytest.raises(Exception, match="must map broker names"):
        (spark.read.format("rmq").option("namesrvAddr", ns).option("topics", "CT1")
         .option("startingOffsets", '{"CT1": {"0": 1}}').load().collect())
    with pytest.raises(Exception, match="pullBatchSize"):
        spark.read.format("rmq").option("path", "/nonexistent").option("topics", "T").option("pullBatchSize", "5").load().collect()
