"""The CommitLog message record, byte for byte as RocketMQ writes it (all integers big-endian): its
one definition, :data:`HEADER_V4`, from which every field position is derived; the record walker,
the checker and the decoder.  Encoders are in :mod:`rmq_spark.store.encode`, the encoded batch
(what the put lock fills in) in :mod:`rmq_spark.store.encoded`.

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

import struct
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
from zlib_ng.zlib_ng import crc32  # hardware-accelerated CRC32, same polynomial as java.util.zip

from rmq_spark.store import layout as L
from rmq_spark.store.message import MessageExt, offset_msg_id
from rmq_spark.store.properties import (
    PROP_CRC_BYTES,
    PROP_CRC_PREFIX,
    decode_properties,
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


# a structured dtype: both are set
_FIELDS: Mapping[str, tuple[Any, ...]] = HEADER_V4.fields or {}
_NAMES: tuple[str, ...] = HEADER_V4.names or ()


def _pos(field: str) -> int:
    return int(_FIELDS[field][1])


# byte positions inside a record, derived from HEADER_V4 (IPv4 born and store hosts; each field
# after an IPv6 host moves by HOST_V6_EXTRA: see store_timestamp_pos and body_len_pos)
POS_MAGIC = _pos("magic")
POS_BODY_CRC = _pos("body_crc")
POS_QUEUE_ID = _pos("queue_id")
POS_FLAG = _pos("flag")
POS_QUEUE_OFFSET = _pos("queue_offset")
POS_PHYSICAL_OFFSET = _pos("physical_offset")
POS_SYS_FLAG = _pos("sys_flag")
POS_BORN_TIMESTAMP = _pos("born_timestamp")
POS_BORN_HOST = _pos("born_host")
POS_STORE_TIMESTAMP_V4 = _pos("store_timestamp")
POS_RECONSUME_TIMES_V4 = _pos("reconsume_times")
POS_PREPARED_OFFSET_V4 = _pos("prepared_offset")
POS_BODY_LEN_V4 = _pos("body_len")
POS_BODY_V4 = HEADER_V4.itemsize
FIXED_V4_BYTES = POS_BODY_LEN_V4  # the fixed part before BODYLEN
HOST_V6_EXTRA = 12  # an IPv6 host takes 16 + 4 bytes instead of 4 + 4


def store_timestamp_pos(sys_flag: int) -> int:
    """Position of STORETIMESTAMP in a record with this SYSFLAG (after the born host)."""
    return POS_STORE_TIMESTAMP_V4 + (HOST_V6_EXTRA if sys_flag & L.FLAG_BORNHOST_V6 else 0)


def body_len_pos(sys_flag: int) -> int:
    """Position of BODYLEN in a record with this SYSFLAG (after both hosts)."""
    return (
        POS_BODY_LEN_V4
        + (HOST_V6_EXTRA if sys_flag & L.FLAG_BORNHOST_V6 else 0)
        + (HOST_V6_EXTRA if sys_flag & L.FLAG_STOREHOST_V6 else 0)
    )


_INT = struct.Struct(">i")
_SHORT = struct.Struct(">H")
_BLANK = struct.Struct(">iI")
_HEAD1 = struct.Struct(">iIiiiqqiq")  # total..born timestamp (48 bytes)
_TS = struct.Struct(">q")
_MID = struct.Struct(">iqi")  # reconsume, prepared offset, body len (after store host)
_PHYS = struct.Struct(">q")
_MIN_RECORD_BYTES = POS_BODY_V4 + 1 + 2  # a v1 record with an empty body, topic and properties
_CHECK_HEAD = np.dtype(
    {name: _FIELDS[name] for name in _NAMES[: _NAMES.index("sys_flag") + 1]}  # type: ignore[call-overload]  # numpy's stubs lack the fields-dict form
)  # TOTALSIZE .. SYSFLAG: the fields before the first host, gathered at once
_POW10 = 10 ** np.arange(10, dtype=np.int64)  # the record CRC's digits, least significant first


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
    return (
        4
        + 4
        + 4
        + 4
        + 4
        + 8
        + 8
        + 4
        + 8
        + born
        + 8
        + store
        + 4
        + 8
        + 4
        + body_len
        + topic_field
        + topic_len
        + 2
        + props_len
    )


class Tail(NamedTuple):
    """Where the variable parts of a record lie (absolute positions in its buffer)."""

    body_at: int
    body_len: int
    topic_at: int
    topic_len: int
    props_at: int  # after PROPERTIESLEN
    props_len: int
    end: int  # one past the last byte the fields claim (TOTALSIZE must say the same)


def walk(buf, pos: int) -> Tail:  # type: ignore[no-untyped-def]
    """The record walker: from SYSFLAG and MAGICCODE to BODY, TOPIC and PROPERTIES of the record at
    ``pos``.  Reads only what its fields say; :func:`check_record` holds them to TOTALSIZE."""
    sys_flag = _INT.unpack_from(buf, pos + POS_SYS_FLAG)[0]
    p = pos + body_len_pos(sys_flag)
    body_len = _INT.unpack_from(buf, p)[0]
    body_at = p + 4
    p = body_at + body_len
    if _BLANK.unpack_from(buf, pos)[1] == L.MAGIC_V2:
        topic_len = _SHORT.unpack_from(buf, p)[0]
        p += 2
    else:
        topic_len = buf[p]
        p += 1
    topic_at = p
    p += topic_len
    props_len = _SHORT.unpack_from(buf, p)[0] if p + 2 <= len(buf) else -1
    return Tail(body_at, body_len, topic_at, topic_len, p + 2, props_len, p + 2 + max(props_len, 0))


def store_timestamp_at(buf, pos: int) -> int:  # type: ignore[no-untyped-def]
    """STORETIMESTAMP of the record at ``pos``."""
    sys_flag = _INT.unpack_from(buf, pos + POS_SYS_FLAG)[0]
    return _TS.unpack_from(buf, pos + store_timestamp_pos(sys_flag))[0]


# --- decoding ------------------------------------------------------------------------------------


class RecordCheck:
    """Outcome of :func:`check_record` at one position."""

    VALID = 0
    BLANK = 1  # end-of-file filler: continue in the next segment
    END = 2  # zero bytes: nothing written here yet
    INVALID = 3  # torn or corrupt


def check_record(  # type: ignore[no-untyped-def]
    buf,
    pos: int,
    limit: int,
    check_crc: bool = True,
    force_prop_crc: bool = False,
    segment_end: int | None = None,
) -> tuple[int, int, str]:
    """Validate the record at ``pos`` of ``buf`` (readable up to ``limit``), the way Apache
    RocketMQ's recovery does (``CommitLog.checkMessageAndReturnSize``): MAGICCODE v1 or v2,
    TOTALSIZE equal to the length its fields lay out, the body CRC; and the whole-record CRC
    property ``__CRC32#`` when the record carries it (Apache writes it only with
    ``enabledAppendPropCRC``, so a record without it is checked as Apache checks it).
    ``force_prop_crc`` requires the property: only for records known to have been written with
    it (the write in flight at a crash, see :mod:`rmq_spark.store.logscan`).  A BLANK record's
    TOTALSIZE must reach ``segment_end`` (the segment's size; ``limit`` when not given): Apache's
    segments are sparse past the 8-byte BLANK header, so the readable bytes end before it.

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
        room = (limit if segment_end is None else segment_end) - pos
        if total != room:
            return RecordCheck.INVALID, 0, f"blank record size {total} != remaining {room}"
        return RecordCheck.BLANK, total, ""
    if magic not in (L.MAGIC_V1, L.MAGIC_V2):
        return RecordCheck.INVALID, 0, f"bad magic code 0x{magic:08X}"
    if total < POS_BODY_V4 + 1 + 2 or total > remaining:
        return RecordCheck.INVALID, 0, f"record size {total} out of range (remaining {remaining})"
    sys_flag = _INT.unpack_from(buf, pos + POS_SYS_FLAG)[0]
    p = pos + body_len_pos(sys_flag)
    body_len = _INT.unpack_from(buf, p)[0]
    if body_len < 0 or p + 4 + body_len > pos + total:
        return RecordCheck.INVALID, 0, f"body length {body_len} out of range"
    tail = walk(buf, pos)
    if tail.props_at > pos + total:
        return RecordCheck.INVALID, 0, "topic runs past the record end"
    body_start, topic_len, props_len = tail.body_at, tail.topic_len, tail.props_len
    if record_length(sys_flag, body_len, topic_len, props_len, magic) != total:
        return RecordCheck.INVALID, 0, f"record size {total} does not match its fields"
    if check_crc:
        crc = _INT.unpack_from(buf, pos + POS_BODY_CRC)[0]
        if crc != crc32(buf[body_start : body_start + body_len]) & 0x7FFFFFFF:
            return RecordCheck.INVALID, 0, "body CRC mismatch"
        end = pos + total
        has_prop_crc = (
            props_len >= PROP_CRC_BYTES
            and bytes(buf[end - PROP_CRC_BYTES : end - PROP_CRC_BYTES + len(PROP_CRC_PREFIX)])
            == PROP_CRC_PREFIX
        )
        if has_prop_crc:
            digits = bytes(buf[end - 10 - 1 : end - 1])
            if not digits.isdigit() or buf[end - 1] != 2:
                return RecordCheck.INVALID, 0, "record CRC property damaged"
            want = int(digits[::-1])
            if want != crc32(buf[pos : end - PROP_CRC_BYTES]) & 0x7FFFFFFF:
                return RecordCheck.INVALID, 0, "record CRC mismatch"
        elif force_prop_crc:
            return RecordCheck.INVALID, 0, "record CRC property missing"
        elif props_len > 0:
            why = properties_damage(bytes(buf[tail.props_at : end]))
            if why:
                return RecordCheck.INVALID, 0, why
    return RecordCheck.VALID, total, ""


def properties_damage(props: bytes) -> str:
    """Why the PROPERTIES of a record without the ``__CRC32#`` property are not what a broker
    writes, or ``""``: Apache RocketMQ's brokers store ``messageProperties2String`` of the
    message's map (UTF-8, every ``name\x01value`` ended by ``\x02``), and so does this store,
    whose own records carry the property (so damage to theirs, which the body CRC does not cover,
    shows: a torn tail zeroes the end, a flipped bit breaks the UTF-8 or the property's name)."""
    if props[-1:] != b"\x02":
        return "the properties do not end with a separator (a torn or damaged record)"
    if b"\x00" in props:
        return "a zero byte in the properties (a torn or damaged record)"
    try:
        props.decode("utf-8")
    except UnicodeDecodeError:
        return "the properties are not UTF-8 (a damaged record)"
    if len(props) >= PROP_CRC_BYTES:
        # the name's bytes where the property's name would stand, against the name
        named = props[-PROP_CRC_BYTES:][: len(PROP_CRC_PREFIX)]
        near = sum(a != b for a, b in zip(named, PROP_CRC_PREFIX, strict=True))
        if near <= 3:  # no broker writes a name this close to it: the property, damaged
            return "record CRC property damaged"
    return ""


def verify_record(  # type: ignore[no-untyped-def]
    buf, pos: int, limit: int, phys: int, size: int | None = None, force_prop_crc: bool = False
) -> str:
    """Why the bytes at ``pos`` are not the record an index says is at CommitLog offset ``phys``
    (of ``size`` bytes when given), or ``""`` when they are: :func:`check_record` with its CRCs,
    then TOTALSIZE and PHYSICALOFFSET held to what the index says.  The check of every read that
    serves a client (zeroed or overwritten records are never decoded into messages)."""
    kind, total, reason = check_record(
        buf, pos, limit, check_crc=True, force_prop_crc=force_prop_crc
    )
    if kind == RecordCheck.END:
        return "zero bytes where a record should be"
    if kind != RecordCheck.VALID:
        return reason or "a BLANK record where a message should be"
    if size is not None and total != size:
        return f"record size {total}, the index says {size}"
    at = _PHYS.unpack_from(buf, pos + POS_PHYSICAL_OFFSET)[0]
    if at != phys:
        return f"the record says it is at offset {at}"
    return ""


def check_records(
    buf: np.ndarray,
    limit: int,
    pos: np.ndarray,
    sizes: np.ndarray,
    phys: np.ndarray,
    force_prop_crc: bool = False,
    topic: bytes | None = None,
    queue_id: int = 0,
    queue_offsets: np.ndarray | None = None,
    check_crc: bool = True,
) -> np.ndarray:
    """:func:`verify_record` of many records of one mapped segment at once, and (with ``topic``)
    that each belongs to ``topic``/``queue_id`` at its queue offset: the mask of those that fail.
    The bounds, the fixed header (one gather), MAGICCODE, TOTALSIZE, PHYSICALOFFSET and the
    lengths that lay the record out are checked with numpy (positions clamped, so garbage fields
    never read outside the segment); then one CRC per record, over the whole record when it
    carries the ``__CRC32#`` property (which covers the body, the body CRC and every header
    field), else over the body; ``check_crc=False`` leaves the CRCs out (a start's check of every
    unit).  ``buf`` is the segment's bytes as uint8, readable up to ``limit``."""
    from rmq_spark.store.views import _at

    pos = pos.astype(np.int64, copy=False)
    sizes = sizes.astype(np.int64, copy=False)
    ok = (pos >= 0) & (sizes >= _MIN_RECORD_BYTES) & (pos + sizes <= limit)
    all_in = bool(ok.all())
    p = pos if all_in else np.where(ok, pos, 0)
    end = p + (sizes if all_in else np.where(ok, sizes, _MIN_RECORD_BYTES))
    head = _at(buf, f"V{_CHECK_HEAD.itemsize}")[p].view(_CHECK_HEAD)
    ok &= head["total_size"] == end - p
    magic = head["magic"]
    v2 = magic == L.MAGIC_V2
    ok &= (magic == L.MAGIC_V1) | v2
    ok &= head["physical_offset"] == phys
    if queue_offsets is not None:
        ok &= (head["queue_id"] == queue_id) & (head["queue_offset"] == queue_offsets)
    body_at = p + POS_BODY_V4
    v6 = head["sys_flag"] & (L.FLAG_BORNHOST_V6 | L.FLAG_STOREHOST_V6)
    if v6.any():
        sys_flag = head["sys_flag"]
        body_at += np.where(sys_flag & L.FLAG_BORNHOST_V6, HOST_V6_EXTRA, 0)
        body_at += np.where(sys_flag & L.FLAG_STOREHOST_V6, HOST_V6_EXTRA, 0)
        ok &= body_at + 1 + 2 <= end
        body_at = np.where(ok, body_at, p + POS_BODY_V4)
    body_len = _at(buf, ">i4")[body_at - 4].astype(np.int64)
    body_end = body_at + body_len
    ok &= (body_len >= 0) & (body_end + 1 + 2 <= end)
    if not ok.all():
        body_end = np.where(ok, body_end, p)
    if v2.any():
        topic_len = np.where(v2, _at(buf, ">u2")[body_end], buf[body_end]).astype(np.int64)
        topic_at = body_end + np.where(v2, 2, 1)
    else:
        topic_len = buf[body_end].astype(np.int64)
        topic_at = body_end + 1
    props_len_at = topic_at + topic_len
    ok &= props_len_at + 2 <= end
    props_len = _at(buf, ">u2")[np.where(ok, props_len_at, p)].astype(np.int64)
    ok &= props_len_at + 2 + props_len == end
    if topic is not None:
        ok &= topic_len == len(topic)
        if len(topic):
            dtype, name = _topic_item(topic)
            ok &= _at(buf, dtype)[np.where(ok, topic_at, p)] == name
    if not check_crc:
        return ~ok
    # the whole-record CRC where the property is there, else the body CRC; the property's 20
    # bytes (prefix, 10 digits least significant first, terminator) gathered at once
    crc_at = end - PROP_CRC_BYTES
    has_prop = ok & (props_len >= PROP_CRC_BYTES)
    tail = _at(buf, _CRC_TAIL)[np.where(has_prop, crc_at, p)]
    has_prop &= tail["prefix"] == PROP_CRC_PREFIX
    if force_prop_crc:
        ok &= has_prop
    digits = tail["digits"] - np.uint8(48)
    ok &= ~has_prop | ((digits <= 9).all(axis=1) & (tail["end"] == 2))
    bare = np.flatnonzero(
        ok & ~has_prop & (props_len > 0)
    )  # Apache's records: their properties checked
    for r in bare.tolist():
        a = int(props_len_at[r]) + 2
        if properties_damage(bytes(buf[a : a + int(props_len[r])])):
            ok[r] = False
    want = np.where(has_prop, digits @ _POW10, head["body_crc"])
    lo = np.where(has_prop, p, body_at)
    hi = np.where(has_prop, crc_at, body_end)
    rows = np.flatnonzero(ok)
    ok[rows] = crc32_ranges(buf, lo[rows], hi[rows]) == want[rows]
    return ~ok


_CRC_TAIL = np.dtype(
    [("prefix", f"S{len(PROP_CRC_PREFIX)}"), ("digits", "u1", (10,)), ("end", "u1")]
)
assert _CRC_TAIL.itemsize == PROP_CRC_BYTES and b"\x00" not in PROP_CRC_PREFIX
GATHER_CRC_BYTES = 4096  # ranges up to this long are copied out together, longer ones read in place


def _topic_item(topic: bytes) -> tuple[str, object]:
    """The dtype to gather a topic name as, and the value to compare with: ``S`` items compare in
    C (a topic has no NUL, so S's NUL padding cannot make two differ by less); a name with a NUL
    falls back to raw ``V`` items."""
    if b"\x00" not in topic:
        return f"S{len(topic)}", topic
    return f"V{len(topic)}", np.frombuffer(topic, dtype=f"V{len(topic)}")[0]


def crc32_ranges(buf: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``UtilAll.crc32`` (sign bit cleared) of each ``buf[lo:hi]``: ranges of one length are
    gathered into one array and its rows hashed (no slice object per record), the others
    read in place."""
    from rmq_spark.store.views import _at

    n = len(lo)
    out = np.empty(n, dtype=np.int64)
    if n == 0:
        return out
    lengths = hi - lo
    first = int(lengths[0])
    if bool((lengths == first).all()):
        groups: list[tuple[int, np.ndarray | None]] = [(first, None)]
    else:
        sizes, inverse = np.unique(lengths, return_inverse=True)
        if len(sizes) > 16:
            groups = []
        else:
            groups = [(int(size), np.flatnonzero(inverse == i)) for i, size in enumerate(sizes)]
    if not groups or any(size > GATHER_CRC_BYTES or size <= 0 for size, _ in groups):
        mv = memoryview(buf)  # type: ignore[arg-type]  # bytes, a mmap or a uint8 ndarray: all buffers
        out[:] = np.fromiter(
            map(crc32, map(mv.__getitem__, map(slice, lo.tolist(), hi.tolist()))), np.int64, n
        )
    else:
        for size, idx in groups:
            starts = lo if idx is None else lo[idx]
            got = np.fromiter(map(crc32, _at(buf, f"V{size}")[starts]), np.int64, len(starts))
            if idx is None:
                out[:] = got
            else:
                out[idx] = got
    out &= 0x7FFFFFFF
    return out


def decode_record(buf, pos: int, read_body: bool = True) -> MessageExt:  # type: ignore[no-untyped-def]
    """Decode the (already validated) record at ``pos`` into a :class:`MessageExt`."""
    total, _magic, crc, qid, flag, qoff, phys, sys_flag, born_ts = _HEAD1.unpack_from(buf, pos)
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
    reconsume, prepared, _ = _MID.unpack_from(buf, p)
    t = walk(buf, pos)
    body = bytes(buf[t.body_at : t.body_at + t.body_len]) if read_body else b""
    topic = bytes(buf[t.topic_at : t.topic_at + t.topic_len]).decode("utf-8")
    props = decode_properties(bytes(buf[t.props_at : t.props_at + t.props_len]))
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
