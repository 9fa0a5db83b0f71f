"""The embedded broker: one per store, shared by every process that asks, gone when idle; a
broker the user started is used through ``endpoints`` and left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from rmq_spark.datasource.embedded import ensure_broker, pid_alive, read_record, stop_broker
from rmq_spark.datasource.testing import produce

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_one_broker_per_store_shared_across_processes(store_dir):
    code = "import sys; from rmq_spark.datasource.embedded import ensure_broker; print(ensure_broker(sys.argv[1], (), 30))"
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, store_dir], stdout=subprocess.PIPE, text=True, cwd=ROOT
            )
            for _ in range(3)
        ]
        endpoints = {p.communicate(timeout=120)[0].strip() for p in procs}
        assert len(endpoints) == 1 and all(p.returncode == 0 for p in procs)
        rec = read_record(store_dir)
        assert rec is not None and rec.endpoint in endpoints and pid_alive(rec.pid)
        assert ensure_broker(store_dir) == rec.endpoint  # this process reuses it too
    finally:
        stop_broker(store_dir)
    assert rec is not None and wait_gone(rec.pid, 15)


def test_an_idle_embedded_broker_exits_and_is_started_again_on_demand(store_dir):
    ep = ensure_broker(store_dir, (), idle_exit_s=1.0)
    first = read_record(store_dir)
    assert first is not None
    try:
        assert wait_gone(first.pid, 30), "the idle broker did not exit"
        produce(store_dir, "Again", ["x"])  # needs the broker: started again
        second = read_record(store_dir)
        assert second is not None and second.pid != first.pid and pid_alive(second.pid)
        assert second.endpoint != ep or second.pid != first.pid
    finally:
        stop_broker(store_dir)


@pytest.mark.spark
def test_queries_with_only_a_path_leave_no_broker_behind(spark, store_dir):
    produce(store_dir, "P", [f"m{i}" for i in range(5)])
    stop_broker(store_dir)
    rows = (
        spark.read.format("rmq")
        .option("path", store_dir)
        .option("topics", "P")
        .option("embeddedIdleExitS", "2")
        .load()
        .count()
    )
    assert rows == 5
    rec = read_record(store_dir)
    assert rec is not None
    try:
        assert wait_gone(rec.pid, 30), "the embedded broker is still running"
    finally:
        stop_broker(store_dir)


@pytest.mark.spark
def test_a_broker_started_by_the_user_is_used_and_left_running(spark, store_dir, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmq_spark.broker", "--store", store_dir, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("rmq-broker listening on"), line
        endpoint = line.split()[3]
        from rmq_spark.broker.connector.client import InternalClient

        with InternalClient(endpoint) as c:
            produce(c, "U", ["a", "b"])
        df = spark.read.format("rmq").option("endpoints", endpoint).option("topics", "U").load()
        assert sorted(r.body for r in df.collect()) == [b"a", b"b"]
        spark.createDataFrame([("c",)], "body string").write.format("rmq").option(
            "endpoints", endpoint
        ).option("topic", "U").mode("append").save()
        again = spark.read.format("rmq").option("endpoints", endpoint).option("topics", "U").load()
        assert again.count() == 3
        assert read_record(store_dir) is None  # nothing embedded was started
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        proc.stdout.close()  # type: ignore[union-attr]
    assert code == 0
