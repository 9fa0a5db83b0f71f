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
from rmq_spark.store.properties import parse_properties
from rmq_spark.store.reader import SOURCE_SCHEMA, StoreReader
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
                "transactionId": p.get(L.P_TRANSACTION_ID)
                if m.transaction_type == L.TRANSACTION_COMMIT_TYPE
                else None,
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
    cfg = StoreConfig(
        commitlog_segment_bytes=64 * 1024, cq_segment_units=64, append_prop_crc=prop_crc
    )
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
    with MessageStore(
        store_dir, StoreConfig(commitlog_segment_bytes=64 * 1024), clock=FakeClock()
    ) as s:
        s.put_messages(random_messages(random.Random(1), 50))
        full = s.read_arrow("R", 0, 0, 50)
        for cols in (
            ["body"],
            ["queueOffset", "storeTimestamp"],
            ["tags", "topic"],
            ["properties"],
        ):
            part = s.read_arrow("R", 0, 0, 50, columns=cols)
            assert part.schema.names == [n for n in SOURCE_SCHEMA.names if n in cols]
            assert part.to_pydict() == full.select(part.schema.names).to_pydict()
        assert s.read_arrow("Nope", 0, 0, 5, columns=["body"]).schema.names == ["body"]


class TagsIn:
    """A minimal filter object with the interface of rmq_spark.filter.TagFilter."""

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
        s.put_messages(
            [Message("F", b"%d" % i, {"TAGS": ["a", "b", "c"][i % 3]}) for i in range(30)]
        )
        b = s.read_arrow("F", 0, 0, 30, tag_filter=TagsIn("a", "c"))
        assert b.column("queueOffset").to_pylist() == [i for i in range(30) if i % 3 != 1]
        assert set(b.column("tags").to_pylist()) == {"a", "c"}


def test_parse_properties_follows_rocketmq_rules():
    raw = pa.array(
        [
            b"a\x011\x02b\x012\x02",
            b"k1\x01v1",
            b"",
            b"aaa",
            b"\x01v\x02k\x01\x02",
            b"x\x01y\x01z\x02",
            None,
        ],
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


def test_property_lookup_tells_apart_keys_sharing_a_prefix():
    from rmq_spark.store.properties import ParsedProperties

    rows = [
        b"UNIQ_KEY\x01u1\x02UNIQ_KEYS\x01no\x02KEY\x01x\x02",
        b"UNIQ_KE\x01no\x02__transactionId__\x01t1\x02__transactionIdX_\x01no",
        b"__transactionId_\x01no\x02KEYS\x01k1\x02KEYS\x01k2",
        b"K\x01v",  # a key in the last bytes of the buffer
    ]
    parsed = ParsedProperties(pa.array(rows, pa.binary()))
    assert parsed.lookup("UNIQ_KEY").to_pylist() == ["u1", None, None, None]
    assert parsed.lookup("__transactionId__").to_pylist() == [None, "t1", None, None]
    assert parsed.lookup("KEYS").to_pylist() == [None, None, "k2", None]  # the last one wins
    assert parsed.lookup("K").to_pylist() == [None, None, None, "v"]
    assert parsed.lookup("KEY").to_pylist() == ["x", None, None, None]


def _both_parsers(rows: list[bytes]):
    from rmq_spark.store.properties import ParsedProperties, UniformProperties

    width = len(rows[0])
    mat = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), width)
    return UniformProperties.of(mat), ParsedProperties(pa.array(rows, pa.binary()))


@pytest.mark.parametrize(
    "template",
    [
        b"TAGS\x01t%d\x02UNIQ_KEY\x01%031d\x02",
        b"KEYS\x01a%d\x02KEYS\x01b%d\x02\x01v\x02k\x01\x02noval\x02",  # repeated key, skipped segments
        b"x\x01y\x01%02d\x02k\x01v%d",  # a value holding \x01, no trailing separator
        b"TAGS\x01%d\x02__CRC32#\x01%010d\x02",  # the record CRC is not a property
        b"__CRC32#\x01%010d\x02",
    ],
)
def test_uniform_layout_reads_as_the_general_parser(template):
    k = template.count(b"%")
    rows = [template % ((i,) * k) for i in range(3, 9)]
    uniform, parsed = _both_parsers(rows)
    assert uniform is not None
    assert uniform.map_array().equals(parsed.map_array())
    for key in ("TAGS", "KEYS", "UNIQ_KEY", "x", "k", "__CRC32#", "absent"):
        assert uniform.lookup(key).equals(parsed.lookup(key)), key


@pytest.mark.parametrize(
    "odd",
    [
        b"TAGS\x01a\x02UNIQ\x01b\x01c\x02",  # an extra \x01 inside a value
        b"TAGS\x01a\x02UNIQ\x01bc\x02\x02",  # ...or \x02
        b"TAGX\x01a\x02UNIQ\x01bcd\x02",  # another key, same length
        b"TAGS\x01a\x02UNIQ\x01\x01\x00\x00\x02",  # an \x01 where another row has \x00
        b"TAGS\x01a\x02UNIQ\x01bcd\x02",  # and the sane row, for contrast
    ],
)
@pytest.mark.parametrize("zeros_first", [False, True])
def test_uniform_layout_refused_when_one_row_differs(odd, zeros_first):
    rows = [b"TAGS\x01a\x02UNIQ\x01%03d\x02" % i for i in range(5)] + [odd]
    if zeros_first:  # \x00 is a value byte like any other, but row 0 then counts differently
        rows[0] = b"TAGS\x01a\x02UNIQ\x01\x00\x00\x00\x02"
    uniform, parsed = _both_parsers(rows)
    if odd.startswith(b"TAGS\x01a\x02UNIQ\x01bcd"):
        assert uniform is not None and uniform.map_array().equals(parsed.map_array())
    else:
        assert uniform is None


@pytest.mark.parametrize("prop_crc", [True, False])
def test_batch_puts_read_as_record_decode(store_dir, prop_crc):
    """put_bodies batches (one property layout: the fast paths) across segments, beside records
    of other layouts, IPv6 hosts and varied body sizes."""
    rng = random.Random(9)
    cfg = StoreConfig(commitlog_segment_bytes=64 * 1024, append_prop_crc=prop_crc, store_host="::1")
    with MessageStore(store_dir, cfg, clock=FakeClock()) as s:
        s.put_bodies("B", 0, [rng.randbytes(100) for _ in range(500)], {"TAGS": "tg", "KEYS": "k1"})
        s.put_bodies(
            "B", 1, [rng.randbytes(rng.randint(0, 40)) for _ in range(300)], {"TAGS": "tg"}
        )
        s.put_messages(random_messages(rng, 60, topic="B"))
        s.put_bodies("B", 0, [b"same"] * 200, {})
        assert len(s.commitlog.mfq.files) > 2
        for q, start, end in [(0, 0, 560), (0, 0, 500), (0, 499, 760), (1, 0, 300), (1, 5, 6)]:
            full = s.read_arrow("B", q, start, end)
            assert as_rows(full) == expected_rows(s, "B", q, start, end), (q, start, end)
            for cols in (["msgId", "body"], ["properties", "storeTimestamp", "reconsumeTimes"]):
                part = s.read_arrow("B", q, start, end, columns=cols)
                assert part.equals(full.select(part.schema.names)), (q, start, end, cols)


def test_read_chunks_split_by_rows_and_bytes(store_dir):
    from rmq_spark.store.reader import chunk_bounds

    assert chunk_bounds(np.array([10] * 10), 4, 25) == [(0, 3), (3, 5), (5, 8), (8, 10)]
    assert chunk_bounds(np.array([100, 1, 1, 100, 1]), 10, 50) == [(0, 1), (1, 4), (4, 5)]
    with MessageStore(store_dir, StoreConfig(), clock=FakeClock()) as s:
        s.put_messages(
            [Message("C", b"x" * (i % 50) * 20, {"TAGS": "ab"[i % 2]}) for i in range(300)]
        )
        s.flush_all()
        r = StoreReader(store_dir)
        try:
            whole = r.read_arrow("C", 0, 5, 290)
            chunks = list(r.read_chunks("C", 0, 5, 290, max_rows=64, max_bytes=4096))
            assert len(chunks) > 300 * 500 // 4096 // 2 and all(c.num_rows <= 64 for c in chunks)
            assert (
                pa.Table.from_batches(chunks)
                .combine_chunks()
                .equals(pa.Table.from_batches([whole]))
            )
            only_b = list(r.read_chunks("C", 0, 0, 300, tag_filter=TagsIn("b"), max_rows=7))
            assert [v for c in only_b for v in c.column("queueOffset").to_pylist()] == list(
                range(1, 300, 2)
            )
            assert list(r.read_chunks("C", 0, 9, 9)) == []
        finally:
            r.close()


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
        out = subprocess.run(
            [sys.executable, "-c", READER, store_dir], capture_output=True, text=True, timeout=60
        )
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
    from rmq_spark.filter import SqlFilter, TagFilter

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
        assert (
            len(
                s.get_messages(
                    "P", 0, 0, max_msgs=100, message_filter=TagFilter.parse("*")
                ).messages
            )
            == 41
        )
        b = s.read_arrow("P", 0, 0, 41, tag_filter=tf, sql_filter=sf)
        assert b.column("body").to_pylist() == [b"32", b"34", b"36", b"38"]


def test_a_reader_maps_a_deleted_and_recreated_queue_again(store_dir):
    """A long-lived reader (an executor, a read worker) holding a queue's files mapped reads the
    new queue once the topic was deleted and created again, not the deleted one's units."""
    with MessageStore(store_dir, StoreConfig(), clock=FakeClock()) as s:
        s.put_bodies("D", 0, [b"old-%d" % i for i in range(500)])
        s.flush_all()
        r = StoreReader(store_dir)
        assert r.read_arrow("D", 0, 0, 500).num_rows == 500
        s.delete_topic("D")
        s.put_bodies("D", 0, [b"new-0", b"new-1"])
        s.flush_all()
        assert r.max_offset("D", 0) == 2
        assert r.read_arrow("D", 0, 0, 2).column("body").to_pylist() == [b"new-0", b"new-1"]
        with pytest.raises(Exception, match="holds offsets up to 2"):
            r.read_arrow("D", 0, 0, 500)
        r.close()
