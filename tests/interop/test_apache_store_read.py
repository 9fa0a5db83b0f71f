"""A store directory a real Apache RocketMQ broker wrote, read offline with ``option("path")``.

One Apache RocketMQ 5.5.0 broker (with its NameServer) per module, CommitLog segments of 64 KiB
and ConsumeQueue files of 100 units so the topic spans several of each (and BLANK records end
every CommitLog segment).  It is filled over the remoting protocol (:mod:`_apache_store`): batches
with tags, keys and properties over four queues, single sends, a body stored zlib-compressed, a
delay-level message and a timer message, both delivered by the broker before the reads.  Then
``spark.read.format("rmq").option("path", store)`` reads it while the broker runs, and again
after it stopped; nothing is started and nothing in the store changes.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from _apache import ApacheRocketMQ
from _apache_store import Filled, create_topic, fill, send_one
from pyspark.sql import functions as F

from rmq_spark.remoting.client import RemotingClient
from rmq_spark.store.reader import StoreReader

TOPIC = "ApacheStoreT"
BROKER = "store-a"


def _listing(root: Path) -> dict[str, int]:
    """Every file of the store with its size (what a read must leave as it is, apart from the
    running broker's own writes)."""
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _wait_all_stored(store: Path, filled: Filled, timeout_s: float = 60.0) -> None:
    """Until the delayed and timer messages reached the topic (the broker delivers them)."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = StoreReader(str(store))
        try:
            n = sum(r.max_offset(TOPIC, q) for q in r.queue_ids(TOPIC))
        finally:
            r.close()
        if n >= len(filled.sent):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n} of {len(filled.sent)} messages in {TOPIC} after {timeout_s}s")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def apache_store(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("apache-store")
    cluster = ApacheRocketMQ(
        work,
        brokers=(BROKER,),
        broker_config={
            "mappedFileSizeCommitLog": str(64 * 1024),
            "mappedFileSizeConsumeQueue": str(100 * 20),
        },
    )
    cluster.start()
    try:
        filled = fill(cluster.broker_addr(BROKER), TOPIC, queues=4, batches=4, batch_size=40)
        store = work / BROKER / "store"
        _wait_all_stored(store, filled)
        yield cluster, store, filled
    finally:
        cluster.close()


def _read(spark, store: Path, **options: str):
    reader = spark.read.format("rmq").option("path", str(store)).option("topics", TOPIC)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _check_rows(rows: list, filled: Filled) -> None:
    """Exactly the messages sent, each with its body, tags, keys, properties and queue."""
    want = filled.by_uniq()
    got = {r["msgId"]: r for r in rows}
    assert len(got) == len(rows) == len(want)
    assert set(got) == set(want)
    for uniq, s in want.items():
        r = got[uniq]
        assert bytes(r["body"]) == s.body, uniq
        assert r["tags"] == s.tags
        assert r["keys"] == s.keys
        assert r["queueId"] == s.queue_id
        props = dict(r["properties"])
        for k, v in s.properties.items():
            assert props[k] == v
        assert r["topic"] == TOPIC
    by_queue: dict[int, list[int]] = {}
    for r in rows:
        by_queue.setdefault(r["queueId"], []).append(r["queueOffset"])
    for q, offs in by_queue.items():  # every queue from 0 without a gap
        assert sorted(offs) == list(range(len(offs))), q


def test_store_spans_several_segments(apache_store) -> None:
    """The store really has what the reader must cope with: several CommitLog segments (so BLANK
    ends), several ConsumeQueue files, the timer wheel and schedule topic, Apache's config files."""
    _cluster, store, _filled = apache_store
    assert len(os.listdir(store / "commitlog")) >= 3
    assert len(os.listdir(store / "consumequeue" / TOPIC / "0")) >= 2
    assert (store / "consumequeue" / "SCHEDULE_TOPIC_XXXX").is_dir()
    assert (store / "consumequeue" / "rmq_sys_wheel_timer").is_dir()
    assert (store / "config" / "topics.json").is_file()


def test_read_while_the_broker_runs(spark, apache_store) -> None:
    cluster, store, filled = apache_store
    assert cluster.brokers[BROKER].proc.poll() is None
    before = _listing(store)
    rows = _read(spark, store).collect()
    _check_rows(rows, filled)
    after = _listing(store)
    # nothing of ours was created: no embedded broker's record, lock or log
    assert not {"broker.endpoint", "embedded.lock", "broker.log"} & set(after)
    assert set(before) <= set(after)
    compressed = [r for r in rows if r["tags"] == "Big"]
    assert len(compressed) == 1 and bytes(compressed[0]["body"]).endswith(b"compressed!")
    timer = [r for r in rows if r["tags"] == "Timer"]
    assert len(timer) == 1 and timer[0]["deliverTimestamp"] is not None


def test_filters_and_offsets(spark, apache_store) -> None:
    _cluster, store, filled = apache_store
    tagged = _read(spark, store, tags="Tag1 || Big").collect()
    assert sorted(r["msgId"] for r in tagged) == sorted(
        s.uniq for s in filled.sent if s.tags in ("Tag1", "Big")
    )
    ranged = (
        _read(
            spark,
            store,
            startingOffsets=json.dumps({TOPIC: {"2": 10}}),
            endingOffsets=json.dumps({TOPIC: {"2": 25}}),
        )
        .where(F.col("queueId") == 2)
        .collect()
    )
    assert sorted(r["queueOffset"] for r in ranged) == list(range(10, 25))
    pushed = (
        _read(spark, store).where((F.col("queueId") == 3) & (F.col("queueOffset") >= 150)).collect()
    )
    want = len([s for s in filled.sent if s.queue_id == 3]) - 150
    assert sorted(r["queueOffset"] for r in pushed) == list(range(150, 150 + want))
    sql = _read(spark, store, sql="i BETWEEN 10 AND 19").collect()
    assert sorted(int(dict(r["properties"])["i"]) for r in sql) == list(range(10, 20))


def test_streams_and_writes_are_refused_while_apache_holds_the_store(spark, apache_store) -> None:
    """The embedded broker opens Apache's stores, but not one its broker holds (its POSIX lock)."""
    cluster, store, _filled = apache_store
    held = f"in use by another process \\(pid {cluster.brokers[BROKER].pid}\\)"
    with pytest.raises(Exception, match=held):
        q = (
            spark.readStream.format("rmq")
            .option("path", str(store))
            .option("topics", TOPIC)
            .load()
            .writeStream.format("memory")
            .queryName("apache_store_stream")
            .start()
        )
        try:
            q.processAllAvailable()
        finally:
            q.stop()
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match=held):
        df.write.format("rmq").option("path", str(store)).option("topic", TOPIC).mode(
            "append"
        ).save()


def test_deleted_commitlog_segments(spark, apache_store, tmp_path: Path) -> None:
    """Retention deletes the oldest CommitLog files before the ConsumeQueue units pointing there:
    the first readable offset of each queue is the first unit still in the log."""
    _cluster, store, filled = apache_store
    copy = tmp_path / "store"
    shutil.copytree(store, copy, ignore=shutil.ignore_patterns("lock"))
    first = sorted(os.listdir(copy / "commitlog"))[0]
    os.unlink(copy / "commitlog" / first)
    kept_from = int(sorted(os.listdir(copy / "commitlog"))[0])
    rows = _read(spark, copy).collect()
    assert rows and all(r["commitLogOffset"] >= kept_from for r in rows)
    lost = [s for s in filled.sent if s.uniq not in {r["msgId"] for r in rows}]
    assert lost and len(rows) + len(lost) == len(filled.sent)
    with pytest.raises(Exception, match=r"failOnDataLoss|now starts at"):
        _read(spark, copy, startingOffsets=json.dumps({TOPIC: {"0": 0}})).collect()


def test_batch_consume_queue_is_refused(spark, apache_store) -> None:
    """A topic with ``queue.type=BatchCQ`` keeps 46-byte ConsumeQueue units: refused by name."""
    cluster, store, _filled = apache_store
    topic = "ApacheBatchCQ"
    create_topic(cluster.broker_addr(BROKER), topic, 1, attributes="+queue.type=BatchCQ")
    with RemotingClient(cluster.broker_addr(BROKER), 10.0) as c:
        send_one(c, topic, 0, b"in a batch queue", {"WAIT": "true"})
    with pytest.raises(Exception, match="batch ConsumeQueue"):
        spark.read.format("rmq").option("path", str(store)).option("topics", topic).load().collect()


def test_read_after_the_broker_stopped(spark, apache_store) -> None:
    """Last: stops the module's broker, then reads the same rows."""
    cluster, store, filled = apache_store
    cluster.stop_broker(BROKER)
    before = _listing(store)
    rows = _read(spark, store).collect()
    _check_rows(rows, filled)
    assert _listing(store) == before
