"""An exactly-once topic-to-topic pipeline: raw click events in, cleaned ones out, every input
message once in the output even when the job is restarted in the middle of a micro-batch.

    python examples/exactly_once_pipeline.py [STORE_DIR]

``RawClicks`` holds JSON click events (some from bots).  A Structured Streaming job parses them,
drops the bots, and writes ``CleanClicks`` with the ``rmq`` sink: each micro-batch's messages are
half messages committed together with the batch (exactly-once, and visible all at once), keyed
by user (``messageGroup``: one user's clicks stay in order in one queue) and tagged by page.

To show what a restart does, the job is run, then its last micro-batch is made to look
unfinished (as if the driver had died after the sink committed but before Spark wrote its commit
log) and it is run again: Spark replays that batch, the sink recognises it as committed, and the
output does not change.  The same with ``transactional=false`` duplicates the replayed batch.
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import sys
import tempfile


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    own = len(sys.argv) < 2
    store = sys.argv[1] if not own else tempfile.mkdtemp(prefix="rmq-eo-")
    work = tempfile.mkdtemp(prefix="rmq-eo-ck-")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("exactly-once-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    rmq = {"path": store}
    try:
        rng = random.Random(7)
        clicks = [
            json.dumps(
                {
                    "user": f"u{rng.randint(1, 20)}",
                    "page": rng.choice(["home", "cart", "item"]),
                    "bot": rng.random() < 0.1,
                    "n": i,
                }
            )
            for i in range(3000)
        ]
        spark.createDataFrame([(c,) for c in clicks], "body string").write.format("rmq").options(
            **rmq
        ).option("topic", "RawClicks").option("transactional", "false").mode("append").save()
        want = sum(1 for c in clicks if not json.loads(c)["bot"])
        schema = "user string, page string, bot boolean, n long"

        def run(target: str, checkpoint: str, transactional: bool) -> None:
            clean = (
                spark.readStream.format("rmq")
                .options(**rmq)
                .option("topics", "RawClicks")
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", "1000")
                .load()
                .select(F.from_json(F.col("body").cast("string"), schema).alias("c"))
                .where("not c.bot")
                .select(
                    F.to_json("c").alias("body"),
                    F.col("c.user").alias("messageGroup"),
                    F.col("c.user").alias("keys"),
                    F.col("c.page").alias("tags"),
                )
            )
            q = (
                clean.writeStream.format("rmq")
                .options(**rmq)
                .option("topic", target)
                .option("transactional", str(transactional).lower())
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination()

        def count(topic: str) -> tuple[int, int]:
            df = spark.read.format("rmq").options(**rmq).option("topics", topic).load()
            return df.count(), df.select("body").distinct().count()

        for target, tx in (("CleanClicks", True), ("CleanClicksAtLeastOnce", False)):
            ck = os.path.join(work, target)
            run(target, ck, tx)
            first = count(target)
            last = max(
                int(os.path.basename(f)) for f in glob.glob(os.path.join(ck, "commits", "[0-9]*"))
            )
            for f in (
                os.path.join(ck, "commits", str(last)),
                os.path.join(ck, "commits", f".{last}.crc"),
            ):
                if os.path.exists(f):
                    os.remove(f)  # the driver "died" before Spark recorded batch `last`
            run(target, ck, tx)  # the restart replays it
            total, distinct = count(target)
            print(
                f"{target:<24} transactional={str(tx).lower():<5} expected {want}: after the first run {first[0]}, "
                f"after the replay of batch {last}: {total} messages ({total - distinct} duplicates)"
            )
        per_user = (
            spark.read.format("rmq")
            .options(**rmq)
            .option("topics", "CleanClicks")
            .load()
            .groupBy("keys")
            .agg(F.countDistinct("queueId").alias("queues"))
        )
        print("users whose clicks span more than one queue:", per_user.where("queues > 1").count())
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
        if own:
            from rmq_spark.datasource.embedded import stop_broker

            stop_broker(store)
            shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
