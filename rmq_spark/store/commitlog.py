"""CommitLog: every message of every topic, appended in arrival order to mapped segments.

Store time and queue offsets are assigned under one put lock; a batch is one write.  Recovery scans
records (magic, length, CRC), truncates a torn tail and reports corruption with file and position.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Collection, Iterator

import numpy as np

from rmq_spark.errors import CorruptStoreError, StoreError
from rmq_spark.store import layout as L
from rmq_spark.store import logscan
from rmq_spark.store.dispatch import Column, DispatchBatch, as_list, group_by_queue
from rmq_spark.store.encode import place_v4_record
from rmq_spark.store.encoded import SMALL_BATCH, EncodedBatch
from rmq_spark.store.inflight import InflightMarker
from rmq_spark.store.mapped import MappedFileQueue
from rmq_spark.store.message import MessageExt, offset_msg_ids
from rmq_spark.store.record import (
    POS_MAGIC,
    POS_PHYSICAL_OFFSET,
    RecordCheck,
    blank_record,
    check_record,
    decode_record,
    store_timestamp_at,
    verify_record,
)

_TS = struct.Struct(">q")
_INT = struct.Struct(">i")
_MAGIC = struct.Struct(">I")


class AppendResult:
    """Where a batch went.  ``phys_offsets`` and ``queue_offsets`` are int64 arrays (kept as lists
    until read for a batch of a few records)."""

    __slots__ = (
        "_phys_offsets",
        "_queue_offsets",
        "store_host",
        "store_port",
        "store_timestamp_ms",
        "wrote_bytes",
        "wrote_offset",
    )  # fmt: skip
    phys_offsets = Column(np.int64)
    queue_offsets = Column(np.int64)

    def __init__(
        self,
        wrote_offset: int,  # CommitLog offset of the first record
        wrote_bytes: int,
        phys_offsets: np.ndarray | list[int],
        queue_offsets: np.ndarray | list[int],
        store_timestamp_ms: int,
        store_host: bytes,
        store_port: int,
    ) -> None:
        self.wrote_offset = wrote_offset
        self.wrote_bytes = wrote_bytes
        self._phys_offsets = phys_offsets
        self._queue_offsets = queue_offsets
        self.store_timestamp_ms = store_timestamp_ms
        self.store_host = store_host
        self.store_port = store_port

    def __repr__(self) -> str:
        return f"AppendResult(wrote_offset={self.wrote_offset}, wrote_bytes={self.wrote_bytes})"

    @property
    def end_offset(self) -> int:
        return self.wrote_offset + self.wrote_bytes

    def phys_list(self) -> list[int]:
        """``phys_offsets`` as Python ints (no array built for a batch of a few records)."""
        return as_list(self._phys_offsets)

    def queue_list(self) -> list[int]:
        """``queue_offsets`` as Python ints (no array built for a batch of a few records)."""
        return as_list(self._queue_offsets)

    @property
    def msg_ids(self) -> list[str]:
        """offsetMsgIds of the records."""
        return (
            offset_msg_ids(self.store_host, self.store_port, self.phys_offsets).astype("U").tolist()
        )


class CommitLog:
    def __init__(
        self,
        directory: str,
        segment_bytes: int,
        *,
        store_host: bytes,
        store_port: int,
        now_ms: Callable[[], int],
        tags_code_for: Callable[[str, dict[str, str], int], int | None] | None = None,
        tags_code_topics: Collection[str] = (),
        inflight_path: str | None = None,
    ) -> None:
        self.mfq = MappedFileQueue(directory, segment_bytes, writable=True)
        # the write under way, for recovery to tell a torn tail from damage (see store.inflight)
        self.inflight = InflightMarker(inflight_path) if inflight_path else None
        self.segment_bytes = segment_bytes
        self.store_host = store_host
        self.store_port = store_port
        self._now_ms = now_ms
        self.put_lock = threading.RLock()
        # next queue offset per (topic, queueId)
        self.queue_table: dict[tuple[str, int], int] = {}
        self._tags_code_for = tags_code_for  # the store's tagsCode rules, for tags_code_topics
        self._tags_code_topics = tags_code_topics
        self.last_store_timestamp_ms = 0
        # reads require the whole-record CRC property: off, as in Apache RocketMQ, whose records
        # carry it only with enabledAppendPropCRC (a record that has it is checked by it)
        self.force_prop_crc = False

    # --- append -------------------------------------------------------------------------------------
    def append(self, batch: EncodedBatch) -> tuple[AppendResult, DispatchBatch]:
        """Append a batch.  Caller holds ``put_lock``.  A batch that does not fit the current
        segment continues in the next one (split at record boundaries, a BLANK record between);
        it is still published as one unit."""
        n = len(batch)
        if 0 < n <= SMALL_BATCH:
            fast = self._append_small(batch)
            if fast is not None:
                return fast
        sizes = batch.sizes.astype(np.int64)
        if n and int(sizes.max()) + L.END_FILE_MIN_BLANK_BYTES > self.segment_bytes:
            raise StoreError(
                f"a record of {int(sizes.max())} bytes does not fit a CommitLog segment of "
                f"{self.segment_bytes} bytes"
            )
        mf = self.mfq.last_file()
        if mf is None:
            mf = self.mfq.new_file()
        # plan the chunks: records [i, j) go to one segment at a base offset
        chunks: list[tuple[int, int, int]] = []
        ends = np.cumsum(sizes)
        i = 0
        seg_from, seg_pos = mf.from_offset, mf.wrote_position
        phys = np.empty(n, dtype=np.int64)
        while i < n:
            room = self.segment_bytes - seg_pos - L.END_FILE_MIN_BLANK_BYTES
            done_before = int(ends[i - 1]) if i else 0
            j = int(np.searchsorted(ends, done_before + room, side="right"))
            if j == i:  # nothing fits: blank out the rest, go to the next segment
                chunks.append((-1, -1, seg_from + seg_pos))
                seg_from, seg_pos = seg_from + self.segment_bytes, 0
                continue
            base = seg_from + seg_pos
            phys[i:j] = batch.rel_pos[i:j] - done_before + base
            chunks.append((i, j, base))
            seg_pos += int(ends[j - 1]) - done_before
            i = j
        # the blocks (and segments) it needs, before anything changes: a full disk fails here
        self.mfq.reserve(mf.from_offset + mf.wrote_position, seg_from + seg_pos)
        base = int(phys[0]) if n else mf.from_offset + mf.wrote_position
        # queue offsets: consecutive per (topic, queue); PREPARED/ROLLBACK records take 0
        tran = batch.sys_flags & L.TRANSACTION_MASK
        consumable = (tran == L.TRANSACTION_NOT_TYPE) | (tran == L.TRANSACTION_COMMIT_TYPE)
        qoffs = np.zeros(n, dtype=np.int64)
        if n:
            for key, idx in group_by_queue(batch.topics, batch.queue_ids).items():
                if not consumable.all():
                    idx = idx[consumable[idx]]
                start = self.queue_table.get(key, 0)
                qoffs[idx] = np.arange(start, start + len(idx), dtype=np.int64)
                self.queue_table[key] = start + len(idx)
        now = max(self._now_ms(), self.last_store_timestamp_ms)
        self.last_store_timestamp_ms = now
        batch.finalize(phys, qoffs, now)
        if self.inflight is not None:
            self.inflight.mark(mf.from_offset + mf.wrote_position, seg_from + seg_pos)
        for i, j, at in chunks:
            mf = self.mfq.last_file()
            assert mf is not None
            if i < 0:
                if mf.remaining_bytes > 0:
                    mf.write(blank_record(mf.remaining_bytes))
                    mf.wrote_position = mf.size_bytes  # the blank record fills the segment
                self.mfq.new_file()
                continue
            a = int(batch.rel_pos[i])
            b = int(batch.rel_pos[j - 1]) + int(sizes[j - 1])
            assert mf.from_offset + mf.wrote_position == at
            mf.write(memoryview(batch.buf)[a:b])
        if self.inflight is not None:
            self.inflight.clear()
        last_end = int(phys[-1]) + int(sizes[-1]) if n else base
        return self._results(batch, phys, qoffs, now, base, last_end, n)

    def _append_small(self, batch: EncodedBatch) -> tuple[AppendResult, DispatchBatch] | None:
        """:meth:`append` for a few records that fit the current segment, in plain Python (numpy's
        per-call cost dominates there); None when the batch needs the general path."""
        files = self.mfq.files
        if not files:
            return None
        mf = files[-1]
        total = len(batch.buf)
        if mf.wrote_position + total + L.END_FILE_MIN_BLANK_BYTES > self.segment_bytes:
            return None
        base = mf.from_offset + mf.wrote_position
        if mf.wrote_position + total > mf.allocated_bytes:  # a full disk: fail before offsets
            mf.ensure_allocated(mf.wrote_position + total)
        rel, qids, sflags = batch._rel_pos, batch._queue_ids, batch._sys_flags  # noqa: SLF001 - the encoded batch is the CommitLog's own input
        if rel.__class__ is not list or qids.__class__ is not list or sflags.__class__ is not list:
            rel, qids, sflags = as_list(rel), as_list(qids), as_list(sflags)
        phys = [base + rel[0]] if len(rel) == 1 else [base + r for r in rel]
        qoffs = []
        table = self.queue_table
        for topic, qid, sf in zip(batch.topics, qids, sflags, strict=True):
            tran = sf & L.TRANSACTION_MASK
            if tran == L.TRANSACTION_NOT_TYPE or tran == L.TRANSACTION_COMMIT_TYPE:
                key = (topic, qid)
                q = table.get(key, 0)
                table[key] = q + 1
                qoffs.append(q)
            else:
                qoffs.append(0)
        now = self._now_ms()
        now = max(now, self.last_store_timestamp_ms)
        self.last_store_timestamp_ms = now
        batch.finalize_lists(phys, qoffs, now)
        self._write(mf, batch.buf, base)
        return self._results(batch, phys, qoffs, now, base, base + total, len(phys))

    def append_one(
        self, buf: bytearray, topic: str, queue_id: int, sys_flag: int, prop_crc: bool
    ) -> tuple[int, int, int] | None:
        """Append one :func:`~rmq_spark.store.record.encode_v4_record` record at the end of the current
        segment (caller holds ``put_lock``): its (physical offset, queue offset, store time), or
        None, nothing changed, when it does not fit there (:meth:`append` rolls the segment)."""
        files = self.mfq.files
        if not files:
            return None
        mf = files[-1]
        pos = mf.wrote_position
        if pos + len(buf) + L.END_FILE_MIN_BLANK_BYTES > self.segment_bytes:
            return None
        phys = mf.from_offset + pos
        if pos + len(buf) > mf.allocated_bytes:  # a full disk: fail before the queue offset
            mf.ensure_allocated(pos + len(buf))
        tran = sys_flag & L.TRANSACTION_MASK
        if tran == L.TRANSACTION_NOT_TYPE or tran == L.TRANSACTION_COMMIT_TYPE:
            table = self.queue_table
            key = (topic, queue_id)
            qoff = table.get(key, 0)
            table[key] = qoff + 1
        else:
            qoff = 0  # PREPARED / ROLLBACK records take none
        now = self._now_ms()
        now = max(now, self.last_store_timestamp_ms)
        self.last_store_timestamp_ms = now
        place_v4_record(buf, qoff, phys, now, prop_crc)
        self._write(mf, buf, phys)
        return phys, qoff, now

    def _write(self, mf, buf, at: int) -> None:  # type: ignore[no-untyped-def]
        marker = self.inflight
        if marker is None:
            mf.write(buf)
            return
        marker.mark(at, at + len(buf))
        mf.write(buf)
        marker.clear()

    def _results(  # type: ignore[no-untyped-def]
        self, batch: EncodedBatch, phys, qoffs, now: int, base: int, end: int, n: int
    ) -> tuple[AppendResult, DispatchBatch]:
        tags = batch._tags_codes  # noqa: SLF001 - the encoded batch is the CommitLog's own input
        if self._tags_code_for is not None and any(
            t in batch.topics for t in self._tags_code_topics
        ):
            tags = list(as_list(tags))
            for i, (t, p) in enumerate(zip(batch.topics, batch.properties, strict=True)):
                code = self._tags_code_for(t, p, now)
                if code is not None:
                    tags[i] = code
            if n > SMALL_BATCH:
                tags = np.array(tags, dtype=np.int64)
        result = AppendResult(base, end - base, phys, qoffs, now, self.store_host, self.store_port)
        dispatch = DispatchBatch(
            phys,
            batch._sizes,  # noqa: SLF001
            batch.topics,
            batch._queue_ids,  # noqa: SLF001
            qoffs,
            tags,
            batch._sys_flags,  # noqa: SLF001
            [now] * n if n <= SMALL_BATCH else np.full(n, now, dtype=np.int64),
            batch.keys,
            batch.uniq_keys,
            batch.properties,
            end,
        )
        return result, dispatch

    # --- positions -------------------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.mfq.min_offset

    @property
    def max_offset(self) -> int:
        return self.mfq.max_offset

    def flush(self) -> int:
        return self.mfq.flush()

    @property
    def flushed_offset(self) -> int:
        return self.mfq.flushed_offset

    # --- reads ----------------------------------------------------------------------------------------
    def read_record(
        self, offset: int, size: int | None = None, read_body: bool = True
    ) -> MessageExt | None:
        """The record at ``offset``, checked (:func:`verify_record`: CRCs, size, position) before
        it is decoded.  None when ``offset`` is outside the log.  Damage raises
        :class:`CorruptStoreError` naming the segment and position; so does any mismatch when the
        caller knows the ``size`` (it comes from an index: a record must be there), while bytes
        that do not even start a record at an offset given without a size are None (no record
        there: an offset from outside, such as a client's handle)."""
        mf = self.mfq.find(offset)
        if mf is None:
            return None
        pos = offset - mf.from_offset
        limit = mf.wrote_position
        if pos >= limit:
            return None
        why = verify_record(mf.mm, pos, limit, offset, size, self.force_prop_crc)
        if why:
            if size is None and not self._starts_record(mf, pos, offset):
                return None
            raise self.corrupt(offset, why)
        return decode_record(mf.mm, pos, read_body=read_body)

    def _starts_record(self, mf, pos: int, offset: int) -> bool:  # type: ignore[no-untyped-def]
        """Does a record header (magic and its own offset) start at ``pos``?"""
        if pos + POS_PHYSICAL_OFFSET + 8 > mf.size_bytes:
            return False
        magic = _MAGIC.unpack_from(mf.mm, pos + POS_MAGIC)[0]
        at = _TS.unpack_from(mf.mm, pos + POS_PHYSICAL_OFFSET)[0]
        return magic in (L.MAGIC_V1, L.MAGIC_V2) and at == offset

    def corrupt(self, offset: int, why: str) -> CorruptStoreError:
        """The error for a damaged record at CommitLog ``offset``: its segment and position."""
        mf = self.mfq.find(offset)
        path = mf.path if mf is not None else self.mfq.directory
        pos = offset - mf.from_offset if mf is not None else offset
        return CorruptStoreError(
            f"{path}: corrupt CommitLog record at position {pos} (offset {offset}): {why}; "
            "it is not served",
            path,
            pos,
        )

    def store_timestamp(self, offset: int) -> int:
        """STORETIMESTAMP of the record at ``offset`` (-1 if none)."""
        mf = self.mfq.find(offset)
        if mf is None:
            return -1
        return store_timestamp_at(mf.mm, offset - mf.from_offset)

    # --- recovery -------------------------------------------------------------------------------------
    def recover(self, *args, **kwargs) -> int:  # type: ignore[no-untyped-def]
        """:func:`rmq_spark.store.logscan.recover` of this log."""
        return logscan.recover(self, *args, **kwargs)

    def valid_record_after(self, mf, pos: int, force_prop_crc: bool = False) -> int | None:  # type: ignore[no-untyped-def]
        return logscan.valid_record_after(self, mf, pos, force_prop_crc)

    def iter_records(self, start: int = 0) -> Iterator[MessageExt]:
        """Every valid record from ``start`` on (tests and tools)."""
        offset = max(start, self.mfq.min_offset)
        while offset < self.mfq.max_offset:
            mf = self.mfq.find(offset)
            if mf is None:
                return
            pos = offset - mf.from_offset
            kind, size, _ = check_record(mf.mm, pos, mf.wrote_position, check_crc=False)
            if kind == RecordCheck.VALID:
                yield decode_record(mf.mm, pos)
                offset += size
            elif kind == RecordCheck.BLANK:
                offset = mf.end_offset
            else:
                return

    def close(self) -> None:
        self.mfq.close()
        if self.inflight is not None:
            self.inflight.close()
