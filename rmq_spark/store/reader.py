"""Bulk reads of a queue range into Arrow, vectorized with numpy over the mapped files.

:func:`read_queue_arrow` turns ConsumeQueue units ``[start, end)`` into a ``pyarrow.RecordBatch``
of :data:`MESSAGE_SCHEMA` (MessageExt's fields), with no Python work per message:

* the fixed header fields of all records come from ONE gather of 52 bytes per record;
* bodies: one fixed-width numpy gather when they all have one length, else Arrow
  ``binary_view`` structs pointing into the mapped CommitLog and one C++ cast (the gather);
* properties: when every record has one layout (a batch put writes them so: same keys, value
  lengths and separators, only value bytes differ) each value column is a column slice of one
  (n, width) byte matrix (:class:`UniformProperties`); otherwise separators are found with numpy
  over the whole column (:class:`ParsedProperties`).  Only the columns asked for are built.

:class:`StoreReader` opens a store directory read-only, so that another process can read
while the broker appends; :meth:`StoreReader.read_chunks` yields a range as
batches bounded in rows and bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq_spark.errors import StoreError
from rmq_spark.store import layout as L
from rmq_spark.store.consumequeue import CQ_UNIT, ConsumeQueue
from rmq_spark.store.mapped import MappedFileQueue
from rmq_spark.store.message import offset_msg_ids
from rmq_spark.store import record as R

_CRC_PREFIX, _CRC_BYTES = R.PROP_CRC_PREFIX, R.PROP_CRC_BYTES

TS = pa.timestamp("us", tz="UTC")
MESSAGE_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("queueId", pa.int32()),
        pa.field("queueOffset", pa.int64()),
        pa.field("msgId", pa.string()),
        pa.field("tags", pa.string()),
        pa.field("keys", pa.string()),
        pa.field("body", pa.binary()),
        pa.field("properties", pa.map_(pa.string(), pa.string())),
        pa.field("bornTimestamp", TS),
        pa.field("storeTimestamp", TS),
        pa.field("deliverTimestamp", TS),
        pa.field("reconsumeTimes", pa.int32()),
        pa.field("transactionId", pa.string()),
        pa.field("commitLogOffset", pa.int64()),
    ]
)  # a message read back, one column per MessageExt field
SOURCE_SCHEMA = MESSAGE_SCHEMA  # its former name, still imported by tests/store/test_reader.py


def empty_batch(columns: Sequence[str] | None = None) -> pa.RecordBatch:
    fields = [f for f in MESSAGE_SCHEMA if columns is None or f.name in columns]
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in fields], schema=pa.schema(fields))


def _at(buf: np.ndarray, dtype: str) -> np.ndarray:
    """``buf`` seen as overlapping items of ``dtype`` starting at every byte: ``_at(buf, ">i4")[p]``
    is the big-endian int at byte ``p``, so one fancy index gathers a field of many records."""
    size = np.dtype(dtype).itemsize
    return np.ndarray(shape=(max(len(buf) - size + 1, 0),), dtype=dtype, buffer=buf, strides=(1,))


def _gather(buf: np.ndarray, pos: np.ndarray, width: int, dtype: str) -> np.ndarray:
    assert np.dtype(dtype).itemsize == width
    return _at(buf, dtype)[pos]


# byte masks of the three inline words for a length of 0..12; 13 stands for "longer": keep all
def _inline_mask(length: int, word: int) -> int:
    keep = max(0, min(4, length - 4 * word))
    return (1 << (8 * keep)) - 1


_INLINE_MASKS = np.array(
    [[_inline_mask(k, j) for j in range(3)] for k in range(13)] + [[0xFFFFFFFF] * 3], dtype="<u4"
)


def _views(buf: np.ndarray, start: np.ndarray, length: np.ndarray, buffer_index: int) -> np.ndarray:
    """Arrow binary_view structs (16 bytes each) for byte ranges of ``buf``: ``length``, then up
    to 12 inline bytes, or a 4-byte prefix, the buffer index and the offset.  Worked on as
    little-endian 32-bit words; returns an (n, 4) uint32 array."""
    n = len(start)
    out = np.empty((n, 4), dtype="<u4")
    if n == 0:
        return out
    length = length.astype(np.int64)
    if int(length.min()) > 12:  # no inline data: the prefix is all that is read
        out[:, 0] = length
        out[:, 1] = _at(buf, "<u4")[start]
        out[:, 2] = buffer_index
        out[:, 3] = start
        return out
    if int(start.max()) > len(buf) - 12:  # the 12-byte reads below must stay inside the buffer
        buf = np.concatenate([buf, np.zeros(12, dtype=np.uint8)])
    # 12 bytes from each start: the inline content, or the prefix
    words = _at(buf, "V12")[start].view("<u4").reshape(n, 3)
    words &= _INLINE_MASKS[np.minimum(length, 13)]
    short = length <= 12
    out[:, 0] = length
    out[:, 1] = words[:, 0]
    out[:, 2] = np.where(short, words[:, 1], np.uint32(buffer_index))
    out[:, 3] = np.where(short, words[:, 2], start.astype("<u4"))
    return out


# header fields read by the source: record byte position with IPv4 hosts, type, and how many of
# the two hosts (BORNHOST, STOREHOST: +12 bytes each when IPv6) come before the field
_FIELDS = {
    "sys_flag": (R.POS_SYS_FLAG, ">i4", 0),
    "born_ts": (R.POS_BORN_TIMESTAMP, ">i8", 0),
    "store_ts": (R.POS_STORE_TIMESTAMP_V4, ">i8", 1),
    "reconsume": (R.POS_RECONSUME_TIMES_V4, ">i4", 2),
    "body_len": (R.POS_BODY_LEN_V4, ">i4", 2),
}
# ... all within one span from SYSFLAG to BODYLEN, gathered as ONE item per record
_HEAD_AT = R.POS_SYS_FLAG
_HEAD = np.dtype(
    {
        "names": list(_FIELDS),
        "formats": [f[1] for f in _FIELDS.values()],
        "offsets": [f[0] - _HEAD_AT for f in _FIELDS.values()],
        "itemsize": _FIELDS["body_len"][0] + 4 - _HEAD_AT,
    }
)
_BODY_AT = _FIELDS["body_len"][0] + 4
_V6 = L.FLAG_BORNHOST_V6 | L.FLAG_STOREHOST_V6


class _Headers:
    """Header fields of the records at ``pos`` of one mapped segment (IPv6 hosts shift them)."""

    def __init__(self, mm_buf: np.ndarray, pos: np.ndarray) -> None:
        head = _at(mm_buf, f"V{_HEAD.itemsize}")[pos + _HEAD_AT].view(_HEAD)
        self.sys_flag = head["sys_flag"].astype(np.int32)
        self._head, self._buf, self._pos = head, mm_buf, pos
        self._v6 = v6 = np.flatnonzero(self.sys_flag & _V6)
        self.body_len = self.field("body_len").astype(np.int64)
        self.body_start = pos + _BODY_AT
        if len(v6):
            self.body_start[v6] += self._shift(v6, 2)

    def _shift(self, rows: np.ndarray, hosts_before: int) -> np.ndarray:
        sf = self.sys_flag[rows]
        shift = np.where(sf & L.FLAG_BORNHOST_V6, 12, 0) if hosts_before >= 1 else np.zeros(len(rows), np.int64)
        if hosts_before >= 2:
            shift = shift + np.where(sf & L.FLAG_STOREHOST_V6, 12, 0)
        return shift.astype(np.int64)

    def field(self, name: str) -> np.ndarray:
        """Field ``name`` of every record (the IPv6 ones gathered again at their place)."""
        at, dtype, hosts_before = _FIELDS[name]
        out = self._head[name].astype(np.int64 if dtype == ">i8" else np.int32)
        v6 = self._v6
        if len(v6) and hosts_before:
            out[v6] = _gather(self._buf, self._pos[v6] + at + self._shift(v6, hosts_before), np.dtype(dtype).itemsize, dtype)
        return out


def _owner(pos: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For sorted byte positions, the index of the record ``[starts[i], ends[i])`` holding each
    (-1 when none).  Records are disjoint and in buffer order, so record ``i`` holds exactly
    ``pos[first[i]:last[i]]``: two searches of ``n`` records instead of one per position."""
    m = len(pos)
    first = np.searchsorted(pos, starts, side="left")
    last = np.searchsorted(pos, ends, side="left")
    counts = last - first
    if int(counts.sum()) == m:  # every position belongs to a record
        return np.repeat(np.arange(len(starts), dtype=np.int64), counts)
    owner = np.full(m, -1, dtype=np.int64)
    has = counts > 0
    delta = np.bincount(first[has], minlength=m + 1) - np.bincount(last[has], minlength=m + 1)
    owner[np.cumsum(delta[:-1]) > 0] = np.repeat(np.arange(len(starts), dtype=np.int64), counts)
    return owner


class ParsedProperties:
    """RocketMQ property strings (``k\\x01v\\x02...``) parsed for a whole column at once.

    The string bytes stay in one Arrow buffer; separators are found with numpy, and keys and
    values become ``binary_view`` arrays pointing into that buffer.  A segment counts only with
    a non-empty key and a non-empty value (``string2messageProperties``); the record CRC
    (``__CRC32#``, the last 20 bytes when present) is not a property."""

    def __init__(self, props: pa.Array) -> None:
        props = props.cast(pa.binary())
        self.n = n = len(props)
        bufs = props.buffers()
        offs = np.frombuffer(bufs[1], dtype=np.int32)[props.offset : props.offset + n + 1].astype(np.int64)
        self._data_buf = bufs[2] if bufs[2] is not None else pa.py_buffer(b"")
        data = np.frombuffer(self._data_buf, dtype=np.uint8)
        starts, ends = offs[:-1], offs[1:].copy()
        # drop the trailing record CRC property
        crc_prefix = np.frombuffer(_CRC_PREFIX, dtype=np.uint8)
        cand = np.flatnonzero(ends - starts >= _CRC_BYTES)
        if len(cand):
            head = data[(ends[cand] - _CRC_BYTES)[:, None] + np.arange(len(crc_prefix))]
            ends[cand[(head == crc_prefix).all(axis=1)]] -= _CRC_BYTES
        # segment ends: every \x02 inside a record, plus the record end when it lacks one
        twos = np.flatnonzero(data == 2)
        rec_of = _owner(twos, starts, ends)
        keep = rec_of >= 0
        if not keep.all():
            twos, rec_of = twos[keep], rec_of[keep]
        nonempty = ends > starts
        last_byte = np.zeros(n, dtype=np.uint8)
        last_byte[nonempty] = data[ends[nonempty] - 1]
        open_end = np.flatnonzero(nonempty & (last_byte != 2))
        if len(open_end):  # records whose last segment has no trailing separator
            seg_end = np.concatenate([twos, ends[open_end]])
            seg_rec = np.concatenate([rec_of, open_end])
            order = np.argsort(seg_end, kind="stable")  # the buffer holds records in order
            seg_end, seg_rec = seg_end[order], seg_rec[order]
        else:
            seg_end, seg_rec = twos, rec_of
        seg_start = np.empty_like(seg_end)
        if len(seg_end):
            seg_start[0] = starts[seg_rec[0]]
            same = seg_rec[1:] == seg_rec[:-1]
            seg_start[1:] = np.where(same, seg_end[:-1] + 1, starts[seg_rec[1:]])
        ones = np.flatnonzero(data == 1)
        if len(ones) == len(seg_start) and (
            len(ones) == 0 or ((ones >= seg_start) & (ones < seg_end)).all()
        ):
            sep = ones  # the usual case: exactly one \x01 in each segment
        else:
            i = np.searchsorted(ones, seg_start)
            sep = np.where(i < len(ones), ones[np.minimum(i, max(len(ones) - 1, 0))] if len(ones) else 0, -1)
        ok = (sep > seg_start) & (sep < seg_end - 1)
        self.rec = seg_rec[ok]
        self.k_start, self.k_len = seg_start[ok], sep[ok] - seg_start[ok]
        self.v_start, self.v_len = sep[ok] + 1, seg_end[ok] - sep[ok] - 1
        self._data = data
        self._key_heads: np.ndarray | None = None

    def _heads(self) -> np.ndarray:
        """First 8 bytes of every key (zero-masked past its length) as one integer: a single
        gather for all keys, so each :meth:`lookup` compares integers instead of bytes."""
        if self._key_heads is None:
            data = self._data
            if len(self.k_start) and int(self.k_start.max()) > len(data) - 8:
                data = np.concatenate([data, np.zeros(8, dtype=np.uint8)])
            heads = _at(data, "<u8")[self.k_start]
            short = self.k_len < 8
            if short.any():
                bits = (np.minimum(self.k_len[short], 8) * 8).astype(np.uint64)
                heads[short] &= (np.uint64(1) << bits) - np.uint64(1)
            self._key_heads = heads
        return self._key_heads

    def _strings(self, start: np.ndarray, length: np.ndarray, validity: np.ndarray | None = None) -> pa.Array:
        m = len(start)
        views = _views(self._data, start, length, 0)
        vbuf = None
        if validity is not None and not validity.all():
            vbuf = pa.py_buffer(np.packbits(validity, bitorder="little").tobytes())
        arr = pa.Array.from_buffers(pa.binary_view(), m, [vbuf, pa.py_buffer(views.tobytes()), self._data_buf])
        return _binary_as_string(arr.cast(pa.binary()))

    def map_array(self) -> pa.MapArray:
        counts = np.bincount(self.rec, minlength=self.n)
        offsets = np.zeros(self.n + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        return pa.MapArray.from_arrays(
            pa.array(offsets), self._strings(self.k_start, self.k_len), self._strings(self.v_start, self.v_len)
        )

    def lookup(self, key: str) -> pa.Array:
        """The value of ``key`` in each record (the last one if repeated), null when absent."""
        kb = np.frombuffer(key.encode("utf-8"), dtype=np.uint8)
        head = int.from_bytes(kb[:8].tobytes(), "little")
        cand = np.flatnonzero((self._heads() == np.uint64(head)) & (self.k_len == len(kb)))
        if len(cand) and len(kb) > 8:  # the rest of a long key, on the candidates only
            rest = kb[8:]
            eq = (self._data[(self.k_start[cand] + 8)[:, None] + np.arange(len(rest))] == rest).all(axis=1)
            cand = cand[eq]
        if len(cand) == 0:  # common for TIMER_OUT_MS, __transactionId__: no views to build
            return pa.nulls(self.n, pa.string())
        start = np.zeros(self.n, dtype=np.int64)
        length = np.zeros(self.n, dtype=np.int64)
        present = np.zeros(self.n, dtype=bool)
        start[self.rec[cand]] = self.v_start[cand]  # later duplicates overwrite, as a HashMap put
        length[self.rec[cand]] = self.v_len[cand]
        present[self.rec[cand]] = True
        return self._strings(start, length, present)


def _binary_as_string(arr: pa.Array) -> pa.Array:
    """A ``binary`` array re-typed as ``string`` without the UTF-8 scan of a cast: the property
    bytes were encoded from ``str`` by the store, so they are UTF-8 by construction."""
    return pa.Array.from_buffers(pa.string(), len(arr), arr.buffers(), arr.null_count, arr.offset)


def _fixed_strings(block: np.ndarray, typ: pa.DataType = pa.string()) -> pa.Array:
    """Rows of an (n, w) uint8 matrix as an Arrow string/binary array: one copy, no per-row work."""
    n, w = block.shape
    data = np.ascontiguousarray(block)
    offsets = np.arange(0, (n + 1) * w, w, dtype=np.int32) if w else np.zeros(n + 1, dtype=np.int32)
    return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _tiled_offsets(n: int, lengths: list[int]) -> np.ndarray:
    """Offsets of ``n`` rows that each hold strings of ``lengths``, back to back."""
    per_row, k = int(sum(lengths)), len(lengths)
    cum = np.cumsum([0, *lengths[:-1]]).astype(np.int32)
    out = np.empty(n * k + 1, dtype=np.int32)
    np.add((np.arange(n, dtype=np.int32) * np.int32(per_row))[:, None], cum[None, :], out=out[:-1].reshape(n, k))
    out[-1] = n * per_row
    return out


class UniformProperties:
    """Properties of records that all share one layout, as a batch put writes them: the same
    length, the same separators and keys at the same bytes, only value bytes differ (and hold no
    separator).  Each value is then a column slice of the (n, L) byte matrix: no parsing per
    record.  Same results as :class:`ParsedProperties` (empty keys or values skipped, the record
    CRC dropped, the last of repeated keys wins in :meth:`lookup`)."""

    def __init__(self, mat: np.ndarray, segments: list[tuple[str, bytes, int, int]]) -> None:
        self.n = len(mat)
        self._mat = mat
        self._segments = segments  # (key, key bytes, value start, value end) in string order

    @classmethod
    def of(cls, mat: np.ndarray) -> "UniformProperties | None":
        """The layout of row 0, if every row follows it (else None: parse them one by one)."""
        n, width = mat.shape
        if n == 0 or width == 0:
            return None
        row = mat[0]
        raw = row.tobytes()
        end = width
        const = (row == 1) | (row == 2)  # bytes every row must repeat: separators, keys, CRC key
        if width >= _CRC_BYTES and raw[width - _CRC_BYTES : width - _CRC_BYTES + len(_CRC_PREFIX)] == _CRC_PREFIX:
            end = width - _CRC_BYTES
            const[end : end + len(_CRC_PREFIX)] = True
        segments = []
        s = 0
        while s < end:
            e = raw.find(b"\x02", s, end)
            e = end if e < 0 else e
            sep = raw.find(b"\x01", s, e)
            if s < sep < e - 1:
                const[s:sep] = True
                segments.append((raw[s:sep].decode("utf-8", "surrogateescape"), raw[s:sep], sep + 1, e))
            s = e + 1
        # every row equals row 0 on the constant bytes (whole-matrix passes: contiguous, SIMD) ...
        diff = np.bitwise_xor(mat, row)
        diff &= np.where(const, np.uint8(0xFF), np.uint8(0))
        if diff.any():
            return None
        del diff
        # ... so they hold row 0's separators there, and no other \x01/\x02 may exist: when row 0
        # has no byte <= 2 outside them, one count of such bytes over all rows tells
        low = int(np.count_nonzero(row <= 2))
        if low == int(np.count_nonzero(const & (row <= 2))):
            return cls(mat, segments) if np.count_nonzero(mat <= 2) == n * low else None
        seps = int(np.count_nonzero(row == 1)), int(np.count_nonzero(row == 2))
        if np.count_nonzero(mat == 1) != n * seps[0] or np.count_nonzero(mat == 2) != n * seps[1]:
            return None
        return cls(mat, segments)

    def _values(self, i: int) -> np.ndarray:
        _, _, vs, ve = self._segments[i]
        return self._mat[:, vs:ve]

    def lookup(self, key: str) -> pa.Array:
        for i in range(len(self._segments) - 1, -1, -1):
            if self._segments[i][0] == key:
                return _fixed_strings(self._values(i))
        return pa.nulls(self.n, pa.string())

    def map_array(self) -> pa.MapArray:
        n, segs = self.n, self._segments
        k = len(segs)
        offsets = pa.array(np.arange(0, n * k + 1, k, dtype=np.int32) if k else np.zeros(n + 1, dtype=np.int32))
        if k == 0:
            empty = pa.array([], pa.string())
            return pa.MapArray.from_arrays(offsets, empty, empty)
        key_bytes = b"".join(kb for _, kb, _, _ in segs)
        keys = pa.Array.from_buffers(
            pa.string(), n * k,
            [None, pa.py_buffer(_tiled_offsets(n, [len(kb) for _, kb, _, _ in segs])),
             pa.py_buffer(np.tile(np.frombuffer(key_bytes, np.uint8), n))],
        )
        vals = np.concatenate([self._values(i) for i in range(k)], axis=1) if k > 1 else np.ascontiguousarray(self._values(0))
        items = pa.Array.from_buffers(
            pa.string(), n * k,
            [None, pa.py_buffer(_tiled_offsets(n, [ve - vs for _, _, vs, ve in segs])), pa.py_buffer(vals)],
        )
        return pa.MapArray.from_arrays(offsets, keys, items)


def parse_properties(props: pa.Array) -> pa.MapArray:
    """RocketMQ property strings to ``map<string,string>`` (see :class:`ParsedProperties`)."""
    return ParsedProperties(props).map_array()


@dataclass
class _Part:
    """The records of one range that lie in one mapped CommitLog file."""

    buf: np.ndarray  # the file's bytes
    mm: Any  # the mapping itself, for Arrow buffers
    head: _Headers
    props_start: np.ndarray
    props_len: np.ndarray


class _Columns:
    """Fixed fields and byte ranges of the records at sorted CommitLog offsets ``phys``, gathered
    file by file, concatenated on demand."""

    def __init__(self, commitlog: MappedFileQueue, phys: np.ndarray, topic_bytes: int) -> None:
        topic_field = 2 if topic_bytes > 127 else 1
        seg_idx = (phys - commitlog.min_offset) // commitlog.segment_bytes
        cuts = np.flatnonzero(seg_idx[1:] != seg_idx[:-1]) + 1
        self.parts: list[_Part] = []
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(phys)]):
            mf = commitlog.files[int(seg_idx[a])]
            buf = np.frombuffer(mf.mm, dtype=np.uint8)
            pos = phys[a:b] - mf.from_offset
            h = _Headers(buf, pos)
            props_len_pos = h.body_start + h.body_len + topic_field + topic_bytes
            props_len = _gather(buf, props_len_pos, 2, ">u2").astype(np.int64)
            self.parts.append(_Part(buf, mf.mm, h, props_len_pos + 2, props_len))

    def cat(self, get: Callable[[_Part], np.ndarray]) -> np.ndarray:
        arrays = [get(p) for p in self.parts]
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    def field(self, name: str) -> np.ndarray:
        return self.cat(lambda p: p.head.field(name))

    def bytes_column(self, starts: Callable[[_Part], np.ndarray], lengths: Callable[[_Part], np.ndarray]) -> pa.Array:
        """Byte ranges as a ``binary`` array: a fixed-width numpy gather when all have one length,
        else binary_view structs over the mapped files and one C++ cast (the gather)."""
        n = sum(len(starts(p)) for p in self.parts)
        lens = [lengths(p) for p in self.parts]
        lo = min(int(x.min()) for x in lens)
        hi = max(int(x.max()) for x in lens)
        if lo == hi and 0 < hi and n * hi < 2**31:
            return _fixed_strings(self.fixed_block(starts, hi), pa.binary())
        views = [_views(p.buf, starts(p), ln, i) for i, (p, ln) in enumerate(zip(self.parts, lens))]
        v = views[0] if len(views) == 1 else np.concatenate(views)
        buffers = [pa.py_buffer(p.mm) for p in self.parts]
        arr = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(v), *buffers])
        return arr.cast(pa.binary())

    def fixed_block(self, starts: Callable[[_Part], np.ndarray], width: int) -> np.ndarray:
        """``width`` bytes at every start, as an (n, width) uint8 matrix."""
        block = self.cat(lambda p: _at(p.buf, f"V{width}")[starts(p)])
        return block.view(np.uint8).reshape(len(block), width)

    def properties(self) -> UniformProperties | ParsedProperties:
        lens = [p.props_len for p in self.parts]
        width = int(lens[0][0])
        n = sum(len(x) for x in lens)
        if 0 < width and n * width < 2**31 and all(int(x.min()) == width == int(x.max()) for x in lens):
            mat = self.fixed_block(lambda p: p.props_start, width)
            uniform = UniformProperties.of(mat)
            if uniform is not None:
                return uniform
            return ParsedProperties(_fixed_strings(mat, pa.binary()))
        return ParsedProperties(self.bytes_column(lambda p: p.props_start, lambda p: p.props_len))


def _timestamps(ms: np.ndarray) -> pa.Array:
    us = ms.astype(np.int64) * 1000
    return pa.Array.from_buffers(TS, len(us), [None, pa.py_buffer(us)])


def _repeated_string(value: str, n: int) -> pa.Array:
    b = np.frombuffer(value.encode("utf-8"), dtype=np.uint8)
    return _fixed_strings(np.broadcast_to(b, (n, len(b))))


def read_units_arrow(
    commitlog: MappedFileQueue,
    units: np.ndarray,
    topic: str,
    queue_id: int,
    first_queue_offset: int,
    tag_filter: object | None = None,
    sql_filter: object | None = None,
    store_host: bytes | None = None,
    store_port: int = 0,
    columns: Sequence[str] | None = None,
) -> pa.RecordBatch:
    """Records named by ConsumeQueue ``units`` (queue offsets ``first_queue_offset, ...``).

    ``columns`` (default: all of MESSAGE_SCHEMA, in its order) limits the work to what is asked:
    the properties are not parsed at all unless a column derived from them is wanted."""
    n_all = len(units)
    if n_all == 0:
        return empty_batch(columns)
    phys = units["offset"].astype(np.int64)
    qoffs = np.arange(first_queue_offset, first_queue_offset + n_all, dtype=np.int64)
    tag_check = tag_filter is not None and not getattr(tag_filter, "match_all", False)
    if tag_check:
        keep = np.asarray(tag_filter.mask_codes(units["tags_code"].astype(np.int64)), dtype=bool)  # type: ignore[union-attr]
        phys, qoffs = phys[keep], qoffs[keep]
    n = len(phys)
    if n == 0:
        return empty_batch(columns)
    order = None
    if n > 1 and bool((phys[1:] < phys[:-1]).any()):  # a queue's records are in log order; be safe
        order = np.argsort(phys, kind="stable")
        phys, qoffs = phys[order], qoffs[order]
    want = set(MESSAGE_SCHEMA.names if columns is None else columns)
    need = set(want)
    if tag_check:
        need.add("tags")
    if sql_filter is not None:
        need.add("properties")
    values: dict[str, pa.Array] = {}
    if need & {"topic", "queueId", "queueOffset", "commitLogOffset"}:
        values["topic"] = _repeated_string(topic, n)
        values["queueId"] = pa.array(np.full(n, queue_id, dtype=np.int32))
        values["queueOffset"] = pa.array(qoffs)
        values["commitLogOffset"] = pa.array(phys)
    cols = _Columns(commitlog, phys, len(topic.encode("utf-8")))
    if "body" in need:
        values["body"] = cols.bytes_column(lambda p: p.head.body_start, lambda p: p.head.body_len)
    if "bornTimestamp" in need:
        values["bornTimestamp"] = _timestamps(cols.field("born_ts"))
    if "storeTimestamp" in need:
        values["storeTimestamp"] = _timestamps(cols.field("store_ts"))
    if "reconsumeTimes" in need:
        values["reconsumeTimes"] = pa.array(cols.field("reconsume"))
    if need & {"msgId", "tags", "keys", "properties", "deliverTimestamp", "transactionId"}:
        parsed = cols.properties()
        if "properties" in need:
            values["properties"] = parsed.map_array()
        if "tags" in need:
            values["tags"] = parsed.lookup(L.P_TAGS)
        if "keys" in need:
            values["keys"] = parsed.lookup(L.P_KEYS)
        if "msgId" in need:
            uniq = parsed.lookup(L.P_UNIQ_KEY)
            if uniq.null_count:  # no client id: the offset msgId, as RocketMQ shows it
                ids = offset_msg_ids(store_host or b"\x7f\x00\x00\x01", store_port, phys)
                uniq = pc.coalesce(uniq, _fixed_strings(ids.view(np.uint8).reshape(n, ids.itemsize)))
            values["msgId"] = uniq
        if "deliverTimestamp" in need:
            deliver = parsed.lookup(L.P_TIMER_OUT_MS)
            if deliver.null_count == n:
                values["deliverTimestamp"] = pa.nulls(n, TS)
            else:
                deliver_ms = pc.cast(deliver, pa.int64(), safe=False)
                values["deliverTimestamp"] = pc.multiply(deliver_ms, 1000).cast(TS)
        if "transactionId" in need:
            txn = parsed.lookup(L.P_TRANSACTION_ID)
            if txn.null_count < n:
                sys_flag = cols.cat(lambda p: p.head.sys_flag)
                is_commit = (sys_flag & L.TRANSACTION_MASK) == L.TRANSACTION_COMMIT_TYPE
                txn = pc.if_else(pa.array(is_commit), txn, pa.scalar(None, pa.string()))
            values["transactionId"] = txn
    del cols
    fields = [f for f in MESSAGE_SCHEMA if f.name in need]
    batch = pa.RecordBatch.from_arrays([values[f.name] for f in fields], schema=pa.schema(fields))
    if order is not None:
        inv = np.empty_like(order)
        inv[order] = np.arange(n)
        batch = batch.take(pa.array(inv))
    if tag_check:
        batch = batch.filter(tag_filter.mask(batch.column("tags")))  # type: ignore[union-attr]
    if sql_filter is not None:
        batch = batch.filter(sql_filter.mask(batch.column("properties")))  # type: ignore[attr-defined]
    if need != want:
        batch = batch.select([f.name for f in MESSAGE_SCHEMA if f.name in want])
    return batch


def read_queue_arrow(
    commitlog: MappedFileQueue,
    cq: ConsumeQueue,
    topic: str,
    queue_id: int,
    start: int,
    end: int,
    tag_filter: object | None = None,
    sql_filter: object | None = None,
    store_host: bytes | None = None,
    store_port: int = 0,
    columns: Sequence[str] | None = None,
) -> pa.RecordBatch:
    """Messages ``[start, end)`` of one queue (clamped to what the queue holds)."""
    first = max(start, cq.min_offset)
    units = cq.units(first, end)
    return read_units_arrow(
        commitlog, units, topic, queue_id, first, tag_filter, sql_filter, store_host, store_port, columns
    )


class StoreReader:
    """Read-only view of a store directory, safe beside a writer in another process."""

    def __init__(self, root: str, cq_segment_units: int = L.CQ_SEGMENT_UNITS, commitlog_segment_bytes: int | None = None) -> None:
        self.root = os.path.abspath(root)
        cl_dir = os.path.join(self.root, L.COMMITLOG_DIR)
        if commitlog_segment_bytes is None:
            commitlog_segment_bytes = _detect_segment_bytes(cl_dir) or L.COMMITLOG_SEGMENT_BYTES
        self.commitlog = MappedFileQueue(cl_dir, commitlog_segment_bytes, writable=False)
        self.commitlog.refresh()
        self.cq_segment_units = cq_segment_units
        self._cqs: dict[tuple[str, int], ConsumeQueue] = {}

    def _cq(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            d = os.path.join(self.root, L.CONSUMEQUEUE_DIR, topic, str(queue_id))
            if not os.path.isdir(d):
                return None
            units = _detect_segment_bytes(d)
            cq = ConsumeQueue(self.root, topic, queue_id, (units or self.cq_segment_units * 20) // 20, writable=False)
            self._cqs[(topic, queue_id)] = cq
        cq.refresh()
        return cq

    def topics(self) -> list[str]:
        base = os.path.join(self.root, L.CONSUMEQUEUE_DIR)
        return sorted(os.listdir(base)) if os.path.isdir(base) else []

    def queue_ids(self, topic: str) -> list[int]:
        d = os.path.join(self.root, L.CONSUMEQUEUE_DIR, topic)
        return sorted(int(q) for q in os.listdir(d) if q.isdigit()) if os.path.isdir(d) else []

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self._cq(topic, queue_id)
        return cq.min_offset if cq else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self._cq(topic, queue_id)
        return cq.max_offset if cq else 0

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        cq = self._cq(topic, queue_id)
        if cq is None:
            return 0
        self.commitlog.refresh()

        def store_time(offset: int) -> int:
            mf = self.commitlog.find(offset)
            return -1 if mf is None else R.store_timestamp_at(mf.mm, offset - mf.from_offset)

        return cq.offset_by_time(timestamp_ms, store_time)

    def read_arrow(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        tag_filter: object | None = None,
        sql_filter: object | None = None,
        columns: Sequence[str] | None = None,
    ) -> pa.RecordBatch:
        cq = self._cq(topic, queue_id)
        if cq is None:
            if end > start:
                raise StoreError(f"queue {topic}/{queue_id} does not exist in {self.root}")
            return empty_batch(columns)
        if end > cq.max_offset:
            raise StoreError(
                f"queue {topic}/{queue_id} holds offsets up to {cq.max_offset}, asked for {end}"
            )
        self.commitlog.refresh()
        return read_queue_arrow(
            self.commitlog, cq, topic, queue_id, start, end, tag_filter, sql_filter, columns=columns
        )

    def read_chunks(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        tag_filter: object | None = None,
        sql_filter: object | None = None,
        max_rows: int = 65_536,
        max_bytes: int = 32 << 20,
    ) -> Iterator[pa.RecordBatch]:
        """:meth:`read_arrow` of ``[start, end)`` as consecutive batches of at most ``max_rows``
        records and about ``max_bytes`` of stored records each (see :func:`chunk_bounds`), so big
        messages never overflow a batch's 2 GiB of ``binary`` offsets.  The
        ConsumeQueue range is read once; batches left empty by a filter are skipped."""
        cq = self._cq(topic, queue_id)
        if cq is None or end <= start:
            if end > start:
                raise StoreError(f"queue {topic}/{queue_id} does not exist in {self.root}")
            return
        if end > cq.max_offset:
            raise StoreError(f"queue {topic}/{queue_id} holds offsets up to {cq.max_offset}, asked for {end}")
        self.commitlog.refresh()
        first = max(start, cq.min_offset)
        units = cq.units(first, end)
        for a, b in chunk_bounds(units["size"], max_rows, max_bytes):
            batch = read_units_arrow(self.commitlog, units[a:b], topic, queue_id, first + a, tag_filter, sql_filter)
            if batch.num_rows:
                yield batch

    def close(self) -> None:
        self.commitlog.close()
        for cq in self._cqs.values():
            cq.close()


def chunk_bounds(sizes: np.ndarray, max_rows: int, max_bytes: int) -> list[tuple[int, int]]:
    """``[a, b)`` row ranges over records of ``sizes``: each at most ``max_rows`` rows, and a new
    range starts wherever the running byte count crosses a multiple of ``max_bytes`` (so a range
    holds at most ``max_bytes`` plus its last record)."""
    n = len(sizes)
    if n == 0:
        return []
    before = np.cumsum(sizes, dtype=np.int64) - sizes.astype(np.int64)  # bytes ahead of each record
    cuts = np.flatnonzero(np.diff(before // max(max_bytes, 1))) + 1
    out = []
    for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), n]):
        out.extend((s, min(b, s + max_rows)) for s in range(a, b, max_rows))
    return out


def _detect_segment_bytes(directory: str) -> int | None:
    if not os.path.isdir(directory):
        return None
    for name in sorted(os.listdir(directory)):
        if name.isdigit() and len(name) == 20:
            return os.path.getsize(os.path.join(directory, name))
    return None


__all__: Sequence[str] = ["MESSAGE_SCHEMA", "StoreReader", "read_queue_arrow", "read_units_arrow", "chunk_bounds", "empty_batch", "parse_properties", "CQ_UNIT"]
