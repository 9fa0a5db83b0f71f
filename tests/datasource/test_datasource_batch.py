"""Batch reads of format rmq: start and end positions, subscriptions, and filter pushdown (same
rows with and without it; fewer partitions with it, on releases that push filters: 4.1+)."""

from __future__ import annotations

import re
import time

import pytest

from rmq_spark.datasource.embedded import stop_broker
from rmq_spark.datasource.releases import FILTER_PUSHDOWN
from rmq_spark.datasource.testing import client, produce

pytestmark = pytest.mark.spark

PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Topics B1 (3 queues x 10) and B2 (1 queue x 5), stored in two steps a known time apart."""
    path = str(tmp_path_factory.mktemp("batch") / "store")
    c = client(path)
    produce(
        c,
        "B1",
        [f"{q}-{i}" for q in range(3) for i in range(5)],
        queueId=[q for q in range(3) for _ in range(5)],
        tags=["even" if i % 2 == 0 else "odd" for _ in range(3) for i in range(5)],
    )
    time.sleep(0.05)
    mark = int(time.time() * 1000)
    time.sleep(0.05)
    produce(
        c,
        "B1",
        [f"{q}-{i}" for q in range(3) for i in range(5, 10)],
        queueId=[q for q in range(3) for _ in range(5)],
        tags=["even" if i % 2 == 0 else "odd" for _ in range(3) for i in range(5, 10)],
    )
    produce(c, "B2", [f"x{i}" for i in range(5)], queueId=[0] * 5)
    c.close()
    yield path, mark
    stop_broker(path)


def read(spark, path: str, **options: str):
    r = spark.read.format("rmq").option("path", path)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def bodies(df) -> list[str]:
    return sorted(r.body.decode() for r in df.select("body").collect())


def test_whole_topics_and_subscriptions(spark, data):
    path, _ = data
    assert read(spark, path, topics="B1").count() == 30
    assert read(spark, path, topicPattern="B[0-9]").count() == 35
    assert bodies(read(spark, path, assign='{"B1": [2]}')) == sorted(f"2-{i}" for i in range(10))
    assert read(spark, path, topics="NoSuchTopic").count() == 0


def test_start_and_end_offsets(spark, data):
    path, _ = data
    df = read(
        spark,
        path,
        topics="B1",
        startingOffsets='{"B1": {"0": 8}}',
        endingOffsets='{"B1": {"1": 2, "2": -1}}',
    )
    # queue 0 from 8 to the end; queue 1 from earliest to 2; queue 2 all
    assert bodies(df) == sorted(["0-8", "0-9", "1-0", "1-1"] + [f"2-{i}" for i in range(10)])


def test_timestamps(spark, data):
    path, mark = data
    later = bodies(read(spark, path, topics="B1", startingTimestamp=str(mark)))
    assert later == sorted(f"{q}-{i}" for q in range(3) for i in range(5, 10))
    earlier = bodies(read(spark, path, topics="B1", endingTimestamp=str(mark)))
    assert earlier == sorted(f"{q}-{i}" for q in range(3) for i in range(5))


def test_filter_pushdown_gives_the_same_rows_with_fewer_partitions(spark, data):
    path, mark = data
    ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(mark / 1000)) + f".{mark % 1000:03d}"
    queries = [
        ("topic = 'B2'", 1),
        ("queueId = 1 and queueOffset >= 3 and queueOffset < 7", 1),
        ("queueId in (0, 2) and tags = 'even'", 3),
        (f"storeTimestamp >= timestamp'{ts}' and queueId = 0", 2),
        ("tags in ('odd') and queueOffset = 3", 4),
        ("body = cast('0-1' as binary) and queueOffset <= 1", 4),  # body is left to Spark
    ]
    expected = {}
    spark.conf.set(PUSHDOWN, "false")
    for where, _ in queries:
        expected[where] = bodies(read(spark, path, topicPattern="B.*").where(where))
    spark.conf.set(PUSHDOWN, "true")
    try:
        for where, parts in queries:
            df = read(spark, path, topicPattern="B.*").where(where)
            assert bodies(df) == expected[where], where
            if FILTER_PUSHDOWN:  # pyspark 4.0 plans every queue's range: Spark applies `where`
                assert df.rdd.getNumPartitions() == parts, where
        assert expected["queueId = 1 and queueOffset >= 3 and queueOffset < 7"] == [
            "1-3",
            "1-4",
            "1-5",
            "1-6",
        ]
        assert expected["tags in ('odd') and queueOffset = 3"] == [
            "0-3",
            "1-3",
            "2-3",
        ]  # x3 has no tag
    finally:
        spark.conf.unset(PUSHDOWN)


def test_batch_option_errors(spark, data):
    path, _ = data
    with pytest.raises(Exception, match="cannot be 'latest' for a batch read"):
        read(spark, path, topics="B1", startingOffsets="latest").collect()
    with pytest.raises(Exception, match="does not apply to a batch read"):
        read(spark, path, topics="B1", maxOffsetsPerTrigger="5").collect()


def test_read_paths_agree(spark, data):
    """Files (executors on the broker's machine), RocketMQ PullMessage, and the broker's bulk read
    over gRPC give the same rows (PullMessage carries no CommitLog offset)."""
    path, _ = data
    cols = [
        "topic",
        "queueId",
        "queueOffset",
        "msgId",
        "tags",
        "body",
        "storeTimestamp",
        "transactionId",
    ]

    def rows(**options: str) -> list[tuple]:
        df = read(
            spark, path, topics="B1", startingOffsets='{"B1": {"1": 2}}', tags="odd", **options
        )
        return sorted(tuple(r) for r in df.select(*cols).collect())

    files = rows(readPath="files")
    assert len(files) == 5 + 4 + 5  # queue 1 from offset 2
    assert rows(readPath="pull") == files
    assert rows(readPath="arrow") == files


READ_ERRORS = [
    ({"topics": "B1", "startingOffsets": '{"B1": {"0": 11}}'},
     "option 'startingOffsets': offset 11 of topic B1 queue 0 is past the end of the queue, whose next offset is 10"),
    ({"topics": "B1", "endingOffsets": '{"B1": {"2": 99}}'},
     "option 'endingOffsets': offset 99 of topic B1 queue 2 is past the end of the queue, whose next offset is 10"),
    ({"topics": "B1", "startingOffsets": '{"B1": {"1": 7}}', "endingOffsets": '{"B1": {"1": 3}}'},
     "Beginning offset 7 is after the ending offset 3 for topic B1 queue 1"),
    ({"topics": "B1", "startingOffsets": '{"B2": {"0": 1}}'},
     "option 'startingOffsets' names topic 'B2', which this read does not subscribe to (topics=B1)"),
    ({"topics": "B1", "endingOffsets": '{"B1": {"5": 1}}'},
     "option 'endingOffsets' names queue B1/5, which is not subscribed: this read has queues 0-3 of topic 'B1'"),
    ({"assign": '{"B1": [0]}', "startingOffsets": '{"B1": {"1": 1}}'},
     "option 'startingOffsets' names queue B1/1, which is not subscribed: this read has only queue 0 of topic 'B1'"),
    ({"topics": "B1", "tags": "|| ||"}, "option 'tags': '|| ||' names no tag"),
    ({"topics": "B1", "startingTimestamp": "2000", "endingTimestamp": "1000"},
     "option 'startingTimestamp' (2000) is after 'endingTimestamp' (1000)"),
]  # fmt: skip


def test_reads_that_cannot_mean_anything_are_refused_by_name(spark, data):
    """Offsets past a queue's end, a start after the end, offsets of topics or queues the read
    does not subscribe to, a tag expression naming no tag: each was read as something (rows
    clamped away or none at all); each is now an error naming the option, topic and queue."""
    path, _ = data
    for options, message in READ_ERRORS:
        with pytest.raises(Exception, match=re.escape(message)):
            read(spark, path, **options).collect()
    # the limits themselves are fine: the end of a queue, an empty range
    assert (
        read(
            spark,
            path,
            topics="B1",
            startingOffsets='{"B1": {"0": 10}}',
            endingOffsets='{"B1": {"0": 10}}',
        ).count()
        == 20
    )


def test_a_read_never_creates_a_store_and_a_file_is_not_a_directory(spark, tmp_path):
    missing = tmp_path / "no-store"
    with pytest.raises(
        Exception,
        match=re.escape(
            f"option 'path': store directory {missing} does not exist (a batch read never creates a store"
        ),
    ):
        spark.read.format("rmq").option("path", str(missing)).option("topics", "T").load().collect()
    assert not missing.exists()
    a_file = tmp_path / "a-file"
    a_file.write_text("not a store")
    with pytest.raises(
        Exception, match=re.escape(f"option 'path': {a_file} is a file, not a store directory")
    ):
        spark.read.format("rmq").option("path", str(a_file)).option("topics", "T").load().collect()
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(
        Exception, match=re.escape(f"option 'path': {a_file} is a file, not a store directory")
    ):
        df.write.format("rmq").option("path", str(a_file)).option("topic", "T").mode(
            "append"
        ).save()
    below = a_file / "store"
    with pytest.raises(
        Exception, match=re.escape(f"option 'path': {below} lies under {a_file}, which is a file")
    ):
        df.write.format("rmq").option("path", str(below)).option("topic", "T").mode("append").save()
