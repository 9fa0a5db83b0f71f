"""Records encoded outside the put lock (:class:`EncodedBatch`), and what the lock fills in:
QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP and the optional whole-record CRC property."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from zlib_ng.zlib_ng import crc32

from rmq_spark.store.dispatch import Column, as_list
from rmq_spark.store.message import IdColumn
from rmq_spark.store.properties import PROP_CRC_BYTES, PROP_CRC_PREFIX
from rmq_spark.store.record import POS_BODY_CRC, POS_PHYSICAL_OFFSET, POS_QUEUE_OFFSET

_TS = struct.Struct(">q")
_QP = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET

# batches up to this size are encoded, finalized, appended and dispatched record by record with
# struct, their columns kept as lists (measured: a put of 32 messages 970 -> 430 us, of 256 about
# even); larger ones column by column with numpy
SMALL_BATCH = 128

_HUNDREDS = (100 ** np.arange(5)).astype(np.uint32)
# "00".."99" as little-endian pairs, units digit first
_TWO_DIGITS = np.array([(48 + i % 10) | ((48 + i // 10) << 8) for i in range(100)], dtype="<u2")


def _crc_digits(crcs: np.ndarray) -> np.ndarray:
    """(n, 10) ASCII digits of CRCs (sign bit cleared), least significant first: two digits per
    lookup."""
    c = (np.asarray(crcs) & 0x7FFFFFFF).astype(np.uint32)
    return _TWO_DIGITS[c[:, None] // _HUNDREDS % 100].view(np.uint8)


class EncodedBatch:
    """Records encoded outside the put lock; :meth:`finalize` patches in what only the lock knows.
    Numpy columns (a batch of a few records keeps them as lists until read)."""

    __slots__ = (
        "_queue_ids",
        "_rel_pos",
        "_sizes",
        "_store_ts_pos",
        "_sys_flags",
        "_tags_codes",
        "buf",
        "keys",
        "prop_crc",
        "properties",
        "topics",
        "uniq_keys",
    )  # fmt: skip
    rel_pos = Column(np.int64)  # start of each record relative to the batch
    sizes = Column(np.int32)
    store_ts_pos = Column(np.int64)  # position of STORETIMESTAMP inside each record
    queue_ids = Column(np.int32)
    tags_codes = Column(np.int64)
    sys_flags = Column(np.int32)

    def __init__(
        self,
        buf: bytearray,
        rel_pos: np.ndarray | list[int],
        sizes: np.ndarray | list[int],
        store_ts_pos: np.ndarray | list[int],
        queue_ids: np.ndarray | list[int],
        topics: Sequence[str],
        tags_codes: np.ndarray | Sequence[int],
        sys_flags: np.ndarray | list[int],
        keys: list[str | None],
        uniq_keys: Sequence[str | None],
        properties: Sequence[dict[str, str]],
        prop_crc: bool = False,
    ) -> None:
        self.buf = buf
        self._rel_pos = rel_pos
        self._sizes = sizes
        self._store_ts_pos = store_ts_pos
        self._queue_ids = queue_ids
        self.topics = topics
        self._tags_codes = tags_codes
        self._sys_flags = sys_flags
        self.keys = keys
        self.uniq_keys = uniq_keys
        self.properties = properties
        self.prop_crc = prop_crc

    def __len__(self) -> int:
        return len(self._sizes)

    @property
    def nbytes(self) -> int:
        return len(self.buf)

    def body_crcs(self) -> np.ndarray:
        """Each record's BODYCRC, read back from its header (records made of the same bodies
        again, a commit's real messages, take them instead of hashing the bodies twice)."""
        arr = np.frombuffer(self.buf, dtype=np.uint8)
        at = np.asarray(self.rel_pos, dtype=np.int64) + POS_BODY_CRC
        return arr[at[:, None] + np.arange(4)].copy().view(">i4").reshape(-1).astype(np.int64)

    def finalize(
        self, phys_offsets: np.ndarray, queue_offsets: np.ndarray, store_ts_ms: int
    ) -> None:
        """Write PHYSICALOFFSET, QUEUEOFFSET and STORETIMESTAMP of every record (vectorized)."""
        n = len(self._sizes)
        if n <= SMALL_BATCH:
            self.finalize_lists(as_list(phys_offsets), as_list(queue_offsets), store_ts_ms)
            return
        sizes = self.sizes
        size = int(sizes[0])
        if (
            size * n == len(self.buf)
            and int(sizes.min()) == size
            and int(self.store_ts_pos.min()) == int(self.store_ts_pos.max())
        ):
            self._finalize_uniform(size, phys_offsets, queue_offsets, store_ts_ms)
            return
        size = int(sizes[-1])
        head = int(self.rel_pos[1]) if n > 1 else 0
        if (head + size * (n - 1) == len(self.buf) and int(sizes[1:].min()) == size
                and int(self.store_ts_pos[1:].min()) == int(self.store_ts_pos[1:].max())):  # fmt: skip
            # one record, then records of one size (a group commit: its op message, the messages)
            phys, qoffs = as_list(phys_offsets[:1]), as_list(queue_offsets[:1])
            self._finalize_record(
                0, int(sizes[0]), int(self.store_ts_pos[0]), phys[0], qoffs[0], store_ts_ms
            )
            self._finalize_uniform(size, phys_offsets[1:], queue_offsets[1:], store_ts_ms, head)
            return
        arr = np.frombuffer(self.buf, dtype=np.uint8)
        eight = np.arange(8, dtype=np.int64)
        po = np.asarray(phys_offsets, dtype=">i8").view(np.uint8).reshape(n, 8)
        arr[(self.rel_pos + POS_PHYSICAL_OFFSET)[:, None] + eight] = po
        qo = np.asarray(queue_offsets, dtype=">i8").view(np.uint8).reshape(n, 8)
        arr[(self.rel_pos + POS_QUEUE_OFFSET)[:, None] + eight] = qo
        ts = np.full(n, store_ts_ms, dtype=">i8").view(np.uint8).reshape(n, 8)
        arr[(self.rel_pos + self.store_ts_pos)[:, None] + eight] = ts
        if self.prop_crc:
            mv = memoryview(self.buf)
            ends = (self.rel_pos + sizes - PROP_CRC_BYTES).tolist()
            crcs = np.fromiter(
                map(crc32, map(mv.__getitem__, map(slice, self.rel_pos.tolist(), ends))),
                np.int64,
                n,
            )
            digits = _crc_digits(crcs)
            pos = np.asarray(ends, dtype=np.int64) + len(PROP_CRC_PREFIX)
            arr[pos[:, None] + np.arange(10, dtype=np.int64)] = digits
            mv.release()

    def _finalize_uniform(
        self, size: int, phys_offsets: Any, queue_offsets: Any, store_ts_ms: int, start: int = 0
    ) -> None:
        """:meth:`finalize` of the records of one size from byte ``start`` to the end: strided
        column stores on an (n, size) view."""
        n = (len(self.buf) - start) // size
        rows = np.frombuffer(self.buf, dtype=np.uint8, offset=start).reshape(n, size)
        rows[:, POS_QUEUE_OFFSET : POS_QUEUE_OFFSET + 8] = (
            np.asarray(queue_offsets, dtype=">i8").view(np.uint8).reshape(n, 8)
        )
        rows[:, POS_PHYSICAL_OFFSET : POS_PHYSICAL_OFFSET + 8] = (
            np.asarray(phys_offsets, dtype=">i8").view(np.uint8).reshape(n, 8)
        )
        at = int(self.store_ts_pos[-1])
        rows[:, at : at + 8] = np.frombuffer(_TS.pack(store_ts_ms), dtype=np.uint8)
        if self.prop_crc:
            # each record but its CRC digits as one void item (a strided view): crc32 reads those
            # faster than row arrays
            heads = np.ndarray(
                (n,),
                dtype=f"V{size - PROP_CRC_BYTES}",
                buffer=self.buf,
                offset=start,
                strides=(size,),
            )
            crcs = np.fromiter(map(crc32, heads), np.int64, n)
            del heads
            at = size - PROP_CRC_BYTES + len(PROP_CRC_PREFIX)
            rows[:, at : at + 10] = _crc_digits(crcs)
        del rows

    def finalize_lists(
        self, phys_offsets: list[int], queue_offsets: list[int], store_ts_ms: int
    ) -> None:
        """:meth:`finalize` of a batch of at most ``SMALL_BATCH`` records, offsets given as lists."""
        rels, sizes, ts_positions = self._rel_pos, self._sizes, self._store_ts_pos
        if (
            rels.__class__ is not list
            or sizes.__class__ is not list
            or ts_positions.__class__ is not list
        ):
            rels, sizes, ts_positions = as_list(rels), as_list(sizes), as_list(ts_positions)
        for rel, size, ts_pos, phys, qoff in zip(
            rels, sizes, ts_positions, phys_offsets, queue_offsets, strict=True
        ):
            self._finalize_record(rel, size, ts_pos, phys, qoff, store_ts_ms)

    def _finalize_record(
        self, rel: int, size: int, ts_pos: int, phys: int, qoff: int, store_ts_ms: int
    ) -> None:
        buf = self.buf
        _QP.pack_into(buf, rel + POS_QUEUE_OFFSET, qoff, phys)
        _TS.pack_into(buf, rel + ts_pos, store_ts_ms)
        if self.prop_crc:
            end = rel + size - PROP_CRC_BYTES
            crc = crc32(memoryview(buf)[rel:end]) & 0x7FFFFFFF
            at = end + len(PROP_CRC_PREFIX)
            buf[at : at + 10] = (b"%010d" % crc)[::-1]


class _Chain(Sequence):  # type: ignore[type-arg]
    """Sequences read as one, without materializing lazy ones."""

    def __init__(self, parts: list[Sequence]) -> None:  # type: ignore[type-arg]
        self._parts = parts
        self._ends = np.cumsum([len(p) for p in parts])

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        k = int(np.searchsorted(self._ends, i, side="right"))
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._parts[k][i - (int(self._ends[k - 1]) if k else 0)]


def _joined_ids(parts: list) -> Sequence[str | None]:  # type: ignore[type-arg]
    """The batches' ids as one IdColumn when they are IdColumns and records without ids (no
    string made), else as a list."""
    if any(isinstance(p, IdColumn) for p in parts):
        joined = IdColumn.joined(parts)
        if joined is not None:
            return joined
    return list(itertools.chain.from_iterable(parts))


def concat_encoded(batches: Sequence[EncodedBatch]) -> EncodedBatch:
    """Encoded batches as one (appended as one unit: visible together)."""
    if len(batches) == 1:
        return batches[0]
    if len({b.prop_crc for b in batches}) != 1:
        raise ValueError("batches to join differ in prop_crc")
    starts = np.cumsum([0] + [len(b.buf) for b in batches[:-1]])
    props = [b.properties for b in batches]
    return EncodedBatch(
        buf=bytearray().join(b.buf for b in batches),
        rel_pos=np.concatenate([b.rel_pos + int(s) for b, s in zip(batches, starts, strict=True)]),
        sizes=np.concatenate([b.sizes for b in batches]),
        store_ts_pos=np.concatenate([b.store_ts_pos for b in batches]),
        queue_ids=np.concatenate([b.queue_ids for b in batches]),
        topics=list(itertools.chain.from_iterable(b.topics for b in batches)),
        tags_codes=np.concatenate([b.tags_codes for b in batches]),
        sys_flags=np.concatenate([b.sys_flags for b in batches]),
        keys=list(itertools.chain.from_iterable(b.keys for b in batches)),
        uniq_keys=_joined_ids([b.uniq_keys for b in batches]),
        properties=[p for ps in props for p in ps]
        if all(type(p) is list for p in props)
        else _Chain(props),
        prop_crc=batches[0].prop_crc,
    )
