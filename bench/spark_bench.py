"""Spark benchmark of format rmq, each figure next to Spark's Parquet file source/sink in the same run.

    python bench/spark_bench.py [--messages N] [--sink-rows N] [--runs R] [--only read|sink]

1. Streaming read: N messages (default 5 000 000) with 100-byte bodies, in 4 queues, read with
   ``spark.readStream.format("rmq")`` (Trigger.AvailableNow) into the ``noop`` sink, against
   ``spark.readStream.parquet`` reading the same rows (the same 14 columns, written from the
   store with pyarrow) into the same sink.  Best of R runs each, after a warm-up.  A third line
   is the ceiling of Spark's Python data source path itself: a trivial source yielding ready-made
   Arrow batches of the same rows (the store read costs nothing there).
2. Sink: the same input (a Parquet stream of 100-byte bodies, 200 000 rows per micro-batch)
   written by the ``rmq`` sink exactly-once (default), at-least-once (``transactional=false``),
   and by Spark's Parquet file sink, each after a warm-up run.

Goal (the issue's compass): rmq read >= 1.0x Parquet.  The store is written directly (no broker
running); the data source starts its embedded broker for planning and reads the files itself.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench._util import Timer, scratch_dir  # noqa: E402

BODY_BYTES = 100
QUEUES = 4
SEGMENT = 1024 * 1024 * 1024


def fill_store(root: str, n: int) -> None:
    from rmq_spark.services.core import BrokerConfig, BrokerCore
    from rmq_spark.store.store import StoreConfig

    distinct = [os.urandom(BODY_BYTES) for _ in range(64)]
    chunk = 100_000
    # written as a broker writes it (index included), so the embedded broker opens it at once
    with BrokerCore(root, BrokerConfig(store=StoreConfig(commitlog_segment_bytes=SEGMENT))) as core:
        s = core.store
        done = 0
        while done < n:
            k = min(chunk, n - done)
            s.put_bodies("Bench", (done // chunk) % QUEUES, [distinct[i % 64] for i in range(k)], {"TAGS": "bench"})
            done += k
        s.flush_all()


def store_to_parquet(root: str, out: str, files_per_queue: int = 2) -> int:
    """The rows the rmq source yields, as Parquet files (the peer reads the same data)."""
    from rmq_spark.store.reader import StoreReader

    os.makedirs(out, exist_ok=True)
    r = StoreReader(root)
    n = 0
    for q in range(QUEUES):
        end = r.max_offset("Bench", q)
        step = -(-end // files_per_queue)
        for i, start in enumerate(range(0, end, step)):
            stop = min(end, start + step)
            batches = [r.read_arrow("Bench", q, s, min(stop, s + 250_000)) for s in range(start, stop, 250_000)]
            table = pa.Table.from_batches(batches)
            pq.write_table(table, os.path.join(out, f"q{q}-{i}.parquet"))
            n += table.num_rows
    r.close()
    return n


def session():  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]").appName("rmq-spark-bench")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "4g")
        .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def timed_query(writer, checkpoint: str) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    shutil.rmtree(checkpoint, ignore_errors=True)
    with Timer() as t:
        q = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(q.exception())
    rows = sum(p["numInputRows"] for p in q.recentProgress)
    return t.seconds, rows


def ceiling_source(store: str):  # type: ignore[no-untyped-def]
    """A Python data source that yields ready Arrow batches of the bench rows: what Spark's Python
    data source path costs by itself, with the same schema and partitions."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    from rmq_spark.datasource.schema import SOURCE_FIELDS

    class Part(InputPartition):
        def __init__(self, queue_id: int, rows: int) -> None:
            self.queue_id, self.rows = queue_id, rows

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"done": 0}

        def latestOffset(self) -> dict:
            return {"done": 1}

        def partitions(self, start: dict, end: dict) -> list:
            if start["done"] >= end["done"]:
                return []
            from rmq_spark.store.reader import StoreReader

            r = StoreReader(store)
            parts = []
            for q in range(QUEUES):
                n = r.max_offset("Bench", q)
                parts += [Part(q, min(650_000, n - s)) for s in range(0, n, 650_000)]
            return parts

        def read(self, p):  # type: ignore[no-untyped-def]
            from rmq_spark.store.reader import StoreReader

            chunk = StoreReader(store).read_arrow("Bench", p.queue_id, 0, 65_000)
            for s in range(0, p.rows, 65_000):
                yield chunk.slice(0, min(65_000, p.rows - s))

        def commit(self, end: dict) -> None:
            pass

    class Ceiling(DataSource):
        @classmethod
        def name(cls) -> str:
            return "rmq_bench_ceiling"

        def schema(self):  # type: ignore[no-untyped-def]
            return SOURCE_FIELDS

        def streamReader(self, schema):  # type: ignore[no-untyped-def]
            return Reader()

    return Ceiling


def bench_read(spark, store: str, parquet: str, work: str, runs: int) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    schema = spark.read.parquet(parquet).schema
    spark.dataSource.register(ceiling_source(store))

    def ours():  # type: ignore[no-untyped-def]
        df = (
            spark.readStream.format("rmq").option("path", store).option("topics", "Bench")
            .option("startingOffsets", "earliest").option("maxRecordsPerPartition", "650000").load()
        )
        return timed_query(df.writeStream.format("noop"), os.path.join(work, "ck-rmq"))

    def peer():  # type: ignore[no-untyped-def]
        df = spark.readStream.schema(schema).parquet(parquet)
        return timed_query(df.writeStream.format("noop"), os.path.join(work, "ck-parquet"))

    def ceiling():  # type: ignore[no-untyped-def]
        df = spark.readStream.format("rmq_bench_ceiling").load()
        return timed_query(df.writeStream.format("noop"), os.path.join(work, "ck-ceiling"))

    best_ours = best_peer = best_ceiling = 0.0
    for run in range(runs + 1):  # run 0 warms the JVM and the Python workers up
        s1, n1 = ours()
        s2, n2 = peer()
        s3, n3 = ceiling()
        if run == 0:
            continue
        best_ours, best_peer, best_ceiling = max(best_ours, n1 / s1), max(best_peer, n2 / s2), max(best_ceiling, n3 / s3)
        print(f"  run {run}: rmq {n1:,} rows in {s1:.2f}s, parquet {n2:,} in {s2:.2f}s, ready batches {n3:,} in {s3:.2f}s")
    return best_ours, best_peer, best_ceiling


def sink_input(directory: str, rows: int) -> None:
    distinct = [os.urandom(BODY_BYTES) for _ in range(64)]
    per_file = 100_000
    os.makedirs(directory, exist_ok=True)
    for i in range(0, rows, per_file):
        k = min(per_file, rows - i)
        pq.write_table(pa.table({"body": pa.array([distinct[j % 64] for j in range(k)], pa.binary())}),
                       os.path.join(directory, f"in-{i // per_file:04d}.parquet"))


def bench_sink(spark, store: str, work: str, rows: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    src, warm = os.path.join(work, "sink-input"), os.path.join(work, "sink-warm")
    sink_input(src, rows)
    sink_input(warm, 20_000)
    schema = spark.read.parquet(src).schema

    def stream(directory: str):  # type: ignore[no-untyped-def]
        return spark.readStream.schema(schema).option("maxFilesPerTrigger", "2").parquet(directory)

    cases = [
        ("rmq exactly-once", lambda d, tag: stream(d).writeStream.format("rmq").option("path", store).option("topic", f"SinkEO{tag}")),
        ("rmq at-least-once", lambda d, tag: stream(d).writeStream.format("rmq").option("path", store)
         .option("topic", f"SinkALO{tag}").option("transactional", "false")),
        ("parquet file sink", lambda d, tag: stream(d).writeStream.format("parquet").option("path", os.path.join(work, f"sink-out{tag}"))),
    ]
    out: dict[str, float] = {}
    for name, make in cases:
        ck = os.path.join(work, "ck-" + name.replace(" ", "-"))
        timed_query(make(warm, "Warm"), ck + "-warm")
        seconds, n = timed_query(make(src, ""), ck)
        out[name] = n / seconds
        print(f"  {name:<20} {n:,} rows in {seconds:.2f}s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=5_000_000)
    ap.add_argument("--sink-rows", type=int, default=400_000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--only", choices=["read", "sink"], help="run one section")
    args = ap.parse_args()
    from rmq_spark.datasource.embedded import stop_broker

    with scratch_dir("spark-bench-") as work:
        store = os.path.join(work, "store")
        parquet = os.path.join(work, "parquet")
        with Timer() as t:
            fill_store(store, args.messages)
        print(f"store: {args.messages:,} messages of {BODY_BYTES} B written in {t.seconds:.1f}s")
        with Timer() as t:
            n = store_to_parquet(store, parquet)
        print(f"parquet peer: the same {n:,} rows (14 columns) written in {t.seconds:.1f}s")
        spark = session()
        try:
            if args.only in (None, "read"):
                print("streaming read to the noop sink (rows/s, best run):")
                ours, peer, ceiling = bench_read(spark, store, parquet, work, args.runs)
                print(f"  rmq source              {ours:>12,.0f} rows/s")
                print(f"  parquet source          {peer:>12,.0f} rows/s")
                print(f"  ready batches (ceiling) {ceiling:>12,.0f} rows/s  ({ceiling / peer:.2f}x parquet)")
                print(f"  ratio rmq / parquet = {ours / peer:.2f}x (goal >= 1.0x); rmq / ceiling = {ours / ceiling:.2f}x")
            if args.only in (None, "sink"):
                print(f"streaming sink, {args.sink_rows:,} rows of {BODY_BYTES} B (rows/s):")
                sink = bench_sink(spark, store, work, args.sink_rows)
                base = sink["parquet file sink"]
                for name, rate in sink.items():
                    print(f"  {name:<20} {rate:>12,.0f} rows/s  {rate / base:.2f}x parquet")
        finally:
            spark.stop()
            stop_broker(store)


if __name__ == "__main__":
    main()
