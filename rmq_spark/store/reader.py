"""Bulk reads of a queue range into Arrow, vectorized with numpy over the mapped files.

:func:`read_queue_arrow` turns ConsumeQueue units ``[start, end)`` into a ``pyarrow.RecordBatch``
of :data:`MESSAGE_SCHEMA` (MessageExt's fields), with no Python work per message:

* the fixed header fields of all records come from ONE gather of 52 bytes per record;
* bodies: one fixed-width numpy gather when they all have one length, else Arrow
  ``binary_view`` structs pointing into the mapped CommitLog and one C++ cast (the gather);
* properties: when every record has one layout (a batch put writes them so: same keys, value
  lengths and separators, only value bytes differ) each value column is a column slice of one
  (n, width) byte matrix (:class:`UniformProperties`); otherwise separators are found with numpy
  over the whole column (:class:`ParsedProperties`).  Only the columns asked for are built.

:class:`StoreReader` opens a store directory read-only, so that another process can read
while the broker appends; :meth:`StoreReader.read_chunks` yields a range as
batches bounded in rows and bytes.

Why this module is long: one concept, reading a queue's range into Arrow columns, with its
filtered and unfiltered paths side by side; its imports, wrapped one name a line, take 18 lines.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq_spark.errors import StoreError
from rmq_spark.store import layout as L
from rmq_spark.store import record as R
from rmq_spark.store.consistency import check_units
from rmq_spark.store.consumequeue import CQ_UNIT, ConsumeQueue
from rmq_spark.store.inflate import inflate_bodies, record_places
from rmq_spark.store.mapped import MappedFileQueue
from rmq_spark.store.message import offset_msg_ids
from rmq_spark.store.properties import ParsedProperties, UniformProperties, deliver_times_ms
from rmq_spark.store.views import _at, _fixed_strings, _gather, _views

TS = pa.timestamp("us", tz="UTC")
MESSAGE_SCHEMA = pa.schema(
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
)  # a message read back, one column per MessageExt field
SOURCE_SCHEMA = MESSAGE_SCHEMA  # its former name, still imported by tests/store/test_reader.py


def empty_batch(columns: Sequence[str] | None = None) -> pa.RecordBatch:
    fields = [f for f in MESSAGE_SCHEMA if columns is None or f.name in columns]
    return pa.RecordBatch.from_arrays(
        [pa.array([], type=f.type) for f in fields], schema=pa.schema(fields)
    )


# header fields read by the source: record byte position with IPv4 hosts, type, and how many of
# the two hosts (BORNHOST, STOREHOST: +12 bytes each when IPv6) come before the field
_FIELDS = {
    "sys_flag": (R.POS_SYS_FLAG, ">i4", 0),
    "born_ts": (R.POS_BORN_TIMESTAMP, ">i8", 0),
    "store_ts": (R.POS_STORE_TIMESTAMP_V4, ">i8", 1),
    "reconsume": (R.POS_RECONSUME_TIMES_V4, ">i4", 2),
    "body_len": (R.POS_BODY_LEN_V4, ">i4", 2),
}
# ... all within one span from SYSFLAG to BODYLEN, gathered as ONE item per record
_HEAD_AT = R.POS_SYS_FLAG
_HEAD = np.dtype(
    {
        "names": list(_FIELDS),
        "formats": [f[1] for f in _FIELDS.values()],
        "offsets": [f[0] - _HEAD_AT for f in _FIELDS.values()],
        "itemsize": _FIELDS["body_len"][0] + 4 - _HEAD_AT,
    }
)
_BODY_AT = _FIELDS["body_len"][0] + 4
_V6 = L.FLAG_BORNHOST_V6 | L.FLAG_STOREHOST_V6


class _Headers:
    """Header fields of the records at ``pos`` of one mapped segment (IPv6 hosts shift them)."""

    def __init__(self, mm_buf: np.ndarray, pos: np.ndarray) -> None:
        head = _at(mm_buf, f"V{_HEAD.itemsize}")[pos + _HEAD_AT].view(_HEAD)
        self.sys_flag = head["sys_flag"].astype(np.int32)
        self._head, self._buf, self._pos = head, mm_buf, pos
        self._v6 = v6 = np.flatnonzero(self.sys_flag & _V6)
        self.body_len = self.field("body_len").astype(np.int64)
        self.body_start = pos + _BODY_AT
        if len(v6):
            self.body_start[v6] += self._shift(v6, 2)

    def _shift(self, rows: np.ndarray, hosts_before: int) -> np.ndarray:
        sf = self.sys_flag[rows]
        shift = (
            np.where(sf & L.FLAG_BORNHOST_V6, 12, 0)
            if hosts_before >= 1
            else np.zeros(len(rows), np.int64)
        )
        if hosts_before >= 2:
            shift = shift + np.where(sf & L.FLAG_STOREHOST_V6, 12, 0)
        return shift.astype(np.int64)

    def field(self, name: str) -> np.ndarray:
        """Field ``name`` of every record (the IPv6 ones gathered again at their place)."""
        at, dtype, hosts_before = _FIELDS[name]
        out = self._head[name].astype(np.int64 if dtype == ">i8" else np.int32)
        v6 = self._v6
        if len(v6) and hosts_before:
            out[v6] = _gather(
                self._buf,
                self._pos[v6] + at + self._shift(v6, hosts_before),
                np.dtype(dtype).itemsize,
                dtype,
            )
        return out


@dataclass
class _Part:
    """The records of one range that lie in one mapped CommitLog file."""

    buf: np.ndarray  # the file's bytes
    mm: Any  # the mapping itself, for Arrow buffers
    head: _Headers
    props_start: np.ndarray
    props_len: np.ndarray


class _Columns:
    """Fixed fields and byte ranges of the records at sorted CommitLog offsets ``phys``, gathered
    file by file, concatenated on demand."""

    def __init__(self, commitlog: MappedFileQueue, phys: np.ndarray, topic_bytes: int) -> None:
        topic_field = 2 if topic_bytes > 127 else 1
        seg_idx = (phys - commitlog.min_offset) // commitlog.segment_bytes
        cuts = np.flatnonzero(seg_idx[1:] != seg_idx[:-1]) + 1
        self.parts: list[_Part] = []
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(phys)], strict=True):
            mf = commitlog.files[int(seg_idx[a])]
            buf = np.frombuffer(mf.mm, dtype=np.uint8)
            pos = phys[a:b] - mf.from_offset
            h = _Headers(buf, pos)
            props_len_pos = h.body_start + h.body_len + topic_field + topic_bytes
            props_len = _gather(buf, props_len_pos, 2, ">u2").astype(np.int64)
            self.parts.append(_Part(buf, mf.mm, h, props_len_pos + 2, props_len))

    def cat(self, get: Callable[[_Part], np.ndarray]) -> np.ndarray:
        arrays = [get(p) for p in self.parts]
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    def field(self, name: str) -> np.ndarray:
        return self.cat(lambda p: p.head.field(name))

    def bytes_column(
        self, starts: Callable[[_Part], np.ndarray], lengths: Callable[[_Part], np.ndarray]
    ) -> pa.Array:
        """Byte ranges as a ``binary`` array: a fixed-width numpy gather when all have one length,
        else binary_view structs over the mapped files and one C++ cast (the gather)."""
        n = sum(len(starts(p)) for p in self.parts)
        lens = [lengths(p) for p in self.parts]
        lo = min(int(x.min()) for x in lens)
        hi = max(int(x.max()) for x in lens)
        if lo == hi and hi > 0 and n * hi < 2**31:
            return _fixed_strings(self.fixed_block(starts, hi), pa.binary())
        views = [
            _views(p.buf, starts(p), ln, i)
            for i, (p, ln) in enumerate(zip(self.parts, lens, strict=True))
        ]
        v = views[0] if len(views) == 1 else np.concatenate(views)
        buffers = [pa.py_buffer(p.mm) for p in self.parts]
        arr = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(v), *buffers])
        return arr.cast(pa.binary())

    def fixed_block(self, starts: Callable[[_Part], np.ndarray], width: int) -> np.ndarray:
        """``width`` bytes at every start, as an (n, width) uint8 matrix."""
        block = self.cat(lambda p: _at(p.buf, f"V{width}")[starts(p)])
        return block.view(np.uint8).reshape(len(block), width)

    def properties(self) -> UniformProperties | ParsedProperties:
        lens = [p.props_len for p in self.parts]
        width = int(lens[0][0])
        n = sum(len(x) for x in lens)
        if (
            width > 0
            and n * width < 2**31
            and all(int(x.min()) == width == int(x.max()) for x in lens)
        ):
            mat = self.fixed_block(lambda p: p.props_start, width)
            uniform = UniformProperties.of(mat)
            if uniform is not None:
                return uniform
            return ParsedProperties(_fixed_strings(mat, pa.binary()))
        return ParsedProperties(self.bytes_column(lambda p: p.props_start, lambda p: p.props_len))


def _timestamps(ms: np.ndarray) -> pa.Array:
    us = ms.astype(np.int64) * 1000
    return pa.Array.from_buffers(TS, len(us), [None, pa.py_buffer(us)])


def _repeated_string(value: str, n: int) -> pa.Array:
    b = np.frombuffer(value.encode("utf-8"), dtype=np.uint8)
    return _fixed_strings(np.broadcast_to(b, (n, len(b))))


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
    verify: bool = True,
    force_prop_crc: bool = False,
    max_inflated: int | None = None,
    consumed: list[int] | None = None,
) -> pa.RecordBatch:
    """Records named by ConsumeQueue ``units`` (queue offsets ``first_queue_offset, ...``).

    ``columns`` (default: all of MESSAGE_SCHEMA, in its order) limits the work to what is asked:
    the properties are not parsed at all unless a column derived from them is wanted.  With
    ``verify`` (the default) the records are first held to the units (:func:`check_units`:
    layout, position, queue and CRC), so damage raises :class:`CorruptStoreError` with its file
    and position instead of being read.  With ``max_inflated``, the rows end before the compressed
    body that would bring the bodies past it once inflated; ``consumed`` gets how many units were read."""
    n_all = len(units)
    consumed = consumed if consumed is not None else []
    consumed[:] = [n_all]
    if n_all == 0:
        return empty_batch(columns)
    phys = units["offset"].astype(np.int64)
    qoffs = np.arange(first_queue_offset, first_queue_offset + n_all, dtype=np.int64)
    tag_check = tag_filter is not None and not getattr(tag_filter, "match_all", False)
    if tag_check:
        codes = units["tags_code"].astype(np.int64)
        keep = np.asarray(tag_filter.mask_codes(codes), dtype=np.bool_)  # type: ignore[union-attr]  # tag_check: not None
        keep |= codes < -(
            2**31
        )  # a ConsumeQueue-ext address (Apache): the TAGS filter below decides
        phys, qoffs = phys[keep], qoffs[keep]
    n = len(phys)
    if n == 0:
        return empty_batch(columns)
    order = None
    if n > 1 and bool((phys[1:] < phys[:-1]).any()):  # a queue's records are in log order; be safe
        order = np.argsort(phys, kind="stable")
        phys, qoffs = phys[order], qoffs[order]
    if verify:
        sizes = units["size"].astype(np.int64)
        if tag_check:
            sizes = sizes[keep]
        check_units(
            commitlog,
            phys,
            sizes if order is None else sizes[order],
            topic,
            queue_id,
            qoffs,
            force_prop_crc,
        )
    want = set(MESSAGE_SCHEMA.names if columns is None else columns)
    need = set(want)
    if tag_check:
        need.add("tags")
    if sql_filter is not None:
        need.add("properties")
    values: dict[str, pa.Array] = {}
    if need & {"topic", "queueId", "queueOffset", "commitLogOffset"}:
        values["topic"] = _repeated_string(topic, n)
        values["queueId"] = pa.array(np.full(n, queue_id, dtype=np.int32))
        values["queueOffset"] = pa.array(qoffs)
        values["commitLogOffset"] = pa.array(phys)
    cols = _Columns(commitlog, phys, len(topic.encode("utf-8")))
    if "body" in need:
        values["body"] = cols.bytes_column(lambda p: p.head.body_start, lambda p: p.head.body_len)
        sys_flags = cols.cat(lambda p: p.head.sys_flag)
        if (
            sys_flags & L.FLAG_COMPRESSED
        ).any():  # a client compressed it (Apache's, bodies > 4 KiB)
            where = record_places(
                commitlog, phys, f"{topic}/{queue_id}", qoffs
            )  # a poison record's (logged)
            budget = max_inflated if order is None else None
            values["body"] = inflate_bodies(values["body"], sys_flags, where=where, budget=budget)
    if "bornTimestamp" in need:
        values["bornTimestamp"] = _timestamps(cols.field("born_ts"))
    if "storeTimestamp" in need:
        values["storeTimestamp"] = _timestamps(cols.field("store_ts"))
    if "reconsumeTimes" in need:
        values["reconsumeTimes"] = pa.array(cols.field("reconsume"))
    if need & {"msgId", "tags", "keys", "properties", "deliverTimestamp", "transactionId"}:
        parsed = cols.properties()
        if "properties" in need:
            values["properties"] = parsed.map_array()
        if "tags" in need:
            values["tags"] = parsed.lookup(L.P_TAGS)
        if "keys" in need:
            values["keys"] = parsed.lookup(L.P_KEYS)
        if "msgId" in need:
            uniq = parsed.lookup(L.P_UNIQ_KEY)
            if uniq.null_count:  # no client id: the offset msgId, as RocketMQ shows it
                ids = offset_msg_ids(store_host or b"\x7f\x00\x00\x01", store_port, phys)
                uniq = pc.coalesce(
                    uniq, _fixed_strings(ids.view(np.uint8).reshape(n, ids.itemsize))
                )
            values["msgId"] = uniq
        if "deliverTimestamp" in need:
            deliver_ms = deliver_times_ms(parsed, cols.field("store_ts"))
            values["deliverTimestamp"] = pc.multiply(deliver_ms, 1000).cast(TS)
        if "transactionId" in need:
            txn = parsed.lookup(L.P_TRANSACTION_ID)
            if txn.null_count < n:
                sys_flag = cols.cat(lambda p: p.head.sys_flag)
                is_commit = (sys_flag & L.TRANSACTION_MASK) == L.TRANSACTION_COMMIT_TYPE
                txn = pc.if_else(pa.array(is_commit), txn, pa.scalar(None, pa.string()))
            values["transactionId"] = txn
    del cols
    cut = len(values["body"]) if "body" in values else n
    if cut < n:  # the rows after passed max_inflated once inflated: left for the next read
        values = {k: v if k == "body" else v.slice(0, cut) for k, v in values.items()}
        consumed[:] = [int(np.flatnonzero(keep)[cut]) if tag_check else cut]
    fields = [f for f in MESSAGE_SCHEMA if f.name in need]
    batch = pa.RecordBatch.from_arrays([values[f.name] for f in fields], schema=pa.schema(fields))
    if order is not None:
        inv = np.empty_like(order)
        inv[order] = np.arange(n)
        batch = batch.take(pa.array(inv))
    if tag_check:
        batch = batch.filter(tag_filter.mask(batch.column("tags")))  # type: ignore[union-attr]
    if sql_filter is not None:
        batch = batch.filter(sql_filter.mask(batch.column("properties")))  # type: ignore[attr-defined]
    if need != want:
        batch = batch.select([f.name for f in MESSAGE_SCHEMA if f.name in want])
    return batch


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
    verify: bool = True,
    force_prop_crc: bool = False,
    max_inflated: int | None = None,
    next_offset: list[int] | None = None,
) -> pa.RecordBatch:
    """Messages ``[start, end)`` of one queue (clamped to what it holds), ending where the bodies
    pass ``max_inflated`` once inflated; ``next_offset`` gets where the next read starts."""
    first = max(start, cq.min_offset)
    units = cq.units(first, end)
    used: list[int] = []
    batch = read_units_arrow(
        commitlog,
        units,
        topic,
        queue_id,
        first,
        tag_filter,
        sql_filter,
        store_host,
        store_port,
        columns,
        verify,
        force_prop_crc,
        max_inflated=max_inflated,
        consumed=used,
    )
    if next_offset is not None:
        next_offset[:] = [max(first + (used[0] if used else len(units)), start + 1)]
    return batch


class StoreReader:
    """Read-only view of a store directory, safe beside a writer in another process."""

    def __init__(
        self,
        root: str,
        cq_segment_units: int = L.CQ_SEGMENT_UNITS,
        commitlog_segment_bytes: int | None = None,
    ) -> None:
        self.root = os.path.abspath(root)
        cl_dir = os.path.join(self.root, L.COMMITLOG_DIR)
        if commitlog_segment_bytes is None:
            commitlog_segment_bytes = _detect_segment_bytes(cl_dir) or L.COMMITLOG_SEGMENT_BYTES
        self.commitlog = MappedFileQueue(cl_dir, commitlog_segment_bytes, writable=False)
        self.commitlog.refresh()
        self.cq_segment_units = cq_segment_units
        self._cqs: dict[tuple[str, int], ConsumeQueue] = {}

    def _cq(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue's ConsumeQueue; mapped again when a file it holds was deleted since (the
        topic deleted, and perhaps created again, or its first segments expired): an inode held
        open cannot be reused, so this cannot mistake a new file for the old one."""
        cq = self._cqs.get((topic, queue_id))
        if cq is not None and cq.mfq.files and cq.mfq.files[0].unlinked():
            cq.close()
            del self._cqs[(topic, queue_id)]
            cq = None
        if cq is None:
            d = os.path.join(self.root, L.CONSUMEQUEUE_DIR, topic, str(queue_id))
            if not os.path.isdir(d):
                return None
            units = _detect_segment_bytes(d)
            cq = ConsumeQueue(
                self.root,
                topic,
                queue_id,
                (units or self.cq_segment_units * 20) // 20,
                writable=False,
            )
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
        """The first offset whose record is still in the CommitLog (Apache deletes old CommitLog
        files before the ConsumeQueue units that point there)."""
        cq = self._cq(topic, queue_id)
        if cq is None:
            return 0
        lo, hi = cq.min_offset, cq.max_offset
        self.commitlog.refresh()
        first_byte = self.commitlog.min_offset
        u = cq.unit(lo)
        if u is None or u[0] >= first_byte:
            return lo
        while lo < hi:  # units point forward in the log: binary search for the first kept one
            mid = (lo + hi) // 2
            u = cq.unit(mid)
            if u is not None and u[0] >= first_byte:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self._cq(topic, queue_id)
        return cq.max_offset if cq else 0

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        cq = self._cq(topic, queue_id)
        if cq is None:
            return 0
        self.commitlog.refresh()

        def store_time(offset: int) -> int:
            mf = self.commitlog.find(offset)
            return -1 if mf is None else R.store_timestamp_at(mf.mm, offset - mf.from_offset)

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
        force_prop_crc: bool = False,
        **bounds: Any,  # max_inflated, next_offset: read_queue_arrow's
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
            self.commitlog, cq, topic, queue_id, start, end, tag_filter, sql_filter, columns=columns,
            force_prop_crc=force_prop_crc, **bounds,
        )  # fmt: skip

    def read_chunks(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        tag_filter: object | None = None,
        sql_filter: object | None = None,
        max_rows: int = 65_536,
        max_bytes: int = 32 << 20,
    ) -> Iterator[pa.RecordBatch]:
        """:meth:`read_arrow` of ``[start, end)`` as consecutive batches of at most ``max_rows``
        records and about ``max_bytes`` of stored records (see :func:`chunk_bounds`) and of bodies
        once inflated each, so big messages never overflow a batch's 2 GiB of ``binary`` offsets.
        The ConsumeQueue range is read once; batches left empty by a filter are skipped."""
        cq = self._cq(topic, queue_id)
        if cq is None or end <= start:
            if end > start:
                raise StoreError(f"queue {topic}/{queue_id} does not exist in {self.root}")
            return
        if end > cq.max_offset:
            raise StoreError(
                f"queue {topic}/{queue_id} holds offsets up to {cq.max_offset}, asked for {end}"
            )
        self.commitlog.refresh()
        first = max(start, cq.min_offset)
        units = cq.units(first, end)
        for a, b in chunk_bounds(units["size"], max_rows, max_bytes):
            step = b - a
            while a < b:  # a chunk whose bodies inflate past max_bytes is read in several batches
                used: list[int] = []
                batch = read_units_arrow(self.commitlog, units[a:min(b, a + step)], topic, queue_id, first + a,
                                         tag_filter, sql_filter, max_inflated=max_bytes, consumed=used)  # fmt: skip
                step = (
                    step if used[0] == min(b - a, step) else 2 * used[0]
                )  # cut: ask for about that many
                a += used[0]
                if batch.num_rows:
                    yield batch

    def close(self) -> None:
        self.commitlog.close()
        for cq in self._cqs.values():
            cq.close()


def chunk_bounds(sizes: np.ndarray, max_rows: int, max_bytes: int) -> list[tuple[int, int]]:
    """``[a, b)`` row ranges over records of ``sizes``: each at most ``max_rows`` rows, and a new
    range starts wherever the running byte count crosses a multiple of ``max_bytes`` (so a range
    holds at most ``max_bytes`` plus its last record)."""
    n = len(sizes)
    if n == 0:
        return []
    before = np.cumsum(sizes, dtype=np.int64) - sizes.astype(np.int64)  # bytes ahead of each record
    cuts = np.flatnonzero(np.diff(before // max(max_bytes, 1))) + 1
    out: list[tuple[int, int]] = []
    for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), n], strict=True):
        out.extend((s, min(b, s + max_rows)) for s in range(a, b, max_rows))
    return out


def _detect_segment_bytes(directory: str) -> int | None:
    if not os.path.isdir(directory):
        return None
    for name in sorted(os.listdir(directory)):
        if name.isdigit() and len(name) == 20:
            return os.path.getsize(os.path.join(directory, name))
    return None


__all__: Sequence[str] = [
    "CQ_UNIT",
    "MESSAGE_SCHEMA",
    "StoreReader",
    "check_units",
    "chunk_bounds",
    "empty_batch",
    "read_queue_arrow",
    "read_units_arrow",
]  # fmt: skip
