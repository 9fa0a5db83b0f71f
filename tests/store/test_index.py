"""IndexFile layout and capacity (RocketMQ's IndexFileTest), hash collisions, rollover across files,
idempotent re-dispatch, and rebuild from the CommitLog after a crash or a deleted index
directory."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_spark.errors import ConfigError
from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.hashing import java_string_hash, java_string_hashes
from rmq_spark.store.index.indexfile import (
    ENTRY_STRUCT,
    HEADER,
    IndexFile,
    index_hash,
    index_hashes,
)
from rmq_spark.store.index.service import HOLD_RECORDS, IndexService
from rmq_spark.store.message import Message
from rmq_spark.store.store import MessageStore, StoreConfig

HDR = 40


def open_store(d: str, clock: FakeClock, slots: int = 8, entries: int = 16, **kw) -> MessageStore:
    cfg = StoreConfig(
        **{"commitlog_segment_bytes": 16 * 1024, "cq_segment_units": 64, **kw},
        extra={"index_slots": slots, "index_entries": entries},
    )
    return MessageStore(d, cfg, clock=clock, dispatchers=[IndexService], start_services=False)


def index_of(store: MessageStore) -> IndexService:
    return next(d for d in store.dispatchers if isinstance(d, IndexService))


def put_keyed(
    store: MessageStore, clock: FakeClock, first: int, count: int, per_put: int = 3
) -> list[int]:
    """``count`` messages of topic T with KEYS "k{i} even|odd"; returns their CommitLog offsets."""
    phys: list[int] = []
    for i in range(first, first + count, per_put):
        msgs = [
            Message("T", b"m%d" % j, {"KEYS": f"k{j} {('odd', 'even')[j % 2 == 0]}"}, j % 2)
            for j in range(i, min(i + per_put, first + count))
        ]
        phys.extend(store.put_messages(msgs).append.phys_offsets.tolist())
        clock.advance(1300)
    return phys


def index_bytes(root: str, store: MessageStore | None = None) -> list[bytes]:
    """The index files' bytes; with ``store`` open, once it indexed what it holds back."""
    if store is not None:
        index_of(store).files  # noqa: B018 - the property indexes the held records
    d = os.path.join(root, L.INDEX_DIR)
    return [Path(d, n).read_bytes() for n in sorted(os.listdir(d))]


# --- hashing --------------------------------------------------------------------------------
def test_java_hash_known_values():
    assert java_string_hashes(["hello", "", "Aa", "BB"]).tolist() == [99162322, 0, 2112, 2112]
    # Integer.MIN_VALUE: abs() stays negative in Java, the index uses 0
    assert java_string_hashes(["polygenelubricants"]).tolist() == [-(2**31)]
    assert index_hashes(["polygenelubricants", "hello"]).tolist() == [0, 99162322]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=30))
def test_vectorized_hash_equals_scalar_java_hash(strings):
    assert java_string_hashes(strings).tolist() == [java_string_hash(s) for s in strings]
    import pyarrow as pa

    from rmq_spark.store.hashing import java_string_hashes_arrow

    column = pa.array(["pad", *strings], pa.string()).slice(1)  # a sliced column, ASCII or not
    assert java_string_hashes_arrow(column).tolist() == [java_string_hash(s) for s in strings]
    ascii_only = pa.array(
        ["pad"] + [s.encode("ascii", "ignore").decode() for s in strings], pa.string()
    ).slice(1)
    assert java_string_hashes_arrow(ascii_only).tolist() == [
        java_string_hash(s) for s in ascii_only.to_pylist()
    ]
    # the scalar keyHash (a few keys) equals the vectorized one (many keys)
    vectorized = np.abs(java_string_hashes(strings).astype(np.int64))
    vectorized[vectorized > 2**31 - 1] = 0
    assert [index_hash(s) for s in strings] == vectorized.tolist()


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=20), st.integers(0, 40), st.integers(0, 6))
def test_hash_of_ids_behind_a_prefix_equals_the_hash_of_the_joined_strings(prefix, n, width):
    """A bulk put's ids are hashed from their digits (``topic#`` + each id, no string made)."""
    from rmq_spark.store.hashing import java_string_hashes_of_rows
    from rmq_spark.store.index.indexfile import index_hashes_of_ids
    from rmq_spark.store.message import IdColumn, new_uniq_ids_array, split_ids

    rows = np.frombuffer(
        bytes(random.Random(n).choice(b"0123456789ABCDEF") for _ in range(n * width)), np.uint8
    )
    rows = rows.reshape(n, width)
    joined = [prefix + bytes(r).decode() for r in rows]
    assert java_string_hashes_of_rows(prefix, rows).tolist() == [
        java_string_hash(s) for s in joined
    ]
    ids = new_uniq_ids_array(n)
    column = IdColumn(ids)
    strings = split_ids(ids)
    assert index_hashes_of_ids(prefix, ids).tolist() == [index_hash(prefix + u) for u in strings]
    assert len(column) == n and list(column) == strings and column == strings
    if n > 3:
        assert column[2] == strings[2] and list(column[1:3]) == strings[1:3]
        fresh = IdColumn(ids)  # one id read before the list is made
        assert (fresh[2], fresh[-1], fresh._strs) == (strings[2], strings[-1], None)
        assert list(column.take(np.array([3, 0]))) == [strings[3], strings[0]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 7, 38]), min_size=1, max_size=40), st.data())
def test_hash_of_strings_of_a_few_lengths_equals_scalar_java_hash(lengths, data):
    """Keys of a few lengths (``topic#UNIQ_KEY``) take the matrix path; surrogate pairs count as
    two UTF-16 units there too."""
    strings = [data.draw(st.text(min_size=n, max_size=n)) for n in lengths]
    assert java_string_hashes(strings).tolist() == [java_string_hash(s) for s in strings]


# --- IndexFile ------------------------------------------------------------------------------
def test_index_file_of_400_entries_takes_399_keys(tmp_path):
    """IndexFileTest.testPutKey: 100 slots / 400 entries accept 399 keys, the 400th is refused."""
    path = str(tmp_path / "20240101000000000")
    f = IndexFile(path, 100, 400, create=True)
    ts0 = 1_700_000_000_000
    for i in range(399):
        assert f.put_key(str(i), i, ts0 + i * 10)
    assert f.is_full
    assert not f.put_key("400", 400, ts0)
    f.flush()
    f.close()
    raw = Path(path).read_bytes()
    assert len(raw) == 40 + 100 * 4 + 400 * 20
    begin_ts, end_ts, begin_phy, end_phy, slot_count, index_count = HEADER.unpack_from(raw, 0)
    assert (begin_ts, end_ts, begin_phy, end_phy, index_count) == (ts0, ts0 + 3980, 0, 398, 400)
    slots = np.frombuffer(raw, dtype=">i4", count=100, offset=HDR)
    assert slot_count == int(np.count_nonzero(slots))
    # entry 1 is key "0": hash, offset 0, 0 s after the begin, no previous entry
    assert ENTRY_STRUCT.unpack_from(raw, HDR + 400 + 20) == (java_string_hash("0"), 0, 0, 0)
    # entry 399 (key "398", stored 3.98 s later): its slot points at it
    h = java_string_hash("398")
    e = ENTRY_STRUCT.unpack_from(raw, HDR + 400 + 399 * 20)
    assert e[:3] == (h, 398, 3) and int(slots[h % 100]) == 399


def test_select_finds_a_key_exactly_once_and_reloads(tmp_path):
    """IndexFileTest.testSelectPhyOffset: key "60" is found once, also after reopening."""
    path = str(tmp_path / "20240101000000000")
    f = IndexFile(path, 100, 400, create=True)
    for i in range(399):
        f.put_key(str(i), i, 1_700_000_000_000)
    assert f.select_key("60") == [60]
    f.close()
    g = IndexFile(path, 100, 400)
    assert g.key_count == 399 and g.select_key("60") == [60] and g.select_key("no such") == []
    g.close()


def test_collisions_in_one_slot_chain_newest_first(tmp_path):
    f = IndexFile(str(tmp_path / "20240101000000000"), 1, 64, create=True)  # every key in slot 0
    keys = [f"key{i % 5}" for i in range(40)]
    f.put_hashes(index_hashes(keys), np.arange(40) * 100, np.full(40, 1_700_000_000_000))
    assert f.hash_slot_count == 1
    for k in range(5):
        assert f.select_key(f"key{k}") == [i * 100 for i in range(39, -1, -1) if i % 5 == k]
    assert f.select_key("key1", max_num=3) == [3600, 3100, 2600]
    # "Aa" and "BB" share a Java hash: the file cannot tell them apart (queries compare keys)
    g = IndexFile(str(tmp_path / "20240101000000001"), 7, 8, create=True)
    g.put_key("Aa", 1, 1_700_000_000_000)
    g.put_key("BB", 2, 1_700_000_000_000)
    assert g.select_key("Aa") == g.select_key("BB") == [2, 1]
    f.close()
    g.close()


def test_batch_put_equals_one_key_at_a_time(tmp_path):
    rng = random.Random(7)
    keys = [f"T#{rng.randrange(30)}" for _ in range(200)]
    phys = np.arange(200, dtype=np.int64) * 37
    ts = 1_700_000_000_000 + np.arange(200, dtype=np.int64) * 450
    a = IndexFile(str(tmp_path / "a"), 13, 300, create=True)
    for k, p, t in zip(keys, phys.tolist(), ts.tolist(), strict=True):
        assert a.put_key(k, p, t)
    b = IndexFile(str(tmp_path / "b"), 13, 300, create=True)
    assert b.put_hashes(index_hashes(keys[:77]), phys[:77], ts[:77]) == 77
    assert b.put_hashes(index_hashes(keys[77:]), phys[77:], ts[77:]) == 123
    a.close()
    b.close()
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


def test_time_range_prunes_by_seconds(tmp_path):
    f = IndexFile(str(tmp_path / "20240101000000000"), 4, 16, create=True)
    t0 = 1_700_000_000_000
    for i, dt in enumerate([0, 1500, 2500, 9000]):
        f.put_key("k", i, t0 + dt)
    assert f.select_key("k", t0 + 1200, t0 + 2600) == [2, 1]  # 1.5 s is kept as "1 s": a candidate
    assert f.select_key("k", t0 + 3000, t0 + 8000) == []
    assert f.select_key("k", t0 + 9000) == [3]
    f.close()


# --- IndexService ---------------------------------------------------------------------------
def test_dispatch_indexes_uniq_key_and_each_key_word(store_dir):
    clock = FakeClock()
    with open_store(store_dir, clock, slots=64, entries=256) as s:
        idx = index_of(s)
        r = s.put_messages(
            [
                Message("T", b"a", {"KEYS": "x  y "}),
                Message("U", b"b", {"KEYS": "x"}),
                Message("T", b"c", {"KEYS": "z"}, sys_flag=L.TRANSACTION_ROLLBACK_TYPE),
                Message("T", b"d", {"KEYS": "w"}, sys_flag=L.TRANSACTION_PREPARED_TYPE),
            ]
        )
        p = r.append.phys_offsets.tolist()
        assert idx.key_count == 3 + 2 + 0 + 2  # uniq+x+y, uniq+x, (rollback: none), uniq+w
        assert idx.query_offsets("T", "x") == [p[0]]
        assert idx.query_offsets("U", "x") == [p[1]]
        assert idx.query_offsets("T", "y") == [p[0]]
        assert idx.query_offsets("T", "") == []
        assert idx.query_offsets("T", "z") == [] and idx.query_offsets("T", r.uniq_keys[2]) == []
        assert idx.query_offsets("T", "w") == [p[3]]
        assert idx.query_offsets("U", r.uniq_keys[1]) == [p[1]]


def test_put_bodies_path_is_indexed(store_dir):
    clock = FakeClock()
    with open_store(store_dir, clock, slots=1024, entries=4096) as s:
        r = s.put_bodies("T", 1, [b"%d" % i for i in range(1000)], {"KEYS": "batch", "TAGS": "a"})
        idx = index_of(s)
        assert idx.key_count == 2000
        got = idx.query_offsets("T", "batch", max_num=5000)
        assert got == r.append.phys_offsets.tolist()[::-1]
        assert idx.query_offsets("T", r.uniq_keys[500]) == [int(r.append.phys_offsets[500])]


def test_rollover_across_several_files(store_dir):
    clock = FakeClock()
    with open_store(store_dir, clock) as s:  # 16 entries: 15 keys per file
        phys = put_keyed(s, clock, 0, 40)  # 40 uniq + 80 key words = 120 keys
        idx = index_of(s)
        assert len(idx.files) == 8 and idx.key_count == 120
        names = sorted(os.listdir(os.path.join(store_dir, L.INDEX_DIR)))
        assert all(len(n) == 17 and n.isdigit() for n in names) and len(set(names)) == 8
        for prev, f in itertools.pairwise(idx.files):
            assert prev.is_full and prev.end_phy <= f.begin_phy and prev.end_ts <= f.begin_ts
        assert idx.query_offsets("T", "even", max_num=100) == phys[::2][::-1]
        for i in range(40):
            assert idx.query_offsets("T", f"k{i}") == [phys[i]]
        assert idx.query_offsets("T", "odd", max_num=3) == phys[1::2][::-1][:3]


def test_redispatch_is_idempotent(store_dir):
    clock = FakeClock()
    with open_store(store_dir, clock) as s:
        seen = []
        s.add_listener(seen.append)
        put_keyed(s, clock, 0, 12)
        idx = index_of(s)
        before = idx.key_count
        for b in seen:  # the same batches again, as recovery would hand them
            idx.dispatch(b)
        s.rebuild_consume_queues()
        assert idx.key_count == before == 36
        s.flush_all()
    snapshot = index_bytes(store_dir)  # as the clean stop left them (sealed)
    with open_store(store_dir, clock) as s:  # clean restart: files kept as they are
        assert index_of(s).rebuilt_records == 0
        assert index_bytes(store_dir) == snapshot
        put_keyed(s, clock, 12, 3)
        assert index_of(s).key_count == 45


def _keys_in_files(root: str) -> int:
    """Keys in the index files as written so far (read past the service)."""
    d = os.path.join(root, L.INDEX_DIR)
    if not os.path.isdir(d):
        return 0
    return sum(HEADER.unpack_from(Path(d, n).read_bytes(), 0)[5] - 1 for n in os.listdir(d))


def test_single_puts_are_held_then_indexed_together_and_queries_see_them_at_once(store_dir):
    clock = FakeClock()
    big = {"slots": 97, "entries": 4 * HOLD_RECORDS + 8, "commitlog_segment_bytes": 1 << 20}
    s = open_store(store_dir, clock, **big)
    try:
        idx = index_of(s)
        phys = [
            s.put_messages([Message("T", b"x", {"KEYS": f"s{i}"})]).append.phys_offsets[0]
            for i in range(HOLD_RECORDS - 1)
        ]
        assert _keys_in_files(store_dir) == 0  # held: nothing written yet
        assert idx.query_offsets("T", "s7") == [phys[7]]  # a query indexes them first
        assert _keys_in_files(store_dir) == 2 * (HOLD_RECORDS - 1)  # UNIQ_KEY + the key each
        more = [
            s.put_messages([Message("T", b"y", {"KEYS": f"m{i}"})]).append.phys_offsets[0]
            for i in range(HOLD_RECORDS)
        ]
        # the HOLD_RECORDS-th held record indexes them all, with no query
        assert _keys_in_files(store_dir) == 2 * (2 * HOLD_RECORDS - 1)
        # a batch too big to hold indexes the held ones first: entries stay in CommitLog order
        s.put_messages([Message("T", b"z", {"KEYS": "z1"})])
        s.put_messages([Message("T", b"w", {"KEYS": f"w{i}"}) for i in range(40)])
        assert _keys_in_files(store_dir) == 2 * (2 * HOLD_RECORDS - 1) + 2 + 80
        assert idx.query_offsets("T", f"m{HOLD_RECORDS - 1}") == [more[-1]]
        held = s.put_messages([Message("T", b"h", {"KEYS": "held"})]).append.phys_offsets[0]
    finally:
        s.crash()  # with one record held
    with open_store(store_dir, clock, **big) as s:
        assert index_of(s).query_offsets("T", "held") == [held]  # indexed again from the CommitLog
        assert index_of(s).query_offsets("T", "s0") == [phys[0]]


def test_rebuild_after_crash_drops_unflushed_files_and_reindexes(store_dir):
    clock = FakeClock()
    s = open_store(store_dir, clock)
    phys = put_keyed(s, clock, 0, 22)
    s.flush_all()  # index and checkpoint durable up to here: 66 keys, in the middle of file 5
    phys += put_keyed(s, clock, 22, 18)
    reference = index_bytes(store_dir, s)
    s.crash()
    # the page cache lost what was written after the flush: garble the newest files
    d = os.path.join(store_dir, L.INDEX_DIR)
    newest = sorted(os.listdir(d))[-3:]
    for n in newest:
        with open(os.path.join(d, n), "r+b") as fh:
            fh.seek(HDR)
            fh.write(b"\x7f" * 200)
    s = open_store(store_dir, clock)
    try:
        idx = index_of(s)
        assert s.last_exit_abnormal
        # the service re-indexed the dropped files' part from before the checkpoint itself
        assert idx.rebuilt_records > 0
        assert index_bytes(store_dir) == reference  # the same bytes as before the crash
        for i in range(40):
            assert idx.query_offsets("T", f"k{i}") == [phys[i]]
        assert idx.query_offsets("T", "even", max_num=100) == phys[::2][::-1]
    finally:
        s.shutdown()


def test_crash_before_any_index_flush_rebuilds_everything(store_dir):
    clock = FakeClock()
    s = open_store(store_dir, clock)
    phys = put_keyed(s, clock, 0, 30)
    reference = index_bytes(store_dir, s)
    s.crash()
    d = os.path.join(store_dir, L.INDEX_DIR)
    for n in os.listdir(d):  # nothing was synced: the files hold zeros
        size = os.path.getsize(os.path.join(d, n))
        with open(os.path.join(d, n), "r+b") as fh:
            fh.write(bytes(size))
    with open_store(store_dir, clock) as s:
        assert index_bytes(store_dir) == reference
        assert index_of(s).query_offsets("T", "k29") == [phys[29]]


def test_rebuild_after_deleting_the_index_directory(store_dir):
    clock = FakeClock()
    with open_store(store_dir, clock) as s:
        phys = put_keyed(s, clock, 0, 25)
    reference = index_bytes(store_dir)
    shutil.rmtree(os.path.join(store_dir, L.INDEX_DIR))
    with open_store(store_dir, clock) as s:
        idx = index_of(s)
        assert idx.rebuilt_records == 25
        assert idx.query_offsets("T", "k3") == [phys[3]]
    assert index_bytes(store_dir) == reference  # the same bytes, sealed by the clean stop
    with open_store(store_dir, clock) as s:
        idx = index_of(s)
        phys += put_keyed(s, clock, 25, 2)
        assert idx.query_offsets("T", "k26") == [phys[26]]


def test_other_sizes_or_torn_file_are_rebuilt(store_dir):
    clock = FakeClock()
    with open_store(store_dir, clock) as s:
        phys = put_keyed(s, clock, 0, 10)
    # other sizes configured: the files are rebuilt in the new layout
    with open_store(store_dir, clock, slots=32, entries=64) as s:
        idx = index_of(s)
        assert idx.rebuilt_records == 10 and len(idx.files) == 1 and idx.key_count == 30
        assert idx.query_offsets("T", "k9") == [phys[9]]
    d = os.path.join(store_dir, L.INDEX_DIR)
    last = sorted(os.listdir(d))[-1]
    with open(os.path.join(d, last), "r+b") as fh:
        fh.truncate(100)
    with open_store(store_dir, clock, slots=32, entries=64) as s:
        assert index_of(s).query_offsets("T", "k0") == [phys[0]]


def test_sizes_are_validated(store_dir):
    with pytest.raises(ConfigError, match="index_entries"):
        open_store(store_dir, FakeClock(), entries=1)
    with pytest.raises(ConfigError, match="index_slots"):
        fake_store = type("S", (), {"config": StoreConfig(extra={"index_slots": -3})})()
        IndexService(fake_store)


def test_checkpoint_records_index_time(store_dir):
    clock = FakeClock()
    with open_store(store_dir, clock) as s:
        put_keyed(s, clock, 0, 3)
        s.flush_all()
        assert s.checkpoint.index_msg_timestamp == index_of(s).files[-1].end_ts > 0
    raw = Path(store_dir, L.CHECKPOINT_FILE).read_bytes()[:24]
    assert struct.unpack(">q", raw[16:24])[0] == clock.now_ms() - 1300


def test_catch_up_reads_the_same_fields_as_a_full_decode(store_dir):
    from rmq_spark.store.index.indexfile import _index_fields
    from rmq_spark.store.record import decode_record

    with MessageStore(store_dir, StoreConfig(commitlog_segment_bytes=1 << 20)) as s:
        msgs = [
            Message("T", b"a", {"KEYS": "k1 k2", "TAGS": "x"}),
            Message("%RETRY%" + "g" * 150, b"bb", {"KEYS": "long"}),
            Message("T", b"c" * 300, {}, born_host="::1"),
            Message("T", b"", {"KEYS": "only"}, sys_flag=L.TRANSACTION_COMMIT_TYPE),
        ]
        s.put_messages(msgs)
        cl = s.commitlog
        for m in cl.iter_records(0):
            mf = cl.mfq.find(m.commitlog_offset)
            pos = m.commitlog_offset - mf.from_offset
            full = decode_record(mf.mm, pos, read_body=False)
            assert _index_fields(mf.mm, pos) == (
                full.topic,
                full.sys_flag,
                full.store_timestamp_ms,
                full.keys,
                full.uniq_key,
            )


def test_a_large_batch_of_several_topics_with_ids_only_is_indexed_as_one_record_at_a_time(tmp_path):
    """A group commit (its op message, which has no id, then the real messages) takes the
    vectorised id-only path; its entries are those of the general path, byte for byte."""
    from rmq_spark.store.encode import encode_columns
    from rmq_spark.store.properties import encode_properties

    def batch(first, count):
        props = [
            {} if i % 100 == 0 else {"UNIQ_KEY": f"ID{i:06d}"} for i in range(first, first + count)
        ]
        topics = ["OP" if i % 100 == 0 else "Real" for i in range(first, first + count)]
        return encode_columns(
            topics, 0, [b"m"] * count, props, [encode_properties(p) for p in props]
        )

    roots = [str(tmp_path / "batched"), str(tmp_path / "single")]
    sizes = {"slots": 97, "entries": 2000, "commitlog_segment_bytes": 1 << 20}
    with open_store(roots[0], FakeClock(), **sizes) as s:
        s.put_encoded(batch(0, 600))
        batched = index_bytes(roots[0], s)
        assert index_of(s).key_count == 594  # 6 op messages without an id
        assert index_of(s).query_offsets("Real", "ID000301")
    with open_store(roots[1], FakeClock(), **sizes) as s:
        for i in range(600):
            s.put_encoded(batch(i, 1))
        assert index_bytes(roots[1], s) == batched


@pytest.mark.parametrize("topics", [("Keyed",), ("Keyed", "Other")])
def test_a_large_batch_with_keys_is_indexed_as_one_record_at_a_time(tmp_path, topics):
    """KEYS split into words, prefixed and hashed column-wise (Arrow): the entries of the general
    path, byte for byte, words of several spaces, empty keys, records without an id, and
    non-ASCII words (hashed over UTF-16 as Java does) among them."""
    from rmq_spark.store.encode import encode_columns
    from rmq_spark.store.properties import encode_properties

    def props(i):
        p = {} if i % 50 == 0 else {"UNIQ_KEY": f"ID{i:06d}"}
        if i % 3:
            p["KEYS"] = f"order-{i}  cust-{i % 7} " + ("日本" if i % 11 == 0 else "x")
        return p

    def batch(first, count):
        ps = [props(i) for i in range(first, first + count)]
        names = [topics[i % len(topics)] for i in range(first, first + count)]
        one = len(set(names)) == 1
        return encode_columns(
            names[0] if one else names, 0, [b"m"] * count, ps, [encode_properties(p) for p in ps]
        )

    roots = [str(tmp_path / "batched"), str(tmp_path / "single")]
    sizes = {"slots": 397, "entries": 4000, "commitlog_segment_bytes": 1 << 20}
    with open_store(roots[0], FakeClock(), **sizes) as s:
        s.put_encoded(batch(0, 900))
        batched = index_bytes(roots[0], s)
        assert index_of(s).query_offsets(topics[0], "order-4") and index_of(s).query_offsets(
            topics[0], "日本"
        )
    with open_store(roots[1], FakeClock(), **sizes) as s:
        for i in range(900):
            s.put_encoded(batch(i, 1))
        assert index_bytes(roots[1], s) == batched
