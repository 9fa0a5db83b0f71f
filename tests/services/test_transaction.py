"""Transactional messages: half / op topics, end transaction, group commit, check-back, crashes."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pyarrow as pa
import pytest
from _killing import lines_until_killed

from rmq_spark.errors import MessageIllegalError
from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.core import BrokerCore
from rmq_spark.services.redelivery.records import DELIVERY_REQUEST_KEYS
from rmq_spark.services.transaction.check import (
    CHECK_GROUP,
    P_CHECK_SOURCE,
    calculate_op_offset,
    immunity_time_ms,
    op_half_offsets,
)
from rmq_spark.services.transaction.service import (
    EndTxStatus,
    HalfRef,
    TransactionService,
    TxnState,
)
from rmq_spark.services.transaction.service import TransactionAction as A
from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock, SystemClock
from rmq_spark.store.config import TopicConfig
from rmq_spark.store.index.service import IndexService
from rmq_spark.store.message import Message, MessageExt
from rmq_spark.store.query import MessageQuery
from rmq_spark.store.store import MessageStore, StoreConfig

HALF, OP, MAXT = L.TRANS_HALF_TOPIC, L.TRANS_OP_HALF_TOPIC, L.TRANS_CHECK_MAX_TIME_TOPIC
SMALL = {"commitlog_segment_bytes": 64 * 1024, "cq_segment_units": 64}
PG = "PG"


class Env:
    """A store and its transaction service on a FakeClock; ``restart`` reopens both."""

    def __init__(self, root: str, **cfg: object) -> None:
        self.root, self.cfg, self.clock = root, cfg, FakeClock()
        self.checks: list[tuple[str, MessageExt]] = []
        self.open()

    def open(self) -> None:
        self.store = MessageStore(
            self.root, StoreConfig(**SMALL), clock=self.clock, start_services=False
        )
        self.svc = TransactionService(self.store, BrokerConfig(**self.cfg), self.clock)  # type: ignore[arg-type]
        self.svc.set_checker(self)

    def check(self, producer_group: str, half: MessageExt) -> None:
        self.checks.append((producer_group, half))

    def restart(self, crash: bool = True) -> None:
        self.svc.shutdown()
        self.store.crash() if crash else self.store.shutdown()
        self.open()

    def prepare(
        self, n: int, topic: str = "T", group: str = PG, **props: str
    ) -> list[tuple[int, int, str]]:
        msgs = [
            Message(topic, b"m%d" % i, {"TAGS": "a", **props}, queue_id=i % 4) for i in range(n)
        ]
        r = self.svc.prepare(msgs, group)
        return [
            (int(p), int(q), u)
            for p, q, u in zip(
                r.append.phys_offsets, r.append.queue_offsets, r.uniq_keys, strict=True
            )
        ]

    def end(self, h: tuple[int, int, str], action: A, **kw: object) -> EndTxStatus:
        return self.svc.end_transaction(h[0], h[1], kw.pop("group", PG), h[2], action, **kw)  # type: ignore[arg-type]

    def real(self, topic: str = "T") -> list[MessageExt]:
        out = []
        for q in range(4):
            out += self.store.get_messages(topic, q, 0, max_msgs=10_000).messages
        return out

    def queue(self, topic: str) -> list[MessageExt]:
        return self.store.get_messages(topic, 0, 0, max_msgs=10_000).messages

    def offsets(self) -> tuple[int, int]:
        o = self.store.offsets
        return o.query(CHECK_GROUP, HALF, 0), o.query(CHECK_GROUP, OP, 0)

    def close(self) -> None:
        self.svc.shutdown()
        self.store.shutdown()


@pytest.fixture
def env(store_dir):
    e = Env(store_dir)
    yield e
    if not e.store.closed:
        e.close()


# --- prepare ------------------------------------------------------------------------------------------
def test_half_is_stored_in_half_topic_and_never_in_its_real_topic(env):
    given = Message(
        "T",
        b"x",
        {"TAGS": "a", L.P_TRAN_MSG: "true", L.P_PGROUP: PG, L.P_UNIQ_KEY: "CLIENT-ID"},
        queue_id=2,
        sys_flag=L.TRANSACTION_PREPARED_TYPE,
    )
    half = env.svc.transform(given)
    r = env.store.put_messages(
        [half, env.svc.transform(Message("T", b"y", {L.P_TRAN_MSG: "TRUE"}))]
    )
    assert r.ok and env.store.max_offset("T", 2) == 0 and env.store.max_offset("T", 0) == 0
    stored = env.queue(HALF)
    assert [m.queue_offset for m in stored] == [0, 1]
    p = stored[0].properties
    assert (p[L.P_REAL_TOPIC], p[L.P_REAL_QID], p[L.P_PGROUP], p[L.P_TRAN_MSG]) == (
        "T",
        "2",
        PG,
        "true",
    )
    assert p[L.P_TRANSACTION_ID] == p[L.P_UNIQ_KEY] == "CLIENT-ID"
    assert stored[0].transaction_type == L.TRANSACTION_NOT_TYPE  # so the half queue indexes it
    assert stored[1].properties[L.P_UNIQ_KEY] == stored[1].properties[L.P_TRANSACTION_ID] != ""
    assert env.store.read_arrow("T", 2, 0, 10).num_rows == 0


def test_transform_leaves_other_messages_alone_and_checks_the_real_queue(env):
    plain = Message("T", b"x", {"TAGS": "a"})
    assert env.svc.transform(plain) is plain
    half = env.svc.transform(Message("T", b"x", {L.P_TRAN_MSG: "true"}))
    assert env.svc.transform(half) is half  # already a half
    with pytest.raises(MessageIllegalError, match="queueId 9"):
        env.svc.transform(Message("T", b"x", {L.P_TRAN_MSG: "true"}, queue_id=9))
    with pytest.raises(MessageIllegalError, match="system topic"):
        env.svc.transform(Message(OP, b"x", {L.P_TRAN_MSG: "true"}))


def test_broker_core_send_stores_halves_and_a_commit_goes_through_the_other_hooks(store_dir):
    core = BrokerCore(
        store_dir, BrokerConfig(store=StoreConfig(**SMALL)), FakeClock(), start_services=False
    )
    try:
        svc = core.transactions
        msgs = [
            Message(
                "T",
                b"now",
                {L.P_TRAN_MSG: "true", L.P_PGROUP: PG},
                sys_flag=L.TRANSACTION_PREPARED_TYPE,
            ),
            Message(
                "T",
                b"later",
                {L.P_TRAN_MSG: "true", L.P_PGROUP: PG, L.P_DELAY: "2"},
                sys_flag=L.TRANSACTION_PREPARED_TYPE,
            ),
        ]
        r = core.send(msgs)
        assert (
            core.store.max_offset(HALF, 0) == 2 and core.store.max_offset(L.SCHEDULE_TOPIC, 1) == 0
        )
        svc.real_message_hook = core._delivery_hooks  # a committed delayed message is delayed then
        for p, q in zip(
            r.append.phys_offsets.tolist(), r.append.queue_offsets.tolist(), strict=True
        ):
            assert svc.end_transaction(p, q, PG, None, A.COMMIT) is EndTxStatus.SUCCESS
        assert (
            core.store.max_offset("T", 0) == 1 and core.store.max_offset(L.SCHEDULE_TOPIC, 1) == 1
        )
    finally:
        core.shutdown()


# --- end transaction ----------------------------------------------------------------------------------
def test_commit_appends_op_then_real_message_in_one_write(env):
    (h,) = env.prepare(1)
    env.clock.advance(1234)
    assert env.end(h, A.COMMIT) is EndTxStatus.SUCCESS
    (real,) = env.real()
    (op,) = env.queue(OP)
    assert op.commitlog_offset + op.store_size == real.commitlog_offset  # op first, same append
    assert (op.tags, op.body, op.properties["TRAN_OP_ACTION"], op.properties["TRAN_OP_GROUP"]) == (
        "d",
        b"0,",
        "COMMIT",
        "1",
    )
    assert (real.topic, real.queue_id, real.body) == ("T", 0, b"m0")
    assert real.transaction_type == L.TRANSACTION_COMMIT_TYPE
    assert real.prepared_transaction_offset == h[0]
    assert real.born_timestamp_ms == env.clock.now_ms() - 1234
    assert real.store_timestamp_ms == env.clock.now_ms()
    # as Apache RocketMQ 5.5.0 stores it: the routing gone, TRAN_MSG=true kept
    assert not {L.P_REAL_TOPIC, L.P_REAL_QID} & set(real.properties)
    assert real.properties[L.P_TRAN_MSG] == "true"
    assert real.properties[L.P_TRANSACTION_ID] == real.properties[L.P_UNIQ_KEY] == h[2]
    assert env.store.read_arrow("T", 0, 0, 1).column("transactionId").to_pylist() == [h[2]]


def test_rollback_writes_only_the_op_and_unknown_writes_nothing(env):
    a, b = env.prepare(2)
    end = env.store.commitlog.max_offset
    assert env.end(b, A.UNKNOWN) is EndTxStatus.NOT_HANDLED
    assert env.store.commitlog.max_offset == end
    assert env.end(a, A.ROLLBACK) is EndTxStatus.SUCCESS
    assert env.real() == []
    (op,) = env.queue(OP)
    assert (op.body, op.properties["TRAN_OP_ACTION"]) == (b"0,", "ROLLBACK")
    assert env.svc.state(a[0]) is TxnState.ROLLED_BACK and env.svc.is_pending(b[0])


def test_second_commit_and_commit_after_rollback_are_rejected(env):
    a, b = env.prepare(2)
    assert env.end(a, A.COMMIT) is EndTxStatus.SUCCESS
    assert env.end(a, A.COMMIT) is EndTxStatus.ALREADY_COMMITTED
    assert env.end(a, A.ROLLBACK) is EndTxStatus.ALREADY_COMMITTED
    assert env.end(b, A.ROLLBACK) is EndTxStatus.SUCCESS
    assert env.end(b, A.COMMIT, from_check=True) is EndTxStatus.ALREADY_ROLLED_BACK
    env.restart()  # the resolved set is rebuilt from the op queue
    assert env.end(a, A.COMMIT) is EndTxStatus.ALREADY_COMMITTED
    assert env.end(b, A.COMMIT) is EndTxStatus.ALREADY_ROLLED_BACK
    assert [m.body for m in env.real()] == [b"m0"]
    assert len(env.queue(OP)) == 2


def test_concurrent_commits_of_one_transaction_write_it_once(env):
    (h,) = env.prepare(1)
    results: list[EndTxStatus] = []
    threads = [
        threading.Thread(target=lambda: results.append(env.end(h, A.COMMIT))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(EndTxStatus.SUCCESS) == 1
    assert set(results) <= {
        EndTxStatus.SUCCESS,
        EndTxStatus.ALREADY_COMMITTED,
        EndTxStatus.IN_PROGRESS,
    }
    assert len(env.real()) == 1 and len(env.queue(OP)) == 1


def test_end_transaction_validates_like_end_transaction_processor(env):
    a, b = env.prepare(2)
    assert env.end(a, A.COMMIT, group="OTHER") is EndTxStatus.PRODUCER_GROUP_MISMATCH
    assert env.svc.end_transaction(a[0], 1, PG, a[2], A.COMMIT) is EndTxStatus.QUEUE_OFFSET_MISMATCH
    assert (
        env.svc.end_transaction(a[0], 0, PG, b[2], A.COMMIT) is EndTxStatus.TRANSACTION_ID_MISMATCH
    )
    for bad in (a[0] + 7, b[0] + b[0] - a[0] + 100, 10**9, -1):  # inside a record, past the end
        assert env.svc.end_transaction(bad, 0, PG, None, A.COMMIT) is EndTxStatus.NOT_FOUND
    assert env.svc.end_transaction(a[0], None, PG, None, A.COMMIT) is EndTxStatus.SUCCESS
    (real,) = env.real()
    assert (
        env.svc.end_transaction(real.commitlog_offset, 0, PG, None, A.COMMIT)
        is EndTxStatus.NOT_FOUND
    )
    assert env.svc.state(real.commitlog_offset) is TxnState.NOT_FOUND
    with pytest.raises(MessageIllegalError):
        env.end(b, "MAYBE")  # type: ignore[arg-type]
    assert env.end(b, "commit_message") is EndTxStatus.SUCCESS  # ok: LocalTransactionState names


def test_producer_end_after_immunity_is_illegal_but_a_checked_end_is_not(env):
    assert [immunity_time_ms(v, 6000) for v in ("1", "7", "x", None)] == [6000, 7000, 6000, 6000]
    (a,) = env.prepare(1, **{L.P_CHECK_IMMUNITY_TIME_IN_SECONDS: "10"})
    env.clock.advance(10_001)
    assert env.end(a, A.COMMIT) is EndTxStatus.ILLEGAL_OPERATION
    assert env.end(a, A.ROLLBACK) is EndTxStatus.ILLEGAL_OPERATION
    assert env.end(a, A.COMMIT, from_check=True) is EndTxStatus.SUCCESS
    (c,) = env.prepare(1)  # no property: no limit
    env.clock.advance(3_600_000)
    assert env.end(c, A.COMMIT) is EndTxStatus.SUCCESS


# --- group commit -------------------------------------------------------------------------------------
def test_commit_group_is_one_append_with_one_batched_op(env):
    hs = env.prepare(6, topic="T") + env.prepare(2, topic="U")
    r = env.svc.commit_group(
        [h[0] for h in hs[:3]]
        + [HalfRef(hs[3][0], hs[3][1], PG, hs[3][2])]
        + [(h[0], h[1]) for h in hs[4:]]
    )
    assert r.ok and len(r.transaction_ids) == 8 and r.rejected == {}
    assert len(r.put.append.phys_offsets) == 9
    (op,) = env.queue(OP)
    assert op.body == b"0,1,2,3,4,5,6,7," and op.properties["TRAN_OP_GROUP"] == "8"
    assert op.commitlog_offset == r.put.append.wrote_offset
    assert sorted(m.body for m in env.real("T") + env.real("U")) == sorted(
        b"m%d" % i for i in (0, 1, 2, 3, 4, 5, 0, 1)
    )
    assert (
        env.svc.commit_group([h[0] for h in hs]).status is EndTxStatus.ALREADY_COMMITTED
    )  # a retried group
    assert len(env.real("T")) == 6


def _mixed_batch(n: int) -> list[Message]:
    """Messages of two topics and four queues; some carry their own UNIQ_KEY, PGROUP or the
    half-only properties, some an IPv6 born host, a flag or a reconsume count."""
    out = []
    for i in range(n):
        props = {"TAGS": f"t{i % 3}", "KEYS": f"k{i} k{i}b", "order": str(i)}
        if i % 5 == 0:
            props[L.P_UNIQ_KEY] = f"CLIENT-{i}"
        if i % 7 == 0:
            props.update({L.P_TRAN_MSG: "true", L.P_REAL_TOPIC: "Elsewhere", L.P_PGROUP: "other"})
        out.append(
            Message(
                "T" if i % 2 else "U",
                b"body-%d" % i,
                props,
                queue_id=i % 4,
                flag=i % 3,
                born_timestamp_ms=1000 + i,
                born_host="::1" if i % 11 == 0 else f"10.0.0.{i % 3}",
                born_port=i,
                reconsume_times=i % 2,
            )
        )
    return out


def _expected_real(m: Message, uniq: str) -> dict[str, str]:
    """What a commit stores: the half's properties without REAL_TOPIC / REAL_QID, TRAN_MSG kept
    (as Apache RocketMQ 5.5.0 stores it)."""
    drop = {L.P_TRAN_MSG, L.P_REAL_TOPIC, L.P_REAL_QID}
    props = {k: v for k, v in m.properties.items() if k not in drop}
    props.update(
        {L.P_UNIQ_KEY: uniq, L.P_TRANSACTION_ID: uniq, L.P_PGROUP: PG, L.P_TRAN_MSG: "true"}
    )
    return props


@pytest.mark.parametrize("from_disk", [False, True])
def test_a_big_group_commit_stores_each_half_as_its_real_message(env, from_disk):
    """The bulk prepare / commit (properties encoded once, at prepare) against the record-level
    rules, both for halves still in memory and for halves read back after a restart."""
    msgs = _mixed_batch(300)
    r = env.svc.prepare(msgs, PG)
    assert r.ok and len(r.uniq_keys) == 300
    own = [u for i, u in enumerate(r.uniq_keys) if i % 5 == 0]
    assert own == [f"CLIENT-{i}" for i in range(0, 300, 5)]
    halves = env.queue(HALF)
    assert [h.commitlog_offset for h in halves] == r.append.phys_offsets.tolist()
    for m, h, u in zip(msgs, halves, r.uniq_keys, strict=True):
        assert h.properties == {
            **{k: v for k, v in _expected_real(m, u).items() if k != L.P_TRAN_MSG},
            L.P_REAL_TOPIC: m.topic,
            L.P_REAL_QID: str(m.queue_id),
            L.P_TRAN_MSG: "true",
        }
        assert (h.body, h.flag, h.born_host, h.born_port) == (
            m.body,
            m.flag,
            m.born_host,
            m.born_port,
        )
    if from_disk:
        env.restart()
    g = env.svc.commit_group(r.append.phys_offsets.tolist())
    assert g.ok and sorted(g.transaction_ids) == sorted(r.uniq_keys)
    real = {m.prepared_transaction_offset: m for m in env.real("T") + env.real("U")}
    assert len(real) == 300
    for m, p, u in zip(msgs, r.append.phys_offsets.tolist(), r.uniq_keys, strict=True):
        got = real[p]
        assert (got.topic, got.queue_id, got.body, got.flag, got.reconsume_times) == (
            m.topic,
            m.queue_id,
            m.body,
            m.flag,
            m.reconsume_times,
        )
        assert (got.born_timestamp_ms, got.born_host, got.born_port) == (
            m.born_timestamp_ms,
            m.born_host,
            m.born_port,
        )
        assert got.properties == _expected_real(m, u)
        assert got.transaction_type == L.TRANSACTION_COMMIT_TYPE
    tags = env.store.read_arrow("T", 1, 0, 100).column("tags").to_pylist()
    assert tags == [f"t{i % 3}" for i in range(1, 300, 4)]  # tagsCode and tag agree


def _real_records(store: MessageStore) -> list[tuple]:
    """The real messages of topics T and U as comparable tuples (offsets and store time left out)."""
    out = []
    for topic in ("T", "U"):
        for q in range(4):
            for m in store.get_messages(topic, q, 0, max_msgs=10_000).messages:
                out.append(
                    (
                        m.topic,
                        m.queue_id,
                        m.body,
                        m.flag,
                        m.sys_flag,
                        m.born_timestamp_ms,
                        m.born_host,
                        m.born_port,
                        m.reconsume_times,
                        list(m.properties.items()),
                    )
                )
            units = store.consume_queue(topic, q, create=False)
            if units is not None:
                out.append(units.units(0, units.max_offset)["tags_code"].tolist())
    return out


@pytest.mark.parametrize("prop_crc", [False, True])
def test_a_patched_group_commit_writes_what_the_general_path_writes(
    tmp_path, monkeypatch, prop_crc
):
    """Large groups of halves read back from the store are committed by patching their bytes;
    the records, their queues and tags codes, and the index entries of their keys equal those of
    the general path."""
    import rmq_spark.services.transaction.service as T

    msgs = [m for m in _mixed_batch(400) if m.born_host != "::1"]  # IPv4: the patchable records
    runs, patched = [], []
    encode = T.encode_commits
    monkeypatch.setattr(
        T, "encode_commits", lambda *a, **k: patched.append(encode(*a, **k)) or patched[-1]
    )

    def reopen(patch: bool) -> tuple[MessageStore, TransactionService]:
        store = MessageStore(
            str(tmp_path / str(patch)),
            StoreConfig(**SMALL, append_prop_crc=prop_crc),
            clock=FakeClock(),
            dispatchers=[IndexService],
            start_services=False,
        )
        svc = TransactionService(store, BrokerConfig(), store.clock)
        svc.real_message_hook, svc.hook_only_on = (lambda m: m), DELIVERY_REQUEST_KEYS
        return store, svc

    for patch in (True, False):
        monkeypatch.setattr(T, "PATCH_COMMIT_MIN", 1 if patch else 10**9)
        store, svc = reopen(patch)
        r = svc.prepare([replace(m, properties=dict(m.properties)) for m in msgs], PG)
        svc.shutdown()
        store.shutdown()
        store, svc = reopen(patch)  # the halves read back: not in memory any more
        assert svc.commit_group(r.append.phys_offsets.tolist()).ok
        ids = {u: f"<id{i}>" for i, u in enumerate(r.uniq_keys)}  # fresh ids per run
        records = [
            (
                m.topic, m.queue_id, m.body, m.flag, m.sys_flag, m.born_timestamp_ms, m.born_host,
                m.born_port, m.reconsume_times, m.prepared_transaction_offset,
                [(k, ids.get(v, v)) for k, v in m.properties.items()],
            )
            for topic in ("T", "U") for q in range(4)
            for m in store.get_messages(topic, q, 0, max_msgs=10_000).messages
        ]  # fmt: skip
        cqs = [store.consume_queue(t, q) for t in ("T", "U") for q in range(4)]
        codes = [cq.units(0, cq.max_offset)["tags_code"].tolist() for cq in cqs if cq is not None]
        by_key = [m.body for m in MessageQuery(store).by_key("T", "k13b")]
        runs.append((records, codes, by_key, svc.hook_only_on))
        svc.shutdown()
        store.shutdown()
    assert len(runs[0][0]) == len(msgs) and runs[0][2] == [b"body-13"]
    assert runs[0] == runs[1]
    assert len(patched) == 1 and len(patched[0]) == len(msgs)  # the first run patched, in one pass
    assert {r[4] & L.TRANSACTION_MASK for r in runs[0][0]} == {L.TRANSACTION_COMMIT_TYPE}


@pytest.mark.parametrize("n", [5, 300])
def test_prepare_bodies_stores_what_prepare_stores(env, n):
    """The column-wise prepare of bodies sharing properties: the same halves as ``prepare`` (ids
    aside), committed to the same real messages."""
    props = {"TAGS": "t", "KEYS": "a b", "sink": "q|1|x"}
    bodies = [b"b%d" % i for i in range(n)]
    r1 = env.svc.prepare_bodies("T", 2, bodies, props, PG)
    r2 = env.svc.prepare([Message("T", b, dict(props), queue_id=2) for b in bodies], PG)

    def view(ms: list[MessageExt], ids: list[str]) -> list[tuple]:
        name = {u: f"<id{i}>" for i, u in enumerate(ids)}
        return [
            (
                m.topic,
                m.queue_id,
                m.body,
                m.sys_flag,
                [(k, name.get(v, v)) for k, v in m.properties.items()],
            )
            for m in ms
        ]

    halves = env.queue(HALF)
    assert view(halves[:n], r1.uniq_keys) == view(halves[n:], r2.uniq_keys)
    with pytest.raises(MessageIllegalError, match="out of range"):
        env.svc.prepare_bodies("T", 9, bodies, props, PG)
    assert env.svc.commit_group(
        r1.append.phys_offsets.tolist() + r2.append.phys_offsets.tolist()
    ).ok
    real = env.store.get_messages("T", 2, 0, max_msgs=10_000).messages
    assert view(real[:n], r1.uniq_keys) == view(real[n:], r2.uniq_keys)
    assert [m.body for m in real[:n]] == bodies


@pytest.mark.parametrize("prop_crc", [False, True])
def test_a_few_records_are_encoded_as_the_columns_encode_them(tmp_path, monkeypatch, prop_crc):
    """Prepares and ends of up to FEW_RECORDS messages encode their records straight from their
    rows, larger ones through the columns of ``encode_rows``: the same records either way (IPv6 born hosts,
    flags, clients' own ids and half-only properties included)."""
    import rmq_spark.services.transaction.service as T

    msgs = _mixed_batch(7)
    runs = []
    for few in (T.FEW_RECORDS, 0):
        monkeypatch.setattr(T, "FEW_RECORDS", few)
        store = MessageStore(
            str(tmp_path / str(few)),
            StoreConfig(**SMALL, append_prop_crc=prop_crc),
            clock=FakeClock(),
            start_services=False,
        )
        svc = TransactionService(store, BrokerConfig(), store.clock)
        r = svc.prepare([replace(m, properties=dict(m.properties)) for m in msgs], PG)
        offsets, queue_offsets = r.append.phys_offsets.tolist(), r.append.queue_offsets.tolist()
        assert svc.commit_group(offsets[:4]).ok
        assert svc.end_transaction(offsets[4], queue_offsets[4], PG, r.uniq_keys[4], A.COMMIT) is (
            EndTxStatus.SUCCESS
        )
        assert svc.end_transaction(offsets[5], None, PG, None, A.ROLLBACK) is EndTxStatus.SUCCESS
        ids: dict[str, int] = {}  # generated ids, by first appearance
        named = (L.P_UNIQ_KEY, L.P_TRANSACTION_ID)
        records = [
            (
                m.topic, m.queue_id, m.body, m.body_crc, m.flag, m.sys_flag, m.born_timestamp_ms,
                m.born_host, m.born_port, m.store_host, m.store_port, m.reconsume_times,
                m.prepared_transaction_offset, m.store_size,
                [(k, ids.setdefault(v, len(ids)) if k in named else v)
                 for k, v in m.properties.items()],
            )
            for topic in (HALF, OP, "T", "U") for q in range(4)
            for m in store.get_messages(topic, q, 0, max_msgs=100).messages
        ]  # fmt: skip
        runs.append(records)
        svc.shutdown()
        store.shutdown()
    assert len(runs[0]) == 7 + 3 + 5  # halves, op messages, real messages
    assert runs[0] == runs[1]


def test_halves_read_back_in_bulk_after_a_restart(env):
    """Halves no longer in memory are looked up in one vectorized pass: a group with an offset
    that is no half (inside a record, a real message) is refused whole; producer groups are
    still checked (the half is read when needed); then the group commits."""
    hs = env.prepare(150) + env.prepare(50, topic="U")
    plain = env.store.put_messages([Message("T", b"plain", {}, queue_id=0)]).append
    env.restart()
    one_by_one = []
    read = env.svc._read
    env.svc._read = lambda p: one_by_one.append(p) or read(p)  # type: ignore[method-assign]
    offsets = [h[0] for h in hs]
    for bad in (offsets[3] + 3, int(plain.phys_offsets[0])):
        r = env.svc.commit_group([*offsets, bad])
        assert r.status is EndTxStatus.NOT_FOUND and list(r.rejected) == [bad]
    wrong = env.svc.commit_group([*offsets[:-1], HalfRef(offsets[-1], producer_group="other")])
    assert not wrong.ok and list(wrong.rejected) == [offsets[-1]]
    assert env.real("T") == env.queue("T")[:1] and env.real("U") == []  # nothing written
    g = env.svc.commit_group(offsets)
    assert g.ok and sorted(g.transaction_ids) == sorted(h[2] for h in hs)
    assert sorted(m.body for m in env.real("T") + env.real("U")) == sorted(
        [b"plain"] + [b"m%d" % i for i in range(150)] + [b"m%d" % i for i in range(50)]
    )
    assert one_by_one == [int(plain.phys_offsets[0])]  # the halves: in bulk
    assert all(env.svc.state(o) is TxnState.COMMITTED for o in offsets)


def test_a_group_with_a_delayed_half_is_committed_through_the_hooks(store_dir):
    """A large group in which one half asks for a delay level: the general path, its real message
    goes to the schedule topic, the rest to their queues."""
    core = BrokerCore(store_dir, start_services=False)
    try:
        msgs = [Message("T", b"m%d" % i, {"TAGS": "a"}, queue_id=i % 4) for i in range(200)]
        msgs[7].properties[L.P_DELAY] = "2"
        r = core.transactions.prepare(msgs, PG)
        assert core.transactions.commit_group(r.append.phys_offsets.tolist()).ok
        assert sum(core.store.max_offset("T", q) for q in range(4)) == 199
        assert core.store.max_offset(L.SCHEDULE_TOPIC, 1) == 1
    finally:
        core.shutdown()


def test_prepare_validates_like_put_messages(env):
    with pytest.raises(MessageIllegalError, match="body"):
        env.svc.prepare([Message("T", b"ok"), Message("T", None)], PG)  # type: ignore[arg-type]
    with pytest.raises(MessageIllegalError, match="properties"):
        env.svc.prepare([Message("T", b"x", {"big": "v" * 40_000})], PG)
    with pytest.raises(MessageIllegalError, match="system topic"):
        env.svc.prepare([Message(HALF, b"x")], PG)
    assert env.store.commitlog.max_offset == 0  # nothing was written
    r = env.svc.prepare([Message("T", bytearray(b"view"))], PG)
    assert env.svc.commit_group(r.append.phys_offsets.tolist()).ok
    assert [m.body for m in env.real()] == [b"view"]


def test_a_group_op_message_may_exceed_the_producers_body_limit(store_dir):
    """The op message of a large group is the broker's own record: not held to the 4 MiB (here
    1 KiB) limit of producers' bodies, so the whole group still ends in one append."""
    store = MessageStore(store_dir, StoreConfig(**SMALL, body_max_bytes=1024), clock=FakeClock())
    svc = TransactionService(store, BrokerConfig(), store.clock)
    try:
        r = svc.prepare_bodies("T", 0, [b"x"] * 400, {}, PG)
        g = svc.rollback_group(r.append.phys_offsets.tolist())
        assert g.ok and len(g.put.append.phys_offsets) == 1  # one op message
        assert len(store.get_messages(OP, 0, 0).messages[0].body) > 1024
    finally:
        svc.shutdown()
        store.shutdown()


def test_commit_group_writes_nothing_unless_every_half_is_pending(env):
    hs = env.prepare(4)
    assert env.end(hs[1], A.ROLLBACK) is EndTxStatus.SUCCESS
    end = env.store.commitlog.max_offset
    r = env.svc.commit_group([h[0] for h in hs])
    assert r.status is EndTxStatus.CONFLICT and r.rejected == {
        hs[1][0]: EndTxStatus.ALREADY_ROLLED_BACK
    }
    r = env.svc.commit_group([hs[0][0], HalfRef(hs[2][0], producer_group="X")])
    assert r.status is EndTxStatus.PRODUCER_GROUP_MISMATCH
    assert env.svc.commit_group([hs[0][0], hs[0][0] + 3]).status is EndTxStatus.NOT_FOUND
    assert env.store.commitlog.max_offset == end and env.real() == []
    assert env.svc.commit_group([]).ok
    assert env.svc.commit_group([hs[0][0], hs[0][0], hs[2][0]]).ok  # duplicates count once
    assert len(env.real()) == 2


def test_rollback_group_rolls_back_the_pending_and_lists_the_rest(env):
    hs = env.prepare(3)
    env.end(hs[0], A.COMMIT)
    r = env.svc.rollback_group([h[0] for h in hs])
    assert (
        r.ok
        and r.rejected == {hs[0][0]: EndTxStatus.ALREADY_COMMITTED}
        and len(r.transaction_ids) == 2
    )
    assert env.queue(OP)[-1].body == b"1,2,"
    assert env.svc.rollback_group([h[0] for h in hs[1:]]).status is EndTxStatus.ALREADY_ROLLED_BACK
    assert [m.body for m in env.real()] == [b"m0"]


def test_readers_see_a_group_commit_entirely_or_not_at_all(env):
    size, rounds = 8, 40
    batches = [env.prepare(size) for _ in range(rounds)]
    seen: list[int] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            snap = env.store.max_offsets_snapshot(["T"])["T"]
            seen.append(sum(snap.values()))

    t = threading.Thread(target=reader)
    t.start()
    for hs in batches:
        assert env.svc.commit_group([h[0] for h in hs]).ok
    done.set()
    t.join()
    assert seen and all(n % size == 0 for n in seen)
    assert sum(env.store.max_offsets_snapshot(["T"])["T"].values()) == size * rounds


# --- check-back ---------------------------------------------------------------------------------------
def test_calculate_op_offset_moves_over_contiguous_done_ops_only():
    assert calculate_op_offset([0, 2], 0) == 1
    assert calculate_op_offset([3, 1, 2, 0], 0) == 4
    assert calculate_op_offset([5, 6, 8], 5) == 7
    assert calculate_op_offset([1, 2], 0) == 0
    assert calculate_op_offset([], 4) == 4


def test_op_bodies_parse_batched_and_single_offsets():
    offs, rows = op_half_offsets(pa.array([b"12,13,14,", b"7", b"", b"x,9,", b"\xff5,"]))
    assert offs.tolist() == [12, 13, 14, 7, 9] and rows.tolist() == [0, 0, 0, 1, 3]


def test_seed_example_five_halves_four_ops(env):
    """Half and op offsets at 0, five halves, ops for 0, 1, 2 and 4: half 3 holds both."""
    hs = env.prepare(5)
    for i in (0, 1, 2, 4):
        assert env.end(hs[i], A.COMMIT) is EndTxStatus.SUCCESS
    env.clock.advance(1000)  # half 3 is younger than the transaction timeout
    r = env.svc.check_once()
    assert (r.half_offset, r.op_offset, r.done, r.checked, r.stop_reason) == (3, 3, 3, 0, "immune")
    assert env.offsets() == (3, 3) and env.checks == []
    env.clock.advance(6000)
    r = env.svc.check_once()  # half 3 is put back (offset 5) and checked; 4 is done; 5 is fresh
    assert (r.half_offset, r.op_offset, r.checked, r.done, r.stop_reason) == (5, 4, 1, 1, "fresh")
    ((group, asked),) = env.checks
    assert (group, asked.topic, asked.queue_id, asked.queue_offset) == (PG, "T", 3, 5)
    assert (
        asked.properties[L.P_TRANSACTION_CHECK_TIMES] == "1"
        and asked.properties[P_CHECK_SOURCE] == "3"
    )
    assert (
        env.svc.end_transaction(asked.commitlog_offset, 5, PG, hs[3][2], A.COMMIT, from_check=True)
        is EndTxStatus.SUCCESS
    )
    assert env.end(hs[3], A.COMMIT) is EndTxStatus.ALREADY_COMMITTED  # the producer's late answer
    env.clock.advance(1000)
    r = env.svc.check_once()
    assert (r.half_offset, r.op_offset) == (6, 5)
    assert sorted(m.body for m in env.real()) == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_seed_example_pending_half_two_holds_the_op_offset_at_one(env):
    """Four halves; ops in order for 0, 3, 1; half 2 pending and young: done ops {0, 2} -> 1."""
    hs = env.prepare(4)
    env.end(hs[0], A.COMMIT)
    env.end(hs[3], A.ROLLBACK)
    env.end(hs[1], A.COMMIT)
    env.clock.advance(100)
    r = env.svc.check_once()
    assert (r.half_offset, r.op_offset) == (2, 1)
    env.end(hs[2], A.COMMIT)  # op 3 names half 2; op 1 (half 3) is now reached too
    r = env.svc.check_once()
    assert (r.half_offset, r.op_offset, r.checked) == (4, 4, 0)
    assert env.store.offsets.query_topic(CHECK_GROUP, OP) == {0: 4}


def test_ends_older_than_the_file_reserved_time_are_forgotten_and_their_halves_refused(env):
    hour = 3_600_000
    (old,) = env.prepare(1)
    assert env.end(old, A.COMMIT) is EndTxStatus.SUCCESS
    env.svc.check_once()  # a check round marks how many transactions ended so far
    env.clock.advance(48 * hour)
    (new,) = env.prepare(1)
    assert env.end(new, A.COMMIT) is EndTxStatus.SUCCESS
    env.svc.check_once()
    assert env.svc.transaction_state(old[2]) is TxnState.COMMITTED
    env.clock.advance(25 * hour)  # 73 h after the first end (72 h kept), 25 h after the second
    env.svc.check_once()
    assert env.svc.transaction_state(old[2]) is TxnState.PENDING  # forgotten ...
    assert env.svc.transaction_state(new[2]) is TxnState.COMMITTED
    assert env.end(old, A.COMMIT) is EndTxStatus.EXPIRED  # ... so a late retry is refused
    assert env.end(new, A.COMMIT) is EndTxStatus.ALREADY_COMMITTED
    assert len(env.real()) == 2  # each committed once


def test_group_ends_refuse_halves_older_than_the_file_reserved_time(env):
    """commit_group / rollback_group apply end_transaction's EXPIRED rule: nothing is written."""
    hour = 3_600_000
    old = env.prepare(2)
    env.clock.advance(73 * hour)  # 72 h kept
    (new,) = env.prepare(1)
    offsets = [h[0] for h in [*old, new]]
    expired = {old[0][0]: EndTxStatus.EXPIRED, old[1][0]: EndTxStatus.EXPIRED}
    g = env.svc.commit_group(offsets)  # a group commits whole or not at all
    assert g.status is EndTxStatus.EXPIRED and not g.ok and g.rejected == expired
    assert env.real() == [] and env.store.max_offset(OP, 0) == 0
    assert env.svc.commit_group([new[0]]).ok  # the young one alone still commits
    assert [m.body for m in env.real()] == [b"m0"]
    (young,) = env.prepare(1)
    g = env.svc.rollback_group([old[0][0], young[0]])  # a rollback ends the young one
    assert (
        g.ok and g.rejected == {old[0][0]: EndTxStatus.EXPIRED} and g.transaction_ids == [young[2]]
    )
    assert env.svc.transaction_state(young[2]) is TxnState.ROLLED_BACK
    assert env.svc.rollback_group([h[0] for h in old]).status is EndTxStatus.EXPIRED


def test_check_counts_checks_and_moves_a_half_to_max_time_topic(store_dir):
    env = Env(store_dir, transaction_check_max=3)
    (h,) = env.prepare(1)
    for n in range(1, 4):
        env.clock.advance(7000)
        r = env.svc.check_once()
        assert r.checked == 1
        assert env.checks[-1][1].properties[L.P_TRANSACTION_CHECK_TIMES] == str(n)
    assert r.discarded == 1  # as RocketMQ: the third copy is discarded by the round that wrote it
    (kept,) = env.queue(MAXT)
    assert kept.body == b"m0" and kept.properties[L.P_TRANSACTION_ID] == h[2]
    env.clock.advance(7000)
    assert env.svc.check_once().checked == 0 and len(env.checks) == 3
    assert env.end(h, A.COMMIT) is EndTxStatus.SUCCESS  # still committable by its producer
    env.close()


def test_check_skips_halves_born_more_than_72_hours_ago(env):
    env.svc.prepare(
        [Message("T", b"old", born_timestamp_ms=env.clock.now_ms() - 73 * 3_600_000)], PG
    )
    env.clock.advance(1)
    r = env.svc.check_once()
    assert (r.discarded, r.checked) == (1, 0) and [m.body for m in env.queue(MAXT)] == [b"old"]


def test_immune_halves_are_renewed_not_checked_and_do_not_block_others(env):
    (imm,) = env.prepare(1, **{L.P_CHECK_IMMUNITY_TIME_IN_SECONDS: "60"})
    env.prepare(1)  # no immunity: checked once its timeout passed
    env.clock.advance(7000)
    r = env.svc.check_once()
    assert (r.renewed, r.checked) == (1, 1) and len(env.checks) == 1
    renewed = env.queue(HALF)[2]
    assert renewed.properties[L.P_TRAN_PREPARED_QUEUE_OFFSET] == "0"
    assert L.P_TRANSACTION_CHECK_TIMES not in renewed.properties  # a renewal is not a check
    env.clock.advance(20_000)
    assert env.svc.check_once().renewed == 1  # copies keep the first offset
    copies = [m for m in env.queue(HALF) if m.properties[L.P_UNIQ_KEY] == imm[2]]
    assert [m.properties.get(L.P_TRAN_PREPARED_QUEUE_OFFSET) for m in copies] == [None, "0", "0"]
    env.clock.advance(40_000)
    r = env.svc.check_once()
    assert (
        r.checked == 2 and env.checks[-1][1].body == b"m0"
    )  # immunity over: checked (plain again too)
    assert env.end(imm, A.COMMIT) is EndTxStatus.ILLEGAL_OPERATION  # its producer is too late


def test_resolvers_decide_during_the_check(env):
    decisions = {"sink-1": A.COMMIT, "sink-2": "ROLLBACK", "other": A.UNKNOWN}
    asked: list[str] = []

    def by_group(half: MessageExt) -> object:
        asked.append(half.properties[L.P_PGROUP])
        return decisions[half.properties[L.P_PGROUP]]

    env.svc.register_resolver("sink-", by_group)
    env.svc.register_resolver("other", by_group)
    env.svc.register_resolver("sink-3", lambda half: 1 / 0)
    hs = {g: env.prepare(1, group=g)[0] for g in ("sink-1", "sink-2", "other", "sink-3")}
    env.clock.advance(7000)
    r = env.svc.check_once()
    assert (r.resolved, r.checked) == (2, 2) and env.checks == []  # resolvers replace the checker
    assert asked == ["sink-1", "sink-2", "other"]
    assert [m.body for m in env.real()] == [b"m0"]
    assert env.svc.state(hs["sink-2"][0]) is TxnState.ROLLED_BACK
    assert env.svc.is_pending(hs["other"][0]) and env.svc.is_pending(hs["sink-3"][0])
    env.svc.unregister_resolver("other")
    env.clock.advance(7000)
    env.svc.check_once()
    assert [g for g, _ in env.checks] == ["other"]


def test_a_half_that_cannot_be_ended_does_not_hold_up_the_check(env):
    env.svc.register_resolver(PG, lambda half: A.COMMIT)
    (stuck,) = [h for h in env.prepare(2) if h[1] == 1]  # real queue 1
    env.store.topics.create(TopicConfig("T", 1, 1))  # the topic shrank: queue 1 is gone
    broken = Message(HALF, b"?", {L.P_REAL_TOPIC: "T", L.P_REAL_QID: "x", L.P_PGROUP: PG})
    env.store.put_messages([broken])
    env.prepare(1, topic="U")
    env.clock.advance(7000)
    r = env.svc.check_once()
    assert (r.resolved, r.checked, r.discarded) == (2, 1, 1)  # T/0 and U/0 committed
    assert [m.body for m in env.real("T") + env.real("U")] == [b"m0", b"m0"]
    assert env.svc.is_pending(stuck[0]) and [m.body for m in env.queue(MAXT)] == [b"?"]


def test_check_progress_is_stored_as_consumer_offsets_of_the_check_group(env):
    hs = env.prepare(3)
    for h in hs:
        env.end(h, A.ROLLBACK)
    env.svc.check_once()
    env.restart(crash=True)
    assert env.offsets() == (3, 3)
    with open(os.path.join(env.root, "config", "consumerOffset.json")) as f:
        table = json.load(f)["offsetTable"]
    assert table[f"{HALF}@{CHECK_GROUP}"] == {"0": 3} and table[f"{OP}@{CHECK_GROUP}"] == {"0": 3}


def test_a_check_round_cut_by_a_crash_does_not_put_a_half_back_twice(env):
    env.prepare(2)
    env.clock.advance(7000)
    real_commit = env.store.offsets.commit_many
    env.store.offsets.commit_many = lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt())  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        env.svc.check_once()
    env.store.offsets.commit_many = real_commit  # type: ignore[method-assign]
    assert len(env.queue(HALF)) == 4 and env.offsets() == (-1, -1)
    env.restart(crash=True)
    r = env.svc.check_once()
    assert (r.half_offset, r.checked) == (2, 0) and len(env.queue(HALF)) == 4


def test_defaults_and_configuration(store_dir):
    e = Env(store_dir)
    assert (e.svc.timeout_ms, e.svc.interval_s, e.svc.check_max) == (6000, 30.0, 15)
    e.close()
    e = Env(
        store_dir,
        transaction_timeout_s=1.5,
        transaction_check_interval_s=2,
        transaction_check_max=4,
        extra={"file_reserved_time_h": 1},
    )
    assert (e.svc.timeout_ms, e.svc.interval_s, e.svc.check_max, e.svc.file_reserved_ms) == (
        1500,
        2.0,
        4,
        3_600_000,
    )
    e.close()


def test_check_thread_runs_every_interval_in_real_time(store_dir):
    cfg = BrokerConfig(transaction_timeout_s=0.02, transaction_check_interval_s=0.02)
    with MessageStore(store_dir, StoreConfig(**SMALL)) as store:
        svc = TransactionService(store, cfg, SystemClock())
        svc.register_resolver(PG, lambda half: A.COMMIT)
        svc.prepare([Message("T", b"a"), Message("T", b"b")], PG)
        svc.start()
        deadline = time.monotonic() + 10
        while store.max_offset("T", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        svc.shutdown()
        assert store.max_offset("T", 0) == 2


# --- crashes ------------------------------------------------------------------------------------------
def _tear(root: str, start: int, end: int) -> None:
    """Zero CommitLog bytes [start, end): what a kill -9 in the middle of an append leaves."""
    seg = SMALL["commitlog_segment_bytes"]
    pos = start
    while pos < end:
        base = pos - pos % seg
        path = os.path.join(root, "commitlog", f"{base:020d}")
        stop = min(end, base + seg)
        if os.path.exists(path):
            with open(path, "r+b") as f:
                f.seek(pos - base)
                f.write(bytes(stop - pos))
        pos = stop


def test_group_commit_torn_by_a_crash_is_all_or_nothing(tmp_path):
    base = tmp_path / "base"
    e = Env(str(base))
    hs = e.prepare(6) + e.prepare(2, topic="U")
    r = e.svc.commit_group([h[0] for h in hs])
    cuts = [r.put.append.wrote_offset + k for k in (0, 5, 150)] + [
        int(p) + 9 for p in r.put.append.phys_offsets[1:]
    ]
    e.svc.shutdown()
    e.store.crash()
    end = r.put.append.end_offset
    for cut in cuts:
        d = tmp_path / f"cut{cut}"
        shutil.copytree(base, d)
        _tear(str(d), cut, end)
        t = Env(str(d))
        bodies = sorted(m.body for m in t.real("T") + t.real("U"))
        op_survived = cut >= int(r.put.append.phys_offsets[1])
        assert bodies == (
            sorted(b"m%d" % i for i in (0, 1, 2, 3, 4, 5, 0, 1)) if op_survived else []
        ), cut
        assert all(t.svc.is_pending(h[0]) != op_survived for h in hs)
        t.restart()  # completing it again changes nothing
        assert len(t.real("T") + t.real("U")) == (8 if op_survived else 0)
        t.close()


@pytest.mark.parametrize("reals", [1, 7, 300])
def test_the_start_reads_a_commits_real_messages_as_decoding_them_does(tmp_path, reals):
    """On start, the commit after the last op is read by its records' sizes and one numpy pass
    (``_commits_after``): what decoding each record finds, for commits within a segment, across
    a segment's end (a blank filler), asked for more records than there are, and starting on a
    record that is not a commit."""
    from rmq_spark.services.transaction.recovery import _commits_after

    def decoded(store, start: int, n: int) -> set[int]:
        present: set[int] = set()
        for rec in store.commitlog.iter_records(start):
            if len(present) == n or rec.transaction_type != L.TRANSACTION_COMMIT_TYPE:
                break
            present.add(rec.prepared_transaction_offset)
        return present

    e = Env(str(tmp_path))
    seen_blank = False
    for k in range(12):  # segments of SMALL's size: some commits cross a segment's end
        hs = e.prepare(reals, topic=f"T{k % 3}")
        r = e.svc.commit_group([h[0] for h in hs])
        start = int(r.put.append.phys_offsets[1])  # the first real message, after the op
        segments = {
            e.store.commitlog.mfq.find(int(p)).from_offset for p in r.put.append.phys_offsets
        }
        seen_blank |= len(segments) > 1
        want = {h[0] for h in hs}
        for n in (reals, reals + 5, max(reals - 1, 0)):
            assert _commits_after(e.store, start, n) == decoded(e.store, start, n)
        assert _commits_after(e.store, start, reals) == want
        op = int(r.put.append.phys_offsets[0])
        assert (
            _commits_after(e.store, op, reals) == decoded(e.store, op, reals) == set()
        )  # the op is no commit
    assert seen_blank or reals < 300
    e.close()


class _Crash(BaseException):
    """The process dies here."""


class _Model:
    """Random prepares / ends / group commits / checks with crashes injected into puts (before,
    after, or tearing the append) and into the check's offset commit; after every restart the
    store must agree with what was acknowledged."""

    def __init__(self, root: str, seed: int) -> None:
        self.rng = random.Random(seed)
        self.env = Env(root)
        self.decision: dict[int, A] = {}  # key -> what its producer decided
        self.acked: dict[int, A] = {}
        self.halves: dict[int, tuple[int, int, str]] = {}  # prepared and acknowledged
        self.next_key = 0
        self.in_flight_group: list[int] = []
        self.crash_rate = 0.08
        self.crashes = 0
        self.decisive = False
        self._install()

    def _install(self) -> None:
        env = self.env
        commit_many = env.store.offsets.commit_many

        def crashing(put):  # type: ignore[no-untyped-def]
            def crashing_put(*args, **kw):  # type: ignore[no-untyped-def]
                mode = self.rng.random()
                if mode < self.crash_rate / 3:
                    raise _Crash()
                if mode < self.crash_rate:
                    r = put(*args, **kw)
                    if mode < self.crash_rate * 2 / 3 and r.append.wrote_bytes > 1:
                        self.tear = (
                            r.append.wrote_offset + self.rng.randrange(1, r.append.wrote_bytes),
                            r.append.end_offset,
                        )
                    raise _Crash()
                return put(*args, **kw)

            return crashing_put

        def crashing_commit(*a, **k):  # type: ignore[no-untyped-def]
            if self.rng.random() < self.crash_rate:
                raise _Crash()
            return commit_many(*a, **k)

        # the service writes through put_rows (a few records) or put_encoded (prepare, end), the
        # check through put_messages
        env.store.put_messages = crashing(env.store.put_messages)  # type: ignore[method-assign]
        env.store.put_encoded = crashing(env.store.put_encoded)  # type: ignore[method-assign]
        env.store.put_rows = crashing(env.store.put_rows)  # type: ignore[method-assign]
        env.store.offsets.commit_many = crashing_commit  # type: ignore[method-assign]
        env.svc.register_resolver(PG, self.resolve)
        self.tear = None

    def resolve(self, half: MessageExt) -> A:
        if not self.decisive and self.rng.random() < 0.3:
            return A.UNKNOWN
        return self.decision[int(half.body[1:])]

    def restart(self) -> None:
        env = self.env
        env.svc.shutdown()
        env.store.crash()
        if self.tear is not None:
            _tear(env.root, *self.tear)
        env.open()
        self._install()
        self.verify()

    def counts(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for m in self.env.real():
            k = int(m.body[1:])
            out[k] = out.get(k, 0) + 1
        return out

    def verify(self) -> None:
        c = self.counts()
        assert all(n == 1 for n in c.values()), "a transaction is visible twice"
        assert all(self.decision[k] is A.COMMIT for k in c), "a rolled-back transaction is visible"
        assert all(c.get(k, 0) == (1 if a is A.COMMIT else 0) for k, a in self.acked.items())
        group = {c.get(k, 0) for k in self.in_flight_group}
        assert len(group) <= 1, f"group commit partly visible: {group}"
        self.in_flight_group = []

    def step(self) -> None:
        op = self.rng.choice(
            ["prepare", "prepare", "end", "group", "group", "rollback", "check", "again"]
        )
        pending = [k for k in self.halves if k not in self.acked]
        env = self.env
        if op == "prepare":
            n = self.rng.randint(1, 6)
            keys = list(range(self.next_key, self.next_key + n))
            self.next_key += n
            for k in keys:
                self.decision[k] = self.rng.choice([A.COMMIT, A.COMMIT, A.ROLLBACK])
            r = env.svc.prepare([Message("T", b"k%d" % k, queue_id=k % 4) for k in keys], PG)
            for k, p, q, u in zip(
                keys, r.append.phys_offsets, r.append.queue_offsets, r.uniq_keys, strict=True
            ):
                self.halves[k] = (int(p), int(q), u)
        elif op == "end" and pending:
            k = self.rng.choice(pending)
            st = env.end(self.halves[k], self.decision[k])
            assert st in (
                EndTxStatus.SUCCESS,
                EndTxStatus.ALREADY_COMMITTED,
                EndTxStatus.ALREADY_ROLLED_BACK,
            )
            self.acked[k] = self.decision[k]
        elif op in ("group", "rollback") and pending:
            want = A.COMMIT if op == "group" else A.ROLLBACK
            keys = [k for k in pending if self.decision[k] is want][: self.rng.randint(1, 8)]
            if not keys:
                return
            self.in_flight_group = keys if want is A.COMMIT else []
            fn = env.svc.commit_group if want is A.COMMIT else env.svc.rollback_group
            r = fn([self.halves[k][0] for k in keys])
            if r.ok:
                self.acked.update(dict.fromkeys(keys, want))
            self.in_flight_group = []
        elif op == "check":
            env.clock.advance(self.rng.choice([1000, 7000]))
            env.svc.check_once()
        elif op == "again" and self.acked:
            k = self.rng.choice(sorted(self.acked))
            st = env.end(self.halves[k], self.rng.choice([A.COMMIT, A.ROLLBACK]))
            assert st in (EndTxStatus.ALREADY_COMMITTED, EndTxStatus.ALREADY_ROLLED_BACK)

    def run(self, steps: int) -> None:
        for _ in range(steps):
            try:
                self.step()
            except _Crash:
                self.crashes += 1
                self.restart()
        assert self.crashes > 0
        self.crash_rate, self.decisive = 0.0, True
        self.restart()
        for _ in range(40):  # unresolved halves are checked again until decided
            self.env.clock.advance(7000)
            if self.env.svc.check_once().checked == 0 and not self._pending_halves():
                break
        assert not self._pending_halves()
        c = self.counts()
        surviving = {int(m.body[1:]) for m in self.env.queue(HALF)}
        assert c == {k: 1 for k in surviving if self.decision[k] is A.COMMIT}
        self.env.close()

    def _pending_halves(self) -> list[MessageExt]:
        return [m for m in self.env.queue(HALF) if not self.env.svc.is_resolved(m)]


@pytest.mark.parametrize("seed", range(16))
def test_random_crashes_never_lose_duplicate_or_resurrect(tmp_path, seed):
    _Model(str(tmp_path / "s"), seed).run(80)


WORKER = os.path.join(os.path.dirname(__file__), "_txn_worker.py")


@pytest.mark.slow
def test_sigkill_during_prepare_commit_and_check(store_dir):
    spec = importlib.util.spec_from_file_location("_txn_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(worker)  # type: ignore[union-attr]
    decision_of, open_service = worker.decision_of, worker.open_service

    acked: dict[int, str] = {}
    next_key = 0
    rng = random.Random(7)
    for _ in range(4):
        p = subprocess.Popen(
            [sys.executable, WORKER, store_dir, str(next_key)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            lines = lines_until_killed(p, rng.uniform(0.6, 1.5))
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
            p.stderr.close()
        for line in lines:
            if line.endswith("\n") and line[:1] in "CR":
                acked.update(dict.fromkeys(map(int, line.split()[1:]), line[0]))
        store, svc = open_service(store_dir, SystemClock())
        try:
            counts = _key_counts(store)
            assert all(n == 1 for n in counts.values()), "duplicate after SIGKILL"
            assert all(decision_of(k) == "C" for k in counts), "rolled-back message visible"
            assert all(counts.get(k, 0) == (a == "C") for k, a in acked.items()), (
                "acknowledged end lost"
            )
            halves = store.get_messages(HALF, 0, 0, max_msgs=1_000_000, max_bytes=1 << 34).messages
            next_key = max([int(m.body) for m in halves], default=-1) + 1
        finally:
            svc.shutdown()
            store.shutdown()
    assert len(acked) > 20
    store, svc = open_service(store_dir, SystemClock())  # the check decides everything left
    try:
        for _ in range(100):
            halves = store.get_messages(HALF, 0, 0, max_msgs=1_000_000, max_bytes=1 << 34).messages
            if all(svc.is_resolved(m) for m in halves):
                break
            time.sleep(0.03)
            svc.check_once()
        halves = store.get_messages(HALF, 0, 0, max_msgs=1_000_000, max_bytes=1 << 34).messages
        assert all(svc.is_resolved(m) for m in halves)
        keys = {int(m.body) for m in halves}
        assert _key_counts(store) == {k: 1 for k in keys if decision_of(k) == "C"}
    finally:
        svc.shutdown()
        store.shutdown()


def _key_counts(store: MessageStore) -> dict[int, int]:
    out: dict[int, int] = {}
    for q in range(4):
        for m in store.get_messages("T", q, 0, max_msgs=1_000_000, max_bytes=1 << 34).messages:
            out[int(m.body)] = out.get(int(m.body), 0) + 1
    return out


class _OpQueue:
    """The op queue as OpWindow reads it: ``read_arrow`` of queueOffset, tags and body."""

    def __init__(self, bodies: list[str], tags: list[str]) -> None:
        self.bodies, self.tags = bodies, tags

    def max_offset(self, topic: str, queue_id: int) -> int:
        return len(self.bodies)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return 0

    def read_arrow(self, topic, queue_id, lo, hi, columns):  # type: ignore[no-untyped-def]
        import pyarrow as pa

        return pa.record_batch({
            "queueOffset": pa.array(range(lo, hi), pa.int64()),
            "tags": pa.array(self.tags[lo:hi], pa.string()),
            "body": pa.array([b.encode() for b in self.bodies[lo:hi]], pa.binary()),
        })  # fmt: skip


def _reference_walk(
    bodies: list[str], tags: list[str], start: int, stop_at: int, pull: int
) -> tuple[int, list[int]]:
    """RocketMQ's removeMap / opMsgMap walk, one half at a time with dictionaries: the model
    the arrays of OpWindow are held to (halves taken, new op offset)."""
    from rmq_spark.services.transaction.check import calculate_op_offset

    remove_map: dict[int, list[int]] = {}
    pending: dict[int, set[int]] = {}
    done: set[int] = set()
    loaded = 0

    def fill() -> bool:
        nonlocal loaded
        if loaded >= len(bodies):
            return False
        for op in range(loaded, min(len(bodies), loaded + pull)):
            named = (
                [int(t) for t in bodies[op].split(",") if t.isdigit()] if tags[op] == "d" else []
            )
            named = [h for h in named if h >= start]
            if not named:
                done.add(op)
            for h in named:
                pending.setdefault(op, set()).add(h)
                remove_map.setdefault(h, []).append(op)
        loaded = min(len(bodies), loaded + pull)
        return True

    fill()
    taken, i = [], start
    while i < stop_at:
        ops = remove_map.pop(i, None)
        if ops is None:
            if fill():
                continue
            break
        for op in ops:
            left = pending.get(op)
            if left is not None:
                left.discard(i)
                if not left:
                    del pending[op]
                    done.add(op)
        taken.append(i)
        i += 1
    for op, left in list(pending.items()):
        if max(left) < i:
            del pending[op]
            done.add(op)
    new = calculate_op_offset(done, 0)
    while new >= loaded and fill():
        for op, left in list(pending.items()):
            if max(left) < i:
                del pending[op]
                done.add(op)
        new = calculate_op_offset(done, new)
    return new, taken


@pytest.mark.parametrize("seed", range(12))
def test_op_window_takes_runs_of_halves_as_the_walk_half_by_half_does(seed):
    """Op messages naming halves in groups (a sink batch's commit), one by one (clients), twice,
    out of order, with gaps and foreign tags: the walk over them with whole runs taken at once
    takes the halves and reaches the op offset the one-at-a-time walk does."""
    import random

    from rmq_spark.services.transaction.check import OpWindow

    rng = random.Random(seed)
    start, halves = rng.randrange(0, 5), rng.randrange(50, 400)
    order = list(range(start, halves))
    rng.shuffle(order) if seed % 3 == 0 else None
    missing = set(
        rng.sample(order, rng.randrange(0, 3))
    )  # halves no op names: the walk stops there
    bodies, tags, at = [], [], 0
    while at < len(order):
        k = rng.choice((1, 1, 2, 7, 40, 120))
        group = [h for h in order[at : at + k] if h not in missing]
        if rng.random() < 0.1:
            group += group[:2]  # named twice
        if rng.random() < 0.05:
            group.append(rng.randrange(0, start + 1))  # behind the walk
        bodies.append("".join(f"{h}," for h in group) + ("x," if rng.random() < 0.1 else ""))
        tags.append("d" if rng.random() > 0.05 else "other")
        at += k
    pull = rng.choice((1, 3, 256))
    want_op, want_taken = _reference_walk(bodies, tags, start, halves, pull)

    window = OpWindow(_OpQueue(bodies, tags), 0, start, pull=pull)  # type: ignore[arg-type]
    window.fill()
    taken, i = [], start
    while i < halves:
        n = window.take_run(i, halves - i) if rng.random() < 0.7 else int(window.take(i))
        if n:
            taken += range(i, i + n)
            i += n
            continue
        if not window.exhausted and window.fill():
            continue
        break
    assert taken == want_taken
    assert window.finish(i) == want_op
