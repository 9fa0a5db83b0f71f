"""The CommitLog's recovery scan: every record checked (magic, size, CRCs) from a segment on,
handed on for re-dispatch, the log cut after the last valid one.

Records are checked as Apache RocketMQ's recovery checks them, whoever wrote them (a store Apache
wrote, or appended to, opens whole): the ``__CRC32#`` property is verified where a record carries
it, required only inside this store's own write in flight.

What stops the scan decides what happens: the end of the log, or a write torn by a kill (the write
in flight, :mod:`rmq_spark.store.inflight`), is cut; what is proven written past the stop stops the
store with file, position and the proof (:class:`CorruptStoreError`) unless the operator asked to
cut it (``truncate_corrupt``): bytes below the durable offset of our checkpoint, a valid record
after the stop (at the offset its PHYSICALOFFSET names, stored no earlier than the last one
before it), a ConsumeQueue unit pointing at a valid record past it, or records short of the store
time Apache's checkpoint says was flushed.  Checked before anything is cut.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from rmq_spark.errors import CorruptStoreError
from rmq_spark.store import layout as L
from rmq_spark.store.dispatch import DispatchBatch
from rmq_spark.store.message import MessageExt
from rmq_spark.store.record import (
    POS_PHYSICAL_OFFSET,
    RecordCheck,
    check_record,
    decode_record,
    store_timestamp_at,
)

__all__ = ["recover", "torn_write", "unit_past", "valid_record_after"]

_PHYS = struct.Struct(">q")

log = logging.getLogger("rmq_spark.store")


def recover(
    cl: Any,
    scan_from: int,
    confirmed_offset: int,
    truncate_corrupt: bool,
    on_batch: Callable[[DispatchBatch], None],
    batch_records: int = 4096,
    force_prop_crc: bool = False,
    consume_queues: Iterable[Any] = (),
    durable_store_ts: int = 0,
) -> int:
    """Scan records from ``scan_from`` (the start of a segment), hand them to ``on_batch`` for
    re-dispatch, and cut the log after the last valid one.

    Records are checked as Apache RocketMQ checks them (:func:`check_record`), whoever wrote
    them; ``force_prop_crc`` (this store appends the ``__CRC32#`` property) requires the property
    only inside the write in flight at a crash, the one place a record of this store's own can be
    half copied.  Nothing is cut that is proven written: an invalid record below
    ``confirmed_offset`` (bytes that were durable), a valid record after the stop (at the offset
    its PHYSICALOFFSET names), a unit of ``consume_queues`` pointing at a valid record past the
    stop, or records short of ``durable_store_ts`` (Apache's checkpoint: every record stored up to
    then was flushed) are corruption: :class:`CorruptStoreError` names the file, the position and
    the proof unless ``truncate_corrupt``.  Returns the end of the valid log."""
    if not cl.mfq.files:
        return 0
    start_mf = cl.mfq.find(scan_from)
    if start_mf is None:
        start_mf = cl.mfq.files[0] if scan_from < cl.mfq.min_offset else cl.mfq.files[-1]
        scan_from = start_mf.from_offset if scan_from < cl.mfq.min_offset else start_mf.end_offset
    start_idx = cl.mfq.files.index(start_mf)
    end = scan_from
    collector = _BatchCollector(on_batch, batch_records)
    stop_reason = ""
    stop_path = ""
    proof = ""
    found = cl.inflight.found if force_prop_crc and cl.inflight is not None else None
    for mf in cl.mfq.files[start_idx:]:
        pos = scan_from - mf.from_offset if mf is start_mf else 0
        if pos >= mf.size_bytes:
            continue
        stopped = False
        while True:
            at = mf.from_offset + pos
            kind, size, reason = check_record(  # never into a hole (see mapped.data_end)
                mf.mm, pos, max(pos, mf.data_bytes), check_crc=True,
                force_prop_crc=found is not None and found[0] <= at < found[1], segment_end=mf.size_bytes,
            )  # fmt: skip
            if (
                kind == RecordCheck.VALID
                and _PHYS.unpack_from(mf.mm, pos + POS_PHYSICAL_OFFSET)[0] != at
            ):
                kind, reason = (
                    RecordCheck.INVALID,
                    f"the record says it is at offset {_PHYS.unpack_from(mf.mm, pos + POS_PHYSICAL_OFFSET)[0]}",
                )
            if kind == RecordCheck.VALID:
                collector.add(mf.mm, pos, at)
                pos += size
                end = mf.from_offset + pos
                continue
            if kind == RecordCheck.BLANK:
                end = mf.end_offset
                break
            stop_reason = reason if kind == RecordCheck.INVALID else "no record"
            stop_path = mf.path
            stopped = True
            break
        if stopped:
            break
    collector.flush()
    if stop_path:
        mf = cl.mfq.find(end) or cl.mfq.files[-1]
        later = valid_record_after(cl, mf, end - mf.from_offset, False, collector.last_store_ts)
        if later is not None and torn_write(cl, end, collector.last_store_ts):
            stop_reason += (
                f"; the rest of the write in flight at the crash {cl.inflight.found} is cut"
            )
        elif later is not None:
            # a valid record follows: the log was written past here, this is damage inside it,
            # not a torn tail (whatever the checkpoint says)
            proof = f"a valid record follows at offset {later}"
            confirmed_offset = max(confirmed_offset, later + 1)
        if not proof:
            unit = unit_past(cl, consume_queues, end)
            if unit is not None:
                proof = unit
                confirmed_offset = max(confirmed_offset, end + 1)
    if (
        not proof
        and durable_store_ts > 0
        and collector.last_store_ts < durable_store_ts
        and scan_from <= cl.mfq.min_offset
    ):
        proof = (
            f"the checkpoint says records stored up to {durable_store_ts} (ms) were flushed, the last record "
            f"found was stored at {collector.last_store_ts}"
        )
        stop_path = stop_path or (cl.mfq.find(end) or cl.mfq.files[-1]).path
        stop_reason = stop_reason or "no record"
        confirmed_offset = max(confirmed_offset, end + 1)
    if end < confirmed_offset and not truncate_corrupt:
        mf = cl.mfq.find(end) or cl.mfq.files[-1]
        said = f"; {proof}" if proof else ""
        raise CorruptStoreError(
            f"{stop_path or mf.path}: corrupt CommitLog record at position {end - mf.from_offset} "
            f"(offset {end}): {stop_reason}{said}; durable bytes follow, which the store does not cut. "
            "Start with truncate_corrupt=True (--truncate-corrupt) to cut the log there.",
            stop_path or mf.path,
            end - mf.from_offset,
        )
    if proof:
        stop_reason += f"; {proof}"
    if stop_path and stop_reason != "no record":  # torn or corrupt: what is cut is said
        mf = cl.mfq.find(end) or cl.mfq.files[-1]
        log.warning("recovery: %s: CommitLog cut at position %d (offset %d): %s", stop_path,
                    end - mf.from_offset, end, stop_reason)  # fmt: skip
    log.info("recovery: CommitLog checked from offset %d to %d (%d bytes re-dispatched)", scan_from, end,
             end - scan_from)  # fmt: skip
    cl.mfq.truncate_dirty(end)
    if cl.inflight is not None:
        cl.inflight.clear()
    for mf in cl.mfq.files:
        mf.flushed_position = mf.wrote_position
    cl.last_store_timestamp_ms = max(cl.last_store_timestamp_ms, collector.last_store_ts)
    return end


def torn_write(cl: Any, offset: int, since_ts: int = 0) -> bool:
    """Is the damage at ``offset`` the torn tail of the write that was in flight (see
    :mod:`rmq_spark.store.inflight`): inside its range, and no valid record at or after its end?"""
    found = cl.inflight.found if cl.inflight is not None else None
    if found is None or not found[0] <= offset < found[1]:
        return False
    seg = cl.mfq.find(found[1] - 1)
    return (
        seg is not None
        and valid_record_after(cl, seg, found[1] - 1 - seg.from_offset, False, since_ts) is None
    )


def valid_record_after(
    cl: Any, mf: Any, pos: int, force_prop_crc: bool = False, since_ts: int = 0
) -> int | None:
    """The CommitLog offset of the first valid record after ``pos`` of segment ``mf`` (in it
    or in a later segment), None if there is none: then what stopped a scan at ``pos`` is
    the end of the log (a torn tail), else damage inside it.  Candidates are found by their
    MAGICCODE (``mmap.find``), not by the damaged record's own size field, which may be the
    damaged part; each is held to :func:`check_record` with its CRCs, to its PHYSICALOFFSET
    naming the offset it is at (a record copied from elsewhere is no proof) and to a store
    time not before ``since_ts`` (the last valid record's): Apache RocketMQ leaves the bytes
    after a cut as they were, so older records may lie past a later, shorter append."""
    magics = [struct.pack(">I", m) for m in (L.MAGIC_V1, L.MAGIC_V2)]
    files = cl.mfq.files
    for seg in files[files.index(mf) :]:
        start = pos + 1 if seg is mf else 0
        hits = []
        limit = seg.data_bytes  # never into a hole (see mapped.data_end)
        for magic in magics:
            at = seg.mm.find(magic, start + 4, limit)
            while at >= 0:
                kind, _, _ = check_record(seg.mm, at - 4, limit, True, force_prop_crc)
                if (
                    kind == RecordCheck.VALID
                    and _PHYS.unpack_from(seg.mm, at - 4 + POS_PHYSICAL_OFFSET)[0]
                    == seg.from_offset + at - 4
                    and store_timestamp_at(seg.mm, at - 4) >= since_ts
                ):
                    hits.append(at - 4)
                    break
                at = seg.mm.find(magic, at + 1, limit)
        if hits:
            return seg.from_offset + min(hits)
    return None


def unit_past(cl: Any, consume_queues: Iterable[Any], end: int, chunk: int = 4096) -> str | None:
    """A ConsumeQueue unit at or past CommitLog offset ``end`` that points at a valid record
    (TOTALSIZE the unit's size, PHYSICALOFFSET the unit's offset): the record was written and
    dispatched, so it may have been acknowledged; what proves it (file, position, unit), or None.
    A unit pointing at zeros or garbage is a ConsumeQueue ahead of a CommitLog tail that never
    reached the disk (a power loss): Apache RocketMQ and this store then drop the unit."""
    for cq in consume_queues:
        if cq.max_phys_end <= end:
            continue
        hi = cq.max_offset
        while hi > cq.min_offset:
            lo = max(cq.min_offset, hi - chunk)
            units = cq.units(lo, hi)
            for i in range(len(units) - 1, -1, -1):
                phys, size = int(units["offset"][i]), int(units["size"][i])
                if phys + size <= end:
                    break
                if _record_at(cl, phys, size):
                    path, pos = cq.unit_location(lo + i)
                    return (
                        f"unit {lo + i} of ConsumeQueue {cq.topic}/{cq.queue_id} ({path} position {pos}) points "
                        f"at a valid record at offset {phys} ({size} bytes)"
                    )
            else:
                hi = lo
                continue
            break
    return None


def _record_at(cl: Any, phys: int, size: int) -> bool:
    seg = cl.mfq.find(phys)
    if seg is None or size <= 0:
        return False
    pos = phys - seg.from_offset
    kind, total, _ = check_record(
        seg.mm, pos, max(pos, seg.data_bytes), True, False, seg.size_bytes
    )
    return (
        kind == RecordCheck.VALID
        and total == size
        and _PHYS.unpack_from(seg.mm, pos + POS_PHYSICAL_OFFSET)[0] == phys
    )


class _BatchCollector:
    """Gathers scanned records into DispatchBatches."""

    def __init__(self, on_batch: Callable[[DispatchBatch], None], limit: int) -> None:
        self.on_batch = on_batch
        self.limit = limit
        self.rows: list[MessageExt] = []
        self.last_store_ts = 0

    def add(self, buf, pos: int, phys: int) -> None:  # type: ignore[no-untyped-def]
        m = decode_record(buf, pos, read_body=False)
        m.commitlog_offset = phys
        self.rows.append(m)
        if len(self.rows) >= self.limit:
            self.flush()

    def flush(self) -> None:
        rows = self.rows
        if not rows:
            return
        self.rows = []
        self.last_store_ts = max(self.last_store_ts, rows[-1].store_timestamp_ms)
        self.on_batch(
            DispatchBatch(
                phys=np.fromiter(
                    (m.commitlog_offset for m in rows), dtype=np.int64, count=len(rows)
                ),
                sizes=np.fromiter((m.store_size for m in rows), dtype=np.int32, count=len(rows)),
                topics=[m.topic for m in rows],
                queue_ids=np.fromiter((m.queue_id for m in rows), dtype=np.int32, count=len(rows)),
                queue_offsets=np.fromiter(
                    (m.queue_offset for m in rows), dtype=np.int64, count=len(rows)
                ),
                tags_codes=np.zeros(len(rows), dtype=np.int64),  # filled by the store
                sys_flags=np.fromiter((m.sys_flag for m in rows), dtype=np.int32, count=len(rows)),
                store_timestamps=np.fromiter(
                    (m.store_timestamp_ms for m in rows), dtype=np.int64, count=len(rows)
                ),
                keys=[m.keys for m in rows],
                uniq_keys=[m.uniq_key for m in rows],
                properties=[m.properties for m in rows],
            )
        )
