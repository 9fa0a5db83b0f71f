"""Spark reading a broker whose store files it truly cannot open, as executors on other hosts: the
broker runs in its own mount namespace (``unshare --mount``) with its store on a tmpfs mounted
there, so the store directory the broker reports is an empty directory for this process and for
Spark's.  With ``endpoints`` only and the default ``readPath=auto``, batch and streaming reads,
tag and SQL92 filters, offsets and replays give exactly the rows that were written."""

from __future__ import annotations

import os
import sys

import pytest

from rmq_spark.broker.connector.client import InternalClient
from rmq_spark.broker.testing import BrokerProcess
from rmq_spark.datasource.releases import ADMISSION_CONTROL
from rmq_spark.datasource.testing import produce

pytestmark = pytest.mark.spark

TOPIC = "Far"
N = 600


def _namespaced(root: str) -> list[str]:
    """``python -m rmq_spark.broker`` in a private mount namespace with a tmpfs on ``root``."""
    script = 'mount -t tmpfs -o size=256m tmpfs "$0" && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, root,
            sys.executable, "-m", "rmq_spark.broker"]  # fmt: skip


def expected() -> list[tuple]:
    """(queueId, queueOffset, body, tags, n) of every message :func:`far_broker` wrote."""
    per_queue = [0, 0, 0]
    out = []
    for i in range(N):
        q = i % 3
        out.append(
            (
                q,
                per_queue[q],
                f"m{i}".encode(),
                ("a", "b", None)[i % 3 if i % 2 else 2],
                str(i % 10),
            )
        )
        per_queue[q] += 1
    return out


@pytest.fixture(scope="module")
def far_broker(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("far"))
    store = os.path.join(root, "store")
    b = BrokerProcess(store, log_path=os.path.join(str(tmp_path_factory.mktemp("far-log")), "broker.log"),
                      program=_namespaced(root))  # fmt: skip
    try:
        rows = expected()
        c = InternalClient(b.endpoints)
        try:
            produce(c, TOPIC, [r[2] for r in rows], queueId=[r[0] for r in rows],
                    tags=[r[3] for r in rows], properties=[{"n": r[4]} for r in rows])  # fmt: skip
        finally:
            c.close()
        yield b, store
    finally:
        b.stop()


def read(spark, endpoints: str, **options: str):
    r = spark.read.format("rmq").option("endpoints", endpoints).option("topics", TOPIC)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def rows_of(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.select("queueId", "queueOffset", "body", "tags").collect())


def test_the_store_the_broker_reports_is_not_there_for_spark(far_broker):
    b, store = far_broker
    c = InternalClient(b.endpoints)
    try:
        info = c.info()
    finally:
        c.close()
    assert os.path.realpath(info["store_root"]) == os.path.realpath(store)
    assert os.path.isdir(os.path.dirname(store)) and not os.path.exists(
        os.path.join(store, "commitlog")
    )


def test_batch_reads_filters_offsets_and_replays(spark, far_broker):
    b, _ = far_broker
    want = [r[:4] for r in expected()]
    everything = rows_of(
        read(spark, b.endpoints, startingOffsets="earliest", endingOffsets="latest")
    )
    assert everything == sorted(want)
    assert rows_of(read(spark, b.endpoints, startingOffsets="earliest")) == everything  # a replay
    tagged = rows_of(read(spark, b.endpoints, tags="a || b"))
    assert tagged == sorted(r for r in want if r[3] in ("a", "b"))
    sql = rows_of(read(spark, b.endpoints, sql="n > 6"))
    assert sql == sorted(r[:4] for r in expected() if int(r[4]) > 6)
    ranged = rows_of(read(spark, b.endpoints, startingOffsets='{"Far": {"1": 150}}',
                          endingOffsets='{"Far": {"0": 10, "1": 160, "2": 0}}'))  # fmt: skip
    assert ranged == sorted(
        r for r in want if (r[0] == 0 and r[1] < 10) or (r[0] == 1 and 150 <= r[1] < 160)
    )


def test_streaming_read_in_limited_batches(spark, far_broker, tmp_path):
    b, _ = far_broker
    got: dict[int, list] = {}

    def collect(batch_df, batch_id: int) -> None:
        got[batch_id] = [
            tuple(r) for r in batch_df.select("queueId", "queueOffset", "body", "tags").collect()
        ]

    df = (spark.readStream.format("rmq").option("endpoints", b.endpoints).option("topics", TOPIC)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "250").load())  # fmt: skip
    w = df.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ck"))
    # pyspark 4.0, 4.1 refuse AvailableNow with a limit: there the source applies it per trigger
    q = w.trigger(availableNow=True).start() if ADMISSION_CONTROL else w.start()
    try:
        if ADMISSION_CONTROL:
            # availableNow ends the query by itself; on a loaded machine that may take minutes
            finished = q.awaitTermination(600)
        else:
            q.processAllAvailable()
            finished = True
    finally:
        q.stop()  # a query still running would outlive the test in the shared session
    assert q.exception() is None, q.exception()
    assert finished, f"the availableNow query had not ended after 600 s: {q.lastProgress}"
    assert sorted(r for rows in got.values() for r in rows) == sorted(r[:4] for r in expected())
    assert len([rows for rows in got.values() if rows]) >= 3 and all(
        len(rows) <= 251 for rows in got.values()
    )
