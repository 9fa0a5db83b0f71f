"""ScheduleService (delay levels): routing, order, clamping, progress, retries, and exactly-once
delivery across crashes -- on a FakeClock, plus a real-clock thread and a SIGKILLed broker."""

from __future__ import annotations

import json
import os
import random
import time

import pytest
from _delay_worker import (
    broker_config,
    delivered_ids,
    patched_and_general,
    run_and_kill,
)

from rmq_spark.errors import ConfigError, MessageIllegalError, StoreError
from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.schedule.service import ScheduleService, store_rules
from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.message import Message, tags_code
from rmq_spark.store.store import MessageStore, StoreConfig

T0 = 1_700_000_000_000


def open_service(
    root: str, clock: FakeClock, levels: str = "1s 5s 10s", batch: int = 1024, **store_kw
):
    cfg = BrokerConfig(
        store=StoreConfig(commitlog_segment_bytes=1 << 20, cq_segment_units=1000, **store_kw),
        delay_levels=levels,
    )
    store = MessageStore(
        root, cfg.store, clock=clock, start_services=False, tags_code_rules=store_rules(cfg)
    )
    return store, ScheduleService(store, cfg, clock, batch_max_msgs=batch)


def send(store: MessageStore, svc: ScheduleService, msgs: list[Message]) -> list[str]:
    result = store.put_messages([svc.transform(m) for m in msgs])
    return result.uniq_keys


def delayed(topic: str, level: int, body: bytes, queue_id: int = 0, tags: str = "TagA") -> Message:
    return Message(
        topic,
        body,
        {L.P_TAGS: tags, L.P_DELAY: str(level), "KEYS": body.decode()},
        queue_id=queue_id,
    )


def bodies(store: MessageStore, topic: str, queue_id: int = 0) -> list[bytes]:
    return [m.body for m in store.get_messages(topic, queue_id, 0, max_msgs=10_000).messages]


# --- put hook -------------------------------------------------------------------------------------
def test_transform_routes_a_level_to_its_schedule_queue(store_dir):
    store, svc = open_service(store_dir, FakeClock(T0))
    out = svc.transform(delayed("Orders", 2, b"a", queue_id=3))
    assert (out.topic, out.queue_id) == (L.SCHEDULE_TOPIC, 1)
    assert out.properties[L.P_REAL_TOPIC] == "Orders" and out.properties[L.P_REAL_QID] == "3"
    assert out.properties[L.P_DELAY] == "2"
    store.shutdown()


def test_transform_clamps_levels_and_leaves_other_messages(store_dir):
    store, svc = open_service(store_dir, FakeClock(T0))  # 3 levels
    out = svc.transform(delayed("Orders", 99, b"a"))
    assert out.queue_id == 2 and out.properties[L.P_DELAY] == "3"
    for level in ("0", "-2"):
        plain = Message("Orders", b"b", {L.P_DELAY: level})
        assert svc.transform(plain) is plain
    half = Message("Orders", b"c", {L.P_DELAY: "1"}, sys_flag=L.TRANSACTION_PREPARED_TYPE)
    assert svc.transform(half) is half
    with pytest.raises(MessageIllegalError, match="DELAY"):
        svc.transform(Message("Orders", b"d", {L.P_DELAY: "soon"}))
    both = svc.transform(Message("Orders", b"e", {L.P_DELAY: "1", L.P_TIMER_DELAY_MS: "5"}))
    assert both.topic == L.SCHEDULE_TOPIC and L.P_TIMER_DELAY_MS not in both.properties
    store.shutdown()


def test_schedule_unit_tags_code_is_the_delivery_time(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [delayed("Orders", 2, b"a"), delayed("Orders", 9, b"b")])
    assert int(store.consume_queue(L.SCHEDULE_TOPIC, 1).units(0, 1)["tags_code"][0]) == T0 + 5000
    assert int(store.consume_queue(L.SCHEDULE_TOPIC, 2).units(0, 1)["tags_code"][0]) == T0 + 10_000
    store.shutdown()


# --- delivery -------------------------------------------------------------------------------------
def test_delivers_in_order_when_due_and_restores_the_message(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    ids = send(store, svc, [delayed("Orders", 2, b"m%d" % i, queue_id=1) for i in range(5)])
    clock.advance(4999)
    assert svc.run_once() == 0
    assert store.max_offset("Orders", 1) == 0
    clock.advance(1)
    assert svc.run_once() == 5
    got = store.get_messages("Orders", 1, 0, max_msgs=10).messages
    assert [m.body for m in got] == [b"m%d" % i for i in range(5)]
    for i, m in enumerate(got):
        assert m.properties[L.P_UNIQ_KEY] == ids[i]
        assert m.properties["KEYS"] == f"m{i}"
        # what Apache's ScheduleMessageService stores: the schedule record's properties as they were
        assert (
            m.properties[L.P_DELAY],
            m.properties[L.P_REAL_TOPIC],
            m.properties[L.P_REAL_QID],
        ) == ("2", "Orders", "1")
        assert L.P_TIMER_OUT_MS not in m.properties
        assert not any(k.endswith("_SOURCE") for k in m.properties)
    units = store.consume_queue("Orders", 1).units(0, 5)
    assert set(units["tags_code"].tolist()) == {tags_code("TagA")}
    assert svc.run_once() == 0  # nothing twice
    store.shutdown()


def test_levels_run_independently(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [delayed("Orders", 3, b"slow")])
    clock.advance(100)
    send(store, svc, [delayed("Orders", 1, b"fast")])
    clock.advance(1000)
    svc.run_once()
    assert bodies(store, "Orders") == [b"fast"]
    clock.advance(9000)
    svc.run_once()
    assert bodies(store, "Orders") == [b"fast", b"slow"]
    assert svc.stats.per_level == {1: 1, 3: 1}
    store.shutdown()


def test_batches_are_bounded_and_drain_in_one_round(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock, batch=7)
    send(store, svc, [delayed("Orders", 1 + i % 2, b"%d" % i) for i in range(40)])
    clock.advance(5000)
    assert svc.run_once() == 40
    assert sorted(bodies(store, "Orders"), key=int) == [b"%d" % i for i in range(40)]
    store.shutdown()


def test_configured_levels_and_clamping(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock, levels="200ms 2s")
    assert svc.levels_ms == [200, 2000]
    send(store, svc, [delayed("Orders", 1, b"a"), delayed("Orders", 7, b"b")])
    clock.advance(200)
    svc.run_once()
    assert bodies(store, "Orders") == [b"a"]
    clock.advance(1800)
    svc.run_once()
    assert bodies(store, "Orders") == [b"a", b"b"]
    store.shutdown()


def test_clock_moved_back_delivers_now(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [delayed("Orders", 1, b"a")])
    clock.set(T0 - 60_000)  # due time is now more than one level delay ahead
    assert svc.run_once() == 1
    store.shutdown()


def test_transaction_half_real_topic_is_discarded(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    msg = svc.transform(delayed("Orders", 1, b"a"))
    msg.properties[L.P_REAL_TOPIC] = L.TRANS_HALF_TOPIC
    store.put_messages([msg, svc.transform(delayed("Orders", 1, b"b"))])
    clock.advance(1000)
    assert svc.run_once() == 1
    assert svc.stats.discarded == 1 and store.max_offset(L.TRANS_HALF_TOPIC, 0) == 0
    assert svc.offsets[0] == 2
    store.shutdown()


# --- progress, retries, restarts ------------------------------------------------------------------
def test_progress_saved_and_resumed_without_redelivery(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [delayed("Orders", 1, b"a"), delayed("Orders", 2, b"b")])
    clock.advance(1000)
    svc.run_once()
    svc.shutdown()
    store.shutdown()
    with open(os.path.join(store_dir, L.CONFIG_DIR, L.DELAY_OFFSET_FILE)) as f:
        saved = json.load(f)
    assert saved["offsetTable"]["1"] == 1 and saved["offsetTable"]["2"] == 0
    assert saved["commitLogOffset"] > 0 and saved["dataVersion"]["counter"] >= 1
    store, svc = open_service(store_dir, clock)
    assert svc.offsets[0] == 1 and svc.stats.reconciled == 0
    clock.advance(4000)
    assert svc.run_once() == 1
    assert bodies(store, "Orders") == [b"a", b"b"]
    store.shutdown()


def test_crash_before_checkpoint_reconciles_from_the_commitlog(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [delayed("Orders", 1, b"%d" % i) for i in range(10)])
    svc.checkpoint()  # progress 0 saved
    clock.advance(1000)
    assert svc.run_once() == 10
    svc.crash()
    store.crash()
    store, svc = open_service(store_dir, clock)
    assert svc.offsets[0] == 10 and svc.stats.reconciled == 10
    clock.advance(60_000)
    assert svc.run_once() == 0
    assert len(bodies(store, "Orders")) == 10
    store.shutdown()


def test_saved_offsets_are_clamped_into_the_queue(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [delayed("Orders", 1, b"a"), delayed("Orders", 1, b"b")])
    svc.crash()
    store.shutdown()
    path = os.path.join(store_dir, L.CONFIG_DIR, L.DELAY_OFFSET_FILE)
    with open(path, "w") as f:  # RocketMQ writes integer keys unquoted
        f.write('{"offsetTable": {1: 999, 2: -4}, "commitLogOffset": 0}')
    store, svc = open_service(store_dir, clock)
    assert svc.offsets[0] == 2 and svc.offsets[1] == 0
    store.shutdown()


def test_failed_write_is_retried_with_nothing_skipped(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [delayed("Orders", 1, b"%d" % i) for i in range(3)])
    real_put, calls = svc._put, []

    def failing(*args):
        calls.append(1)
        if len(calls) == 1:
            raise StoreError("disk full")
        real_put(*args)

    svc._put = failing
    clock.advance(1000)
    assert svc.run_once() == 0
    assert svc.offsets[0] == 0 and svc.stats.failed_puts == 1
    assert "disk full" in str(svc.last_error)
    clock.advance(50)
    assert svc.run_once() == 0  # backing off
    assert svc.next_due_ms() == T0 + 1100
    clock.advance(50)
    assert svc.run_once() == 3
    assert bodies(store, "Orders") == [b"0", b"1", b"2"]
    store.shutdown()


def test_a_topic_that_cannot_take_messages_holds_only_its_level(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock, auto_create_topics=False)
    from rmq_spark.store.config import TopicConfig

    store.topics.create(TopicConfig("Open", 1, 1))
    store.topics.create(TopicConfig("Missing", 1, 1))
    send(store, svc, [delayed("Missing", 1, b"x"), delayed("Open", 2, b"y")])
    store.topics.delete("Missing")
    clock.advance(5000)
    assert svc.run_once() == 1
    assert bodies(store, "Open") == [b"y"] and svc.offsets[0] == 0
    assert isinstance(svc.last_error, ConfigError)
    store.topics.create(TopicConfig("Missing", 1, 1))
    clock.advance(100)
    assert svc.run_once() == 1
    assert bodies(store, "Missing") == [b"x"]
    store.shutdown()


class _Kill(BaseException):
    """Stands for kill -9 in the middle of a round."""


@pytest.mark.parametrize("seed", range(1, 9))
def test_random_crashes_deliver_every_message_exactly_once(tmp_path, seed):
    rng = random.Random(seed)
    root = str(tmp_path / "s")
    clock = FakeClock(T0)
    store, svc = open_service(root, clock, levels="1s 2s 3s", batch=5)
    sent: list[str] = []
    crashes = 0
    for step in range(60):
        if step < 40:
            n = rng.randint(0, 6)
            msgs = [
                delayed(
                    "Orders", rng.randint(1, 4), b"%d-%d" % (step, k), queue_id=rng.randint(0, 3)
                )
                for k in range(n)
            ]
            if msgs:
                sent += send(store, svc, msgs)
        clock.advance(rng.randint(0, 400))
        mode = rng.random()
        if mode < 0.3:  # die inside a round: before or after one of its writes
            real_put, budget, after = svc._put, rng.randint(0, 3), rng.random() < 0.5

            def dying(*args, real_put=real_put, state={"left": budget}, after=after):  # noqa: B006
                if state["left"] == 0:
                    if after:
                        real_put(*args)
                    raise _Kill()
                state["left"] -= 1
                real_put(*args)

            svc._put = dying
            try:
                svc.run_once()
            except _Kill:
                pass
            svc.crash()
            store.crash()
            crashes += 1
            store, svc = open_service(root, clock, levels="1s 2s 3s", batch=5)
        elif mode < 0.4:
            svc.run_once()
            svc.checkpoint()
        elif mode < 0.5:  # a write fails (nothing written): retried after the back-off
            real_put, state = svc._put, {"left": rng.randint(0, 2)}

            def flaky(*args, real_put=real_put, state=state):
                if state["left"] == 0:
                    state["left"] = -1
                    raise StoreError("transient")
                state["left"] -= 1
                real_put(*args)

            svc._put = flaky
            svc.run_once()
            svc._put = real_put
        else:
            svc.run_once()
    clock.advance(10_000)
    svc.run_once()
    got = delivered_ids(store, "Orders")
    assert crashes > 0
    assert sorted(got) == sorted(sent) and set(got.values()) == {1}
    store.shutdown()


# --- threads and real processes -------------------------------------------------------------------
def test_service_thread_delivers_on_the_real_clock(store_dir):
    cfg = BrokerConfig(
        store=StoreConfig(commitlog_segment_bytes=1 << 20), delay_levels="100ms 300ms"
    )
    store = MessageStore(store_dir, cfg.store, tags_code_rules=store_rules(cfg))
    svc = ScheduleService(store, cfg, store.clock)
    svc.start()
    try:
        ids = send(store, svc, [delayed("Orders", 1 + i % 2, b"%d" % i) for i in range(20)])
        deadline = time.monotonic() + 10
        while sum(delivered_ids(store, "Orders").values()) < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        svc.shutdown()
    got = store.get_messages("Orders", 0, 0, max_msgs=100).messages
    assert sorted(m.properties[L.P_UNIQ_KEY] for m in got) == sorted(ids)
    due = {}  # unique id -> when its schedule record came due (the unit's tagsCode)
    for q in (0, 1):
        cq = store.consume_queue(L.SCHEDULE_TOPIC, q)
        units = cq.units(0, cq.max_offset)
        recs = store.get_messages(L.SCHEDULE_TOPIC, q, 0, max_msgs=100).messages
        due.update(
            (r.properties[L.P_UNIQ_KEY], int(t))
            for r, t in zip(recs, units["tags_code"], strict=True)
        )
    for m in got:  # never early
        assert m.store_timestamp_ms >= due[m.properties[L.P_UNIQ_KEY]]
    store.shutdown()


@pytest.mark.slow
def test_sigkilled_broker_delivers_exactly_once(tmp_path):
    root = str(tmp_path / "s")
    conf = {
        "delay_levels": "1s 2s",
        "segment_bytes": 4 << 20,
        "batch_max_msgs": 8,
        "checkpoint_interval_ms": 100,
    }
    cfg = broker_config(conf)
    store = MessageStore(root, cfg.store, tags_code_rules=store_rules(cfg))
    svc = ScheduleService(store, cfg, store.clock)
    sent = []
    for k in range(4):
        sent += send(
            store,
            svc,
            [delayed("Orders", 1 + i % 2, b"%d-%d" % (k, i), queue_id=i % 4) for i in range(500)],
        )
    svc.crash()
    store.shutdown()
    rng = random.Random(5)
    targets = sorted(rng.sample(range(100, len(sent) - 100), 3))
    seen = run_and_kill(root, conf, "Orders", targets)
    assert all(
        s >= t for s, t in zip(seen, targets, strict=True)
    )  # each kill landed while delivering
    store = MessageStore(root, cfg.store, tags_code_rules=store_rules(cfg))
    svc = ScheduleService(store, cfg, store.clock)
    last_due = max(
        int(store.consume_queue(L.SCHEDULE_TOPIC, q).units(0, 10**6)["tags_code"].max())
        for q in (0, 1)
    )
    time.sleep(max(0.0, (last_due - store.clock.now_ms()) / 1000))
    svc.run_once()
    got = delivered_ids(store, "Orders")
    assert sorted(got) == sorted(sent) and set(got.values()) == {1}
    print(
        f"kills at {seen} (targets {targets}); "
        f"reconciled at the last restart: {svc.stats.reconciled}"
    )
    store.shutdown()


@pytest.mark.parametrize("crc", [False, True])
def test_patched_delivery_writes_what_the_general_path_writes(tmp_path, crc):
    """Re-writing records by patching their bytes yields the messages that decoding and
    encoding them yields (properties, routing, tags codes, headers), record CRC on or off."""
    views, patched = patched_and_general(
        tmp_path, crc, open_service, send, L.P_DELAY, lambda rng: str(rng.randint(1, 3)), seed=11
    )
    assert sum(map(len, views[0].values())) == 300
    assert views[0] == views[1]
    assert patched == [300, 0]


def test_gather_runs_concatenates_the_runs():
    """The in-place run gather of the patched path equals slicing and joining, empty runs, a
    reused per-thread index that is larger than needed, and a gather bigger than it included."""
    import numpy as np

    from rmq_spark.services.redelivery.patch import gather_runs

    rng = np.random.default_rng(5)
    for size in [3000, 5, 40_000, 200, 1]:  # shrinking after growing reuses a longer index
        pool = rng.integers(0, 256, size).astype(np.uint8)
        k = int(rng.integers(1, 80))
        starts = rng.integers(0, size, k)
        lens = np.minimum(rng.integers(0, 700, k), size - starts)
        lens[0] = 0
        want = b"".join(pool[s : s + n].tobytes() for s, n in zip(starts, lens, strict=True))
        assert bytes(gather_runs(pool, starts, lens, int(lens.sum()))) == want
    assert gather_runs(np.zeros(4, np.uint8), np.array([1]), np.array([0]), 0) == bytearray()


# --- recovery without a marker of its own (issue 29: the copy stores what Apache stores) ------------
def twin(level: int, body: bytes, uniq: str) -> Message:
    """A message a client sent twice (a resend): the same unique id, born time and body."""
    return Message(
        "Orders", body, {L.P_DELAY: str(level), L.P_UNIQ_KEY: uniq}, born_timestamp_ms=T0 - 5
    )


def test_crash_recovery_matches_copies_past_resends_and_discarded_records(store_dir):
    """The copies carry no marker: after a crash each level's cursor moves past the records its
    copies match, in order -- an identical resend counted once per copy, a record discarded
    (no REAL_TOPIC) skipped -- and the records delivered later come exactly once."""
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [twin(1, b"A", "U-A")])
    # a schedule record without a real topic (written straight to the topic): discarded when due
    store.put_messages([Message(L.SCHEDULE_TOPIC, b"X", {L.P_DELAY: "1"}, queue_id=0)])
    send(store, svc, [twin(1, b"A", "U-A")])  # the resend
    svc.checkpoint()  # progress 0 saved, with the CommitLog end before any delivery
    clock.advance(500)
    send(store, svc, [twin(1, b"B", "U-B"), twin(1, b"C", "U-C")])  # due 500 ms later
    clock.advance(500)
    assert svc.run_once() == 2 and svc.stats.discarded == 1  # A and its resend; X discarded
    svc.crash()
    store.crash()
    store, svc = open_service(store_dir, clock)
    assert svc.offsets[0] == 3 and svc.stats.reconciled == 3  # A, X, A' done; B and C not
    clock.advance(500)
    assert svc.run_once() == 2
    assert sorted(bodies(store, "Orders")) == [b"A", b"A", b"B", b"C"]
    assert not any(
        k.endswith("_SOURCE")
        for m in store.get_messages("Orders", 0, 0).messages
        for k in m.properties
    )
    store.shutdown()


def test_copies_behind_the_cursor_move_nothing(store_dir):
    """Progress saved without a CommitLog offset (as Apache writes delayOffset.json): the scan
    starts at 0 and finds copies of records the cursor has passed; they match no record ahead of
    it, so nothing is skipped."""
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [twin(1, b"A", "U-A"), twin(1, b"B", "U-B")])
    clock.advance(1000)
    assert svc.run_once() == 2
    send(store, svc, [twin(1, b"C", "U-C"), twin(1, b"D", "U-D")])
    svc.crash()
    store.shutdown()
    path = os.path.join(store_dir, L.CONFIG_DIR, L.DELAY_OFFSET_FILE)
    with open(path, "w") as f:
        f.write('{"offsetTable": {"1": 2}}')
    store, svc = open_service(store_dir, clock)
    assert svc.offsets[0] == 2 and svc.stats.reconciled == 0
    clock.advance(1000)
    assert svc.run_once() == 2
    assert sorted(bodies(store, "Orders")) == [b"A", b"B", b"C", b"D"]
    store.shutdown()
