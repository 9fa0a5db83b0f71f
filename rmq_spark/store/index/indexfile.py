"""The IndexFile: CommitLog offsets by message key, in RocketMQ's layout; and the IndexService, the
dispatcher that feeds it.

Files live at ``{root}/index/{yyyyMMddHHmmssSSS}`` (local creation time, as RocketMQ's
``UtilAll.timeMillisToHumanString``).  A file is a header, a hash-slot table and linked entries::

    header, 40 bytes (big-endian, like every field below)
    ┌────────────────┬──────────────┬────────────────┬──────────────┬──────────────┬────────────┐
    │ beginTimestamp │ endTimestamp │ beginPhyOffset │ endPhyOffset │ hashSlotCount│ indexCount │
    │ long (8) @0    │ long (8) @8  │ long (8) @16   │ long (8) @24 │ int (4) @32  │ int (4) @36│
    └────────────────┴──────────────┴────────────────┴──────────────┴──────────────┴────────────┘
    hash slots: slotNum x int (4) @40, the index of the newest entry of each slot (0: none)
    entries: indexNum x 20 bytes @40 + slotNum*4; entry 0 is the "none" sentinel, so a file
    holds indexNum - 1 keys
    ┌─────────────┬──────────────────────┬─────────────────┬───────────────┐
    │ keyHash (4) │ phyOffset (8)        │ timeDiff (4)    │ prevIndex (4) │
    └─────────────┴──────────────────────┴─────────────────┴───────────────┘
    keyHash    abs(Java String.hashCode(topic + "#" + key)), Integer.MIN_VALUE -> 0;
               its slot is keyHash % slotNum
    timeDiff   whole seconds from beginTimestamp to the record's store time, clamped to
               [0, 2^31 - 1]
    prevIndex  the previous entry of the same slot (0: end of the chain)

Each message gets an entry for ``topic#UNIQ_KEY`` and one per non-empty space-separated word of
its KEYS; ROLLBACK records get none (PREPARED ones do).  A full file rolls over to a new one whose
header starts where the previous one ended.

Crash safety: ``flush`` syncs the files before the store writes its checkpoint, and puts the last
indexed store time there (``indexMsgTimestamp``).  After an abnormal exit, files that may hold
entries the checkpoint does not cover (end offset at or past ``dispatchedOffset``, or end time
past ``indexMsgTimestamp``) are deleted, and the service re-indexes the CommitLog itself from the
end of the last file it kept up to where the store's re-dispatch starts (from the start of the
CommitLog when the index directory is gone).  Re-dispatch is idempotent: records at or below the
last indexed CommitLog offset are skipped.

Small dispatches (a broker's single sends) are held in memory and indexed together once
``HOLD_RECORDS`` have gathered, or before anything reads the index (a query, ``files``,
``key_count``), a flush or a close: one pass over many records costs a fraction of as many passes
over one (measured: a put of one message spent a fifth of its time indexing itself).  Nothing
depends on held records being in the files: a crash loses them with the unflushed rest, and the
catch-up above indexes them again from the CommitLog.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rmq_spark.errors import ConfigError, CorruptStoreError
from rmq_spark.store import layout as L
from rmq_spark.store.dispatch import DispatchBatch, as_list
from rmq_spark.store.properties import find_properties
from rmq_spark.store.record import (
    POS_SYS_FLAG,
    RecordCheck,
    check_record,
    store_timestamp_at,
    walk,
)

__all__ = [
    "DEFAULT_INDEX_ENTRIES",
    "DEFAULT_INDEX_SLOTS",
    "IndexFile",
    "IndexService",
    "index_hashes",
    "java_string_hashes",
]

DEFAULT_INDEX_SLOTS = 5_000_000  # maxHashSlotNum
DEFAULT_INDEX_ENTRIES = 20_000_000  # maxIndexNum
HEADER = struct.Struct(">qqqqii")
HEADER_BYTES = HEADER.size
ENTRY = np.dtype([("hash", ">i4"), ("phy", ">i8"), ("diff", ">i4"), ("prev", ">i4")])
ENTRY_STRUCT = struct.Struct(">iqii")
ENTRY_BYTES = ENTRY.itemsize
SLOT_BYTES = 4
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
_NAME = re.compile(r"^\d{17}$")
_SCAN_BATCH_RECORDS = 4096
SMALL_KEYS = 8  # up to this many keys are hashed and linked one by one, in plain Python
HOLD_BATCH_MAX = 32  # dispatches of fewer records than this are held back ...
HOLD_RECORDS = 256  # ... until this many have gathered (see the module docstring)
_SLOT = struct.Struct(">i")
assert HEADER_BYTES == 40 and ENTRY_BYTES == 20 == ENTRY_STRUCT.size

_POW31: np.ndarray = np.ones(1, dtype=np.uint64)


def _pow31(n: int) -> np.ndarray:
    """``31**k mod 2**32`` for k < n (at least), as uint64."""
    global _POW31
    if len(_POW31) < n:
        size = max(n, 2 * len(_POW31))
        p = np.empty(size, dtype=np.uint64)
        acc = 1
        for k in range(size):
            p[k] = acc
            acc = (acc * 31) & 0xFFFFFFFF
        _POW31 = p
    return _POW31


def java_string_hashes(strings: Sequence[str]) -> np.ndarray:
    """Java ``String.hashCode()`` of every string (over UTF-16 code units) as int32, in one numpy
    pass: ``sum(unit[i] * 31**(len-1-i)) mod 2**32``."""
    n = len(strings)
    if n == 0:
        return np.empty(0, dtype=np.int32)
    units = np.frombuffer("".join(strings).encode("utf-16-le", "surrogatepass"), dtype="<u2")
    lens = np.fromiter(map(len, strings), dtype=np.int64, count=n)
    if int(lens.sum()) != len(units):  # characters outside the BMP take two code units
        lens = np.fromiter(
            (len(s.encode("utf-16-le", "surrogatepass")) // 2 for s in strings),
            dtype=np.int64,
            count=n,
        )
    distinct = np.unique(lens)
    if len(distinct) <= 8 and len(units):  # a few lengths (topic#UNIQ_KEY): one matrix product each
        return _hashes_by_length(units, lens, distinct)
    out = np.zeros(n, dtype=np.uint64)
    if len(units):
        ends = np.cumsum(lens)
        exponents = np.repeat(ends, lens) - 1 - np.arange(len(units), dtype=np.int64)
        terms = units.astype(np.uint64) * _pow31(int(lens.max()))[exponents]
        nonempty = lens > 0
        out[nonempty] = np.add.reduceat(terms, (ends - lens)[nonempty])
    return (out & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)


def _hashes_by_length(units: np.ndarray, lens: np.ndarray, distinct: np.ndarray) -> np.ndarray:
    """:func:`java_string_hashes` for strings of a few distinct lengths: the strings of each
    length as rows of a matrix, times the powers of 31 (uint32 arithmetic wraps mod 2**32)."""
    out = np.empty(len(lens), dtype=np.uint32)
    starts = np.cumsum(lens) - lens
    pow31 = _pow31(int(distinct[-1])).astype(np.uint32)
    for size in distinct.tolist():
        rows = np.flatnonzero(lens == size) if len(distinct) > 1 else np.arange(len(lens))
        if size == 0:
            out[rows] = 0
            continue
        if len(distinct) == 1:
            mat = units.reshape(len(lens), size)
        else:
            mat = units[starts[rows, None] + np.arange(size)]
        out[rows] = mat.astype(np.uint32) @ pow31[size - 1 :: -1]
    return out.view(np.int32)


def index_hash(key: str) -> int:
    """The IndexFile keyHash of one key (plain Python: cheaper than numpy for a single key)."""
    h = 0
    if key.isascii():  # its bytes are its UTF-16 code units
        units: Sequence[int] = key.encode()
    else:
        units = struct.unpack(f"<{len(b := key.encode('utf-16-le', 'surrogatepass')) // 2}H", b)
    for unit in units:
        h = (31 * h + unit) & 0xFFFFFFFF
    h = h - 0x100000000 if h & 0x80000000 else h
    return 0 if h == -(2**31) else abs(h)


def index_hashes(keys: Sequence[str]) -> np.ndarray:
    """The IndexFile keyHash of each key: ``abs(hashCode)``, with ``Integer.MIN_VALUE`` -> 0."""
    if len(keys) <= SMALL_KEYS:
        return np.array([index_hash(k) for k in keys], dtype=np.int32)
    h = np.abs(java_string_hashes(keys).astype(np.int64))
    h[h > INT_MAX] = 0
    return h.astype(np.int32)


def file_bytes(slot_num: int, index_num: int) -> int:
    return HEADER_BYTES + slot_num * SLOT_BYTES + index_num * ENTRY_BYTES


_SYS_FLAG = struct.Struct(">i")


def _index_fields(buf, pos: int) -> tuple[str, int, int, str | None, str | None]:  # type: ignore[no-untyped-def]
    """What the index needs of the (valid) record at ``pos``: topic, sysflag, store time, KEYS and
    UNIQ_KEY — read straight from the bytes, without decoding the whole record (the catch-up
    after a crash scans the CommitLog with it)."""
    sys_flag = _SYS_FLAG.unpack_from(buf, pos + POS_SYS_FLAG)[0]
    store_ts = store_timestamp_at(buf, pos)
    t = walk(buf, pos)
    topic = bytes(buf[t.topic_at : t.topic_at + t.topic_len]).decode("utf-8")
    at, plen = t.props_at - 2, t.props_len
    keys, uniq = find_properties(bytes(buf[at + 2 : at + 2 + plen]), L.P_KEYS, L.P_UNIQ_KEY)
    return topic, sys_flag, store_ts, keys, uniq


class IndexFile:
    """One index file, memory-mapped.  Not thread-safe (:class:`IndexService` holds a lock)."""

    def __init__(
        self,
        path: str,
        slot_num: int,
        index_num: int,
        *,
        create: bool = False,
        begin_phy: int = 0,
        begin_ts: int = 0,
    ) -> None:
        self.path = path
        self.slot_num = slot_num
        self.index_num = index_num
        size = file_bytes(slot_num, index_num)
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o644)
        try:
            if create:
                os.ftruncate(fd, size)
            elif (actual := os.fstat(fd).st_size) != size:
                raise CorruptStoreError(
                    f"{path}: index file is {actual} bytes, expected {size} "
                    f"({slot_num} slots, {index_num} entries)",
                    path,
                    actual,
                )
            self._mm: mmap.mmap | None = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._entries_pos = HEADER_BYTES + slot_num * SLOT_BYTES
        self._slots = np.frombuffer(self._mm, dtype=">i4", count=slot_num, offset=HEADER_BYTES)
        self._entries = np.frombuffer(
            self._mm, dtype=ENTRY, count=index_num, offset=self._entries_pos
        )
        self.dirty = create
        if create:
            self.begin_ts = self.end_ts = begin_ts
            self.begin_phy = self.end_phy = begin_phy
            self.hash_slot_count, self.index_count = 0, 1
            self._write_header()
            return
        (self.begin_ts, self.end_ts, self.begin_phy, self.end_phy,
         self.hash_slot_count, self.index_count) = HEADER.unpack_from(self._mm, 0)  # fmt: skip
        if not 1 <= self.index_count <= index_num:
            self.close()
            raise CorruptStoreError(
                f"{path}: index count {self.index_count} is out of range", path, 36
            )

    def _write_header(self) -> None:
        assert self._mm is not None
        HEADER.pack_into(
            self._mm, 0, self.begin_ts, self.end_ts, self.begin_phy, self.end_phy,
            self.hash_slot_count, self.index_count,
        )  # fmt: skip

    @property
    def is_full(self) -> bool:
        return self.index_count >= self.index_num

    @property
    def key_count(self) -> int:
        return self.index_count - 1

    # --- write side ------------------------------------------------------------------------
    def put_hashes(self, hashes: np.ndarray, phys: np.ndarray, store_ts: np.ndarray) -> int:
        """Append entries for keys with these keyHashes (>= 0), in order; returns how many fit."""
        first = self.index_count
        k = min(self.index_num - first, len(hashes))
        if k <= 0:
            return 0
        if k <= SMALL_KEYS:
            return self._put_few(list(hashes[:k]), list(phys[:k]), list(store_ts[:k]))
        h = np.asarray(hashes[:k], dtype=np.int64)
        phy = np.asarray(phys[:k], dtype=np.int64)
        ts = np.asarray(store_ts[:k], dtype=np.int64)
        if first <= 1:
            self.begin_phy, self.begin_ts = int(phy[0]), int(ts[0])
        if self.begin_ts > 0:
            diff = np.clip((ts - self.begin_ts) // 1000, 0, INT_MAX)
        else:
            diff = np.zeros(k, dtype=np.int64)
        idx = np.arange(first, first + k, dtype=np.int64)
        slot = h % self.slot_num
        # chain the new entries: sorted by slot, each points at the one before it in its slot,
        # the first one of a slot at the slot's current head
        order = np.argsort(slot, kind="stable")
        s_sorted, i_sorted = slot[order], idx[order]
        head = np.ones(k, dtype=bool)
        head[1:] = s_sorted[1:] != s_sorted[:-1]
        tail = np.ones(k, dtype=bool)
        tail[:-1] = head[1:]
        old = self._slots[s_sorted[head]].astype(np.int64)
        old[(old <= 0) | (old >= first)] = 0
        prev_sorted = np.empty(k, dtype=np.int64)
        prev_sorted[1:] = i_sorted[:-1]
        prev_sorted[head] = old
        prev = np.empty(k, dtype=np.int64)
        prev[order] = prev_sorted
        rec = np.empty(k, dtype=ENTRY)
        rec["hash"], rec["phy"], rec["diff"], rec["prev"] = h, phy, diff, prev
        self._entries[first : first + k] = rec
        self._slots[s_sorted[tail]] = i_sorted[tail]
        self.hash_slot_count += int(np.count_nonzero(old == 0))
        self.index_count = first + k
        self.end_phy, self.end_ts = int(phy[-1]), int(ts[-1])
        self._write_header()
        self.dirty = True
        return k

    def _put_few(self, hashes: list[int], phys: list[int], store_ts: list[int]) -> int:
        """:meth:`put_hashes` for a few keys, entry by entry (same result)."""
        mm = self._mm
        assert mm is not None
        first = self.index_count
        k = min(self.index_num - first, len(hashes))
        if k <= 0:
            return 0
        hashes, phys, store_ts = [int(x) for x in hashes[:k]], [int(x) for x in phys[:k]], [int(x) for x in store_ts[:k]]
        if first <= 1:
            self.begin_phy, self.begin_ts = phys[0], store_ts[0]
        linked: dict[int, int] = {}  # slot -> entry written by this call
        idx = first
        for h, phy, ts in zip(hashes, phys, store_ts):
            slot = h % self.slot_num
            slot_pos = HEADER_BYTES + slot * SLOT_BYTES
            prev = linked.get(slot)
            if prev is None:
                prev = _SLOT.unpack_from(mm, slot_pos)[0]
                if prev <= 0 or prev >= first:
                    prev = 0
                    self.hash_slot_count += 1
            diff = min(max((ts - self.begin_ts) // 1000, 0), INT_MAX) if self.begin_ts > 0 else 0
            ENTRY_STRUCT.pack_into(mm, self._entries_pos + idx * ENTRY_BYTES, h, phy, diff, prev)
            _SLOT.pack_into(mm, slot_pos, idx)
            linked[slot] = idx
            idx += 1
        self.index_count = idx
        self.end_phy, self.end_ts = phys[-1], store_ts[-1]
        self._write_header()
        self.dirty = True
        return idx - first

    def put_key(self, key: str, phy: int, store_ts: int) -> bool:
        """``IndexFile.putKey``: False when the file is full."""
        one = index_hashes([key])
        return self.put_hashes(one, np.array([phy]), np.array([store_ts])) == 1

    # --- read side ---------------------------------------------------------------------------
    def time_matched(self, begin_ms: int, end_ms: int) -> bool:
        return self.index_count > 1 and self.begin_ts <= end_ms and self.end_ts >= begin_ms

    def select(self, key_hash: int, begin_ms: int, end_ms: int, max_num: int) -> list[int]:
        """CommitLog offsets of entries with ``key_hash`` whose store time may lie in
        ``[begin_ms, end_ms]`` (entries keep whole seconds: callers re-check the record's own
        time), newest first, at most ``max_num``."""
        out: list[int] = []
        if self.index_count <= 1 or max_num <= 0 or self._mm is None:
            return out
        mm, base, count = self._mm, self._entries_pos, self.index_count
        cur = int(self._slots[key_hash % self.slot_num])
        while 0 < cur < count:
            h, phy, diff, prev = ENTRY_STRUCT.unpack_from(mm, base + cur * ENTRY_BYTES)
            t = self.begin_ts + diff * 1000  # stored somewhere in [t, t + 999]
            if h == key_hash and t <= end_ms and t + 999 >= begin_ms:
                out.append(phy)
                if len(out) >= max_num:
                    break
            if t + 999 < begin_ms or prev >= cur:  # chains go back in time; a loop is damage
                break
            cur = prev
        return out

    def select_key(
        self, key: str, begin_ms: int = 0, end_ms: int = LONG_MAX, max_num: int = 64
    ) -> list[int]:
        return self.select(int(index_hashes([key])[0]), begin_ms, end_ms, max_num)

    # --- lifecycle ---------------------------------------------------------------------------
    def flush(self) -> None:
        if self.dirty:
            self.dirty = False
            self.sync()

    def sync(self) -> None:
        """msync the mapping (whatever the dirty flag says)."""
        if self._mm is not None:
            self._mm.flush()

    def close(self) -> None:
        if self._mm is not None:
            self._slots = self._entries = None  # type: ignore[assignment]
            self._mm.close()
            self._mm = None

    def destroy(self) -> None:
        self.close()
        os.unlink(self.path)


@dataclass
class _Scanned:
    """Columns of records read back from the CommitLog by the service's own catch-up scan."""

    phys: list[int] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    sys_flags: list[int] = field(default_factory=list)
    store_ts: list[int] = field(default_factory=list)
    keys: list[str | None] = field(default_factory=list)
    uniq_keys: list[str | None] = field(default_factory=list)

    def add(self, phys: int, topic: str, sys_flag: int, store_ts: int, keys: str | None, uniq: str | None) -> None:
        self.phys.append(phys)
        self.topics.append(topic)
        self.sys_flags.append(sys_flag)
        self.store_ts.append(store_ts)
        self.keys.append(keys)
        self.uniq_keys.append(uniq)


class IndexService:
    """The dispatcher that keeps the index files: ``MessageStore(...,
    dispatchers=[IndexService])``.  Sizes come from ``store.config.extra["index_slots"]`` and
    ``["index_entries"]`` unless given."""

    def __init__(  # type: ignore[no-untyped-def]
        self, store, slot_num: int | None = None, index_num: int | None = None
    ) -> None:
        self.store = store
        extra = getattr(store.config, "extra", None) or {}
        self.slot_num = int(slot_num or extra.get("index_slots", DEFAULT_INDEX_SLOTS))
        self.index_num = int(index_num or extra.get("index_entries", DEFAULT_INDEX_ENTRIES))
        if not 1 <= self.slot_num <= INT_MAX:
            raise ConfigError(f"index_slots must be in [1, {INT_MAX}], not {self.slot_num}")
        if not 2 <= self.index_num <= INT_MAX:
            raise ConfigError(f"index_entries must be in [2, {INT_MAX}], not {self.index_num}")
        self.directory = os.path.join(store.root, L.INDEX_DIR)
        self._lock = threading.RLock()  # the file list and contents (dispatch, queries)
        self._flush_lock = threading.Lock()  # one flush at a time; close waits for it
        self._files: list[IndexFile] = []
        self._held = _Scanned()  # columns of small dispatches not indexed yet, in CommitLog order
        self._held_records = 0
        self.rebuilt_records = 0  # records indexed from this service's own CommitLog scan
        self._closed = False
        self._load(getattr(store, "last_exit_abnormal", False), store.checkpoint)
        indexed = [f.end_phy for f in self._files if f.index_count > 1]
        self._last_phy = max(indexed, default=-1)  # the newest indexed CommitLog offset
        # the CommitLog offset up to which records have been handed to us (None: nothing yet)
        self._covered: int | None = self._last_phy if indexed else None

    def _load(self, abnormal: bool, checkpoint) -> None:  # type: ignore[no-untyped-def]
        if not os.path.isdir(self.directory):
            return
        names = sorted(n for n in os.listdir(self.directory) if _NAME.match(n))
        for i, name in enumerate(names):
            try:
                self._files.append(
                    IndexFile(os.path.join(self.directory, name), self.slot_num, self.index_num)
                )
            except CorruptStoreError:
                # other sizes or a torn file: drop it and the files after it; they are rebuilt
                for later in names[i:]:
                    os.unlink(os.path.join(self.directory, later))
                break
        if abnormal:
            cp_offset, cp_ts = checkpoint.dispatched_offset, checkpoint.index_msg_timestamp
            keep = next(
                (
                    i
                    for i, f in enumerate(self._files)
                    if f.index_count > 1 and (f.end_phy >= cp_offset or f.end_ts > cp_ts)
                ),
                len(self._files),
            )
            for f in self._files[keep:]:
                f.destroy()
            del self._files[keep:]

    # --- dispatch --------------------------------------------------------------------------
    @property
    def files(self) -> list[IndexFile]:
        """The index files, every record handed to the service indexed in them."""
        with self._lock:
            self._drain()
            return self._files

    def dispatch(self, batch: DispatchBatch) -> None:
        n = len(batch)
        if n == 0:
            return
        with self._lock:
            if self._closed:
                return
            phys = batch._phys  # noqa: SLF001 - a list for a put of a few records
            first = phys[0] if phys.__class__ is list else int(phys[0])
            if self._covered is None or self._covered < first:
                self._catch_up(first)
            if n < HOLD_BATCH_MAX:
                self._hold(batch, n)
                if self._held_records >= HOLD_RECORDS:
                    self._drain()
            else:
                self._drain()
                self._index(
                    batch.column_list("phys"), batch.topics, batch.column_list("sys_flags"),
                    batch.column_list("store_timestamps"), batch.keys, batch.uniq_keys,
                )  # fmt: skip
            end = batch.end_offset
            if self._covered is None or end > self._covered:
                self._covered = end

    def dispatch_one(  # type: ignore[no-untyped-def]
        self, phys: int, size: int, topic: str, queue_id: int, queue_offset: int, tags_code: int,
        sys_flag: int, store_ts_ms: int, keys: str | None, uniq_key: str | None, end_offset: int,
    ) -> None:
        """:meth:`dispatch` of a batch of one record (held like the records of small batches)."""
        with self._lock:
            if self._closed:
                return
            covered = self._covered
            if covered is None or covered < phys:
                self._catch_up(phys)
            self._held.add(phys, topic, sys_flag, store_ts_ms, keys, uniq_key)
            self._held_records += 1
            if self._held_records >= HOLD_RECORDS:
                self._drain()
            if self._covered is None or end_offset > self._covered:
                self._covered = end_offset

    def _hold(self, b: DispatchBatch, n: int) -> None:
        """Add the columns :meth:`_index` reads of a small dispatch to the held ones."""
        h = self._held
        phys, flags, ts = b._phys, b._sys_flags, b._store_timestamps  # noqa: SLF001 - lists, or arrays
        h.phys += phys if phys.__class__ is list else as_list(phys)
        h.topics += b.topics
        h.sys_flags += flags if flags.__class__ is list else as_list(flags)
        h.store_ts += ts if ts.__class__ is list else as_list(ts)
        keys, uniq = b.keys, b.uniq_keys
        h.keys += keys if len(keys) == n else [*keys[:n], *[None] * (n - len(keys))]
        h.uniq_keys += uniq if len(uniq) == n else [*uniq[:n], *[None] * (n - len(uniq))]
        self._held_records += n

    def _drain(self) -> None:
        """Index the held records (under the lock), in one pass."""
        if not self._held_records:
            return
        s = self._held
        self._held, self._held_records = _Scanned(), 0
        self._index(s.phys, s.topics, s.sys_flags, s.store_ts, s.keys, s.uniq_keys)

    def _index(
        self,
        phys: np.ndarray | list[int],
        topics: list[str],
        sys_flags: np.ndarray | list[int],
        store_ts: np.ndarray | list[int],
        keys: list[str | None],
        uniq_keys: list[str | None],
    ) -> int:
        """Index records (skipping ROLLBACK ones and those already indexed); returns how many
        records were new."""
        last = self._last_phy
        phys_list = phys.tolist() if isinstance(phys, np.ndarray) else list(phys)
        sflags = sys_flags.tolist() if isinstance(sys_flags, np.ndarray) else list(sys_flags)
        sel = [
            i for i, (p, f) in enumerate(zip(phys_list, sflags))
            if p > last and (f & L.TRANSACTION_MASK) != L.TRANSACTION_ROLLBACK_TYPE
        ]  # fmt: skip
        if not sel:
            return 0
        one_topic = topics.count(topics[0]) == len(topics)
        prefix = topics[0] + "#"
        n_uniq, n_keys = len(uniq_keys), len(keys)
        # the UNIQ_KEY strings, then the KEYS words; a stable sort by record interleaves them
        strs: list[str] = []
        rec: list[int] = []
        for i in sel:
            u = uniq_keys[i] if i < n_uniq else None
            if u:
                strs.append(prefix + u if one_topic else f"{topics[i]}#{u}")
                rec.append(i)
        uniq_only = len(strs)
        words: dict[str, list[str]] = {}
        for i in sel:
            k = keys[i] if i < n_keys else None
            if not k:
                continue
            parts = words.get(k)
            if parts is None:
                parts = words[k] = [w for w in k.split(L.KEY_SEPARATOR) if w]
            t = prefix if one_topic else topics[i] + "#"
            strs.extend(t + w for w in parts)
            rec.extend([i] * len(parts))
        if not strs:
            return len(sel)
        if len(strs) <= SMALL_KEYS:
            order = sorted(range(len(rec)), key=rec.__getitem__)  # stable: by record
            ts_list = store_ts.tolist() if isinstance(store_ts, np.ndarray) else list(store_ts)
            hs = [index_hash(strs[j]) for j in order]
            kp = [phys_list[rec[j]] for j in order]
            kt = [ts_list[rec[j]] for j in order]
            done = 0
            while done < len(hs):
                done += self._writable_file()._put_few(hs[done:], kp[done:], kt[done:])
            self._last_phy = kp[-1]
            return len(sel)
        rec_arr = np.asarray(rec, dtype=np.int64)
        hashes = index_hashes(strs)
        if len(strs) > uniq_only:
            order = np.argsort(rec_arr, kind="stable")
            rec_arr, hashes = rec_arr[order], hashes[order]
        key_phys = np.asarray(phys, dtype=np.int64)[rec_arr]
        key_ts = np.asarray(store_ts, dtype=np.int64)[rec_arr]
        done = 0
        while done < len(hashes):
            f = self._writable_file()
            done += f.put_hashes(hashes[done:], key_phys[done:], key_ts[done:])
        self._last_phy = int(key_phys[-1])
        return len(sel)

    def _writable_file(self) -> IndexFile:
        if self._files and not self._files[-1].is_full:
            return self._files[-1]
        last = self._files[-1] if self._files else None
        os.makedirs(self.directory, exist_ok=True)
        f = IndexFile(
            os.path.join(self.directory, self._new_name()),
            self.slot_num,
            self.index_num,
            create=True,
            begin_phy=last.end_phy if last else 0,
            begin_ts=last.end_ts if last else 0,
        )
        self._files.append(f)
        return f

    def _new_name(self) -> str:
        """``yyyyMMddHHmmssSSS`` of now, a millisecond later until it sorts after the last file."""
        last = os.path.basename(self._files[-1].path) if self._files else ""
        ms = self.store.clock.now_ms()
        while True:
            name = time.strftime("%Y%m%d%H%M%S", time.localtime(ms // 1000)) + f"{ms % 1000:03d}"
            if name > last and not os.path.exists(os.path.join(self.directory, name)):
                return name
            ms += 1

    def _catch_up(self, upto: int) -> None:
        """Index the CommitLog records in ``[covered, upto)`` ourselves (files dropped after a
        crash, a deleted index directory): the store only re-dispatches from its checkpoint."""
        self._drain()  # they come first in the CommitLog
        cl = self.store.commitlog
        offset = max(self._covered or 0, cl.min_offset)
        scanned = _Scanned()
        while offset < upto:
            mf = cl.mfq.find(offset)
            if mf is None:
                break
            pos = offset - mf.from_offset
            kind, size, _ = check_record(mf.mm, pos, mf.size_bytes, check_crc=False)
            if kind == RecordCheck.BLANK:
                offset = mf.end_offset
                continue
            if kind != RecordCheck.VALID:
                break
            scanned.add(offset, *_index_fields(mf.mm, pos))
            offset += size
            if len(scanned.phys) >= _SCAN_BATCH_RECORDS:
                self._index_scanned(scanned)
                scanned = _Scanned()
        self._index_scanned(scanned)
        self._covered = max(self._covered or 0, upto)

    def _index_scanned(self, s: _Scanned) -> None:
        if s.phys:
            self.rebuilt_records += self._index(
                np.asarray(s.phys, dtype=np.int64), s.topics, np.asarray(s.sys_flags, np.int32),
                np.asarray(s.store_ts, dtype=np.int64), s.keys, s.uniq_keys,
            )  # fmt: skip

    # --- queries -------------------------------------------------------------------------------
    def query_offsets(
        self, topic: str, key: str, max_num: int = 64, begin_ms: int = 0, end_ms: int = LONG_MAX
    ) -> list[int]:
        """CommitLog offsets of records indexed under ``topic#key`` whose store time may lie in
        ``[begin_ms, end_ms]``, newest first, at most ``max_num``.  Hash collisions are NOT
        filtered here: callers compare the records' keys (:mod:`rmq_spark.store.query`)."""
        key_hash = int(index_hashes([f"{topic}#{key}"])[0])
        out: list[int] = []
        with self._lock:
            self._drain()
            for f in reversed(self._files):
                if len(out) >= max_num:
                    break
                if f.time_matched(begin_ms, end_ms):
                    out.extend(f.select(key_hash, begin_ms, end_ms, max_num - len(out)))
                if f.index_count > 1 and f.begin_ts < begin_ms:
                    break  # older files end before this one begins
        return out

    @property
    def key_count(self) -> int:
        with self._lock:
            self._drain()
            return sum(f.key_count for f in self._files)

    # --- lifecycle -----------------------------------------------------------------------------
    def flush(self) -> None:
        """Catch up with the store (after recovery), sync the files, and put the last indexed
        store time in the checkpoint (the store writes it right after this).  The sync runs
        outside the dispatch lock: puts do not wait for it."""
        with self._flush_lock:
            with self._lock:
                if self._closed:
                    return
                done = self.store.dispatched_offset
                self._drain()
                if self._covered is None or self._covered < done:
                    self._catch_up(done)
                dirty = [f for f in self._files if f.dirty]
                for f in dirty:
                    f.dirty = False
                last = next((f for f in reversed(self._files) if f.index_count > 1), None)
                last_ts = last.end_ts if last is not None else None
            for f in dirty:
                f.sync()
            if last_ts is not None:
                self.store.checkpoint.index_msg_timestamp = last_ts

    def close(self) -> None:
        with self._flush_lock, self._lock:
            self._drain()
            self._closed = True
            for f in self._files:
                f.close()
            self._files = []
