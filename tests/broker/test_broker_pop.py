"""Pop consumption (receive / ack / invisible time / retry / DLQ / FIFO) on a store, with a fake
clock: no gRPC, no sleeping."""

from __future__ import annotations

import itertools
import random

import pytest

from rmq_spark.broker import revive
from rmq_spark.broker.codes import AckOutcome
from rmq_spark.broker.pop import PopConfig, PopService, dlq_topic, retry_topic
from rmq_spark.broker.popstate import OffsetSet
from rmq_spark.errors import StoreError
from rmq_spark.filter import make_filter
from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.message import Message
from rmq_spark.store.store import MessageStore, StoreConfig

ALL = make_filter("TAG", "*")


class Core:
    """What the pop service needs of a BrokerCore: the store (no services)."""

    def __init__(self, root: str, clock: FakeClock) -> None:
        self.store = MessageStore(
            root, StoreConfig(commitlog_segment_bytes=1 << 20), clock=clock, start_services=False
        )

    def shutdown(self) -> None:
        self.store.shutdown()


@pytest.fixture
def env(store_dir):
    clock = FakeClock()
    core = Core(store_dir, clock)
    pop = PopService(core.store, PopConfig(max_delivery_attempts=3), clock)
    yield core, pop, clock
    if not core.store.closed:
        core.shutdown()


def put(core, topic, bodies, queue_id=0, **props):
    for b in bodies:
        core.store.put_message(Message(topic, b, dict(props), queue_id=queue_id))


def bodies(ds):
    return [d.message.body for d in ds]


def test_receive_ack_and_invalid_handles(env):
    core, pop, clock = env
    put(core, "T", [b"a", b"b"], queue_id=1)
    put(core, "T", [b"c"], queue_id=3)
    got = pop.pop("g", "T", ALL, 10, 5000)
    assert sorted(bodies(got)) == [b"a", b"b", b"c"]
    assert all(d.attempt == 1 and d.topic == "T" for d in got)
    assert pop.pop("g", "T", ALL, 10, 5000) == []  # invisible now
    assert pop.pop("other", "T", ALL, 10, 5000) != []  # groups are independent
    h = got[0].handle
    assert pop.ack("g", "T", h) is AckOutcome.OK
    assert pop.ack("g", "T", h) is AckOutcome.INVALID_HANDLE  # already acked
    assert pop.ack("g", "OTHER", got[1].handle) is AckOutcome.INVALID_HANDLE  # wrong topic
    for junk in ("", "x", "1 2 3", "9 9 9 9 9 9 9", "-1 0 0 0 0 0 a", "é" * 300):
        assert pop.ack("g", "T", junk) is AckOutcome.INVALID_HANDLE
    clock.advance(5001)
    assert pop.ack("g", "T", got[1].handle) is AckOutcome.EXPIRED


def test_change_invisible_duration_issues_a_new_handle(env):
    core, pop, clock = env
    put(core, "T", [b"a"])
    (d,) = pop.pop("g", "T", ALL, 1, 1000)
    outcome, new = pop.change_invisible("g", "T", d.handle, 10_000)
    assert outcome is AckOutcome.OK and new != d.handle
    assert pop.change_invisible("g", "T", d.handle, 10_000)[0] is AckOutcome.INVALID_HANDLE
    clock.advance(5000)
    assert pop.revive_once() == 0  # the old deadline no longer counts
    assert pop.pop("g", "T", ALL, 1, 1000) == []
    assert pop.ack("g", "T", new) is AckOutcome.OK
    clock.advance(20_000)
    assert pop.revive_once() == 0
    assert pop.pop("g", "T", ALL, 1, 1000) == []


def test_redelivery_through_the_retry_topic_then_dead_letters(env):
    core, pop, clock = env
    put(core, "T", [b"x"], TAGS="t1", KEYS="k1")
    attempts = []
    for _ in range(3):
        (d,) = pop.pop("g", "T", ALL, 5, 1000)
        attempts.append(d.attempt)
        assert d.topic == "T" and d.message.body == b"x" and d.message.tags == "t1"
        clock.advance(1001)
        assert pop.revive_once() == 1
    assert attempts == [1, 2, 3]
    assert core.store.max_offset(retry_topic("g"), 0) == 2
    assert pop.pop("g", "T", ALL, 5, 1000) == []
    dlq = core.store.get_messages(dlq_topic("g"), 0, 0).messages
    assert [m.body for m in dlq] == [b"x"]
    p = dlq[0].properties
    assert p[L.P_DLQ_ORIGIN_TOPIC] == "T" and p[L.P_KEYS] == "k1" and dlq[0].reconsume_times == 3
    assert p[L.P_UNIQ_KEY] == p[L.P_DLQ_ORIGIN_MESSAGE_ID]
    # everything of the group is finished: its committed offsets moved past the message
    assert core.store.offsets.query("g", "T", 0) == 1
    assert core.store.offsets.query("g", retry_topic("g"), 0) == 2


def test_a_message_that_cannot_be_read_back_stays_to_redeliver_and_the_others_move(
    env, monkeypatch, caplog
):
    """An expired message whose record fails to read (a damaged file) is not lost or stuck: the
    error is logged, it is delivered again from its queue, and the round's other messages move."""
    core, pop, clock = env
    put(core, "T", [b"a", b"b", b"c"])
    got = pop.pop("g", "T", ALL, 5, 1000)
    assert bodies(got) == [b"a", b"b", b"c"]
    bad = got[1].message.commitlog_offset
    real = core.store.look_message_by_offset

    def damaged(phys, size=None):  # type: ignore[no-untyped-def]
        if phys == bad:
            raise StoreError(f"commitlog/00000000000000000000: bad record at {phys}")
        return real(phys, size)

    monkeypatch.setattr(core.store, "look_message_by_offset", damaged)
    clock.advance(1001)
    pop.revive_once()
    assert "bad record at" in caplog.text
    assert core.store.max_offset(retry_topic("g"), 0) == 2  # a and c moved
    monkeypatch.setattr(core.store, "look_message_by_offset", real)
    again = {d.message.body: d for d in pop.pop("g", "T", ALL, 5, 1000)}
    assert sorted(again) == [b"a", b"b", b"c"]  # b from its queue, a and c from the retry topic
    assert (
        again[b"b"].message.commitlog_offset == bad
        and again[b"a"].attempt == again[b"c"].attempt == 2
    )
    for d in again.values():
        assert pop.ack("g", "T", d.handle) is AckOutcome.OK
    assert core.store.offsets.query("g", "T", 0) == 3  # nothing left behind in the queue


def test_a_copy_that_cannot_be_made_stays_to_redeliver_and_the_others_move(
    env, monkeypatch, caplog
):
    """Making one message's retry copy raises: that message is delivered again from its queue, the
    round's other messages move, nothing is lost."""
    core, pop, clock = env
    put(core, "T", [b"a", b"b", b"c"])
    assert bodies(pop.pop("g", "T", ALL, 5, 1000)) == [b"a", b"b", b"c"]
    real = revive.retry_copy

    def copy(ext, *args):  # type: ignore[no-untyped-def]
        if ext.body == b"b":
            raise ValueError("a property the copy cannot take")
        return real(ext, *args)

    monkeypatch.setattr(revive, "retry_copy", copy)
    clock.advance(1001)
    assert pop.revive_once() == 3
    assert "a property the copy cannot take" in caplog.text
    assert core.store.max_offset(retry_topic("g"), 0) == 2  # a and c moved
    monkeypatch.setattr(revive, "retry_copy", real)
    again = {d.message.body: d.attempt for d in pop.pop("g", "T", ALL, 5, 1000)}
    assert again == {b"a": 2, b"b": 1, b"c": 2}  # b from its queue (it was never copied)


@pytest.mark.parametrize("failure", ["raises", "refused"])
def test_a_failed_move_leaves_every_message_to_redeliver(env, monkeypatch, caplog, failure):
    """The write of the round's retry copies fails (an exception, or a status the store refuses
    with): every message of the round is delivered again from its own queue."""
    core, pop, clock = env
    put(core, "T", [b"a", b"b"])
    assert bodies(pop.pop("g", "T", ALL, 5, 1000)) == [b"a", b"b"]
    real = core.store.put_messages

    def broken(msgs, **kw):  # type: ignore[no-untyped-def]
        if failure == "raises":
            raise OSError("No space left on device")
        return type("Refused", (), {"ok": False})()

    monkeypatch.setattr(core.store, "put_messages", broken)
    clock.advance(1001)
    pop.revive_once()
    assert "moving 2 expired messages failed" in caplog.text
    monkeypatch.setattr(core.store, "put_messages", real)
    assert core.store.max_offset(retry_topic("g"), 0) == 0
    again = pop.pop("g", "T", ALL, 5, 1000)
    assert sorted(bodies(again)) == [b"a", b"b"]
    for d in again:
        assert pop.ack("g", "T", d.handle) is AckOutcome.OK
    assert core.store.offsets.query("g", "T", 0) == 2


def test_a_round_that_raises_midway_leaves_the_rest_in_flight_for_the_next(env, monkeypatch):
    """Something raises while a round looks at its due messages: the ones it already handled are
    moved, the rest stay in flight and expire in the next round."""
    core, pop, clock = env
    put(core, "T", [b"a", b"b", b"c"])
    pop.pop("g", "T", ALL, 1, 1000, client_id="c1", auto_renew=True)
    pop.pop("g", "T", ALL, 2, 1000)
    calls = []

    def flaky(cid):  # type: ignore[no-untyped-def]
        calls.append(cid)
        raise RuntimeError("client registry unavailable")

    pop.is_client_alive = flaky
    clock.advance(1001)
    with pytest.raises(RuntimeError):
        pop.revive_once()  # a (auto-renewed) comes first and raises
    assert calls == ["c1"]
    assert core.store.max_offset(retry_topic("g"), 0) == 0 and pop.inflight_count("g") == 3
    pop.is_client_alive = lambda cid: False
    assert pop.revive_once() == 3
    assert core.store.max_offset(retry_topic("g"), 0) == 3 and pop.inflight_count("g") == 0


def test_forward_to_dead_letter_queue_is_idempotent(env):
    core, pop, _clock = env
    put(core, "T", [b"x"])
    (d,) = pop.pop("g", "T", ALL, 1, 1000)
    assert pop.forward_to_dlq("g", "T", d.handle) is AckOutcome.OK
    assert pop.forward_to_dlq("g", "T", d.handle) is AckOutcome.OK
    assert core.store.max_offset(dlq_topic("g"), 0) == 1
    assert pop.forward_to_dlq("g", "T", "1 2 3 0 0 99 z") is AckOutcome.INVALID_HANDLE


def test_fifo_groups_are_served_in_order(env):
    core, pop, clock = env
    for i in range(3):
        for g in ("A", "B"):
            core.store.put_message(Message("F", f"{g}{i}".encode(), {L.P_SHARDING_KEY: g}))
    core.store.put_message(Message("F", b"free", {}))
    first = pop.pop("c", "F", ALL, 1, 1000)
    assert bodies(first) == [b"A0"]
    # A is blocked behind A0; B and the group-less message go on
    second = pop.pop("c", "F", ALL, 10, 1000)
    assert bodies(second) == [b"B0", b"B1", b"B2", b"free"]
    assert pop.pop("c", "F", ALL, 10, 1000) == []
    # everything times out; A0 and B* stay in their queue (FIFO), the group-less one goes to retry
    clock.advance(1001)
    for d in second:
        assert pop.ack("c", "F", d.handle) is AckOutcome.EXPIRED
    assert pop.revive_once() == 5
    assert core.store.max_offset(retry_topic("c"), 0) == 1
    again = pop.pop("c", "F", ALL, 2, 1000)
    assert bodies(again) == [b"free", b"A0"] and again[1].attempt == 2
    # a batch may hold several messages of a group, in order; A1 was never delivered
    more = pop.pop("c", "F", ALL, 10, 1000)
    assert bodies(more) == [b"B0", b"B1", b"B2"] and [d.attempt for d in more] == [2, 2, 2]
    assert pop.pop("c", "F", ALL, 10, 1000) == []  # A1 waits for A0
    assert pop.ack("c", "F", again[1].handle) is AckOutcome.OK
    last = pop.pop("c", "F", ALL, 10, 1000)
    assert bodies(last) == [b"A1", b"A2"] and [d.attempt for d in last] == [1, 1]


def test_tag_and_sql_filters(env):
    core, pop, _clock = env
    put(core, "T", [b"a1", b"a2"], TAGS="a", n="1")
    put(core, "T", [b"b1"], TAGS="b", n="7")
    assert bodies(pop.pop("g1", "T", make_filter("TAG", "b || c"), 10, 1000)) == [b"b1"]
    assert bodies(pop.pop("g2", "T", make_filter("SQL92", "n > 3"), 10, 1000)) == [b"b1"]
    # what a group's filter does not want is consumed, not left behind
    assert core.store.offsets.query("g1", "T", 0) == 2


def test_acks_survive_a_restart(store_dir):
    clock = FakeClock()
    core = Core(store_dir, clock)
    pop = PopService(core.store, PopConfig(), clock)
    put(core, "T", [b"%d" % i for i in range(6)])
    got = pop.pop("g", "T", ALL, 6, 60_000)
    for d in got:
        if d.message.body in (b"1", b"3", b"4"):
            assert pop.ack("g", "T", d.handle) is AckOutcome.OK
    pop.shutdown()
    core.shutdown()
    core = Core(store_dir, clock)
    pop = PopService(core.store, PopConfig(), clock)
    again = pop.pop("g", "T", ALL, 10, 60_000)
    assert bodies(again) == [b"0", b"2", b"5"]
    core.shutdown()


def test_auto_renew_and_release_client(env):
    core, pop, clock = env
    alive = {"c1": True}
    pop.is_client_alive = lambda cid: alive.get(cid, False)
    put(core, "T", [b"x"])
    (_d,) = pop.pop("g", "T", ALL, 1, 1000, client_id="c1", auto_renew=True)
    clock.advance(1001)
    assert pop.revive_once() == 0  # renewed: the client is alive
    assert pop.pop("g", "T", ALL, 1, 1000) == []
    assert pop.release_client("c1") == 1
    assert pop.revive_once() == 1
    (d2,) = pop.pop("g", "T", ALL, 1, 1000)
    assert d2.attempt == 2 and d2.message.body == b"x"


def test_new_group_starts_at_the_beginning_and_committed_offsets_win(env):
    core, pop, _clock = env
    put(core, "T", [b"a", b"b", b"c"])
    core.store.offsets.commit("late", "T", 0, 2)
    assert bodies(pop.pop("late", "T", ALL, 10, 1000)) == [b"c"]
    assert bodies(pop.pop("early", "T", ALL, 10, 1000)) == [b"a", b"b", b"c"]


def test_offset_set_matches_a_plain_set():
    rnd = random.Random(7)
    for _ in range(200):
        s = OffsetSet()
        ref: set[int] = set()
        base = 0
        for _ in range(30):
            lo = rnd.randrange(0, 60)
            hi = lo + rnd.randrange(1, 5)
            s.add_range(lo, hi)
            ref.update(range(lo, hi))
            if rnd.random() < 0.3:
                base = s.advance(base)
                while base in ref:
                    base += 1
                ref = {x for x in ref if x >= base}
            assert all((x in s) == (x in ref) for x in range(base, 70))
        ivs = s.intervals()
        assert all(a[1] < b[0] for a, b in itertools.pairwise(ivs))  # disjoint, not touching
