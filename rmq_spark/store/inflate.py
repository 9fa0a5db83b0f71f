"""Bounded inflation of compressed bodies: the one place the package inflates anything a client
sent, so that no input can make a process allocate more than the limit it is read with.

A RocketMQ producer compresses a body (the Java client: over 4 KiB) and says so in the record's
SYSFLAG: bit 0 (``COMPRESSED``) and, since 5.x, the compression type in bits 8-10
(``MessageSysFlag.getCompressionType``: 0 from 4.x clients and 3 are zlib, 1 LZ4 frame, 2 zstd).
:func:`inflate` inflates one body through a streaming decoder that never produces more than
``limit + 1`` bytes (``zlib.decompressobj(...).decompress(data, max_length)``), so a zlib bomb
costs at most the limit (4 MiB by default, :data:`~rmq_spark.store.layout.BODY_MAX_BYTES`) and
is refused with an :class:`InflateError` naming the problem, as is data that is not a whole
stream of its codec.

Where it is used:

* at the send (:func:`check_compressed_body`): a body flagged COMPRESSED that does not inflate,
  or inflates over the body limit, is refused (MessageIllegalError), so the readers never meet
  one that was stored after this check existed;
* by every reader of stored or pulled records (:func:`inflate_bodies`: the store's bulk reader,
  the reader of a PULL_MESSAGE body, the offline read of Apache's stores), by the NameServer for
  a compressed REGISTER_BROKER body (:func:`inflate`, zlib) and for gzip bodies of gRPC messages
  (:func:`inflate_gzip`);
* by the bulk reader's batches (``StoreReader.read_chunks``): each body is within the limit,
  but a few KiB of zlib can hold 4 MiB, so a batch bounded by the bytes its records take in the
  CommitLog is also cut where its bodies pass that bound once inflated (``budget`` of
  :func:`inflate_bodies`).

A poison record (one stored before the send was checked, or by another broker: flagged
COMPRESSED, but its body does not inflate within the limit) must not stop a stream forever.
RocketMQ's own client drops it silently, and with it the rest of its pull batch
(``MessageDecoder.decode`` returns null on any exception and ``decodesBatch`` stops there, while
the consumer moves past the whole batch); its reply path keeps the body as received and logs a
warning.  Here, every bulk read keeps the row and serves its **body as stored** (the bytes the
producer sent, not inflated), and logs one WARNING per batch naming such records (the first
five, and how many) by CommitLog file, position and why each did not inflate: nothing
acknowledged is lost or hidden, the other records of the range are served, and a stream passes
it.  A missing optional codec package (LZ4,
zstd) is not a property of the record: that read fails with an error naming the package.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from rmq_spark.errors import ConfigError, MessageIllegalError
from rmq_spark.store import layout as L

__all__ = [
    "COMPRESSION_MASK",
    "LZ4",
    "ZLIB",
    "ZSTD",
    "CodecUnavailableError",
    "InflateError",
    "check_compressed_body",
    "compression_type",
    "inflate",
    "inflate_bodies",
    "inflate_body",
    "inflate_gzip",
    "record_places",
]

log = logging.getLogger("rmq_spark.store.inflate")

COMPRESSION_MASK = 0x700  # MessageSysFlag.COMPRESSION_TYPE_COMPARATOR
LZ4, ZSTD, ZLIB = 1, 2, 3  # CompressionType values (0: written by 4.x clients, zlib)
_POISON_LOGGED = 5  # records named in one warning line (the count says how many in all)
_PIECE = 256 << 10  # bytes inflated per step


class InflateError(MessageIllegalError):
    """A compressed body that does not inflate, or inflates to more than its limit.  At a send it
    is the message's fault (MessageIllegalError); in a stored record, a poison record."""


class CodecUnavailableError(ConfigError):
    """A body uses a codec whose optional package is not installed here (names the package)."""


def compression_type(sys_flag: int) -> int:
    """``MessageSysFlag.getCompressionType``: the codec of a COMPRESSED body (0 and 3: zlib)."""
    return (int(sys_flag) & COMPRESSION_MASK) >> 8


def _limit_text(limit: int) -> str:
    return (
        f"{limit} bytes (4 MiB, the body limit)" if limit == L.BODY_MAX_BYTES else f"{limit} bytes"
    )


def _zlib(data: bytes, limit: int, wbits: int, codec: str, what: str) -> bytes:
    # in pieces of at most _PIECE bytes into one buffer: one decompress(data, limit + 1) would
    # hold its output blocks and their joined copy at once (twice the limit)
    d = zlib.decompressobj(wbits)
    out = bytearray()
    rest = data
    try:
        while len(out) <= limit:
            piece = d.decompress(rest, min(_PIECE, limit + 1 - len(out)))
            out += piece
            rest = d.unconsumed_tail
            if d.eof or not (piece or rest):
                break
    except zlib.error as e:
        raise InflateError(f"{what} is not valid {codec} data ({e})") from None
    if len(out) > limit:
        raise InflateError(f"{what} inflates to more than {_limit_text(limit)}")
    if not d.eof:  # all input consumed and no more output, but no stream end
        raise InflateError(f"{what} is not valid {codec} data (incomplete or truncated stream)")
    return bytes(out)


def inflate(
    data: bytes | bytearray | memoryview, limit: int = L.BODY_MAX_BYTES, what: str = "the body"
) -> bytes:
    """``data`` (a zlib stream, as ``java.util.zip.Deflater`` writes it) inflated, never more than
    ``limit`` bytes: :class:`InflateError` when it is not a whole zlib stream or would inflate
    over ``limit`` (at most ``limit + 1`` bytes are ever produced).  ``what`` names the data in
    the error.  Bytes after the stream's end are ignored, as ``zlib.decompress`` and Java's
    ``InflaterInputStream`` do."""
    return _zlib(bytes(data), limit, zlib.MAX_WBITS, "zlib", what)


def inflate_gzip(
    data: bytes | bytearray | memoryview, limit: int = L.BODY_MAX_BYTES, what: str = "the body"
) -> bytes:
    """:func:`inflate` of a gzip member (a gRPC message's GZIP body encoding)."""
    return _zlib(bytes(data), limit, 16 + zlib.MAX_WBITS, "gzip", what)


def _lz4(data: bytes, limit: int, what: str) -> bytes:
    try:
        import lz4.frame as lz4f  # type: ignore[import-not-found]
    except ImportError:
        raise CodecUnavailableError(
            f"{what} is LZ4-compressed (sysflag compression type 1): install the 'lz4' package"
        ) from None
    d = lz4f.LZ4FrameDecompressor()
    try:
        out = bytes(d.decompress(data, max_length=limit + 1))
    except RuntimeError as e:
        raise InflateError(f"{what} is not valid LZ4 frame data ({e})") from None
    if len(out) > limit:
        raise InflateError(f"{what} inflates to more than {_limit_text(limit)}")
    if not d.eof:
        raise InflateError(f"{what} is not valid LZ4 frame data (incomplete or truncated frame)")
    return out


def _zstd(data: bytes, limit: int, what: str) -> bytes:
    try:
        import zstandard  # type: ignore[import-not-found,unused-ignore]  # an optional package
    except ImportError:
        raise CodecUnavailableError(
            f"{what} is zstd-compressed (sysflag compression type 2): install the 'zstandard' package"
        ) from None
    pieces: list[bytes] = []
    n = 0
    try:  # a stream reader: output is read in pieces up to the limit, whatever the frame claims
        with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=False) as r:
            while n <= limit:
                piece = r.read(limit + 1 - n)
                if not piece:
                    break
                pieces.append(piece)
                n += len(piece)
    except zstandard.ZstdError as e:
        raise InflateError(f"{what} is not valid zstd data ({e})") from None
    if n > limit:
        raise InflateError(f"{what} inflates to more than {_limit_text(limit)}")
    return b"".join(pieces)


def inflate_body(data: bytes | bytearray | memoryview, sys_flag: int, limit: int = L.BODY_MAX_BYTES,
                 what: str = "the body") -> bytes:  # fmt: skip
    """The body of a record with ``sys_flag`` as the producer gave it: inflated by the codec its
    compression type names when it is flagged COMPRESSED (bounded by ``limit``), else as it is.
    :class:`InflateError` for a body that cannot be inflated within ``limit`` or an unknown
    compression type; :class:`CodecUnavailableError` when the codec's package is missing."""
    if not int(sys_flag) & L.FLAG_COMPRESSED:
        return bytes(data)
    kind = compression_type(sys_flag)
    if kind in (0, ZLIB):
        return _zlib(bytes(data), limit, zlib.MAX_WBITS, "zlib", what)
    if kind == LZ4:
        return _lz4(bytes(data), limit, what)
    if kind == ZSTD:
        return _zstd(bytes(data), limit, what)
    raise InflateError(
        f"{what} is marked compressed with unknown compression type {kind} (sysflag {int(sys_flag)})"
    )


def check_compressed_body(body: bytes, sys_flag: int, limit: int) -> None:
    """Refuse at the send what the readers cannot read: :class:`~rmq_spark.errors.MessageIllegalError`
    (an :class:`InflateError`) when ``body`` is flagged COMPRESSED in ``sys_flag`` and does not
    inflate, inflates to more than ``limit`` bytes, or names an unknown compression type, or
    when its codec's package is missing here; nothing when it is not flagged.  Costs one bounded
    inflation (at most ``limit + 1`` bytes of memory)."""
    if not int(sys_flag) & L.FLAG_COMPRESSED:
        return
    try:
        inflate_body(body, sys_flag, limit, "the message body, flagged COMPRESSED,")
    except CodecUnavailableError as e:
        raise InflateError(f"{e}; this broker cannot check it, so it is refused") from None


def record_places(
    commitlog: Any, phys: np.ndarray, queue: str, queue_offsets: np.ndarray
) -> Callable[[int], str]:
    """``where`` of :func:`inflate_bodies` for records at CommitLog offsets ``phys`` of a
    :class:`~rmq_spark.store.mapped.MappedFileQueue`: row -> its file, position and queue offset."""

    def where(row: int) -> str:
        at = int(phys[row])
        mf = commitlog.find(at)
        place = (
            f"{mf.path} position {at - mf.from_offset}"
            if mf is not None
            else f"CommitLog offset {at}"
        )
        return f"{place} ({queue} offset {int(queue_offsets[row])})"

    return where


def inflate_bodies(bodies: pa.Array, sys_flags: np.ndarray, limit: int = L.BODY_MAX_BYTES,
                   where: Callable[[int], str] | None = None, budget: int | None = None) -> pa.Array:  # fmt: skip
    """``bodies`` with the rows whose SYSFLAG says COMPRESSED inflated (zlib, LZ4 frame or zstd
    frame, by the compression type bits; each bounded by ``limit``): one call of the codec per
    compressed row.  A row that does not inflate within the limit (a poison record) keeps its body
    as stored, and one WARNING names those rows (``where(row)``: its file and position).  A
    missing codec package raises :class:`CodecUnavailableError`.

    With ``budget``, the rows stop before the first compressed one (never the first row) that
    brings the bodies past ``budget`` bytes once inflated: the array returned is then shorter
    (each body is within the limit, but a few KiB of zlib can hold 4 MiB, so a range bounded by
    its stored bytes is not bounded by its inflated ones)."""
    flags_all = np.asarray(sys_flags)
    compressed = np.flatnonzero(flags_all & L.FLAG_COMPRESSED)
    if len(compressed) == 0:
        return bodies
    import pyarrow.compute as pc

    plain_before = None
    if budget is not None:  # bytes of the bodies not compressed, before each row
        stored = np.asarray(pc.binary_length(bodies).fill_null(0), dtype=np.int64)
        stored[compressed] = 0
        plain_before = np.cumsum(stored) - stored
    packed = bodies.take(pa.array(compressed)).to_pylist()
    out: list[bytes] = []
    poison: list[tuple[int, str]] = []
    cut, inflated = len(bodies), 0
    for data, flag, row in zip(
        packed, flags_all[compressed].tolist(), compressed.tolist(), strict=True
    ):
        try:
            body = inflate_body(data, flag, limit)
        except InflateError as e:
            body = data
            poison.append((row, str(e)))
        inflated += len(body)
        if plain_before is not None and row > 0 and int(plain_before[row]) + inflated > budget:  # type: ignore[operator]
            cut = row
            poison = [p for p in poison if p[0] < row]
            break
        out.append(body)
    if poison:
        named = "; ".join(
            f"{where(r) if where else f'row {r}'}: {why}" for r, why in poison[:_POISON_LOGGED]
        )
        more = f" (and {len(poison) - _POISON_LOGGED} more)" if len(poison) > _POISON_LOGGED else ""
        log.warning("%d record(s) marked compressed whose body does not inflate are served with the body as "
                    "stored: %s%s", len(poison), named, more)  # fmt: skip
    if cut < len(bodies):
        bodies = bodies.slice(0, cut)
    mask = np.zeros(len(bodies), dtype=bool)
    mask[compressed[compressed < cut]] = True
    return pc.replace_with_mask(bodies, pa.array(mask), pa.array(out, pa.binary()))
