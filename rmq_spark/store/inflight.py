"""The CommitLog write in flight, kept in a small mapped file (``<store>/inflight``).

A kill -9 in the middle of a write leaves its bytes as the copy had left them, and a copy does not
go in order: glibc's ``memcpy`` loads the first vector of a buffer, copies the rest, and stores
that first vector last.  So a write torn by a kill can show a hole where its first record starts
with whole, valid records of the same write after it.  Recovery must cut such a tail (the write had
not returned, so nothing in it was acknowledged), yet stop at a hole with valid records after it
anywhere else: those records were written by earlier writes, so the hole is damage inside the log.

The bytes alone cannot tell the two apart; this marker does.  The CommitLog sets it to the range
``[start, end)`` of a write before copying a byte, and clears it when the copy is done (two stores
into a mapping: no system call).  After a kill the page cache keeps it, so recovery knows the write
that was under way: a hole inside that range, with no valid record at or after its end, is the torn
tail.  After a power loss the marker itself may be lost (it is never synced): a hole with valid
records after it is then reported as damage with file and position, and the operator decides
(``--truncate-corrupt``), never a silent cut of what may have been acknowledged.  A marker torn by
the kill (its CRC does not match) counts as no marker, the same conservative answer.

Layout (24 bytes, big-endian): ``"RMQW"``, start (int64), end (int64), CRC32 of the 20 bytes before.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib

__all__ = ["InflightMarker", "read_inflight"]

_HEAD = struct.Struct(">4sqq")
_CRC = struct.Struct(">I")
_MAGIC = b"RMQW"
SIZE = _HEAD.size + _CRC.size


def _decode(buf: bytes) -> tuple[int, int] | None:
    if len(buf) < SIZE or buf[:4] != _MAGIC:
        return None
    if _CRC.unpack_from(buf, _HEAD.size)[0] != zlib.crc32(buf[: _HEAD.size]):
        return None
    _, start, end = _HEAD.unpack_from(buf, 0)
    return (start, end) if 0 <= start < end else None


def read_inflight(path: str) -> tuple[int, int] | None:
    """The range of the write that was under way when the writer stopped, or None (no write was,
    no marker file, or a marker that does not check)."""
    try:
        with open(path, "rb") as f:
            return _decode(f.read(SIZE))
    except FileNotFoundError:
        return None


class InflightMarker:
    """The writer's side: :meth:`mark` before a write, :meth:`clear` after it (put lock held)."""

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < SIZE:
                os.ftruncate(fd, SIZE)
            self._mm = mmap.mmap(fd, SIZE, access=mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        self.found = _decode(self._mm[:SIZE])  # what the last writer left
        self._zero = bytes(4)

    def mark(self, start: int, end: int) -> None:
        head = _HEAD.pack(_MAGIC, start, end)
        self._mm[:SIZE] = head + _CRC.pack(zlib.crc32(head))

    def clear(self) -> None:
        self._mm[:4] = self._zero

    def close(self) -> None:
        self._mm.close()
