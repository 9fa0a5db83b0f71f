"""The IndexFile: CommitLog offsets by message key, in RocketMQ's layout (the IndexService that
feeds it is in :mod:`.service`).

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

Entry 0, never an entry in RocketMQ, holds this store's seal: ``RMQSEAL1`` and a CRC32 of the
header, the slots and entries 1 .. indexCount-1, written when the file is full or the store stops
cleanly and cleared before the file changes again.  A sealed file whose CRC does not match is
damaged: the service drops it and rebuilds it from the CommitLog.

Each message gets an entry for ``topic#UNIQ_KEY`` and one per non-empty space-separated word of
its KEYS; ROLLBACK records get none (PREPARED ones do).  A full file rolls over to a new one whose
header starts where the previous one ended.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from zlib_ng.zlib_ng import crc32

from rmq_spark.errors import CorruptStoreError
from rmq_spark.store import layout as L
from rmq_spark.store.hashing import (
    java_string_hash,
    java_string_hashes,
    java_string_hashes_arrow,
    java_string_hashes_of_rows,
)
from rmq_spark.store.mapped import ALLOCATE_AHEAD_BYTES, allocate
from rmq_spark.store.properties import find_properties
from rmq_spark.store.record import (
    POS_SYS_FLAG,
    store_timestamp_at,
    walk,
)

__all__ = [
    "DEFAULT_INDEX_ENTRIES",
    "DEFAULT_INDEX_SLOTS",
    "IndexFile",
    "index_hash",
    "index_hashes",
]

DEFAULT_INDEX_SLOTS = 5_000_000  # maxHashSlotNum
DEFAULT_INDEX_ENTRIES = 20_000_000  # maxIndexNum
HEADER = struct.Struct(">qqqqii")
SEAL_MAGIC = b"RMQSEAL1"  # in entry 0, then the CRC32 (see the module docstring)
_SEAL_CRC = struct.Struct(">I")
HEADER_BYTES = HEADER.size
ENTRY = np.dtype([("hash", ">i4"), ("phy", ">i8"), ("diff", ">i4"), ("prev", ">i4")])
ENTRY_STRUCT = struct.Struct(">iqii")
ENTRY_BYTES = ENTRY.itemsize
SLOT_BYTES = 4
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
_NAME = re.compile(r"^\d{17}$")
SMALL_KEYS = 8  # up to this many keys are hashed and linked one by one, in plain Python
_SLOT = struct.Struct(">i")
assert HEADER_BYTES == 40 and ENTRY_BYTES == 20 == ENTRY_STRUCT.size


def index_hash(key: str) -> int:
    """The IndexFile keyHash of one key: ``abs(hashCode)``, with ``Integer.MIN_VALUE`` -> 0."""
    h = java_string_hash(key)
    return 0 if h == -(2**31) else abs(h)


def index_hashes(keys: Sequence[str]) -> np.ndarray:
    """The IndexFile keyHash of each key: ``abs(hashCode)``, with ``Integer.MIN_VALUE`` -> 0."""
    if len(keys) <= SMALL_KEYS:
        return np.array([index_hash(k) for k in keys], dtype=np.int32)
    h = np.abs(java_string_hashes(keys).astype(np.int64))
    h[h > INT_MAX] = 0
    return h.astype(np.int32)


def id_keys(
    topics: Sequence[str],
    uniq_keys: Sequence[str | None],
    sel: np.ndarray,
    every: bool,
    one_topic: bool,
) -> list[str]:
    """The index keys ``topic#UNIQ_KEY`` of the records ``sel`` (``every``: all of them)."""
    picked = uniq_keys if every else [uniq_keys[i] for i in sel.tolist()]
    if one_topic:
        prefix = topics[0] + "#"
        return [prefix + u for u in picked]  # type: ignore[operator]
    named = topics if every else [topics[i] for i in sel.tolist()]
    return [f"{t}#{u}" for t, u in zip(named, picked, strict=True)]


def index_hashes_of_ids(prefix: str, digits: np.ndarray) -> np.ndarray:
    """:func:`index_hashes` of ``prefix`` + each unique id of an (n, 32) array of its ASCII digits."""
    h = np.abs(java_string_hashes_of_rows(prefix, digits).astype(np.int64))
    h[h > INT_MAX] = 0
    return h.astype(np.int32)


def id_hashes(
    topics: Sequence[str],
    uniq_keys: Sequence[str | None],
    keep: np.ndarray,
    sel: np.ndarray,
    one_topic: bool,
) -> np.ndarray:
    """:func:`index_hashes` of the keys ``topic#UNIQ_KEY`` of the records ``sel`` (those true in
    ``keep``): from an IdColumn's digits when the records share a topic (a sink's rows; a
    commit's real messages, after its op message), else from the strings."""
    every = len(sel) == len(topics)
    digits = getattr(uniq_keys, "digits", None)
    if digits is not None and one_topic:
        return index_hashes_of_ids(topics[0] + "#", digits if every else digits[sel])
    if digits is not None:  # the records kept may still share a topic: all but a few
        others = np.flatnonzero(~keep).tolist()
        first = topics[int(sel[0])]
        if len(others) < 64 and topics.count(first) == len(sel) + sum(
            topics[i] == first for i in others
        ):
            return index_hashes_of_ids(first + "#", digits[sel])
    return index_hashes(id_keys(topics, uniq_keys, sel, every, one_topic))


def index_hashes_arrow(keys: pa.Array) -> np.ndarray:
    """:func:`index_hashes` of an Arrow string column."""
    h = np.abs(java_string_hashes_arrow(keys).astype(np.int64))
    h[h > INT_MAX] = 0
    return h.astype(np.int32)


def key_word_hashes(
    chosen: np.ndarray, topics: Sequence[str], keys: Sequence[str | None], one_topic: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(record, keyHash) of every non-empty word of the KEYS of the records ``chosen`` (indexes
    into ``topics`` and ``keys``), in record order, each word hashed as ``topic#word``: split,
    prefixed and hashed column-wise (Arrow)."""
    picked = keys if len(chosen) == len(keys) else [keys[i] for i in chosen.tolist()]
    split = pc.split_pattern(pa.array(picked, pa.string()), L.KEY_SEPARATOR)
    words = pc.list_flatten(split)
    parents = pc.list_parent_indices(split).to_numpy()
    nonempty = pc.greater(pc.binary_length(words), 0)
    if not pc.all(nonempty).as_py():
        words, parents = words.filter(nonempty), parents[nonempty.to_numpy(zero_copy_only=False)]
    rec = chosen[parents]
    if one_topic:
        full = pc.binary_join_element_wise(pa.scalar(topics[0] + "#"), words, pa.scalar(""))
    else:
        named = pa.array([topics[i] + "#" for i in rec.tolist()], pa.string())
        full = pc.binary_join_element_wise(named, words, pa.scalar(""))
    return rec, index_hashes_arrow(full)


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
                try:
                    os.ftruncate(fd, size)
                    # the header and slots (written anywhere) now; entries as they come (put_*)
                    allocate(fd, 0, HEADER_BYTES + slot_num * SLOT_BYTES + ENTRY_BYTES, path)
                except BaseException:
                    os.close(fd)
                    os.unlink(path)
                    raise
            elif (actual := os.fstat(fd).st_size) != size:
                raise CorruptStoreError(
                    f"{path}: index file is {actual} bytes, expected {size} "
                    f"({slot_num} slots, {index_num} entries)",
                    path,
                    actual,
                )
            if not create:  # (an older version's file may be sparse: its slots get blocks now)
                allocate(fd, 0, HEADER_BYTES + slot_num * SLOT_BYTES, path)
            self._mm: mmap.mmap | None = mmap.mmap(fd, size)
        except BaseException:
            if not create:
                os.close(fd)
            raise
        self._fd = fd  # kept for allocating the entries' blocks as they are written
        self._allocated = HEADER_BYTES + slot_num * SLOT_BYTES
        self._entries_pos = HEADER_BYTES + slot_num * SLOT_BYTES
        self._slots = np.frombuffer(self._mm, dtype=">i4", count=slot_num, offset=HEADER_BYTES)
        self._entries = np.frombuffer(
            self._mm, dtype=ENTRY, count=index_num, offset=self._entries_pos
        )
        self.dirty = create
        self._sealed = False
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
        e0 = self._entries_pos
        self._sealed = self._mm[e0 : e0 + len(SEAL_MAGIC)] == SEAL_MAGIC
        if (
            self._sealed
            and _SEAL_CRC.unpack_from(self._mm, e0 + len(SEAL_MAGIC))[0] != self._checksum()
        ):
            self.close()
            raise CorruptStoreError(
                f"{path}: the sealed index file's CRC does not match its content", path, e0
            )

    @property
    def sealed(self) -> bool:
        return self._sealed

    def _checksum(self) -> int:
        """CRC32 of the header, the slots and the entries in use (entry 0, the seal, left out)."""
        mm, e0 = self._mm, self._entries_pos
        assert mm is not None
        crc = crc32(mm[0:e0])
        return crc32(mm[e0 + ENTRY_BYTES : e0 + self.index_count * ENTRY_BYTES], crc)

    def seal(self) -> None:
        """Write the seal (see the module docstring) and sync: the file can be checked on load."""
        if self._mm is not None and not self._sealed:
            e0 = self._entries_pos
            self._mm[e0 : e0 + len(SEAL_MAGIC)] = SEAL_MAGIC
            _SEAL_CRC.pack_into(self._mm, e0 + len(SEAL_MAGIC), self._checksum())
            self._sealed = True
            self.sync()

    def _unseal(self) -> None:
        """Before the file changes: its seal would no longer hold."""
        e0 = self._entries_pos
        assert self._mm is not None
        self._mm[e0 : e0 + len(SEAL_MAGIC) + _SEAL_CRC.size] = bytes(
            len(SEAL_MAGIC) + _SEAL_CRC.size
        )
        self._sealed = False

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
        self._allocate_entries(first, k)
        if self._sealed:
            self._unseal()
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
        self._allocate_entries(first, k)
        if self._sealed:
            self._unseal()
        hashes, phys, store_ts = (
            [int(x) for x in hashes[:k]],
            [int(x) for x in phys[:k]],
            [int(x) for x in store_ts[:k]],
        )
        if first <= 1:
            self.begin_phy, self.begin_ts = phys[0], store_ts[0]
        linked: dict[int, int] = {}  # slot -> entry written by this call
        idx = first
        for h, phy, ts in zip(hashes, phys, store_ts, strict=True):
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
            os.close(self._fd)

    def _allocate_entries(self, first: int, k: int) -> None:
        """Blocks for entries ``[first, first + k)`` before they are written (a full disk raises
        :class:`DiskFullError` here, nothing written; never a SIGBUS on the mapping)."""
        end = self._entries_pos + (first + k) * ENTRY_BYTES
        if end > self._allocated:
            upto = min(
                self._entries_pos + self.index_num * ENTRY_BYTES,
                max(end, self._allocated + ALLOCATE_AHEAD_BYTES),
            )
            allocate(self._fd, self._allocated, upto, self.path)
            self._allocated = upto

    def destroy(self) -> None:
        self.close()
        os.unlink(self.path)
