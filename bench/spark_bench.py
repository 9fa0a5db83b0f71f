"""Spark benchmark of format rmq, each figure next to its peers in the same run: Spark's Parquet
file source/sink and a single-node Kafka broker with Spark's Kafka source/sink.

    python bench/spark_bench.py [--messages N] [--sink-rows N] [--runs R] [--only read|remote|sink]
                                [--peers parquet,kafka]

1. Streaming read: N messages (default 5 000 000) with 100-byte bodies, in 4 queues, read with
   ``spark.readStream.format("rmq")`` (Trigger.AvailableNow) into the ``noop`` sink, against
   ``spark.readStream.parquet`` reading the same rows (the same 14 columns, written from the
   store with pyarrow) into the same sink.  Best of R runs each, after a warm-up.  A third line
   is the ceiling of Spark's Python data source path itself: a trivial source yielding ready-made
   Arrow batches of the same rows (the store read costs nothing there).
2. Reads against Kafka: the same N messages (key, value = body) in a topic of 4 partitions, each
   in the partition numbered like its rmq queue, written there by Spark's batch Kafka sink from the
   Parquet peer's files.  Streaming read (Trigger.AvailableNow, ``noop`` sink) and batch read
   (``spark.read`` earliest to latest, ``.write.format("noop")``) of rmq and of Kafka, interleaved,
   best of R runs after a warm-up; Kafka reads with ``minPartitions`` equal to rmq's partition count.
3. Remote read: the same N messages served by a broker whose store Spark cannot open (the broker
   in its own mount namespace with a copy of the store on a tmpfs mounted there, as on another
   host), read with ``endpoints`` only (``readPath=auto`` takes the broker's bulk Arrow stream),
   against the local-files read of the same messages, interleaved, best of R runs.
4. Sink: the same input (a Parquet stream of 100-byte bodies, 200 000 rows per micro-batch,
   1 000 000 rows by default) written by the ``rmq`` sink exactly-once (default), at-least-once
   (``transactional=false``), by Spark's Parquet file sink and by Spark's Kafka sink (``value`` =
   body, the connector's default producer settings), best of R runs after a warm-up, the cases
   taking turns.  Beside them, the ceiling of any sink written with Spark's Python data source
   API: a sink whose tasks drop the Arrow batches they get.  Then the same three with each row
   carrying its own tags, keys and a user property (``+props``).
A summary table ends the run: each figure, its peer, the ratio rmq / peer and the goal.
``--only sink`` makes only the sink's input (no store of N messages, Parquet copy or Kafka topic).

Goals (the issue's compass): rmq streaming read >= 1.0x Parquet and >= 1.0x Kafka; rmq batch read
>= 1.0x Kafka; rmq at-least-once sink >= 1.0x Kafka's sink and >= 1.0x Parquet's file sink;
exactly-once >= 0.5x at-least-once, shown beside the peers.  The
store is written directly (no broker running); the data source starts its embedded broker for
planning and reads the files itself.

Kafka (``--peers`` without ``kafka`` skips it; ``make test`` never needs it): ``bench/_kafka.py``
resolves ``org.apache.kafka:kafka_2.13`` with Maven once (jars and the resolved classpath kept in
the project's cache, ``~/.cache/rmq_spark/`` or ``$RMQ_SPARK_CACHE``: ``m2/`` and
``kafka_2.13-<v>/``), formats a KRaft log dir and starts the broker on free local ports, stopping
it when the bench ends.  Spark gets
``spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:<pyspark's version>`` (the
newest release not newer than pyspark when Maven Central lacks that one); Ivy downloads it once
into the same cache (``ivy/``, ``spark.jars.ivy``).  The bench prints where each came from.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa
import pyarrow.parquet as pq

from bench._util import Timer, scratch_dir

BODY_BYTES = 100
QUEUES = 4
SEGMENT = 1024 * 1024 * 1024


def fill_store(root: str, n: int) -> None:
    from rmq_spark.services.config import BrokerConfig
    from rmq_spark.services.core import BrokerCore
    from rmq_spark.store.store import StoreConfig

    distinct = [os.urandom(BODY_BYTES) for _ in range(64)]
    chunk = 100_000
    # written as a broker writes it (index included), so the embedded broker opens it at once
    with BrokerCore(root, BrokerConfig(store=StoreConfig(commitlog_segment_bytes=SEGMENT))) as core:
        s = core.store
        done = 0
        while done < n:
            k = min(chunk, n - done)
            s.put_bodies(
                "Bench",
                (done // chunk) % QUEUES,
                [distinct[i % 64] for i in range(k)],
                {"TAGS": "bench"},
            )
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
        step = max(1, -(-end // files_per_queue))
        for i, start in enumerate(range(0, end, step)):
            stop = min(end, start + step)
            batches = [
                r.read_arrow("Bench", q, s, min(stop, s + 250_000))
                for s in range(start, stop, 250_000)
            ]
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
        SparkSession.builder.master("local[2]")
        .appName("rmq-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "4g")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
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
            spark.readStream.format("rmq")
            .option("path", store)
            .option("topics", "Bench")
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerPartition", "650000")
            .load()
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
        best_ours, best_peer, best_ceiling = (
            max(best_ours, n1 / s1),
            max(best_peer, n2 / s2),
            max(best_ceiling, n3 / s3),
        )
        print(
            f"  run {run}: rmq {n1:,} rows in {s1:.2f}s, parquet {n2:,} in {s2:.2f}s, ready batches {n3:,} in {s3:.2f}s"
        )
    return best_ours, best_peer, best_ceiling


def remote_broker(store: str, work: str):  # type: ignore[no-untyped-def]
    """A broker serving a copy of ``store`` that this process and Spark cannot open: it runs in
    its own mount namespace (``unshare --mount``) with the copy on a tmpfs mounted there, as a
    broker on another host would be.  Returns the running :class:`BrokerProcess`."""
    from rmq_spark.broker.testing import BrokerProcess

    hidden = os.path.join(work, "hidden")
    os.makedirs(hidden, exist_ok=True)
    script = 'mount -t tmpfs -o size=16g tmpfs "$0" && cp -a "$1" "$0/store" && shift && exec "$@"'
    program = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, hidden, store,
               sys.executable, "-m", "rmq_spark.broker"]  # fmt: skip
    return BrokerProcess(os.path.join(hidden, "store"), program=program, start_timeout_s=300,
                         log_path=os.path.join(work, "hidden-broker.log"))  # fmt: skip


def bench_remote_read(
    spark, store: str, endpoints: str, work: str, runs: int
) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Streaming read of the same messages through the broker only (``endpoints``, files out of
    reach: ``readPath=auto`` reads the broker's bulk Arrow stream) and from the files (``path``)."""

    def read(option: str, value: str, name: str):  # type: ignore[no-untyped-def]
        df = (
            spark.readStream.format("rmq")
            .option(option, value)
            .option("topics", "Bench")
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerPartition", "650000")
            .load()
        )
        return timed_query(df.writeStream.format("noop"), os.path.join(work, "ck-" + name))

    best_remote = best_files = 0.0
    for run in range(runs + 1):  # run 0 warms up
        s1, n1 = read("endpoints", endpoints, "remote")
        s2, n2 = read("path", store, "files")
        if run == 0:
            continue
        best_remote, best_files = max(best_remote, n1 / s1), max(best_files, n2 / s2)
        print(f"  run {run}: endpoints only {n1:,} rows in {s1:.2f}s, files {n2:,} in {s2:.2f}s")
    return best_remote, best_files


def sink_input(directory: str, rows: int, with_properties: bool = False) -> None:
    """``rows`` rows of 100-byte bodies in Parquet files of 100 000 rows; ``with_properties``: each
    row also with its own tags, keys and a user property (the sink encodes them column-wise)."""
    distinct = [os.urandom(BODY_BYTES) for _ in range(64)]
    per_file = 100_000
    os.makedirs(directory, exist_ok=True)
    for i in range(0, rows, per_file):
        k = min(per_file, rows - i)
        cols = {"body": pa.array([distinct[j % 64] for j in range(k)], pa.binary())}
        if with_properties:
            cols["tags"] = pa.array([f"tag{j % 8}" for j in range(k)])
            cols["keys"] = pa.array(
                [[f"order-{i + j}", f"customer-{j % 1000}"] for j in range(k)],
                pa.list_(pa.string()),
            )
            cols["properties"] = pa.array(
                [[("region", f"r{j % 16}")] for j in range(k)], pa.map_(pa.string(), pa.string())
            )
        pq.write_table(pa.table(cols), os.path.join(directory, f"in-{i // per_file:04d}.parquet"))


def null_sink():  # type: ignore[no-untyped-def]
    """A Python data source sink whose tasks read their Arrow batches and drop them: what Spark's
    Python data source sink path costs by itself (the ceiling of any sink written with it)."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

    class Writer(DataSourceStreamArrowWriter):
        def write(self, iterator):  # type: ignore[no-untyped-def]
            for _batch in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages, batchId) -> None:  # type: ignore[no-untyped-def]
            pass

        def abort(self, messages, batchId) -> None:  # type: ignore[no-untyped-def]
            pass

    class NullSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "rmq_bench_null"

        def streamWriter(self, schema, overwrite):  # type: ignore[no-untyped-def]
            return Writer()

    return NullSink


def bench_sink(spark, store: str, work: str, rows: int, runs: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Each sink over the same input, best of ``runs`` after a warm-up; the cases run in turn, run
    after run, so a slow moment of the machine does not fall on one of them only."""
    spark.dataSource.register(null_sink())
    inputs = {"": os.path.join(work, "sink-input"), "props": os.path.join(work, "sink-input-props")}
    sink_input(inputs[""], rows)
    sink_input(inputs["props"], rows, with_properties=True)
    warm = {"": os.path.join(work, "sink-warm"), "props": os.path.join(work, "sink-warm-props")}
    sink_input(warm[""], 20_000)
    sink_input(warm["props"], 20_000, with_properties=True)

    def stream(directory: str):  # type: ignore[no-untyped-def]
        schema = spark.read.parquet(directory).schema
        return spark.readStream.schema(schema).option("maxFilesPerTrigger", "2").parquet(directory)

    def rmq(kind: str, transactional: bool):  # type: ignore[no-untyped-def]
        return lambda d, tag: (stream(d).writeStream.format("rmq").option("path", store)
                               .option("topic", f"Sink{'EO' if transactional else 'ALO'}{kind}{tag}")
                               .option("transactional", str(transactional).lower()))  # fmt: skip

    def parquet(d, tag):  # type: ignore[no-untyped-def]
        return (
            stream(d)
            .writeStream.format("parquet")
            .option("path", os.path.join(work, f"sink-out-{tag}"))
        )

    cases = [
        ("rmq exactly-once", "", rmq("", True)),
        ("rmq at-least-once", "", rmq("", False)),
        ("parquet file sink", "", parquet),
        ("python null sink", "", lambda d, tag: stream(d).writeStream.format("rmq_bench_null")),
        ("rmq exactly-once +props", "props", rmq("P", True)),
        ("rmq at-least-once +props", "props", rmq("P", False)),
        ("parquet +props", "props", parquet),
    ]
    best: dict[str, float] = {}
    for run in range(runs + 1):  # run 0 warms up
        for name, kind, make in cases:
            ck = os.path.join(work, f"ck-{name.replace(' ', '-')}-{run}")
            src = warm[kind] if run == 0 else inputs[kind]
            seconds, n = timed_query(make(src, f"{kind}{run}"), ck)
            if run:
                best[name] = max(best.get(name, 0.0), n / seconds)
                print(f"  run {run}: {name:<26} {n:,} rows in {seconds:.2f}s")
    return best


KAFKA_TOPIC = "Bench"


def kafka_session(package: str, ivy: str):  # type: ignore[no-untyped-def]
    """The bench's session with Spark's Kafka connector on its classpath (``spark.jars.packages``,
    given to the JVM launcher: Ivy downloads the jars once and keeps them in ``ivy``,
    ``spark.jars.ivy``)."""
    args = os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--packages {package} --conf spark.jars.ivy={ivy} {args}"
    return session()


def fill_kafka(spark, parquet: str, bootstrap: str) -> int:  # type: ignore[no-untyped-def]
    """The Parquet peer's rows into the Kafka topic with Spark's batch Kafka sink: body as the value,
    keys as the key, each row in the partition numbered like its rmq queue."""
    df = spark.read.parquet(parquet).selectExpr(
        "CAST(keys AS BINARY) AS key", "body AS value", "queueId AS partition"
    )
    (
        df.write.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", KAFKA_TOPIC)
        .option("kafka.linger.ms", "20")
        .option("kafka.batch.size", "1048576")
        .save()
    )
    return int(df.count())


def kafka_partitions(messages: int) -> int:
    """Spark partitions for the Kafka read (``minPartitions``): as many as the rmq source plans with
    ``maxRecordsPerPartition=650000`` over the 4 queues, so both read with the same parallelism."""
    per_queue = -(-messages // QUEUES)
    return QUEUES * max(1, -(-per_queue // 650_000))


def bench_kafka_read(
    spark, store: str, bootstrap: str, work: str, runs: int, splits: int
) -> dict[str, tuple[float, float]]:  # type: ignore[no-untyped-def]
    """Streaming and batch reads of the same rows from rmq and from Kafka, interleaved; best of R
    runs after a warm-up.  Returns {"streaming read": (rmq, kafka), "batch read": (rmq, kafka)} in rows/s."""

    def kafka(reader):  # type: ignore[no-untyped-def]
        return (
            reader.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", KAFKA_TOPIC)
            .option("startingOffsets", "earliest")
            .option("minPartitions", str(splits))
        )

    def rmq(reader):  # type: ignore[no-untyped-def]
        return (
            reader.format("rmq")
            .option("path", store)
            .option("topics", "Bench")
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerPartition", "650000")
        )

    def stream(make, name: str) -> tuple[float, int]:
        return timed_query(
            make(spark.readStream).load().writeStream.format("noop"),
            os.path.join(work, f"ck-{name}"),
        )

    def batch(df) -> tuple[float, int]:  # type: ignore[no-untyped-def]
        with Timer() as t:
            df.write.format("noop").mode("overwrite").save()
        return t.seconds, 0

    rows = rmq(spark.read).load().count()
    kafka_rows = kafka(spark.read).option("endingOffsets", "latest").load().count()
    if kafka_rows != rows:
        raise RuntimeError(f"the peers hold different rows: rmq {rows:,}, kafka {kafka_rows:,}")
    best = {"streaming read": [0.0, 0.0], "batch read": [0.0, 0.0]}
    for run in range(runs + 1):  # run 0 warms up
        s1, n1 = stream(rmq, "rmq-vs-kafka")
        s2, n2 = stream(kafka, "kafka")
        s3, _ = batch(rmq(spark.read).load())
        s4, _ = batch(kafka(spark.read).option("endingOffsets", "latest").load())
        if run == 0:
            continue
        for key, rates in (
            ("streaming read", (n1 / s1, n2 / s2)),
            ("batch read", (rows / s3, rows / s4)),
        ):
            best[key] = [max(b, r) for b, r in zip(best[key], rates, strict=True)]
        print(
            f"  run {run}: stream rmq {n1:,} rows in {s1:.2f}s, kafka {n2:,} in {s2:.2f}s; "
            f"batch rmq {rows:,} in {s3:.2f}s, kafka in {s4:.2f}s"
        )
    return {k: (v[0], v[1]) for k, v in best.items()}


def bench_kafka_sink(spark, kafka, work: str) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """Spark's Kafka sink over the sink section's input (written by ``bench_sink``), body as the value,
    into a topic of 4 partitions; after a warm-up run.  Producer settings are the connector's defaults."""
    src, warm = os.path.join(work, "sink-input"), os.path.join(work, "sink-warm")
    schema = spark.read.parquet(src).schema
    for topic in ("SinkWarm", "Sink"):
        kafka.create_topic(topic, QUEUES)

    def make(directory: str, topic: str):  # type: ignore[no-untyped-def]
        df = spark.readStream.schema(schema).option("maxFilesPerTrigger", "2").parquet(directory)
        return (
            df.selectExpr("body AS value")
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap)
            .option("topic", topic)
        )

    timed_query(make(warm, "SinkWarm"), os.path.join(work, "ck-kafka-sink-warm"))
    seconds, n = timed_query(make(src, "Sink"), os.path.join(work, "ck-kafka-sink"))
    print(f"  {'kafka sink':<20} {n:,} rows in {seconds:.2f}s")
    return n / seconds, n


def print_summary(rows: list[tuple[str, str, float, str, float, str]]) -> None:
    """One table: figure, rmq's line and rate, the peer's line and rate, the ratio and its goal."""
    print("summary (rows/s; ratio = rmq / peer):")
    print(
        f"  {'figure':<16} {'rmq':<20} {'rows/s':>11}   {'peer':<18} {'rows/s':>11} {'ratio':>7}  goal"
    )
    for figure, ours, ours_rate, peer, peer_rate, goal in rows:
        print(
            f"  {figure:<16} {ours:<20} {ours_rate:>11,.0f}   {peer:<18} {peer_rate:>11,.0f} {ours_rate / peer_rate:>6.2f}x  {goal}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=5_000_000)
    ap.add_argument("--sink-rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--only", choices=["read", "remote", "sink"], help="run one section")
    ap.add_argument(
        "--peers",
        default="parquet,kafka",
        help="comma-separated peers of the read sections: parquet, kafka (default both)",
    )
    args = ap.parse_args()
    peers = {p.strip() for p in args.peers.split(",") if p.strip()}
    if not peers <= {"parquet", "kafka"}:
        ap.error(
            f"--peers: unknown peer(s) {sorted(peers - {'parquet', 'kafka'})}; known: parquet, kafka"
        )
    from rmq_spark.datasource.embedded import stop_broker

    summary: list[tuple[str, str, float, str, float, str]] = []
    with scratch_dir("spark-bench-") as work, contextlib.ExitStack() as stack:
        store = os.path.join(work, "store")
        parquet = os.path.join(work, "parquet")
        reads = args.only in (None, "read", "remote")  # the sink section makes its own input
        if reads:
            with Timer() as t:
                fill_store(store, args.messages)
            print(
                f"store: {args.messages:,} messages of {BODY_BYTES} B written in {t.seconds:.1f}s"
            )
            with Timer() as t:
                n = store_to_parquet(store, parquet)
            print(f"parquet peer: the same {n:,} rows (14 columns) written in {t.seconds:.1f}s")
        else:
            os.makedirs(store)
        kafka = None
        if "kafka" in peers:
            from bench._kafka import (
                KAFKA_VERSION,
                KafkaBroker,
                broker_classpath,
                cache_dir,
                ivy_dir,
                maven_repo,
                spark_kafka_package,
            )

            _, cached = broker_classpath()
            print(
                f"kafka peer: kafka_2.13:{KAFKA_VERSION} classpath {'from the cache' if cached else 'resolved with mvn'} "
                f"in {cache_dir()} (jars in {maven_repo()})"
            )
            kafka = stack.enter_context(KafkaBroker.start(os.path.join(work, "kafka")))
            print(
                f"kafka peer: single-node KRaft broker on {kafka.bootstrap}, serving {kafka.startup_s:.1f}s after launch"
            )
            kafka.create_topic(KAFKA_TOPIC, QUEUES)
            package, note = spark_kafka_package(pyspark_version())
            if note:
                print(f"kafka peer: {note}")
            print(
                f"kafka peer: spark.jars.packages={package} (Ivy downloads it once into {ivy_dir()})"
            )
            spark = kafka_session(package, ivy_dir())
        else:
            spark = session()
        try:
            if kafka is not None and args.only in (None, "read"):
                with Timer() as t:
                    n = fill_kafka(spark, parquet, kafka.bootstrap)
                print(
                    f"kafka peer: the same {n:,} messages (key, value = body) in topic {KAFKA_TOPIC}, "
                    f"{QUEUES} partitions, written by Spark's Kafka sink in {t.seconds:.1f}s"
                )
            if args.only in (None, "read") and "parquet" in peers:
                print("streaming read to the noop sink (rows/s, best run):")
                ours, peer, ceiling = bench_read(spark, store, parquet, work, args.runs)
                print(f"  rmq source              {ours:>12,.0f} rows/s")
                print(f"  parquet source          {peer:>12,.0f} rows/s")
                print(
                    f"  ready batches (ceiling) {ceiling:>12,.0f} rows/s  ({ceiling / peer:.2f}x parquet)"
                )
                print(
                    f"  ratio rmq / parquet = {ours / peer:.2f}x (goal >= 1.0x); rmq / ceiling = {ours / ceiling:.2f}x"
                )
                summary.append(
                    ("streaming read", "rmq source", ours, "parquet source", peer, ">= 1.0x")
                )
                summary.append(
                    ("streaming read", "rmq source", ours, "ready batches", ceiling, "(ceiling)")
                )
            if args.only in (None, "read", "remote"):
                remote = stack.enter_context(
                    contextlib.closing(_Stopping(remote_broker(store, work)))
                )
                print(
                    f"remote read (a broker whose store Spark cannot open, at {remote.broker.endpoints}) "
                    "vs the files, streaming to the noop sink (rows/s, best run):"
                )
                far, near = bench_remote_read(
                    spark, store, remote.broker.endpoints, work, args.runs
                )
                print(f"  endpoints only (readPath=auto -> arrow) {far:>12,.0f} rows/s")
                print(f"  store files (path)                      {near:>12,.0f} rows/s")
                print(f"  ratio remote / files = {far / near:.2f}x (goal >= 0.8x)")
                summary.append(
                    ("remote read", "rmq endpoints only", far, "rmq store files", near, ">= 0.8x")
                )
            if args.only in (None, "read") and kafka is not None:
                splits = kafka_partitions(args.messages)
                print(
                    f"reads, rmq vs kafka (minPartitions={splits}), to the noop sink (rows/s, best run):"
                )
                rates = bench_kafka_read(spark, store, kafka.bootstrap, work, args.runs, splits)
                for figure, (ours, peer) in rates.items():
                    print(
                        f"  {figure:<15} rmq {ours:>12,.0f}  kafka {peer:>12,.0f}  ratio {ours / peer:.2f}x (goal >= 1.0x)"
                    )
                    summary.append((figure, "rmq source", ours, "kafka source", peer, ">= 1.0x"))
            if args.only in (None, "sink"):
                print(
                    f"streaming sink, {args.sink_rows:,} rows of {BODY_BYTES} B, 200,000 a micro-batch "
                    f"(rows/s, best of {args.runs}):"
                )
                sink = bench_sink(spark, store, work, args.sink_rows, args.runs)
                if kafka is not None:
                    sink["kafka sink"], _ = bench_kafka_sink(spark, kafka, work)
                base = sink["parquet file sink"]
                for name, rate in sink.items():
                    peer = sink["parquet +props"] if name.endswith("+props") else base
                    vs_kafka = (
                        f"  {rate / sink['kafka sink']:.2f}x kafka"
                        if "kafka sink" in sink and "props" not in name
                        else ""
                    )
                    print(
                        f"  {name:<26} {rate:>12,.0f} rows/s  {rate / peer:.2f}x parquet{vs_kafka}"
                    )
                eos, alos = sink["rmq exactly-once"], sink["rmq at-least-once"]
                ceiling = sink["python null sink"]
                print(
                    f"  ratio exactly-once / at-least-once = {eos / alos:.2f}x (goal >= 0.5x); "
                    f"at-least-once / parquet = {alos / base:.2f}x (goal >= 1.0x); "
                    f"python null sink / parquet = {ceiling / base:.2f}x (the ceiling of a Python sink)"
                )
                summary.append(
                    ("sink", "rmq exactly-once", eos, "rmq at-least-once", alos, ">= 0.5x")
                )
                goals = {
                    ("rmq at-least-once", "kafka sink"): ">= 1.0x",
                    ("rmq at-least-once", "parquet file sink"): ">= 1.0x",
                }
                for name in ("rmq at-least-once", "rmq exactly-once"):
                    for peer in ("parquet file sink", "kafka sink"):
                        if peer in sink:
                            summary.append(
                                (
                                    "sink",
                                    name,
                                    sink[name],
                                    peer,
                                    sink[peer],
                                    goals.get((name, peer), "(beside)"),
                                )
                            )
                summary.append(
                    ("sink", "python null sink", ceiling, "parquet file sink", base, "(ceiling)")
                )
                summary.append(
                    ("sink", "rmq at-least-once", alos, "python null sink", ceiling, "(beside)")
                )
                summary.append(
                    (
                        "sink +props",
                        "rmq exactly-once",
                        sink["rmq exactly-once +props"],
                        "rmq at-least-once",
                        sink["rmq at-least-once +props"],
                        ">= 0.5x",
                    )
                )
                summary.append(
                    (
                        "sink +props",
                        "rmq at-least-once",
                        sink["rmq at-least-once +props"],
                        "parquet file sink",
                        sink["parquet +props"],
                        ">= 1.0x",
                    )
                )
        finally:
            spark.stop()
            stop_broker(store)
    if summary:
        print_summary(summary)


class _Stopping:
    """A BrokerProcess as a closing context (stopped by pid at the end of the run)."""

    def __init__(self, broker) -> None:  # type: ignore[no-untyped-def]
        self.broker = broker

    def close(self) -> None:
        self.broker.stop()


def pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


if __name__ == "__main__":
    main()
