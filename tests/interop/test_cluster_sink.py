"""The sink writing to a RocketMQ cluster with ``namesrvAddr``: a real Apache RocketMQ 5.5.0
(NameServer + two brokers of one cluster) and rmq-broker through its remoting port and NameServer,
the same tests for both (``RMQ_INTEROP_TARGETS``).

Every message is read back over PULL_MESSAGE from every broker of the route (:mod:`_cluster_io`).
The guarantee tested is the one the README states: at-least-once, each row with a deterministic
message id, so that dropping duplicates by id gives exactly the input rows -- also with the
streaming driver killed -9 at random points and restarted from its checkpoint.
"""

from __future__ import annotations

import collections
import datetime as dt
import sys
from pathlib import Path

import pytest
from _cluster_io import create_topic, read_topic, wait_count
from _targets import enabled_targets
from pyspark.sql import functions as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "datasource"))


@pytest.fixture(scope="module", params=enabled_targets())
def sink_target(request: pytest.FixtureRequest):
    return request.getfixturevalue("_apache" if request.param == "apache" else "_rmq_broker")


def _topic(names: str, suffix: str) -> str:
    return (names[:60] + "_" + suffix).replace("[", "_").replace("]", "_")


def _write(df, namesrv: str, topic: str | None = None, **options: str) -> None:
    w = df.write.format("rmq").option("namesrvAddr", namesrv).mode("append")
    if topic is not None:
        w = w.option("topic", topic)
    for k, v in options.items():
        w = w.option(k, v)
    w.save()


def test_every_column_lands(spark, sink_target, names: str) -> None:
    """Bodies, tags, keys (array), properties; rows spread over every broker by round robin;
    a message group on one queue, in order; message ids of 32 hex digits, one per row."""
    topic = _topic(names, "cols")
    brokers = create_topic(sink_target.namesrv_addr, topic, 4)
    n = 3000
    df = (
        spark.range(n)
        .coalesce(1)
        .select(
            F.format_string("row-%d", "id").alias("body"),
            F.format_string("Tag%d", F.col("id") % 3).alias("tags"),
            F.array(F.format_string("k%d", "id"), F.lit("common")).alias("keys"),
            F.create_map(
                F.lit("i"), F.col("id").cast("string"), F.lit("city"), F.lit("Zürich")
            ).alias("properties"),
            F.when(F.col("id") % 10 == 0, F.format_string("g%d", F.col("id") % 7)).alias(
                "messageGroup"
            ),
            F.col("id"),
        )
    )
    _write(df.drop("id"), sink_target.namesrv_addr, topic)
    t = read_topic(sink_target.namesrv_addr, topic)
    rows = t.to_pylist()
    assert len(rows) == n
    ids = [r["msgId"] for r in rows]
    assert len(set(ids)) == n and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    by_body = {r["body"]: r for r in rows}
    assert sorted(by_body) == sorted(f"row-{i}".encode() for i in range(n))
    for i in (0, 1, 17, n - 1):
        r = by_body[f"row-{i}".encode()]
        assert r["tags"] == f"Tag{i % 3}" and r["keys"] == f"k{i} common"
        props = dict(r["properties"])
        assert props["i"] == str(i) and props["city"] == "Zürich"
    assert {r["brokerName"] for r in rows} == set(brokers)
    groups = collections.defaultdict(list)
    for r in rows:
        i = int(r["body"][4:])
        if i % 10 == 0:
            groups[f"g{i % 7}"].append((r["brokerName"], r["queueId"], r["queueOffset"], i))
    for g, members in groups.items():
        assert len({(b, q) for b, q, _, _ in members}) == 1, g  # one queue per group
        assert [i for *_, i in sorted(members)] == sorted(i for *_, i in members), g  # in order


def test_queue_id_delay_and_timer(spark, sink_target, names: str) -> None:
    topic = _topic(names, "qd")
    brokers = create_topic(sink_target.namesrv_addr, topic, 4)
    last = 4 * len(brokers) - 1  # write queues: brokers in name order, then queue ids
    due = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=3)
    df = spark.createDataFrame(
        [
            ("fixed-0", last, None, None),
            ("fixed-1", last, None, None),
            ("late", None, 1, None),
            ("timer", None, None, due),
        ],
        "body string, queueId int, delayLevel int, deliverTimestamp timestamp",
    )
    _write(df, sink_target.namesrv_addr, topic)
    t = wait_count(sink_target.namesrv_addr, topic, 4)
    rows = {r["body"]: r for r in t.to_pylist()}
    assert sorted(rows) == [b"fixed-0", b"fixed-1", b"late", b"timer"]
    assert {(rows[b]["brokerName"], rows[b]["queueId"]) for b in (b"fixed-0", b"fixed-1")} == {
        (brokers[-1], 3)
    }
    assert rows[b"fixed-0"]["queueOffset"] < rows[b"fixed-1"]["queueOffset"]
    # delivered, not at once: level 1 is 1 s after its birth; the timer message at its time (the
    # wheel's precision is 1 s).  (Apache RocketMQ keeps DELAY and TIMER_DELIVER_MS in the delivered
    # message, rmq-broker removes them: README of tests/interop.)
    late = rows[b"late"]
    assert late["storeTimestamp"] - late["bornTimestamp"] >= dt.timedelta(milliseconds=900)
    assert rows[b"timer"]["storeTimestamp"] >= due - dt.timedelta(seconds=1)
    if sink_target.name == "apache":
        assert dict(late["properties"]).get("DELAY") == "1"
        assert int(dict(rows[b"timer"]["properties"])["TIMER_DELIVER_MS"]) == int(
            due.timestamp() * 1000
        )


def test_bad_rows_fail_before_anything_is_sent(spark, sink_target, names: str) -> None:
    topic = _topic(names, "bad")
    create_topic(sink_target.namesrv_addr, topic, 4)
    df = spark.createDataFrame(
        [("ok", {"a": "1"}), ("reserved", {"UNIQ_KEY": "mine"})],
        "body string, properties map<string,string>",
    ).coalesce(1)
    with pytest.raises(Exception, match=r"ILLEGAL_MESSAGE_PROPERTY_KEY.*UNIQ_KEY"):
        _write(df, sink_target.namesrv_addr, topic)
    with pytest.raises(Exception, match="namesrvAddr: 'nope' is not host:port"):
        _write(df, "nope", topic)
    with pytest.raises(Exception, match="transactional=true' is not available"):
        _write(df, sink_target.namesrv_addr, topic, transactional="true")
    assert read_topic(sink_target.namesrv_addr, topic).num_rows == 0


def test_failed_broker_is_retried_on_another(_apache, names: str) -> None:
    """Apache RocketMQ's two brokers: a route taken while both ran, then one killed -9: every
    batch meant for it goes to the other broker (DefaultMQProducer's retry), nothing lost."""
    import pyarrow as pa

    from rmq_spark.datasource.cluster_options import sink_options
    from rmq_spark.datasource.cluster_writer import _Sender, key_prefix

    cluster = _apache.cluster_process
    topic = _topic(names, "retry")
    brokers = create_topic(_apache.namesrv_addr, topic, 4)
    victim = brokers[-1]
    opts = sink_options({"namesrvAddr": _apache.namesrv_addr, "topic": topic}, streaming=False)
    sender = _Sender(opts)
    try:
        queues, _ = sender.queues(topic)
        assert {b for b, _ in queues} == set(brokers)
        cluster.stop_broker(victim, kill=True)
        n = 2000
        table = pa.table({"topic": [topic] * n, "body": [f"r{i}".encode() for i in range(n)]})
        assert sender.send_chunk(table, key_prefix("retry", 0, 0), 0) == n
    finally:
        sender.close()
        if victim not in cluster.brokers:
            cluster.start_broker(victim)
    rows = read_topic(_apache.namesrv_addr, topic).to_pylist()
    assert sorted(r["body"] for r in rows) == sorted(f"r{i}".encode() for i in range(n))
    assert {r["brokerName"] for r in rows} == set(brokers) - {victim}
