"""Quickstart (``make demo``): a broker, RocketMQ's own Python client producing normal, delayed
and transactional messages, and a Spark Structured Streaming query printing what it reads.

    python examples/quickstart.py [STORE_DIR]

1. start ``rmq-broker`` on a store directory (a fresh temporary one by default);
2. start a Structured Streaming query on the topic (``spark.readStream.format("rmq")``) that
   prints every micro-batch;
3. send with the official ``rocketmq-python-client``: three orders, one message with a delivery
   time 5 s ahead, one transactional message committed and one rolled back;
4. wait until the query has seen all it should (the delayed message in a micro-batch about 5 s
   later, the rolled-back one never); then stop everything.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

READY = re.compile(r"rmq-broker listening on (\S+:\d+) store=")
TOPIC = "Orders"


def start_broker(store: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rmq_spark.broker",
            "--store",
            store,
            "--listen",
            "127.0.0.1:0",
            "--transaction-check-interval",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline()  # type: ignore[union-attr]
    m = READY.search(line)
    if m is None:
        proc.kill()
        raise SystemExit(f"the broker did not start: {line!r}")
    return proc, m.group(1)


def produce(endpoint: str) -> None:
    from rocketmq import (
        ClientConfiguration,
        Credentials,
        Message,
        Producer,
        TransactionChecker,
        TransactionResolution,
    )

    class Checker(TransactionChecker):
        def check(self, message: Message) -> TransactionResolution:  # asked about orphans only
            return TransactionResolution.ROLLBACK

    producer = Producer(ClientConfiguration(endpoint, Credentials()), (TOPIC,), Checker())
    producer.startup()
    try:
        for i in (1, 2, 3):
            m = Message()
            m.topic, m.body, m.tag = (
                TOPIC,
                f'{{"order": {i}, "state": "created"}}'.encode(),
                "created",
            )
            m.keys = f"order-{i}"
            print("sent normal      ", producer.send(m).message_id)
        m = Message()
        m.topic, m.body, m.tag = TOPIC, b'{"order": 1, "state": "check-payment"}', "timeout"
        m.delivery_timestamp = int(time.time()) + 5  # this client sends it in seconds
        print("sent delayed 5 s ", producer.send(m).message_id)
        for state, commit in (("paid", True), ("cancelled", False)):
            tx = producer.begin_transaction()
            m = Message()
            m.topic, m.body, m.tag = TOPIC, f'{{"order": 2, "state": "{state}"}}'.encode(), state
            receipt = producer.send(m, tx)
            (tx.commit if commit else tx.rollback)()
            print(
                f"sent transactional ({'committed' if commit else 'rolled back'})",
                receipt.message_id,
            )
    finally:
        producer.shutdown()


def stream(endpoint: str, checkpoint: str) -> None:
    from pyspark.sql import SparkSession

    print("starting Spark ...")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("rmq-quickstart")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    seen: list[str] = []

    def show(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        rows = df.selectExpr(
            "queueId",
            "queueOffset",
            "tags",
            "cast(body as string) as body",
            "storeTimestamp",
            "deliverTimestamp",
            "transactionId is not null as tx",
        ).collect()
        print(f"--- micro-batch {batch_id}: {len(rows)} message(s)")
        for r in rows:
            print(
                f"  q{r.queueId}@{r.queueOffset} tags={r.tags:<10} tx={r.tx!s:<5} {r.body}"
                + (
                    f"  (delivered at {r.deliverTimestamp:%H:%M:%S.%f})"
                    if r.deliverTimestamp
                    else ""
                )
            )
            seen.append(r.body)

    q = (
        spark.readStream.format("rmq")
        .option("endpoints", endpoint)
        .option("topics", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(show)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 second")
        .start()
    )
    while not q.recentProgress:  # the query runs: now the producer
        time.sleep(0.2)
    produce(endpoint)
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline and len(seen) < 5:
        time.sleep(0.5)
    time.sleep(1.5)  # one more trigger: nothing else (the rolled-back message) shows up
    q.stop()
    spark.stop()
    print(
        f"read {len(seen)} messages: 3 orders, the delayed check, the committed payment; "
        f"the cancelled (rolled-back) one: {'never seen' if not any('cancelled' in s for s in seen) else 'SEEN?!'}"
    )


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    own_store = len(sys.argv) < 2
    store = sys.argv[1] if not own_store else tempfile.mkdtemp(prefix="rmq-quickstart-")
    work = tempfile.mkdtemp(prefix="rmq-quickstart-ck-")
    broker, endpoint = start_broker(store)
    print(f"broker at {endpoint}, store {store}")
    try:
        stream(endpoint, os.path.join(work, "checkpoint"))
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(timeout=30)
        broker.stdout.close()  # type: ignore[union-attr]
        shutil.rmtree(work, ignore_errors=True)
        if own_store:
            shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
