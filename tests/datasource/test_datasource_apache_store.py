"""``format("rmq")`` with ``path`` on a store in Apache RocketMQ's format: a stream and a write
start the embedded broker on it, which opens it as ``rmq-broker --store`` does (records without
the ``__CRC32#`` property, segment sizes taken from the files); what rmq-broker would refuse at
start, and a store Apache's broker holds, are refused by name before anything is written.  A
batch read still reads such a store offline (``tests/interop/test_apache_store_read.py``).

The store is made without Java, as ``tests/store/test_apache_format.py`` makes them: this
project's encoder without the CRC property (``append_prop_crc=False``), 64 KiB CommitLog
segments and ConsumeQueue files of 100 units (a broker.conf's ``mappedFileSizeCommitLog`` /
``mappedFileSizeConsumeQueue``), Apache's config files and checkpoint.  Before, every stream and
write was refused: ``... is a store Apache RocketMQ wrote; ... never opened by rmq-broker``."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys

import pytest

from rmq_spark.datasource.embedded import read_record, stop_broker
from rmq_spark.store import layout as L
from rmq_spark.store.apache import is_apache_store
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.message import Message
from rmq_spark.store.store import MessageStore, StoreConfig

pytestmark = pytest.mark.spark

TOPIC = "ApacheT"
SEGMENT = 64 * 1024
CQ_UNITS = 100


def apache_like_store(root: str, n: int) -> dict[str, bytes]:
    """``n`` messages over four queues in Apache's format, stopped cleanly: UNIQ_KEY -> body."""
    cfg = StoreConfig(
        commitlog_segment_bytes=SEGMENT, cq_segment_units=CQ_UNITS, append_prop_crc=False
    )
    out = {}
    with MessageStore(root, cfg, clock=FakeClock()) as s:
        for i in range(n):
            body = (b"apache %05d " % i) * 30
            r = s.put_message(
                Message(TOPIC, body, {"TAGS": f"t{i % 3}", "KEYS": f"k{i}"}, queue_id=i % 4)
            )
            assert r.ok
            out[r.uniq_keys[0]] = body
    for name in ("subscriptionGroup.json", "consumerFilter.json"):  # only Apache writes these
        with open(os.path.join(root, L.CONFIG_DIR, name), "w", encoding="utf-8") as f:
            f.write("{}")
    if os.path.exists(os.path.join(root, L.INFLIGHT_FILE)):  # rmq-broker's own
        os.unlink(os.path.join(root, L.INFLIGHT_FILE))
    with open(os.path.join(root, L.CHECKPOINT_FILE), "wb") as f:  # Apache's: timestamps, offsets
        f.write(struct.pack(">qqqqq", 0, 0, 0, 0, 0).ljust(4096, b"\0"))
    assert is_apache_store(root)
    return out


def tree_digest(root: str) -> dict[str, str]:
    out = {}
    for base, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(base, name), root) + "/"] = ""
        for name in files:
            with open(os.path.join(base, name), "rb") as f:
                out[os.path.relpath(os.path.join(base, name), root)] = hashlib.sha256(
                    f.read()
                ).hexdigest()
    return out


def _stream_rows(spark, store: str, checkpoint: str) -> list:
    """Every row a stream of the store's topic reads (Trigger.AvailableNow)."""
    got: list = []
    df = (
        spark.readStream.format("rmq")
        .option("path", store)
        .option("topics", TOPIC)
        .option("startingOffsets", "earliest")
        .option("embeddedIdleExitS", "60")
        .load()
    )
    q = (
        df.writeStream.foreachBatch(
            lambda batch, _id: got.extend(batch.select("msgId", "body").collect())
        )
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    if q.exception() is not None:
        raise q.exception()  # type: ignore[misc]
    return got


def test_stream_and_write_open_an_apache_store_through_the_embedded_broker(
    spark, store_dir, tmp_path
):
    sent = apache_like_store(store_dir, 600)
    assert len(os.listdir(os.path.join(store_dir, L.COMMITLOG_DIR))) >= 3
    try:
        rows = _stream_rows(spark, store_dir, str(tmp_path / "checkpoint"))
        assert {r.msgId: bytes(r.body) for r in rows} == sent  # each once, intact
        assert read_record(store_dir) is not None  # the embedded broker served it
        spark.createDataFrame([("written by Spark",)], "body string").write.format("rmq").option(
            "path", store_dir
        ).option("topic", TOPIC).mode("append").save()
    finally:
        stop_broker(store_dir)
    # the broker kept the store's own sizes and Apache's record format for what it appended
    sizes = {
        os.path.getsize(os.path.join(store_dir, L.COMMITLOG_DIR, n))
        for n in os.listdir(os.path.join(store_dir, L.COMMITLOG_DIR))
    }
    assert sizes == {SEGMENT}
    # a batch read: offline, from the files
    batch = spark.read.format("rmq").option("path", store_dir).option("topics", TOPIC).load()
    got = {r.msgId: bytes(r.body) for r in batch.collect()}
    assert len(got) == len(sent) + 1 and {u: got[u] for u in sent} == sent
    assert b"written by Spark" in got.values()


def test_a_store_rmq_broker_cannot_serve_is_refused_before_anything_is_written(
    spark, store_dir, tmp_path
):
    apache_like_store(store_dir, 20)
    ext = os.path.join(store_dir, "consumequeue_ext", TOPIC, "0")
    os.makedirs(ext)
    with open(os.path.join(ext, "0" * 20), "wb") as f:
        f.write(bytes(4096))
    before = tree_digest(store_dir)
    with pytest.raises(Exception, match="enableConsumeQueueExt") as e:
        _stream_rows(spark, store_dir, str(tmp_path / "checkpoint"))
    assert "consumequeue_ext" in str(e.value)
    with pytest.raises(Exception, match="enableConsumeQueueExt"):
        spark.createDataFrame([("x",)], "body string").write.format("rmq").option(
            "path", store_dir
        ).option("topic", TOPIC).mode("append").save()
    assert tree_digest(store_dir) == before


_HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)  # Java's FileChannel.tryLock(0, 1, false)
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_store_an_apache_broker_holds_is_refused_naming_it(spark, store_dir):
    apache_like_store(store_dir, 20)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, os.path.join(store_dir, L.LOCK_FILE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"  # type: ignore[union-attr]
        before = tree_digest(store_dir)
        with pytest.raises(Exception, match=f"in use by another process \\(pid {holder.pid}\\)"):
            spark.createDataFrame([("x",)], "body string").write.format("rmq").option(
                "path", store_dir
            ).option("topic", TOPIC).mode("append").save()
        assert tree_digest(store_dir) == before
    finally:
        holder.stdin.close()  # type: ignore[union-attr]
        holder.wait(timeout=30)
        holder.stdout.close()  # type: ignore[union-attr]
