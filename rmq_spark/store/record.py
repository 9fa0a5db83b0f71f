"""The CommitLog message record, byte for byte as RocketMQ writes it (all integers big-endian).

::

    ┌───────────┬───────────┬──────────┬──────────┬──────┬──────────────┬────────────────┬─────────┐
    │ TOTALSIZE │ MAGICCODE │ BODYCRC  │ QUEUEID  │ FLAG │ QUEUEOFFSET  │ PHYSICALOFFSET │ SYSFLAG │
    │ 4         │ 4         │ 4        │ 4        │ 4    │ 8            │ 8              │ 4       │
    ├───────────┴─────┬─────┴──────────┴──┬───────┴──────┴───┬──────────┴───────┬────────┴─────────┤
    │ BORNTIMESTAMP 8 │ BORNHOST 8 | 20   │ STORETIMESTAMP 8 │ STOREHOST 8 | 20 │ RECONSUMETIMES 4 │
    ├─────────────────┴───────────┬───────┴──────────┬───────┴──────────────────┴──────────────────┤
    │ PREPARED TRANSACTION OFFSET │ BODYLEN 4 + BODY │ TOPICLEN 1 (v1) | 2 (v2) + TOPIC           │
    │ 8                           │                  │ PROPERTIESLEN 2 + PROPERTIES               │
    └─────────────────────────────┴──────────────────┴────────────────────────────────────────────┘

A host is its raw IP (4 or 16 bytes) then the port as an int.  The fixed part is 84 bytes with
IPv4 hosts (+12 per IPv6 host).  At the end of a segment a record that does not fit is replaced by
an 8-byte BLANK record (TOTALSIZE = the remaining space, MAGIC = BLANK).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from zlib_ng.zlib_ng import crc32  # hardware-accelerated CRC32, same polynomial as java.util.zip

from rmq_spark.store import layout as L
from rmq_spark.store.dispatch import Column, as_list
from rmq_spark.store.message import (
    MessageExt,
    decode_properties,
    host_bytes,
    offset_msg_id,
    tags_code,
)

# Fixed header for IPv4 born and store hosts, plus BODYLEN (so 88 bytes); one definition, used by
# the vectorized encoder and by the bulk reader.
HEADER_V4 = np.dtype(
    [
        ("total_size", ">i4"),
        ("magic", ">u4"),
        ("body_crc", ">i4"),
        ("queue_id", ">i4"),
        ("flag", ">i4"),
        ("queue_offset", ">i8"),
        ("physical_offset", ">i8"),
        ("sys_flag", ">i4"),
        ("born_timestamp", ">i8"),
        ("born_host", "V4"),
        ("born_port", ">i4"),
        ("store_timestamp", ">i8"),
        ("store_host", "V4"),
        ("store_port", ">i4"),
        ("reconsume_times", ">i4"),
        ("prepared_offset", ">i8"),
        ("body_len", ">i4"),
    ]
)
assert HEADER_V4.itemsize == 88

FIXED_V4_BYTES = 84
# byte positions inside a record (IPv4 born host; store timestamp moves by +12 with an IPv6 born host)
POS_MAGIC = 4
POS_BODY_CRC = 8
POS_QUEUE_ID = 12
POS_FLAG = 16
POS_QUEUE_OFFSET = 20
POS_PHYSICAL_OFFSET = 28
POS_SYS_FLAG = 36
POS_BORN_TIMESTAMP = 40
POS_BORN_HOST = 48
POS_STORE_TIMESTAMP_V4 = 56

# optional whole-record CRC (RocketMQ's enabledAppendPropCRC): the last 20 bytes of the properties
# are "__CRC32#" \x01 <10 ASCII digits, least significant first> \x02, the CRC32 (sign bit
# cleared) of every record byte before them.
PROP_CRC_PREFIX = b"__CRC32#\x01"
PROP_CRC_BYTES = 20
PROP_CRC_PLACEHOLDER = PROP_CRC_PREFIX + b"0" * 10 + b"\x02"
_TEN = 10 ** np.arange(10, dtype=np.int64)


_HUNDREDS = (100 ** np.arange(5)).astype(np.uint32)
# "00".."99" as little-endian pairs, units digit first
_TWO_DIGITS = np.array([(48 + i % 10) | ((48 + i // 10) << 8) for i in range(100)], dtype="<u2")


def _crc_digits(crcs: np.ndarray) -> np.ndarray:
    """(n, 10) ASCII digits of CRCs (sign bit cleared), least significant first: two digits per
    lookup."""
    c = (np.asarray(crcs) & 0x7FFFFFFF).astype(np.uint32)
    return _TWO_DIGITS[c[:, None] // _HUNDREDS % 100].view(np.uint8)

_INT = struct.Struct(">i")
_UINT = struct.Struct(">I")
_SHORT = struct.Struct(">H")
_BLANK = struct.Struct(">iI")
_HEAD1 = struct.Struct(">iIiiiqqiq")  # total..born timestamp (48 bytes)
_TS = struct.Struct(">q")
_QP = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET
_MID = struct.Struct(">iqi")  # reconsume, prepared offset, body len (after store host)
_HEAD_V4 = struct.Struct(">iIiiiqqiq4siq4siiqi")  # the whole fixed part with IPv4 hosts + BODYLEN
assert _HEAD_V4.size == HEADER_V4.itemsize


def body_crc(body: bytes) -> int:
    """``UtilAll.crc32``: CRC32 of the body with the sign bit cleared."""
    return crc32(body) & 0x7FFFFFFF


def record_length(
    sys_flag: int, body_len: int, topic_len: int, props_len: int, magic: int = L.MAGIC_V1
) -> int:
    """``MessageExtEncoder.calMsgLength``."""
    born = 20 if sys_flag & L.FLAG_BORNHOST_V6 else 8
    store = 20 if sys_flag & L.FLAG_STOREHOST_V6 else 8
    topic_field = 2 if magic == L.MAGIC_V2 else 1
    return 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + born + 8 + store + 4 + 8 + 4 + body_len + topic_field + topic_len + 2 + props_len


class EncodedBatch:
    """Records encoded outside the put lock; :meth:`finalize` patches in what only the lock knows.
    Numpy columns (a batch of a few records keeps them as lists until read)."""

    __slots__ = (
        "buf", "_rel_pos", "_sizes", "_store_ts_pos", "_queue_ids", "topics", "_tags_codes",
        "_sys_flags", "keys", "uniq_keys", "properties", "prop_crc",
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
        topics: list[str],
        tags_codes: np.ndarray | list[int],
        sys_flags: np.ndarray | list[int],
        keys: list[str | None],
        uniq_keys: list[str | None],
        properties: list[dict[str, str]],
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

    def finalize(self, phys_offsets: np.ndarray, queue_offsets: np.ndarray, store_ts_ms: int) -> None:
        """Write PHYSICALOFFSET, QUEUEOFFSET and STORETIMESTAMP of every record (vectorized)."""
        n = len(self._sizes)
        if n <= SMALL_BATCH:
            self.finalize_few(as_list(phys_offsets), as_list(queue_offsets), store_ts_ms)
            return
        sizes = self.sizes
        size = int(sizes[0])
        if size * n == len(self.buf) and int(sizes.min()) == size and int(self.store_ts_pos.min()) == int(self.store_ts_pos.max()):
            self._finalize_uniform(size, phys_offsets, queue_offsets, store_ts_ms)
            return
        arr = np.frombuffer(self.buf, dtype=np.uint8)
        eight = np.arange(8, dtype=np.int64)
        phys = np.asarray(phys_offsets, dtype=">i8").view(np.uint8).reshape(n, 8)
        arr[(self.rel_pos + POS_PHYSICAL_OFFSET)[:, None] + eight] = phys
        qo = np.asarray(queue_offsets, dtype=">i8").view(np.uint8).reshape(n, 8)
        arr[(self.rel_pos + POS_QUEUE_OFFSET)[:, None] + eight] = qo
        ts = np.full(n, store_ts_ms, dtype=">i8").view(np.uint8).reshape(n, 8)
        arr[(self.rel_pos + self.store_ts_pos)[:, None] + eight] = ts
        if self.prop_crc:
            mv = memoryview(self.buf)
            ends = (self.rel_pos + sizes - PROP_CRC_BYTES).tolist()
            crcs = np.fromiter(map(crc32, map(mv.__getitem__, map(slice, self.rel_pos.tolist(), ends))), np.int64, n)
            digits = _crc_digits(crcs)
            pos = np.asarray(ends, dtype=np.int64) + len(PROP_CRC_PREFIX)
            arr[pos[:, None] + np.arange(10, dtype=np.int64)] = digits
            mv.release()

    def _finalize_uniform(self, size: int, phys_offsets, queue_offsets, store_ts_ms: int) -> None:  # type: ignore[no-untyped-def]
        """:meth:`finalize` of records of one size: strided column stores on an (n, size) view."""
        n = len(self._sizes)
        rows = np.frombuffer(self.buf, dtype=np.uint8).reshape(n, size)
        rows[:, POS_QUEUE_OFFSET : POS_QUEUE_OFFSET + 8] = np.asarray(queue_offsets, dtype=">i8").view(np.uint8).reshape(n, 8)
        rows[:, POS_PHYSICAL_OFFSET : POS_PHYSICAL_OFFSET + 8] = np.asarray(phys_offsets, dtype=">i8").view(np.uint8).reshape(n, 8)
        at = int(self.store_ts_pos[0])
        rows[:, at : at + 8] = np.frombuffer(_TS.pack(store_ts_ms), dtype=np.uint8)
        if self.prop_crc:
            crcs = np.fromiter(map(crc32, rows[:, : size - PROP_CRC_BYTES]), np.int64, n)
            at = size - PROP_CRC_BYTES + len(PROP_CRC_PREFIX)
            rows[:, at : at + 10] = _crc_digits(crcs)
        del rows

    def finalize_few(self, phys_offsets: list[int], queue_offsets: list[int], store_ts_ms: int) -> None:
        """:meth:`finalize` of a batch of at most ``SMALL_BATCH`` records, offsets given as lists."""
        rels, sizes, ts_positions = self._rel_pos, self._sizes, self._store_ts_pos
        if rels.__class__ is not list or sizes.__class__ is not list or ts_positions.__class__ is not list:
            rels, sizes, ts_positions = as_list(rels), as_list(sizes), as_list(ts_positions)
        buf = self.buf
        mv = memoryview(buf) if self.prop_crc else None
        for rel, size, ts_pos, phys, qoff in zip(rels, sizes, ts_positions, phys_offsets, queue_offsets):
            _QP.pack_into(buf, rel + POS_QUEUE_OFFSET, qoff, phys)
            _TS.pack_into(buf, rel + ts_pos, store_ts_ms)
            if mv is not None:
                end = rel + size - PROP_CRC_BYTES
                crc = crc32(mv[rel:end]) & 0x7FFFFFFF
                at = end + len(PROP_CRC_PREFIX)
                buf[at : at + 10] = (b"%010d" % crc)[::-1]
        if mv is not None:
            mv.release()


class _Chain(Sequence):  # type: ignore[type-arg]
    """Sequences read as one, without materializing lazy ones."""

    def __init__(self, parts: list[Sequence]) -> None:  # type: ignore[type-arg]
        self._parts = parts
        self._ends = np.cumsum([len(p) for p in parts])

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        k = int(np.searchsorted(self._ends, i, side="right"))
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._parts[k][i - (int(self._ends[k - 1]) if k else 0)]


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
        rel_pos=np.concatenate([b.rel_pos + int(s) for b, s in zip(batches, starts)]),
        sizes=np.concatenate([b.sizes for b in batches]),
        store_ts_pos=np.concatenate([b.store_ts_pos for b in batches]),
        queue_ids=np.concatenate([b.queue_ids for b in batches]),
        topics=[t for b in batches for t in b.topics],
        tags_codes=np.concatenate([b.tags_codes for b in batches]),
        sys_flags=np.concatenate([b.sys_flags for b in batches]),
        keys=[k for b in batches for k in b.keys],
        uniq_keys=[u for b in batches for u in b.uniq_keys],
        properties=[p for ps in props for p in ps] if all(type(p) is list for p in props) else _Chain(props),  # type: ignore[arg-type]
        prop_crc=batches[0].prop_crc,
    )


# batches up to this size are encoded, finalized, appended and dispatched record by record with
# struct, their columns kept as lists (measured: a put of 32 messages 970 -> 430 us, of 256 about
# even); larger ones column by column with numpy
SMALL_BATCH = 128


# records at least this long on average are assembled with one copy per body (memcpy-bound);
# shorter ones through Arrow's element-wise join (call-overhead-bound)
LARGE_RECORD_BYTES = 1024


def _assemble_large(  # type: ignore[no-untyped-def]
    headers: np.ndarray, bodies: Sequence[bytes], body_lens: np.ndarray, tails, total: int
) -> bytearray:
    n = len(bodies)
    out = bytearray(total)
    arr = np.frombuffer(out, dtype=np.uint8)
    sizes = 88 + body_lens + (tails.shape[1] if isinstance(tails, np.ndarray) else np.fromiter(map(len, tails), np.int64, n))
    starts = np.cumsum(sizes) - sizes
    arr[starts[:, None] + np.arange(88)] = headers.view(np.uint8).reshape(n, 88)
    mv = memoryview(out)
    for p, b in zip((starts + 88).tolist(), bodies):
        mv[p : p + len(b)] = b
    tail_at = starts + 88 + body_lens
    if isinstance(tails, np.ndarray):
        arr[tail_at[:, None] + np.arange(tails.shape[1])] = tails
    else:
        for p, t in zip(tail_at.tolist(), tails):
            mv[p : p + len(t)] = t
    del arr, mv
    return out


def _assemble_uniform(headers: np.ndarray, bodies: Sequence[bytes], body_len: int, tails2d: np.ndarray) -> bytearray:
    """Records of one size (equal bodies, equal tails) as rows of a 2-D array: three strided
    copies, no per-record call."""
    n = len(bodies)
    width = 88 + body_len + tails2d.shape[1]
    out = bytearray(n * width)
    rows = np.frombuffer(out, dtype=np.uint8).reshape(n, width)
    rows[:, :88] = headers.view(np.uint8).reshape(n, 88)
    if body_len:
        rows[:, 88 : 88 + body_len] = np.frombuffer(b"".join(bodies), dtype=np.uint8).reshape(n, body_len)
    rows[:, 88 + body_len :] = tails2d
    del rows
    return out


def encode_batch(
    topics: Sequence[str] | str,
    queue_ids: Sequence[int] | np.ndarray | int,
    bodies: Sequence[bytes],
    properties: Sequence[dict[str, str]],
    encoded_properties: Sequence[bytes] | np.ndarray,
    *,
    flags: Sequence[int] | np.ndarray | int = 0,
    sys_flags: Sequence[int] | np.ndarray | int = 0,
    born_timestamps: Sequence[int] | np.ndarray | int = 0,
    born_hosts: Sequence[bytes] | bytes = b"\x7f\x00\x00\x01",
    born_ports: Sequence[int] | np.ndarray | int = 0,
    reconsume_times: Sequence[int] | np.ndarray | int = 0,
    prepared_offsets: Sequence[int] | np.ndarray | int = 0,
    store_host: bytes = b"\x7f\x00\x00\x01",
    store_port: int = 0,
    prop_crc: bool = False,
    tags_codes: np.ndarray | None = None,
) -> EncodedBatch:
    """Encode ``n`` records into one buffer. Per-record arguments are sequences of length ``n``
    or a scalar shared by all (``topics`` too).  ``encoded_properties`` may be a 2-D uint8 array
    when every record's properties have the same length (the columnar fast path).  IPv6 hosts
    set their sysflag bits automatically."""
    n = len(bodies)
    if 0 < n <= SMALL_BATCH and not isinstance(encoded_properties, np.ndarray):
        return _encode_few(
            topics, queue_ids, bodies, properties, encoded_properties, flags, sys_flags,
            born_timestamps, born_hosts, born_ports, reconsume_times, prepared_offsets,
            store_host, store_port, prop_crc, tags_codes,
        )  # fmt: skip
    shared_topic = isinstance(topics, str)
    topic_list = [topics] * n if shared_topic else list(topics)  # type: ignore[list-item]
    sflags = _col(sys_flags, n, np.int32) & ~(L.FLAG_BORNHOST_V6 | L.FLAG_STOREHOST_V6)
    if isinstance(born_hosts, (bytes, bytearray)):
        bhosts: list[bytes] | None = None
        v6_born = np.full(n, len(born_hosts) == 16)
    else:
        bhosts = list(born_hosts)
        v6_born = np.fromiter((len(h) == 16 for h in bhosts), dtype=bool, count=n)
    sflags = sflags | np.where(v6_born, L.FLAG_BORNHOST_V6, 0).astype(np.int32)
    if len(store_host) == 16:
        sflags |= L.FLAG_STOREHOST_V6
    # TOPIC + PROPERTIES ("tail") of each record
    fixed_props = isinstance(encoded_properties, np.ndarray)
    if shared_topic:
        tb = topics.encode("utf-8")  # type: ignore[union-attr]
        v2 = len(tb) > 127
        magics = np.full(n, L.MAGIC_V2 if v2 else L.MAGIC_V1, dtype=np.uint32)
        topic_field = (_SHORT.pack(len(tb)) if v2 else bytes((len(tb),))) + tb
    if shared_topic and fixed_props:
        props2d = encoded_properties  # type: ignore[assignment]
        plen = props2d.shape[1] + (PROP_CRC_BYTES if prop_crc else 0)
        head = np.frombuffer(topic_field + _SHORT.pack(plen), dtype=np.uint8)
        width = len(head) + plen
        tails2d = np.empty((n, width), dtype=np.uint8)
        tails2d[:, : len(head)] = head
        tails2d[:, len(head) : len(head) + props2d.shape[1]] = props2d
        if prop_crc:
            tails2d[:, width - PROP_CRC_BYTES :] = np.frombuffer(PROP_CRC_PLACEHOLDER, dtype=np.uint8)
        tails = None
        tail_lens = np.full(n, width, dtype=np.int64)
        props_bytes = None
    else:
        props_bytes = [bytes(p) for p in encoded_properties]
        if prop_crc:
            props_bytes = [pb + PROP_CRC_PLACEHOLDER for pb in props_bytes]
        tail_list = []
        if not shared_topic:
            magics = np.empty(n, dtype=np.uint32)
        for i, pb in enumerate(props_bytes):
            if shared_topic:
                tail_list.append(topic_field + _SHORT.pack(len(pb)) + pb)
                continue
            tbi = topic_list[i].encode("utf-8")
            if len(tbi) > 127:
                magics[i] = L.MAGIC_V2
                tail_list.append(_SHORT.pack(len(tbi)) + tbi + _SHORT.pack(len(pb)) + pb)
            else:
                magics[i] = L.MAGIC_V1
                tail_list.append(bytes((len(tbi),)) + tbi + _SHORT.pack(len(pb)) + pb)
        tails = None
        tail_lens = np.fromiter(map(len, tail_list), dtype=np.int64, count=n)
    body_lens = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
    crcs = np.array(list(map(crc32, bodies)), dtype=np.int64) & 0x7FFFFFFF
    if tags_codes is None:
        tags_codes = np.fromiter((tags_code(p.get(L.P_TAGS)) for p in properties), dtype=np.int64, count=n)
    qids = _col(queue_ids, n, np.int32)

    if n > SMALL_BATCH and not v6_born.any() and len(store_host) == 4:
        sizes = FIXED_V4_BYTES + 4 + body_lens + tail_lens
        h = np.zeros(n, dtype=HEADER_V4)
        h["total_size"] = sizes
        h["magic"] = magics
        h["body_crc"] = crcs
        h["queue_id"] = qids
        h["flag"] = _col(flags, n, np.int32)
        h["sys_flag"] = sflags
        h["born_timestamp"] = _col(born_timestamps, n, np.int64)
        if bhosts is None:
            h["born_host"] = np.frombuffer(bytes(born_hosts), dtype="V4")[0]  # type: ignore[arg-type]
        elif n:
            h["born_host"] = np.frombuffer(b"".join(bhosts), dtype="V4")
        h["born_port"] = _col(born_ports, n, np.int32)
        h["store_host"] = np.frombuffer(store_host, dtype="V4")[0]
        h["store_port"] = store_port
        h["reconsume_times"] = _col(reconsume_times, n, np.int32)
        h["prepared_offset"] = _col(prepared_offsets, n, np.int64)
        h["body_len"] = body_lens
        total = int(sizes.sum())
        if total >= n * LARGE_RECORD_BYTES:
            buf = _assemble_large(h, bodies, body_lens, tails2d if props_bytes is None else tail_list, total)
        elif props_bytes is None and n and int(body_lens.min()) == int(body_lens.max()):
            buf = _assemble_uniform(h, bodies, int(body_lens[0]), tails2d)
        else:
            if props_bytes is None:
                tails = pa.FixedSizeBinaryArray.from_buffers(
                    pa.binary(tails2d.shape[1]), n, [None, pa.py_buffer(tails2d)]
                ).cast(pa.binary())
            else:
                tails = pa.array(tail_list, pa.binary())
            headers = pa.FixedSizeBinaryArray.from_buffers(
                pa.binary(88), n, [None, pa.py_buffer(h)]
            ).cast(pa.binary())
            # one C++ pass interleaves header, body and tail of every record
            joined = pc.binary_join_element_wise(
                headers, pa.array(bodies, pa.binary()), tails, pa.scalar(b"", pa.binary())
            )
            buf = bytearray(memoryview(joined.buffers()[2])[:total]) if n else bytearray()
        store_ts_pos = np.full(n, POS_STORE_TIMESTAMP_V4, dtype=np.int64)
    else:
        hosts = bhosts if bhosts is not None else [bytes(born_hosts)] * n  # type: ignore[arg-type]
        tail_py = tail_list if props_bytes is not None else [r.tobytes() for r in tails2d]
        flg = _col(flags, n, np.int32)
        bts = _col(born_timestamps, n, np.int64)
        bports = _col(born_ports, n, np.int32)
        rts = _col(reconsume_times, n, np.int32)
        prep = _col(prepared_offsets, n, np.int64)
        chunks = []
        sizes = np.empty(n, dtype=np.int64)
        store_ts_pos = np.empty(n, dtype=np.int64)
        for i in range(n):
            sf = int(sflags[i])
            size = FIXED_V4_BYTES + 4 + int(body_lens[i]) + int(tail_lens[i])
            size += 12 if sf & L.FLAG_BORNHOST_V6 else 0
            size += 12 if sf & L.FLAG_STOREHOST_V6 else 0
            sizes[i] = size
            store_ts_pos[i] = POS_BORN_HOST + len(hosts[i]) + 4
            chunks.append(
                _HEAD1.pack(size, int(magics[i]), int(crcs[i]), int(qids[i]), int(flg[i]), 0, 0, sf, int(bts[i]))
                + hosts[i]
                + _INT.pack(int(bports[i]))
                + _TS.pack(0)
                + store_host
                + _INT.pack(store_port)
                + _MID.pack(int(rts[i]), int(prep[i]), int(body_lens[i]))
                + bodies[i]
                + tail_py[i]
            )
        buf = bytearray(b"".join(chunks))
    sizes = sizes.astype(np.int64)
    rel_pos = np.cumsum(sizes) - sizes
    if properties is None or len(properties) != n:
        raise ValueError("properties must give one dict per record")
    return EncodedBatch(
        buf=buf,
        rel_pos=rel_pos,
        sizes=sizes.astype(np.int32),
        store_ts_pos=store_ts_pos,
        queue_ids=qids,
        topics=topic_list,
        tags_codes=tags_codes,
        sys_flags=sflags,
        # fixed-width properties (put_bodies) share one dict: its keys, and UNIQ_KEYs set by the caller
        keys=[p.get(L.P_KEYS) for p in properties] if not fixed_props else [properties[0].get(L.P_KEYS) if n else None] * n,
        uniq_keys=[p.get(L.P_UNIQ_KEY) for p in properties] if not fixed_props else [properties[0].get(L.P_UNIQ_KEY) if n else None] * n,
        properties=list(properties),
        prop_crc=prop_crc,
    )


def _encode_few(  # type: ignore[no-untyped-def]
    topics, queue_ids, bodies, properties, encoded_properties, flags, sys_flags, born_timestamps,
    born_hosts, born_ports, reconsume_times, prepared_offsets, store_host, store_port, prop_crc, tags_codes,
) -> EncodedBatch:
    """:func:`encode_batch` of a few records in plain Python with struct (the same bytes: numpy's
    per-call cost dominates at this size)."""
    n = len(bodies)
    if properties is None or len(properties) != n:
        raise ValueError("properties must give one dict per record")
    topic_list = [topics] * n if isinstance(topics, str) else list(topics)
    hosts = [bytes(born_hosts)] * n if isinstance(born_hosts, (bytes, bytearray)) else list(born_hosts)
    codes = as_list(tags_codes) if tags_codes is not None else [tags_code(p.get(L.P_TAGS)) for p in properties]
    return _encode_rows(
        topic_list, _lst(queue_ids, n), bodies, properties, [bytes(p) for p in encoded_properties],
        _lst(flags, n), _lst(sys_flags, n), _lst(born_timestamps, n), hosts, _lst(born_ports, n),
        _lst(reconsume_times, n), _lst(prepared_offsets, n), store_host, store_port, prop_crc, codes,
    )  # fmt: skip


def encode_messages(  # type: ignore[no-untyped-def]
    msgs: Sequence, encoded_properties: list[bytes], born_default_ms: int, store_host: bytes,
    store_port: int, prop_crc: bool,
) -> EncodedBatch:
    """Records of a few checked :class:`~rmq_spark.store.message.Message` objects (their
    properties already encoded; ``born_default_ms`` for a message without a born time)."""
    props = [m.properties for m in msgs]
    return _encode_rows(
        [m.topic for m in msgs], [m.queue_id for m in msgs],
        [m.body if m.body.__class__ is bytes else bytes(m.body) for m in msgs], props,
        encoded_properties, [m.flag for m in msgs], [m.sys_flag for m in msgs],
        [m.born_timestamp_ms or born_default_ms for m in msgs], [host_bytes(m.born_host) for m in msgs],
        [m.born_port for m in msgs], [m.reconsume_times for m in msgs],
        [m.prepared_transaction_offset for m in msgs], store_host, store_port, prop_crc,
        [tags_code(p.get(L.P_TAGS)) for p in props],
    )  # fmt: skip


# One record to write, as the columns of :func:`encode_few` / :func:`encode_batch`: topic, queue id,
# body, properties, the properties encoded (with their UNIQ_KEY), tagsCode, flag, sys flag, born
# time, born host, born port, reconsume times, prepared transaction offset.
Row = tuple[str, int, bytes, dict[str, str], bytes, int, int, int, int, str, int, int, int]


# the sys flag of a record with IPv4 born and store hosts (the IPv6 host bits cleared)
V4_SYS_FLAG_MASK = ~(L.FLAG_BORNHOST_V6 | L.FLAG_STOREHOST_V6)
_FIXED_PARTS = FIXED_V4_BYTES + 4 + 2  # + BODYLEN's body, + PROPERTIES_LENGTH's properties


def encode_few(  # type: ignore[no-untyped-def]
    topics: Sequence[str], queue_ids: Sequence[int], bodies: Sequence[bytes],
    properties: Sequence[dict[str, str]], encoded_properties: Sequence[bytes],
    tags_codes: Sequence[int], flags: Sequence[int], sys_flags: Sequence[int],
    born_timestamps: Sequence[int], born_hosts: Sequence[str], born_ports: Sequence[int],
    reconsume_times: Sequence[int], prepared_offsets: Sequence[int], store_host: bytes,
    store_port: int, prop_crc: bool,
) -> EncodedBatch:
    """Records of a few checked messages given as columns (lists or tuples of Python values;
    bodies bytes, born hosts as text, properties encoded with their UNIQ_KEY), encoded one by one
    as :func:`encode_messages` does, without Message objects."""
    return _encode_rows(
        list(topics), list(queue_ids), bodies, properties, encoded_properties, flags, sys_flags,
        born_timestamps, [host_bytes(h) for h in born_hosts], born_ports, reconsume_times,
        prepared_offsets, store_host, store_port, prop_crc, list(tags_codes),
    )  # fmt: skip


def _encode_rows(  # type: ignore[no-untyped-def]
    topic_list, qids, bodies, properties, encoded_properties, flg, sfl, bts, hosts, bports, rts, prep,
    store_host, store_port, prop_crc, codes,
) -> EncodedBatch:
    """The record loop of a few records, every argument a list of Python values."""
    store_v6 = len(store_host) == 16
    store_field = store_host + _INT.pack(store_port)
    crc_tail = PROP_CRC_PLACEHOLDER if prop_crc else b""
    chunks, sizes, ts_pos, flags_out, rel, at = [], [], [], [], [], 0
    keep, fixed = V4_SYS_FLAG_MASK, _FIXED_PARTS
    for i, body in enumerate(bodies):
        magic, tfield = _topic_field(topic_list[i])
        pb = encoded_properties[i] + crc_tail
        host = hosts[i]
        sf = sfl[i] & keep
        size = fixed + len(body) + len(tfield) + len(pb)
        if len(host) == 4 and not store_v6:
            head = _HEAD_V4.pack(
                size, magic, crc32(body) & 0x7FFFFFFF, qids[i], flg[i], 0, 0, sf, bts[i], host,
                bports[i], 0, store_host, store_port, rts[i], prep[i], len(body),
            )  # fmt: skip
        else:
            if len(host) == 16:
                sf |= L.FLAG_BORNHOST_V6
                size += 12
            if store_v6:
                sf |= L.FLAG_STOREHOST_V6
                size += 12
            head = (
                _HEAD1.pack(size, magic, crc32(body) & 0x7FFFFFFF, qids[i], flg[i], 0, 0, sf, bts[i])
                + host + _INT.pack(bports[i]) + _TS.pack(0) + store_field
                + _MID.pack(rts[i], prep[i], len(body))
            )  # fmt: skip
        chunks += (head, body, tfield, _SHORT.pack(len(pb)), pb)
        sizes.append(size)
        ts_pos.append(POS_BORN_HOST + len(host) + 4)
        flags_out.append(sf)
        rel.append(at)
        at += size
    return EncodedBatch(
        buf=bytearray(b"".join(chunks)),
        rel_pos=rel,
        sizes=sizes,
        store_ts_pos=ts_pos,
        queue_ids=qids,
        topics=topic_list,
        tags_codes=codes,
        sys_flags=flags_out,
        keys=[p.get(L.P_KEYS) for p in properties],
        uniq_keys=[p.get(L.P_UNIQ_KEY) for p in properties],
        properties=list(properties),
        prop_crc=prop_crc,
    )


def encode_one(  # type: ignore[no-untyped-def]
    topic: str, queue_id: int, body: bytes, encoded_properties: bytes, flag: int, sys_flag: int,
    born_ms: int, born_host: bytes, born_port: int, reconsume_times: int, prepared_offset: int,
    store_host: bytes, store_port: int, prop_crc: bool,
) -> bytearray | None:
    """One checked record with IPv4 born and store hosts (``sys_flag`` masked with
    ``V4_SYS_FLAG_MASK``), as :func:`encode_few` encodes it; QUEUEOFFSET, PHYSICALOFFSET,
    STORETIMESTAMP and the properties' CRC are left for :func:`place_one`.  None for an IPv6
    host (the batch encoders handle those)."""
    if len(born_host) != 4 or len(store_host) != 4:
        return None
    magic, tfield = _topic_field(topic)
    pb = encoded_properties + PROP_CRC_PLACEHOLDER if prop_crc else encoded_properties
    blen = len(body)
    head = _HEAD_V4.pack(
        _FIXED_PARTS + blen + len(tfield) + len(pb), magic, crc32(body) & 0x7FFFFFFF, queue_id, flag, 0, 0,
        sys_flag, born_ms, born_host, born_port, 0, store_host, store_port, reconsume_times, prepared_offset, blen,
    )  # fmt: skip
    return bytearray().join((head, body, tfield, _SHORT.pack(len(pb)), pb))


def place_one(buf: bytearray, queue_offset: int, phys: int, store_ts_ms: int, prop_crc: bool) -> None:
    """Write the offsets and store time of an :func:`encode_one` record (and its CRC)."""
    _QP.pack_into(buf, POS_QUEUE_OFFSET, queue_offset, phys)
    _TS.pack_into(buf, POS_STORE_TIMESTAMP_V4, store_ts_ms)
    if prop_crc:
        end = len(buf) - PROP_CRC_BYTES
        at = end + len(PROP_CRC_PREFIX)
        buf[at : at + 10] = (b"%010d" % (crc32(buf[:end]) & 0x7FFFFFFF))[::-1]


@functools.lru_cache(maxsize=1024)
def _topic_bytes(topic: str) -> bytes:
    return topic.encode("utf-8")


@functools.lru_cache(maxsize=1024)
def _topic_field(topic: str) -> tuple[int, bytes]:
    """The record's magic code and TOPIC field (length byte, or short for a long name, + name)."""
    tb = _topic_bytes(topic)
    if len(tb) > 127:
        return L.MAGIC_V2, _SHORT.pack(len(tb)) + tb
    return L.MAGIC_V1, bytes((len(tb),)) + tb


def _lst(value, n: int) -> list:  # type: ignore[no-untyped-def]
    if isinstance(value, (int, np.integer)):
        return [int(value)] * n
    out = value.tolist() if isinstance(value, np.ndarray) else [int(v) for v in value]
    if len(out) != n:
        raise ValueError(f"expected {n} values, got {len(out)}")
    return out


def _col(value, n: int, dtype) -> np.ndarray:  # type: ignore[no-untyped-def]
    if isinstance(value, (int, np.integer)):
        return np.full(n, value, dtype=dtype)
    arr = np.asarray(value, dtype=dtype)
    if arr.shape != (n,):
        raise ValueError(f"expected {n} values, got {arr.shape}")
    return arr


# --- decoding ------------------------------------------------------------------------------------


class RecordCheck:
    """Outcome of :func:`check_record` at one position."""

    VALID = 0
    BLANK = 1  # end-of-file filler: continue in the next segment
    END = 2  # zero bytes: nothing written here yet
    INVALID = 3  # torn or corrupt


def check_record(  # type: ignore[no-untyped-def]
    buf, pos: int, limit: int, check_crc: bool = True, force_prop_crc: bool = False
) -> tuple[int, int, str]:
    """Validate the record at ``pos`` of ``buf`` (readable up to ``limit``).

    Returns ``(kind, size, reason)`` where kind is a :class:`RecordCheck` value."""
    remaining = limit - pos
    if remaining < 8:
        if remaining <= 0 or not any(bytes(buf[pos:limit])):
            return RecordCheck.END, 0, ""
        return RecordCheck.INVALID, 0, f"only {remaining} bytes left, less than a record header"
    total, magic = _BLANK.unpack_from(buf, pos)
    if total == 0 and magic == 0:
        return RecordCheck.END, 0, ""
    if magic == L.BLANK_MAGIC:
        if total != remaining:
            return RecordCheck.INVALID, 0, f"blank record size {total} != remaining {remaining}"
        return RecordCheck.BLANK, total, ""
    if magic not in (L.MAGIC_V1, L.MAGIC_V2):
        return RecordCheck.INVALID, 0, f"bad magic code 0x{magic:08X}"
    if total < FIXED_V4_BYTES + 4 + 1 + 2 or total > remaining:
        return RecordCheck.INVALID, 0, f"record size {total} out of range (remaining {remaining})"
    sys_flag = _INT.unpack_from(buf, pos + POS_SYS_FLAG)[0]
    p = pos + POS_BORN_HOST + (20 if sys_flag & L.FLAG_BORNHOST_V6 else 8) + 8
    p += (20 if sys_flag & L.FLAG_STOREHOST_V6 else 8) + 4 + 8
    body_len = _INT.unpack_from(buf, p)[0]
    if body_len < 0 or p + 4 + body_len > pos + total:
        return RecordCheck.INVALID, 0, f"body length {body_len} out of range"
    body_start = p + 4
    p = body_start + body_len
    if magic == L.MAGIC_V2:
        topic_len = _SHORT.unpack_from(buf, p)[0]
        p += 2
    else:
        topic_len = buf[p]
        p += 1
    p += topic_len
    if p + 2 > pos + total:
        return RecordCheck.INVALID, 0, "topic runs past the record end"
    props_len = _SHORT.unpack_from(buf, p)[0]
    if record_length(sys_flag, body_len, topic_len, props_len, magic) != total:
        return RecordCheck.INVALID, 0, f"record size {total} does not match its fields"
    if check_crc:
        crc = _INT.unpack_from(buf, pos + POS_BODY_CRC)[0]
        if crc != crc32(buf[body_start : body_start + body_len]) & 0x7FFFFFFF:
            return RecordCheck.INVALID, 0, "body CRC mismatch"
        end = pos + total
        has_prop_crc = props_len >= PROP_CRC_BYTES and bytes(
            buf[end - PROP_CRC_BYTES : end - PROP_CRC_BYTES + len(PROP_CRC_PREFIX)]
        ) == PROP_CRC_PREFIX
        if has_prop_crc:
            digits = bytes(buf[end - 10 - 1 : end - 1])
            if not digits.isdigit() or buf[end - 1] != 2:
                return RecordCheck.INVALID, 0, "record CRC property damaged"
            want = int(digits[::-1])
            if want != crc32(buf[pos : end - PROP_CRC_BYTES]) & 0x7FFFFFFF:
                return RecordCheck.INVALID, 0, "record CRC mismatch"
        elif force_prop_crc:
            return RecordCheck.INVALID, 0, "record CRC property missing"
    return RecordCheck.VALID, total, ""


def decode_record(buf, pos: int, read_body: bool = True) -> MessageExt:  # type: ignore[no-untyped-def]
    """Decode the (already validated) record at ``pos`` into a :class:`MessageExt`."""
    total, magic, crc, qid, flag, qoff, phys, sys_flag, born_ts = _HEAD1.unpack_from(buf, pos)
    p = pos + POS_BORN_HOST
    hl = 16 if sys_flag & L.FLAG_BORNHOST_V6 else 4
    born_host = bytes(buf[p : p + hl])
    born_port = _INT.unpack_from(buf, p + hl)[0]
    p += hl + 4
    store_ts = _TS.unpack_from(buf, p)[0]
    p += 8
    hl = 16 if sys_flag & L.FLAG_STOREHOST_V6 else 4
    store_host = bytes(buf[p : p + hl])
    store_port = _INT.unpack_from(buf, p + hl)[0]
    p += hl + 4
    reconsume, prepared, body_len = _MID.unpack_from(buf, p)
    p += 16
    body = bytes(buf[p : p + body_len]) if read_body else b""
    p += body_len
    if magic == L.MAGIC_V2:
        tl = _SHORT.unpack_from(buf, p)[0]
        p += 2
    else:
        tl = buf[p]
        p += 1
    topic = bytes(buf[p : p + tl]).decode("utf-8")
    p += tl
    pl = _SHORT.unpack_from(buf, p)[0]
    props = decode_properties(bytes(buf[p + 2 : p + 2 + pl]))
    return MessageExt(
        topic=topic,
        body=body,
        properties=props,
        queue_id=qid,
        flag=flag,
        sys_flag=sys_flag,
        born_timestamp_ms=born_ts,
        born_host=_ip_str(born_host),
        born_port=born_port,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        queue_offset=qoff,
        commitlog_offset=phys,
        store_size=total,
        store_timestamp_ms=store_ts,
        store_host=_ip_str(store_host),
        store_port=store_port,
        body_crc=crc,
        msg_id=offset_msg_id(store_host, store_port, phys),
    )


def _ip_str(raw: bytes) -> str:
    import ipaddress

    return str(ipaddress.ip_address(raw))


def blank_record(size: int) -> bytes:
    return _BLANK.pack(size, L.BLANK_MAGIC)
