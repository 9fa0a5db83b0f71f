"""Properties of many records that differ from record to record, encoded column by column.

A batch of rows (a sink's, a bulk writer's) may carry its own tags, keys, message group and user
properties. Encoding them record by record (a dict, then ``k\\x01v\\x02`` bytes, per row) costs
microseconds of Python each; here every property becomes an Arrow string column,
``NAME\\x01value\\x02`` is joined onto each value in one C++ pass (nothing where the value is null
or empty), and a row's properties are the join of those columns. User properties (an Arrow
``map<string, string>``) are joined per entry, then per row through the map's own offsets. The
bytes are those :func:`encode_properties` makes of the same properties (in the order given), so a
record decodes the same either way.

What the store needs besides the bytes comes along: each record's tagsCode (the Java hash of its
TAGS, vectorised), its KEYS (the index), and its properties as dicts when a service asks for one
(decoded on demand: nobody does for a user topic).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq_spark.store import layout as L
from rmq_spark.store.hashing import java_string_hashes
from rmq_spark.store.properties import decode_properties

__all__ = ["RowProperties", "decoded", "id_column", "row_properties"]

_EMPTY = pa.scalar(b"", pa.binary())


class RowProperties:
    """``blobs``: each record's encoded properties (binary, no UNIQ_KEY); ``tags_codes``, ``keys``:
    what the store takes from them."""

    __slots__ = ("blobs", "keys", "tags_codes")

    def __init__(self, blobs: pa.Array, tags_codes: np.ndarray, keys: list[str | None]) -> None:
        self.blobs = blobs
        self.tags_codes = tags_codes
        self.keys = keys

    def __len__(self) -> int:
        return len(self.blobs)

    def take(self, idx: np.ndarray) -> RowProperties:
        """The rows at ``idx``."""
        at = idx.tolist()
        return RowProperties(
            self.blobs.take(pa.array(idx)), self.tags_codes[idx], [self.keys[i] for i in at]
        )

    def joined(self, *parts: bytes | pa.Array) -> pa.Array:
        """Each row's properties followed by ``parts`` (bytes shared by all rows, or a binary
        array of one value per row), as one binary array."""
        cols = [self.blobs] + [
            pa.scalar(p, pa.binary()) if isinstance(p, bytes) else p for p in parts
        ]
        return pc.binary_join_element_wise(*cols, _EMPTY)

    def max_bytes(self) -> int:
        return int(pc.max(pc.binary_length(self.blobs)).as_py() or 0) if len(self.blobs) else 0


def decoded(blobs: pa.Array) -> Sequence[dict[str, str]]:
    """Encoded properties as dicts, each decoded when asked for."""
    return _Decoded(blobs)


def id_column(ids: np.ndarray) -> pa.Array:
    """An (n, 32) array of ASCII hex ids as an Arrow binary column."""
    n = len(ids)
    return pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(32), n, [None, pa.py_buffer(np.ascontiguousarray(ids))]
    ).cast(pa.binary())


class _Decoded(Sequence):  # type: ignore[type-arg]
    def __init__(self, blobs: pa.Array) -> None:
        self._blobs = blobs

    def __len__(self) -> int:
        return len(self._blobs)

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return decode_properties(self._blobs[i].as_py())


def _named(name: str, values: pa.Array) -> pa.Array:
    """``name\\x01value\\x02`` where ``values`` has a non-empty value, else empty bytes."""
    values = values.cast(pa.binary())
    joined = pc.binary_join_element_wise(
        pa.scalar(name.encode() + b"\x01", pa.binary()), values, pa.scalar(b"\x02", pa.binary()), _EMPTY,
        null_handling="emit_null",
    )  # fmt: skip
    present = pc.fill_null(pc.greater(pc.binary_length(values), 0), False)
    return pc.if_else(present, joined, _EMPTY)


def _map_entries(props: pa.Array) -> pa.Array:
    """Each row's ``k\\x01v\\x02`` entries of a ``map<string, string>`` column (entries whose value
    is null left out), joined per row."""
    if isinstance(props, pa.ChunkedArray):
        props = props.combine_chunks()
    n = len(props)
    if props.null_count == n or len(props.keys) == 0:
        return pa.array([b""] * n, pa.binary())
    entry_type = pa.struct(
        [pa.field("key", props.type.key_type, nullable=False), ("value", props.type.item_type)]
    )
    as_list = props.cast(pa.list_(entry_type))
    entries = as_list.flatten()  # the slice's entries, none of a null map
    keys, values = entries.field(0).cast(pa.binary()), entries.field(1).cast(pa.binary())
    entry = pc.binary_join_element_wise(keys, pa.scalar(b"\x01", pa.binary()), values, pa.scalar(b"\x02", pa.binary()),
                                        _EMPTY, null_handling="emit_null")  # fmt: skip
    entry = pc.fill_null(entry, _EMPTY)
    lengths = pc.fill_null(pc.list_value_length(as_list), 0).to_numpy(zero_copy_only=False)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    lists = pa.ListArray.from_arrays(offsets, entry)
    joined = pc.binary_join(lists, _EMPTY)
    return pc.if_else(pc.is_valid(props), joined, _EMPTY)


def row_properties(
    n: int,
    *,
    properties: pa.Array | None = None,
    named: Mapping[str, pa.Array | None] | None = None,
    shared: Mapping[str, str] | None = None,
) -> RowProperties:
    """The properties of ``n`` rows: the user ``properties`` (``map<string, string>``) first, then
    the ``named`` ones (a string column each: TAGS, KEYS, ...; null or empty: absent), then the
    ``shared`` ones (the same for every row)."""
    cols: list[pa.Array] = []
    if properties is not None and properties.null_count < n:
        cols.append(_map_entries(properties))
    named = {k: v for k, v in (named or {}).items() if v is not None and v.null_count < n}
    for name, values in named.items():
        cols.append(
            _named(name, values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values)
        )
    tail = b"".join(f"{k}\x01{v}\x02".encode() for k, v in (shared or {}).items())
    if tail:
        cols.append(pa.scalar(tail, pa.binary()))
    if not cols:
        blobs = pa.array([b""] * n, pa.binary())
    elif len(cols) == 1 and isinstance(cols[0], pa.Array):
        blobs = cols[0]
    else:
        blobs = pc.binary_join_element_wise(*cols, _EMPTY)
        if not isinstance(blobs, pa.Array):  # shared properties only
            blobs = pa.array([blobs.as_py()] * n, pa.binary())
    tags = named.get(L.P_TAGS)
    if tags is None:
        codes = np.zeros(n, dtype=np.int64)
    else:
        values = tags.to_pylist()
        codes = java_string_hashes([v or "" for v in values]).astype(np.int64)
    keys_col = named.get(L.P_KEYS)
    keys = keys_col.to_pylist() if keys_col is not None else [None] * n
    keys = [k or None for k in keys]
    return RowProperties(blobs, codes, keys)
