"""CommitLog records concatenated in one buffer (a PULL_MESSAGE body) read into Arrow equal the
bulk reader's rows of the same queue range: record starts found without a loop (bodies that
contain a record header are not mistaken for one), the longest topics, zlib bodies."""

from __future__ import annotations

import random
import struct
import zlib

import numpy as np
import pytest

from rmq_spark.errors import CorruptStoreError
from rmq_spark.remoting.lookup import raw_record
from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.message import Message
from rmq_spark.store.pulled import record_starts, records_arrow
from rmq_spark.store.store import MessageStore, StoreConfig


def _records(s: MessageStore, topic: str, start: int, end: int) -> bytes:
    cq = s.consume_queue(topic, 0)
    return b"".join(raw_record(s, cq.unit(q)[0]) for q in range(start, end))


@pytest.mark.parametrize("topic", ["P", "T" * 127])
def test_pulled_records_equal_the_bulk_read(store_dir, topic):
    rng = random.Random(3)
    with MessageStore(
        store_dir, StoreConfig(commitlog_segment_bytes=1 << 20), clock=FakeClock()
    ) as s:
        msgs = []
        for i in range(300):
            body = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 3, 12, 13, 200])))
            if i % 7 == 0:  # a body holding what looks like a record header: size + MAGIC_V1
                body = struct.pack(">iI", 40, L.MAGIC_V1) + body
            props = {"TAGS": rng.choice(["a", "bb"]), "n": str(i)}
            if i % 3:
                props["UNIQ_KEY"] = f"ID{i:06d}"
            msgs.append(Message(topic, body, props))
        for i in range(0, 300, 50):
            s.put_messages(msgs[i : i + 50])
        for start, end in [(0, 300), (5, 6), (120, 201)]:
            data = _records(s, topic, start, end)
            got = records_arrow(data)
            want = s.read_arrow(topic, 0, start, end)
            assert got.schema == want.schema
            assert got.to_pylist() == want.to_pylist()
        assert records_arrow(b"").num_rows == 0
        data = _records(s, topic, 0, 10)
        with pytest.raises(CorruptStoreError, match="not whole records"):
            records_arrow(data[:-3])
        with pytest.raises(CorruptStoreError, match="does not begin"):
            record_starts(np.frombuffer(data[5:], dtype=np.uint8))


def test_zlib_bodies_are_inflated(store_dir):
    with MessageStore(
        store_dir, StoreConfig(commitlog_segment_bytes=1 << 20), clock=FakeClock()
    ) as s:
        raw = b"hello " * 1000
        s.put_messages(
            [
                Message("Z", b"plain", {}),
                Message("Z", zlib.compress(raw), {}, sys_flag=L.FLAG_COMPRESSED),
            ]
        )
        got = records_arrow(_records(s, "Z", 0, 2))
        assert got.column("body").to_pylist() == [b"plain", raw]
