"""The exactly-once sink with its driver killed -9 at random points and restarted from the
checkpoint: every input row ends up in the output topic exactly once.

The streaming driver runs in a subprocess with its own local[2] SparkSession (the JVM and Python
workers in its process group, all killed together); the embedded broker it starts lives in its
own session and survives, as a broker would.  The random kill points are seeded and printed.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from rmq_spark.datasource.embedded import stop_broker
from rmq_spark.datasource.testing import client, produce, read_topic

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = r"""
import os, sys
from pyspark.sql import SparkSession

path, checkpoint, warehouse = sys.argv[1:4]
spark = (
    SparkSession.builder.master("local[2]").appName("rmq-kill-driver")
    .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
    .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
    .config("spark.sql.warehouse.dir", warehouse)
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
q = (
    spark.readStream.format("rmq").option("path", path).option("topics", "KIn")
    .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100").load()
    .select("body", "tags")
    .writeStream.format("rmq").option("path", path).option("topic", "KOut")
    .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
)
print("started", flush=True)
q.awaitTermination()
print("done", flush=True)
"""


def start_driver(
    script: str, path: str, checkpoint: str, warehouse: str, log: str
) -> subprocess.Popen:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, script, path, checkpoint, warehouse],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_started(
    proc: subprocess.Popen, log: str, runs_before: int, timeout_s: float = 180.0
) -> bool:
    """Until this run printed ``started`` (its query runs); False if the process ended first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(log, encoding="utf-8", errors="replace") as f:
            if f.read().count("\nstarted") > runs_before:
                return True
        if proc.poll() is not None:
            return False
        time.sleep(0.1)
    raise AssertionError(f"the driver did not start in {timeout_s:.0f}s")


def committed(checkpoint: str) -> int:
    d = os.path.join(checkpoint, "commits")
    return len([n for n in os.listdir(d) if n.isdigit()]) if os.path.isdir(d) else 0


def clear_unplanned_first_batch(checkpoint: str) -> None:
    """Spark 4.3 refuses to start batch 0 when ``offsets/`` holds anything, even the temp file a
    driver killed while writing ``offsets/0`` leaves (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY).
    No batch was planned then, so nothing was written by the sink: the remedy a user applies is
    to remove those temp files, which is what this does."""
    d = os.path.join(checkpoint, "offsets")
    if os.path.isdir(d) and not any(n.isdigit() for n in os.listdir(d)):
        for n in os.listdir(d):
            os.remove(os.path.join(d, n))


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def test_driver_killed_at_random_points_leaves_every_row_exactly_once(store_dir, tmp_path):
    seed = int(os.environ.get("RMQ_KILL_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    print(f"kill test seed {seed} (RMQ_KILL_SEED={seed} to repeat)")
    n = 800
    produce(store_dir, "KIn", [f"row-{i}" for i in range(n)], tags=[f"t{i % 3}" for i in range(n)])
    script = str(tmp_path / "driver.py")
    with open(script, "w") as f:
        f.write(DRIVER)
    checkpoint, warehouse, log = (
        str(tmp_path / "ck"),
        str(tmp_path / "wh"),
        str(tmp_path / "driver.log"),
    )
    kills = []
    try:
        for run in range(3):
            proc = start_driver(script, store_dir, checkpoint, warehouse, log)
            if not wait_started(proc, log, run):
                break
            # somewhere in the micro-batches: after a random number of them, mid-read, mid-send,
            # between the sink's commit and Spark's commit log
            target, delay_s = committed(checkpoint) + rng.randint(0, 2), rng.uniform(0.0, 1.5)
            while committed(checkpoint) < target and proc.poll() is None:
                time.sleep(0.05)
            try:
                proc.wait(timeout=delay_s)
            except subprocess.TimeoutExpired:
                kill_group(proc)
                kills.append((committed(checkpoint), round(delay_s, 2)))
                clear_unplanned_first_batch(checkpoint)
                continue
            break  # it finished before the kill point
        proc = start_driver(script, store_dir, checkpoint, warehouse, log)
        try:
            rc = proc.wait(timeout=420)
        finally:
            if proc.poll() is None:
                kill_group(proc)
        with open(log, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-3000:]
        assert rc == 0 and "done" in tail, tail
        print(f"driver killed at (batches in the commit log, seconds after the last one): {kills}")
        out = collections.Counter(read_topic(store_dir, "KOut").column("body").to_pylist())
        assert sorted(out) == sorted(f"row-{i}".encode() for i in range(n)), f"kills at {kills}"
        assert set(out.values()) == {1}, (
            f"duplicates after kills at {kills}: {[k for k, v in out.items() if v > 1][:5]}"
        )
        c = client(store_dir)
        assert c.offsets(["KOut"])[0]["KOut"] and sum(c.offsets(["KOut"])[0]["KOut"].values()) == n
        c.close()
    finally:
        stop_broker(store_dir)
