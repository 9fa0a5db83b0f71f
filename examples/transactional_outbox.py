"""A transactional outbox: an order is stored in the service's database and its ``OrderPlaced``
event is published, both or neither — with RocketMQ transactional (half) messages and the
broker's check-back, read by Spark.

    python examples/transactional_outbox.py

The order service (RocketMQ's Python client, SQLite as its database):

1. sends the event as a half message (invisible to every reader);
2. runs its local transaction (inserts the order);
3. commits the half if the insert committed, rolls it back if it failed.

If the service dies between 1 and 3, the broker asks it later (the check-back) and the answer
comes from the database: the order is there -> commit, it is not -> roll back.  Four orders:
``A`` ends normally, ``B``'s insert fails, ``C`` and ``D`` "crash" before ending their
transaction, ``C`` after its insert and ``D`` before it.  Spark reads ``OrderOutbox`` as a batch
and finds exactly the events of the orders in the database: ``A`` and ``C``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

TOPIC = "OrderOutbox"
READY = re.compile(r"rmq-broker listening on (\S+:\d+) store=")


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    work = tempfile.mkdtemp(prefix="rmq-outbox-")
    broker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rmq_spark.broker",
            "--store",
            os.path.join(work, "store"),
            "--listen",
            "127.0.0.1:0",
            "--transaction-timeout",
            "2",
            "--transaction-check-interval",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        m = READY.search(broker.stdout.readline())  # type: ignore[union-attr]
        if m is None:
            raise SystemExit("the broker did not start")
        endpoint = m.group(1)
        db_path = os.path.join(work, "orders.db")
        run_order_service(endpoint, db_path)
        show_with_spark(endpoint, db_path)
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(timeout=30)
        broker.stdout.close()  # type: ignore[union-attr]
        shutil.rmtree(work, ignore_errors=True)


def run_order_service(endpoint: str, db_path: str) -> None:
    from rocketmq import (
        ClientConfiguration,
        Credentials,
        Message,
        Producer,
        TransactionChecker,
        TransactionResolution,
    )

    db = sqlite3.connect(db_path, check_same_thread=False)
    db.execute("create table orders (id text primary key, amount real)")
    db.commit()

    class FromDatabase(TransactionChecker):
        """The broker's check-back: is the order in the database?"""

        def check(self, message: Message) -> TransactionResolution:
            order = json.loads(message.body)["id"]
            found = db.execute("select 1 from orders where id = ?", (order,)).fetchone() is not None
            print(
                f"  check-back for order {order}: {'in the database -> COMMIT' if found else 'not there -> ROLLBACK'}"
            )
            return TransactionResolution.COMMIT if found else TransactionResolution.ROLLBACK

    producer = Producer(ClientConfiguration(endpoint, Credentials()), (TOPIC,), FromDatabase())
    producer.startup()

    def place(order: str, amount: float, insert_fails: bool = False, crash: str = "") -> None:
        tx = producer.begin_transaction()
        msg = Message()
        msg.topic, msg.tag, msg.keys = TOPIC, "OrderPlaced", order
        msg.body = json.dumps({"id": order, "amount": amount}).encode()
        producer.send(msg, tx)  # 1. the half message
        if crash == "before-insert":
            print(f"order {order}: half sent, service died before its insert")
            return
        try:  # 2. the local transaction
            with db:
                db.execute("insert into orders values (?, ?)", (order, amount))
                if insert_fails:
                    raise sqlite3.IntegrityError("payment declined")
        except sqlite3.Error as e:
            tx.rollback()  # 3. ... or its undo
            print(f"order {order}: insert failed ({e}) -> rolled back")
            return
        if crash == "after-insert":
            print(f"order {order}: inserted, service died before its commit")
            return
        tx.commit()  # 3. publish
        print(f"order {order}: inserted -> committed")

    try:
        place("A", 10.0)
        place("B", 20.0, insert_fails=True)
        place("C", 30.0, crash="after-insert")
        place("D", 40.0, crash="before-insert")
        print("waiting for the broker's check-back to settle C and D ...")
        time.sleep(6)
    finally:
        producer.shutdown()
    db.close()


def show_with_spark(endpoint: str, db_path: str) -> None:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("outbox")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        events = (
            spark.read.format("rmq")
            .option("endpoints", endpoint)
            .option("topics", TOPIC)
            .load()
            .selectExpr(
                "keys as order",
                "cast(body as string) as event",
                "transactionId is not null as transactional",
            )
            .orderBy("order")
        )
        events.show(truncate=False)
        db = sqlite3.connect(db_path)
        in_db = sorted(r[0] for r in db.execute("select id from orders"))
        db.close()
        published = [r.order for r in events.collect()]
        print(
            f"orders in the database: {in_db}; events published: {published}; "
            f"{'consistent' if in_db == published else 'INCONSISTENT'}"
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
