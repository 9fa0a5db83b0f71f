"""Bulk reads of a queue range into Arrow, vectorized with numpy over the mapped files.

:func:`read_queue_arrow` turns ConsumeQueue units ``[start, end)`` into a ``pyarrow.RecordBatch``
with the Spark source schema: fixed header fields are gathered with numpy at all record positions
at once; bodies and properties become Arrow ``binary_view`` arrays whose views point into the
mapped CommitLog, and one C++ cast copies them out.  No Python work per message.

:class:`StoreReader` opens a store directory read-only, so that another process (a Spark
executor) can read while the broker appends.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq_spark.errors import StoreError
from rmq_spark.store import layout as L
from rmq_spark.store.consumequeue import CQ_UNIT, ConsumeQueue
from rmq_spark.store.mapped import MappedFileQueue
from rmq_spark.store.message import hex_rows

TS = pa.timestamp("us", tz="UTC")
SOURCE_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("queueId", pa.int32()),
        pa.field("queueOffset", pa.int64()),
        pa.field("msgId", pa.string()),
        pa.field("tags", pa.string()),
        pa.field("keys", pa.string()),
        pa.field("body", pa.binary()),
        pa.field("properties", pa.map_(pa.string(), pa.string())),
        pa.field("bornTimestamp", TS),
        pa.field("storeTimestamp", TS),
        pa.field("deliverTimestamp", TS),
        pa.field("reconsumeTimes", pa.int32()),
        pa.field("transactionId", pa.string()),
        pa.field("commitLogOffset", pa.int64()),
    ]
)


def empty_batch(columns: Sequence[str] | None = None) -> pa.RecordBatch:
    fields = [f for f in SOURCE_SCHEMA if columns is None or f.name in columns]
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in fields], schema=pa.schema(fields))


def _at(buf: np.ndarray, dtype: str) -> np.ndarray:
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


def _segment_fields(mm_buf: np.ndarray, pos: np.ndarray, topic_field_bytes: int, topic_len: int) -> dict:
    """Header fields and body/properties ranges of the records at ``pos`` of one segment."""
    sys_flag = _gather(mm_buf, pos + 36, 4, ">i4").astype(np.int32)
    adj_b = np.where(sys_flag & L.FLAG_BORNHOST_V6, 12, 0).astype(np.int64)
    adj_s = np.where(sys_flag & L.FLAG_STOREHOST_V6, 12, 0).astype(np.int64)
    born_ts = _gather(mm_buf, pos + 40, 8, ">i8").astype(np.int64)
    store_ts = _gather(mm_buf, pos + 56 + adj_b, 8, ">i8").astype(np.int64)
    reconsume = _gather(mm_buf, pos + 72 + adj_b + adj_s, 4, ">i4").astype(np.int32)
    body_len = _gather(mm_buf, pos + 84 + adj_b + adj_s, 4, ">i4").astype(np.int64)
    body_start = pos + 88 + adj_b + adj_s
    props_len_pos = body_start + body_len + topic_field_bytes + topic_len
    props_len = _gather(mm_buf, props_len_pos, 2, ">u2").astype(np.int64)
    return {
        "sys_flag": sys_flag,
        "born_ts": born_ts,
        "store_ts": store_ts,
        "reconsume": reconsume,
        "body_start": body_start,
        "body_len": body_len,
        "props_start": props_len_pos + 2,
        "props_len": props_len,
    }


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


class ParsedProperties:
    """RocketMQ property strings (``k\\x01v\\x02...``) parsed for a whole column at once.

    The string bytes stay in one Arrow buffer; separators are found with numpy, and keys and
    values become ``binary_view`` arrays pointing into that buffer.  A segment counts only with
    a non-empty key and a non-empty value (``string2messageProperties``); the record CRC
    (``__CRC32#``, the last 20 bytes when present) is not a property."""

    def __init__(self, props: pa.Array) -> None:
        props = props.cast(pa.binary())
        self.n = n = len(props)
        bufs = props.buffers()
        offs = np.frombuffer(bufs[1], dtype=np.int32)[props.offset : props.offset + n + 1].astype(np.int64)
        self._data_buf = bufs[2] if bufs[2] is not None else pa.py_buffer(b"")
        data = np.frombuffer(self._data_buf, dtype=np.uint8)
        starts, ends = offs[:-1], offs[1:].copy()
        # drop the trailing record CRC property
        crc_prefix = np.frombuffer(b"__CRC32#\x01", dtype=np.uint8)
        cand = np.flatnonzero(ends - starts >= 20)
        if len(cand):
            head = data[(ends[cand] - 20)[:, None] + np.arange(len(crc_prefix))]
            ends[cand[(head == crc_prefix).all(axis=1)]] -= 20
        # segment ends: every \x02 inside a record, plus the record end when it lacks one
        twos = np.flatnonzero(data == 2)
        rec_of = _owner(twos, starts, ends)
        keep = rec_of >= 0
        if not keep.all():
            twos, rec_of = twos[keep], rec_of[keep]
        nonempty = ends > starts
        last_byte = np.zeros(n, dtype=np.uint8)
        last_byte[nonempty] = data[ends[nonempty] - 1]
        open_end = np.flatnonzero(nonempty & (last_byte != 2))
        if len(open_end):  # records whose last segment has no trailing separator
            seg_end = np.concatenate([twos, ends[open_end]])
            seg_rec = np.concatenate([rec_of, open_end])
            order = np.argsort(seg_end, kind="stable")  # the buffer holds records in order
            seg_end, seg_rec = seg_end[order], seg_rec[order]
        else:
            seg_end, seg_rec = twos, rec_of
        seg_start = np.empty_like(seg_end)
        if len(seg_end):
            seg_start[0] = starts[seg_rec[0]]
            same = seg_rec[1:] == seg_rec[:-1]
            seg_start[1:] = np.where(same, seg_end[:-1] + 1, starts[seg_rec[1:]])
        ones = np.flatnonzero(data == 1)
        if len(ones) == len(seg_start) and (
            len(ones) == 0 or ((ones >= seg_start) & (ones < seg_end)).all()
        ):
            sep = ones  # the usual case: exactly one \x01 in each segment
        else:
            i = np.searchsorted(ones, seg_start)
            sep = np.where(i < len(ones), ones[np.minimum(i, max(len(ones) - 1, 0))] if len(ones) else 0, -1)
        ok = (sep > seg_start) & (sep < seg_end - 1)
        self.rec = seg_rec[ok]
        self.k_start, self.k_len = seg_start[ok], sep[ok] - seg_start[ok]
        self.v_start, self.v_len = sep[ok] + 1, seg_end[ok] - sep[ok] - 1
        self._data = data

    def _strings(self, start: np.ndarray, length: np.ndarray, validity: np.ndarray | None = None) -> pa.Array:
        m = len(start)
        views = _views(self._data, start, length, 0)
        vbuf = None
        if validity is not None and not validity.all():
            vbuf = pa.py_buffer(np.packbits(validity, bitorder="little").tobytes())
        arr = pa.Array.from_buffers(pa.binary_view(), m, [vbuf, pa.py_buffer(views.tobytes()), self._data_buf])
        return arr.cast(pa.string())

    def map_array(self) -> pa.MapArray:
        counts = np.bincount(self.rec, minlength=self.n)
        offsets = np.zeros(self.n + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        return pa.MapArray.from_arrays(
            pa.array(offsets), self._strings(self.k_start, self.k_len), self._strings(self.v_start, self.v_len)
        )

    def lookup(self, key: str) -> pa.Array:
        """The value of ``key`` in each record (the last one if repeated), null when absent."""
        kb = np.frombuffer(key.encode("utf-8"), dtype=np.uint8)
        cand = np.flatnonzero(self.k_len == len(kb))
        if len(cand):
            eq = (self._data[self.k_start[cand][:, None] + np.arange(len(kb))] == kb).all(axis=1)
            cand = cand[eq]
        start = np.zeros(self.n, dtype=np.int64)
        length = np.zeros(self.n, dtype=np.int64)
        present = np.zeros(self.n, dtype=bool)
        start[self.rec[cand]] = self.v_start[cand]  # later duplicates overwrite, as a HashMap put
        length[self.rec[cand]] = self.v_len[cand]
        present[self.rec[cand]] = True
        return self._strings(start, length, present)


def parse_properties(props: pa.Array) -> pa.MapArray:
    """RocketMQ property strings to ``map<string,string>`` (see :class:`ParsedProperties`)."""
    return ParsedProperties(props).map_array()


def read_units_arrow(
    commitlog: MappedFileQueue,
    units: np.ndarray,
    topic: str,
    queue_id: int,
    first_queue_offset: int,
    tag_filter: object | None = None,
    sql_filter: object | None = None,
    store_host: bytes | None = None,
    store_port: int = 0,
    columns: Sequence[str] | None = None,
) -> pa.RecordBatch:
    """Records named by ConsumeQueue ``units`` (queue offsets ``first_queue_offset, ...``).

    ``columns`` (default: all of SOURCE_SCHEMA, in its order) limits the work to what is asked:
    the properties string is not parsed at all unless a column derived from it is wanted."""
    n_all = len(units)
    if n_all == 0:
        return empty_batch(columns)
    phys = units["offset"].astype(np.int64)
    qoffs = np.arange(first_queue_offset, first_queue_offset + n_all, dtype=np.int64)
    tcodes = units["tags_code"].astype(np.int64)
    if tag_filter is not None and not getattr(tag_filter, "match_all", False):
        keep = np.asarray(tag_filter.mask_codes(tcodes), dtype=bool)  # type: ignore[attr-defined]
        phys, qoffs = phys[keep], qoffs[keep]
    n = len(phys)
    if n == 0:
        return empty_batch(columns)
    tb = topic.encode("utf-8")
    topic_field = 2 if len(tb) > 127 else 1
    seg_bytes = commitlog.segment_bytes
    first_file = commitlog.min_offset
    seg_idx = (phys - first_file) // seg_bytes
    body_views, props_views, buffers = [], [], []
    cols: dict[str, list[np.ndarray]] = {}
    order = []
    for bi, s in enumerate(np.unique(seg_idx)):
        rows = np.flatnonzero(seg_idx == s)
        order.append(rows)
        mf = commitlog.files[int(s)]
        mbuf = np.frombuffer(mf.mm, dtype=np.uint8)
        pos = phys[rows] - mf.from_offset
        f = _segment_fields(mbuf, pos, topic_field, len(tb))
        body_views.append(_views(mbuf, f["body_start"], f["body_len"], bi))
        props_views.append(_views(mbuf, f["props_start"], f["props_len"], bi))
        buffers.append(pa.py_buffer(mf.mm))
        for k in ("sys_flag", "born_ts", "store_ts", "reconsume"):
            cols.setdefault(k, []).append(f[k])
        del mbuf
    perm = np.concatenate(order)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(len(perm))

    def col(k: str) -> np.ndarray:
        return np.concatenate(cols[k])[inv]

    def binary(views: list[np.ndarray]) -> pa.Array:
        v = np.concatenate(views)[inv]
        arr = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(v.tobytes()), *buffers])
        return arr.cast(pa.binary())

    want = set(SOURCE_SCHEMA.names if columns is None else columns)
    tag_check = tag_filter is not None and not getattr(tag_filter, "match_all", False)
    need = set(want)
    if tag_check:
        need.add("tags")
    if sql_filter is not None:
        need.add("properties")
    values: dict[str, pa.Array] = {}
    if "body" in need:
        values["body"] = binary(body_views)
    prop_cols = {"msgId", "tags", "keys", "properties", "deliverTimestamp", "transactionId"}
    if need & prop_cols:
        parsed = ParsedProperties(binary(props_views))
        if "properties" in need:
            values["properties"] = parsed.map_array()
        if "tags" in need:
            values["tags"] = parsed.lookup(L.P_TAGS)
        if "keys" in need:
            values["keys"] = parsed.lookup(L.P_KEYS)
        if "msgId" in need:
            uniq = parsed.lookup(L.P_UNIQ_KEY)
            if uniq.null_count:
                host = store_host or b"\x7f\x00\x00\x01"
                uniq = pc.coalesce(uniq, pa.array(hex_rows_ids(host, store_port, phys)))
            values["msgId"] = uniq
        if "deliverTimestamp" in need:
            deliver_ms = pc.cast(parsed.lookup(L.P_TIMER_OUT_MS), pa.int64(), safe=False)
            values["deliverTimestamp"] = pc.multiply(deliver_ms, 1000).cast(TS)
        if "transactionId" in need:
            is_txn = (col("sys_flag") & L.TRANSACTION_MASK) == L.TRANSACTION_COMMIT_TYPE
            txn = parsed.lookup(L.P_TRANSACTION_ID)
            values["transactionId"] = pc.if_else(pa.array(is_txn), txn, pa.scalar(None, pa.string()))
    del buffers
    simple = {
        "topic": lambda: pa.DictionaryArray.from_arrays(np.zeros(n, dtype=np.int32), pa.array([topic])).cast(pa.string()),
        "queueId": lambda: pa.array(np.full(n, queue_id, dtype=np.int32)),
        "queueOffset": lambda: pa.array(qoffs),
        "bornTimestamp": lambda: pa.array(col("born_ts") * 1000).cast(TS),
        "storeTimestamp": lambda: pa.array(col("store_ts") * 1000).cast(TS),
        "reconsumeTimes": lambda: pa.array(col("reconsume")),
        "commitLogOffset": lambda: pa.array(phys),
    }
    for name, make in simple.items():
        if name in need:
            values[name] = make()
    fields = [f for f in SOURCE_SCHEMA if f.name in need]
    batch = pa.RecordBatch.from_arrays([values[f.name] for f in fields], schema=pa.schema(fields))
    if tag_check:
        batch = batch.filter(tag_filter.mask(batch.column("tags")))  # type: ignore[union-attr]
    if sql_filter is not None:
        batch = batch.filter(sql_filter.mask(batch.column("properties")))  # type: ignore[attr-defined]
    if need != want:
        batch = batch.select([f.name for f in SOURCE_SCHEMA if f.name in want])
    return batch


def hex_rows_ids(host: bytes, port: int, phys: np.ndarray) -> np.ndarray:
    from rmq_spark.store.message import offset_msg_ids

    return offset_msg_ids(host, port, phys).astype("U")


def read_queue_arrow(
    commitlog: MappedFileQueue,
    cq: ConsumeQueue,
    topic: str,
    queue_id: int,
    start: int,
    end: int,
    tag_filter: object | None = None,
    sql_filter: object | None = None,
    store_host: bytes | None = None,
    store_port: int = 0,
    columns: Sequence[str] | None = None,
) -> pa.RecordBatch:
    """Messages ``[start, end)`` of one queue (clamped to what the queue holds)."""
    first = max(start, cq.min_offset)
    units = cq.units(first, end)
    return read_units_arrow(
        commitlog, units, topic, queue_id, first, tag_filter, sql_filter, store_host, store_port, columns
    )


class StoreReader:
    """Read-only view of a store directory, safe beside a writer in another process."""

    def __init__(self, root: str, cq_segment_units: int = L.CQ_SEGMENT_UNITS, commitlog_segment_bytes: int | None = None) -> None:
        self.root = os.path.abspath(root)
        cl_dir = os.path.join(self.root, L.COMMITLOG_DIR)
        if commitlog_segment_bytes is None:
            commitlog_segment_bytes = _detect_segment_bytes(cl_dir) or L.COMMITLOG_SEGMENT_BYTES
        self.commitlog = MappedFileQueue(cl_dir, commitlog_segment_bytes, writable=False)
        self.commitlog.refresh()
        self.cq_segment_units = cq_segment_units
        self._cqs: dict[tuple[str, int], ConsumeQueue] = {}

    def _cq(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            d = os.path.join(self.root, L.CONSUMEQUEUE_DIR, topic, str(queue_id))
            if not os.path.isdir(d):
                return None
            units = _detect_segment_bytes(d)
            cq = ConsumeQueue(self.root, topic, queue_id, (units or self.cq_segment_units * 20) // 20, writable=False)
            self._cqs[(topic, queue_id)] = cq
        cq.refresh()
        return cq

    def topics(self) -> list[str]:
        base = os.path.join(self.root, L.CONSUMEQUEUE_DIR)
        return sorted(os.listdir(base)) if os.path.isdir(base) else []

    def queue_ids(self, topic: str) -> list[int]:
        d = os.path.join(self.root, L.CONSUMEQUEUE_DIR, topic)
        return sorted(int(q) for q in os.listdir(d) if q.isdigit()) if os.path.isdir(d) else []

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self._cq(topic, queue_id)
        return cq.min_offset if cq else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self._cq(topic, queue_id)
        return cq.max_offset if cq else 0

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        cq = self._cq(topic, queue_id)
        if cq is None:
            return 0
        self.commitlog.refresh()
        from rmq_spark.store.commitlog import _TS, _INT

        def store_time(offset: int) -> int:
            mf = self.commitlog.find(offset)
            if mf is None:
                return -1
            pos = offset - mf.from_offset
            sf = _INT.unpack_from(mf.mm, pos + 36)[0]
            return _TS.unpack_from(mf.mm, pos + 56 + (12 if sf & L.FLAG_BORNHOST_V6 else 0))[0]

        return cq.offset_by_time(timestamp_ms, store_time)

    def read_arrow(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        tag_filter: object | None = None,
        sql_filter: object | None = None,
        columns: Sequence[str] | None = None,
    ) -> pa.RecordBatch:
        cq = self._cq(topic, queue_id)
        if cq is None:
            if end > start:
                raise StoreError(f"queue {topic}/{queue_id} does not exist in {self.root}")
            return empty_batch(columns)
        if end > cq.max_offset:
            raise StoreError(
                f"queue {topic}/{queue_id} holds offsets up to {cq.max_offset}, asked for {end}"
            )
        self.commitlog.refresh()
        return read_queue_arrow(
            self.commitlog, cq, topic, queue_id, start, end, tag_filter, sql_filter, columns=columns
        )

    def close(self) -> None:
        self.commitlog.close()
        for cq in self._cqs.values():
            cq.close()


def _detect_segment_bytes(directory: str) -> int | None:
    if not os.path.isdir(directory):
        return None
    for name in sorted(os.listdir(directory)):
        if name.isdigit() and len(name) == 20:
            return os.path.getsize(os.path.join(directory, name))
    return None


__all__: Sequence[str] = ["SOURCE_SCHEMA", "StoreReader", "read_queue_arrow", "read_units_arrow", "empty_batch", "parse_properties", "CQ_UNIT"]
