"""Avro message bodies: write a struct column as Avro-encoded bodies, read them back decoded.

    python examples/avro_bodies.py [STORE_DIR]

With option ``avroSchema`` the sink encodes a struct column ``value`` into each message body
(the Avro binary encoding of one record, no container header) and the source adds a struct
column ``value`` decoded from ``body`` with fastavro.  Here: sensor readings are written as
Avro, a streaming query decodes them and keeps a per-sensor average, and a batch read shows that
any RocketMQ consumer sees plain Avro bytes in ``body``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

SCHEMA = """{
  "type": "record", "name": "Reading", "namespace": "demo",
  "fields": [
    {"name": "sensor", "type": "string"},
    {"name": "celsius", "type": "double"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "flags", "type": {"type": "array", "items": "string"}},
    {"name": "note", "type": ["null", "string"], "default": null}
  ]
}"""


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    own = len(sys.argv) < 2
    store = sys.argv[1] if not own else tempfile.mkdtemp(prefix="rmq-avro-")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("avro-bodies")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    rmq = {"path": store, "avroSchema": SCHEMA}
    try:
        readings = spark.range(60).select(
            F.struct(
                F.concat(F.lit("s"), (F.col("id") % 3).cast("string")).alias("sensor"),
                (F.lit(20.0) + F.col("id") % 7).alias("celsius"),
                F.timestamp_millis(F.lit(1_700_000_000_000) + F.col("id") * 1000).alias("at"),
                F.when(F.col("id") % 10 == 0, F.array(F.lit("calibrated")))
                .otherwise(F.array())
                .alias("flags"),
                F.when(F.col("id") == 0, F.lit("first")).alias("note"),
            ).alias("value"),
            (F.col("id") % 3).cast("string").alias("messageGroup"),
        )
        readings.write.format("rmq").options(**rmq).option("topic", "Readings").mode(
            "append"
        ).save()

        averages = (
            spark.readStream.format("rmq")
            .options(**rmq)
            .option("topics", "Readings")
            .option("startingOffsets", "earliest")
            .load()
            .groupBy("value.sensor")
            .agg(F.count("*").alias("n"), F.round(F.avg("value.celsius"), 2).alias("avg_celsius"))
        )
        q = (
            averages.writeStream.format("memory")
            .queryName("averages")
            .outputMode("complete")
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        spark.sql("select * from averages order by sensor").show()

        raw = spark.read.format("rmq").option("path", store).option("topics", "Readings").load()
        first = raw.orderBy("queueId", "queueOffset").select("body").first()
        print("a raw body (what any consumer receives):", bytes(first.body)[:40], "...")
        decoded = spark.read.format("rmq").options(**rmq).option("topics", "Readings").load()
        decoded.where("value.note is not null or size(value.flags) > 0").select("value.*").orderBy(
            "at"
        ).show(truncate=False)
    finally:
        spark.stop()
        if own:
            from rmq_spark.datasource.embedded import stop_broker

            stop_broker(store)
            shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
