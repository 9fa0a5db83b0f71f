"""Damage inside a store is reported with its file and position, never cut silently nor served:
issue 17 items 4 (a bad size field in a crashed store), 5 (a flipped body byte in a clean one),
6 (zeroed records inside the durable range) and 7 (ConsumeQueue units damaged or deleted)."""

from __future__ import annotations

import os
import shutil

import pytest

from rmq_spark.errors import CorruptStoreError
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.message import Message
from rmq_spark.store.record import POS_BODY_V4
from rmq_spark.store.store import MessageStore, StoreConfig

SEG = 32 * 1024
SMALL = dict(commitlog_segment_bytes=SEG, cq_segment_units=40)


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
    offset, size = placed[20]
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
    offset, size = placed[-1]
    patch(segment_path(d, offset), offset % SEG + 1, b"\x7f")  # its size field, nothing after
    with open_store(d) as s:
        assert s.commitlog.max_offset == offset
        assert s.max_offset("A", 0) == 10 + 99
