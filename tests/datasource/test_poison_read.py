"""Issue 28 item 12, through Spark: a batch read over a range holding poison records (flagged
COMPRESSED, a body that is not zlib, a zlib bomb) returns every row, the others as always and
the poison ones with their body as stored, by the store files and by the broker's bulk read."""

from __future__ import annotations

import zlib

import pytest

from rmq_spark.datasource.embedded import stop_broker
from rmq_spark.store import layout as L
from rmq_spark.store.message import Message
from rmq_spark.store.store import MessageStore

pytestmark = pytest.mark.spark

TOPIC = "PoisonSpark"
GOOD = b"inflated " * 1000
BOMB = zlib.compress(bytes(256 << 20), 9)


def _want(i: int) -> bytes:
    return {3: b"this body is not zlib", 5: BOMB, 8: GOOD}.get(i, b"plain %d" % i)


@pytest.mark.parametrize("read_path", ["files", "arrow"])
def test_a_batch_read_over_poison_records_returns_every_row(spark, tmp_path, read_path):
    path = str(tmp_path / "store")
    with MessageStore(path) as s:  # as a store written before the send was checked holds them
        for i in range(10):
            body = zlib.compress(GOOD) if i == 8 else _want(i)
            flag = L.FLAG_COMPRESSED if i in (3, 5, 8) else 0
            assert s.put_message(Message(TOPIC, body, {"n": str(i)}, sys_flag=flag)).ok
    try:
        df = (
            spark.read.format("rmq")
            .option("path", path)
            .option("topics", TOPIC)
            .option("readPath", read_path)
            .load()
        )
        rows = sorted(
            (r.queueOffset, bytes(r.body)) for r in df.select("queueOffset", "body").collect()
        )
    finally:
        stop_broker(path)
    assert rows == [(i, _want(i)) for i in range(10)]
