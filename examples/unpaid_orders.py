"""Close orders that were not paid in time — the delayed-message scenario of an order system
(pay within 30 minutes, or the order is closed), with seconds instead of minutes.

    python examples/unpaid_orders.py [STORE_DIR]

Nothing is started by hand: with only ``path`` the data source runs an embedded broker, which
exits by itself once idle.

1. Orders are created: each goes to topic ``Orders``, and a *timeout check* for it goes to
   ``OrderTimeouts`` with a delivery time ``PAY_WITHIN_S`` ahead (the sink's
   ``deliverTimestamp`` column: the check stays invisible until then).
2. Some orders are paid (topic ``Payments``) before their time is up.
3. A streaming query reads ``OrderTimeouts``: a check shows up in a micro-batch only once it is
   due.  For each micro-batch it looks the payments up and writes an ``OrderClosed`` event to
   ``OrderEvents`` for every order still unpaid (an exactly-once, all-or-nothing batch write).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

PAY_WITHIN_S = 6
ORDERS = ["o-1001", "o-1002", "o-1003", "o-1004"]
PAID = {"o-1002", "o-1004"}


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    own = len(sys.argv) < 2
    store = sys.argv[1] if not own else tempfile.mkdtemp(prefix="rmq-unpaid-")
    checkpoint = tempfile.mkdtemp(prefix="rmq-unpaid-ck-")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("unpaid-orders")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    rmq = {"path": store}
    closed: list[str] = []
    handled: list[str] = []

    def close_unpaid(checks, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        due = checks.select(
            F.col("keys").alias("order"),
            F.coalesce("deliverTimestamp", "storeTimestamp").alias("due"),
        )
        if due.isEmpty():
            return
        paid = (
            spark.read.format("rmq")
            .options(**rmq)
            .option("topics", "Payments")
            .load()
            .select(F.col("keys").alias("order"))
        )
        unpaid = due.join(paid, "order", "left_anti")
        events = unpaid.select(
            F.lit("OrderEvents").alias("topic"),
            F.col("order").alias("keys"),
            F.lit("closed").alias("tags"),
            F.to_json(F.struct("order", F.lit("closed: not paid in time").alias("reason"))).alias(
                "body"
            ),
        )
        events.write.format("rmq").options(**rmq).mode("append").save()
        for r in due.join(paid, "order", "left_semi").collect():
            print(f"  [{time.strftime('%H:%M:%S')}] {r.order}: paid in time, nothing to do")
        gone = [r.order for r in unpaid.collect()]
        for r in unpaid.collect():
            print(
                f"  [{time.strftime('%H:%M:%S')}] {r.order}: payment window over at {r.due:%H:%M:%S}, "
                "no payment -> closed"
            )
        handled.extend(
            r.order for r in due.collect()
        )  # last: the main thread may stop the query now
        closed.extend(gone)

    try:
        # start watching first: checks appear only when due
        q = (
            spark.readStream.format("rmq")
            .options(**rmq)
            .option("topics", "OrderTimeouts")
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.foreachBatch(close_unpaid)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="1 second")
            .start()
        )
        orders = spark.createDataFrame([(o,) for o in ORDERS], "order string")
        orders.select(
            F.col("order").alias("keys"),
            F.lit("created").alias("tags"),
            F.to_json(F.struct("order")).alias("body"),
        ).write.format("rmq").options(**rmq).option("topic", "Orders").mode("append").save()
        orders.select(
            F.col("order").alias("keys"),
            F.lit("timeout-check").alias("tags"),
            F.col("order").alias("body"),
            (F.current_timestamp() + F.expr(f"INTERVAL {PAY_WITHIN_S} SECONDS")).alias(
                "deliverTimestamp"
            ),
        ).write.format("rmq").options(**rmq).option("topic", "OrderTimeouts").mode("append").save()
        print(
            f"[{time.strftime('%H:%M:%S')}] created {len(ORDERS)} orders; each must be paid within {PAY_WITHIN_S}s"
        )
        spark.createDataFrame(
            [(o, "paid") for o in sorted(PAID)], "keys string, body string"
        ).write.format("rmq").options(**rmq).option("topic", "Payments").mode("append").save()
        print(f"[{time.strftime('%H:%M:%S')}] paid: {', '.join(sorted(PAID))}")
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and len(handled) < len(ORDERS):
            time.sleep(0.5)
        q.stop()
        events = spark.read.format("rmq").options(**rmq).option("topics", "OrderEvents").load()
        print("OrderEvents:", sorted(r.keys for r in events.select("keys").collect()))
    finally:
        spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
        if own:
            from rmq_spark.datasource.embedded import stop_broker

            stop_broker(store)  # it would exit by itself when idle; a demo cleans up now
            shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
