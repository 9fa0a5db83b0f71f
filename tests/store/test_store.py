"""MessageStore: appends, rollover, ConsumeQueue, reads, config files, validation, flush."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

from rmq_spark.errors import ConfigError, MessageIllegalError, StoreError, StoreLockedError
from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.config import TopicConfig
from rmq_spark.store.consumequeue import CQ_UNIT
from rmq_spark.store.message import Message, tags_code
from rmq_spark.store.status import GetStatus, PutStatus
from rmq_spark.store.store import MessageStore, StoreConfig

SMALL = {"commitlog_segment_bytes": 64 * 1024, "cq_segment_units": 50}


def open_store(d, clock=None, **kw):
    return MessageStore(d, StoreConfig(**{**SMALL, **kw}), clock=clock or FakeClock())


def test_segments_named_by_offset_and_rollover_with_blank(store_dir):
    with open_store(store_dir) as s:
        for i in range(600):
            r = s.put_message(
                Message("T", bytes([i % 256]) * 300, {"TAGS": f"t{i % 3}"}, queue_id=i % 2)
            )
            assert r.ok
        names = sorted(os.listdir(os.path.join(store_dir, "commitlog")))
        assert names[0] == "00000000000000000000"
        assert names[1] == f"{64 * 1024:020d}"
        assert len(names) >= 3
        assert all(
            os.path.getsize(os.path.join(store_dir, "commitlog", n)) == 64 * 1024 for n in names
        )
        # the first segment ends with a BLANK record
        mf = s.commitlog.mfq.files[0]
        ends = []
        for m in s.commitlog.iter_records():
            if m.commitlog_offset < mf.end_offset:
                ends.append(m.commitlog_offset + m.store_size)
        last_end = max(ends)
        assert int.from_bytes(mf.mm[last_end + 4 : last_end + 8], "big") == L.BLANK_MAGIC
        assert s.max_offset("T", 0) == 300 and s.max_offset("T", 1) == 300
        # CQ rolled over too: 300 units in files of 50 units
        assert len(os.listdir(os.path.join(store_dir, "consumequeue", "T", "0"))) == 6
        g = s.get_messages("T", 1, 290, max_msgs=32)
        assert [m.queue_offset for m in g.messages] == list(range(290, 300))
        assert all(m.body == bytes([m.queue_offset * 2 + 1 & 0xFF]) * 300 for m in g.messages)


def test_batch_is_one_write_with_consecutive_offsets_and_one_store_time(store_dir):
    clock = FakeClock(1_000)
    with open_store(store_dir, clock) as s:
        s.put_message(Message("A", b"first"))
        clock.advance(5)
        msgs = [Message("A", f"m{i}".encode(), {"KEYS": f"k{i}"}) for i in range(10)]
        r = s.put_messages(msgs)
        assert r.ok
        assert r.append.queue_offsets.tolist() == list(range(1, 11))
        assert r.append.store_timestamp_ms == 1_005
        assert (np.diff(r.append.phys_offsets) > 0).all()
        assert len(set(r.append.msg_ids)) == 10 and all(len(x) == 32 for x in r.append.msg_ids)
        got = s.get_messages("A", 0, 1, max_msgs=100).messages
        assert {m.store_timestamp_ms for m in got} == {1_005}
        assert [m.properties["KEYS"] for m in got] == [f"k{i}" for i in range(10)]


def test_batch_larger_than_a_segment_spans_segments(store_dir):
    with open_store(store_dir) as s:
        bodies = [bytes([i % 251]) * 1000 for i in range(200)]  # ~230 KB > 64 KB segments
        r = s.put_bodies("Big", 0, bodies, {"TAGS": "x"})
        assert r.ok and len(r.append.phys_offsets) == 200
        assert len(s.commitlog.mfq.files) >= 4
        batch = s.read_arrow("Big", 0, 0, 200)
        assert batch.column("body").to_pylist() == bodies
        assert batch.column("queueOffset").to_pylist() == list(range(200))
        assert batch.column("commitLogOffset").to_pylist() == r.append.phys_offsets.tolist()


def test_consume_queue_units_are_rocketmq_layout(store_dir):
    with open_store(store_dir) as s:
        r = s.put_messages([Message("Q", b"x" * 10, {"TAGS": "TagA"}), Message("Q", b"y", {})])
        path = os.path.join(store_dir, "consumequeue", "Q", "0", "00000000000000000000")
        with open(path, "rb") as f:
            raw = f.read(40)
        units = np.frombuffer(raw, dtype=CQ_UNIT)
        assert units["offset"].tolist() == r.append.phys_offsets.tolist()
        assert units["size"].tolist() == [*r.append.phys_offsets[1:].tolist(), units["size"][1]]
        assert units["tags_code"].tolist() == [2598919, 0]
        assert raw[:8] == r.append.phys_offsets[0].item().to_bytes(8, "big")


def test_get_message_statuses(store_dir):
    with open_store(store_dir) as s:
        assert s.get_messages("none", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
        for i in range(5):
            s.put_message(Message("S", b"%d" % i, {"TAGS": "a" if i % 2 else "b"}))
        assert s.get_messages("S", 0, 5).status is GetStatus.OFFSET_OVERFLOW_ONE
        assert s.get_messages("S", 0, 9).status is GetStatus.OFFSET_OVERFLOW_BADLY
        g = s.get_messages("S", 0, 0, max_msgs=2)
        assert g.status is GetStatus.FOUND and g.next_begin_offset == 2

        class OnlyA:
            code = tags_code("a")

            def matches_code(self, c):
                return c == self.code

        g = s.get_messages("S", 0, 0, max_msgs=10, message_filter=OnlyA())
        assert [m.body for m in g.messages] == [b"1", b"3"] and g.next_begin_offset == 5
        g = s.get_messages("S", 0, 0, max_msgs=10, max_bytes=1)
        assert len(g.messages) == 1  # at least one message, then the byte limit


def test_offset_by_time(store_dir):
    clock = FakeClock(10_000)
    with open_store(store_dir, clock) as s:
        for _i in range(20):
            s.put_message(Message("Tm", b"x"))
            clock.advance(100)
        assert s.offset_by_time("Tm", 0, 0) == 0
        assert s.offset_by_time("Tm", 0, 10_000) == 0
        assert s.offset_by_time("Tm", 0, 10_050) == 1
        assert s.offset_by_time("Tm", 0, 11_900) == 19
        assert s.offset_by_time("Tm", 0, 99_999) == 20


def test_validation_errors_name_the_problem(store_dir):
    with open_store(store_dir, body_max_bytes=1000) as s:
        with pytest.raises(MessageIllegalError, match="characters outside"):
            s.put_message(Message("bad topic", b"x"))
        with pytest.raises(MessageIllegalError, match="127"):
            s.put_message(Message("t" * 128, b"x"))
        with pytest.raises(MessageIllegalError, match="1001 bytes; the limit is 1000"):
            s.put_message(Message("T", b"x" * 1001))
        with pytest.raises(MessageIllegalError, match="properties are 32768 bytes"):
            s.put_message(Message("T", b"x", {"k": "v" * (32768 - 65)}))  # + UNIQ_KEY + record CRC
        with pytest.raises(MessageIllegalError, match="queueId 9"):
            s.put_message(Message("T", b"x", queue_id=9))
        with pytest.raises(MessageIllegalError, match="system topic"):
            s.put_messages([Message(L.SCHEDULE_TOPIC, b"x")], allow_system=False)
        with pytest.raises(MessageIllegalError, match="body is null"):
            s.put_message(Message("T", None))  # type: ignore[arg-type]
        assert s.max_offset("T", 0) == 0  # nothing stored
        r = s.put_message(Message("T", b"x" * 1000, {"k": "v" * 100}))
        assert r.ok
    with pytest.raises(ConfigError, match="flush"):
        StoreConfig(flush="sometimes")


def test_store_directory_lock(store_dir):
    with open_store(store_dir):
        with pytest.raises(StoreLockedError, match="in use by another process"):
            open_store(store_dir)


def test_topic_config_and_offsets_persist_atomically(store_dir):
    with open_store(store_dir, auto_create_topics=False) as s:
        with pytest.raises(ConfigError, match="auto-creation is off"):
            s.put_message(Message("Nope", b"x"))
        s.topics.create(TopicConfig("Orders", 8, 8, message_type="FIFO"))
        s.topics.create(TopicConfig("Other", 2, 2))
        s.offsets.commit("g1", "Orders", 3, 42)
        s.offsets.commit_many("g1", {"Orders": {0: 7}})
    with open(os.path.join(store_dir, "config", "topics.json")) as f:
        cfg = json.load(f)
    orders = cfg["topicConfigTable"]["Orders"]
    assert orders["readQueueNums"] == 8 and orders["perm"] == 6
    assert orders["attributes"]["+message.type"] == "FIFO"
    with open(os.path.join(store_dir, "config", "consumerOffset.json")) as f:
        off = json.load(f)
    assert off["offsetTable"]["Orders@g1"] == {"0": 7, "3": 42}
    # a damaged file falls back to its .bak
    with open(os.path.join(store_dir, "config", "topics.json"), "w") as f:
        f.write("{broken")
    with open_store(store_dir) as s:
        assert s.offsets.query("g1", "Orders", 3) == 42 and s.offsets.query("g1", "Orders", 1) == -1
        assert s.topics.get("Orders").read_queue_nums == 8  # from topics.json.bak
        assert s.topics.get("Other").read_queue_nums == 2  # the copy holds the newest version too


def test_rocketmq_offset_file_with_unquoted_keys_loads(store_dir):
    os.makedirs(os.path.join(store_dir, "config"))
    with open(os.path.join(store_dir, "config", "consumerOffset.json"), "w") as f:
        f.write('{"offsetTable":{"TopicTest@please_rename":{0:5280,1:5312}}}')
    with open_store(store_dir) as s:
        assert s.offsets.query("please_rename", "TopicTest", 1) == 5312


def test_sync_flush_group_commit_shares_fdatasync(store_dir, monkeypatch):
    calls = []
    real = os.fdatasync

    def counting(fd):
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    with open_store(store_dir, flush="sync", flush_interval_ms=60_000) as s:
        n_threads, per_thread = 8, 25
        errors = []

        def producer(t):
            for i in range(per_thread):
                r = s.put_message(Message("Sync", b"%d-%d" % (t, i), queue_id=t % 4))
                if r.status is not PutStatus.PUT_OK:
                    errors.append(r.status)
                # once put returns, its bytes are durable
                if s.commitlog.flushed_offset < r.append.end_offset:
                    errors.append("returned before durable")

        threads = [threading.Thread(target=producer, args=(t,)) for t in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        total = n_threads * per_thread
        assert sum(s.max_offset("Sync", q) for q in range(4)) == total
        assert len(calls) < total  # concurrent puts shared fdatasyncs


def test_sync_flush_publishes_only_durable_records(store_dir, monkeypatch):
    with open_store(store_dir, flush="sync") as s:
        r = s.put_message(Message("D", b"x"))
        assert r.ok and s.max_offset("D", 0) == 1
        assert s.dispatched_offset <= s.commitlog.flushed_offset


def test_closed_store_refuses_puts(store_dir):
    s = open_store(store_dir)
    s.shutdown()
    with pytest.raises(StoreError, match="shut down"):
        s.put_message(Message("T", b"x"))


def test_group_commit_one_flush_serves_all_gathered_waiters():
    from rmq_spark.store.flush import GroupCommitService

    gate, entered = threading.Event(), threading.Event()
    durable = [0]

    def flush():
        entered.set()
        gate.wait(5)  # hold the first round while the other waiters gather
        return durable[0]

    gc = GroupCommitService(flush, timeout_ms=5000)
    gc.start()
    results: dict[int, bool] = {}
    first = threading.Thread(target=lambda: results.__setitem__(0, gc.wait_durable(10)))
    first.start()
    assert entered.wait(5)
    others = [
        threading.Thread(target=lambda k=k: results.__setitem__(k, gc.wait_durable(10 * k)))
        for k in range(1, 9)
    ]
    for t in others:
        t.start()
    durable[0] = 90  # the next round covers every waiter
    gate.set()
    for t in [first, *others]:
        t.join(10)
    gc.shutdown()
    assert results == dict.fromkeys(range(9), True)
    assert gc.flushes <= 3  # the first round, then one (or two) for the eight gathered meanwhile


def test_group_commit_hands_a_flush_error_to_the_waiter():
    from rmq_spark.store.flush import GroupCommitService

    def flush():
        raise OSError("disk gone")

    gc = GroupCommitService(flush, timeout_ms=5000)
    gc.start()
    with pytest.raises(OSError, match="disk gone"):
        gc.wait_durable(1)
    gc.shutdown()


def test_group_commit_after_shutdown_does_not_block():
    from rmq_spark.store.flush import GroupCommitService

    gc = GroupCommitService(lambda: 5, timeout_ms=5000)
    gc.start()
    assert gc.wait_durable(5)
    gc.shutdown()
    assert gc.wait_durable(5)  # already durable
    assert not gc.wait_durable(6)  # nothing flushes any more: refused at once


@pytest.mark.parametrize("n", [1, 3, 300])  # list columns (a few records) and numpy ones
def test_put_results_and_dispatch_batches_have_numpy_columns(store_dir, n):
    seen = []
    with open_store(store_dir, commitlog_segment_bytes=1 << 20) as s:
        s.add_listener(seen.append)
        r = s.put_messages(
            [Message("Cols", b"x" * 10, {"TAGS": "a"}, queue_id=i % 2) for i in range(n)]
        )
        (batch,) = seen
        for col, dtype in (("phys", np.int64), ("sizes", np.int32), ("queue_ids", np.int32),
                           ("queue_offsets", np.int64), ("tags_codes", np.int64), ("sys_flags", np.int32),
                           ("store_timestamps", np.int64)):  # fmt: skip
            arr = getattr(batch, col)
            assert isinstance(arr, np.ndarray) and arr.dtype == dtype and len(arr) == n, col
        assert (
            isinstance(r.append.phys_offsets, np.ndarray)
            and r.append.phys_offsets.dtype == np.int64
        )
        np.testing.assert_array_equal(r.append.phys_offsets, batch.phys)
        np.testing.assert_array_equal(r.append.queue_offsets, [i // 2 for i in range(n)])
        assert (batch.tags_codes == tags_code("a")).all()
        assert batch.end_offset == r.append.end_offset == s.commitlog.max_offset
        assert len(r.append.msg_ids) == n and len(set(r.uniq_keys)) == n
        assert s.max_offset("Cols", 0) == (n + 1) // 2


def test_topic_check_cache_keeps_each_rule(store_dir):
    with open_store(store_dir) as s:
        s.put_messages([Message(L.SCHEDULE_TOPIC, b"x", {"DELAY": "1"})], allow_system=True)
        with pytest.raises(MessageIllegalError, match="system topic"):
            s.put_messages([Message(L.SCHEDULE_TOPIC, b"x", {"DELAY": "1"})], allow_system=False)
        s.put_message(Message("Fine", b"x"))
        with pytest.raises(MessageIllegalError, match="characters outside"):
            s.put_message(Message("Fine!", b"x"))
        with pytest.raises(MessageIllegalError, match="queueId 9"):
            s.put_message(Message("Fine", b"x", queue_id=9))
        with pytest.raises(MessageIllegalError, match="must be bytes"):
            s.put_message(Message("Fine", "text"))  # type: ignore[arg-type]


def test_small_puts_are_written_through_the_mapping_and_survive_a_crash(store_dir):
    with open_store(store_dir) as s:
        for i in range(30):
            s.put_message(Message("Crash", b"%d" % i, queue_id=i % 3))
        s.crash()
    with open_store(store_dir) as s:
        assert [s.max_offset("Crash", q) for q in range(3)] == [10, 10, 10]
        got = s.get_messages("Crash", 1, 0, max_msgs=32)
        assert [m.body for m in got.messages] == [b"%d" % i for i in range(1, 30, 3)]


def test_group_commit_leader_flushes_in_its_own_thread_and_hands_over():
    """An uncontended put flushes itself; a put written after a round began leads the next."""
    from rmq_spark.store.flush import GroupCommitService

    gate, entered = threading.Event(), threading.Event()
    flushers: list[int] = []

    def flush():
        flushers.append(threading.get_ident())
        if len(flushers) == 1:
            entered.set()
            gate.wait(5)
            return 10  # the first round covers the first put only
        return 20

    gc = GroupCommitService(flush, timeout_ms=5000)
    gc.start()
    results: dict[str, bool] = {}
    first = threading.Thread(target=lambda: results.__setitem__("a", gc.wait_durable(10)))
    second = threading.Thread(target=lambda: results.__setitem__("b", gc.wait_durable(20)))
    first.start()
    assert entered.wait(5)
    second.start()
    for _ in range(500):  # bounded: until the second put waits behind the first round
        if gc.waiting == 1:
            break
        threading.Event().wait(0.01)
    assert gc.waiting == 1
    gate.set()
    first.join(10)
    second.join(10)
    gc.shutdown()
    assert results == {"a": True, "b": True}
    assert flushers == [first.ident, second.ident]
    assert (gc.flushes, gc.served) == (2, 2)


@pytest.mark.parametrize("crc", [False, True])
def test_one_row_puts_write_the_bytes_batch_puts_write(tmp_path, monkeypatch, crc):
    """A put of one row (the broker's usual send) skips the batch objects; the CommitLog, the
    ConsumeQueues and the index it leaves are byte for byte those of the batch path, across
    segment rolls, IPv6 hosts, transaction records and keys."""
    from rmq_spark.store.commitlog import CommitLog
    from rmq_spark.store.index.service import IndexService
    from rmq_spark.store.properties import encode_properties

    fast = [0]
    real = CommitLog.append_one

    def counted(self, *a):  # type: ignore[no-untyped-def]
        placed = real(self, *a)
        fast[0] += placed is not None
        return placed

    monkeypatch.setattr(CommitLog, "append_one", counted)
    flags = (0, L.TRANSACTION_PREPARED_TYPE, L.TRANSACTION_COMMIT_TYPE, L.TRANSACTION_ROLLBACK_TYPE)
    msgs = []
    for i in range(240):
        props = {
            "TAGS": f"t{i % 3}",
            L.P_UNIQ_KEY: f"7F00000100000000000000000000{i:04X}",
            "n": str(i),
        }
        if i % 4 == 1:
            props["KEYS"] = f"order-{i} shared"
        msgs.append(Message(f"One{i % 2}", b"b" * (50 + 37 * (i % 13)), props, queue_id=i % 3, flag=i % 5,
                            sys_flag=flags[i % 7 % 4], born_timestamp_ms=1000 + i, born_port=4000 + i,
                            born_host="::1" if i % 17 == 5 else "10.0.0.9", reconsume_times=i % 2))  # fmt: skip

    def fill(d, one_rows):  # type: ignore[no-untyped-def]
        clock = FakeClock(5_000)
        cfg = StoreConfig(commitlog_segment_bytes=16 * 1024, cq_segment_units=50, append_prop_crc=crc,
                          extra={"index_slots": 16, "index_entries": 64})  # fmt: skip
        with MessageStore(
            str(d), cfg, clock=clock, dispatchers=[IndexService], start_services=False
        ) as s:
            for m in msgs:
                if one_rows:
                    row = (m.topic, m.queue_id, m.body, m.properties, encode_properties(m.properties),
                           tags_code(m.properties["TAGS"]), m.flag, m.sys_flag, m.born_timestamp_ms, m.born_host,
                           m.born_port, m.reconsume_times, m.prepared_transaction_offset)  # fmt: skip
                    assert s.put_rows([row]).ok
                else:
                    assert s.put_messages([m]).ok
                clock.advance(1)

    a, b = tmp_path / "rows", tmp_path / "messages"
    fill(a, True)
    assert 200 <= fast[0] < 240  # most went the one-record way; rolls and IPv6 hosts did not
    fill(b, False)
    for sub in (L.COMMITLOG_DIR, L.CONSUMEQUEUE_DIR, L.INDEX_DIR):
        names = sorted(
            os.path.relpath(os.path.join(r, f), a) for r, _, fs in os.walk(a / sub) for f in fs
        )
        assert names == sorted(
            os.path.relpath(os.path.join(r, f), b) for r, _, fs in os.walk(b / sub) for f in fs
        )
        assert names, sub
        for n in names:
            assert (a / n).read_bytes() == (b / n).read_bytes(), n


@pytest.mark.parametrize("crc", [False, True])
def test_put_rows_writes_the_records_put_messages_writes(store_dir, crc):
    """The broker's and the transactions' put of checked rows stores what put_messages stores."""
    from rmq_spark.store.properties import encode_properties

    props = {
        "TAGS": "tg",
        "KEYS": "k1 k2",
        "user": "v",
        L.P_UNIQ_KEY: "7F0000010000000000000000000000AA",
    }
    msgs = [Message("Rows", b"body-%d" % i, dict(props), queue_id=1, flag=3, born_timestamp_ms=1234,
                    born_host=host, born_port=77) for i, host in enumerate(("10.0.0.9", "::1"))]  # fmt: skip
    with open_store(store_dir, append_prop_crc=crc) as s:
        a = s.put_messages(msgs)
        rows = [(m.topic, m.queue_id, m.body, m.properties, encode_properties(m.properties),
                 tags_code(m.properties["TAGS"]), m.flag, m.sys_flag, m.born_timestamp_ms, m.born_host,
                 m.born_port, m.reconsume_times, m.prepared_transaction_offset) for m in msgs]  # fmt: skip
        b = s.put_rows(rows)
        assert a.ok and b.ok and b.uniq_keys == [props[L.P_UNIQ_KEY]] * 2
        assert b.append.queue_list() == [2, 3] and b.append.wrote_bytes == a.append.wrote_bytes
        got = s.get_messages("Rows", 1, 0).messages
        assert [m.queue_offset for m in got] == [0, 1, 2, 3]
        for x, y in zip(got[:2], got[2:], strict=True):
            for f in ("topic", "body", "properties", "flag", "sys_flag", "born_timestamp_ms", "born_host",
                      "born_port", "store_size", "store_timestamp_ms", "body_crc"):  # fmt: skip
                assert getattr(x, f) == getattr(y, f), f
        cq = s.consume_queue("Rows", 1)
        assert set(cq.units(0, 4)["tags_code"].tolist()) == {tags_code("tg")}
        with pytest.raises(StoreError, match="at least one row"):
            s.put_rows([])


@pytest.mark.parametrize(
    "sizes", [[1], [3], [200], [1, 1, 4, 300]], ids=["one", "few", "many", "mixed"]
)
def test_a_reader_never_sees_a_consume_queue_unit_before_it_is_whole(store_dir, monkeypatch, sizes):
    """Every byte write of a ConsumeQueue is followed by a look a concurrent reader could take at
    that instant: each unit below the queue's end must already have its size (a unit read with
    size 0 was skipped by get_messages, and a new consumer group on a fresh queue lost the first
    message of a racing put that way)."""
    from rmq_spark.store.mapped import MappedFile

    s = MessageStore(store_dir, StoreConfig(commitlog_segment_bytes=1 << 20))
    looks = []
    real_write = MappedFile.write

    def write(mf, data, position=None, publish=True):  # type: ignore[no-untyped-def]
        if publish:
            real_write(mf, data, position)
        else:
            real_write(mf, data, position, publish=False)
        for (topic, qid), cq in list(s._cqs.items()):
            if mf in cq.mfq.files:
                units = cq.units(cq.min_offset, cq.max_offset)
                looks.append(len(units))
                assert (units["size"] > 0).all(), f"{topic}/{qid}: a unit visible without its size"

    monkeypatch.setattr(MappedFile, "write", write)
    sent = 0
    for n in sizes:  # the first put of each size goes to a fresh queue (queue id = the round)
        for qid in (len(looks) % 4, 3):
            s.put_messages([Message("Race", b"m%d" % i, queue_id=qid) for i in range(n)])
            sent += n
    assert looks, "no ConsumeQueue write was looked at"
    got = sum(len(s.get_messages("Race", q, 0, max_msgs=10_000).messages) for q in range(4))
    assert got == sent
    s.shutdown()


def test_a_unit_pointing_at_no_record_is_passed_over_and_reported(store_dir, caplog):
    """A ConsumeQueue unit whose bytes in a live CommitLog segment hold no record (damage) is
    passed over by get_messages and logged with both files and the position, not silently."""
    s = MessageStore(store_dir, StoreConfig(commitlog_segment_bytes=1 << 20))
    s.put_messages([Message("T", b"a"), Message("T", b"b")])
    cq = s.consume_queue("T", 0)
    mf = cq.mfq.files[0]
    np.frombuffer(mf.mm, dtype=CQ_UNIT, count=1, offset=0)["offset"] = (
        1 << 19
    )  # unit 0: no record there
    got = s.get_messages("T", 0, 0)
    assert [m.body for m in got.messages] == [b"b"]
    assert "ConsumeQueue T/0 unit 0" in caplog.text and "position 524288" in caplog.text
    assert os.path.join("commitlog", "") in caplog.text
    s.shutdown()
