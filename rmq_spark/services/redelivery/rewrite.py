"""Re-writing stored records into their real topic: what the delay-level and timer services
deliver.

Two ways, same result byte for byte: records are decoded and encoded again
(:func:`read_records`, :func:`encode_redelivered`), or, for larger rounds, their bytes are patched
in bulk (:func:`parse_records` finds the header fields and the property values a delivery needs,
:func:`encode_redelivery` gathers the unchanged runs of every record around the new topic, queue,
sysflag and properties with numpy).  Also: the real queue of a message (:func:`resolve_queue`) and
the recovery scan of the CommitLog for deliveries already made (:func:`scan_sources`).
"""

from __future__ import annotations

import functools
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from rmq_spark.errors import MessageIllegalError, RmqError, StoreError
from rmq_spark.store import layout as L
from rmq_spark.store.message import host_bytes, new_uniq_ids, tags_code
from rmq_spark.store.properties import CRC_KEY, decode_properties, encode_properties
from rmq_spark.store.encode import encode_batch
from rmq_spark.store.encoded import EncodedBatch
from rmq_spark.store.record import (
    HEADER_V4,
    POS_STORE_TIMESTAMP_V4,
    PROP_CRC_BYTES,
    PROP_CRC_PLACEHOLDER,
    PROP_CRC_PREFIX,
    decode_record,
)
from rmq_spark.store.validation import check_topic

if TYPE_CHECKING:
    from rmq_spark.store.store import MessageStore, PutResult

__all__ = [
    "DELIVERY_DROP",
    "DELIVERY_REQUEST_KEYS",
    "DELIVERY_KEYS",
    "DROPPED_ON_DELIVERY",
    "PATCH_MIN_MSGS",
    "ParsedRecords",
    "StoredRecords",
    "commit_keys",
    "encode_commits",
    "encode_redelivered",
    "encode_redelivery",
    "gather_runs",
    "parse_records",
    "record_sizes",
    "patch_redelivery",
    "put_redelivered",
    "read_records",
    "resolve_queue",
    "resolve_queues",
    "scan_sources",
]

# what a delivered message loses: routing of the system topic and the client's delay request
DROPPED_ON_DELIVERY = (
    L.P_DELAY,
    L.P_REAL_TOPIC,
    L.P_REAL_QID,
    L.P_TIMER_DELIVER_MS,
    L.P_TIMER_DELAY_SEC,
    L.P_TIMER_DELAY_MS,
)
_HOSTS_V6 = L.FLAG_BORNHOST_V6 | L.FLAG_STOREHOST_V6
_STRUCT_CODES = {"i4": "i", "u4": "I", "i8": "q", "V4": "4s"}
_HEADER = struct.Struct(">" + "".join(_STRUCT_CODES[t[-2:]] for _, t in HEADER_V4.descr))
assert _HEADER.size == HEADER_V4.itemsize
_H = {name: i for i, (name, _) in enumerate(HEADER_V4.descr)}
_H_MAGIC, _H_FLAG, _H_SYS_FLAG, _H_BORN_TS = (
    _H["magic"],
    _H["flag"],
    _H["sys_flag"],
    _H["born_timestamp"],
)
_H_BORN_HOST, _H_BORN_PORT, _H_RECONSUME = _H["born_host"], _H["born_port"], _H["reconsume_times"]
_H_PREPARED, _H_BODY_LEN = _H["prepared_offset"], _H["body_len"]
_CRC_KEY = CRC_KEY
# what a delivery reads from a record's properties, and what it removes before adding its own
DELIVERY_KEYS = (L.P_REAL_TOPIC, L.P_REAL_QID, L.P_TAGS, L.P_KEYS, L.P_UNIQ_KEY, _CRC_KEY)
DELIVERY_KEYS += tuple(k for k in DROPPED_ON_DELIVERY if k not in DELIVERY_KEYS)
DELIVERY_DROP = DROPPED_ON_DELIVERY + (_CRC_KEY,)  # and the record CRC (written again if on)
_RECORD_HEAD = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE (record.py's diagram)


# --- reading stored records in bulk ---------------------------------------------------------------
@dataclass
class StoredRecords:
    """What it takes to write stored records again, one entry per record, in request order."""

    bodies: list[bytes]
    properties: list[dict[str, str]]
    flags: np.ndarray
    sys_flags: np.ndarray
    born_timestamps: np.ndarray
    born_hosts: list[bytes]
    born_ports: np.ndarray
    reconsume_times: np.ndarray
    prepared_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.bodies)


def read_records(store: MessageStore, phys: np.ndarray, sizes: np.ndarray) -> StoredRecords:
    """The records at CommitLog offsets ``phys`` (``sizes`` long), in that order.  One ``struct``
    unpack of the fixed header per record (its format derived from ``record.HEADER_V4``, the one
    definition): cheaper than numpy gathers for the few dozen records of a typical round."""
    n = len(phys)
    bodies: list[bytes] = []
    props: list[dict[str, str]] = []
    heads: list[tuple] = []  # one HEADER_V4 tuple per record
    mfq = store.commitlog.mfq
    unpack = _HEADER.unpack_from
    mf = None
    for offset in np.asarray(phys, dtype=np.int64).tolist():
        if mf is None or not mf.from_offset <= offset < mf.end_offset:
            mf = mfq.find(offset)
            if mf is None:
                raise StoreError(f"CommitLog offset {offset} is outside the log")
            mm = mf.mm
        pos = offset - mf.from_offset
        h = unpack(mm, pos)
        if h[_H_SYS_FLAG] & _HOSTS_V6:  # IPv6 hosts move the later fields: rare, decoded in full
            m = decode_record(mm, pos)
            bodies.append(m.body)
            props.append(m.properties)
            v = list(h)
            v[_H_FLAG], v[_H_SYS_FLAG], v[_H_BORN_TS] = m.flag, m.sys_flag, m.born_timestamp_ms
            v[_H_BORN_HOST], v[_H_BORN_PORT] = host_bytes(m.born_host), m.born_port
            v[_H_RECONSUME], v[_H_PREPARED] = m.reconsume_times, m.prepared_transaction_offset
            heads.append(tuple(v))
            continue
        heads.append(h)
        p = pos + _HEADER.size
        q = p + h[_H_BODY_LEN]
        bodies.append(mm[p:q])
        if h[_H_MAGIC] == L.MAGIC_V2:
            q += 2 + ((mm[q] << 8) | mm[q + 1])
        else:
            q += 1 + mm[q]
        props.append(decode_properties(mm[q + 2 : q + 2 + ((mm[q] << 8) | mm[q + 1])]))
    cols = list(zip(*heads)) if heads else [()] * len(_H)

    def col(i: int, dtype: type) -> np.ndarray:
        return np.array(cols[i], dtype=dtype).reshape(n)

    return StoredRecords(
        bodies=bodies,
        properties=props,
        flags=col(_H_FLAG, np.int32),
        sys_flags=col(_H_SYS_FLAG, np.int32),
        born_timestamps=col(_H_BORN_TS, np.int64),
        born_hosts=list(cols[_H_BORN_HOST]),
        born_ports=col(_H_BORN_PORT, np.int32),
        reconsume_times=col(_H_RECONSUME, np.int32),
        prepared_offsets=col(_H_PREPARED, np.int64),
    )


# --- writing redelivered records ------------------------------------------------------------------
def resolve_queue(
    store: MessageStore, topic: str, queue_id: str | int | None, cache: dict[str, int]
) -> int:
    """The queue a redelivered message goes to: its ``REAL_QID``, folded into the topic's queue
    count when the topic shrank.  Raises an :class:`RmqError` when the topic cannot take it
    (invalid name, missing with auto-creation off)."""
    nq = cache.get(topic)
    if nq is None:
        check_topic(topic, allow_system=True)
        cfg = store.topics.get_or_create(topic)
        nq = cache[topic] = max(cfg.write_queue_nums, cfg.read_queue_nums, 1)
    try:
        qid = int(queue_id) if queue_id is not None else 0
    except ValueError:
        qid = 0
    return qid if 0 <= qid < nq else qid % nq


def put_redelivered(
    store: MessageStore,
    src: StoredRecords,
    rows: list[int],
    topics: list[str],
    queue_ids: list[int],
    properties: list[dict[str, str]],
) -> PutResult:
    """Write records ``rows`` of ``src`` again, to ``topics``/``queue_ids`` with ``properties``, as
    ONE CommitLog write (one batch: visible together).  Topics must have been resolved with
    :func:`resolve_queue`."""
    return store.put_encoded(encode_redelivered(store, src, rows, topics, queue_ids, properties))


def encode_redelivered(
    store: MessageStore,
    src: StoredRecords,
    rows: list[int],
    topics: list[str],
    queue_ids: list[int],
    properties: list[dict[str, str]],
) -> EncodedBatch:
    """The batch :func:`put_redelivered` writes (the general path: decoded properties)."""
    encoded = [encode_properties(p) for p in properties]
    limit = L.PROPERTY_MAX_BYTES - (PROP_CRC_BYTES if store.config.append_prop_crc else 0)
    for i, e in enumerate(encoded):
        if len(e) > limit:
            raise MessageIllegalError(
                f"redelivered message properties are {len(e)} bytes; the limit is {limit}"
            )
    missing = [i for i, p in enumerate(properties) if L.P_UNIQ_KEY not in p]
    if missing:
        for i, uid in zip(missing, new_uniq_ids(len(missing))):
            properties[i][L.P_UNIQ_KEY] = uid
            encoded[i] = encode_properties(properties[i])
    idx = np.asarray(rows, dtype=np.int64)
    shared = topics[0] if topics.count(topics[0]) == len(topics) else None
    batch = encode_batch(
        shared if shared is not None else topics,
        queue_ids,
        [src.bodies[i] for i in rows],
        properties,
        encoded,
        flags=src.flags[idx],
        sys_flags=src.sys_flags[idx],
        born_timestamps=src.born_timestamps[idx],
        born_hosts=[src.born_hosts[i] for i in rows],
        born_ports=src.born_ports[idx],
        reconsume_times=src.reconsume_times[idx],
        prepared_offsets=src.prepared_offsets[idx],
        store_host=host_bytes(store.config.store_host),
        store_port=store.config.store_port,
        prop_crc=store.config.append_prop_crc,
    )
    return batch


# --- re-writing stored records by patching their bytes --------------------------------------------
# The hot path of delivery: the records of a round are copied out of the CommitLog in one buffer
# and re-assembled with numpy -- header patched (size, queue, store host), body copied, topic
# replaced, property segments dropped or kept as bytes, the service's own properties appended --
# with no per-message decode or encode.  Anything unusual (IPv6 hosts, a topic over 127 bytes,
# bytes that are not UTF-8, a record without REAL_TOPIC or UNIQ_KEY) makes :func:`parse_records`
# or :func:`encode_redelivery` return None and the caller takes the general path
# (:func:`read_records` and :func:`put_redelivered`), which writes the same properties.
_SEP, _KV_SEP = ord(L.PROPERTY_SEPARATOR), ord(L.NAME_VALUE_SEPARATOR)
_BODY_POS = HEADER_V4.itemsize  # BODY starts after BODYLEN (IPv4 hosts)
_SHORT_TOPIC_MAX = 127  # longer topics need MAGIC_V2 (a 2-byte TOPICLEN)
# below this many messages a round is cheaper decoded and encoded (numpy's per-call cost dominates)
PATCH_MIN_MSGS = 128
_RANK_HEAD, _RANK_BODY, _RANK_TOPIC, _RANK_PLEN, _RANK_PROP, _RANK_EXTRA, _RANK_CRC = range(7)


@dataclass
class ParsedRecords:
    """Stored records copied into ``buf`` (``starts`` within it), with their property segments
    located: segment ``i`` is ``buf[seg_start[i]:seg_end[i]]`` (its \\x02 at ``seg_end``) in
    record ``seg_rec[i]``, key index ``seg_key[i]`` into the keys asked for (-1: another key)."""

    u8: np.ndarray
    starts: np.ndarray
    head: np.ndarray  # HEADER_V4, one per record (a copy)
    seg_start: np.ndarray
    seg_end: np.ndarray
    seg_rec: np.ndarray
    seg_key: np.ndarray
    seg_value: np.ndarray  # start of the value (after \x01)
    keys: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.starts)

    def values(self, key: str) -> list[str | None] | None:
        """The value of ``key`` per record (the last one when repeated; None when absent or
        empty, as the decoder), or None when some value is not UTF-8."""
        segs = np.flatnonzero(self.seg_key == self.keys.index(key))
        out: list[str | None] = [None] * len(self)
        if len(segs) == 0:
            return out
        a, b = self.seg_value[segs], self.seg_end[segs]
        lens = b - a
        offs = np.zeros(len(segs) + 1, dtype=np.int64)
        np.cumsum(lens, out=offs[1:])
        data = self.u8[np.repeat(a - offs[:-1], lens) + np.arange(offs[-1], dtype=np.int64)]
        arr = pa.StringArray.from_buffers(
            len(segs), pa.py_buffer(offs.astype(np.int32)), pa.py_buffer(data)
        )
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid:
            return None
        for r, v in zip(self.seg_rec[segs].tolist(), arr.to_pylist()):
            out[r] = v or None
        return out


def record_sizes(store: MessageStore, phys: np.ndarray) -> np.ndarray:
    """TOTALSIZE of the records at CommitLog offsets ``phys`` (one gather per segment), -1 where
    no MAGIC_V1 record starts: outside the log, too close to a segment's end, another magic."""
    phys = np.asarray(phys, dtype=np.int64)
    out = np.full(len(phys), -1, dtype=np.int64)
    mfq = store.commitlog.mfq
    seg = phys // mfq.segment_bytes
    for s in np.unique(seg).tolist():
        mf = mfq.find(s * mfq.segment_bytes)
        if mf is None:
            continue
        rows = np.flatnonzero(seg == s)
        pos = phys[rows] - mf.from_offset
        end = min(len(mf.mm), mfq.segment_bytes)
        ok = (pos >= 0) & (pos + 8 <= end)
        head = np.frombuffer(mf.mm, dtype=np.uint8)[pos[ok][:, None] + np.arange(8)].view(">i4")
        size = head[:, 0].astype(np.int64)
        fits = (head[:, 1].view(">u4") == L.MAGIC_V1) & (size > 0) & (pos[ok] + size <= end)
        out[rows[ok][fits]] = size[fits]
    return out


def parse_records(
    store: MessageStore, phys: np.ndarray, sizes: np.ndarray, keys: tuple[str, ...]
) -> ParsedRecords | None:
    """Copy the records at ``phys`` and locate their property segments (vectorized), or None
    when one of them needs the general path."""
    phys = np.asarray(phys, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    n = len(phys)
    if n == 0:
        return None
    mfq = store.commitlog.mfq
    parts = []
    mf = None
    # runs of records that follow each other in one segment are copied as one slice
    ends = phys + sizes
    seg = phys // mfq.segment_bytes
    brk = np.flatnonzero((phys[1:] != ends[:-1]) | (seg[1:] != seg[:-1])) + 1
    for a, b in zip([0, *brk.tolist()], [*brk.tolist(), n]):
        offset, stop = int(phys[a]), int(ends[b - 1])
        if mf is None or not mf.from_offset <= offset < mf.end_offset:
            mf = mfq.find(offset)
            if mf is None:
                raise StoreError(f"CommitLog offset {offset} is outside the log")
            mm, base = mf.mm, mf.from_offset
        parts.append(mm[offset - base : stop - base])
    parts.append(_PAD)
    buf = b"".join(parts)
    u8 = np.frombuffer(buf, dtype=np.uint8)[: -len(_PAD)]
    starts = np.cumsum(sizes) - sizes
    if (sizes < _BODY_POS).any():
        return None
    heads = np.ndarray((len(u8) - _BODY_POS + 1,), dtype=HEADER_V4, buffer=buf, strides=(1,))
    head = heads[starts]
    if (
        (head["total_size"] != sizes).any()
        or (head["magic"] != L.MAGIC_V1).any()
        or (head["sys_flag"] & _HOSTS_V6).any()
    ):
        return None
    tpos = starts + _BODY_POS + head["body_len"].astype(np.int64)
    if (tpos + 3 > starts + sizes).any():
        return None
    ppos = tpos + 1 + u8[tpos]
    ps = ppos + 2
    pe = ps + ((u8[ppos].astype(np.int64) << 8) | u8[ppos + 1])
    if (pe != starts + sizes).any() or (u8[pe - 1] != _SEP).any():
        return None  # properties must be the record's end, each segment closed by \x02
    sep, seg_rec = _in_regions(np.flatnonzero(u8 == _SEP), ps, pe)
    kv, _ = _in_regions(np.flatnonzero(u8 == _KV_SEP), ps, pe)
    first = np.ones(len(sep), dtype=bool)
    first[1:] = seg_rec[1:] != seg_rec[:-1]
    prev = np.empty_like(sep)
    prev[0:1] = 0
    prev[1:] = sep[:-1] + 1
    seg_start = np.where(first, ps[seg_rec], prev)
    k = np.searchsorted(kv, seg_start)
    one = kv[np.minimum(k, len(kv) - 1)] if len(kv) else np.full(len(sep), -1)
    has_kv = (k < len(kv)) & (one < sep)
    one = np.where(has_kv, one, sep)
    key_len = one - seg_start
    # a key of up to 16 bytes is named by its length and its bytes as two words (zero-padded),
    # read as unaligned words straight from the buffer
    words = np.ndarray((len(u8) + len(_PAD) - 7,), dtype="<u8", buffer=buf, strides=(1,))
    klen = np.minimum(key_len, _KEY_BYTES)
    w0 = words[seg_start] & _WORD_MASKS[np.minimum(klen, 8)]
    w1 = words[seg_start + 8] & _WORD_MASKS[np.maximum(klen - 8, 0)]
    seg_key = np.full(len(sep), -1, dtype=np.int16)
    for i, (kl, k0, k1) in enumerate(_key_words(keys)):
        seg_key[has_kv & (key_len == kl) & (w0 == k0) & (w1 == k1)] = i
    return ParsedRecords(u8, starts, head, seg_start, sep, seg_rec, seg_key, one + 1, keys)


_KEY_BYTES = 16
_PAD = bytes(_KEY_BYTES)  # after the records, so that a key's words can be read past the end
_WORD_MASKS = np.array([(1 << (8 * i)) - 1 for i in range(8)] + [2**64 - 1], dtype=np.uint64)


@functools.lru_cache(maxsize=8)
def _key_words(keys: tuple[str, ...]) -> list[tuple[int, int, int]]:
    """(length, first word, second word) of each key, as :func:`parse_records` compares them."""
    out = []
    for key in keys:
        kb = key.encode()
        if len(kb) > _KEY_BYTES:
            raise ValueError(f"property key {key!r} is longer than {_KEY_BYTES} bytes")
        w = np.frombuffer(kb.ljust(_KEY_BYTES, b"\0"), dtype="<u8")
        out.append((len(kb), int(w[0]), int(w[1])))
    return out


def _in_regions(pos: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions inside one of the sorted, disjoint regions ``[starts, ends)``, and which."""
    region = np.searchsorted(starts, pos, side="right") - 1
    inside = (region >= 0) & (pos < ends[np.maximum(region, 0)])
    return pos[inside], region[inside]


class _LazyProperties(Sequence[dict[str, str]]):
    """The properties of an encoded batch's records, decoded only when asked for (nobody on the
    delivery path reads them; the batch carries them for its listeners)."""

    def __init__(self, buf: bytearray, starts: np.ndarray, ends: np.ndarray) -> None:
        self._buf, self._starts, self._ends = buf, starts.tolist(), ends.tolist()

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return decode_properties(bytes(self._buf[self._starts[i] : self._ends[i]]))


_SCRATCH = threading.local()  # per thread: the byte index of the last gather, reused
_SCRATCH_KEEP_LEN = 1 << 21  # index entries kept (16 MiB); bigger gathers get a fresh one


def gather_runs(pool: np.ndarray, starts: np.ndarray, lens: np.ndarray, total: int) -> bytearray:
    """``pool[starts[i] : starts[i] + lens[i]]`` for every i, concatenated (``total`` bytes).

    One index per output byte, built in place (a cumulative sum of steps: 1 inside a run, a jump
    at each run's start) in a per-thread buffer kept between calls, a few megabytes of output at
    a time: fresh multi-megabyte index arrays cost a page fault per 4 KiB, more than the gather."""
    out = bytearray(total)
    if total == 0:
        return out
    keep = lens > 0
    starts, lens = starts[keep].astype(np.int64), lens[keep].astype(np.int64)
    dest = np.frombuffer(out, dtype=np.uint8)
    ends = np.cumsum(lens)
    i, done = 0, 0
    while i < len(lens):
        j = max(i + 1, int(np.searchsorted(ends, done + _SCRATCH_KEEP_LEN, side="right")))
        stop = int(ends[j - 1])
        _gather_into(pool, starts[i:j], lens[i:j], dest[done:stop])
        i, done = j, stop
    return out


def _gather_into(pool: np.ndarray, starts: np.ndarray, lens: np.ndarray, dest: np.ndarray) -> None:
    total = len(dest)
    idx: np.ndarray | None = getattr(_SCRATCH, "idx", None)
    if idx is None or len(idx) < total:
        grown = min(2 * len(idx), _SCRATCH_KEEP_LEN) if idx is not None else 0
        idx = np.empty(max(total, grown), dtype=np.int64)
        if len(idx) <= _SCRATCH_KEEP_LEN:
            _SCRATCH.idx = idx
    step = idx[:total]
    step.fill(1)
    at = np.cumsum(lens) - lens
    step[0] = starts[0]
    step[at[1:]] = starts[1:] - (starts[:-1] + lens[:-1] - 1)
    np.cumsum(step, out=step)
    np.take(pool, step, out=dest, mode="clip")  # no bounds pass


def patch_redelivery(
    store: MessageStore,
    phys: np.ndarray,
    sizes: np.ndarray,
    keys: tuple[str, ...],
    drop: tuple[str, ...],
    extra: Callable[[], list[bytes]],
) -> EncodedBatch | None:
    """The records at ``phys``/``sizes`` re-written to their ``REAL_TOPIC``/``REAL_QID`` by
    patching their bytes (``keys``: the properties to find, at least :data:`DELIVERY_KEYS`;
    ``drop`` and ``extra()`` as :func:`encode_redelivery` takes them), or None when one of them
    needs the general path: unusual bytes, no real topic or unique id, the half topic as real
    topic, a real queue that cannot be resolved."""
    rec = parse_records(store, phys, sizes, keys)
    if rec is None:
        return None
    real, raw_qids, uniq = (rec.values(k) for k in (L.P_REAL_TOPIC, L.P_REAL_QID, L.P_UNIQ_KEY))
    tags, words = rec.values(L.P_TAGS), rec.values(L.P_KEYS)
    if real is None or raw_qids is None or uniq is None or tags is None or words is None:
        return None
    if None in real or L.TRANS_HALF_TOPIC in real or None in uniq:
        return None
    try:
        qids = resolve_queues(store, real, raw_qids, {})  # type: ignore[arg-type]
    except RmqError:
        return None  # the general path holds back what cannot be delivered
    return encode_redelivery(store, rec, drop, real, qids, extra(), tags, words, uniq)  # type: ignore[arg-type]


# the properties the delay and timer put hooks act on: a message without any of them passes
# through them unchanged
DELIVERY_REQUEST_KEYS = (
    L.P_DELAY, L.P_TIMER_DELIVER_MS, L.P_TIMER_DELAY_SEC, L.P_TIMER_DELAY_MS, "DELAY_SOURCE", "TIMER_SOURCE",
)  # fmt: skip
# a committed half's real message: its properties without the half's routing
_COMMIT_DROP = (L.P_REAL_TOPIC, L.P_REAL_QID, L.P_TRAN_MSG, _CRC_KEY)
_COMMIT_KEYS = (L.P_TAGS, L.P_KEYS, L.P_UNIQ_KEY) + _COMMIT_DROP


def commit_keys(hooked: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The properties :func:`encode_commits` parses (a lookup may parse them first)."""
    return _COMMIT_KEYS + tuple(k for k in hooked if k not in _COMMIT_KEYS)


def encode_commits(
    store: MessageStore,
    phys: np.ndarray,
    sizes: np.ndarray | None,
    hooked: tuple[str, ...] = (),
    parsed: ParsedRecords | None = None,
) -> EncodedBatch | None:
    """The real messages a commit of the halves at ``phys``/``sizes`` writes, made by patching the
    halves' bytes: topic and queue from ``REAL_TOPIC``/``REAL_QID``, those and ``TRAN_MSG``
    removed from the properties, SYSFLAG COMMIT, PREPAREDTRANSACTIONOFFSET the half's offset.
    None when a half needs the general path: unusual bytes, one of the properties ``hooked`` (a
    put hook must see it), a real queue out of range (the general path names the error).
    ``parsed``: the halves already parsed with :func:`commit_keys` (then ``sizes`` is unused)."""
    rec = parsed if parsed is not None else parse_records(store, phys, sizes, commit_keys(hooked))
    if rec is None:
        return None
    if hooked and np.isin(rec.seg_key, [rec.keys.index(k) for k in hooked]).any():
        return None
    real, raw_qids, uniq = (rec.values(k) for k in (L.P_REAL_TOPIC, L.P_REAL_QID, L.P_UNIQ_KEY))
    tags, words = rec.values(L.P_TAGS), rec.values(L.P_KEYS)
    if real is None or raw_qids is None or uniq is None or tags is None or words is None:
        return None
    if None in real or None in uniq or None in raw_qids:
        return None
    try:
        qids = np.array(raw_qids, dtype=np.int64)
    except ValueError:
        return None
    for t in set(real):
        cfg = store.topics.get_or_create(t)
        if ((qids < 0) | (qids >= max(cfg.write_queue_nums, cfg.read_queue_nums)))[np.asarray(real) == t].any():
            return None
    flags = (rec.head["sys_flag"] & ~L.TRANSACTION_MASK) | L.TRANSACTION_COMMIT_TYPE
    return encode_redelivery(
        store, rec, _COMMIT_DROP, real, qids, [b""] * len(rec), tags, words, uniq,  # type: ignore[arg-type]
        sys_flags=flags, prepared_offsets=np.asarray(phys, dtype=np.int64),
    )  # fmt: skip


def encode_redelivery(
    store: MessageStore,
    rec: ParsedRecords,
    drop: tuple[str, ...],
    topics: list[str],
    queue_ids: np.ndarray,
    extra: list[bytes],
    tags: list[str | None],
    keys: list[str | None],
    uniq_keys: list[str],
    sys_flags: np.ndarray | None = None,
    prepared_offsets: np.ndarray | None = None,
) -> EncodedBatch | None:
    """Records of ``rec`` re-written to ``topics``/``queue_ids``: property segments with a key in
    ``drop`` removed, ``extra`` (encoded properties) appended, SYSFLAG and PREPAREDTRANSACTIONOFFSET
    replaced when given; None when the general path must do it.  The bytes equal
    :func:`put_redelivered`'s up to the order of the properties."""
    n = len(rec)
    store_host = host_bytes(store.config.store_host)
    crc = store.config.append_prop_crc
    tfield: dict[str, bytes] = {}
    for t in set(topics):
        tb = t.encode("utf-8")
        if len(tb) > _SHORT_TOPIC_MAX:
            return None
        tfield[t] = bytes((len(tb),)) + tb
    if len(store_host) != 4:
        return None
    drop_ids = [rec.keys.index(k) for k in drop]
    keep = ~np.isin(rec.seg_key, drop_ids)
    seg_len = rec.seg_end - rec.seg_start + 1  # with its \x02
    kept_len = np.bincount(rec.seg_rec[keep], weights=seg_len[keep], minlength=n).astype(np.int64)
    extra_len = np.fromiter(map(len, extra), dtype=np.int64, count=n)
    plen = kept_len + extra_len + (PROP_CRC_BYTES if crc else 0)
    if (plen > L.PROPERTY_MAX_BYTES).any():
        return None
    blen = rec.head["body_len"].astype(np.int64)
    tf_list = [tfield[t] for t in topics]
    tf_len = np.fromiter(map(len, tf_list), dtype=np.int64, count=n)
    sizes = _BODY_POS + blen + tf_len + 2 + plen
    h = rec.head.copy()
    h["total_size"] = sizes
    h["queue_id"] = queue_ids
    h["queue_offset"] = 0
    h["physical_offset"] = 0
    h["store_timestamp"] = 0
    h["store_host"] = np.frombuffer(store_host, dtype="V4")[0]
    h["store_port"] = store.config.store_port
    if sys_flags is not None:
        h["sys_flag"] = sys_flags
    if prepared_offsets is not None:
        h["prepared_offset"] = prepared_offsets
    # the pool every output byte is gathered from: source records, new headers, topic fields,
    # PROPERTIESLEN fields, extra properties, the CRC placeholder
    tf_unique = list(tfield.values())
    tf_at = {}
    pos = len(rec.u8) + n * _BODY_POS
    for tf in tf_unique:
        tf_at[tf] = pos
        pos += len(tf)
    plen_at = pos
    extra_at = plen_at + 2 * n
    crc_at = extra_at + int(extra_len.sum())
    pool = np.concatenate(
        [
            rec.u8,
            h.view(np.uint8),
            np.frombuffer(b"".join(tf_unique), dtype=np.uint8),
            plen.astype(">u2").view(np.uint8),
            np.frombuffer(b"".join(extra), dtype=np.uint8),
            np.frombuffer(PROP_CRC_PLACEHOLDER, dtype=np.uint8),
        ]
    )
    r = np.arange(n, dtype=np.int64)
    ks = np.flatnonzero(keep)
    extra_start = extra_at + np.cumsum(extra_len) - extra_len
    fixed = [
        (_RANK_HEAD, len(rec.u8) + r * _BODY_POS, np.full(n, _BODY_POS)),
        (_RANK_BODY, rec.starts + _BODY_POS, blen),
        (_RANK_TOPIC, np.fromiter((tf_at[t] for t in tf_list), np.int64, n), tf_len),
        (_RANK_PLEN, plen_at + 2 * r, np.full(n, 2)),
        (_RANK_EXTRA, extra_start, extra_len),
    ]
    if crc:
        fixed.append((_RANK_CRC, np.full(n, crc_at), np.full(n, PROP_CRC_BYTES)))
    p_rec = np.concatenate([r] * len(fixed) + [rec.seg_rec[ks]])
    p_rank = np.concatenate([np.full(n, k) for k, _, _ in fixed] + [np.full(len(ks), _RANK_PROP)])
    p_start = np.concatenate([s for _, s, _ in fixed] + [rec.seg_start[ks]]).astype(np.int64)
    p_len = np.concatenate([ln for _, _, ln in fixed] + [seg_len[ks]]).astype(np.int64)
    order = np.lexsort((p_start, p_rank, p_rec))
    p_start, p_len = p_start[order], p_len[order]
    buf = gather_runs(pool, p_start, p_len, int(sizes.sum()))
    rel_pos = np.cumsum(sizes) - sizes
    props_end = rel_pos + sizes
    return EncodedBatch(
        buf=buf,
        rel_pos=rel_pos,
        sizes=sizes.astype(np.int32),
        store_ts_pos=np.full(n, POS_STORE_TIMESTAMP_V4, dtype=np.int64),
        queue_ids=np.asarray(queue_ids, dtype=np.int32),
        topics=topics,
        tags_codes=np.fromiter(map(tags_code, tags), dtype=np.int64, count=n),
        sys_flags=h["sys_flag"].astype(np.int32),
        keys=keys,
        uniq_keys=list(uniq_keys),
        properties=_LazyProperties(buf, props_end - plen, props_end),  # type: ignore[arg-type]
        prop_crc=crc,
    )


def resolve_queues(
    store: MessageStore, topics: list[str], queue_ids: list[str | None], cache: dict[str, int]
) -> np.ndarray:
    """:func:`resolve_queue` of many records (each distinct topic and queue text parsed once)."""
    for t in set(topics):
        if t not in cache:
            resolve_queue(store, t, 0, cache)
    parsed: dict[str | None, int] = {}
    for raw in set(queue_ids):
        try:
            parsed[raw] = int(raw) if raw is not None else 0
        except ValueError:
            parsed[raw] = 0
    n = len(topics)
    nq = np.fromiter(map(cache.__getitem__, topics), dtype=np.int64, count=n)
    q = np.fromiter(map(parsed.__getitem__, queue_ids), dtype=np.int64, count=n)
    return np.where((q >= 0) & (q < nq), q, q % nq)


# --- recovery: which sources were already delivered -----------------------------------------------
def scan_sources(store: MessageStore, start: int, key: str) -> list[str]:
    """Values of property ``key`` in every delivered record from CommitLog offset ``start`` (a
    record boundary).  Segments are searched for the key with ``mmap.find`` first; records are
    walked only where it occurs.  Records still routed through a system topic (they carry
    ``REAL_TOPIC``, which delivery removes) do not count."""
    marker = key.encode() + b"\x01"
    mfq = store.commitlog.mfq
    start = max(start, mfq.min_offset)
    hits_phys: list[int] = []
    hits_size: list[int] = []
    for mf in list(mfq.files):
        if mf.end_offset <= start:
            continue
        pos = max(0, start - mf.from_offset)
        limit = mf.wrote_position
        mm = mf.mm
        last = mm.rfind(marker, pos, limit)
        if last < 0:
            continue
        while pos + 8 <= limit and pos <= last:
            size, magic = _RECORD_HEAD.unpack_from(mm, pos)
            if magic not in (L.MAGIC_V1, L.MAGIC_V2) or size <= 0 or pos + size > limit:
                break  # a BLANK filler or the end of the written bytes
            if mm.find(marker, pos, pos + size) >= 0:
                hits_phys.append(mf.from_offset + pos)
                hits_size.append(size)
            pos += size
    if not hits_phys:
        return []
    src = read_records(store, np.asarray(hits_phys), np.asarray(hits_size))
    # a key found only in a body has no value here
    return [p[key] for p in src.properties if key in p and L.P_REAL_TOPIC not in p]
