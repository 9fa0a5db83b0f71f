"""The examples of README run as a user runs them (a process each, a store of the test's own) and
print what they promise; no broker of theirs is left running."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rmq_spark.datasource.embedded import stop_broker

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXAMPLES = [
    # script, takes a store directory, lines it must print
    ("store_demo.py", True, ["restart   : queue 1 holds 10000 messages"]),
    (
        "quickstart.py",
        True,
        ["--- micro-batch", "read 5 messages", "the cancelled (rolled-back) one: never seen"],
    ),
    ("unpaid_orders.py", True, ["no payment -> closed", "OrderEvents: ['o-1001', 'o-1003']"]),
    ("transactional_outbox.py", False, ["events published: ['A', 'C']; consistent"]),
    (
        "exactly_once_pipeline.py",
        True,
        ["after the replay of batch 2: 2685 messages (0 duplicates)"],
    ),
    ("avro_bodies.py", True, ["|sensor|celsius|", "|s0    |20.0   |"]),
]


@pytest.mark.parametrize(
    ("script", "takes_store", "expected"), EXAMPLES, ids=[e[0] for e in EXAMPLES]
)
def test_example_runs_and_prints_what_it_promises(script, takes_store, expected, tmp_path):
    store = str(tmp_path / "store")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    cmd = [sys.executable, os.path.join(ROOT, "examples", script)] + (
        [store] if takes_store else []
    )
    try:
        run = subprocess.run(
            cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        left_running = stop_broker(store) if takes_store else False
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    for line in expected:
        assert line in run.stdout, f"{script} did not print {line!r}:\n{run.stdout[-3000:]}"
    assert "SEEN?!" not in run.stdout
    if script == "quickstart.py":
        assert not left_running, "the quickstart left its broker running"
