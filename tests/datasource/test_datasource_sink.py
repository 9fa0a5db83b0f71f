"""The rmq sink on the session's SparkSession: exactly-once across a replayed micro-batch (and
the duplicate at-least-once gives), batches visible whole, columns, all-or-nothing batch writes,
Avro, errors."""

from __future__ import annotations

import glob
import os
import threading
import time

import pytest
from pyspark.sql import functions as F

from rmq_spark.broker.connector.client import InternalClient
from rmq_spark.datasource.embedded import stop_broker
from rmq_spark.datasource.releases import ADMISSION_CONTROL
from rmq_spark.datasource.testing import client, produce, read_topic
from rmq_spark.store import layout as L

pytestmark = pytest.mark.spark

AVRO = (
    '{"type": "record", "name": "Order", "fields": ['
    '{"name": "id", "type": "long"}, {"name": "item", "type": "string"},'
    '{"name": "price", "type": ["null", "double"]},'
    '{"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},'
    '{"name": "lines", "type": {"type": "array", "items": "int"}}]}'
)


@pytest.fixture
def rmq(store_dir):
    yield store_dir
    stop_broker(store_dir)


def pipeline(spark, path: str, source: str, target: str, checkpoint: str, **sink_options: str):
    df = (
        spark.readStream.format("rmq")
        .option("path", path)
        .option("topics", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "50")
        .load()
        .select("body", "tags")
    )
    w = (
        df.writeStream.format("rmq")
        .option("path", path)
        .option("topic", target)
        .option("checkpointLocation", checkpoint)
    )
    for k, v in sink_options.items():
        w = w.option(k, v)
    if ADMISSION_CONTROL:
        q = w.trigger(availableNow=True).start()
        q.awaitTermination(300)
    else:  # pyspark 4.0, 4.1 refuse AvailableNow with a limit: the source applies it per trigger
        q = w.start()
        try:
            q.processAllAvailable()
        finally:
            q.stop()
    assert q.exception() is None, q.exception()
    return q


def drop_last_commit(checkpoint: str) -> int:
    last = max(
        int(os.path.basename(f)) for f in glob.glob(os.path.join(checkpoint, "commits", "[0-9]*"))
    )
    for f in glob.glob(os.path.join(checkpoint, "commits", f"{last}")) + glob.glob(
        os.path.join(checkpoint, "commits", f".{last}.crc")
    ):
        os.remove(f)
    return last


def test_replayed_batch_is_written_once_exactly_once_and_twice_at_least_once(spark, rmq, tmp_path):
    produce(rmq, "In", [f"m{i}" for i in range(150)], queueId=[0] * 150)
    eo = str(tmp_path / "eo")
    q = pipeline(spark, rmq, "In", "OutEO", eo)
    alo = str(tmp_path / "alo")
    pipeline(spark, rmq, "In", "OutALO", alo, transactional="false")
    # the driver died between the sink's commit and Spark's commits/N: batch N is replayed
    drop_last_commit(eo)
    drop_last_commit(alo)
    pipeline(spark, rmq, "In", "OutEO", eo)
    pipeline(spark, rmq, "In", "OutALO", alo, transactional="false")
    bodies = sorted(read_topic(rmq, "OutEO").column("body").to_pylist())
    assert bodies == sorted(f"m{i}".encode() for i in range(150))
    alo_bodies = read_topic(rmq, "OutALO").column("body").to_pylist()
    assert len(alo_bodies) == 150 + 50 and set(alo_bodies) == set(bodies)
    c = client(rmq)
    assert sorted(int(b) for b in c.sink_status(str(q.id))["batches"]) == [0, 1, 2]
    c.close()


def test_sink_batches_become_visible_whole(spark, rmq, tmp_path):
    produce(rmq, "Src", [f"m{i}" for i in range(400)], queueId=[0] * 400)
    c = client(rmq)
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def poll() -> None:
        reader = InternalClient(c.endpoint)
        try:
            while not stop.is_set():
                hi, _ = reader.offsets(["Whole"])
                seen.append(sum(hi.get("Whole", {}).values()))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            reader.close()

    th = threading.Thread(target=poll)
    th.start()
    try:
        pipeline(spark, rmq, "Src", "Whole", str(tmp_path / "ck"))  # 8 batches of 50 over 4 queues
    finally:
        stop.set()
        th.join()
    c.close()
    assert not errors
    assert len(set(seen)) > 2 and all(n % 50 == 0 for n in seen)
    assert (
        spark.read.format("rmq").option("path", rmq).option("topics", "Whole").load().count() == 400
    )


def test_sink_columns_are_honoured(spark, rmq):
    df = spark.createDataFrame(
        [
            ("a", "T1", "TagA", ["k1", "k2"], {"color": "red"}, "g1", None),
            ("b", "T1", None, None, None, "g1", None),
            ("c", "T2", "TagC", ["k3"], {}, None, 3),
        ],
        "body string, topic string, tags string, keys array<string>, properties map<string,string>, "
        "messageGroup string, queueId int",
    )
    df.write.format("rmq").option("path", rmq).mode("append").save()
    t1 = {r["body"]: r for r in read_topic(rmq, "T1").to_pylist()}
    t2 = read_topic(rmq, "T2").to_pylist()
    assert t1[b"a"]["tags"] == "TagA" and t1[b"a"]["keys"] == "k1 k2"
    assert dict(t1[b"a"]["properties"])["color"] == "red"
    assert t1[b"a"]["queueId"] == t1[b"b"]["queueId"]  # one message group, one queue
    assert dict(t1[b"b"]["properties"])[L.P_SHARDING_KEY] == "g1"
    assert [(r["body"], r["queueId"], r["tags"]) for r in t2] == [(b"c", 3, "TagC")]
    assert all(r["transactionId"] for r in t2)  # a transactional (exactly-once) write


def test_batch_write_is_all_or_nothing(spark, rmq):
    good = spark.range(0, 300, numPartitions=3).select(F.format_string("ok%d", "id").alias("body"))
    bad = spark.createDataFrame([("x" * 10,)], "body string").select(
        F.expr("repeat(body, 500000)").alias("body")
    )
    df = good.union(bad)  # one task sends a body over the 4 MiB limit
    with pytest.raises(Exception, match="limit is"):
        df.write.format("rmq").option("path", rmq).option("topic", "Atomic").mode("append").save()
    assert read_topic(rmq, "Atomic").num_rows == 0
    good.write.format("rmq").option("path", rmq).option("topic", "Atomic").mode("append").save()
    assert read_topic(rmq, "Atomic").num_rows == 300


def test_avro_round_trip(spark, rmq):
    rows = [(1, "pen", 1.5, [1, 2]), (2, "ink", None, [])]
    df = spark.createDataFrame(rows, "id long, item string, price double, lines array<int>").select(
        F.struct(
            "id", "item", "price", F.timestamp_millis(F.lit(1_700_000_000_123)).alias("at"), "lines"
        ).alias("value")
    )
    df.write.format("rmq").option("path", rmq).option("topic", "Avro").option(
        "avroSchema", AVRO
    ).mode("append").save()
    back = (
        spark.read.format("rmq")
        .option("path", rmq)
        .option("topics", "Avro")
        .option("avroSchema", AVRO)
        .load()
        .select("value.*")
        .orderBy("id")
        .collect()
    )
    assert [(r.id, r.item, r.price, r.lines) for r in back] == rows
    assert all(r.at.timestamp() == 1_700_000_000.123 for r in back)
    produce(rmq, "Avro", [b"\xff\xfe not avro"])
    with pytest.raises(Exception, match="not Avro of the given schema"):
        spark.read.format("rmq").option("path", rmq).option("topics", "Avro").option(
            "avroSchema", AVRO
        ).load().collect()


def test_sink_errors(spark, rmq, tmp_path):
    df = spark.createDataFrame([(1,)], "body int")
    with pytest.raises(Exception, match="column 'body' must be binary or string"):
        df.write.format("rmq").option("path", rmq).option("topic", "E").mode("append").save()
    with pytest.raises(Exception, match="set option 'topic' or give a column 'topic'"):
        spark.createDataFrame([("x",)], "body string").write.format("rmq").option("path", rmq).mode(
            "append"
        ).save()
    with pytest.raises(Exception, match="'overwrite' is not supported"):
        spark.createDataFrame([("x",)], "body string").write.format("rmq").option(
            "path", rmq
        ).option("topic", "E").mode("overwrite").save()
    with pytest.raises(Exception, match="needs a column 'body'"):
        q = (
            spark.readStream.format("rmq")
            .option("path", rmq)
            .option("topics", "E")
            .load()
            .select("topic")
            .writeStream.format("rmq")
            .option("path", rmq)
            .option("checkpointLocation", str(tmp_path / "c"))
            .start()
        )
        q.awaitTermination(60)


def test_a_bad_row_of_an_exactly_once_batch_commits_nothing(spark, rmq, tmp_path):
    """A delivery time beyond the timer's limit in one row of 100: every row is checked before
    anything is prepared, so the batch fails naming the column, the row and the limit (it used to
    record the batch as committed, fail to commit its halves, then let 99 of them appear), and a
    rerun from the same checkpoint fails the same way instead of skipping the batch."""
    produce(rmq, "In", [f"m{i}" for i in range(100)], queueId=[0] * 100)
    far_ms = int(time.time() * 1000) + 10 * 24 * 3600 * 1000
    df = (
        spark.readStream.format("rmq")
        .option("path", rmq)
        .option("topics", "In")
        .option("startingOffsets", "earliest")
        .load()
        .select(
            "body",
            F.when(F.col("queueOffset") == 57, F.timestamp_millis(F.lit(far_ms))).alias(
                "deliverTimestamp"
            ),
        )
    )
    checkpoint = str(tmp_path / "ck")
    for _ in range(2):
        q = (
            df.writeStream.format("rmq")
            .option("path", rmq)
            .option("topic", "Out")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        with pytest.raises(
            Exception,
            match=r"ILLEGAL_DELIVERY_TIME: column 'deliverTimestamp', row 57 of partition 0: .*the limit is 259200s",
        ):
            q.awaitTermination(300)
        assert not q.isActive
        c = client(rmq)
        assert c.sink_status(str(q.id))["batches"] == {}
        hi, _ = c.offsets([L.TRANS_HALF_TOPIC])
        assert sum(hi.get(L.TRANS_HALF_TOPIC, {}).values()) == 0, "nothing was prepared"
        c.close()
    assert read_topic(rmq, "Out").num_rows == 0


BAD_ROWS = {
    "reserved key": ("properties", {"UNIQ_KEY": "same"},
                     r"ILLEGAL_MESSAGE_PROPERTY_KEY: column 'properties', row 40 of partition 0: property key 'UNIQ_KEY' is reserved"),
    "delay key": ("properties", {"DELAY": "3"},
                  r"ILLEGAL_MESSAGE_PROPERTY_KEY: column 'properties', row 40 of partition 0: property key 'DELAY' is reserved"),
    "empty body": ("body", "", r"MESSAGE_BODY_EMPTY: column 'body', row 40 of partition 0: message body is empty"),
}  # fmt: skip


@pytest.mark.parametrize("transactional", ["true", "false"])
def test_the_sink_refuses_what_send_message_refuses_and_writes_none_of_the_partition(
    spark, rmq, transactional
):
    for name, (column, value, match) in BAD_ROWS.items():
        rows = [(f"m{i}", {"k": str(i)}) for i in range(100)]
        rows[40] = (value, rows[40][1]) if column == "body" else (rows[40][0], value)
        df = spark.createDataFrame(rows, "body string, properties map<string,string>").coalesce(1)
        topic = f"Bad{transactional}{len(match)}"
        w = (
            df.write.format("rmq")
            .option("path", rmq)
            .option("topic", topic)
            .option("transactional", transactional)
        )
        with pytest.raises(Exception, match=match):
            w.mode("append").save()
        assert read_topic(rmq, topic).num_rows == 0, name


def test_writes_from_another_python_thread_find_the_format(spark, rmq, tmp_path):
    """Spark looks a write's format up in the JVM thread's active session, which the thread of a
    new Python thread lacks (DATA_SOURCE_NOT_FOUND); after register(spark) writes work there."""
    import rmq_spark

    rmq_spark.register(spark)
    produce(rmq, "ThreadIn", ["a", "b", "c"], queueId=[0, 0, 0])
    batch = spark.createDataFrame([("x",), ("y",)], "body string")
    stream = (
        spark.readStream.format("rmq")
        .option("path", rmq)
        .option("topics", "ThreadIn")
        .option("startingOffsets", "earliest")
        .load()
        .select("body")
    )
    errors: list[BaseException] = []

    def write() -> None:
        try:
            batch.write.format("rmq").option("path", rmq).option("topic", "ThreadBatch").mode(
                "append"
            ).save()
            q = (
                stream.writeStream.format("rmq")
                .option("path", rmq)
                .option("topic", "ThreadStream")
                .option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination(300)
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread
            errors.append(e)

    t = threading.Thread(target=write)
    t.start()
    t.join(600)
    assert errors == []
    assert sorted(read_topic(rmq, "ThreadBatch").column("body").to_pylist()) == [b"x", b"y"]
    assert sorted(read_topic(rmq, "ThreadStream").column("body").to_pylist()) == [b"a", b"b", b"c"]


def test_partition_rows_past_the_spill_size_wait_on_disk_and_come_back_whole(monkeypatch):
    """A write task holds its checked rows until the whole partition is checked: past
    SPILL_BYTES they go to a local Arrow file, and are sent back in order, whole."""
    import pyarrow as pa

    from rmq_spark.access.rules import SendLimits
    from rmq_spark.datasource import writer as W

    monkeypatch.setattr(W, "SPILL_BYTES", 4096)
    rows = W.PartitionRows(lambda: SendLimits(now_ms=int(time.time() * 1000)), 0, {})
    batches = [
        pa.table({"topic": ["T"] * 100, "body": [b"%d-%d" % (b, i) for i in range(100)]})
        for b in range(5)
    ]
    for b in batches:
        rows.add(b)
    assert rows._spill is not None and os.path.exists(rows._spill[1])
    spilled = rows._spill[0].name
    back = pa.concat_tables(list(rows.chunks()))
    assert back.column("body").to_pylist() == [
        x for b in batches for x in b.column("body").to_pylist()
    ]
    rows.close()
    assert not os.path.exists(spilled)
    bad = W.PartitionRows(lambda: SendLimits(now_ms=0), 7, {})
    bad.add(batches[0])
    with pytest.raises(
        Exception, match=r"MESSAGE_BODY_EMPTY: column 'body', row 103 of partition 7"
    ):
        bad.add(pa.table({"topic": ["T"] * 4, "body": [b"a", b"b", b"c", b""]}))
