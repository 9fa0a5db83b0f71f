"""Wire formats of the private connector service: JSON documents and Arrow IPC frames.

No ``.proto`` files: every request and response is either a JSON object (UTF-8) or a *frame*,
a JSON header followed by an Arrow IPC stream::

    ┌────────────┬──────────────────┬──────────────────────┬──────────────────────────────┐
    │ magic (4)  │ header len (4)   │ header (JSON, UTF-8) │ Arrow IPC stream (to the end) │
    │ "RMQF"     │ uint32 big-end.  │ header len bytes     │ optional: may be empty        │
    └────────────┴──────────────────┴──────────────────────┴──────────────────────────────┘

The documents themselves (which fields each request and response has) are defined in
:mod:`rmq_spark.broker.connector.protocol`.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

FRAME_MAGIC = b"RMQF"
_FRAME_HEAD = struct.Struct(">4sI")


def dump_json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def load_json(data: bytes) -> Any:
    return json.loads(data.decode("utf-8")) if data else {}


@dataclass
class Frame:
    header: dict[str, Any]
    table: pa.Table | None = None


def dump_frame(frame: Frame) -> bytes:
    """The frame as bytes: head and Arrow stream written into one buffer, copied out once (a
    Send carries tens of MB: each copy of it costs the writing executor)."""
    head = dump_json(frame.header)
    if frame.table is None:
        return _FRAME_HEAD.pack(FRAME_MAGIC, len(head)) + head
    sink = pa.BufferOutputStream()
    sink.write(_FRAME_HEAD.pack(FRAME_MAGIC, len(head)))
    sink.write(head)
    with pa.ipc.new_stream(sink, frame.table.schema) as w:
        w.write_table(frame.table)
    return sink.getvalue().to_pybytes()


def load_frame(data: bytes) -> Frame:
    if len(data) < _FRAME_HEAD.size:
        raise ValueError(f"frame is {len(data)} bytes, shorter than its 8-byte head")
    magic, n = _FRAME_HEAD.unpack_from(data, 0)
    if magic != FRAME_MAGIC:
        raise ValueError(f"frame magic is {magic!r}, expected {FRAME_MAGIC!r}")
    start = _FRAME_HEAD.size
    header = load_json(data[start : start + n])
    rest = memoryview(data)[start + n :]
    table = None
    if len(rest):
        table = pa.ipc.open_stream(pa.py_buffer(rest)).read_all()
    return Frame(header, table)


COMPRESSIONS = ("none", "lz4", "zstd")  # Arrow IPC body compression of the ReadArrow chunks


def dump_batch(batch: pa.RecordBatch, compression: str | None = None) -> bytes:
    """One record batch as an Arrow IPC stream (the ReadArrow response chunks); ``compression``
    ``lz4`` or ``zstd`` compresses its buffers (Arrow IPC's LZ4_FRAME / ZSTD: the reader
    decompresses by itself), ``none`` / None leaves them as they are."""
    if compression not in (None, "none") and compression not in COMPRESSIONS:
        raise ValueError(
            f"compression must be one of {', '.join(COMPRESSIONS)}, not {compression!r}"
        )
    options = (
        pa.ipc.IpcWriteOptions(compression=compression)
        if compression not in (None, "none")
        else None
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=options) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def load_batch(data: bytes) -> pa.RecordBatch:
    batches = list(pa.ipc.open_stream(pa.py_buffer(data)))
    if len(batches) != 1:
        raise ValueError(f"a ReadArrow chunk holds {len(batches)} record batches, expected 1")
    return batches[0]


def identity(data: bytes) -> bytes:
    return data
