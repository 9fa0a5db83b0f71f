"""Damage inside a store is reported with its file and position, never cut silently nor served:
issue 17 items 4 (a bad size field in a crashed store), 5 (a flipped body byte in a clean one),
6 (zeroed records inside the durable range) and 7 (ConsumeQueue units damaged or deleted)."""

from __future__ import annotations

import os
import shutil

import pytest

from rmq_spark.errors import CorruptStoreError
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.mapped import MappedFile
from rmq_spark.store.message import Message
from rmq_spark.store.record import POS_BODY_V4
from rmq_spark.store.store import MessageStore, StoreConfig

SEG = 32 * 1024
SMALL = {"commitlog_segment_bytes": SEG, "cq_segment_units": 40}


def open_store(d, **kw):
    return MessageStore(d, StoreConfig(**{**SMALL, **kw}), clock=FakeClock())


def segment_path(d, offset):
    return os.path.join(d, "commitlog", f"{offset // SEG * SEG:020d}")


def patch(path, pos, data):
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def crashed_with_checkpoint_behind(d, durable=10, after=100):
    """``durable`` messages checkpointed, then ``after`` more acknowledged under sync flush (so on
    disk) while the checkpoint file still says ``durable``; then the process dies."""
    s = open_store(d, flush="sync", flush_interval_ms=3_600_000)
    for i in range(durable):
        assert s.put_message(Message("A", b"d%d" % i, queue_id=0)).ok
    s.flush_all()
    placed = []
    for i in range(after):
        r = s.put_message(Message("A", b"m%d" % i * 10, queue_id=0))
        assert r.ok
        placed.append((r.append.wrote_offset, r.append.wrote_bytes))
    s.crash()
    return placed


@pytest.mark.parametrize("byte", [0, 1, 2, 3])
def test_bad_size_field_in_a_crashed_store_stops_it_with_file_and_position(tmp_path, byte):
    """Item 4: the record's own size field is the damaged part, so it cannot say where the next
    record starts; the valid records after it still prove the log was written past it."""
    d = str(tmp_path / "s")
    placed = crashed_with_checkpoint_behind(d)
    offset, _size = placed[20]
    path, pos = segment_path(d, offset), offset % SEG
    with open(path, "rb") as f:
        f.seek(pos + byte)
        old = f.read(1)[0]
    patch(path, pos + byte, bytes([old ^ 0x40]))
    with pytest.raises(CorruptStoreError) as e:
        open_store(d)
    assert e.value.path == path and e.value.position == pos
    assert path in str(e.value) and f"position {pos}" in str(e.value)
    with open_store(d, truncate_corrupt=True) as s:  # the operator's choice: cut it there
        assert s.commitlog.max_offset == offset
        assert s.max_offset("A", 0) == 10 + 20


def test_zeroed_record_in_a_crashed_store_is_not_a_torn_tail(tmp_path):
    d = str(tmp_path / "s")
    placed = crashed_with_checkpoint_behind(d)
    offset, size = placed[50]
    patch(segment_path(d, offset), offset % SEG, bytes(size))
    with pytest.raises(CorruptStoreError, match=f"position {offset % SEG}"):
        open_store(d)


def test_torn_last_record_of_a_crashed_store_is_still_cut(tmp_path):
    d = str(tmp_path / "s")
    placed = crashed_with_checkpoint_behind(d)
    offset, _size = placed[-1]
    patch(segment_path(d, offset), offset % SEG + 1, b"\x7f")  # its size field, nothing after
    with open_store(d) as s:
        assert s.commitlog.max_offset == offset
        assert s.max_offset("A", 0) == 10 + 99


class Killed(BaseException):
    """The process dies in the middle of a write (what kill -9 does to a copy under way)."""


def kill_during_write(monkeypatch, s, msgs, copied_from=32):
    """Put ``msgs`` as one write that dies half done, leaving the bytes as glibc's ``memcpy``
    leaves a buffer it was copying (its first vector is stored last): the write's start a hole,
    its later records whole; then the store dies."""

    def torn(self, data, position=None, publish=True):
        pos = self.wrote_position if position is None else position
        self.mm[pos + copied_from : pos + len(data)] = bytes(memoryview(data)[copied_from:])
        raise Killed()

    monkeypatch.setattr(MappedFile, "write", torn)
    start = s.commitlog.max_offset
    with pytest.raises(Killed):
        s.put_messages(msgs)
    monkeypatch.undo()
    s.crash()
    return start


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_write_torn_by_a_kill_is_cut_though_whole_records_follow_its_hole(
    tmp_path, monkeypatch, caplog, flush
):
    """The torn write was never acknowledged (it had not returned): the hole at its start with
    valid records after it is its torn tail, not damage, because the write was in flight."""
    d = str(tmp_path / "s")
    s = open_store(d, flush=flush)
    for i in range(10):
        assert s.put_message(Message("A", b"d%d" % i, queue_id=0)).ok
    start = kill_during_write(
        monkeypatch, s, [Message("A", b"t%d" % i * 30, queue_id=0) for i in range(5)]
    )
    with open_store(d) as s:
        assert s.commitlog.max_offset == start
        assert s.max_offset("A", 0) == 10
        assert [m.body for m in s.get_messages("A", 0, 0, max_msgs=100).messages] == [
            b"d%d" % i for i in range(10)
        ]
        assert s.put_message(Message("A", b"after", queue_id=0)).ok  # the cut tail was zeroed
    assert f"CommitLog cut at position {start % SEG}" in caplog.text and "in flight" in caplog.text
    with open_store(d) as s:  # and the next start finds nothing wrong
        assert s.max_offset("A", 0) == 11
    s = open_store(d)
    s.crash()
    with open_store(d) as s:  # nor does a recovery scan after a crash with no write in flight
        assert s.max_offset("A", 0) == 11


def test_hole_before_the_write_in_flight_is_damage(tmp_path, monkeypatch):
    """Only the write in flight may be torn: a hole in an earlier write, with valid records after
    it, stops the store with file and position even though the crash tore the last write."""
    d = str(tmp_path / "s")
    s = open_store(d, flush="sync", flush_interval_ms=3_600_000)
    placed = []
    for i in range(20):
        r = s.put_message(Message("A", b"m%d" % i * 10, queue_id=0))
        placed.append(r.append.wrote_offset)
    kill_during_write(monkeypatch, s, [Message("A", b"t%d" % i * 30, queue_id=0) for i in range(5)])
    patch(segment_path(d, placed[5]), placed[5] % SEG, bytes(8))
    with pytest.raises(CorruptStoreError, match=f"position {placed[5] % SEG}"):
        open_store(d)


def test_marker_of_the_write_in_flight_that_does_not_check_counts_as_none(tmp_path, monkeypatch):
    """A marker torn by the kill (or lost by a power cut) tells nothing: the hole is reported."""
    d = str(tmp_path / "s")
    s = open_store(d, flush="sync")
    for i in range(10):
        assert s.put_message(Message("A", b"d%d" % i, queue_id=0)).ok
    start = kill_during_write(
        monkeypatch, s, [Message("A", b"t%d" % i * 30, queue_id=0) for i in range(5)]
    )
    patch(os.path.join(d, "inflight"), 10, b"\xff")
    with pytest.raises(CorruptStoreError, match=f"position {start % SEG}"):
        open_store(d)
    with open_store(d, truncate_corrupt=True) as s:
        assert s.max_offset("A", 0) == 10


def clean_store(d, n=60):
    with open_store(d) as s:
        for i in range(n):
            assert s.put_message(
                Message("B", b"body-%d" % i * 5, {"KEYS": f"k{i}"}, queue_id=i % 2)
            ).ok
        return [m for q in range(2) for m in s.get_messages("B", q, 0, max_msgs=100).messages]


def reads(s, at):
    """Every way a client reads queue B/0 over its damaged record at queue offset ``at``: the pull
    path (a pull from before it serves the records up to it and ends there, the one that starts at
    it raises: issue 28 item 23) and the bulk Arrow path."""
    served = s.get_messages("B", 0, 0, max_msgs=100)
    assert [m.queue_offset for m in served.messages] == list(
        range(at)
    ) and served.next_begin_offset == at
    yield lambda: s.get_messages("B", 0, at, max_msgs=100)
    yield lambda: s.read_arrow("B", 0, 0, s.max_offset("B", 0))


@pytest.mark.parametrize("where", ["body", "header"])
def test_flipped_byte_in_a_clean_store_is_never_served(store_dir, where):
    """Item 5: a clean store's recovery scans nothing; the reads check each record's CRCs."""
    msgs = clean_store(store_dir)
    victim = msgs[7]
    assert victim.queue_id == 0
    path, pos = segment_path(store_dir, victim.commitlog_offset), victim.commitlog_offset % SEG
    at = pos + (POS_BODY_V4 + 3 if where == "body" else 48)  # a body byte, BORNTIMESTAMP
    with open(path, "rb") as f:
        f.seek(at)
        old = f.read(1)[0]
    patch(path, at, bytes([old ^ 1]))
    with open_store(store_dir) as s:
        for read in reads(s, victim.queue_offset):
            with pytest.raises(CorruptStoreError) as e:
                read()
            assert e.value.path == path and e.value.position == pos
            assert f"position {pos}" in str(e.value)
        assert s.get_messages("B", 0, 8).messages[0].body == msgs[8].body  # the rest is served


def test_zeroed_record_inside_the_durable_range_is_never_served(store_dir):
    """Item 6: not an empty message with msgId 000...0: the start's check of every unit against
    its record finds it, and the CommitLog scan that follows names it."""
    msgs = clean_store(store_dir)
    victim = msgs[3]
    path, pos = segment_path(store_dir, victim.commitlog_offset), victim.commitlog_offset % SEG
    patch(path, pos, bytes(victim.store_size))
    with pytest.raises(CorruptStoreError) as e:
        open_store(store_dir)
    assert e.value.path == path and e.value.position == pos


def test_damage_found_by_a_read_is_never_served(store_dir):
    """The same zeroed record under a store already open: the read checks it."""
    msgs = clean_store(store_dir)
    victim = msgs[3]
    path, pos = segment_path(store_dir, victim.commitlog_offset), victim.commitlog_offset % SEG
    with open_store(store_dir) as s:
        s.commitlog.mfq.find(victim.commitlog_offset).mm[pos : pos + victim.store_size] = bytes(
            victim.store_size
        )
        for read in reads(s, victim.queue_offset):
            with pytest.raises(CorruptStoreError, match=f"position {pos}.*zero bytes") as e:
                read()
            assert e.value.path == path and e.value.position == pos  # the file named, and where
        assert s.look_message_by_offset(victim.commitlog_offset) is None  # no record starts there


def cq_path(d, topic, qid):
    return os.path.join(d, "consumequeue", topic, str(qid), "0" * 20)


@pytest.mark.parametrize("unit", [0, 5, 29])
@pytest.mark.parametrize(
    "garbage", [b"\xff" * 20, b"\x00" * 20, b"\x00\x00\x00\x00\x00\x00\x01\x00" + bytes(12)]
)
def test_damaged_consume_queue_unit_is_rebuilt_from_the_commitlog(store_dir, caplog, unit, garbage):
    """Item 7: a unit overwritten with garbage no longer cuts its queue (30 messages unreachable)."""
    msgs = clean_store(store_dir)
    path = cq_path(store_dir, "B", 0)
    patch(path, unit * 20, garbage)
    with open_store(store_dir) as s:
        got = s.get_messages("B", 0, 0, max_msgs=100).messages
        assert [m.body for m in got] == [m.body for m in msgs if m.queue_id == 0]
        assert s.read_arrow("B", 0, 0, 30).column("body").to_pylist() == [m.body for m in got]
    if unit < 29:
        assert f"{path}: unit {unit} of B/0 at position {unit * 20}" in caplog.text
    else:  # the last unit cut by the queue's own recovery: the record it named has none
        assert "of B/0 offset 29 has no ConsumeQueue unit" in caplog.text


def test_unit_pointing_at_another_record_is_rebuilt(store_dir, caplog):
    msgs = clean_store(store_dir)
    path = cq_path(store_dir, "B", 0)
    with open(cq_path(store_dir, "B", 1), "rb") as f:
        other = f.read(20)  # queue 1's first unit: a sound record, of another queue
    patch(path, 40, other)
    with open_store(store_dir) as s:
        got = s.get_messages("B", 0, 0, max_msgs=100).messages
        assert [m.body for m in got] == [m.body for m in msgs if m.queue_id == 0]
    assert "belongs to another queue" in caplog.text


@pytest.mark.parametrize("what", ["one queue", "every queue"])
def test_deleted_consume_queue_directory_is_rebuilt_on_a_clean_start(store_dir, what):
    msgs = clean_store(store_dir)
    shutil.rmtree(
        os.path.join(store_dir, "consumequeue", "B", "1")
        if what == "one queue"
        else os.path.join(store_dir, "consumequeue")
    )
    with open_store(store_dir) as s:
        for q in range(2):
            got = s.get_messages("B", q, 0, max_msgs=100).messages
            assert [m.body for m in got] == [m.body for m in msgs if m.queue_id == q]


def test_index_rebuild_after_a_crash_never_reads_keys_from_a_damaged_record(store_dir):
    """The index's own catch-up scan (its files dropped after a crash) checks the CRCs: a record
    whose properties were zeroed is not indexed under no key, it stops the store."""
    from rmq_spark.store.index.service import IndexService
    from rmq_spark.store.query import MessageQuery

    s = MessageStore(
        store_dir,
        StoreConfig(**SMALL, flush="sync", flush_interval_ms=3_600_000),
        clock=FakeClock(),
        dispatchers=[IndexService],
    )
    first = s.put_message(Message("A", b"x", {"KEYS": "k0"})).append
    s.put_message(Message("A", b"y", {"KEYS": "k1"}))
    s.flush_all()
    s.put_message(Message("A", b"z", {"KEYS": "k2"}))
    s.crash()
    path = segment_path(store_dir, first.wrote_offset)
    with open(path, "rb") as f:
        keys_at = f.read().index(b"KEYS\x01k0")
    assert first.wrote_offset < keys_at < first.wrote_offset + first.wrote_bytes
    patch(path, keys_at, bytes(7))  # its KEYS property
    with pytest.raises(CorruptStoreError) as e:
        s = MessageStore(
            store_dir, StoreConfig(**SMALL), clock=FakeClock(), dispatchers=[IndexService]
        )
        MessageQuery(s).by_key("A", "k0")
    assert e.value.path == path and e.value.position == first.wrote_offset


@pytest.mark.parametrize("name", ["consumerOffset.json", "topics.json"])
def test_config_file_damaged_into_valid_json_is_told_apart_and_its_copy_read(
    store_dir, caplog, name
):
    """A digit flipped in a committed offset leaves valid JSON: the checksum tells it, and the
    copy (``.bak``, written with the same, current content) is read instead, with a log line."""
    with open_store(store_dir) as s:
        s.topics.get_or_create("B")
        s.offsets.commit("G", "B", 0, 41, persist=True)
        s.offsets.commit("G", "B", 0, 42, persist=True)
    path = os.path.join(store_dir, "config", name)
    with open(path, "rb") as f:
        text = f.read()
    digit = b"42" if name == "consumerOffset.json" else b'"readQueueNums": 4'
    assert digit in text
    patch(path, text.index(digit) + len(digit) - 1, b"7")
    with open_store(store_dir) as s:
        assert s.offsets.query("G", "B", 0) == 42
        assert s.topics.get("B").read_queue_nums == 4
    assert f"{path} is damaged" in caplog.text and f"{path}.bak is read" in caplog.text


@pytest.mark.parametrize("where", ["slot", "entry hash", "seal"])
def test_damaged_index_file_of_a_clean_store_is_rebuilt(store_dir, caplog, where):
    """An index file is sealed (a CRC in its unused entry 0) on a clean stop and when full: a
    flipped byte, even one that keeps every chain well formed, is told and the file rebuilt."""
    from rmq_spark.store.index.indexfile import HEADER_BYTES
    from rmq_spark.store.index.service import IndexService
    from rmq_spark.store.query import MessageQuery

    cfg = StoreConfig(**SMALL, extra={"index_slots": 8, "index_entries": 64})
    with MessageStore(store_dir, cfg, clock=FakeClock(), dispatchers=[IndexService]) as s:
        for i in range(10):
            s.put_message(Message("A", b"v%d" % i, {"KEYS": f"k{i}"}))
    (name,) = os.listdir(os.path.join(store_dir, "index"))
    path = os.path.join(store_dir, "index", name)
    entries = HEADER_BYTES + 8 * 4
    at = {"slot": HEADER_BYTES + 4 * 3, "entry hash": entries + 20 * 5, "seal": entries + 2}[where]
    with open(path, "rb") as f:
        f.seek(at)
        old = f.read(1)[0]
    patch(path, at, bytes([old ^ 0x40]))
    with MessageStore(store_dir, cfg, clock=FakeClock(), dispatchers=[IndexService]) as s:
        q = MessageQuery(s)
        for i in range(10):
            assert [m.body for m in q.by_key("A", f"k{i}")] == [b"v%d" % i]
    assert path in caplog.text and "rebuilt from the CommitLog" in caplog.text


@pytest.mark.parametrize("byte", [0, 35, 44, 50])
def test_damaged_checkpoint_is_logged_and_the_whole_log_checked(store_dir, caplog, byte):
    """A flipped bit in the checkpoint's offsets once made a clean store refuse to start, blaming
    the CommitLog ("durable bytes follow"); its CRC tells the checkpoint is the damaged file."""
    msgs = clean_store(store_dir)
    path = os.path.join(store_dir, "checkpoint")
    with open(path, "rb") as f:
        f.seek(byte)
        old = f.read(1)[0]
    patch(path, byte, bytes([old ^ 0x10]))
    with open_store(store_dir) as s:
        for q in range(2):
            got = s.get_messages("B", q, 0, max_msgs=100).messages
            assert [m.body for m in got] == [m.body for m in msgs if m.queue_id == q]
    assert f"{path}: the checkpoint is damaged" in caplog.text
