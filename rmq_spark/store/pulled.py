"""CommitLog records concatenated in one buffer (a PULL_MESSAGE answer's body) as Arrow, with the
bulk reader's vectorized gathers: no Python work per message.

Where the records start is the only sequential fact of such a buffer (each record's TOTALSIZE
says where the next begins).  It is found without a loop over records: every position whose
MAGICCODE field holds a message magic is a candidate (found by one byte compare over the buffer), each candidate points at the candidate its
TOTALSIZE reaches, and the chain from position 0 is followed by pointer doubling (log2(n) numpy
steps).  A chain that does not end exactly at the buffer's end is a :class:`CorruptStoreError`.

Bodies the Java producer compressed (SYSFLAG bit 0: zlib, or LZ4 / zstd by the compression type
bits) are inflated by :func:`rmq_spark.store.inflate.inflate_bodies`, the bulk reader's, one
call per compressed body (only those, which are over 4 KiB each), each bounded by the body limit;
a poison record (flagged COMPRESSED, its body not inflating within the limit) keeps its body as
sent and is named in a WARNING (its position in the buffer, CommitLog and queue offsets).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq_spark.errors import CorruptStoreError
from rmq_spark.store import layout as L
from rmq_spark.store import record as R
from rmq_spark.store.inflate import inflate_bodies
from rmq_spark.store.message import offset_msg_ids
from rmq_spark.store.properties import deliver_times_ms
from rmq_spark.store.reader import (
    MESSAGE_SCHEMA,
    TS,
    _Columns,
    _repeated_string,
    _timestamps,
    empty_batch,
)
from rmq_spark.store.views import _at, _fixed_strings, _gather

__all__ = ["record_starts", "records_arrow"]

_MAGICS = np.array([L.MAGIC_V1, L.MAGIC_V2], dtype=np.uint32)
_MAGIC_BYTE0 = L.MAGIC_V1 >> 24
assert L.MAGIC_V2 >> 24 == _MAGIC_BYTE0


def record_starts(buf: np.ndarray) -> np.ndarray:
    """Byte positions of the records of ``buf`` (records back to back from 0 to its end)."""
    n = len(buf)
    if n == 0:
        return np.zeros(0, np.int64)
    if n < R.POS_BODY_V4:
        raise CorruptStoreError(f"a buffer of {n} bytes holds no whole record")
    ints = _at(buf, ">u4")
    # positions p with a message magic at p + 4: first the magics' common first byte (one byte
    # compare over the buffer), then the whole word at those few places
    cand = np.flatnonzero(buf[4 : n - 3] == _MAGIC_BYTE0).astype(np.int64)
    words = ints[cand + 4]
    cand = cand[(words == _MAGICS[0]) | (words == _MAGICS[1])]
    if len(cand) == 0 or cand[0] != 0:
        raise CorruptStoreError(
            "the buffer does not begin with a message record (no MAGICCODE at byte 4)"
        )
    size = _at(buf, ">i4")[cand].astype(np.int64)
    nxt = cand + size
    idx = np.searchsorted(cand, nxt)
    idx = np.minimum(idx, len(cand))
    hit = np.zeros(len(cand), bool)
    inside = idx < len(cand)
    hit[inside] = cand[idx[inside]] == nxt[inside]
    sentinel = len(cand)
    jump = np.append(
        np.where(hit & (size > 0), idx, sentinel), sentinel
    )  # sentinel points at itself
    path = np.zeros(1, np.int64)
    while True:
        step = jump[path]
        step = step[step != sentinel]
        if len(step) == 0:
            break
        path = np.concatenate([path, step])
        jump = jump[jump]
    path = np.sort(path)  # distinct already: the chain never repeats a record
    starts = cand[path]
    end = int(starts[-1] + size[path[-1]])
    if end != n:
        raise CorruptStoreError(
            f"the records of a {n}-byte buffer end at byte {end}: it is not whole records"
        )
    return starts


def records_arrow(
    data: bytes | bytearray | memoryview,
    columns: Sequence[str] | None = None,
    tag_filter: object | None = None,
    sql_filter: object | None = None,
) -> pa.RecordBatch:
    """Every record of ``data`` as a batch of :data:`~rmq_spark.store.reader.MESSAGE_SCHEMA`."""
    buf = np.frombuffer(data, dtype=np.uint8)
    pos = record_starts(buf)
    n = len(pos)
    if n == 0:
        return empty_batch(columns)
    fake = SimpleNamespace(
        min_offset=0, segment_bytes=len(buf) + 1, files=[SimpleNamespace(mm=data, from_offset=0)]
    )
    # the topic: after the body, a 1-byte length (MAGIC_V1) or 2-byte (MAGIC_V2); one per pull
    cols = _Columns(fake, pos, 0)  # type: ignore[arg-type]
    part = cols.parts[0]
    head = part.head
    after_body = head.body_start + head.body_len
    v2 = _at(buf, ">u4")[pos + R.POS_MAGIC] == L.MAGIC_V2
    topic_len = np.where(
        v2,
        _gather(buf, np.minimum(after_body, len(buf) - 2), 2, ">u2"),
        buf[np.minimum(after_body, len(buf) - 1)],
    )
    topic_at = after_body + np.where(v2, 2, 1)
    tl = int(topic_len[0])
    topic = bytes(buf[int(topic_at[0]) : int(topic_at[0]) + tl]).decode("utf-8")
    part.props_start = topic_at + topic_len.astype(np.int64) + 2
    part.props_len = _gather(buf, part.props_start - 2, 2, ">u2").astype(np.int64)
    want = set(MESSAGE_SCHEMA.names if columns is None else columns)
    need = set(want)
    if tag_filter is not None:
        need.add("tags")
    if sql_filter is not None:
        need.add("properties")
    phys = _at(buf, ">i8")[pos + R.POS_PHYSICAL_OFFSET].astype(np.int64)
    values: dict[str, pa.Array] = {
        "topic": _repeated_string(topic, n)
        if len(set(topic_len.tolist())) == 1
        else pa.array(
            [
                bytes(buf[a : a + b]).decode()
                for a, b in zip(topic_at.tolist(), topic_len.tolist(), strict=True)
            ],
            pa.string(),
        ),
        "queueId": pa.array(_at(buf, ">i4")[pos + R.POS_QUEUE_ID].astype(np.int32)),
        "queueOffset": pa.array(_at(buf, ">i8")[pos + R.POS_QUEUE_OFFSET].astype(np.int64)),
        "commitLogOffset": pa.array(phys),
    }
    if "body" in need:

        def where(row: int) -> str:  # a poison record (inflate_bodies logs it)
            return (
                f"the record at byte {int(pos[row])} of a pulled buffer (CommitLog offset {int(phys[row])}, "
                f"{topic}/{int(values['queueId'][row].as_py())} offset {int(values['queueOffset'][row].as_py())})"
            )

        values["body"] = inflate_bodies(
            cols.bytes_column(lambda p: p.head.body_start, lambda p: p.head.body_len),
            head.sys_flag,
            where=where,
        )
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
            if uniq.null_count:  # no client id: the offset msgId from the record's STOREHOST
                v6 = int(head.sys_flag[0]) & L.FLAG_STOREHOST_V6
                born6 = 12 if int(head.sys_flag[0]) & L.FLAG_BORNHOST_V6 else 0
                at = int(pos[0]) + R.POS_STORE_TIMESTAMP_V4 + born6 + 8
                host = bytes(buf[at : at + (16 if v6 else 4)])
                port = int(_at(buf, ">i4")[at + len(host)])
                ids = offset_msg_ids(host, port, phys)
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
                is_commit = (head.sys_flag & L.TRANSACTION_MASK) == L.TRANSACTION_COMMIT_TYPE
                txn = pc.if_else(pa.array(is_commit), txn, pa.scalar(None, pa.string()))
            values["transactionId"] = txn
    fields = [f for f in MESSAGE_SCHEMA if f.name in need]
    batch = pa.RecordBatch.from_arrays([values[f.name] for f in fields], schema=pa.schema(fields))
    if tag_filter is not None and not getattr(tag_filter, "match_all", False):
        batch = batch.filter(tag_filter.mask(batch.column("tags")))  # type: ignore[attr-defined]
    if sql_filter is not None:
        batch = batch.filter(sql_filter.mask(batch.column("properties")))  # type: ignore[attr-defined]
    if need != want:
        batch = batch.select([f.name for f in MESSAGE_SCHEMA if f.name in want])
    return batch
