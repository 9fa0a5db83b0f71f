"""Delay and transactions at micro-batch boundaries (design.md 3.4), seen by a running query:

* a delayed message (delay level, delivery time, or an exactly-once sink row with a delay) is in
  no micro-batch whose ``current_timestamp()`` is before its delivery time, and in the first one
  planned after it (give or take the broker's precision);
* a half message is in no micro-batch planned before its commit; a rolled-back one in none.
"""

from __future__ import annotations

import threading
import time

import pytest
from pyspark.sql import functions as F

from rmq_spark.datasource.embedded import stop_broker
from rmq_spark.datasource.testing import client, produce

pytestmark = pytest.mark.spark

PRECISION_MS = 100  # the broker's delivery precision
PLANNING_SLACK_MS = 400  # a batch's timestamp is taken just before its offsets are planned
LATE_SLACK_MS = 3000  # delivery lag + one trigger, on a busy 2-core machine


def test_delay_and_transactions_at_batch_boundaries(spark, store_dir, tmp_path):
    path = store_dir
    flags = (("delay-levels", "1s 2s 3s"),)
    c = client(path, flags=flags)
    batches: list[tuple[int, int, list[tuple]]] = []  # (batch id, batch timestamp ms, rows)
    lock = threading.Lock()

    def collect(df, batch_id: int) -> None:
        rows = df.select(
            F.col("body").cast("string"),
            (F.unix_micros(F.current_timestamp()) / 1000).cast("long"),
            (F.unix_micros("deliverTimestamp") / 1000).cast("long"),
        ).collect()
        if rows:
            with lock:
                batches.append((batch_id, rows[0][1], [(r[0], r[2]) for r in rows]))

    produce(c, "Sem", ["warm-up"])
    q = (
        spark.readStream.format("rmq")
        .option("path", path)
        .option("topics", "Sem")
        .option("startingOffsets", "earliest")
        .option("broker.delay-levels", "1s 2s 3s")
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while not batches and time.monotonic() < deadline:  # the query is up and reading
            time.sleep(0.1)
        t0 = int(time.time() * 1000)
        produce(c, "Sem", ["normal"])
        produce(c, "Sem", ["level1", "level2"], delayLevel=[1, 2])
        produce(c, "Sem", ["timer"], deliverTimeMs=[t0 + 1500])
        # an exactly-once batch write whose rows ask for a delay level: delayed after commit
        spark.createDataFrame([("sink-delayed", 1)], "body string, delayLevel int").write.format(
            "rmq"
        ).option("path", path).option("topic", "Sem").mode("append").save()
        committed = c.send(
            _rows("Sem", ["half-committed"]),
            {"mode": "half", "query_id": "txq", "batch_id": 0, "attempt": "A"},
        )
        aborted = c.send(
            _rows("Sem", ["half-rolled-back"]),
            {"mode": "half", "query_id": "txq", "batch_id": 1, "attempt": "B"},
        )
        time.sleep(1.0)
        commit_ms = int(time.time() * 1000)
        c.commit_batch("txq", 0, "A", [committed["offsets"]])
        c.abort_batch("txq", 1, "B", [aborted["offsets"]])
        want = {"normal", "level1", "level2", "timer", "sink-delayed", "half-committed"}
        while time.monotonic() < deadline:
            with lock:
                seen = {r[0] for _, _, rows in batches for r in rows}
            if want <= seen:
                break
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        q.stop()
        c.close()
        stop_broker(path)
    assert q.exception() is None
    appear = {body: (bid, ts, deliver) for bid, ts, rows in batches for body, deliver in rows}
    assert want <= set(appear), f"missing {want - set(appear)}"
    assert "half-rolled-back" not in appear
    assert sum(1 for _, _, rows in batches for r in rows if r[0] in want) == len(want)  # each once
    for body in ("level1", "level2", "timer", "sink-delayed"):
        bid, ts, deliver = appear[body]
        assert deliver is not None, body
        assert deliver >= t0 + (1500 if body == "timer" else 1000) - PRECISION_MS, body
        # not in a batch planned before its delivery time ...
        assert ts >= deliver - PRECISION_MS - PLANNING_SLACK_MS, (body, ts, deliver)
        # ... and in the first one planned after it
        for other_bid, other_ts, _ in batches:
            if other_bid < bid:
                assert other_ts < deliver + LATE_SLACK_MS, (body, other_bid, other_ts, deliver)
    assert appear["level2"][2] - appear["level1"][2] >= 1000 - PRECISION_MS
    bid, ts, _ = appear["half-committed"]
    assert ts >= commit_ms - PLANNING_SLACK_MS
    assert appear["normal"][1] < commit_ms  # seen long before the commit


def _rows(topic: str, bodies: list[str]):
    import pyarrow as pa

    return pa.table({"topic": [topic] * len(bodies), "body": [b.encode() for b in bodies]})
