"""Recovery: clean restart, torn tails, corruption, ConsumeQueue rebuild, kill -9 of a writer."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys

import pytest
from _killing import lines_until_killed

from rmq_spark.errors import CorruptStoreError
from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.message import Message
from rmq_spark.store.store import MessageStore, StoreConfig

SMALL = {"commitlog_segment_bytes": 32 * 1024, "cq_segment_units": 40}


def open_store(d, **kw):
    return MessageStore(d, StoreConfig(**{**SMALL, **kw}), clock=FakeClock())


def cq_snapshot(s):
    out = {}
    for key in s.queue_keys():
        cq = s.consume_queue(*key)
        out[key] = cq.units(0, cq.max_offset).tobytes()
    return out


def fill(s, n=300, seed=1):
    rng = random.Random(seed)
    for i in range(n):
        s.put_message(
            Message(
                f"T{i % 3}",
                rng.randbytes(rng.randint(0, 400)),
                {"TAGS": f"g{i % 5}"},
                queue_id=i % 4,
            )
        )


def test_clean_restart_keeps_everything(store_dir):
    with open_store(store_dir) as s:
        fill(s)
        before = cq_snapshot(s)
        end = s.commitlog.max_offset
    assert not os.path.exists(os.path.join(store_dir, L.ABORT_FILE))
    with open_store(store_dir) as s:
        assert not s.last_exit_abnormal
        assert s.commitlog.max_offset == end
        assert cq_snapshot(s) == before
        r = s.put_message(Message("T0", b"after", queue_id=0))
        assert r.append.wrote_offset == end
        assert r.append.queue_offsets[0] == s.max_offset("T0", 0) - 1


def _write_then_crash(d):
    """300 messages durable and checkpointed, then one more appended but never checkpointed."""
    s = open_store(d)
    fill(s)
    s.flush_all()
    before = cq_snapshot(s)
    end = s.commitlog.max_offset
    r = s.put_message(Message("T1", b"L" * 100, {"KEYS": "last"}, queue_id=2))
    s.crash()
    return before, end, r.append.wrote_offset, r.append.end_offset


def test_torn_tail_at_every_byte_of_the_last_record(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    before, good_end, last_start, last_end = _write_then_crash(str(base))
    seg = 32 * 1024
    # the torn record is within one segment
    assert last_start // seg == (last_end - 1) // seg
    for cut in range(last_start, last_end):
        d = tmp_path / f"cut{cut}"
        shutil.copytree(base, d)
        path = os.path.join(d, "commitlog", f"{(last_start // seg) * seg:020d}")
        with open(path, "r+b") as f:
            f.seek(cut % seg)
            f.write(bytes(last_end - cut))  # bytes from `cut` on never reached the disk
        with open_store(str(d)) as s:
            assert s.last_exit_abnormal
            assert s.commitlog.max_offset == good_end, cut
            assert cq_snapshot(s) == before, cut
            r = s.put_message(Message("T1", b"again", queue_id=2))
            assert r.append.wrote_offset == good_end
        shutil.rmtree(d)
    # and the untorn case keeps the last record
    with open_store(str(base)) as s:
        assert s.commitlog.max_offset == last_end
        assert s.get_messages("T1", 2, s.max_offset("T1", 2) - 1).messages[0].keys == "last"


def test_torn_tail_with_garbage_instead_of_zeros(tmp_path):
    d = str(tmp_path / "s")
    before, good_end, last_start, _last_end = _write_then_crash(d)
    seg = 32 * 1024
    path = os.path.join(d, "commitlog", f"{(last_start // seg) * seg:020d}")
    with open(path, "r+b") as f:
        f.seek(last_start % seg + 90)
        f.write(b"\xff" * 10)  # a page of the body was written with other bytes
    with open_store(d) as s:
        assert s.commitlog.max_offset == good_end
        assert cq_snapshot(s) == before


def test_corruption_inside_durable_data_is_reported_with_file_and_position(store_dir):
    with open_store(store_dir) as s:
        fill(s, 100)
        victim = s.get_messages("T0", 0, 3).messages[0]
    seg = 32 * 1024
    # the store starts its scan from the checkpoint: make it scan from the beginning
    shutil.rmtree(os.path.join(store_dir, "consumequeue"))
    path = os.path.join(store_dir, "commitlog", f"{(victim.commitlog_offset // seg) * seg:020d}")
    pos = victim.commitlog_offset % seg
    with open(path, "r+b") as f:
        f.seek(pos + victim.store_size - 3)
        f.write(b"\x00\x00\x00")  # damage inside the record (its properties)
    with pytest.raises(CorruptStoreError) as e:
        open_store(store_dir)
    assert e.value.path == path and e.value.position == pos
    assert f"position {pos}" in str(e.value) and path in str(e.value)
    # without a checkpoint the damage is still told from a torn tail: valid records follow it
    os.unlink(os.path.join(store_dir, "checkpoint"))
    shutil.rmtree(os.path.join(store_dir, "consumequeue"))
    with pytest.raises(CorruptStoreError, match=f"position {pos}"):
        open_store(store_dir)
    # told to truncate, the store cuts the log at the damaged record
    shutil.rmtree(os.path.join(store_dir, "consumequeue"))
    with open_store(store_dir, truncate_corrupt=True) as s:
        assert s.commitlog.max_offset == victim.commitlog_offset
        assert s.max_offset("T0", 0) == 3


def test_wrong_segment_size_is_corruption(store_dir):
    with open_store(store_dir) as s:
        fill(s, 10)
    path = os.path.join(store_dir, "commitlog", "00000000000000000000")
    with open(path, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(CorruptStoreError, match="expected 32768"):
        open_store(store_dir)


def test_rebuilt_consume_queues_equal_the_originals(store_dir):
    with open_store(store_dir) as s:
        fill(s, 500)
        before = cq_snapshot(s)
        s.rebuild_consume_queues()
        assert cq_snapshot(s) == before
    shutil.rmtree(os.path.join(store_dir, "consumequeue"))
    with open_store(store_dir) as s:
        assert cq_snapshot(s) == before


def test_consume_queue_behind_commitlog_is_redispatched(store_dir):
    """A crash after the CommitLog append but before the queue units were flushed."""
    s = open_store(store_dir)
    fill(s, 100)
    s.flush_all()
    before_max = s.max_offset("T0", 0)
    fill(s, 30, seed=7)
    full = cq_snapshot(s)
    s.crash()
    # zero the units written after the checkpoint, as if they never reached the disk
    cq_dir = os.path.join(store_dir, "consumequeue", "T0", "0")
    for name in sorted(os.listdir(cq_dir)):
        first_unit = int(name) // 20
        cut = max(0, before_max - first_unit) * 20
        with open(os.path.join(cq_dir, name), "r+b") as f:
            size = os.path.getsize(f.name)
            if cut < size:
                f.seek(cut)
                f.write(bytes(size - cut))
    with open_store(store_dir) as s:
        assert cq_snapshot(s) == full


WRITER = r"""
import sys
from rmq_spark.store.store import MessageStore, StoreConfig
from rmq_spark.store.message import Message
d, start = sys.argv[1], int(sys.argv[2])
s = MessageStore(d, StoreConfig(commitlog_segment_bytes=64 * 1024, cq_segment_units=100, flush="sync"))
i = start
while True:
    n = 1 + i % 7
    r = s.put_messages([Message("K", b"%d" % (i + k) * (1 + (i + k) % 50), {"KEYS": str(i + k)}, queue_id=(i + k) % 2) for k in range(n)])
    assert r.ok
    print(" ".join(str(i + k) for k in range(n)), flush=True)  # acknowledged
    i += n
"""


@pytest.mark.slow
def test_kill_9_writer_loses_no_acknowledged_message(store_dir):
    acked: set[int] = set()
    rng = random.Random(42)
    next_id = 0
    for round_ in range(8):
        p = subprocess.Popen(
            [sys.executable, "-c", WRITER, store_dir, str(next_id)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            lines = lines_until_killed(p, rng.uniform(0.3, 1.2))
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
            p.stderr.close()
        for line in lines:
            if line.endswith("\n"):
                acked.update(int(x) for x in line.split())
        # restart: every acknowledged message is there exactly once, in order per queue
        with MessageStore(
            store_dir, StoreConfig(commitlog_segment_bytes=64 * 1024, cq_segment_units=100)
        ) as s:
            seen = []
            for q in range(2):
                off = 0
                while True:
                    g = s.get_messages("K", q, off, max_msgs=1000)
                    if not g.messages:
                        break
                    seen.extend(int(m.keys) for m in g.messages)
                    off = g.next_begin_offset
            assert len(seen) == len(set(seen)), "duplicates after recovery"
            missing = acked - set(seen)
            assert not missing, f"round {round_}: lost acknowledged messages {sorted(missing)[:10]}"
            next_id = max(seen) + 1 if seen else 0
    assert len(acked) > 50


READER = r"""
import sys, time
from rmq_spark.store.reader import StoreReader
d, want = sys.argv[1], int(sys.argv[2])
r = StoreReader(d)
seen = 0
deadline = time.monotonic() + 60
while seen < want and time.monotonic() < deadline:
    hi = r.max_offset("R", 0)
    if hi > seen:
        b = r.read_arrow("R", 0, seen, hi)
        bodies = b.column("body").to_pylist()
        offs = b.column("queueOffset").to_pylist()
        for o, body in zip(offs, bodies):
            assert body == b"%d" % o * 20, (o, body[:20])
        seen = hi
    else:
        time.sleep(0.002)
print(seen)
"""


def test_reader_process_reads_while_writer_appends(store_dir):
    total = 3000
    with MessageStore(
        store_dir, StoreConfig(commitlog_segment_bytes=64 * 1024, cq_segment_units=100)
    ) as s:
        s.put_message(Message("R", b"0" * 20))
        p = subprocess.Popen(
            [sys.executable, "-c", READER, store_dir, str(total)], stdout=subprocess.PIPE, text=True
        )
        try:
            i = 1
            while i < total:
                n = min(37, total - i)
                s.put_bodies("R", 0, [b"%d" % (i + k) * 20 for k in range(n)])
                i += n
            out, _ = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 0
        assert int(out.strip()) == total
        assert len(s.commitlog.mfq.files) > 3  # the reader followed segment rollover


def test_checkpoint_file_layout(store_dir):
    import struct
    import zlib

    clock = FakeClock(1_700_000_000_000)
    s = MessageStore(store_dir, StoreConfig(**SMALL), clock=clock)
    s.put_message(Message("C", b"x"))
    end = s.commitlog.max_offset
    s.shutdown()
    with open(os.path.join(store_dir, "checkpoint"), "rb") as f:
        raw = f.read()
    assert len(raw) == 4096
    physic, logics, _index, master, confirm, dispatched = struct.unpack_from(">qqqqqq", raw, 0)
    assert physic == logics == 1_700_000_000_000 and master == 0
    assert confirm == dispatched == end
    assert raw[48:56] == b"RMQSPCK2"
    assert struct.unpack_from(">I", raw, 56)[0] == zlib.crc32(raw[:56])
    assert not any(raw[60:])
