"""The ConsumeQueues held to the CommitLog: every unit against the record it names, and the units
of all queues against the log they index.

A unit is sound when the bytes it names are a whole record (magic, TOTALSIZE equal to the unit's
size, PHYSICALOFFSET equal to the unit's offset, a layout that adds up) of the unit's topic and
queue at the unit's queue offset: :func:`bad_units` checks that for many units at once with numpy
(:func:`record.check_records`), with the record CRCs on a read that serves clients and without
them on a start.  On a start, :func:`check_consume_queues` also lays the units of every queue
side by side: they must cover the CommitLog from its first to its last record, except for records
that get no unit (PREPARED and ROLLBACK ones) and the BLANK fillers at segment ends, which the
gaps between units must hold and nothing else.  A queue whose unit was overwritten (and cut by
its own recovery), a deleted ConsumeQueue directory, a unit pointing at another record: each
shows there, named with its file and position, and the store rebuilds its queues from the
CommitLog (as RocketMQ's recovery re-dispatches).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rmq_spark.errors import CorruptStoreError
from rmq_spark.store import layout as L
from rmq_spark.store import record as R
from rmq_spark.store.consumequeue import ConsumeQueue
from rmq_spark.store.mapped import MappedFileQueue

__all__ = ["bad_units", "check_consume_queues", "check_units"]

_INT = np.dtype(">i4")


def bad_units(
    commitlog: MappedFileQueue,
    phys: np.ndarray,
    sizes: np.ndarray,
    topic: str,
    queue_id: int,
    queue_offsets: np.ndarray,
    force_prop_crc: bool = False,
    check_crc: bool = True,
) -> np.ndarray:
    """The mask of units (CommitLog offsets ``phys``, ``sizes``, at ``queue_offsets`` of
    ``topic``/``queue_id``) whose record is not what they say, or lies outside the log."""
    n = len(phys)
    bad = np.ones(n, dtype=bool)
    files = commitlog.files
    if n == 0 or not files:
        return bad
    phys = phys.astype(np.int64, copy=False)
    seg_idx = (phys - commitlog.min_offset) // commitlog.segment_bytes
    inside = np.flatnonzero((phys >= commitlog.min_offset) & (seg_idx < len(files)) & (sizes > 0))
    if len(inside) == 0:
        return bad
    topic_bytes = topic.encode("utf-8")
    seg = seg_idx[inside]
    order = np.argsort(seg, kind="stable") if bool((seg[1:] < seg[:-1]).any()) else None
    rows = inside if order is None else inside[order]
    seg = seg_idx[rows]
    cuts = np.flatnonzero(seg[1:] != seg[:-1]) + 1
    for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(rows)], strict=True):
        r = rows[a:b]
        mf = files[int(seg[a])]
        buf = np.frombuffer(mf.mm, dtype=np.uint8)
        bad[r] = R.check_records(
            buf, mf.wrote_position, phys[r] - mf.from_offset, sizes[r], phys[r], force_prop_crc,
            topic_bytes, queue_id, queue_offsets[r], check_crc,
        )  # fmt: skip
        del buf
    return bad


def why_bad(
    commitlog: MappedFileQueue, phys: int, size: int, force_prop_crc: bool
) -> tuple[str, int, str]:
    """(CommitLog file, position, reason) of one unit :func:`bad_units` flagged."""
    mf = commitlog.find(phys) if commitlog.files else None
    if mf is None or size <= 0:
        return commitlog.directory, phys, f"{size} bytes at offset {phys} are outside the CommitLog"
    pos = phys - mf.from_offset
    why = R.verify_record(mf.mm, pos, mf.wrote_position, phys, size, force_prop_crc)
    return mf.path, pos, why or "the record belongs to another queue or queue offset"


def check_units(
    commitlog: MappedFileQueue,
    phys: np.ndarray,
    sizes: np.ndarray,
    topic: str,
    queue_id: int,
    queue_offsets: np.ndarray,
    force_prop_crc: bool = False,
) -> None:
    """:func:`bad_units` with the CRCs, before a read serves the records: the first bad one
    raises :class:`CorruptStoreError` naming its CommitLog file and position."""
    bad = bad_units(commitlog, phys, sizes, topic, queue_id, queue_offsets, force_prop_crc)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        path, pos, why = why_bad(commitlog, int(phys[i]), int(sizes[i]), force_prop_crc)
        raise CorruptStoreError(
            f"{path}: corrupt CommitLog record at position {pos} (offset {int(phys[i])}), unit "
            f"{int(queue_offsets[i])} of {topic}/{queue_id}: {why}; it is not served",
            path,
            pos,
        )


def check_consume_queues(
    cqs: Mapping[tuple[str, int], ConsumeQueue],
    commitlog: MappedFileQueue,
    end: int,
    force_prop_crc: bool,
    deleted: Mapping[str, int] | None = None,
) -> list[str]:
    """What is wrong with the queues (each problem names its file and position; empty when
    every unit is sound and together they index every record of the log up to ``end``, but
    for the records of a deleted topic below its tombstone in ``deleted``, which get none).
    Damage in the CommitLog itself, found in a gap between units, raises
    :class:`CorruptStoreError`."""
    problems: list[str] = []
    all_phys, all_sizes = [], []
    for (topic, qid), cq in sorted(cqs.items()):
        lo, hi = cq.min_offset, cq.max_offset
        if hi <= lo:
            continue
        units = cq.units(lo, hi)
        phys = units["offset"].astype(np.int64)
        sizes = units["size"].astype(np.int64)
        live = phys >= commitlog.min_offset  # units of deleted (expired) segments are passed over
        qoffs = np.arange(lo, hi, dtype=np.int64)
        bad = bad_units(commitlog, phys, sizes, topic, qid, qoffs, force_prop_crc, check_crc=False)
        bad &= live
        bad |= live & (phys + sizes > end)
        if deleted and topic in deleted:
            bad |= live & (phys < deleted[topic])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            path, pos = cq.unit_location(lo + i)
            if deleted and int(phys[i]) < deleted.get(topic, -1):
                why = f"the topic was deleted at CommitLog offset {deleted[topic]}"
            else:
                _, _, why = why_bad(commitlog, int(phys[i]), int(sizes[i]), force_prop_crc)
            problems.append(
                f"{path}: unit {lo + i} of {topic}/{qid} at position {pos} (CommitLog offset "
                f"{int(phys[i])}, {int(sizes[i])} bytes): {why}"
            )
            continue
        all_phys.append(phys[live])
        all_sizes.append(sizes[live])
    if problems:
        return problems
    phys = np.concatenate(all_phys) if all_phys else np.empty(0, np.int64)
    sizes = np.concatenate(all_sizes) if all_sizes else np.empty(0, np.int64)
    order = np.argsort(phys, kind="stable")
    phys, sizes = phys[order], sizes[order]
    starts = np.concatenate(
        [[commitlog.min_offset], phys + sizes]
    )  # where the next unit should start
    nexts = np.concatenate([phys, [end]])
    overlap = np.flatnonzero(nexts < starts)
    if len(overlap):
        i = int(overlap[0])
        return [
            f"{commitlog.directory}: two units name the bytes at CommitLog offset {int(nexts[i])}"
        ]
    for a, b in zip(starts[nexts > starts].tolist(), nexts[nexts > starts].tolist(), strict=True):
        problem = _walk_gap(commitlog, a, b, force_prop_crc, deleted or {})
        if problem:
            return [problem]
    return []


def _walk_gap(
    commitlog: MappedFileQueue,
    start: int,
    stop: int,
    force_prop_crc: bool,
    deleted: Mapping[str, int],
) -> str:
    """Records in ``[start, stop)`` that no unit names must be ones that get none."""
    offset = start
    while offset < stop:
        mf = commitlog.find(offset)
        if mf is None:
            return f"{commitlog.directory}: CommitLog offset {offset} is not in any segment"
        pos = offset - mf.from_offset
        kind, size, reason = R.check_record(
            mf.mm, pos, mf.wrote_position, True, force_prop_crc, mf.size_bytes
        )
        if kind == R.RecordCheck.BLANK:
            offset = mf.end_offset
            continue
        if kind != R.RecordCheck.VALID:
            raise CorruptStoreError(
                f"{mf.path}: corrupt CommitLog record at position {pos} (offset {offset}) inside the "
                f"durable log: {reason or 'zero bytes'}",
                mf.path,
                pos,
            )
        sys_flag = int(np.frombuffer(mf.mm, dtype=_INT, count=1, offset=pos + R.POS_SYS_FLAG)[0])
        tran = sys_flag & L.TRANSACTION_MASK
        if tran in (L.TRANSACTION_NOT_TYPE, L.TRANSACTION_COMMIT_TYPE):
            m = R.decode_record(mf.mm, pos, read_body=False)
            if offset < deleted.get(m.topic, -1):  # a deleted topic's
                offset += size
                continue
            return (
                f"{mf.path}: the record at position {pos} (offset {offset}) of {m.topic}/{m.queue_id} "
                f"offset {m.queue_offset} has no ConsumeQueue unit"
            )
        offset += size
    return ""
