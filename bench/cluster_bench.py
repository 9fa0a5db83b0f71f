"""Spark reading a topic of a two-broker Apache RocketMQ vs the Java ``DefaultLitePullConsumer``
draining the same topic, in the same run.

    python bench/cluster_bench.py [--messages 1000000] [--queues 8] [--body-bytes 100] [--runs 2]
                                  [--pull-batch 32] [--max-transfer N]

* A real Apache RocketMQ 5.5.0 from Maven Central's jars (``_rocketmq.apache_rocketmq``): a
  NameServer and brokers ``broker-a``, ``broker-b``; the topic has ``--queues`` queues on each.
  ``--max-transfer N`` sets the brokers' ``maxTransferCountOnMessageInMemory`` (default: the
  broker's own, 32 messages per pull) and raises the byte cap to match; both readers then ask N.
* The messages are sent with the project's cluster client in SEND_BATCH_MESSAGE batches of 200
  (each with a UNIQ_KEY and a tag, as the Java producer's); not timed.
* Spark: ``spark.read.format("rmq").option("namesrvAddr", ...)`` earliest to latest into the
  ``noop`` sink (every column materialised), local[2]; timed from the action's start (routes,
  offsets, planning included) to its end.
* Java: ``bench-lite-pull-consumer`` (tests/interop/java): DefaultLitePullConsumer assigned
  every queue, sought to its first offset, polling until every message arrived (each body
  touched); timed from ``start()`` to the last message, as the program reports.
* Before the runs, Spark reads the first 100 messages of every queue (not timed): its Python
  workers are started and their imports done, as in a running application.
* ``--runs`` alternates them (Spark, Java, Spark, Java, ...) and prints every run, the best of
  each and the ratio Spark / Java in messages per second (goal >= 1.0x).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _rocketmq import apache_rocketmq, java_programs
from _util import Timer
from spark_bench import session

from rmq_spark.cluster import ClusterClient, ClusterError
from rmq_spark.remoting.codes import ResponseCode

TOPIC = "ClusterBench"
BATCH = 200


def fill(namesrv: str, brokers: list[str], queues: int, n: int, body_bytes: int) -> None:
    body = b"x" * body_bytes
    prefix = uuid.uuid4().hex[:16].upper()
    slots = [(b, q) for b in brokers for q in range(queues)]
    with ClusterClient(namesrv, timeout_s=60) as c:
        sent = 0
        i = 0
        while sent < n:
            b, q = slots[i % len(slots)]
            k = min(BATCH, n - sent)
            batch = [
                (body, {"TAGS": "bench", "UNIQ_KEY": f"{prefix}{sent + j:016X}"}, 0)
                for j in range(k)
            ]
            for attempt in range(
                50
            ):  # SYSTEM_BUSY (flow control): again later, as the Java producer
                try:
                    c.send_batch(b, "bench-p", TOPIC, q, batch)
                    break
                except ClusterError as e:
                    if (
                        e.code not in (ResponseCode.SYSTEM_BUSY, ResponseCode.SYSTEM_ERROR)
                        or attempt == 49
                    ):
                        raise
                    time.sleep(0.2)
            sent += k
            i += 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--body-bytes", type=int, default=100)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--pull-batch", type=int, default=32)
    ap.add_argument("--max-transfer", type=int, default=0)
    a = ap.parse_args()
    config = {}
    pull_batch = a.pull_batch
    if a.max_transfer:
        config = {
            "maxTransferCountOnMessageInMemory": str(a.max_transfer),
            "maxTransferBytesOnMessageInMemory": str(a.max_transfer * (a.body_bytes + 400)),
        }
        pull_batch = a.max_transfer
    programs = java_programs()
    spark = session()
    with apache_rocketmq(brokers=2, heap="1g", broker_config=config) as cluster:
        ns = cluster.namesrv_addr
        brokers = list(cluster.broker_names)
        with ClusterClient(ns) as c:
            for b in brokers:
                c.create_topic(cluster.broker_addr(b), TOPIC, a.queues)
        cluster.wait_route(TOPIC)
        with Timer() as t:
            fill(ns, brokers, a.queues, a.messages, a.body_bytes)
        print(
            f"sent {a.messages:,} messages ({a.body_bytes} B bodies) to {brokers} x {a.queues} queues "
            f"in {t.seconds:.1f}s; pulls ask {pull_batch} messages",
            flush=True,
        )
        # warm-up, not timed: Spark's Python workers started and imports done, as in a running app
        # (the Java side's JVM start is outside its timing too)
        warm = json.dumps({TOPIC: {b: {str(q): 100 for q in range(a.queues)} for b in brokers}})
        (
            spark.read.format("rmq")
            .option("namesrvAddr", ns)
            .option("topics", TOPIC)
            .option("endingOffsets", warm)
            .load()
            .write.format("noop")
            .mode("append")
            .save()
        )
        spark_runs, java_runs = [], []
        for run in range(a.runs):
            df = (
                spark.read.format("rmq")
                .option("namesrvAddr", ns)
                .option("topics", TOPIC)
                .option("pullBatchSize", str(pull_batch))
                .load()
            )
            with Timer() as t:
                df.write.format("noop").mode("append").save()
            rows = (
                spark.read.format("rmq")
                .option("namesrvAddr", ns)
                .option("topics", TOPIC)
                .load()
                .count()
                if run == 0
                else a.messages
            )
            assert rows == a.messages, f"Spark read {rows} rows, not {a.messages}"
            spark_runs.append(a.messages / t.seconds)
            print(
                f"run {run}: Spark rmq (namesrvAddr) {a.messages / t.seconds:12,.0f} msg/s  ({t.seconds:.2f}s)",
                flush=True,
            )
            res = programs.run(
                "bench-lite-pull-consumer",
                "--namesrv",
                ns,
                "--group",
                f"bench-lite-{run}-{time.time_ns()}",
                "--topic",
                TOPIC,
                "--count",
                str(a.messages),
                "--pull-batch",
                str(pull_batch),
                home=cluster.home,
                timeout_s=900,
            )
            (ev,) = res.events("bench")
            assert ev["messages"] >= a.messages, ev
            java_runs.append(ev["messages"] / ev["seconds"])
            print(
                f"run {run}: Java DefaultLitePullConsumer {java_runs[-1]:12,.0f} msg/s  ({ev['seconds']:.2f}s)",
                flush=True,
            )
        best_s, best_j = max(spark_runs), max(java_runs)
        print(
            f"best: Spark {best_s:,.0f} msg/s, Java {best_j:,.0f} msg/s, ratio Spark/Java {best_s / best_j:.2f}x "
            f"({a.messages:,} messages, 2 brokers x {a.queues} queues, pulls of {pull_batch})"
        )
    spark.stop()


if __name__ == "__main__":
    main()
