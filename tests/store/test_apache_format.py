"""Stores in Apache RocketMQ's format, made without Java: records without the ``__CRC32#``
property (Apache writes it only with ``enabledAppendPropCRC``; written here with the project's own
encoder, ``append_prop_crc=False``), BLANK records in sparse segments, Apache's checkpoint, the
store kinds the broker cannot serve, Apache's POSIX lock.  The store opens them and serves every
message, refuses with file, position and proof rather than cut what is proven written, and refuses
what it cannot serve before writing anything.  The same against a real Apache broker:
``tests/interop/test_apache_store_open.py``."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys

import pytest

from rmq_spark.errors import CorruptStoreError, StoreLockedError
from rmq_spark.store import layout as L
from rmq_spark.store.apache import ApacheStoreError
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.message import Message
from rmq_spark.store.record import POS_STORE_TIMESTAMP_V4, RecordCheck, check_record
from rmq_spark.store.store import MessageStore, StoreConfig

SMALL = {"commitlog_segment_bytes": 64 * 1024, "cq_segment_units": 100}


def open_store(d, clock=None, **kw) -> MessageStore:
    return MessageStore(str(d), StoreConfig(**{**SMALL, **kw}), clock=clock or FakeClock())


def put(
    s: MessageStore, n: int, start: int = 0, body_bytes: int = 100
) -> list[tuple[str, int, int, bytes, str]]:
    """``n`` messages over two topics and three queues: (topic, queue, queue offset, body, uniq)."""
    out = []
    for i in range(start, start + n):
        topic, qid = f"T{i % 2}", i % 3
        body = (b"m%05d-" % i) * (body_bytes // 7 + 1)
        r = s.put_message(
            Message(topic, body[:body_bytes], {"TAGS": f"t{i % 4}", "KEYS": f"k{i}"}, queue_id=qid)
        )
        assert r.ok
        out.append((topic, qid, r.append.queue_offsets[0], body[:body_bytes], r.uniq_keys[0]))
    return out


def served(s: MessageStore) -> dict[str, tuple[str, int, int, bytes]]:
    """Every message the store serves, by UNIQ_KEY: (topic, queue, queue offset, body)."""
    out = {}
    for topic, qid in s.queue_keys():
        offset = s.min_offset(topic, qid)
        while offset < s.max_offset(topic, qid):
            got = s.get_messages(topic, qid, offset, max_msgs=64).messages
            assert got, (topic, qid, offset)
            for m in got:
                assert m.uniq_key not in out
                out[m.uniq_key] = (m.topic, m.queue_id, m.queue_offset, m.body)
            offset = got[-1].queue_offset + 1
    return out


def want(rows) -> dict[str, tuple[str, int, int, bytes]]:
    return {u: (t, q, o, b) for t, q, o, b, u in rows}


def tree_digest(root) -> dict[str, str]:
    out = {}
    for base, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(base, name), root) + "/"] = ""
        for name in files:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def apache_checkpoint(root, physic_ts: int) -> None:
    """Apache's checkpoint: physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp,
    masterFlushedOffset, confirmPhyOffset; the rest of the 4096 bytes zero."""
    with open(os.path.join(root, L.CHECKPOINT_FILE), "wb") as f:
        f.write(struct.pack(">qqqqq", physic_ts, physic_ts, physic_ts, 0, 0).ljust(4096, b"\0"))


# --- records without the CRC property ------------------------------------------------------------


@pytest.mark.parametrize("stop", ["clean", "crash"])
def test_records_without_the_crc_property_are_served_whole(tmp_path, stop):
    """Before: ``CommitLog cut at position 0 (offset 0): record CRC property missing``, the
    segment zeroed, the next deleted, 0 messages served."""
    with_crc_off = open_store(tmp_path, append_prop_crc=False)
    rows = put(with_crc_off, 900, body_bytes=300)  # several 64 KiB segments, BLANK records between
    with_crc_off.crash() if stop == "crash" else with_crc_off.shutdown()
    assert len(os.listdir(tmp_path / "commitlog")) >= 4
    with open_store(tmp_path) as s:  # append_prop_crc on: records of its own get the property
        assert served(s) == want(rows)
        more = put(s, 5, start=900)
    with open_store(tmp_path) as s:
        assert served(s) == want(rows + more)


def test_appends_without_the_property_after_ours_are_kept(tmp_path):
    """The round trip without Java: records with the property, then records without it appended
    by another writer (as Apache does), then ours again; before, the store cut exactly where its
    own records ended."""
    first = open_store(tmp_path)
    rows = put(first, 50)
    first.shutdown()
    other = open_store(tmp_path, append_prop_crc=False)
    rows += put(other, 7, start=50)
    other.shutdown()
    with open_store(tmp_path) as s:
        assert served(s) == want(rows)
        rows += put(s, 3, start=57)
    with open_store(tmp_path) as s:
        assert served(s) == want(rows)


def test_torn_record_without_the_property_at_the_tail_is_still_cut(tmp_path):
    """A torn tail (its last bytes never written) of a record without the property is cut, as
    before: the properties no longer end with their separator."""
    s = open_store(tmp_path, append_prop_crc=False)
    rows = put(s, 20)
    end = s.commitlog.max_offset
    s.crash()
    path = tmp_path / "commitlog" / ("0" * 20)
    with open(path, "r+b") as f:
        f.seek(end - 3)
        f.write(bytes(3))
    with open_store(tmp_path) as s:
        assert served(s) == want(rows[:-1])


def test_damaged_properties_of_a_record_without_the_property_are_not_served(tmp_path):
    s = open_store(tmp_path, append_prop_crc=False)
    put(s, 20)
    mf = s.commitlog.mfq.files[0]
    s.shutdown()
    with open(mf.path, "rb") as f:
        data = bytearray(f.read())
    assert check_record(data, 0, len(data))[0] == RecordCheck.VALID
    size = struct.unpack_from(">i", data, 0)[0]
    for bad in (b"\0", b"\xff"):
        damaged = bytearray(data)
        damaged[size - 5 : size - 4] = bad  # inside the UNIQ_KEY value
        kind, _, why = check_record(damaged, 0, len(damaged))
        assert kind == RecordCheck.INVALID and "properties" in why


# --- BLANK records of sparse segments ------------------------------------------------------------


def test_blank_record_of_a_sparse_segment_is_accepted(tmp_path):
    """Apache writes only the 8 bytes of the BLANK header and leaves its 1 GiB segments sparse:
    the readable bytes end before the BLANK's TOTALSIZE does.  Before: ``blank record size ...
    != remaining``, the log cut after the first segment."""
    s = open_store(tmp_path, append_prop_crc=False)
    rows = put(s, 12, body_bytes=20000)  # 20 KB records: the BLANK at a segment's end spans pages
    s.shutdown()
    segs = sorted(os.listdir(tmp_path / "commitlog"))
    assert len(segs) >= 3
    path = tmp_path / "commitlog" / segs[0]
    data = path.read_bytes()
    pos = 0
    while struct.unpack_from(">I", data, pos + 4)[0] != L.BLANK_MAGIC:
        pos += struct.unpack_from(">i", data, pos)[0]
    assert len(data) - pos > 4096 + 8
    os.unlink(path)  # the same bytes, sparse after the BLANK header's page
    with open(path, "wb") as f:
        f.write(data[: pos + 8])
        f.truncate(len(data))
    fd = os.open(path, os.O_RDONLY)
    try:
        hole = os.lseek(fd, 0, os.SEEK_HOLE)
    finally:
        os.close(fd)
    assert hole < len(data), "this filesystem keeps no holes"
    with open_store(tmp_path) as s:
        assert served(s) == want(rows)


# --- never cut what is proven written ------------------------------------------------------------


def test_valid_records_after_damage_stop_the_store(tmp_path):
    s = open_store(tmp_path, append_prop_crc=False)
    rows = put(s, 40)
    second = s.commitlog.read_record(0).store_size
    s.crash()
    path = tmp_path / "commitlog" / ("0" * 20)
    with open(path, "r+b") as f:
        f.seek(second + 30)
        f.write(b"\x55")
    before = tree_digest(tmp_path)
    with pytest.raises(CorruptStoreError) as e:
        open_store(tmp_path)
    assert str(path) in str(e.value) and f"position {second}" in str(e.value)
    assert "a valid record follows" in str(e.value)
    assert set(tree_digest(tmp_path)) == set(before)  # nothing deleted
    with open(path, "rb") as f:
        assert f.read()[second + 200 : second + 220] != bytes(20)
    assert len(rows) == 40


def test_consume_queue_unit_proving_a_record_past_the_cut_stops_the_store(tmp_path):
    """Records stored with an older clock after the damage are no proof by themselves (stale
    bytes past a cut look like that); a ConsumeQueue unit pointing at one is."""
    clock = FakeClock(1_700_000_000_000)
    s = open_store(tmp_path, clock=clock, append_prop_crc=False)
    put(s, 10)
    damaged_at = s.commitlog.max_offset
    put(s, 1, start=10)
    after = s.commitlog.max_offset
    put(s, 5, start=11)
    end = s.commitlog.max_offset
    s.shutdown()
    path = tmp_path / "commitlog" / ("0" * 20)
    with open(path, "r+b") as f:
        pos = after
        while (
            pos < end
        ):  # stored by a clock that stepped back (Apache's store times are not kept monotonic)
            f.seek(pos)
            size = struct.unpack(">i", f.read(4))[0]
            f.seek(pos + POS_STORE_TIMESTAMP_V4)
            f.write(struct.pack(">q", 1_600_000_000_000))
            pos += size
        f.seek(damaged_at + 4)
        f.write(b"\0\0\0\0")  # MAGICCODE gone
    os.unlink(tmp_path / L.CHECKPOINT_FILE)  # no durable offset of ours: only the unit proves it
    with pytest.raises(CorruptStoreError) as e:
        open_store(tmp_path)
    msg = str(e.value)
    assert f"{path}: corrupt CommitLog record at position {damaged_at}" in msg
    assert "of ConsumeQueue T" in msg and "points at a valid record" in msg, msg


def test_apache_checkpoint_vouches_for_flushed_records(tmp_path):
    """Apache's checkpoint (no RMQSPCK magic) was read as none, so a lost flushed tail was cut
    silently; its physicMsgTimestamp says which records were flushed."""
    clock = FakeClock(1_700_000_000_000)
    s = open_store(tmp_path, clock=clock, append_prop_crc=False)
    rows = put(s, 10)
    last_start = s.commitlog.max_offset
    clock.advance(1000)
    rows += put(s, 1, start=10)
    s.shutdown()
    os.unlink(tmp_path / L.ABORT_FILE) if (tmp_path / L.ABORT_FILE).exists() else None
    apache_checkpoint(tmp_path, 1_700_000_001_000)
    with open_store(tmp_path) as s:  # the log intact: served
        assert served(s) == want(rows)
    apache_checkpoint(tmp_path, 1_700_000_001_000)
    path = tmp_path / "commitlog" / ("0" * 20)
    with open(path, "r+b") as f:
        f.seek(last_start)
        f.write(bytes(64))  # the flushed last record lost
    with pytest.raises(CorruptStoreError) as e:
        open_store(tmp_path)
    assert f"position {last_start}" in str(
        e.value
    ) and "the checkpoint says records stored up to" in str(e.value)


# --- what cannot be served is refused before anything is written --------------------------------


def _mk(root, rel: str, data: bytes | None = b"x") -> None:
    path = os.path.join(root, rel)
    if os.path.exists(path + ".bak"):  # ours: Apache keeps one of its own
        os.unlink(path + ".bak")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if data is not None:
        with open(path, "wb") as f:
            f.write(data)


UNSERVABLE = {
    "rocksdb-cq": (lambda r: _mk(r, "consumequeue/CURRENT", b"MANIFEST-000001\n"), "RocksDB"),
    "rocksdb-sst": (lambda r: _mk(r, "consumequeue/000012.sst"), "RocksDB"),
    "rocksdb-config": (
        lambda r: os.makedirs(os.path.join(r, "config", "rdb")),
        "RocksDB configuration",
    ),
    "batch-cq-dir": (lambda r: _mk(r, "batchconsumequeue/B/0/" + "0" * 20), "batch ConsumeQueues"),
    "batch-cq-attr": (
        lambda r: _mk(
            r,
            "config/topics.json",
            json.dumps(
                {
                    "topicConfigTable": {
                        "B": {"topicName": "B", "attributes": {"+queue.type": "BatchCQ"}}
                    }
                }
            ).encode(),
        ),
        "queue.type=BatchCQ",
    ),
    "compaction-attr": (
        lambda r: _mk(
            r,
            "config/topics.json",
            json.dumps(
                {
                    "topicConfigTable": {
                        "C": {"topicName": "C", "attributes": {"+cleanup.policy": "COMPACTION"}}
                    }
                }
            ).encode(),
        ),
        "COMPACTION",
    ),
    "compaction-log": (lambda r: _mk(r, "compaction/compactionLog/C/0/" + "0" * 20), "compaction"),
    "dledger": (
        lambda r: (
            _mk(r, "DefaultBroker-n0/data/" + "0" * 20),
            _mk(r, "DefaultBroker-n0/index/" + "0" * 20),
        ),
        "DLedger",
    ),
    "controller-epoch": (lambda r: _mk(r, "epochFileCheckpoint"), "controller"),
    "controller-identity": (lambda r: _mk(r, "brokerIdentity"), "controller"),
    "tiered-metadata": (lambda r: _mk(r, "config/tieredStoreMetadata.json", b"{}"), "tiered store"),
    "tiered-index": (lambda r: os.makedirs(os.path.join(r, "tiered_index_file")), "tiered store"),
    "cq-ext": (
        lambda r: _mk(r, "consumequeue_ext/T/0/" + "0" * 20, bytes(4096)),
        "enableConsumeQueueExt",
    ),
    "commitlog-elsewhere": (
        lambda r: (
            _mk(r, "consumequeue/T/0/" + "0" * 20, b"\1" * 20),
            _mk(r, "config/timermetrics"),
        ),
        "storePathCommitLog",
    ),
}


@pytest.mark.parametrize("kind", sorted(UNSERVABLE))
def test_store_it_cannot_serve_is_refused_before_anything_is_written(tmp_path, kind):
    root = tmp_path / "store"
    if kind != "commitlog-elsewhere":
        s = open_store(root, append_prop_crc=False)
        put(s, 5)
        s.shutdown()
    else:
        root.mkdir()
    make, named = UNSERVABLE[kind]
    make(str(root))
    before = tree_digest(root)
    with pytest.raises(ApacheStoreError) as e:
        open_store(root)
    assert named in str(e.value) and str(root) in str(e.value)
    assert tree_digest(root) == before


# --- Apache's lock -------------------------------------------------------------------------------

_HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)  # what Java's FileChannel.tryLock(0, 1, false) takes
print("locked", flush=True)
sys.stdin.read()
"""


def test_store_held_with_apaches_posix_lock_is_refused(tmp_path):
    """flock and POSIX record locks do not exclude each other on Linux: before, the store opened
    while Apache RocketMQ held it."""
    s = open_store(tmp_path)
    put(s, 3)
    s.shutdown()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path / L.LOCK_FILE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = tree_digest(tmp_path)
        with pytest.raises(StoreLockedError) as e:
            open_store(tmp_path)
        assert f"pid {holder.pid}" in str(e.value) and str(tmp_path / L.LOCK_FILE) in str(e.value)
        assert tree_digest(tmp_path) == before
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()
    with open_store(tmp_path) as s:  # released: opens
        assert len(served(s)) == 3


def test_lock_is_kept_when_a_second_open_in_the_process_fails(tmp_path):
    """A failed second open closes its descriptor of the lock file; the first store's POSIX lock
    (an open-file-description lock) stays, so Apache's tryLock still fails."""
    probe = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    print("free")
except OSError:
    print("held")
"""
    with open_store(tmp_path) as s:
        with pytest.raises(StoreLockedError):
            open_store(tmp_path)
        got = subprocess.run(
            [sys.executable, "-c", probe, str(tmp_path / L.LOCK_FILE)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert got == "held"
        assert s.commitlog is not None


# --- segment sizes other than the defaults (mappedFileSizeCommitLog, mappedFileSizeConsumeQueue) ----


def test_segment_sizes_are_taken_from_the_files(tmp_path):
    """A store written with 64 KiB CommitLog segments and ConsumeQueue files of 100 units (as an
    Apache broker.conf may set them) opens with the default configuration, serves every message
    and appends in its own sizes.  Before: ``segment is 65536 bytes, expected 1073741824``."""
    first = open_store(tmp_path, append_prop_crc=False)
    rows = put(first, 900, body_bytes=300)
    first.shutdown()
    _mk(str(tmp_path), "config/subscriptionGroup.json", b"{}")  # as Apache's
    segments = sorted(os.listdir(tmp_path / "commitlog"))
    assert len(segments) >= 4
    with MessageStore(str(tmp_path), StoreConfig(), clock=FakeClock()) as s:
        assert (s.config.commitlog_segment_bytes, s.config.cq_segment_units) == (64 * 1024, 100)
        assert served(s) == want(rows)
        rows += put(s, 300, start=900, body_bytes=300)
    sizes = {
        os.path.getsize(tmp_path / "commitlog" / n) for n in os.listdir(tmp_path / "commitlog")
    }
    assert sizes == {64 * 1024} and len(os.listdir(tmp_path / "commitlog")) > len(segments)
    cq_sizes = {
        os.path.getsize(os.path.join(b, f))
        for b, _, fs in os.walk(tmp_path / "consumequeue")
        for f in fs
    }
    assert cq_sizes == {100 * L.CQ_UNIT_BYTES}
    with MessageStore(str(tmp_path), StoreConfig(), clock=FakeClock()) as s:
        assert served(s) == want(rows)


def _resize(path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def _only_first_segment(root, size: int) -> None:
    """One segment left, cut to ``size`` bytes."""
    for path in sorted((root / "commitlog").iterdir())[1:]:
        os.unlink(path)
    _resize(root / "commitlog" / ("0" * 20), size)


SIZE_MISMATCH = {
    "commitlog-size": (
        lambda r: _resize(sorted((r / "commitlog").iterdir())[1], 32 * 1024),
        "CommitLog segment of 32768 bytes, but {first} is 65536",
    ),
    "commitlog-name": (
        lambda r: os.rename(
            sorted((r / "commitlog").iterdir())[-1],
            r / "commitlog" / f"{3 * 64 * 1024 + 4096:020d}",
        ),
        "expected",
    ),
    "cq-units": (
        lambda r: _resize(r / "consumequeue" / "T1" / "1" / ("0" * 20), 1990),
        "not a whole number of 20-byte units",
    ),
    "cq-size": (
        lambda r: _resize(r / "consumequeue" / "T1" / "1" / ("0" * 20), 4000),
        "ConsumeQueue file of 4000 bytes, but",
    ),
    "commitlog-short": (
        lambda r: _only_first_segment(r, 1000),
        "CommitLog segment of 1000 bytes, less than 4096",
    ),
}


@pytest.mark.parametrize("kind", sorted(SIZE_MISMATCH))
def test_segment_files_that_disagree_are_refused_naming_the_file(tmp_path, kind):
    s = open_store(tmp_path, append_prop_crc=False)
    put(s, 900, body_bytes=300)
    s.shutdown()
    _mk(
        str(tmp_path), "config/subscriptionGroup.json", b"{}"
    )  # as Apache's (in a store of its own,
    # a segment of another size than configured stays CorruptStoreError: test_recovery.py)
    make, said = SIZE_MISMATCH[kind]
    make(tmp_path)
    before = tree_digest(tmp_path)
    with pytest.raises(ApacheStoreError) as e:
        MessageStore(str(tmp_path), StoreConfig(), clock=FakeClock())
    first = str(sorted((tmp_path / "commitlog").iterdir())[0])
    assert said.format(first=first) in str(e.value)
    assert str(tmp_path) in str(e.value)
    assert tree_digest(tmp_path) == before
