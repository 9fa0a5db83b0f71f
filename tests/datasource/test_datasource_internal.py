"""The private connector service over real gRPC, around an in-process BrokerCore: sends, the
exactly-once commit protocol (replays, aborts, orphans), atomic snapshots, errors.  No Spark."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

from rmq_spark.broker.connector.client import BrokerUnavailableError, InternalClient
from rmq_spark.broker.connector.sink import ATTEMPT_IDLE_MS, P_SINK_KEY, sink_key
from rmq_spark.broker.connector.sinklog import SinkCommitLog
from rmq_spark.broker.testing import InternalServer
from rmq_spark.errors import ConfigError, MessageIllegalError, StoreError
from rmq_spark.services.transaction.states import TransactionAction
from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock


class Broker(InternalServer):
    @property
    def service(self):  # type: ignore[no-untyped-def]
        return self.connector


@pytest.fixture
def broker(store_dir):
    b = Broker(store_dir)
    yield b
    b.close()


def rows(topic: str, n: int, prefix: str = "m", **cols) -> pa.Table:
    data = {"topic": [topic] * n, "body": [f"{prefix}{i}".encode() for i in range(n)]}
    data.update(cols)
    return pa.table(data)


def visible(client: InternalClient, topic: str) -> list[bytes]:
    hi, _ = client.offsets([topic])
    out: list[bytes] = []
    for q, end in hi.get(topic, {}).items():
        for b in client.read_arrow(topic, int(q), 0, end):
            out += b.column("body").to_pylist()
    return sorted(out)


def half(client: InternalClient, table: pa.Table, query: str, batch: int, attempt: str) -> str:
    r = client.send(
        table, {"mode": "half", "query_id": query, "batch_id": batch, "attempt": attempt}
    )
    assert r["count"] == table.num_rows
    return r["offsets"]


def test_info_topics_and_plain_sends(broker):
    c = broker.client
    info = c.info()
    assert info["store_root"] == broker.core.store.root and info["pid"] > 0
    assert c.send(rows("A", 10), {"mode": "normal"}) == {"count": 10, "offsets": ""}
    assert visible(c, "A") == sorted(f"m{i}".encode() for i in range(10))
    hi, lo = c.offsets(["A", "Missing"])
    assert sum(hi["A"].values()) == 10 and hi["Missing"] == {} and set(lo["A"].values()) == {0}
    half(c, rows("B", 2), "q", 0, "a1")
    c.commit_batch("q", 0, "a1", [])  # a commit record lands in the system topic
    assert set(c.topics()) == {"A", "B"}  # no system topics


def test_columns_are_honoured(broker):
    c = broker.client
    t = rows(
        "C",
        4,
        tags=["x", None, "y", "x"],
        keys=["k1 k2", None, None, "k3"],
        properties=pa.array(
            [[("color", "red")], None, [("n", "1")], []], pa.map_(pa.string(), pa.string())
        ),
        messageGroup=[None, "g", "g", None],
        queueId=pa.array([2, None, None, 0], pa.int32()),
    )
    c.send(t, {"mode": "normal"})
    hi, _ = c.offsets(["C"])
    got = {}
    for q, end in hi["C"].items():
        for b in c.read_arrow("C", int(q), 0, end):
            for r in b.to_pylist():
                got[r["body"]] = r
    assert got[b"m0"]["queueId"] == 2 and got[b"m3"]["queueId"] == 0
    assert got[b"m1"]["queueId"] == got[b"m2"]["queueId"]  # same group, same queue
    assert got[b"m0"]["tags"] == "x" and got[b"m0"]["keys"] == "k1 k2"
    assert dict(got[b"m0"]["properties"])["color"] == "red"
    assert dict(got[b"m1"]["properties"])[L.P_SHARDING_KEY] == "g"


@pytest.mark.parametrize("n", [20, 600])  # a few rows; enough for the column-wise halves
def test_commit_makes_halves_visible_at_once_and_replays_roll_back(broker, n):
    c = broker.client
    offs = half(c, rows("T", n), "q1", 0, "att-1")
    assert visible(c, "T") == []  # halves are never read
    halves = broker.core.store.get_messages(L.TRANS_HALF_TOPIC, 0, 0, max_msgs=n).messages
    assert {h.properties[P_SINK_KEY] for h in halves} == {sink_key("q1", 0, "att-1")}
    assert c.commit_batch("q1", 0, "att-1", [offs]) == {"outcome": "COMMITTED", "attempt": "att-1"}
    assert visible(c, "T") == sorted(f"m{i}".encode() for i in range(n))
    # the same batch written again by a replayed attempt: its halves are rolled back
    offs2 = half(c, rows("T", n, prefix="r"), "q1", 0, "att-2")
    assert c.commit_batch("q1", 0, "att-2", [offs2])["outcome"] == "ALREADY_COMMITTED"
    assert c.commit_batch("q1", 0, "att-1", [offs])["outcome"] == "ALREADY_COMMITTED"  # idempotent
    assert len(visible(c, "T")) == n and all(b.startswith(b"m") for b in visible(c, "T"))
    assert c.sink_status("q1") == {"batches": {"0": "att-1"}}


def test_abort_rolls_back_and_the_attempt_cannot_commit_later(broker):
    c = broker.client
    offs = half(c, rows("T", 5), "q", 3, "dead")
    assert c.abort_batch("q", 3, "dead", [offs]) == {"rolled_back": 5}
    with pytest.raises(StoreError, match="rolled back"):
        c.commit_batch("q", 3, "dead", [offs])
    with pytest.raises(StoreError, match="rolled back"):
        half(c, rows("T", 1), "q", 3, "dead")
    offs2 = half(c, rows("T", 5, prefix="n"), "q", 3, "alive")
    c.commit_batch("q", 3, "alive", [offs2])
    assert visible(c, "T") == sorted(f"n{i}".encode() for i in range(5))


def test_an_abort_after_the_commit_record_finishes_the_commit(broker, monkeypatch):
    """The commit record is the commit point: a group commit that fails after it leaves the
    halves pending (never a batch in part), and the abort Spark may send then finishes it, all
    the batch's rows at once."""
    c = broker.client
    offs = half(c, rows("T", 50), "q", 0, "a1")
    ledger = broker.service.sink.ledger
    real = ledger.commit_group
    monkeypatch.setattr(
        ledger,
        "commit_group",
        lambda offsets, expect=None: (_ for _ in ()).throw(StoreError("disk trouble")),
    )
    assert c.commit_batch("q", 0, "a1", [offs]) == {"outcome": "COMMITTED", "attempt": "a1"}
    assert visible(c, "T") == []
    with pytest.raises(
        StoreError, match=r"batch 0 of query q is recorded as committed .* check-back commits them"
    ):
        c.abort_batch("q", 0, "a1", [offs])
    monkeypatch.setattr(ledger, "commit_group", real)
    assert c.abort_batch("q", 0, "a1", [offs]) == {"rolled_back": 0}
    assert visible(c, "T") == sorted(f"m{i}".encode() for i in range(50))
    assert c.commit_batch("q", 0, "a2", []) == {"outcome": "ALREADY_COMMITTED", "attempt": "a1"}


@pytest.mark.parametrize(
    "n", [50, 3000]
)  # the general group commit; halves stored with their real messages
def test_the_commit_answers_at_its_record_and_a_read_waits_for_the_group_commit(
    broker, monkeypatch, n
):
    """CommitBatch answers once the commit record is durable; the group commit follows on the
    committer thread.  Meanwhile the check-back is told to wait, an abort of the attempt waits,
    and a read plans only after it: what was written before a read is in it."""
    c, sink = broker.client, broker.service.sink
    ledger = sink.ledger
    release, started = threading.Event(), threading.Event()
    name = "commit_group" if n < 128 else "commit_encoded"
    real = getattr(ledger, name)

    def slow(*a, **kw):  # type: ignore[no-untyped-def]
        started.set()
        assert release.wait(30)
        return real(*a, **kw)

    monkeypatch.setattr(ledger, name, slow)
    offs = half(c, rows("W", n), "q", 0, "a1")
    assert c.commit_batch("q", 0, "a1", [offs]) == {"outcome": "COMMITTED", "attempt": "a1"}
    assert started.wait(30)
    assert sink.resolve({P_SINK_KEY: sink_key("q", 0, "a1")}) is TransactionAction.UNKNOWN
    got: list[list[bytes]] = []
    reader = threading.Thread(target=lambda: got.append(visible(c, "W")))
    reader.start()
    reader.join(0.5)
    assert reader.is_alive()  # waiting for the group commit
    release.set()
    reader.join(30)
    assert got == [sorted(f"m{i}".encode() for i in range(n))]
    assert sink.resolve({P_SINK_KEY: sink_key("q", 0, "a1")}) is TransactionAction.COMMIT
    assert c.abort_batch("q", 0, "a1", [offs]) == {"rolled_back": 0}
    assert visible(c, "W") == got[0]


def test_group_commits_run_in_the_order_of_their_batches_and_a_stop_finishes_them(store_dir):
    b = Broker(store_dir)
    c = b.client
    for batch in range(5):
        offs = half(c, rows("Ord", 200, prefix=f"b{batch}-"), "q", batch, f"a{batch}")
        assert c.commit_batch("q", batch, f"a{batch}", [offs])["outcome"] == "COMMITTED"
    b.close()  # before the store closes, the queued group commits are done
    b = Broker(store_dir)
    try:
        store = b.core.store
        per_queue = [m.body.decode() for q in range(store.topics.get("Ord").read_queue_nums)
                     for m in store.get_messages("Ord", q, 0, max_msgs=2000).messages]  # fmt: skip
        assert sorted(per_queue) == sorted(f"b{k}-{i}" for k in range(5) for i in range(200))
        for q in range(store.topics.get("Ord").read_queue_nums):
            batches = [
                int(m.body.decode()[1])
                for m in store.get_messages("Ord", q, 0, max_msgs=2000).messages
            ]
            assert batches == sorted(batches)  # batch after batch in every queue
    finally:
        b.close()


def test_resolver_decides_orphans_by_the_same_attempt(broker):
    sink = broker.service.sink
    c = broker.client
    offs = half(c, rows("T", 2), "q", 7, "winner")
    c.commit_batch("q", 7, "winner", [offs])
    sink.wait_visible()  # (its group commit done: until then the resolver says UNKNOWN)
    assert sink.resolve({P_SINK_KEY: sink_key("q", 7, "winner")}) is TransactionAction.COMMIT
    # a dead attempt of the same batch (its driver was killed before commit): never committed
    assert sink.resolve({P_SINK_KEY: sink_key("q", 7, "loser")}) is TransactionAction.ROLLBACK
    # a live attempt still writing a long batch: ask again later
    half(c, rows("T", 1), "q", 8, "writing")
    assert sink.resolve({P_SINK_KEY: sink_key("q", 8, "writing")}) is TransactionAction.UNKNOWN
    # ... until it has been silent too long: rolled back, and it cannot commit after that
    sink._last_send_ms["writing"] -= ATTEMPT_IDLE_MS + 1
    assert sink.resolve({P_SINK_KEY: sink_key("q", 8, "writing")}) is TransactionAction.ROLLBACK
    with pytest.raises(StoreError, match="rolled back before its commit"):
        c.commit_batch("q", 8, "writing", [])
    # an attempt this broker never saw (it restarted since): rolled back
    assert sink.resolve({P_SINK_KEY: sink_key("q", 9, "unknown")}) is TransactionAction.ROLLBACK
    assert sink.resolve({}) is TransactionAction.ROLLBACK


def test_check_back_decides_orphans_by_the_commit_record_of_the_same_attempt(store_dir):
    """The trap of semantics.md: a dead attempt of batch N must vanish even though a later
    attempt of batch N committed; a recorded attempt whose group commit never ran must appear."""
    clock = FakeClock()
    b = Broker(store_dir, clock=clock)
    try:
        c, txn = b.client, b.core.transactions
        half(c, rows("X", 6, prefix="dead"), "q", 5, "A")  # the driver died before commit
        offs_b = half(c, rows("X", 6, prefix="replay"), "q", 5, "B")
        assert c.commit_batch("q", 5, "B", [offs_b])["outcome"] == "COMMITTED"
        half(c, rows("X", 4, prefix="torn"), "q", 6, "C")
        b.service.sink.commits.record("q", 6, "C", clock.now_ms())  # the broker died right here
        half(c, rows("X", 3, prefix="live"), "q", 7, "D")  # still being written
        clock.advance(int(b.core.config.transaction_timeout_s * 1000) + 1000)
        txn.check_once()
        got = visible(c, "X")
        assert got == sorted(
            [f"replay{i}".encode() for i in range(6)] + [f"torn{i}".encode() for i in range(4)]
        )
        clock.advance(ATTEMPT_IDLE_MS + 1000)  # D went silent: given up
        txn.check_once()
        assert visible(c, "X") == got
        with pytest.raises(StoreError, match="rolled back"):
            c.commit_batch("q", 7, "D", [])
    finally:
        b.close()


def test_commit_records_survive_a_restart(store_dir):
    b = Broker(store_dir)
    offs = half(b.client, rows("T", 3), "q", 0, "a")
    b.client.commit_batch("q", 0, "a", [offs])
    gone = half(b.client, rows("T", 2, prefix="x"), "q", 1, "given-up")
    b.client.abort_batch("q", 1, "given-up", [gone])
    b.close()
    b = Broker(store_dir)
    try:
        assert b.client.commit_batch("q", 0, "other", [])["outcome"] == "ALREADY_COMMITTED"
        assert SinkCommitLog(b.core.store).lookup("q", 0) == "a"
        with pytest.raises(StoreError, match="rolled back"):  # an abort is durable too
            b.client.commit_batch("q", 1, "given-up", [gone])
        assert len(visible(b.client, "T")) == 3
    finally:
        b.close()


def test_snapshots_never_split_a_group_commit(broker):
    """Every max-offsets snapshot holds all of a committed batch or none of it."""
    c = broker.client
    batch_rows = 37  # spread over the 4 queues of the topic
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def poll() -> None:
        reader = InternalClient(c.endpoint)
        try:
            while not stop.is_set():
                hi, _ = reader.offsets(["G"])
                seen.append(sum(hi["G"].values()))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            reader.close()

    th = threading.Thread(target=poll)
    th.start()
    try:
        for i in range(25):
            offs = half(c, rows("G", batch_rows, prefix=f"b{i}-"), "atomic", i, f"a{i}")
            c.commit_batch("atomic", i, f"a{i}", [offs])
    finally:
        stop.set()
        th.join()
    assert not errors
    assert seen and all(n % batch_rows == 0 for n in seen)
    assert len(visible(c, "G")) == 25 * batch_rows


def test_errors_cross_the_wire_as_their_classes(broker):
    c = broker.client
    with pytest.raises(MessageIllegalError, match="characters outside"):
        c.send(rows("bad/topic", 1), {"mode": "normal"})
    with pytest.raises(MessageIllegalError, match="system topic"):
        c.send(rows(L.TRANS_HALF_TOPIC, 1), {"mode": "normal"})
    with pytest.raises(MessageIllegalError, match="limit is"):
        c.send(
            pa.table({"topic": ["T"], "body": [b"x" * (4 * 1024 * 1024 + 1)], "tags": ["t"]}),
            {"mode": "normal"},
        )
    with pytest.raises(MessageIllegalError, match="out of range"):
        c.send(rows("T", 1, queueId=pa.array([9], pa.int32())), {"mode": "normal"})
    with pytest.raises(MessageIllegalError, match="body is null"):
        c.send(
            pa.table({"topic": ["T"], "body": pa.array([None], pa.binary())}), {"mode": "normal"}
        )
    with pytest.raises(MessageIllegalError, match="no topic"):
        c.send(
            pa.table({"topic": pa.array([None], pa.string()), "body": [b"x"]}), {"mode": "normal"}
        )
    with pytest.raises(ConfigError, match="option 'sql'"):
        list(c.read_arrow("T", 0, 0, 0, sql="a >"))
    with pytest.raises(StoreError, match="holds offsets up to"):
        list(c.read_arrow("T", 0, 0, 1000))
    dead = InternalClient("127.0.0.1:1", timeout_s=2)
    with pytest.raises(BrokerUnavailableError):
        dead.ping(timeout_s=1)


def test_a_bad_row_stores_and_prepares_none_of_its_send(broker):
    """The rules of SendMessage hold for every row of a Send, checked before any is stored: a
    reserved property key, an empty body, a delivery time beyond the timer's limit (which used
    to be found only when the batch's halves were committed, after its commit record)."""
    c = broker.client
    now = broker.core.clock.now_ms()
    limits = c.send(
        pa.table({"topic": pa.array([], pa.string()), "body": pa.array([], pa.binary())}),
        {"mode": "normal"},
    )["limits"]
    assert (
        limits["body_max_bytes"] == 4 * 1024 * 1024
        and limits["max_delay_ms"] == 3 * 24 * 3600 * 1000
    )
    assert abs(limits["now_ms"] - now) < 60_000
    deliver = [None] * 100
    deliver[57] = now + 10 * 24 * 3600 * 1000
    props = [None] * 100
    props[3] = [("a", "1"), ("UNIQ_KEY", "same")]
    bodies = [f"m{i}".encode() for i in range(100)]
    bad_tables = {
        r"ILLEGAL_DELIVERY_TIME: column 'deliverTimestamp', row 57 of this send: .*the limit is 259200s":
            rows("T", 100, deliverTimeMs=pa.array(deliver, pa.int64())),
        r"ILLEGAL_MESSAGE_PROPERTY_KEY: column 'properties', row 3 of this send: property key 'UNIQ_KEY' is reserved":
            rows("T", 100, properties=pa.array(props, pa.map_(pa.string(), pa.string()))),
        r"MESSAGE_BODY_EMPTY: column 'body', row 99 of this send: message body is empty":
            pa.table({"topic": ["T"] * 100, "body": [*bodies[:99], b""]}),
    }  # fmt: skip
    for match, table in bad_tables.items():
        for header in (
            {"mode": "normal"},
            {"mode": "half", "query_id": "q", "batch_id": 0, "attempt": "a"},
        ):
            with pytest.raises(MessageIllegalError, match=match):
                c.send(table, header)
    assert visible(c, "T") == []
    store = broker.core.store
    assert store.max_offset(L.TRANS_HALF_TOPIC, 0) == 0 and store.max_offset(L.TIMER_TOPIC, 0) == 0


def test_consumer_offsets_and_times(broker):
    c = broker.client
    c.send(rows("O", 8), {"mode": "normal"})
    c.commit_offsets("g1", {"O": {"0": 2, "1": 1}})
    assert c.query_offsets("g1", ["O"]) == {"O": {"0": 2, "1": 1}}
    assert broker.core.store.offsets.query("g1", "O", 0) == 2
    far = c.offsets_for_times({"O": [0, 1]}, 2**62)
    hi, _ = c.offsets(["O"])
    assert far == {"O": {"0": hi["O"]["0"], "1": hi["O"]["1"]}}
    assert c.offsets_for_times({"O": [0]}, 0) == {"O": {"0": 0}}


def test_many_rows_go_through_one_put(broker):
    c = broker.client
    n = 50_000
    bodies = np.arange(n).astype(str).tolist()
    c.send(
        pa.table({"topic": ["Big"] * n, "body": pa.array(bodies).cast(pa.binary())}),
        {"mode": "normal"},
    )
    hi, _ = c.offsets(["Big"])
    assert sum(hi["Big"].values()) == n


def test_a_commit_rolls_back_the_halves_of_its_attempt_it_does_not_name(broker, monkeypatch):
    """A task that failed after sending and was run again: only the retry's commit message
    reaches commit(), so the failed task's halves (same attempt) are rolled back before the
    commit record is written, and the check-back can never commit them.  Batches this large
    commit through the vectorized path (commit_own)."""
    from rmq_spark.broker.connector.sink import decode_offsets
    from rmq_spark.services.transaction.states import TxnState

    c = broker.client
    txn = broker.core.transactions
    general: list[int] = []
    group = txn.commit_group
    monkeypatch.setattr(
        txn, "commit_group", lambda halves, *a: general.append(len(halves)) or group(halves, *a)
    )
    stray = half(c, rows("S", 200, prefix="failed"), "q", 3, "a")
    kept = half(c, rows("S", 300, prefix="retry"), "q", 3, "a")
    assert c.commit_batch("q", 3, "a", [kept])["outcome"] == "COMMITTED"
    assert general == []  # the vectorized path, no fallback
    assert visible(c, "S") == sorted(f"retry{i}".encode() for i in range(300))
    assert {txn.state(o) for o in decode_offsets([stray])} == {TxnState.ROLLED_BACK}
    assert {txn.state(o) for o in decode_offsets([kept])} == {TxnState.COMMITTED}
    assert c.commit_batch("q", 3, "b", [])["outcome"] == "ALREADY_COMMITTED"
    assert visible(c, "S") == sorted(f"retry{i}".encode() for i in range(300))


def test_a_commit_writes_the_real_messages_encoded_when_the_halves_were_stored(broker, monkeypatch):
    """Halves stored from bodies alone get their real messages encoded at the same time; the
    commit appends those (no parse of the halves), and they read back as any commit's."""
    from rmq_spark.broker.connector.sink import decode_offsets
    from rmq_spark.services.transaction.states import TxnState

    c, txn = broker.client, broker.core.transactions
    other: list[str] = []
    for name in ("commit_group", "commit_own"):
        fn = getattr(txn, name)
        monkeypatch.setattr(txn, name, lambda *a, _fn=fn, _n=name: other.append(_n) or _fn(*a))
    offs = [
        half(c, rows("E", 300, prefix=f"p{k}-", queueId=[k] * 300), "q", 1, "a") for k in (0, 1)
    ]
    assert c.commit_batch("q", 1, "a", offs)["outcome"] == "COMMITTED"
    assert other == []
    assert visible(c, "E") == sorted(f"p{k}-{i}".encode() for k in (0, 1) for i in range(300))
    assert {txn.state(o) for o in decode_offsets(offs)} == {TxnState.COMMITTED}
    assert broker.service.sink._reals == {} and broker.service.sink._reals_bytes == 0
    hi, _ = c.offsets(["E"])
    got = [b for q in (0, 1) for b in c.read_arrow("E", q, 0, int(hi["E"][str(q)]))]
    assert sum(b.num_rows for b in got) == 600


def _rows_with_properties(n: int) -> pa.Table:
    return pa.table({
        "topic": ["Props" if i % 5 else "Props2" for i in range(n)],
        "body": [f"r{i}".encode() for i in range(n)],
        "tags": [None if i % 7 == 0 else ("" if i % 7 == 1 else f"tag{i % 3}") for i in range(n)],
        "keys": [None if i % 4 == 0 else f"key{i} k{i % 10}" for i in range(n)],
        "properties": pa.array([None if i % 6 == 0 else ([] if i % 6 == 1 else [("color", f"c{i}"), ("none", None)])
                                for i in range(n)], pa.map_(pa.string(), pa.string())),
        "messageGroup": [f"g{i % 4}" if i % 3 == 0 else None for i in range(n)],
    })  # fmt: skip


def _expected(table: pa.Table) -> dict[bytes, tuple[str, dict[str, str]]]:
    """What the record-by-record path stores for each row: its topic and properties."""
    out = {}
    for r in table.to_pylist():
        p = {k: v for k, v in (r["properties"] or []) if v is not None}
        if r["tags"]:
            p[L.P_TAGS] = r["tags"]
        if r["keys"]:
            p[L.P_KEYS] = r["keys"]
        if r["messageGroup"] is not None:
            p[L.P_SHARDING_KEY] = r["messageGroup"]
        out[r["body"]] = (r["topic"], p)
    return out


def _stored(core, topics, drop=(L.P_UNIQ_KEY, L.P_TRANSACTION_ID, L.P_PGROUP, P_SINK_KEY, L.P_TRAN_MSG, L.P_REAL_TOPIC,
                                 L.P_REAL_QID, L.P_TRAN_PREPARED_QUEUE_OFFSET)):  # fmt: skip
    store = core.store
    out = {}
    for t in topics:
        cfg = store.topics.get(t)
        for q in range(cfg.read_queue_nums if cfg else 0):
            msgs = store.get_messages(t, q, 0, max_msgs=100_000, max_bytes=1 << 30).messages
            units = store.consume_queue(t, q).units(0, len(msgs)) if msgs else []
            for m, unit in zip(msgs, units, strict=True):
                assert m.uniq_key and int(unit["tags_code"]) == store_tags_code(m.tags)
                out[m.body] = (m.topic, {k: v for k, v in m.properties.items() if k not in drop})
    return out


def store_tags_code(tags):  # type: ignore[no-untyped-def]
    from rmq_spark.store.message import tags_code

    return tags_code(tags)


@pytest.mark.parametrize(
    "n", [40, 3000]
)  # a few rows; enough for the real messages to be kept for the commit
@pytest.mark.parametrize("mode", ["normal", "half"])
def test_rows_with_their_own_properties_are_stored_as_the_record_by_record_path_stores_them(
    broker, n, mode
):
    """Tags, keys, user properties and message groups, built column-wise: every message holds
    what the record-by-record path puts there (tagsCode, index keys included), rows of two
    topics, a message group keeping its queue."""
    c = broker.client
    table = _rows_with_properties(n)
    if mode == "normal":
        assert c.send(table, {"mode": "normal"})["count"] == n
    else:
        offs = half(c, table, "qp", 0, "ap")
        kept = broker.service.sink._reals.get("ap")
        assert bool(kept) == (n >= 3000)  # the real messages made with the halves, for the commit
        assert c.commit_batch("qp", 0, "ap", [offs])["outcome"] == "COMMITTED"
        broker.service.sink.wait_visible()
    assert _stored(broker.core, ["Props", "Props2"]) == _expected(table)
    from rmq_spark.store.query import MessageQuery

    found = MessageQuery(broker.core.store).by_key("Props", f"key{n - 1}")
    assert [m.body for m in found] == [f"r{n - 1}".encode()]
    by_group: dict = {}
    for t in ("Props", "Props2"):
        for q in range(broker.core.store.topics.get(t).read_queue_nums):
            for m in broker.core.store.get_messages(t, q, 0, max_msgs=100_000).messages:
                if L.P_SHARDING_KEY in m.properties:
                    by_group.setdefault((t, m.properties[L.P_SHARDING_KEY]), set()).add(q)
    assert by_group and all(len(qs) == 1 for qs in by_group.values())


def test_body_only_rows_of_several_topics(broker):
    c = broker.client
    table = pa.table(
        {"topic": ["A1", "B22", "A1", "C333"] * 50, "body": [f"b{i}".encode() for i in range(200)]}
    )
    assert c.send(table, {"mode": "normal"})["count"] == 200
    offs = half(c, table.slice(0, 100), "qm", 0, "am")
    assert c.commit_batch("qm", 0, "am", [offs])["outcome"] == "COMMITTED"
    assert visible(c, "B22") == sorted(
        [f"b{i}".encode() for i in range(1, 200, 4)] + [f"b{i}".encode() for i in range(1, 100, 4)]
    )


def test_a_committed_batch_is_remembered_by_offset_and_a_second_end_is_refused(broker):
    """The halves of a batch the sink stored and committed in one group are remembered as one
    array of CommitLog offsets (8 bytes a message, not an entry per transaction id): ending one
    again (its producer group's END_TRANSACTION, a group commit, the check-back) is refused, and
    the memory goes once the check-back has walked past them."""
    from rmq_spark.broker.connector.sink import decode_offsets
    from rmq_spark.services.transaction.check import CHECK_GROUP
    from rmq_spark.services.transaction.states import EndTxStatus

    c, sink = broker.client, broker.service.sink
    svc = sink.ledger._svc
    n = 3000
    offs = half(c, rows("Once", n), "q1", 0, "a1")
    c.commit_batch("q1", 0, "a1", [offs])
    sink.wait_visible()
    halves = decode_offsets([offs])
    ids = {m.uniq_key for m in broker.core.store.get_messages("Once", 0, 0, max_msgs=n).messages}
    assert ids and not ids & set(svc._state) and len(svc._runs) == n
    assert svc.end_transaction(halves[7], None, "rmq-spark-sink") is EndTxStatus.ALREADY_COMMITTED
    assert svc.commit_group(halves[:10]).status is EndTxStatus.ALREADY_COMMITTED
    half_msg = broker.core.store.look_message_by_offset(halves[3])
    assert svc.is_resolved(half_msg)
    assert len(visible(c, "Once")) == n  # nothing written twice
    # an abort of the committed attempt (its commit answer lost) ends nothing again
    assert c.abort_batch("q1", 0, "a1", [offs]) == {"rolled_back": 0}
    assert len(visible(c, "Once")) == n
    now = broker.core.clock.now_ms()
    svc._forget_old_ends(now)
    assert len(svc._runs) == n  # the check-back has not walked past them yet
    store = broker.core.store
    store.offsets.commit(
        CHECK_GROUP, L.TRANS_HALF_TOPIC, 0, store.max_offset(L.TRANS_HALF_TOPIC, 0)
    )
    svc._forget_old_ends(now)
    assert len(svc._runs) == 0


def test_after_a_restart_committed_batches_are_remembered_by_offset_and_transactions_by_id(
    store_dir,
):
    """On start, the service reads how transactions ended from the op queue: a sink's committed
    batches come back as arrays of CommitLog offsets (as the running service keeps them, no
    string per message: a restart after hours of a sink at full speed loaded millions of ids), a
    producer's transaction by its id; ending either again is refused, and the batches the
    check-back has walked past are not loaded at all."""
    from rmq_spark.broker.connector.sink import decode_offsets
    from rmq_spark.services.transaction.check import CHECK_GROUP
    from rmq_spark.services.transaction.states import EndTxStatus, TxnState
    from rmq_spark.store.message import Message

    b = Broker(store_dir)
    try:
        n = 2000
        offs = [half(b.client, rows("Re", n, prefix=f"b{k}-"), "q1", k, f"a{k}") for k in range(2)]
        for k in range(2):
            b.client.commit_batch("q1", k, f"a{k}", [offs[k]])
        b.service.sink.wait_visible()
        svc = b.service.sink.ledger._svc
        prepared = svc.prepare([Message("ReP", b"p", {L.P_TRAN_MSG: "true"})], "app-producer")
        phys = prepared.append.phys_offsets[0]
        tid = b.core.store.look_message_by_offset(phys).uniq_key
        assert svc.end_transaction(phys, None, "app-producer", tid) is EndTxStatus.SUCCESS
    finally:
        b.close()
    first, second = (decode_offsets([o]) for o in offs)
    for checked in (0, n):  # the check-back at the first half, then past the first batch
        b = Broker(store_dir)
        try:
            svc, store = b.service.sink.ledger._svc, b.core.store
            assert svc._state == {tid: TxnState.COMMITTED}
            assert len(svc._runs) == (2 * n if checked == 0 else n)
            assert (
                svc.end_transaction(second[5], None, "rmq-spark-sink")
                is EndTxStatus.ALREADY_COMMITTED
            )
            assert (
                svc.end_transaction(phys, None, "app-producer", tid)
                is EndTxStatus.ALREADY_COMMITTED
            )
            if checked == 0:
                assert svc.commit_group(first[:3]).status is EndTxStatus.ALREADY_COMMITTED
            assert visible(b.client, "Re") == sorted(
                f"b{k}-{i}".encode() for k in range(2) for i in range(n)
            )
            assert visible(b.client, "ReP") == [b"p"]
            now = b.core.clock.now_ms()
            svc._runs.forget(-1, now - 60_000)
            assert len(svc._runs) == (2 * n if checked == 0 else n)  # ended under a minute ago
            store.offsets.commit(CHECK_GROUP, L.TRANS_HALF_TOPIC, 0, n)
            store.offsets.persist()
        finally:
            b.close()
    svc._runs.forget(-1, now + 1)  # the batches' times are in ms: a moment later, they are old
    assert len(svc._runs) == 0


@pytest.mark.parametrize("kind", ["large_binary", "string", "sliced", "int64"])
def test_a_send_of_bodies_in_another_arrow_type_stores_them_or_says_why(broker, kind):
    """Bodies go into the store as their Arrow column (equal lengths copied from its buffer): a
    peer's large_binary, string (its UTF-8 bytes) or sliced column stores the same rows; a column
    of another type is refused with an error naming it, and the broker goes on serving."""
    c = broker.client
    bodies = [f"body-{i:05d}".encode() for i in range(1000)]  # 1,000 bodies of one length
    if kind == "large_binary":
        col = pa.array(bodies, pa.large_binary())
    elif kind == "string":
        col = pa.array([b.decode() for b in bodies], pa.string())
    elif kind == "int64":
        col = pa.array(range(1000), pa.int64())
    else:
        col = pa.array([b"x", *bodies], pa.binary()).slice(1)
    table = pa.table({"topic": ["Kinds"] * len(bodies), "body": col})
    if kind == "int64":
        with pytest.raises(MessageIllegalError, match="'body' must be binary or string, not int64"):
            c.send(table, {"mode": "normal"})
    else:
        assert c.send(table, {"mode": "normal"})["count"] == len(bodies)
        assert sorted(visible(c, "Kinds")) == sorted(bodies)
    more = rows("Kinds2", 300)
    assert c.send(more, {"mode": "normal"})["count"] == 300
    assert len(visible(c, "Kinds2")) == 300
