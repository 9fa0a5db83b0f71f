"""ScheduleService: RocketMQ's delay levels, delivered exactly once across crashes.

A message with property ``DELAY=n`` (n > 0) is stored in ``SCHEDULE_TOPIC_XXXX`` queue ``n - 1``
(a level above the maximum is clamped to it) with ``REAL_TOPIC``/``REAL_QID``; the store gives its
ConsumeQueue unit tagsCode = store time + the level's delay.  One cursor per level walks that queue
in order and re-writes every due message to its real topic and queue (``DELAY`` and ``REAL_*``
removed, ``TIMER_OUT_MS`` = its delivery time, the tags code computed from ``TAGS`` again), as one
CommitLog write per batch (:func:`put_redelivered`).

Exactly once: every delivered message carries ``DELAY_SOURCE = "{queueId}:{queueOffset}"`` of the
schedule record it came from.  Progress is saved to ``config/delayOffset.json`` (atomically) with
the CommitLog end at the time; on start the CommitLog is scanned from there
(:func:`scan_sources`) and each cursor moves past every source already delivered, so a crash at
any moment neither loses nor repeats a delivery (RocketMQ 4.x saved progress every 10 s and
redelivered after a crash).  A failed write leaves the cursor where it was and is retried after a
back-off (100 ms doubling to 10 s); a message whose real topic cannot take it (topic missing with
auto-creation off) holds back its own level only.

``config/delayOffset.json`` (RocketMQ's ``DelayOffsetSerializeWrapper`` plus two keys)::

    ┌───────────────────┬────────────────────────────────────────────────────────────────┐
    │ offsetTable       │ {"level": next ConsumeQueue offset to deliver, ...}           │
    │ commitLogOffset   │ CommitLog end when the table was taken: every delivery not    │
    │                   │ counted in the table lies at or after it (recovery scans here) │
    │ dataVersion       │ {"counter": n, "stateVersion": 0, "timestamp": ms}             │
    │ version           │ 1                                                              │
    └───────────────────┴────────────────────────────────────────────────────────────────┘

The module also holds what the timer service shares: reading stored records in bulk
(:func:`read_records`), writing redelivered ones (:func:`put_redelivered`), the recovery scan,
the staged checkpoint writer and the service thread.
"""

from __future__ import annotations

import functools
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from rmq_spark.errors import MessageIllegalError, RmqError, StoreError
from rmq_spark.store import layout as L
from rmq_spark.store.clock import Clock
from rmq_spark.store.dispatch import DispatchBatch
from rmq_spark.store.jsonfile import read_json, write_json_atomic
from rmq_spark.store.message import (
    Message,
    encode_properties,
    host_bytes,
    new_uniq_ids,
    tags_code,
)
from rmq_spark.store.record import (
    HEADER_V4,
    POS_STORE_TIMESTAMP_V4,
    PROP_CRC_BYTES,
    PROP_CRC_PLACEHOLDER,
    PROP_CRC_PREFIX,
    EncodedBatch,
    decode_record,
    encode_batch,
)
from rmq_spark.store.validation import check_topic

if TYPE_CHECKING:
    from rmq_spark.core import BrokerConfig
    from rmq_spark.store.store import MessageStore, PutResult

__all__ = [
    "P_DELAY_SOURCE",
    "ParsedRecords",
    "ScheduleService",
    "StoredRecords",
    "encode_redelivered",
    "encode_redelivery",
    "gather_runs",
    "parse_records",
    "put_redelivered",
    "read_records",
    "resolve_queue",
    "resolve_queues",
    "scan_sources",
]

logger = logging.getLogger(__name__)

P_DELAY_SOURCE = "DELAY_SOURCE"  # "{scheduleQueueId}:{queueOffset}" of the record delivered
# what a delivered message loses: routing of the system topic and the client's delay request
DROPPED_ON_DELIVERY = (
    L.P_DELAY,
    L.P_REAL_TOPIC,
    L.P_REAL_QID,
    L.P_TIMER_DELIVER_MS,
    L.P_TIMER_DELAY_SEC,
    L.P_TIMER_DELAY_MS,
)
_TIMER_PROPS = (L.P_TIMER_DELIVER_MS, L.P_TIMER_DELAY_SEC, L.P_TIMER_DELAY_MS)
_UNCONSUMABLE = (L.TRANSACTION_PREPARED_TYPE, L.TRANSACTION_ROLLBACK_TYPE)
BACKOFF_FIRST_MS = 100  # DELAY_FOR_A_WHILE
BACKOFF_MAX_MS = 10_000  # DELAY_FOR_A_PERIOD
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
_CRC_KEY = PROP_CRC_PREFIX[:-1].decode()
# what a delivery reads from a record's properties, and what it removes before adding its own
DELIVERY_KEYS = (L.P_REAL_TOPIC, L.P_REAL_QID, L.P_TAGS, L.P_KEYS, L.P_UNIQ_KEY, _CRC_KEY)
DELIVERY_KEYS += tuple(k for k in DROPPED_ON_DELIVERY if k not in DELIVERY_KEYS)
_SCHEDULE_KEYS = DELIVERY_KEYS + (L.P_TIMER_OUT_MS, P_DELAY_SOURCE)
DELIVERY_DROP = DROPPED_ON_DELIVERY + (_CRC_KEY,)  # and the record CRC (written again if on)
_SCHEDULE_DROP = DELIVERY_DROP + (L.P_TIMER_OUT_MS, P_DELAY_SOURCE)
_SCHEDULE_EXTRA = f"{L.P_TIMER_OUT_MS}\x01%d\x02{P_DELAY_SOURCE}\x01%d:%d\x02".encode()
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
        props.append(_decode_props(mm[q + 2 : q + 2 + ((mm[q] << 8) | mm[q + 1])]))
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


def _decode_props(raw: bytes) -> dict[str, str]:
    """``message.decode_properties``'s rule (a segment counts with a non-empty key before its
    first \\x01 and a non-empty value after it; the record CRC is no property), twice as fast."""
    out: dict[str, str] = {}
    for seg in raw.decode("utf-8", "replace").split(L.PROPERTY_SEPARATOR):
        k, _, v = seg.partition(L.NAME_VALUE_SEPARATOR)
        if k and v:
            out[k] = v
    out.pop(_CRC_KEY, None)
    return out


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
    for offset, size in zip(phys.tolist(), sizes.tolist()):
        if mf is None or not mf.from_offset <= offset < mf.end_offset:
            mf = mfq.find(offset)
            if mf is None:
                raise StoreError(f"CommitLog offset {offset} is outside the log")
            mm, base = mf.mm, mf.from_offset
        parts.append(mm[offset - base : offset - base + size])
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
        return _decode_props(bytes(self._buf[self._starts[i] : self._ends[i]]))


_SCRATCH = threading.local()  # per thread: the byte index of the last gather, reused
_SCRATCH_KEEP_LEN = 1 << 21  # index entries kept (16 MiB); bigger gathers get a fresh one


def gather_runs(pool: np.ndarray, starts: np.ndarray, lens: np.ndarray, total: int) -> bytearray:
    """``pool[starts[i] : starts[i] + lens[i]]`` for every i, concatenated (``total`` bytes).

    One index per output byte, built in place (a cumulative sum of steps: 1 inside a run, a jump
    at each run's start) in a per-thread buffer kept between calls: fresh multi-megabyte index
    arrays every round cost a page fault per 4 KiB, a third of a delivery's CPU at big rounds."""
    out = bytearray(total)
    if total == 0:
        return out
    keep = lens > 0
    starts, lens = starts[keep], lens[keep]
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
    np.take(pool, step, out=np.frombuffer(out, dtype=np.uint8), mode="clip")  # no bounds pass
    return out


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
) -> EncodedBatch | None:
    """Records of ``rec`` re-written to ``topics``/``queue_ids``: property segments with a key in
    ``drop`` removed, ``extra`` (encoded properties) appended; None when the general path must
    do it.  The bytes equal :func:`put_redelivered`'s up to the order of the properties."""
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


# --- checkpoints and the service thread -----------------------------------------------------------
class StagedCheckpoint:
    """Writes a service's progress file every ``interval_ms`` when it changed, and only once the
    CommitLog is durable up to the snapshot's ``commitLogOffset`` (so the deliveries it counts
    survive an OS crash): the write waits for the store's flush, and forces one only after three
    intervals.  Driven by ``tick`` from the service's rounds (tests, FakeClock), or by its own
    thread once ``start`` is called, so that fsyncs never stall a delivery round."""

    def __init__(
        self,
        store: MessageStore,
        path: str,
        interval_ms: int,
        snapshot: Callable[[], dict[str, Any]],
    ) -> None:
        self.store = store
        self.path = path
        self.interval_ms = interval_ms
        self._snapshot = snapshot  # takes the service's lock
        self._staged: dict[str, Any] | None = None
        self._staged_ms = 0
        self._offered_ms: int | None = None
        self._written: dict[str, Any] | None = None
        self._version = 0
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self, now_ms: int) -> None:
        """One step without a thread: write what is staged and durable, stage a new snapshot."""
        if self._thread is not None:
            return
        if self._staged is not None:
            durable = self.store.commitlog.flushed_offset >= self._staged["commitLogOffset"]
            if durable or now_ms - self._staged_ms >= 3 * self.interval_ms:
                self._write(self._staged)
                self._staged = None
        if self._staged is None and (
            self._offered_ms is None or now_ms - self._offered_ms >= self.interval_ms
        ):
            self._offered_ms = now_ms
            snap = self._snapshot()
            if snap != self._written:
                self._staged, self._staged_ms = snap, now_ms

    def start(self, name: str) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._thread = None

    def _run(self) -> None:
        interval_s = self.interval_ms / 1000
        while not self._stop.wait(interval_s):
            if self.store.closed:
                return
            try:
                snap = self._snapshot()
                if snap == self._written:
                    continue
                waited = 0.0
                while (
                    self.store.commitlog.flushed_offset < snap["commitLogOffset"]
                    and waited < 3 * interval_s
                ):
                    if self._stop.wait(0.05):
                        return
                    waited += 0.05
                self._write(snap)
            except Exception:  # noqa: BLE001 - the next interval tries again
                if self.store.closed:
                    return
                logger.exception("checkpoint %s not written", self.path)

    def write_now(self) -> None:
        self._staged = None
        self._write(self._snapshot())

    def _write(self, snap: dict[str, Any]) -> None:
        with self._write_lock:
            if self.store.commitlog.flushed_offset < snap["commitLogOffset"]:
                self.store.commitlog.flush()
            self._version += 1
            data = dict(snap)
            data["dataVersion"] = {
                "counter": self._version,
                "stateVersion": 0,
                "timestamp": self.store.clock.now_ms(),
            }
            write_json_atomic(self.path, data)
            self._written = snap


class ServiceThread:
    """Runs ``round_fn`` now and again: after each round it sleeps ``wait_fn()`` ms or until
    :meth:`wake` (a new message arrived).  Rounds start at least ``min_gap_ms`` apart, so that
    a steady trickle of due messages is written a few ms' worth at a time rather than one
    write each (a write has a fixed cost of some hundred microseconds)."""

    def __init__(
        self,
        name: str,
        round_fn: Callable[[], object],
        wait_fn: Callable[[], int],
        closed: Callable[[], bool],
        min_gap_ms: int = 0,
    ) -> None:
        self.name = name
        self.min_gap_s = min_gap_ms / 1000
        self._round = round_fn
        self._wait = wait_fn
        self._closed = closed
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set() and not self._closed():
            self._wake.clear()
            started = time.monotonic()
            try:
                self._round()
                wait_ms = self._wait()
            except Exception:  # noqa: BLE001 - a service thread must survive a bad round
                if self._closed():
                    return
                logger.exception("%s: delivery round failed", self.name)
                wait_ms = 1000
            if wait_ms > 0:
                self._wake.wait(wait_ms / 1000)
            gap_s = started + self.min_gap_s - time.monotonic()
            if gap_s > 0:
                self._stop.wait(gap_s)


def backoff_ms(previous_ms: int) -> int:
    return min(BACKOFF_MAX_MS, previous_ms * 2) if previous_ms else BACKOFF_FIRST_MS


# --- the service ----------------------------------------------------------------------------------
@dataclass
class ScheduleStats:
    delivered: int = 0
    discarded: int = 0  # real topic is the transaction half topic, or no REAL_TOPIC at all
    failed_puts: int = 0
    reconciled: int = 0  # sources found already delivered at start or after a failed put
    patched: int = 0  # delivered through the byte-patching path (the rest: decoded, encoded)
    busy_s: float = 0.0  # CPU time (this thread) of rounds that delivered something
    per_level: dict[int, int] = field(default_factory=dict)


class DeliveryLifecycle:
    """Start, stop and checkpoint of a delivery service (delay levels, timer): a delivery thread
    woken when a message of ``TOPIC`` is stored, and a staged checkpoint on its own thread."""

    TOPIC: str = ""
    CHECKPOINT_THREAD = ""
    _thread: ServiceThread
    _checkpoint: StagedCheckpoint
    store: MessageStore

    def start(self) -> None:
        self._thread.start()
        self._checkpoint.start(self.CHECKPOINT_THREAD)

    def shutdown(self) -> None:
        """Stop the threads and save progress (a final checkpoint)."""
        self._thread.stop()
        self._checkpoint.stop()
        if not self.store.closed:
            self._checkpoint.write_now()

    def crash(self) -> None:
        """Tests: stop as kill -9 would (no final checkpoint)."""
        self._thread.stop()
        self._checkpoint.stop()

    def checkpoint(self) -> None:
        """Save progress now."""
        self._checkpoint.write_now()

    def _on_dispatch(self, batch: DispatchBatch) -> None:
        if self.TOPIC in batch.topics:
            self._thread.wake()


class ScheduleService(DeliveryLifecycle):
    """Delay levels (see the module docstring).  ``run_once`` delivers what is due at
    ``clock.now_ms()``; ``start`` runs it on a thread woken by new schedule messages.

    ``batch_max_msgs``: messages per CommitLog write; ``checkpoint_interval_ms``: how often
    progress is saved; ``round_gap_ms``: least time between the thread's rounds."""

    TOPIC = L.SCHEDULE_TOPIC
    CHECKPOINT_THREAD = "rmq-schedule-checkpoint"

    def __init__(
        self,
        store: MessageStore,
        config: BrokerConfig,
        clock: Clock,
        *,
        batch_max_msgs: int = 1024,
        checkpoint_interval_ms: int = 1000,
        round_gap_ms: int = 5,
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.levels_ms: list[int] = list(config.store.delay_levels_ms)
        self.batch_max_msgs = batch_max_msgs
        self.patch_min_msgs = PATCH_MIN_MSGS
        self.wait_max_ms = max(10, int(config.timer_precision_ms))
        self.stats = ScheduleStats()
        self.last_error: BaseException | None = None
        self.offsets: dict[int, int] = {}  # schedule queueId (level - 1) -> next queue offset
        self._retry_at_ms: dict[int, int] = {}
        self._backoff_ms: dict[int, int] = {}
        self._lock = threading.RLock()
        path = os.path.join(store.root, L.CONFIG_DIR, L.DELAY_OFFSET_FILE)
        self._checkpoint = StagedCheckpoint(
            store, path, checkpoint_interval_ms, self._locked_snapshot
        )
        self._thread = ServiceThread(
            "rmq-schedule", self.run_once, self.next_wait_ms, lambda: store.closed, round_gap_ms
        )
        store.add_listener(self._on_dispatch)
        data = read_json(path) or {}
        self._load(data)
        pending = any(off < self._queue_end(q) for q, off in self.offsets.items())
        if pending:  # else no delivery can be missing from the saved progress
            self.stats.reconciled += self._reconcile(int(data.get("commitLogOffset", 0)))

    # --- put hook ---------------------------------------------------------------------------------
    def transform(self, msg: Message) -> Message:
        """A message with ``DELAY=n > 0`` goes to the schedule topic, queue ``min(n, max) - 1``.
        Timer properties on it are dropped: the level wins (as ``HookUtils``)."""
        p = msg.properties
        if P_DELAY_SOURCE in p:  # only the service may claim a delivery
            p = {k: v for k, v in p.items() if k != P_DELAY_SOURCE}
            msg = replace(msg, properties=p)
        raw = p.get(L.P_DELAY)
        if raw is None or msg.topic in (L.SCHEDULE_TOPIC, L.TIMER_TOPIC):
            return msg
        if msg.sys_flag & L.TRANSACTION_MASK in _UNCONSUMABLE:
            return msg  # a half message is delayed when it is committed
        try:
            level = int(raw)
        except ValueError:
            raise MessageIllegalError(
                f"property DELAY={raw!r} is not an integer delay level"
            ) from None
        if level <= 0:
            return msg
        level = min(level, len(self.levels_ms))
        props = {k: v for k, v in p.items() if k not in _TIMER_PROPS}
        props[L.P_DELAY] = str(level)
        props[L.P_REAL_TOPIC] = msg.topic
        props[L.P_REAL_QID] = str(msg.queue_id)
        return replace(msg, topic=L.SCHEDULE_TOPIC, queue_id=level - 1, properties=props)

    # --- state ------------------------------------------------------------------------------------
    def _load(self, data: dict[str, Any]) -> None:
        table = data.get("offsetTable") or {}
        for q in range(len(self.levels_ms)):
            cq = self.store.consume_queue(L.SCHEDULE_TOPIC, q)
            lo, hi = (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)
            saved = int(table.get(str(q + 1), lo))
            self.offsets[q] = min(max(saved, lo), hi)  # correctDelayOffset

    def _queue_end(self, q: int) -> int:
        cq = self.store.consume_queue(L.SCHEDULE_TOPIC, q)
        return cq.max_offset if cq is not None else 0

    def _reconcile(self, start: int) -> int:
        """Move each cursor past the sources delivered at CommitLog offset >= ``start``."""
        moved = 0
        for value in scan_sources(self.store, start, P_DELAY_SOURCE):
            q_text, _, off_text = value.partition(":")
            if not (q_text.isdigit() and off_text.isdigit()):
                continue
            q, off = int(q_text), int(off_text)
            if q in self.offsets and off >= self.offsets[q]:
                moved += off + 1 - self.offsets[q]
                self.offsets[q] = off + 1
        return moved

    def _locked_snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        return {
            "offsetTable": {str(q + 1): off for q, off in sorted(self.offsets.items())},
            "commitLogOffset": self.store.commitlog.max_offset,
            "version": 1,
        }

    # --- delivery ---------------------------------------------------------------------------------
    def run_once(self) -> int:
        """Deliver every message due at ``clock.now_ms()``; returns how many were delivered."""
        with self._lock:
            began = time.thread_time()
            now = self.clock.now_ms()
            total = 0
            while True:
                plan = self._plan(now)
                if not plan:
                    break
                n, more = self._deliver(plan, now)
                total += n
                if not more:
                    break
            self._checkpoint.tick(now)
            if total:
                self.stats.busy_s += time.thread_time() - began
            return total

    def _plan(self, now: int) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
        """Per level: (queueId, first offset, units, deliver times) of the due prefix."""
        plan = []
        budget = self.batch_max_msgs
        for q, delay in enumerate(self.levels_ms):
            if budget <= 0:
                break
            retry_at = self._retry_at_ms.get(q)
            if retry_at is not None:
                if retry_at > now:
                    continue
                del self._retry_at_ms[q]
            cq = self.store.consume_queue(L.SCHEDULE_TOPIC, q)
            if cq is None:
                continue
            start = max(self.offsets.get(q, 0), cq.min_offset)
            hi = cq.max_offset
            if start >= hi:
                continue
            units = cq.units(start, min(hi, start + budget))
            ts = units["tags_code"].astype(np.int64)
            late = ts > now + delay  # the clock went back: deliver now (correctDeliverTimestamp)
            not_due = (ts > now) & ~late
            k = int(np.argmax(not_due)) if not_due.any() else len(units)
            if k == 0:
                continue
            plan.append((q, start, units[:k], np.where(late[:k], now, ts[:k])))
            budget -= k
        return plan

    def _deliver(
        self, plan: list[tuple[int, int, np.ndarray, np.ndarray]], now: int
    ) -> tuple[int, bool]:
        """Deliver the planned prefixes as one write.  Returns (delivered, maybe more due)."""
        phys = np.concatenate([u["offset"] for _, _, u, _ in plan]).astype(np.int64)
        sizes = np.concatenate([u["size"] for _, _, u, _ in plan]).astype(np.int64)
        taken = len(phys)
        batch = self._fast_batch(plan, phys, sizes)
        if batch is not None:  # every planned message goes
            ends = {q: start + len(units) for q, start, units, _ in plan}
            counts = {q: len(units) for q, _, units, _ in plan}
            return self._write(plan, batch, None, ends, counts, now, taken)
        src = read_records(self.store, phys, sizes)
        rows: list[int] = []
        topics: list[str] = []
        qids: list[int] = []
        props: list[dict[str, str]] = []
        ends: dict[int, int] = {}
        counts: dict[int, int] = {}
        cache: dict[str, int] = {}
        row = 0
        for q, start, units, deliver in plan:
            end = start
            for j, deliver_ms in enumerate(deliver.tolist()):
                i = row + j
                p = src.properties[i]
                real = p.get(L.P_REAL_TOPIC)
                if real is None or real == L.TRANS_HALF_TOPIC:
                    logger.warning(
                        "schedule queue %d offset %d: discarded (real topic %r)", q, start + j, real
                    )
                    self.stats.discarded += 1
                    end = start + j + 1
                    continue
                try:
                    qid = resolve_queue(self.store, real, p.get(L.P_REAL_QID), cache)
                except RmqError as e:
                    self._hold(q, now, e)  # this level waits; the others go on
                    break
                p = {k: v for k, v in p.items() if k not in DROPPED_ON_DELIVERY}
                p[L.P_TIMER_OUT_MS] = str(deliver_ms)
                p[P_DELAY_SOURCE] = f"{q}:{start + j}"
                rows.append(i)
                topics.append(real)
                qids.append(qid)
                props.append(p)
                counts[q] = counts.get(q, 0) + 1
                end = start + j + 1
            ends[q] = end
            row += len(units)
        general = (src, rows, topics, qids, props) if rows else None
        return self._write(plan, None, general, ends, counts, now, taken)

    def _write(
        self,
        plan: list[tuple[int, int, np.ndarray, np.ndarray]],
        batch: EncodedBatch | None,
        general: tuple[StoredRecords, list[int], list[str], list[int], list[dict[str, str]]] | None,
        ends: dict[int, int],
        counts: dict[int, int],
        now: int,
        taken: int,
    ) -> tuple[int, bool]:
        """Write ``batch`` (or encode ``general``) and move the cursors to ``ends``.  Returns
        (delivered, maybe more due); a failed write holds every planned level."""
        if batch is not None or general is not None:
            before = self.store.commitlog.max_offset
            try:
                if batch is None:
                    assert general is not None
                    batch = encode_redelivered(self.store, *general)
                self._put(batch)
            except Exception as e:  # noqa: BLE001 - retried after a back-off, never skipped
                self.stats.failed_puts += 1
                for q, _, _, _ in plan:
                    self._hold(q, now, e)
                self.stats.reconciled += self._reconcile(before)  # part of it may have landed
                return 0, False
        for q, end in ends.items():
            self.offsets[q] = max(self.offsets.get(q, 0), end)
            if counts.get(q) and q not in self._retry_at_ms:
                self._backoff_ms.pop(q, None)
        for q, c in counts.items():
            self.stats.per_level[q + 1] = self.stats.per_level.get(q + 1, 0) + c
        n = len(batch) if batch is not None else 0
        self.stats.delivered += n
        self.stats.patched += n if general is None else 0
        return n, taken >= self.batch_max_msgs

    def _fast_batch(
        self, plan: list[tuple[int, int, np.ndarray, np.ndarray]], phys: np.ndarray, sizes: np.ndarray
    ) -> EncodedBatch | None:
        """The planned messages re-written by patching their bytes (:func:`encode_redelivery`),
        or None when one of them needs the general path (discarded, held, unusual bytes)."""
        if len(phys) < self.patch_min_msgs:
            return None
        rec = parse_records(self.store, phys, sizes, _SCHEDULE_KEYS)
        if rec is None:
            return None
        real, raw_qids, uniq = (rec.values(k) for k in (L.P_REAL_TOPIC, L.P_REAL_QID, L.P_UNIQ_KEY))
        tags, keys = rec.values(L.P_TAGS), rec.values(L.P_KEYS)
        if real is None or raw_qids is None or uniq is None or tags is None or keys is None:
            return None
        if None in real or L.TRANS_HALF_TOPIC in real or None in uniq:
            return None
        try:
            qids = resolve_queues(self.store, real, raw_qids, {})  # type: ignore[arg-type]
        except RmqError:
            return None  # the general path holds that level alone
        extra: list[bytes] = []
        for q, start, _, deliver in plan:
            extra += [_SCHEDULE_EXTRA % (d, q, start + j) for j, d in enumerate(deliver.tolist())]
        return encode_redelivery(
            self.store, rec, _SCHEDULE_DROP, real, qids, extra, tags, keys, uniq  # type: ignore[arg-type]
        )

    def _put(self, batch: EncodedBatch) -> None:
        self.store.put_encoded(batch)

    def _hold(self, q: int, now: int, error: BaseException) -> None:
        wait = self._backoff_ms[q] = backoff_ms(self._backoff_ms.get(q, 0))
        self._retry_at_ms[q] = now + wait
        self.last_error = error
        logger.warning(
            "delay level %d: delivery failed (%s); retrying in %d ms", q + 1, error, wait
        )

    def next_due_ms(self) -> int | None:
        """When the next delivery is due (a retry time counts), None when nothing is waiting."""
        with self._lock:
            best: int | None = None
            now = self.clock.now_ms()
            for q, delay in enumerate(self.levels_ms):
                cq = self.store.consume_queue(L.SCHEDULE_TOPIC, q)
                if cq is None:
                    continue
                off = max(self.offsets.get(q, 0), cq.min_offset)
                if off >= cq.max_offset:
                    continue
                ts = int(cq.units(off, off + 1)["tags_code"][0])
                due = now if ts > now + delay else ts
                due = max(due, self._retry_at_ms.get(q, 0))
                best = due if best is None else min(best, due)
            return best

    def next_wait_ms(self) -> int:
        due = self.next_due_ms()
        if due is None:
            return self.wait_max_ms
        return max(0, min(self.wait_max_ms, due - self.clock.now_ms()))
