"""The vectorized bulk read equals a record-by-record decode, in this process and in another."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.message import Message, tags_code
from rmq_spark.store.reader import SOURCE_SCHEMA, StoreReader, parse_properties
from rmq_spark.store.store import MessageStore, StoreConfig


def random_messages(rng: random.Random, n: int, topic: str = "R") -> list[Message]:
    out = []
    for i in range(n):
        size = rng.choice([0, 1, 5, 11, 12, 13, 40, 300, 3000])
        props = {}
        if rng.random() < 0.7:
            props["TAGS"] = rng.choice(["a", "TagB", "a-much-longer-tag-value"])
        if rng.random() < 0.5:
            props["KEYS"] = " ".join(f"k{rng.randint(0, 99)}" for _ in range(rng.randint(1, 3)))
        if rng.random() < 0.3:
            props["color"] = rng.choice(["red", "x" * 30, "v\x01w"])  # a value holding \x01
        if rng.random() < 0.2:
            props[L.P_TIMER_OUT_MS] = str(1_700_000_000_000 + i)
        out.append(
            Message(
                topic,
                rng.randbytes(size),
                props,
                queue_id=0,
                born_host=rng.choice(["10.1.2.3", "::1", "fe80::1"]),
                born_port=rng.randint(1, 65000),
                reconsume_times=rng.randint(0, 3),
            )
        )
    return out


def expected_rows(s: MessageStore, topic: str, q: int, start: int, end: int) -> list[dict]:
    rows = []
    for m in s.get_messages(topic, q, start, max_msgs=end - start, max_bytes=1 << 30).messages:
        if m.queue_offset >= end:
            break
        p = m.properties
        rows.append(
            {
                "topic": m.topic,
                "queueId": m.queue_id,
                "queueOffset": m.queue_offset,
                "msgId": p.get(L.P_UNIQ_KEY) or m.msg_id,
                "tags": p.get("TAGS"),
                "keys": p.get("KEYS"),
                "body": m.body,
                "properties": sorted(p.items()),
                "bornTimestamp": m.born_timestamp_ms,
                "storeTimestamp": m.store_timestamp_ms,
                "deliverTimestamp": int(p[L.P_TIMER_OUT_MS]) if L.P_TIMER_OUT_MS in p else None,
                "reconsumeTimes": m.reconsume_times,
                "transactionId": p.get(L.P_TRANSACTION_ID) if m.transaction_type == L.TRANSACTION_COMMIT_TYPE else None,
                "commitLogOffset": m.commitlog_offset,
            }
        )
    return rows


def as_rows(batch: pa.RecordBatch) -> list[dict]:
    rows = batch.to_pylist()
    for r in rows:
        r["properties"] = sorted(r["properties"])
        for k in ("bornTimestamp", "storeTimestamp", "deliverTimestamp"):
            if r[k] is not None:
                r[k] = int(r[k].timestamp() * 1000)
    return rows


@pytest.mark.parametrize("prop_crc", [True, False])
def test_bulk_read_equals_record_decode(store_dir, prop_crc):
    rng = random.Random(5)
    cfg = StoreConfig(commitlog_segment_bytes=64 * 1024, cq_segment_units=64, append_prop_crc=prop_crc)
    with MessageStore(store_dir, cfg, clock=FakeClock()) as s:
        msgs = random_messages(rng, 400)
        for i in range(0, 400, 37):
            s.put_messages(msgs[i : i + 37])
        s.put_message(Message("Other", b"interleaved"))
        assert len(s.commitlog.mfq.files) > 2
        for start, end in [(0, 400), (0, 1), (17, 250), (399, 400), (100, 100)]:
            batch = s.read_arrow("R", 0, start, end)
            assert batch.schema == SOURCE_SCHEMA
            assert as_rows(batch) == expected_rows(s, "R", 0, start, end)


def test_columns_subset_skips_work_but_keeps_values(store_dir):
    with MessageStore(store_dir, StoreConfig(commitlog_segment_bytes=64 * 1024), clock=FakeClock()) as s:
        s.put_messages(random_messages(random.Random(1), 50))
        full = s.read_arrow("R", 0, 0, 50)
        for cols in (["body"], ["queueOffset", "storeTimestamp"], ["tags", "topic"], ["properties"]):
            part = s.read_arrow("R", 0, 0, 50, columns=cols)
            assert part.schema.names == [n for n in SOURCE_SCHEMA.names if n in cols]
            assert part.to_pydict() == full.select(part.schema.names).to_pydict()
        assert s.read_arrow("Nope", 0, 0, 5, columns=["body"]).schema.names == ["body"]


class TagsIn:
    """A minimal filter object with the interface of rmq_spark.store.filter.TagFilter."""

    match_all = False

    def __init__(self, *tags: str) -> None:
        self.tags = set(tags)
        self.codes = np.array([tags_code(t) for t in tags], dtype=np.int64)

    def mask_codes(self, codes):
        return np.isin(codes, self.codes)

    def mask(self, tags):
        return pa.array([t in self.tags for t in tags.to_pylist()])


def test_tag_filter_on_codes_then_strings(store_dir):
    with MessageStore(store_dir, StoreConfig(), clock=FakeClock()) as s:
        s.put_messages([Message("F", b"%d" % i, {"TAGS": ["a", "b", "c"][i % 3]}) for i in range(30)])
        b = s.read_arrow("F", 0, 0, 30, tag_filter=TagsIn("a", "c"))
        assert b.column("queueOffset").to_pylist() == [i for i in range(30) if i % 3 != 1]
        assert set(b.column("tags").to_pylist()) == {"a", "c"}


def test_parse_properties_follows_rocketmq_rules():
    raw = pa.array(
        [b"a\x011\x02b\x012\x02", b"k1\x01v1", b"", b"aaa", b"\x01v\x02k\x01\x02", b"x\x01y\x01z\x02", None],
        pa.binary(),
    )
    m = parse_properties(raw.fill_null(b""))
    assert [sorted(r) for r in m.to_pylist()] == [
        [("a", "1"), ("b", "2")],
        [("k1", "v1")],
        [],
        [],
        [],
        [("x", "y\x01z")],
        [],
    ]


READER = r"""
import sys, json
from rmq_spark.store.reader import StoreReader
r = StoreReader(sys.argv[1])
b = r.read_arrow("R", 0, 0, r.max_offset("R", 0))
print(json.dumps([r.topics(), r.queue_ids("R"), b.num_rows, b.column("body").to_pylist()[-1].hex()]))
"""


def test_store_reader_in_another_process(store_dir):
    with MessageStore(store_dir, StoreConfig(commitlog_segment_bytes=64 * 1024)) as s:
        s.put_messages(random_messages(random.Random(2), 120))
        last = s.read_arrow("R", 0, 119, 120).column("body")[0].as_py()
        out = subprocess.run([sys.executable, "-c", READER, store_dir], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        import json

        topics, qids, rows, last_hex = json.loads(out.stdout)
        assert topics == ["R"] and qids == [0] and rows == 120 and last_hex == last.hex()
    r = StoreReader(store_dir)
    try:
        with pytest.raises(Exception, match="holds offsets up to 120"):
            r.read_arrow("R", 0, 0, 121)
    finally:
        r.close()


def test_store_read_paths_take_tag_and_sql_filters(store_dir):
    from rmq_spark.store.filter import SqlFilter, TagFilter

    with MessageStore(store_dir, StoreConfig(), clock=FakeClock()) as s:
        s.put_messages(
            [Message("P", b"%d" % i, {"TAGS": "ab"[i % 2], "n": str(i)}) for i in range(40)]
            + [Message("P", b"untagged", {"n": "100"})]
        )
        tf, sf = TagFilter.parse("a || zz"), SqlFilter.parse("n > 30 AND n < 100")
        got = s.get_messages("P", 0, 0, max_msgs=100, message_filter=tf).messages
        assert [m.body for m in got] == [b"%d" % i for i in range(0, 40, 2)]
        got = s.get_messages("P", 0, 0, max_msgs=100, message_filter=sf).messages
        assert [m.body for m in got] == [b"%d" % i for i in range(31, 40)]
        assert len(s.get_messages("P", 0, 0, max_msgs=100, message_filter=TagFilter.parse("*")).messages) == 41
        b = s.read_arrow("P", 0, 0, 41, tag_filter=tf, sql_filter=sf)
        assert b.column("body").to_pylist() == [b"32", b"34", b"36", b"38"]
