"""Message properties, RocketMQ's ``key \\x01 value \\x02 ...`` strings: the one encoder and parser
of one record's properties (``MessageDecoder.messageProperties2String`` /
``string2messageProperties``), and the column-wise parsers of many records' properties into Arrow
(:class:`ParsedProperties`, :class:`UniformProperties`) that follow the same rule: a segment counts
only with a non-empty key before its first \\x01 and a non-empty value after it, and the record CRC
(``__CRC32#``) is no property."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from rmq_spark.store import layout as L
from rmq_spark.store.views import (
    _at,
    _binary_as_string,
    _fixed_strings,
    _owner,
    _tiled_offsets,
    _views,
)

CRC_KEY = "__CRC32#"
# optional whole-record CRC (RocketMQ's enabledAppendPropCRC): the last 20 bytes of the properties
# are "__CRC32#" \x01 <10 ASCII digits, least significant first> \x02, the CRC32 (sign bit
# cleared) of every record byte before them.
PROP_CRC_PREFIX = b"__CRC32#\x01"
PROP_CRC_BYTES = 20
PROP_CRC_PLACEHOLDER = PROP_CRC_PREFIX + b"0" * 10 + b"\x02"
_CRC_PREFIX, _CRC_BYTES = PROP_CRC_PREFIX, PROP_CRC_BYTES


def encode_properties(props: Mapping[str, str | None]) -> bytes:
    """``key \\x01 value \\x02`` for each entry with a value, UTF-8, trailing separator kept; entries
    whose value is None and transient keys are left out."""
    if not props:
        return b""
    try:  # the common case, twice as fast: every value a string and no transient key
        # a None value raises TypeError here: the general path below
        text = "\x02".join(map("\x01".join, props.items())) + "\x02"  # type: ignore[arg-type]
        if L.TRANSIENT_PREFIX not in text:
            return text.encode("utf-8")
    except TypeError:  # a value that is not a string: None is dropped, others str()-ed
        pass
    parts = []
    for k, v in props.items():
        if v is None or k.startswith(L.TRANSIENT_PREFIX):
            continue
        parts.append(f"{k}\x01{v}\x02")
    return "".join(parts).encode("utf-8")


def decode_properties(data: bytes | str) -> dict[str, str]:
    """RocketMQ's ``string2messageProperties``: segments split on \\x02; a segment needs a
    non-empty key and a non-empty value around its first \\x01, otherwise it is dropped."""
    text = (
        data.decode("utf-8", errors="replace")
        if isinstance(data, (bytes, bytearray, memoryview))
        else data
    )
    out: dict[str, str] = {}
    if not text:
        return out
    for seg in text.split(L.PROPERTY_SEPARATOR):
        k, _, v = seg.partition(L.NAME_VALUE_SEPARATOR)
        if k and v:
            out[k] = v
    out.pop(CRC_KEY, None)  # the record CRC is part of the record, not a user property
    return out


def find_properties(data: bytes, *keys: str) -> list[str | None]:
    """The values of a few ``keys`` in encoded properties (None where absent), by the rule of
    :func:`decode_properties` without building the whole dict (the last of repeated keys wins)."""
    prefixes = [k + L.NAME_VALUE_SEPARATOR for k in keys]
    out: list[str | None] = [None] * len(keys)
    for seg in data.decode("utf-8", "replace").split(L.PROPERTY_SEPARATOR):
        for i, prefix in enumerate(prefixes):
            if seg.startswith(prefix) and len(seg) > len(prefix):
                out[i] = seg[len(prefix) :]
    return out


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
        offs = np.frombuffer(bufs[1], dtype=np.int32)[props.offset : props.offset + n + 1].astype(
            np.int64
        )
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
            sep = np.where(
                i < len(ones), ones[np.minimum(i, max(len(ones) - 1, 0))] if len(ones) else 0, -1
            )
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

    def _strings(
        self, start: np.ndarray, length: np.ndarray, validity: np.ndarray | None = None
    ) -> pa.Array:
        m = len(start)
        views = _views(self._data, start, length, 0)
        vbuf = None
        if validity is not None and not validity.all():
            vbuf = pa.py_buffer(np.packbits(validity, bitorder="little").tobytes())
        arr = pa.Array.from_buffers(
            pa.binary_view(), m, [vbuf, pa.py_buffer(views.tobytes()), self._data_buf]
        )
        return _binary_as_string(arr.cast(pa.binary()))

    def map_array(self) -> pa.MapArray:
        counts = np.bincount(self.rec, minlength=self.n)
        offsets = np.zeros(self.n + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        return pa.MapArray.from_arrays(
            pa.array(offsets),
            self._strings(self.k_start, self.k_len),
            self._strings(self.v_start, self.v_len),
        )

    def lookup(self, key: str) -> pa.Array:
        """The value of ``key`` in each record (the last one if repeated), null when absent."""
        kb = np.frombuffer(key.encode("utf-8"), dtype=np.uint8)
        head = int.from_bytes(kb[:8].tobytes(), "little")
        cand = np.flatnonzero((self._heads() == np.uint64(head)) & (self.k_len == len(kb)))
        if len(cand) and len(kb) > 8:  # the rest of a long key, on the candidates only
            rest = kb[8:]
            eq = (self._data[(self.k_start[cand] + 8)[:, None] + np.arange(len(rest))] == rest).all(
                axis=1
            )
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
    def of(cls, mat: np.ndarray) -> UniformProperties | None:
        """The layout of row 0, if every row follows it (else None: parse them one by one)."""
        n, width = mat.shape
        if n == 0 or width == 0:
            return None
        row = mat[0]
        raw = row.tobytes()
        end = width
        const = (row == 1) | (row == 2)  # bytes every row must repeat: separators, keys, CRC key
        if (
            width >= _CRC_BYTES
            and raw[width - _CRC_BYTES : width - _CRC_BYTES + len(_CRC_PREFIX)] == _CRC_PREFIX
        ):
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
                segments.append(
                    (raw[s:sep].decode("utf-8", "surrogateescape"), raw[s:sep], sep + 1, e)
                )
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
        offsets = pa.array(
            np.arange(0, n * k + 1, k, dtype=np.int32) if k else np.zeros(n + 1, dtype=np.int32)
        )
        if k == 0:
            empty = pa.array([], pa.string())
            return pa.MapArray.from_arrays(offsets, empty, empty)
        key_bytes = b"".join(kb for _, kb, _, _ in segs)
        keys = pa.Array.from_buffers(
            pa.string(),
            n * k,
            [
                None,
                pa.py_buffer(_tiled_offsets(n, [len(kb) for _, kb, _, _ in segs])),
                pa.py_buffer(np.tile(np.frombuffer(key_bytes, np.uint8), n)),
            ],
        )
        vals = (
            np.concatenate([self._values(i) for i in range(k)], axis=1)
            if k > 1
            else np.ascontiguousarray(self._values(0))
        )
        items = pa.Array.from_buffers(
            pa.string(),
            n * k,
            [
                None,
                pa.py_buffer(_tiled_offsets(n, [ve - vs for _, _, vs, ve in segs])),
                pa.py_buffer(vals),
            ],
        )
        return pa.MapArray.from_arrays(offsets, keys, items)


def parse_properties(props: pa.Array) -> pa.MapArray:
    """RocketMQ property strings to ``map<string,string>`` (see :class:`ParsedProperties`)."""
    return ParsedProperties(props).map_array()


# MessageConst.PROPERTY_DELAY_TIME_LEVEL as stored on a delivered copy: read as part of the record
# format here (what the delay service does with it is not the store's concern)
_DELAY_LEVEL_KEY = "DELAY"


def deliver_times_ms(
    parsed: ParsedProperties | UniformProperties, store_ts_ms: np.ndarray
) -> pa.Array:
    """The ``deliverTimestamp`` column's milliseconds (int64, null where a message was not
    delayed): a timer message's ``TIMER_OUT_MS`` (its record and its delivered copy, as Apache
    stores them); for a delivered delay-level copy (``DELAY`` set, no ``TIMER_OUT_MS``: Apache
    keeps the level on the copy) its store time, which is when it was delivered.  ``DELAY=0`` (a
    dead-letter copy) is no delay."""
    import pyarrow.compute as pc

    n = len(store_ts_ms)
    timer = parsed.lookup(L.P_TIMER_OUT_MS)
    delay = parsed.lookup(_DELAY_LEVEL_KEY)
    if timer.null_count == n and delay.null_count == n:
        return pa.nulls(n, pa.int64())
    ms = pc.cast(timer, pa.int64(), safe=False)
    if delay.null_count < n:
        delayed = pc.and_kleene(pc.is_valid(delay), pc.not_equal(delay, "0"))
        use_store = pc.and_kleene(pc.is_null(ms), delayed)
        ms = pc.if_else(use_store, pa.array(np.asarray(store_ts_ms, dtype=np.int64)), ms)
    return ms
