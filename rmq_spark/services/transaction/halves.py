"""Half messages as records: what ``prepare`` writes and what ending them reads back.

A half's properties are its real message's (the client's, then ``UNIQ_KEY``,
``__transactionId__`` = the same id, ``PGROUP``) followed by ``REAL_TOPIC``, ``REAL_QID`` and
``TRAN_MSG``; a commit writes the real message with the half's properties but ``REAL_TOPIC`` and
``REAL_QID`` (``TRAN_MSG=true`` kept), as Apache RocketMQ 5.5.0 stores it.  :func:`half_rows`
builds them message by message (each one's properties encoded once, kept for the commit),
:func:`body_halves` column-wise for bodies that share their properties, :func:`read_halves` reads
many back in one vectorized pass.

Why this module is long: the three ways halves are built and read back (row by row, column-wise,
vectorized) must agree byte for byte on one property layout, so they stay side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rmq_spark.errors import MessageIllegalError, StoreError
from rmq_spark.services.redelivery.patch import ParsedRecords, parse_records, record_sizes
from rmq_spark.store import layout as L
from rmq_spark.store.encode import Row, encode_columns
from rmq_spark.store.encoded import EncodedBatch, concat_encoded
from rmq_spark.store.message import (
    IdColumn,
    Message,
    MessageExt,
    host_bytes,
    new_uniq_ids,
    new_uniq_ids_array,
    tags_code,
)
from rmq_spark.store.properties import CRC_KEY, PROP_CRC_BYTES, encode_properties
from rmq_spark.store.record import HEADER_V4
from rmq_spark.store.rowprops import RowProperties, decoded, id_column
from rmq_spark.store.store import MessageStore
from rmq_spark.store.validation import check_bodies, check_properties_size, check_topic_cached

__all__ = [
    "HALF_ONLY",
    "Half",
    "Real",
    "Row",
    "body_halves",
    "encode_rows",
    "half_of",
    "half_rows",
    "message_of",
    "parse_halves",
    "read_halves",
    "txn_id_of",
]

HALF_ONLY = (
    L.P_REAL_TOPIC,
    L.P_REAL_QID,
    L.P_TRAN_MSG,
)  # what a half adds (its commit keeps TRAN_MSG)
_ROUTING = (L.P_REAL_TOPIC, L.P_REAL_QID, CRC_KEY)  # what a commit drops of a half's properties
_UNIQ, _TXN_ID = f"{L.P_UNIQ_KEY}\x01", f"{L.P_TRANSACTION_ID}\x01"
_HALF_TOPIC_BYTES = L.TRANS_HALF_TOPIC.encode()
_BODY_POS = HEADER_V4.itemsize  # the topic field follows the body
_MIN_RECORD = HEADER_V4.itemsize + 3
# properties half_rows sets: a message that has any of them loses them (they are added after)
_ADDED = frozenset({L.P_UNIQ_KEY, L.P_TRANSACTION_ID, *HALF_ONLY})
_ADDED_WITH_GROUP = _ADDED | {L.P_PGROUP}
# (real topic, queue, TRAN_MSG) -> what a half adds to its real message, and those encoded (read
# only: the row's dict is a copy)
_TAILS: dict[tuple[str, int, str | None], tuple[dict[str, str], bytes]] = {}
_TAILS_MAX = 4096


# what a commit stores for a half, built once (at prepare, so that a commit encodes nothing
# again): real topic, real queue, properties, the properties encoded, tagsCode
Real = tuple[str, int, dict[str, str], bytes, int]


class Half:
    """A half to end: where it is, its transaction, the half as stored (a MessageExt when read
    back, else built on first use from ``row``, the half's record as prepare wrote it)."""

    __slots__ = (
        "_msg",
        "phys",
        "queue_offset",
        "real",
        "row",
        "seen",
        "store",
        "stored_ms",
        "txn_id",
    )

    def __init__(
        self,
        phys: int,
        queue_offset: int,
        txn_id: str,
        msg: Message | None = None,
        real: Real | None = None,
        row: Row | None = None,
        store: MessageStore | None = None,
        stored_ms: int | None = None,
    ) -> None:
        self.phys, self.queue_offset, self.txn_id = phys, queue_offset, txn_id
        self._msg, self.real, self.row = msg, real, row
        self.store = store  # where to read the half from when neither msg nor row is given
        self.stored_ms = stored_ms  # its store time when known without reading it back
        self.seen: dict[str, str | None] | None = None  # properties the vectorized read located

    @property
    def store_timestamp_ms(self) -> int | None:
        """When the half was stored (the broker's clock, unlike its born time); None: unknown."""
        if self.stored_ms is not None:
            return self.stored_ms
        return getattr(self.msg, "store_timestamp_ms", None)  # a MessageExt read back has it

    @property
    def properties(self) -> dict[str, str]:
        """The half's properties (no Message built for a half prepared moments ago)."""
        if self._msg is None and self.row is not None:
            return self.row[3]
        return self.msg.properties

    def prop(self, key: str) -> str | None:
        """One property of the half, without reading the half back when the vectorized read
        (:func:`read_halves`) located it."""
        seen = self.seen
        if seen is not None and self._msg is None and self.row is None and key in seen:
            return seen[key]
        return self.properties.get(key)

    @property
    def born_timestamp_ms(self) -> int:
        if self._msg is None and self.row is not None:
            return self.row[8]
        return self.msg.born_timestamp_ms

    @property
    def msg(self) -> Message:
        if self._msg is None and self.row is None and self.store is not None:
            m = self.store.look_message_by_offset(self.phys)
            if m is None or m.commitlog_offset != self.phys:
                raise StoreError(f"half message at CommitLog offset {self.phys} is gone")
            self._msg = m
        if self._msg is None:
            assert self.row is not None
            _, _, body, props, _, _, flag, sys_flag, born, host, port, reconsume, _ = self.row
            self._msg = Message(
                L.TRANS_HALF_TOPIC, body, props, 0, flag, sys_flag, born, host, port, reconsume
            )
        return self._msg

    def real_parts(self) -> Real:
        if self.real is None:
            p = self.msg.properties
            props = {k: v for k, v in p.items() if k not in _ROUTING}  # as Apache stores it
            enc = encode_properties(props)
            code = tags_code(p.get(L.P_TAGS))
            self.real = (p[L.P_REAL_TOPIC], int(p[L.P_REAL_QID]), props, enc, code)
        return self.real

    def real_row(self) -> Row:
        """The record a commit of this half writes (before the delivery hook)."""
        topic, qid, props, enc, code = self.real_parts()
        if self.row is not None:
            _, _, body, _, _, _, flag, sys_flag, born, host, port, reconsume, _ = self.row
        else:
            m = self.msg
            body, flag, sys_flag, born = m.body, m.flag, m.sys_flag, m.born_timestamp_ms
            host, port, reconsume = m.born_host, m.born_port, m.reconsume_times
        sys_flag = (sys_flag & ~L.TRANSACTION_MASK) | L.TRANSACTION_COMMIT_TYPE
        phys = self.phys
        return (
            topic,
            qid,
            body,
            props,
            enc,
            code,
            flag,
            sys_flag,
            born,
            host,
            port,
            reconsume,
            phys,
        )


def half_rows(
    store: MessageStore,
    now_ms: int,
    msgs: Sequence[Message],
    group: str | None = None,
    force: bool = False,
) -> tuple[list[Row], list[Real]]:
    """The records of the halves of ``msgs`` and what each one's commit will store.  A half's
    properties are its real message's followed by REAL_TOPIC, REAL_QID (and TRAN_MSG)."""
    ids = None  # new ids for the messages without one (made at the first of them)
    queues: dict[str, int] = {}
    tails = _TAILS
    added = _ADDED if group is None else _ADDED_WITH_GROUP
    group_tail = "" if group is None else f"{L.P_PGROUP}\x01{group}\x02"
    half_topic, mask = L.TRANS_HALF_TOPIC, ~L.TRANSACTION_MASK
    configs = store.topics.topics
    rows: list[Row] = []
    reals: list[Real] = []
    for m in msgs:
        topic, qid, p = m.topic, m.queue_id, m.properties
        n = queues.get(topic)
        if n is None:
            check_topic_cached(topic)
            cfg = configs.get(topic) or store.topics.get_or_create(topic)
            n = queues[topic] = max(cfg.write_queue_nums, cfg.read_queue_nums)
        if not 0 <= qid < n:
            raise MessageIllegalError(
                f"queueId {qid} is out of range for topic {topic!r} ({n} queues)"
            )
        uniq = p.get(L.P_UNIQ_KEY)
        if not uniq:
            if ids is None:
                ids = iter(new_uniq_ids(len(msgs)))
            uniq = next(ids)
        tran = "true" if force else p.get(L.P_TRAN_MSG)
        # the rare second case: the dict keeps the order of the encoding
        real = p.copy() if added.isdisjoint(p) else {k: v for k, v in p.items() if k not in added}
        enc = encode_properties(real)
        real[L.P_UNIQ_KEY] = real[L.P_TRANSACTION_ID] = uniq
        if group is not None:
            real[L.P_PGROUP] = group
        enc += f"{_UNIQ}{uniq}\x02{_TXN_ID}{uniq}\x02{group_tail}".encode()
        tail = tails.get((topic, qid, tran))
        if tail is None:
            extra = {L.P_REAL_TOPIC: topic, L.P_REAL_QID: str(qid)}
            if tran is not None:
                extra[L.P_TRAN_MSG] = tran
            if len(tails) >= _TAILS_MAX:
                tails.clear()
            tail = tails[(topic, qid, tran)] = (extra, encode_properties(extra))
        code = tags_code(p.get(L.P_TAGS))
        if tran is None:
            reals.append((topic, qid, real, enc, code))
        else:  # the commit keeps TRAN_MSG, as Apache
            reals.append(
                (
                    topic,
                    qid,
                    {**real, L.P_TRAN_MSG: tran},
                    enc + f"{L.P_TRAN_MSG}\x01{tran}\x02".encode(),
                    code,
                )
            )
        rows.append(
            (
                half_topic,
                0,
                m.body,
                {**real, **tail[0]},
                enc + tail[1],
                code,
                m.flag,
                m.sys_flag & mask,  # NOT_TYPE: the half queue has it
                m.born_timestamp_ms or now_ms,
                m.born_host,
                m.born_port,
                m.reconsume_times,
                0,
            )
        )
    return rows, reals


def body_halves(
    store: MessageStore,
    now_ms: int,
    topic: str,
    queue_id: int,
    bodies: Sequence[bytes],
    properties: dict[str, str] | RowProperties,
    producer_group: str,
    ids: np.ndarray | None = None,
    prepared_offsets: np.ndarray | None = None,
    body_crcs: np.ndarray | None = None,
) -> EncodedBatch:
    """The halves of messages of one topic and queue, built column-wise: shared ``properties``
    are encoded once and each record gets its own id twice (UNIQ_KEY, the transaction id) in one
    numpy pass; with :class:`RowProperties` (each record its own, encoded column-wise) the same
    parts are joined onto each record's by Arrow.  With ``prepared_offsets`` (the halves'
    CommitLog offsets, ``ids`` theirs): the real messages their commit writes instead, the same
    bytes :func:`~rmq_spark.services.transaction.commit.encode_commits` makes of them."""
    n = len(bodies)
    check_topic_cached(topic)
    cfg = store.topics.get_or_create(topic)
    nq = max(cfg.write_queue_nums, cfg.read_queue_nums)
    if not 0 <= queue_id < nq:
        raise MessageIllegalError(
            f"queueId {queue_id} is out of range for topic {topic!r} ({nq} queues)"
        )
    bodies = check_bodies(
        bodies, store.config.body_max_bytes
    )  # a list, or an Arrow column (a sink's rows)
    if isinstance(properties, RowProperties):
        return _row_halves(
            store,
            now_ms,
            topic,
            queue_id,
            bodies,
            properties,
            producer_group,
            ids,
            prepared_offsets,
            body_crcs,
        )
    added = {L.P_UNIQ_KEY, L.P_TRANSACTION_ID, L.P_PGROUP, *HALF_ONLY}
    base = {k: v for k, v in properties.items() if k not in added}
    pre = encode_properties(base) + _UNIQ.encode()
    mid = f"\x02{_TXN_ID}".encode()
    tail = {
        L.P_PGROUP: producer_group,
        L.P_REAL_TOPIC: topic,
        L.P_REAL_QID: str(queue_id),
        L.P_TRAN_MSG: "true",
    }
    if prepared_offsets is not None:  # the real messages: the half's routing dropped, TRAN_MSG kept
        tail = {L.P_PGROUP: producer_group, L.P_TRAN_MSG: "true"}
    post = b"\x02" + encode_properties(tail)
    width = len(pre) + 32 + len(mid) + 32 + len(post)
    cfg_store = store.config
    check_properties_size(bytes(width + (PROP_CRC_BYTES if cfg_store.append_prop_crc else 0)))
    ids = new_uniq_ids_array(n) if ids is None else ids
    enc = np.empty((n, width), dtype=np.uint8)
    at = 0
    for part in (pre, ids, mid, ids, post):
        w = 32 if isinstance(part, np.ndarray) else len(part)
        enc[:, at : at + w] = (
            part if isinstance(part, np.ndarray) else np.frombuffer(part, dtype=np.uint8)
        )
        at += w
    real = prepared_offsets is not None
    batch = encode_columns(
        topic if real else L.TRANS_HALF_TOPIC,
        queue_id if real else 0,
        bodies,
        [{**base, **tail}] * n,  # one shared dict: tags and keys are the same for all
        enc,
        sys_flags=L.TRANSACTION_COMMIT_TYPE if real else 0,
        prepared_offsets=prepared_offsets if prepared_offsets is not None else 0,
        born_timestamps=now_ms,
        store_host=host_bytes(cfg_store.store_host),
        store_port=cfg_store.store_port,
        prop_crc=cfg_store.append_prop_crc,
        tags_codes=np.full(n, tags_code(base.get(L.P_TAGS)), dtype=np.int64),
        body_crcs=body_crcs,
    )
    batch.uniq_keys = IdColumn(ids)
    return batch


def _row_halves(  # type: ignore[no-untyped-def]
    store: MessageStore,
    now_ms: int,
    topic: str,
    queue_id: int,
    bodies: Sequence[bytes],
    props: RowProperties,
    producer_group: str,
    ids,
    prepared_offsets,
    body_crcs=None,
) -> EncodedBatch:
    """:func:`body_halves` of records each with its own properties (checked by the caller: no
    reserved key among them)."""
    n = len(bodies)
    real = prepared_offsets is not None
    tail = {
        L.P_PGROUP: producer_group,
        L.P_REAL_TOPIC: topic,
        L.P_REAL_QID: str(queue_id),
        L.P_TRAN_MSG: "true",
    }
    if real:  # a commit's real messages: the half's routing dropped, TRAN_MSG kept (as Apache)
        tail = {L.P_PGROUP: producer_group, L.P_TRAN_MSG: "true"}
    post = b"\x02" + encode_properties(tail)
    cfg_store = store.config
    extra = len(_UNIQ) + 32 + 1 + len(_TXN_ID) + 32 + len(post)
    check_properties_size(
        bytes(props.max_bytes() + extra + (PROP_CRC_BYTES if cfg_store.append_prop_crc else 0))
    )
    ids = new_uniq_ids_array(n) if ids is None else ids
    id_arr = id_column(ids)
    full = props.joined(_UNIQ.encode(), id_arr, f"\x02{_TXN_ID}".encode(), id_arr, post)
    uniq = IdColumn(ids)
    batch = encode_columns(
        topic if real else L.TRANS_HALF_TOPIC, queue_id if real else 0, bodies, decoded(full), full,
        sys_flags=L.TRANSACTION_COMMIT_TYPE if real else 0, prepared_offsets=prepared_offsets if real else 0,
        born_timestamps=now_ms, store_host=host_bytes(cfg_store.store_host), store_port=cfg_store.store_port,
        prop_crc=cfg_store.append_prop_crc, tags_codes=props.tags_codes, keys=props.keys, uniq_keys=uniq,
        body_crcs=body_crcs,
    )  # fmt: skip
    batch.uniq_keys = uniq
    return batch


def encode_rows(
    store: MessageStore, rows: list[Row], tail: EncodedBatch | Sequence[EncodedBatch] | None = None
) -> EncodedBatch:
    """``rows`` (checked, each with its UNIQ_KEY), then the records of ``tail`` (one batch or
    several, joined with the rows in one copy), as one batch to
    append: the bulk form of ``store.put_messages``' encoding for records whose properties are
    already encoded."""
    cfg = store.config
    (
        topics,
        qids,
        bodies,
        props,
        encs,
        codes,
        flags,
        sys_flags,
        born,
        hosts,
        ports,
        reconsume,
        prepared,
    ) = zip(*rows, strict=True)
    reserve = PROP_CRC_BYTES if cfg.append_prop_crc else 0
    if max(map(len, encs)) + reserve > L.PROPERTY_MAX_BYTES:
        for e in encs:
            check_properties_size(e + bytes(reserve))
    one_queue = topics.count(topics[0]) == len(topics) and qids.count(qids[0]) == len(qids)
    one_host = hosts.count(hosts[0]) == len(hosts)
    batch = encode_columns(
        topics[0] if one_queue else topics,
        qids[0] if one_queue else qids,
        bodies,
        props,
        encs,
        flags=flags,
        sys_flags=sys_flags,
        born_timestamps=born,
        born_hosts=host_bytes(hosts[0]) if one_host else [host_bytes(h) for h in hosts],
        born_ports=ports,
        reconsume_times=reconsume,
        prepared_offsets=prepared,
        store_host=host_bytes(cfg.store_host),
        store_port=cfg.store_port,
        prop_crc=cfg.append_prop_crc,
        tags_codes=np.array(codes, dtype=np.int64),
    )
    if tail is None:
        return batch
    return concat_encoded([batch, tail] if isinstance(tail, EncodedBatch) else [batch, *tail])


def read_halves(
    store: MessageStore,
    offsets: list[int],
    keys: tuple[str, ...],
    read_one: Callable[[int], Half | None],
    also: tuple[str, ...] = (),
) -> tuple[list[Half | None], tuple[np.ndarray, ParsedRecords] | None]:
    """Halves at ``offsets`` read in one vectorized pass over their bytes (transaction id and
    queue offset; the message itself is read when needed), None where no half starts; and, when
    every offset held a half, their parse (properties ``keys`` located) for a commit to reuse.
    ``read_one`` reads what the vectorized pass cannot (unusual bytes).  The values of the
    properties ``also`` (keys of up to 16 bytes) are kept on each half (:meth:`Half.prop`), so a
    check of them over many halves reads none back."""
    also = tuple(k for k in also if len(k.encode()) <= 16)
    keys = keys + tuple(k for k in also if k not in keys)
    phys = np.asarray(offsets, dtype=np.int64)
    sizes = record_sizes(store, phys)
    good = sizes >= _MIN_RECORD
    rec = parse_records(store, phys[good], sizes[good], keys) if good.any() else None
    if rec is None:  # unusual bytes somewhere: one by one
        return [read_one(p) for p in offsets], None
    head = rec.head
    tpos = rec.starts + _BODY_POS + head["body_len"].astype(np.int64)
    at = np.minimum(tpos[:, None] + 1 + np.arange(len(_HALF_TOPIC_BYTES)), len(rec.u8) - 1)
    topic = rec.u8[at]
    ok = (
        (head["physical_offset"] == phys[good])
        & (rec.u8[tpos] == len(_HALF_TOPIC_BYTES))
        & (topic == np.frombuffer(_HALF_TOPIC_BYTES, dtype=np.uint8)).all(axis=1)
    )
    uniq, real, qid = (rec.values(k) for k in (L.P_UNIQ_KEY, L.P_REAL_TOPIC, L.P_REAL_QID))
    if uniq is None or real is None or qid is None:
        return [read_one(p) for p in offsets], None
    seen = {k: rec.values(k) for k in also}
    if any(v is None for v in seen.values()):
        seen = {}  # a value that is not UTF-8: such halves are read back when asked
    out: list[Half | None] = [None] * len(offsets)
    rows = zip(
        np.flatnonzero(good).tolist(),
        phys[good].tolist(),
        head["queue_offset"].tolist(),
        head["store_timestamp"].tolist(),
        strict=True,
    )
    for j, (i, p, q, stored) in enumerate(rows):
        if not (ok[j] and real[j] and (qj := qid[j]) and qj.isdigit()):
            continue
        u = uniq[j]
        if not u:
            out[i] = read_one(p)
            continue
        h = out[i] = Half(p, q, u, store=store, stored_ms=stored)
        if seen:
            h.seen = {k: v[j] for k, v in seen.items()}  # type: ignore[index]
    return out, ((phys[good], rec) if good.all() and ok.all() else None)


def parse_halves(
    store: MessageStore, offsets: Sequence[int], keys: tuple[str, ...]
) -> tuple[ParsedRecords, list[str]] | None:
    """The records at ``offsets`` parsed in one vectorized pass (properties ``keys`` located) and
    their transaction ids, when every one is a half with its id and its destination; else None
    (the caller takes the general path, :func:`read_halves`)."""
    phys = np.asarray(offsets, dtype=np.int64)
    sizes = record_sizes(store, phys)
    if len(phys) == 0 or (sizes < _MIN_RECORD).any():
        return None
    rec = parse_records(store, phys, sizes, keys)
    if rec is None:
        return None
    head = rec.head
    tpos = rec.starts + _BODY_POS + head["body_len"].astype(np.int64)
    at = np.minimum(tpos[:, None] + 1 + np.arange(len(_HALF_TOPIC_BYTES)), len(rec.u8) - 1)
    halves = (
        (head["physical_offset"] == phys)
        & (rec.u8[tpos] == len(_HALF_TOPIC_BYTES))
        & (rec.u8[at] == np.frombuffer(_HALF_TOPIC_BYTES, dtype=np.uint8)).all(axis=1)
    )
    uniq = rec.values(L.P_UNIQ_KEY)
    if not halves.all() or uniq is None or None in uniq:
        return None
    return rec, uniq  # type: ignore[return-value]


def message_of(row: Row) -> Message:
    """The message a record is written from."""
    topic, qid, body, props, _, _, flag, sys_flag, born, host, port, reconsume, prepared = row
    return Message(topic, body, props, qid, flag, sys_flag, born, host, port, reconsume, prepared)


def txn_id_of(m: Message) -> str:
    """A transaction's id: the client's message id (``UNIQ_KEY``)."""
    return m.properties.get(L.P_UNIQ_KEY) or m.properties.get(L.P_TRANSACTION_ID) or ""


def half_of(m: MessageExt) -> Half | None:
    """``m`` (read from the half queue) as a half to end; None if it lacks its destination."""
    if L.P_REAL_TOPIC not in m.properties or not m.properties.get(L.P_REAL_QID, "").isdigit():
        return None
    return Half(m.commitlog_offset, m.queue_offset, txn_id_of(m), m)
