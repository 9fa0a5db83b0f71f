"""Re-writing stored records by patching their bytes in bulk: :func:`parse_records` finds the
header fields and the property values a re-write needs, :func:`encode_redelivery` gathers the
unchanged runs of every record around the new topic, queue, sysflag and properties with numpy.
The same bytes as decoding and encoding each record again (``tests/store/test_put_paths.py``)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from rmq_spark.errors import RmqError, StoreError
from rmq_spark.services.redelivery.records import _HOSTS_V6
from rmq_spark.services.redelivery.rewrite import resolve_queues
from rmq_spark.store import layout as L
from rmq_spark.store.encoded import EncodedBatch
from rmq_spark.store.message import host_bytes, tags_code
from rmq_spark.store.properties import PROP_CRC_BYTES, PROP_CRC_PLACEHOLDER, decode_properties
from rmq_spark.store.record import HEADER_V4, POS_STORE_TIMESTAMP_V4

if TYPE_CHECKING:
    from rmq_spark.store.store import MessageStore

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
        empty, as the decoder), or None when some value is not UTF-8.  Made once per key (the
        list is shared: callers do not change it)."""
        memo = self.__dict__.setdefault("_values", {})
        if key not in memo:
            memo[key] = self._values_of(key)
        return memo[key]

    def _values_of(self, key: str) -> list[str | None] | None:
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
        for r, v in zip(self.seg_rec[segs].tolist(), arr.to_pylist(), strict=True):
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
    for a, b in zip([0, *brk.tolist()], [*brk.tolist(), n], strict=True):
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


def _in_regions(
    pos: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
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

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
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
    extra: Callable[[ParsedRecords], list[bytes]],
) -> EncodedBatch | None:
    """The records at ``phys``/``sizes`` re-written to their ``REAL_TOPIC``/``REAL_QID`` by
    patching their bytes (``keys``: the properties to find, at least :data:`DELIVERY_KEYS`;
    ``drop`` and ``extra(parsed records)`` as :func:`encode_redelivery` takes them), or None when one of them
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
    return encode_redelivery(store, rec, drop, real, qids, extra(rec), tags, words, uniq)  # type: ignore[arg-type]


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
        properties=_LazyProperties(buf, props_end - plen, props_end),
        prop_crc=crc,
    )
