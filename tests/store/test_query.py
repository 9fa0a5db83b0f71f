"""Queries against golden data: by key in a time range (newest first, limit, collisions dropped),
by unique id, by offsetMsgId, and queue offset by store time."""

from __future__ import annotations

import struct

import pytest

from rmq_spark.errors import StoreError
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.index.service import IndexService
from rmq_spark.store.message import Message, decode_offset_msg_id
from rmq_spark.store.query import Boundary, MessageIdError, MessageQuery
from rmq_spark.store.store import MessageStore, StoreConfig

T0 = 1_700_000_000_000
STEP_MS = 700
N = 30


def open_store(d: str, clock: FakeClock, dispatchers=(IndexService,)) -> MessageStore:
    cfg = StoreConfig(
        commitlog_segment_bytes=64 * 1024,
        cq_segment_units=64,
        extra={"index_slots": 16, "index_entries": 32},  # 31 keys per file: many files
    )
    return MessageStore(d, cfg, clock=clock, dispatchers=list(dispatchers), start_services=False)


@pytest.fixture
def golden(store_dir):
    """Orders/0: message i stored at T0 + i*700 ms with KEYS "order-i cust-(i%3)" (+ "vip" when
    i%5 == 0); Refunds/0 reuses order keys; Orders/1 holds two 3-message batches."""
    clock = FakeClock(T0)
    s = open_store(store_dir, clock)
    ids, uniq = [], []
    for i in range(N):
        keys = f"order-{i} cust-{i % 3}" + (" vip" if i % 5 == 0 else "")
        r = s.put_message(Message("Orders", b"o%d" % i, {"KEYS": keys, "TAGS": "t"}))
        ids.append(r.append.msg_ids[0])
        uniq.append(r.uniq_keys[0])
        if i % 10 == 0:
            s.put_message(Message("Refunds", b"r%d" % i, {"KEYS": f"order-{i}"}))
        clock.advance(STEP_MS)
    s.put_messages([Message("Orders", b"b%d" % k, {"KEYS": "batch"}, queue_id=1) for k in range(3)])
    clock.advance(5000)
    s.put_messages([Message("Orders", b"c%d" % k, {"KEYS": "batch"}, queue_id=1) for k in range(3)])
    yield s, MessageQuery(s), ids, uniq
    s.shutdown()


def bodies(msgs) -> list[bytes]:
    return [m.body for m in msgs]


def test_by_key_newest_first_with_limit(golden):
    _s, q, _, _ = golden
    assert len(q.index.files) > 3
    assert bodies(q.by_key("Orders", "cust-1")) == [b"o%d" % i for i in range(28, 0, -3)]
    assert bodies(q.by_key("Orders", "cust-1", limit=3)) == [b"o28", b"o25", b"o22"]
    assert bodies(q.by_key("Orders", "vip")) == [b"o25", b"o20", b"o15", b"o10", b"o5", b"o0"]
    assert bodies(q.by_key("Orders", "order-17")) == [b"o17"]
    assert [m.queue_offset for m in q.by_key("Orders", "batch")] == [5, 4, 3, 2, 1, 0]


def test_by_key_time_range_is_exact_to_the_millisecond(golden):
    _, q, _, _ = golden
    # message 4 is at T0+2800: its index entry says "2 s" (a candidate), its record says 2800 ms
    got = q.by_key("Orders", "cust-1", begin_ms=T0 + 4 * STEP_MS + 1, end_ms=T0 + 13 * STEP_MS)
    assert bodies(got) == [b"o13", b"o10", b"o7"]
    got = q.by_key("Orders", "cust-1", begin_ms=T0 + 4 * STEP_MS, end_ms=T0 + 13 * STEP_MS - 1)
    assert bodies(got) == [b"o10", b"o7", b"o4"]
    assert q.by_key("Orders", "vip", begin_ms=T0 + 1, end_ms=T0 + 5 * STEP_MS - 1) == []
    assert bodies(q.by_key("Orders", "vip", begin_ms=T0 + 20 * STEP_MS)) == [b"o25", b"o20"]
    assert q.by_key("Orders", "vip", begin_ms=T0 + 10_000, end_ms=T0) == []


def test_by_key_keeps_topics_apart_and_compares_keys_exactly(golden):
    _, q, _, _ = golden
    assert bodies(q.by_key("Refunds", "order-10")) == [b"r10"]
    assert bodies(q.by_key("Orders", "order-10")) == [b"o10"]
    assert q.by_key("Orders", "order-1 cust-1") == []  # a whole KEYS value is not a key
    assert q.by_key("Orders", "order") == [] and q.by_key("Orders", "") == []
    assert q.by_key("Nope", "order-1") == []


def test_hash_collisions_are_dropped_and_never_use_up_the_limit(store_dir):
    clock = FakeClock(T0)
    with open_store(store_dir, clock) as s:
        q = MessageQuery(s)
        s.put_message(Message("T", b"bb", {"KEYS": "BB"}))  # "Aa" and "BB" share a Java hash
        for i in range(80):
            clock.advance(10)
            s.put_message(Message("T", b"aa%d" % i, {"KEYS": "Aa"}))
        assert len(q.index.query_offsets("T", "BB", max_num=1000)) == 81
        assert bodies(q.by_key("T", "BB", limit=1)) == [b"bb"]
        assert bodies(q.by_key("T", "Aa", limit=2)) == [b"aa79", b"aa78"]
        assert len(q.by_key("T", "Aa", limit=200)) == 80


def test_by_unique_id(golden):
    _s, q, _, uniq = golden
    assert q.by_unique_id(uniq[7], "Orders").body == b"o7"
    assert q.by_unique_id(uniq[7]).body == b"o7"  # every topic searched
    assert q.by_unique_id(uniq[7], "Refunds") is None
    assert q.by_unique_id("0" * 32, "Orders") is None
    assert q.by_unique_id(uniq[7][:-1], "Orders") is None


def test_by_unique_id_prefers_the_earliest_stored(store_dir):
    clock = FakeClock(T0)
    with open_store(store_dir, clock) as s:
        q = MessageQuery(s)
        uid = "AC110001000000000000000000000001"
        for k in range(3):
            s.put_message(Message("T", b"copy%d" % k, {"UNIQ_KEY": uid}))
            clock.advance(1000)
        assert q.by_unique_id(uid, "T").body == b"copy0"
        assert q.by_unique_id(uid).body == b"copy0"


def test_by_offset_msg_id(golden):
    s, q, ids, uniq = golden
    m = q.by_offset_msg_id(ids[12])
    assert m.body == b"o12" and m.msg_id == ids[12] and m.uniq_key == uniq[12]
    assert decode_offset_msg_id(ids[12])[2] == m.commitlog_offset
    host, port, offset = decode_offset_msg_id(ids[12])
    assert q.by_offset_msg_id(ids[12].lower()).body == b"o12"
    # an IPv6 store address names the same offset (the address is not compared)
    v6 = (bytes(15) + b"\x01" + struct.pack(">iq", port, offset)).hex().upper()
    assert q.by_offset_msg_id(v6).body == b"o12"
    mid_record = (host + struct.pack(">iq", port, offset + 4)).hex().upper()
    beyond = (host + struct.pack(">iq", port, s.commitlog.max_offset + 100)).hex().upper()
    negative = (host + struct.pack(">iq", port, -1)).hex().upper()
    assert q.by_offset_msg_id(mid_record) is None
    assert q.by_offset_msg_id(beyond) is None
    assert q.by_offset_msg_id(negative) is None
    for bad in ("", "XYZ", "G" * 32, ids[12][:-2]):
        with pytest.raises(MessageIdError):
            q.by_offset_msg_id(bad)


def test_offset_by_time(golden):
    s, q, _, _ = golden
    at = lambda i: T0 + i * STEP_MS  # noqa: E731
    assert q.offset_by_time("Orders", 0, at(5)) == 5
    assert q.offset_by_time("Orders", 0, at(5), Boundary.UPPER) == 6
    assert q.offset_by_time("Orders", 0, at(5) + 1) == 6
    assert q.offset_by_time("Orders", 0, at(5) - 1, Boundary.UPPER) == 5
    assert q.offset_by_time("Orders", 0, T0 - 1) == 0
    assert q.offset_by_time("Orders", 0, T0 - 1, Boundary.UPPER) == 0
    assert q.offset_by_time("Orders", 0, at(N)) == N
    assert q.offset_by_time("Orders", 0, at(N), Boundary.UPPER) == N
    # one store time for a whole batch: LOWER is its first message, UPPER the one after its last
    t_batch = at(N)
    assert q.offset_by_time("Orders", 1, t_batch) == 0
    assert q.offset_by_time("Orders", 1, t_batch, Boundary.UPPER) == 3
    assert q.offset_by_time("Orders", 1, t_batch + 1) == 3
    assert q.offset_by_time("Orders", 1, t_batch + 5000) == 3
    assert q.offset_by_time("Orders", 1, t_batch + 5000, Boundary.UPPER) == 6
    assert q.offset_by_time("Orders", 3, T0) == 0  # a queue without messages
    assert q.offset_by_time("Nope", 0, T0) == 0
    # agrees with the store's own LOWER search
    for t in range(T0 - 500, at(N) + 500, 333):
        assert q.offset_by_time("Orders", 0, t) == s.offset_by_time("Orders", 0, t)


def test_queries_after_restart_and_without_index(store_dir):
    clock = FakeClock(T0)
    with open_store(store_dir, clock) as s:
        r = s.put_message(Message("T", b"x", {"KEYS": "k"}))
    with open_store(store_dir, clock) as s:
        q = MessageQuery(s)
        assert bodies(q.by_key("T", "k")) == [b"x"]
        assert q.by_unique_id(r.uniq_keys[0], "T").body == b"x"
    with open_store(store_dir, clock, dispatchers=()) as s:
        q = MessageQuery(s)
        assert q.by_offset_msg_id(r.append.msg_ids[0]).body == b"x"  # needs no index
        with pytest.raises(StoreError, match="IndexService"):
            q.by_key("T", "k")
