"""Java's ``String.hashCode()`` (over UTF-16 code units, wrapping at 32 bits), the hash RocketMQ
keys its ConsumeQueue tagsCode and its IndexFile slots with: one string at a time in plain Python
(:func:`java_string_hash`), or many in one numpy pass (:func:`java_string_hashes`)."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["java_string_hash", "java_string_hashes", "java_string_hashes_of_rows"]


def java_string_hash(s: str) -> int:
    """Java ``String.hashCode()`` of one string, as a signed 32-bit int (plain Python: cheaper than
    numpy for a single string)."""
    h = 0
    if s.isascii():  # its bytes are its UTF-16 code units
        units: Sequence[int] = s.encode()
    else:
        units = struct.unpack(f"<{len(b := s.encode('utf-16-le', 'surrogatepass')) // 2}H", b)
    for unit in units:
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


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
    return _hashes_of_units(units, lens)


def java_string_hashes_arrow(strings: pa.Array) -> np.ndarray:
    """:func:`java_string_hashes` of an Arrow string column (no nulls), read from its buffers when
    every character is ASCII (a UTF-16 code unit per byte), else through Python strings."""
    n = len(strings)
    if n == 0:
        return np.empty(0, dtype=np.int32)
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int32)[
        strings.offset : strings.offset + n + 1
    ]
    data = strings.buffers()[2]
    units = (
        np.frombuffer(data, dtype=np.uint8)[int(offsets[0]) : int(offsets[-1])]
        if data is not None
        else np.empty(0, np.uint8)
    )
    if len(units) and int(units.max()) >= 0x80:
        return java_string_hashes(strings.to_pylist())
    return _hashes_of_units(units, np.diff(offsets).astype(np.int64))


def _hashes_of_units(units: np.ndarray, lens: np.ndarray) -> np.ndarray:
    n = len(lens)
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


def java_string_hashes_of_rows(prefix: str, rows: np.ndarray) -> np.ndarray:
    """:func:`java_string_hashes` of ``prefix`` followed by each row of ``rows``, an (n, w) array
    of ASCII bytes (a batch's unique ids behind ``topic#``): one matrix product, no string made."""
    n, w = rows.shape
    pow31 = _pow31(w + 1)
    out = (
        rows.astype(np.uint32) @ pow31[w - 1 :: -1].astype(np.uint32)
        if w
        else np.zeros(n, dtype=np.uint32)
    )
    head = (java_string_hash(prefix) & 0xFFFFFFFF) * int(pow31[w]) & 0xFFFFFFFF
    out += np.uint32(head)
    return out.view(np.int32)
