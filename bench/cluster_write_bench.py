"""Cluster write benchmark: Spark's ``format("rmq")`` sink with ``namesrvAddr`` against the Java
producer sending batches, both to the same two-broker Apache RocketMQ 5.5.0 in the same run.

    python bench/cluster_write_bench.py [--messages N] [--partitions P] [--rounds R]

1. Java: ``bench-batch-producer`` (tests/interop/java): 4 threads share one DefaultMQProducer and
   send N 100-byte messages (tag, key) as ``send(Collection)`` batches of 1,000, the producer
   choosing queues round robin over both brokers (after 5 untimed warm-up batches);
2. Spark: ``df.write.format("rmq").option("namesrvAddr", ...)`` of a cached DataFrame of the same
   N rows (body, tags, keys) in P partitions (default 2: one task per core) on ``local[2]``, timed
   from ``save()`` to its return, after an untimed warm-up write of 20,000 rows.

Each side writes its own topic of 4 queues per broker; the counts stored are checked with
GET_MAX_OFFSET on every queue.  The ratio is Spark's rate over Java's (best round each).  Goal
(issue 20): >= 1.0x.  Needs Java 17 and Maven.  The machine's two cores are shared by the
brokers, the client and (for Spark) its workers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._rocketmq import apache_rocketmq, java_programs

BODY_BYTES = 100
JAVA_BATCH = 1000
JAVA_THREADS = 4


def stored(namesrv: str, topic: str, n: int, wait_s: float = 120.0) -> int:
    """Messages in the topic's ConsumeQueues, once they hold ``n`` (the broker dispatches the
    CommitLog to them in the background: a send returns before; not timed)."""
    from rmq_spark.cluster import ClusterClient

    deadline = time.monotonic() + wait_s
    with ClusterClient(namesrv) as c:
        while True:
            have = sum(
                c.get_max_offset(b, topic, q)
                for b, q in c.route(topic, refresh=True).write_queues()
            )
            if have >= n or time.monotonic() > deadline:
                return have
            time.sleep(0.5)


def run_java(programs, cluster, topic: str, n: int) -> float:
    r = programs.run(
        "bench-batch-producer",
        "--namesrv",
        cluster.namesrv_addr,
        "--group",
        "bench-java",
        "--topic",
        topic,
        "--count",
        str(n),
        "--threads",
        str(JAVA_THREADS),
        "--batch",
        str(JAVA_BATCH),
        "--body-bytes",
        str(BODY_BYTES),
        "--warmup",
        "5",
        home=cluster.home,
        timeout_s=1800,
    )
    ev = r.events("bench")[0]
    if ev.get("retried"):
        print(f"java: {ev['retried']} batches refused and sent again", flush=True)
    if ev["failed"]:
        raise RuntimeError(f"the Java producer failed {ev['failed']} sends")
    return float(ev["seconds"])


def run_spark(spark, df, cluster, topic: str) -> float:
    t0 = time.perf_counter()
    df.write.format("rmq").option("namesrvAddr", cluster.namesrv_addr).option("topic", topic).mode(
        "append"
    ).save()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    n = args.messages

    from _cluster_io import create_topic  # tests/interop, on the path through bench._rocketmq
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    programs = java_programs()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("cluster-write-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "65536")
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    df = (
        spark.range(n, numPartitions=args.partitions).select(
            F.lit(b"x" * BODY_BYTES).alias("body"),
            F.lit("bench").alias("tags"),
            F.format_string("k%d", "id").alias("keys"),
        )
    ).cache()
    df.count()
    with apache_rocketmq(brokers=2, heap="1g") as cluster:
        # untimed warm-up, as the Java program's 5 batches: Python workers started, modules
        # imported, routes fetched, the brokers' JIT warm for both sides
        create_topic(cluster.namesrv_addr, "BenchWarmup", 4)
        run_spark(spark, df.limit(20_000), cluster, "BenchWarmup")
        java_rates, spark_rates = [], []
        for rnd in range(args.rounds):
            jt, st = f"BenchJava{rnd}", f"BenchSpark{rnd}"
            for t in (jt, st):
                create_topic(cluster.namesrv_addr, t, 4)
            order = [("java", jt), ("spark", st)] if rnd % 2 == 0 else [("spark", st), ("java", jt)]
            for side, topic in order:
                secs = (
                    run_java(programs, cluster, topic, n)
                    if side == "java"
                    else run_spark(spark, df, cluster, topic)
                )
                have = stored(cluster.namesrv_addr, topic, n)
                if have < n:
                    raise RuntimeError(f"{side}: {have} of {n} messages stored in {topic}")
                (java_rates if side == "java" else spark_rates).append(n / secs)
                print(
                    f"round {rnd} {side:5s}: {n:,} messages in {secs:.2f} s = {n / secs:,.0f} msg/s "
                    f"({have:,} stored)",
                    flush=True,
                )
        best_java, best_spark = max(java_rates), max(spark_rates)
        print(
            f"Java DefaultMQProducer (batches of {JAVA_BATCH}, {JAVA_THREADS} threads): {best_java:,.0f} msg/s"
        )
        print(
            f"Spark format rmq namesrvAddr ({args.partitions} partitions, local[2]): {best_spark:,.0f} msg/s"
        )
        print(f"ratio Spark / Java: {best_spark / best_java:.2f}x (goal >= 1.0x)")
    spark.stop()


if __name__ == "__main__":
    main()
