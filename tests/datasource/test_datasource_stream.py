"""Structured Streaming reads of format rmq on the session's local[2] SparkSession: limits,
restarts from a checkpoint, starting positions, filters, consumer groups, lag, data loss.

``format("rmq")`` is used without registering it: pyspark finds ``pyspark_rmq.DefaultSource``.
"""

from __future__ import annotations

import glob
import os
import shutil
import time

import pytest

from rmq_spark.datasource.embedded import stop_broker
from rmq_spark.datasource.releases import ADMISSION_CONTROL
from rmq_spark.datasource.testing import client, produce

pytestmark = pytest.mark.spark


@pytest.fixture
def rmq(store_dir):
    """A store directory; its embedded broker (started by the connector) is stopped after."""
    yield store_dir
    stop_broker(store_dir)


def stream(spark, path: str, **options: str):
    r = spark.readStream.format("rmq").option("path", path)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def run_batches(df, checkpoint: str, select: str = "body") -> dict[int, list]:
    """Run ``df`` to the end of what is stored, with Trigger.AvailableNow where the release has
    admission control of Python sources (4.2+; 4.0 and 4.1 refuse it with a limit: there the
    default trigger until ``processAllAvailable`` returns); returns every micro-batch's rows by
    batch id."""
    got: dict[int, list] = {}

    def collect(batch_df, batch_id: int) -> None:
        got[batch_id] = sorted(tuple(r) for r in batch_df.selectExpr(*select.split(",")).collect())

    w = df.writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
    if ADMISSION_CONTROL:
        q = w.trigger(availableNow=True).start()
        q.awaitTermination(300)
    else:
        q = w.start()
        try:
            q.processAllAvailable()
        finally:
            q.stop()
    assert q.exception() is None, q.exception()
    return got


def test_limited_batches_deliver_every_message_once(spark, rmq, tmp_path):
    produce(rmq, "T", [f"m{i}" for i in range(200)], queueId=[i % 3 for i in range(200)])
    got = run_batches(
        stream(spark, rmq, topics="T", startingOffsets="earliest", maxOffsetsPerTrigger="60"),
        str(tmp_path / "ck"),
    )
    rows = [r for b in got.values() for r in b]
    assert sorted(rows) == sorted((f"m{i}".encode(),) for i in range(200))
    assert all(len(b) <= 61 for b in got.values()) and len([b for b in got.values() if b]) >= 4


def test_restart_from_checkpoint_replays_identical_batches(spark, rmq, tmp_path):
    produce(rmq, "R", [f"a{i}" for i in range(120)])
    ck = str(tmp_path / "ck")
    df = stream(spark, rmq, topics="R", startingOffsets="earliest", maxOffsetsPerTrigger="40")
    first = run_batches(df, ck, "topic,queueId,queueOffset,body")
    last = max(first)
    assert last >= 2
    # the driver died after writing offsets/N but before commits/N: batch N runs again
    for f in glob.glob(os.path.join(ck, "commits", f"{last}")) + glob.glob(
        os.path.join(ck, "commits", f".{last}.crc")
    ):
        os.remove(f)
    produce(rmq, "R", [f"b{i}" for i in range(50)])  # newer data must not leak into the replay
    second = run_batches(df, ck, "topic,queueId,queueOffset,body")
    assert second[last] == first[last]
    later = [r for b, rows in second.items() if b > last for r in rows]
    assert sorted(r[3] for r in later) == sorted(f"b{i}".encode() for i in range(50))


def test_starting_positions(spark, rmq, tmp_path):
    produce(rmq, "S", ["old1", "old2"], queueId=[0, 0])
    ck = str(tmp_path / "latest")
    df = stream(spark, rmq, topics="S")  # latest by default
    assert [r for b in run_batches(df, ck).values() for r in b] == []
    produce(rmq, "S", ["new1"], queueId=[1])
    assert [r for b in run_batches(df, ck).values() for r in b] == [(b"new1",)]
    mark = int(time.time() * 1000)
    time.sleep(0.02)
    produce(rmq, "S", ["after"], queueId=[1])
    by_time = run_batches(
        stream(spark, rmq, topics="S", startingTimestamp=str(mark)), str(tmp_path / "ts")
    )
    assert [r for b in by_time.values() for r in b] == [(b"after",)]
    # queue 0 from offset 1, the queues the JSON does not name from the earliest
    by_json = run_batches(
        stream(spark, rmq, topics="S", startingOffsets='{"S": {"0": 1}}'), str(tmp_path / "js")
    )
    assert sorted(r for b in by_json.values() for r in b) == [(b"after",), (b"new1",), (b"old2",)]


def test_tag_and_sql_filters_leave_gaps_that_are_not_data_loss(spark, rmq, tmp_path):
    n = 40
    produce(
        rmq,
        "F",
        [f"m{i}" for i in range(n)],
        tags=["TagA" if i % 4 == 0 else "TagB" if i % 4 == 1 else "TagC" for i in range(n)],
        properties=[[("n", str(i))] for i in range(n)],
        queueId=[0] * n,
    )
    tagged = run_batches(
        stream(
            spark,
            rmq,
            topics="F",
            startingOffsets="earliest",
            tags="TagA || TagB",
            maxOffsetsPerTrigger="7",
        ),
        str(tmp_path / "t"),
    )
    assert sorted(r[0] for b in tagged.values() for r in b) == sorted(
        f"m{i}".encode() for i in range(n) if i % 4 < 2
    )
    sql = run_batches(
        stream(spark, rmq, topics="F", startingOffsets="earliest", sql="n >= 30 AND n < 35"),
        str(tmp_path / "s"),
    )
    assert sorted(r[0] for b in sql.values() for r in b) == sorted(
        f"m{i}".encode() for i in range(30, 35)
    )


def test_consumer_group_offsets_lag_one_batch(spark, rmq, tmp_path):
    produce(rmq, "G", [f"m{i}" for i in range(30)], queueId=[0] * 30)
    ck = str(tmp_path / "ck")
    df = stream(
        spark,
        rmq,
        topics="G",
        startingOffsets="earliest",
        maxOffsetsPerTrigger="10",
        consumerGroup="spark-g",
    )
    run_batches(df, ck)
    c = client(rmq)
    # Spark commits batch N-1 while planning batch N: the last batch of a run is not committed yet
    assert c.query_offsets("spark-g", ["G"])["G"]["0"] == 20
    produce(c, "G", ["x"], queueId=[0])
    run_batches(df, ck)
    assert c.query_offsets("spark-g", ["G"])["G"]["0"] == 30
    c.close()


def test_progress_reports_the_latest_offsets(spark, rmq, tmp_path):
    produce(rmq, "L", [f"m{i}" for i in range(12)], queueId=[i % 2 for i in range(12)])
    q = (
        stream(spark, rmq, topics="L", startingOffsets="earliest", maxOffsetsPerTrigger="5")
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    latest = [
        p["sources"][0]["latestOffset"]
        for p in q.recentProgress
        if p["sources"][0].get("latestOffset")
    ]
    assert latest and all('"L"' in x and '"0":6' in x.replace(" ", "") for x in latest)
    assert sum(p["numInputRows"] for p in q.recentProgress) == 12


def test_fail_on_data_loss(spark, rmq, tmp_path):
    produce(rmq, "D", [f"m{i}" for i in range(10)], queueId=[0] * 10)
    ck = str(tmp_path / "ck")
    run_batches(stream(spark, rmq, topics="D", startingOffsets="earliest"), ck)
    # the store is replaced by a shorter one: offsets already read are gone
    stop_broker(rmq)
    shutil.rmtree(rmq)
    os.makedirs(rmq)
    produce(rmq, "D", ["n0", "n1"], queueId=[0, 0])
    q = (
        stream(spark, rmq, topics="D", startingOffsets="earliest")
        .writeStream.format("noop")
        .option("checkpointLocation", ck)
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match="failOnDataLoss"):
        q.awaitTermination(300)
    produce(rmq, "D", [f"k{i}" for i in range(10)], queueId=[0] * 10)
    lenient = run_batches(
        stream(spark, rmq, topics="D", startingOffsets="earliest", failOnDataLoss="false"), ck
    )
    assert sorted(r[0] for b in lenient.values() for r in b) == [b"k8", b"k9"]


def test_option_errors_reach_the_user(spark, rmq):
    with pytest.raises(Exception, match="unknown option 'topcs'"):
        spark.readStream.format("rmq").option("path", rmq).option("topcs", "T").load()
    with pytest.raises(Exception, match="does not apply to a streaming read"):
        q = (
            stream(spark, rmq, topics="T", endingOffsets="latest")
            .writeStream.format("noop")
            .start()
        )
        q.awaitTermination(60)
    with pytest.raises(Exception, match="fixed schema"):
        q = (
            spark.readStream.format("rmq")
            .schema("body binary")
            .option("path", rmq)
            .option("topics", "T")
            .load()
            .writeStream.format("noop")
            .start()
        )
        q.awaitTermination(60)
