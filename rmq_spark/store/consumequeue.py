"""ConsumeQueue: the index of one (topic, queueId) into the CommitLog, one 20-byte unit per message.

::

    ┌──────────────────────────┬────────────────┬───────────────────────┐
    │ CommitLog offset (8)     │ size (4)       │ tagsCode (8)          │
    └──────────────────────────┴────────────────┴───────────────────────┘

Unit ``i`` (the message with queue offset ``i``) lives at byte ``i * 20`` of the queue's log.  The
size field is written last, so a reader that sees a non-zero size sees a complete unit.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

import numpy as np

from rmq_spark.store import layout as L
from rmq_spark.store.mapped import MappedFileQueue
from rmq_spark.store.validation import check_queue_id_value, check_topic_cached

CQ_UNIT = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
assert CQ_UNIT.itemsize == L.CQ_UNIT_BYTES
U = L.CQ_UNIT_BYTES
_UNIT_NO_SIZE = struct.Struct(">qiq")
_SIZE = struct.Struct(">i")


class ConsumeQueue:
    def __init__(
        self,
        root: str,
        topic: str,
        queue_id: int,
        units_per_segment: int = L.CQ_SEGMENT_UNITS,
        writable: bool = True,
    ) -> None:
        # the directory is built from the name: a name that is not a topic's ("..", "/x", "")
        # never gets that far (MessageIllegalError naming it)
        check_topic_cached(topic, allow_system=True)
        self.topic = topic
        self.queue_id = check_queue_id_value(queue_id)
        self.directory = os.path.join(root, L.CONSUMEQUEUE_DIR, topic, str(self.queue_id))
        self.mfq = MappedFileQueue(self.directory, units_per_segment * U, writable=writable)
        self.max_phys_end = 0  # CommitLog end (offset + size) of the last unit
        self.damage: str | None = None  # what recovery cut that was no torn tail (file, position)

    # --- offsets ------------------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.mfq.min_offset // U

    @property
    def max_offset(self) -> int:
        """The queue offset the next message gets (= number of units, from the first file)."""
        return self.mfq.max_offset // U

    # --- write side ------------------------------------------------------------------------------------
    def put_unit(self, queue_offset: int, phys: int, size: int, tags_code: int) -> None:
        """:meth:`put_units` for one unit, stored through the mapping (no syscall, no numpy)."""
        files = self.mfq.files
        if files:
            mf = files[-1]
            pos = mf.wrote_position
            if mf.from_offset + pos == queue_offset * U and pos + U <= mf.allocated_bytes:
                # the unit's bytes are zero (fresh or truncated): offset and tagsCode, then the
                # size; moving wrote_position past the whole unit publishes it to readers
                _UNIT_NO_SIZE.pack_into(mf.mm, pos, phys, 0, tags_code)
                _SIZE.pack_into(mf.mm, pos + 8, size)
                mf.wrote_position = pos + U
                self.max_phys_end = phys + size
                return
        one = np.array([phys, size, tags_code], dtype=np.int64)
        self.put_units(queue_offset, one[0:1], one[1:2], one[2:3])

    def put_units(
        self, first_queue_offset: int, phys: np.ndarray, sizes: np.ndarray, tags_codes: np.ndarray
    ) -> None:
        """Append units for queue offsets ``first_queue_offset ...``; units already present are
        skipped (re-dispatch after a crash is idempotent)."""
        n = len(phys)
        cur = self.max_offset
        if not self.mfq.files and first_queue_offset > 0 and cur == 0:
            # a fresh queue starting above zero (its old files were deleted): start there
            self.mfq.new_file(first_queue_offset * U)
            self.mfq.files[-1].wrote_position = (first_queue_offset * U) % self.mfq.segment_bytes
            cur = self.max_offset
        skip = cur - first_queue_offset
        if skip >= n:
            return
        if skip < 0:
            raise ValueError(
                f"consume queue {self.topic}/{self.queue_id}: unit {first_queue_offset} would "
                f"leave a gap after {cur}"
            )
        if (
            n - skip <= 4
            and self.mfq.files
            and self.mfq.files[-1].remaining_bytes >= (n - skip) * U
        ):
            mf = self.mfq.files[-1]
            for k in range(skip, n):  # a few units: struct beats numpy's per-call cost
                pos = mf.wrote_position
                mf.write(_UNIT_NO_SIZE.pack(int(phys[k]), 0, int(tags_codes[k])), publish=False)
                _SIZE.pack_into(mf.mm, pos + 8, int(sizes[k]))
                mf.wrote_position = pos + U  # a reader sees the unit once it is whole
            self.max_phys_end = int(phys[-1]) + int(sizes[-1])
            return
        units = np.empty(n - skip, dtype=CQ_UNIT)
        units["offset"] = phys[skip:]
        units["size"] = 0
        units["tags_code"] = tags_codes[skip:]
        raw = units.view(np.uint8)
        size_be = np.asarray(sizes[skip:], dtype=">i4")
        done = 0
        total = len(units)
        while done < total:
            tail = self.mfq.last_file()
            mf = self.mfq.new_file() if tail is None or tail.remaining_bytes < U else tail
            k = min(total - done, mf.remaining_bytes // U)
            pos = mf.wrote_position
            mf.write(raw[done * U : (done + k) * U].tobytes(), publish=False)
            # the size field last (4-byte aligned stores), then the units are published: a reader
            # never sees a unit below wrote_position without its size
            view = np.frombuffer(mf.mm, dtype=CQ_UNIT, count=k, offset=pos)
            view["size"] = size_be[done : done + k]
            del view
            mf.wrote_position = pos + k * U
            done += k
        self.max_phys_end = int(phys[-1]) + int(sizes[-1])

    def has_room(self, n: int) -> bool:
        """Do ``n`` more units fit the last segment?"""
        files = self.mfq.files
        return bool(files) and files[-1].wrote_position + n * U <= files[-1].allocated_bytes

    def reserve(self, first_queue_offset: int, n: int) -> None:
        """Segments for units ``[first_queue_offset, +n)`` made ahead (see
        :meth:`MappedFileQueue.reserve`): a full disk fails here, before the CommitLog append."""
        if not self.has_room(n):
            start = max(first_queue_offset, self.max_offset)
            self.mfq.reserve(start * U, (start + n) * U)

    def flush(self) -> None:
        self.mfq.flush()

    # --- read side ---------------------------------------------------------------------------------------
    def units(self, start: int, end: int) -> np.ndarray:
        """A copy of units ``[start, end)`` (clamped to what exists)."""
        start = max(start, self.min_offset)
        end = min(end, self.max_offset)
        if end <= start:
            return np.empty(0, dtype=CQ_UNIT)
        parts = []
        pos, stop = start * U, end * U
        while pos < stop:
            mf = self.mfq.find(pos)
            if mf is None:
                break
            a = pos - mf.from_offset
            b = min(stop, mf.end_offset) - mf.from_offset
            parts.append(np.frombuffer(mf.mm, dtype=CQ_UNIT, count=(b - a) // U, offset=a).copy())
            pos = mf.from_offset + b
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def unit_location(self, queue_offset: int) -> tuple[str, int]:
        """The segment file and byte position of unit ``queue_offset`` (for error messages)."""
        mf = self.mfq.find(queue_offset * U)
        if mf is None:
            return self.directory, queue_offset * U
        return mf.path, queue_offset * U - mf.from_offset

    def unit(self, queue_offset: int) -> tuple[int, int, int] | None:
        u = self.units(queue_offset, queue_offset + 1)
        if len(u) == 0:
            return None
        return int(u["offset"][0]), int(u["size"][0]), int(u["tags_code"][0])

    def offset_by_time(self, timestamp_ms: int, store_time: Callable[[int], int]) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms``
        (``max_offset`` if none): a binary search over store times read from the CommitLog."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(mid)
            if u is None or store_time(u[0]) >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        return lo

    # --- recovery ----------------------------------------------------------------------------------------
    def load(self) -> None:
        self.mfq.load()
        self.recover()

    def recover(self) -> None:
        """Find the end of valid units (offset >= 0 and size > 0) in the last segments."""
        files = self.mfq.files
        if not files:
            return
        for i in range(max(0, len(files) - 3), len(files)):
            mf = files[i]
            arr = np.frombuffer(mf.mm, dtype=CQ_UNIT, count=mf.data_bytes // U)  # not the holes
            valid = (arr["offset"] >= 0) & (arr["size"] > 0)
            if i == 0 and mf.from_offset == 0:
                pass
            bad = np.flatnonzero(~valid)
            n_valid = int(bad[0]) if len(bad) else len(arr)
            if n_valid > 0:
                last = arr[n_valid - 1]
                self.max_phys_end = int(last["offset"]) + int(last["size"])
            del arr, valid
            mf.wrote_position = mf.flushed_position = n_valid * U
            if len(bad) and self.damage is None:
                rest = np.frombuffer(mf.mm, dtype=np.uint8, count=mf.data_bytes)[
                    (n_valid + 1) * U :
                ]
                later = any(
                    np.frombuffer(f.mm, dtype=np.uint8, count=f.data_bytes).any()
                    for f in files[i + 1 :]
                )
                if rest.any() or later:  # units follow the bad one: not a torn tail
                    self.damage = (
                        f"{mf.path}: unit {mf.from_offset // U + n_valid} of {self.topic}/{self.queue_id} "
                        f"at position {n_valid * U} is not a unit (offset < 0 or size <= 0) and units follow it"
                    )
                del rest
            if n_valid < mf.size_bytes // U:
                # later files (if any) are past a hole: drop them
                for dropped in files[i + 1 :]:
                    dropped.destroy()
                del files[i + 1 :]
                break
        if self.mfq.writable:
            self.mfq.truncate_dirty(self.mfq.max_offset)

    def refresh(self) -> None:
        """Reader side: learn the current end from the files (binary search on size > 0)."""
        self.mfq.refresh()
        for mf in self.mfq.files:
            arr = np.frombuffer(mf.mm, dtype=CQ_UNIT, count=mf.refresh_data_bytes() // U)
            sizes = arr["size"]
            lo, hi = 0, len(arr)
            while lo < hi:
                mid = (lo + hi) // 2
                if sizes[mid] > 0:
                    lo = mid + 1
                else:
                    hi = mid
            mf.wrote_position = lo * U
            del arr, sizes

    def truncate_dirty(self, phys_offset: int) -> None:
        """Drop trailing units whose CommitLog offset is at or past ``phys_offset``."""
        files = self.mfq.files
        while files:
            mf = files[-1]
            n = mf.wrote_position // U
            arr = np.frombuffer(mf.mm, dtype=CQ_UNIT, count=n)
            keep = int(np.searchsorted(arr["offset"].astype(np.int64), phys_offset, side="left"))
            del arr
            if keep == 0 and len(files) > 1:
                files.pop().destroy()
                continue
            self.mfq.truncate_dirty(mf.from_offset + keep * U)
            break
        if self.max_offset > 0:
            u = self.unit(self.max_offset - 1)
            self.max_phys_end = u[0] + u[1] if u else 0
        else:
            self.max_phys_end = 0

    def destroy(self) -> None:
        self.mfq.delete_all()

    def close(self) -> None:
        self.mfq.close()
