"""The cluster sink (``namesrvAddr``) with its streaming driver killed -9 at random points and
restarted from the checkpoint, against a real Apache RocketMQ (two brokers) and rmq-broker's
NameServer: dropping duplicates by message id leaves exactly the input rows (at-least-once with
a deterministic id per row, the README's guarantee), and a message id never names two rows.

The driver runs in a subprocess with its own local[2] SparkSession (killed with its process
group), reading a local rmq store (its embedded broker survives the kills, as a source would).
The random kill points are seeded and printed (``RMQ_KILL_SEED`` repeats a run).
"""

from __future__ import annotations

import collections
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _cluster_io import create_topic, read_topic
from _targets import enabled_targets

from rmq_spark.datasource.embedded import stop_broker
from rmq_spark.datasource.testing import produce

REPO = Path(__file__).resolve().parents[2]
DRIVER = r"""
import sys
from pyspark.sql import SparkSession

path, checkpoint, warehouse, namesrv, topic = sys.argv[1:6]
spark = (
    SparkSession.builder.master("local[2]").appName("rmq-cluster-kill-driver")
    .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
    .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
    .config("spark.driver.memory", "512m").config("spark.sql.warehouse.dir", warehouse)
    # a loaded machine: give the Python workers time to connect back (default 15 s)
    .config("spark.python.authenticate.socketTimeout", "120s")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
q = (
    spark.readStream.format("rmq").option("path", path).option("topics", "KIn")
    .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "150").load()
    .select("body", "tags")
    .writeStream.format("rmq").option("namesrvAddr", namesrv).option("topic", topic)
    .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
)
print("started", flush=True)
q.awaitTermination()
print("done", flush=True)
"""


@pytest.fixture(scope="module", params=enabled_targets())
def sink_target(request: pytest.FixtureRequest):
    return request.getfixturevalue("_apache" if request.param == "apache" else "_rmq_broker")


def _start(script: str, args: list[str], log: str) -> subprocess.Popen:
    env = dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, script, *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_started(
    proc: subprocess.Popen, log: str, runs_before: int, timeout_s: float = 180.0
) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(log, encoding="utf-8", errors="replace") as f:
            if f.read().splitlines().count("started") > runs_before:
                return True
        if proc.poll() is not None:
            return False
        time.sleep(0.1)
    raise AssertionError(f"the driver did not start in {timeout_s:.0f}s")


def _committed(checkpoint: str) -> int:
    d = os.path.join(checkpoint, "commits")
    return len([n for n in os.listdir(d) if n.isdigit()]) if os.path.isdir(d) else 0


def _clear_unplanned_first_batch(checkpoint: str) -> None:
    """As tests/datasource/test_datasource_kill.py: a driver killed while writing ``offsets/0``
    leaves a temp file Spark refuses to start over; no batch was planned, nothing was sent."""
    d = os.path.join(checkpoint, "offsets")
    if os.path.isdir(d) and not any(n.isdigit() for n in os.listdir(d)):
        for n in os.listdir(d):
            os.remove(os.path.join(d, n))


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def test_driver_killed_at_random_points_dedup_by_id_gives_every_row(
    sink_target, names: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("RMQ_KILL_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    print(f"cluster sink kill test seed {seed} (RMQ_KILL_SEED={seed} to repeat)")
    topic = (names[:60] + "_kill").replace("[", "_").replace("]", "_")
    create_topic(sink_target.namesrv_addr, topic, 4)
    store = str(tmp_path / "source")
    os.makedirs(store)
    n = 1200
    produce(store, "KIn", [f"row-{i}" for i in range(n)], tags=[f"t{i % 3}" for i in range(n)])
    script = str(tmp_path / "driver.py")
    Path(script).write_text(DRIVER)
    checkpoint, warehouse, log = (
        str(tmp_path / "ck"),
        str(tmp_path / "wh"),
        str(tmp_path / "driver.log"),
    )
    args = [store, checkpoint, warehouse, sink_target.namesrv_addr, topic]
    kills = []
    try:
        for run in range(3):
            proc = _start(script, args, log)
            if not _wait_started(proc, log, run):
                break
            target, delay_s = _committed(checkpoint) + rng.randint(0, 3), rng.uniform(0.0, 1.5)
            while _committed(checkpoint) < target and proc.poll() is None:
                time.sleep(0.05)
            try:
                proc.wait(timeout=delay_s)
            except subprocess.TimeoutExpired:
                _kill(proc)
                kills.append((_committed(checkpoint), round(delay_s, 2)))
                _clear_unplanned_first_batch(checkpoint)
                continue
            break
        proc = _start(script, args, log)
        try:
            rc = proc.wait(timeout=420)
        finally:
            if proc.poll() is None:
                _kill(proc)
        tail = Path(log).read_text(errors="replace")[-3000:]
        assert rc == 0 and "done" in tail, tail
    finally:
        stop_broker(store)
    print(f"driver killed at (batches in the commit log, seconds after the last one): {kills}")
    rows = read_topic(sink_target.namesrv_addr, topic).select(["msgId", "body", "tags"]).to_pylist()
    by_id: dict[str, set] = collections.defaultdict(set)
    for r in rows:
        by_id[r["msgId"]].add((r["body"], r["tags"]))
    assert all(len(v) == 1 for v in by_id.values()), "a message id names two different rows"
    deduped = sorted(next(iter(v))[0] for v in by_id.values())
    assert deduped == sorted(f"row-{i}".encode() for i in range(n)), f"kills at {kills}"
    print(f"{len(rows)} messages stored for {n} rows ({len(rows) - n} duplicates, dropped by id)")
