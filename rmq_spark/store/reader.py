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


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([], type=f.type) for f in SOURCE_SCHEMA], schema=SOURCE_SCHEMA
    )


def _gather(buf: np.ndarray, pos: np.ndarray, width: int, dtype: str) -> np.ndarray:
    idx = pos[:, None] + np.arange(width, dtype=np.int64)
    return buf[idx].view(dtype).reshape(len(pos))


def _views(buf: np.ndarray, start: np.ndarray, length: np.ndarray, buffer_index: int) -> np.ndarray:
    """Arrow binary_view structs (16 bytes each) for byte ranges of ``buf``."""
    n = len(start)
    views = np.zeros((n, 16), dtype=np.uint8)
    views[:, 0:4] = length.astype("<i4").view(np.uint8).reshape(n, 4)
    head = buf[start[:, None] + np.arange(12, dtype=np.int64)]
    short = length <= 12
    if short.any():
        keep = np.arange(12)[None, :] < length[:, None]
        views[:, 4:16] = np.where(keep & short[:, None], head, 0)
    long_ = ~short
    if long_.any():
        views[long_, 4:8] = head[long_, 0:4]
        views[long_, 8:12] = np.full(int(long_.sum()), buffer_index, dtype="<i4").view(np.uint8).reshape(-1, 4)
        views[long_, 12:16] = start[long_].astype("<i4").view(np.uint8).reshape(-1, 4)
    return views


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


def parse_properties(props: pa.Array) -> pa.MapArray:
    """RocketMQ property strings (``k\\x01v\\x02...``) to ``map<string,string>``, vectorized.

    A segment counts only with a non-empty key and a non-empty value (``string2messageProperties``)."""
    n = len(props)
    segs = pc.split_pattern(props, "\x02")
    flat = pc.list_flatten(segs)
    parents = pc.list_parent_indices(segs).to_numpy(zero_copy_only=False)
    kv = pc.split_pattern(flat, "\x01", max_splits=1)
    nparts = pc.list_value_length(kv).to_numpy(zero_copy_only=False)
    has_two = nparts == 2
    if len(flat) == 0:
        offsets = pa.array(np.zeros(n + 1, dtype=np.int32))
        return pa.MapArray.from_arrays(offsets, pa.array([], pa.string()), pa.array([], pa.string()))
    keys = pc.list_element(pc.if_else(pa.array(has_two), kv, pa.scalar(["", ""], kv.type)), 0)
    vals = pc.list_element(pc.if_else(pa.array(has_two), kv, pa.scalar(["", ""], kv.type)), 1)
    valid = (
        has_two
        & pc.not_equal(keys, "__CRC32#").to_numpy(zero_copy_only=False)
        & (pc.binary_length(keys).to_numpy(zero_copy_only=False) > 0)
        & (pc.binary_length(vals).to_numpy(zero_copy_only=False) > 0)
    )
    sel = np.flatnonzero(valid)
    counts = np.bincount(parents[sel], minlength=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    idx = pa.array(sel)
    return pa.MapArray.from_arrays(pa.array(offsets), keys.take(idx), vals.take(idx))


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
) -> pa.RecordBatch:
    """Records named by ConsumeQueue ``units`` (queue offsets ``first_queue_offset, ...``)."""
    n_all = len(units)
    if n_all == 0:
        return empty_batch()
    phys = units["offset"].astype(np.int64)
    qoffs = np.arange(first_queue_offset, first_queue_offset + n_all, dtype=np.int64)
    tcodes = units["tags_code"].astype(np.int64)
    if tag_filter is not None and not getattr(tag_filter, "match_all", False):
        keep = np.asarray(tag_filter.mask_codes(tcodes), dtype=bool)  # type: ignore[attr-defined]
        phys, qoffs = phys[keep], qoffs[keep]
    n = len(phys)
    if n == 0:
        return empty_batch()
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

    body = binary(body_views)
    props_raw = binary(props_views).cast(pa.string())
    props = parse_properties(props_raw)
    del buffers
    tags = pc.map_lookup(props, L.P_TAGS, "first")
    keys = pc.map_lookup(props, L.P_KEYS, "first")
    uniq = pc.map_lookup(props, L.P_UNIQ_KEY, "first")
    if uniq.null_count:
        host = store_host or b"\x7f\x00\x00\x01"
        ids = pa.array(hex_rows_ids(host, store_port, phys))
        uniq = pc.coalesce(uniq, ids)
    deliver = pc.map_lookup(props, L.P_TIMER_OUT_MS, "first")
    deliver_ms = pc.cast(deliver, pa.int64(), safe=False) if len(deliver) else deliver
    txn = pc.map_lookup(props, L.P_TRANSACTION_ID, "first")
    sys_flag = col("sys_flag")
    is_txn = (sys_flag & L.TRANSACTION_MASK) == L.TRANSACTION_COMMIT_TYPE
    txn = pc.if_else(pa.array(is_txn), txn, pa.scalar(None, pa.string()))
    batch = pa.RecordBatch.from_arrays(
        [
            pa.DictionaryArray.from_arrays(np.zeros(n, dtype=np.int32), pa.array([topic])).cast(pa.string()),
            pa.array(np.full(n, queue_id, dtype=np.int32)),
            pa.array(qoffs),
            uniq,
            tags,
            keys,
            body,
            props,
            pa.array(col("born_ts") * 1000).cast(TS),
            pa.array(col("store_ts") * 1000).cast(TS),
            pc.multiply(deliver_ms, 1000).cast(TS),
            pa.array(col("reconsume")),
            txn,
            pa.array(phys),
        ],
        schema=SOURCE_SCHEMA,
    )
    if tag_filter is not None and not getattr(tag_filter, "match_all", False):
        batch = batch.filter(tag_filter.mask(batch.column("tags")))  # type: ignore[attr-defined]
    if sql_filter is not None:
        batch = batch.filter(sql_filter.mask(batch.column("properties")))  # type: ignore[attr-defined]
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
) -> pa.RecordBatch:
    """Messages ``[start, end)`` of one queue (clamped to what the queue holds)."""
    first = max(start, cq.min_offset)
    units = cq.units(first, end)
    return read_units_arrow(
        commitlog, units, topic, queue_id, first, tag_filter, sql_filter, store_host, store_port
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
        self, topic: str, queue_id: int, start: int, end: int, tag_filter: object | None = None, sql_filter: object | None = None
    ) -> pa.RecordBatch:
        cq = self._cq(topic, queue_id)
        if cq is None:
            if end > start:
                raise StoreError(f"queue {topic}/{queue_id} does not exist in {self.root}")
            return empty_batch()
        if end > cq.max_offset:
            raise StoreError(
                f"queue {topic}/{queue_id} holds offsets up to {cq.max_offset}, asked for {end}"
            )
        self.commitlog.refresh()
        return read_queue_arrow(self.commitlog, cq, topic, queue_id, start, end, tag_filter, sql_filter)

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
