"""numpy gathers of fields at many byte positions of a mapped file, and Arrow ``binary_view``
arrays pointing into it: the building blocks of the bulk reader and the column-wise property
parser, with no Python work per record."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def _at(buf: np.ndarray, dtype: str | np.dtype) -> np.ndarray:
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


def _binary_as_string(arr: pa.Array) -> pa.Array:
    """A ``binary`` array re-typed as ``string`` without the UTF-8 scan of a cast: the property
    bytes were encoded from ``str`` by the store, so they are UTF-8 by construction."""
    return pa.Array.from_buffers(pa.string(), len(arr), arr.buffers(), arr.null_count, arr.offset)


_STRING = pa.string()


def _fixed_strings(block: np.ndarray, typ: pa.DataType = _STRING) -> pa.Array:
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
    np.add(
        (np.arange(n, dtype=np.int32) * np.int32(per_row))[:, None],
        cum[None, :],
        out=out[:-1].reshape(n, k),
    )
    out[-1] = n * per_row
    return out
