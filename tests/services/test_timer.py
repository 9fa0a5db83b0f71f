"""TimerService (timer messages): the put hook, exact delivery on a FakeClock, the wheel, recall,
restarts, and exactly-once delivery across crashes -- plus a real-clock thread, a SIGKILLed
broker and the BrokerCore composition."""

from __future__ import annotations

import base64
import os
import random
import time

import numpy as np
import pytest
from _delay_worker import (
    broker_config,
    delivered_ids,
    patched_and_general,
    run_and_kill,
)

from rmq_spark.errors import MessageIllegalError, StoreError
from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.timer.recall import (
    RecallError,
    RecallFailure,
    build_recall_handle,
    parse_recall_handle,
)
from rmq_spark.services.timer.service import TIMER_CHECK_FILE, TimerService
from rmq_spark.services.timer.wheel import ENTRY, TimerWheel
from rmq_spark.store import layout as L
from rmq_spark.store import timerfiles
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.message import Message, tags_code
from rmq_spark.store.store import MessageStore, StoreConfig

T0 = 1_700_000_000_000


def open_service(
    root: str, clock: FakeClock, batch: int = 1024, max_delay_s: int = 3 * 86400, **store_kw
):
    cfg = BrokerConfig(
        store=StoreConfig(commitlog_segment_bytes=1 << 20, cq_segment_units=1000, **store_kw),
        timer_max_delay_s=max_delay_s,
        broker_name="broker-a",
    )
    store = MessageStore(root, cfg.store, clock=clock, start_services=False)
    return store, TimerService(store, cfg, clock, batch_max_msgs=batch)


def timed(topic: str, body: bytes, queue_id: int = 0, **props: str) -> Message:
    return Message(topic, body, {L.P_TAGS: "TagT", **props}, queue_id=queue_id)


def send(
    store: MessageStore, svc: TimerService, msgs: list[Message]
) -> tuple[list[str], list[str | None]]:
    out = [svc.transform(m) for m in msgs]
    result = store.put_messages(out)
    return result.uniq_keys, [svc.recall_handle(m) for m in out]


def bodies(store: MessageStore, topic: str, queue_id: int = 0) -> list[bytes]:
    return [m.body for m in store.get_messages(topic, queue_id, 0, max_msgs=10_000).messages]


# --- put hook -------------------------------------------------------------------------------------
def test_transform_precedence_and_routing(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    out = svc.transform(
        timed(
            "Orders",
            b"a",
            2,
            **{
                L.P_TIMER_DELAY_SEC: "3",
                L.P_TIMER_DELAY_MS: "500",
                L.P_TIMER_DELIVER_MS: str(T0 + 9),
            },
        )
    )
    assert (out.topic, out.queue_id) == (L.TIMER_TOPIC, 0)
    assert out.properties[L.P_TIMER_OUT_MS] == str(T0 + 3000)
    assert out.properties[L.P_REAL_TOPIC] == "Orders" and out.properties[L.P_REAL_QID] == "2"
    assert L.P_UNIQ_KEY in out.properties
    out = svc.transform(
        timed("Orders", b"b", **{L.P_TIMER_DELAY_MS: "500", L.P_TIMER_DELIVER_MS: str(T0 + 9)})
    )
    assert out.properties[L.P_TIMER_OUT_MS] == str(T0 + 500)
    out = svc.transform(timed("Orders", b"c", **{L.P_TIMER_DELIVER_MS: str(T0 + 1234)}))
    assert out.properties[L.P_TIMER_OUT_MS] == str(T0 + 1234)  # exact: no rounding to a precision
    store.shutdown()


def test_transform_leaves_levels_past_times_and_halves_alone(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    level = svc.transform(timed("Orders", b"a", **{L.P_DELAY: "2", L.P_TIMER_DELAY_MS: "500"}))
    assert (
        level.topic == "Orders"
        and L.P_TIMER_DELAY_MS not in level.properties
        and level.properties[L.P_DELAY] == "2"
    )
    past = timed("Orders", b"b", **{L.P_TIMER_DELIVER_MS: str(T0)})
    assert svc.transform(past) is past  # already due: a normal message
    negative = timed("Orders", b"c", **{L.P_TIMER_DELAY_SEC: "-5"})
    assert svc.transform(negative) is negative
    half = Message(
        "Orders", b"d", {L.P_TIMER_DELAY_MS: "500"}, sys_flag=L.TRANSACTION_PREPARED_TYPE
    )
    assert svc.transform(half) is half
    plain = Message("Orders", b"e")
    assert svc.transform(plain) is plain
    store.shutdown()


def test_transform_rejects_bad_and_too_distant_times(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock, max_delay_s=60)
    with pytest.raises(MessageIllegalError, match=r"WHEEL_TIMER_MSG_ILLEGAL.*TIMER_DELAY_MS"):
        svc.transform(timed("Orders", b"a", **{L.P_TIMER_DELAY_MS: "soon"}))
    with pytest.raises(MessageIllegalError, match="maximum is 60s"):
        svc.transform(timed("Orders", b"b", **{L.P_TIMER_DELIVER_MS: str(T0 + 60_001)}))
    with pytest.raises(MessageIllegalError, match="maximum is 60s"):
        svc.transform(timed("Orders", b"c", **{L.P_TIMER_DELAY_SEC: "61"}))
    ok = svc.transform(timed("Orders", b"d", **{L.P_TIMER_DELAY_SEC: "60"}))
    assert ok.properties[L.P_TIMER_OUT_MS] == str(T0 + 60_000)
    store.shutdown()


# --- the wheel ------------------------------------------------------------------------------------
def test_wheel_pops_due_entries_in_time_then_queue_order():
    wheel = TimerWheel(slot_ms=100)
    e = np.zeros(6, ENTRY)
    e["deliver_ms"] = [250, 40, 250, 1000, 99, 101]
    e["offset"] = [5, 1, 2, 3, 4, 0]
    wheel.add(e)
    assert len(wheel) == 6 and wheel.next_ms() == 40 and wheel.min_offset() == 0
    assert wheel.pop_due(39).tolist() == []
    assert wheel.pop_due(250)["offset"].tolist() == [1, 4, 0, 2, 5]
    assert (
        len(wheel) == 1 and wheel.find(1000)["offset"].tolist() == [3] and wheel.find(999).size == 0
    )
    assert wheel.next_ms() == 1000 and wheel.pop_due(10**6)["offset"].tolist() == [3]
    assert wheel.next_ms() is None and wheel.min_offset() is None


# --- delivery -------------------------------------------------------------------------------------
def test_delivers_exactly_when_due_in_time_order(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock, batch=4)
    rng = random.Random(3)
    delays = [rng.randint(1, 500) for _ in range(40)]
    ids, _ = send(
        store,
        svc,
        [
            timed("Orders", b"%d" % d, i % 2, **{L.P_TIMER_DELAY_MS: str(d)})
            for i, d in enumerate(delays)
        ],
    )
    for _ in range(500):
        clock.advance(1)
        svc.run_once()
    got = [m for q in (0, 1) for m in store.get_messages("Orders", q, 0, max_msgs=100).messages]
    assert sorted(m.properties[L.P_UNIQ_KEY] for m in got) == sorted(ids)
    for m in got:  # each written in the round at its due millisecond
        assert m.store_timestamp_ms == int(m.properties[L.P_TIMER_OUT_MS]) == T0 + int(m.body)
    for q in (0, 1):
        times = [int(b) for b in bodies(store, "Orders", q)]
        assert times == sorted(times)
    assert svc.pending_count == 0 and svc.next_due_ms() is None
    store.shutdown()


def test_delivered_message_is_restored(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    ids, _ = send(
        store, svc, [timed("Orders", b"body", 3, KEYS="k1", **{L.P_TIMER_DELAY_MS: "100"})]
    )
    clock.advance(100)
    assert svc.run_once() == 1
    (m,) = store.get_messages("Orders", 3, 0).messages
    assert (
        m.body == b"body" and m.properties[L.P_UNIQ_KEY] == ids[0] and m.properties["KEYS"] == "k1"
    )
    # what Apache's TimerMessageStore stores: the timer record's properties, and the two stamps
    assert m.properties[L.P_TIMER_OUT_MS] == str(T0 + 100)
    (timer_record,) = store.get_messages(L.TIMER_TOPIC, 0, 0).messages
    assert m.properties[L.P_TIMER_ENQUEUE_MS] == str(timer_record.store_timestamp_ms)
    assert m.properties[L.P_TIMER_DEQUEUE_MS] == str(T0 + 100)
    assert (m.properties[L.P_REAL_TOPIC], m.properties[L.P_REAL_QID]) == ("Orders", "3")
    assert m.properties[L.P_TIMER_DELAY_MS] == "100"
    assert {
        k: v
        for k, v in m.properties.items()
        if k not in (L.P_TIMER_ENQUEUE_MS, L.P_TIMER_DEQUEUE_MS)
    } == {k: v for k, v in timer_record.properties.items() if k != "__CRC32#"}
    assert not any(k.endswith("_SOURCE") for k in m.properties)
    assert int(store.consume_queue("Orders", 3).units(0, 1)["tags_code"][0]) == tags_code("TagT")
    store.shutdown()


def test_failed_write_is_held_and_retried(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [timed("Orders", b"%d" % i, **{L.P_TIMER_DELAY_MS: "10"}) for i in range(3)])
    real_put, calls = svc._put, []

    def failing(*args):
        calls.append(1)
        if len(calls) == 1:
            raise StoreError("disk full")
        real_put(*args)

    svc._put = failing
    clock.advance(10)
    assert svc.run_once() == 0 and svc.stats.failed_puts == 1 and svc.pending_count == 3
    assert svc.next_due_ms() == T0 + 110  # back-off
    clock.advance(99)
    assert svc.run_once() == 0
    clock.advance(1)
    assert svc.run_once() == 3
    assert bodies(store, "Orders") == [b"0", b"1", b"2"]
    store.shutdown()


# --- recall ---------------------------------------------------------------------------------------
def test_recall_handle_is_rocketmq_v1(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    ids, handles = send(
        store, svc, [timed("Orders", b"a", **{L.P_TIMER_DELAY_MS: "500"}), Message("Orders", b"b")]
    )
    assert handles[1] is None
    raw = base64.urlsafe_b64decode(handles[0]).decode()
    assert raw == f"v1 Orders broker-a {T0 + 501} {ids[0]}"
    h = parse_recall_handle(handles[0].rstrip("="))  # padding optional
    assert (h.topic, h.broker_name, h.timestamp_ms, h.message_id) == (
        "Orders",
        "broker-a",
        T0 + 501,
        ids[0],
    )
    assert build_recall_handle("Orders", "broker-a", T0 + 501, ids[0]) == handles[0]
    retry = svc.transform(timed("%RETRY%g", b"c", **{L.P_TIMER_DELAY_MS: "500"}))
    assert svc.recall_handle(retry) is None
    store.shutdown()


def test_recall_cancels_only_its_message(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    ids, handles = send(
        store, svc, [timed("Orders", b"%d" % i, **{L.P_TIMER_DELAY_MS: "500"}) for i in range(3)]
    )
    send(store, svc, [Message("Other", b"x", {L.P_UNIQ_KEY: ids[1], L.P_TIMER_DELAY_MS: "500"})])
    clock.advance(100)
    assert svc.recall("Orders", handles[1]) == ids[1]
    clock.advance(400)
    assert svc.run_once() == 3
    assert bodies(store, "Orders") == [b"0", b"2"]
    assert bodies(store, "Other") == [b"x"]  # same id, other topic: untouched
    assert svc.stats.recalled == 1
    store.shutdown()


def test_recall_errors_are_clear(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    ids, handles = send(store, svc, [timed("Orders", b"a", **{L.P_TIMER_DELAY_MS: "500"})])
    cases = [
        ("Orders", "not base64!", RecallFailure.INVALID_HANDLE),
        ("Orders", base64.urlsafe_b64encode(b"v2 a b 1 c").decode(), RecallFailure.INVALID_HANDLE),
        (
            "Orders",
            build_recall_handle("Orders", "broker-a", "soon", ids[0]),
            RecallFailure.INVALID_HANDLE,
        ),  # type: ignore[arg-type]
        ("Other", handles[0], RecallFailure.TOPIC_MISMATCH),
        (
            "Orders",
            build_recall_handle("Orders", "broker-b", T0 + 501, ids[0]),
            RecallFailure.BROKER_MISMATCH,
        ),
        (
            "Orders",
            build_recall_handle("Orders", "broker-a", T0 + 10**12, ids[0]),
            RecallFailure.TIMESTAMP_INVALID,
        ),
        (
            "Orders",
            build_recall_handle("Orders", "broker-a", T0 + 501, "NOSUCHID"),
            RecallFailure.NOT_FOUND,
        ),
    ]
    for topic, handle, reason in cases:
        with pytest.raises(RecallError) as err:
            svc.recall(topic, handle)
        assert err.value.reason is reason, (handle, err.value)
    svc.recall("Orders", handles[0])
    with pytest.raises(RecallError, match="already recalled"):
        svc.recall("Orders", handles[0])
    _, handles2 = send(store, svc, [timed("Orders", b"b", **{L.P_TIMER_DELAY_MS: "10"})])
    clock.advance(10)
    svc.run_once()  # delivered at its time; the handle's time (+1 ms) is not reached yet
    with pytest.raises(RecallError, match="delivered") as err:
        svc.recall("Orders", handles2[0])
    assert err.value.reason is RecallFailure.NOT_FOUND
    clock.advance(1)
    with pytest.raises(RecallError, match="too late") as err:
        svc.recall("Orders", handles2[0])
    assert err.value.reason is RecallFailure.TIMESTAMP_INVALID
    store.shutdown()


def test_recall_survives_a_crash(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    _, handles = send(
        store, svc, [timed("Orders", b"%d" % i, **{L.P_TIMER_DELAY_MS: "1000"}) for i in range(2)]
    )
    svc.checkpoint()
    svc.recall("Orders", handles[0])
    svc.crash()
    store.crash()
    store, svc = open_service(store_dir, clock)
    clock.advance(1000)
    assert svc.run_once() == 1
    assert bodies(store, "Orders") == [b"1"]
    with pytest.raises(RecallError):
        svc.recall("Orders", handles[1])
    store.shutdown()


# --- restarts -------------------------------------------------------------------------------------
def test_restart_rebuilds_pending_messages(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(
        store,
        svc,
        [timed("Orders", b"%d" % d, **{L.P_TIMER_DELAY_MS: str(d)}) for d in (300, 100, 200)],
    )
    svc.crash()
    store.crash()
    store, svc = open_service(store_dir, clock)
    assert svc.pending_count == 3 and svc.next_due_ms() == T0 + 100
    clock.advance(200)
    assert svc.run_once() == 2
    svc.shutdown()
    store.shutdown()
    # kept as Apache keeps it: read from the first pending slot, every record below 3 enqueued,
    # one unit for the record still pending and one for the last record (delivered: a past slot)
    check = timerfiles.read_check(store_dir)
    assert (check.last_read_ms, check.queue_offset, check.master_offset) == (T0, 3, 3)
    assert check.flush_pos == 2 * timerfiles.UNIT_SIZE
    assert not os.path.exists(os.path.join(store_dir, L.CONFIG_DIR, TIMER_CHECK_FILE))
    rec = timerfiles.recover(store_dir, T0 + 200)
    assert rec.pending["write_ms"].tolist() == [T0] and rec.pending["delta"].tolist() == [300]
    store, svc = open_service(store_dir, clock)
    assert svc.pending_count == 1
    clock.advance(100)
    assert svc.run_once() == 1
    assert bodies(store, "Orders") == [b"100", b"200", b"300"]
    store.shutdown()


def test_crash_after_delivery_reconciles_from_the_commitlog(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(
        store,
        svc,
        [timed("Orders", b"%d" % i, **{L.P_TIMER_DELAY_MS: str(10 + i)}) for i in range(10)],
    )
    svc.checkpoint()
    clock.advance(15)
    assert svc.run_once() == 6
    svc.crash()
    store.crash()
    store, svc = open_service(store_dir, clock)
    assert svc.stats.reconciled == 6 and svc.pending_count == 4
    clock.advance(100)
    assert svc.run_once() == 4
    assert sorted(bodies(store, "Orders"), key=int) == [b"%d" % i for i in range(10)]
    store.shutdown()


class _Kill(BaseException):
    """Stands for kill -9 in the middle of a round."""


@pytest.mark.parametrize("seed", range(1, 9))
def test_random_crashes_deliver_every_message_exactly_once(tmp_path, seed):
    rng = random.Random(seed)
    root = str(tmp_path / "s")
    clock = FakeClock(T0)
    store, svc = open_service(root, clock, batch=5)
    expected: set[str] = set()
    handles: list[tuple[str, str]] = []
    crashes = recalled = 0
    for step in range(70):
        if step < 45:
            msgs = [
                timed(
                    "Orders",
                    b"%d-%d" % (step, k),
                    rng.randint(0, 3),
                    **{L.P_TIMER_DELAY_MS: str(rng.randint(1, 3000))},
                )
                for k in range(rng.randint(0, 6))
            ]
            if msgs:
                ids, hs = send(store, svc, msgs)
                expected.update(ids)
                handles += list(zip(ids, hs, strict=True))
        if handles and rng.random() < 0.3:
            uid, h = handles.pop(rng.randrange(len(handles)))
            try:
                svc.recall("Orders", h)
                expected.discard(uid)
                recalled += 1
            except RecallError as e:  # already delivered
                assert e.reason in (RecallFailure.TIMESTAMP_INVALID, RecallFailure.NOT_FOUND)
        clock.advance(rng.randint(0, 300))
        mode = rng.random()
        if mode < 0.3:  # die inside a round: before or after one of its writes
            budget, after = rng.randint(0, 3), rng.random() < 0.5
            real_put = svc._put

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
            store, svc = open_service(root, clock, batch=5)
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
    clock.advance(5000)
    svc.run_once()
    got = delivered_ids(store, "Orders")
    assert crashes > 0 and recalled > 0
    assert set(got) == expected and set(got.values()) == {1}
    assert svc.pending_count == 0
    store.shutdown()


# --- threads, real processes, composition ---------------------------------------------------------
def test_service_thread_delivers_on_the_real_clock(store_dir):
    cfg = BrokerConfig(store=StoreConfig(commitlog_segment_bytes=1 << 20))
    store = MessageStore(store_dir, cfg.store)
    svc = TimerService(store, cfg, store.clock)
    svc.start()
    try:
        ids, _ = send(
            store,
            svc,
            [timed("Orders", b"%d" % i, **{L.P_TIMER_DELAY_MS: str(20 * i)}) for i in range(1, 16)],
        )
        deadline = time.monotonic() + 10
        while (
            sum(delivered_ids(store, "Orders").values()) < len(ids) and time.monotonic() < deadline
        ):
            time.sleep(0.02)
    finally:
        svc.shutdown()
    got = store.get_messages("Orders", 0, 0, max_msgs=100).messages
    assert sorted(m.properties[L.P_UNIQ_KEY] for m in got) == sorted(ids)
    for m in got:  # never early
        assert m.store_timestamp_ms >= int(m.properties[L.P_TIMER_OUT_MS])
    store.shutdown()


@pytest.mark.slow
def test_sigkilled_broker_delivers_exactly_once(tmp_path):
    root = str(tmp_path / "s")
    conf = {
        "delay_levels": "1s",
        "segment_bytes": 4 << 20,
        "batch_max_msgs": 8,
        "checkpoint_interval_ms": 100,
    }
    cfg = broker_config(conf)
    store = MessageStore(root, cfg.store)
    svc = TimerService(store, cfg, store.clock)
    now = store.clock.now_ms()
    # due in 4 s: the sends and recalls before them take a second or more on a loaded machine
    # (at 1.5 s a recall found its message due already)
    msgs = [
        timed("Orders", b"%d" % i, i % 4, **{L.P_TIMER_DELIVER_MS: str(now + 4000 + i % 700)})
        for i in range(2000)
    ]
    ids, handles = send(store, svc, msgs)
    recalled = {ids[i] for i in range(0, 2000, 97)}
    for i in range(0, 2000, 97):
        svc.recall("Orders", handles[i])
    svc.crash()
    store.shutdown()
    rng = random.Random(11)
    targets = sorted(rng.sample(range(100, 1800), 3))
    seen = run_and_kill(root, conf, "Orders", targets)
    assert all(
        s >= t for s, t in zip(seen, targets, strict=True)
    )  # each kill landed while delivering
    store = MessageStore(root, cfg.store)
    svc = TimerService(store, cfg, store.clock)
    time.sleep(max(0.0, (now + 4800 - store.clock.now_ms()) / 1000))
    svc.run_once()
    got = delivered_ids(store, "Orders")
    assert set(got) == set(ids) - recalled and set(got.values()) == {1}
    print(
        f"kills at {seen} (targets {targets}); "
        f"reconciled at the last restart: {svc.stats.reconciled}"
    )
    store.shutdown()


def test_broker_core_send_recall_and_deliver(store_dir):
    from rmq_spark.services.core import BrokerCore

    clock = FakeClock(T0)
    cfg = BrokerConfig(store=StoreConfig(commitlog_segment_bytes=1 << 20), broker_name="broker-a")
    core = BrokerCore(store_dir, cfg, clock, start_services=False)
    try:
        msgs = [
            timed("Orders", b"timer", **{L.P_TIMER_DELAY_MS: "1500"}),
            timed("Orders", b"level", **{L.P_DELAY: "1"}),
            timed("Orders", b"gone", **{L.P_TIMER_DELAY_MS: "1500"}),
            timed("Orders", b"now"),
        ]
        transformed = [core.transform(m) for m in msgs]
        assert [m.topic for m in transformed] == [
            L.TIMER_TOPIC,
            L.SCHEDULE_TOPIC,
            L.TIMER_TOPIC,
            "Orders",
        ]
        core.store.put_messages(transformed)
        core.timer.recall("Orders", core.timer.recall_handle(transformed[2]))
        clock.advance(1500)
        core.schedule.run_once()
        core.timer.run_once()
        assert bodies(core.store, "Orders") == [b"now", b"level", b"timer"]
    finally:
        core.shutdown()


@pytest.mark.parametrize("crc", [False, True])
def test_patched_delivery_writes_what_the_general_path_writes(tmp_path, crc):
    """Re-writing records by patching their bytes yields the messages that decoding and
    encoding them yields (properties, routing, tags codes, headers), record CRC on or off."""
    views, patched = patched_and_general(
        tmp_path,
        crc,
        open_service,
        send,
        L.P_TIMER_DELAY_MS,
        lambda rng: str(rng.randint(1, 5000)),
        seed=12,
    )
    assert sum(map(len, views[0].values())) == 300
    assert views[0] == views[1]
    assert patched == [300, 0]


# --- recovery without a marker of its own (issue 29: the copy stores what Apache stores) ------------
def test_crash_between_identical_resends_delivers_each_once(store_dir):
    """Two identical timer messages (a client's resend: same unique id, born time, body and
    delivery time), the first delivered before a kill -9: the restart counts one copy for one
    record (told apart by TIMER_ENQUEUE_MS, the record's store time) and delivers the other."""
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock, batch=1)
    twin = {L.P_TIMER_DELIVER_MS: str(T0 + 100), L.P_UNIQ_KEY: "U-1"}
    send(store, svc, [Message("Orders", b"t", dict(twin), born_timestamp_ms=T0)])
    clock.advance(1)
    send(store, svc, [Message("Orders", b"t", dict(twin), born_timestamp_ms=T0)])
    svc.checkpoint()
    real_put, calls = svc._put, []

    def put_once_then_die(batch):
        calls.append(1)
        if len(calls) == 2:
            raise _Kill
        real_put(batch)

    svc._put = put_once_then_die
    clock.advance(100)
    with pytest.raises(_Kill):
        svc.run_once()
    svc.crash()
    store.crash()
    store, svc = open_service(store_dir, clock)
    assert svc.stats.reconciled == 1 and svc.pending_count == 1
    assert svc.run_once() == 1
    got = store.get_messages("Orders", 0, 0).messages
    assert [m.body for m in got] == [b"t", b"t"]
    enqueued = sorted(m.properties[L.P_TIMER_ENQUEUE_MS] for m in got)
    assert enqueued[0] != enqueued[1]
    store.shutdown()


def test_a_client_message_that_looks_like_a_copy_claims_no_delivery(store_dir):
    """A plain message carrying a pending timer message's unique id and timer properties (as a
    consumer forwarding a delivered copy would) is not taken for its delivery after a crash: its
    born time and TIMER_ENQUEUE_MS are its own."""
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    ids, _ = send(store, svc, [timed("Orders", b"p", **{L.P_TIMER_DELAY_MS: "100"})])
    svc.checkpoint()
    (record,) = store.get_messages(L.TIMER_TOPIC, 0, 0).messages
    lookalike = {
        L.P_UNIQ_KEY: ids[0], L.P_TIMER_OUT_MS: str(T0 + 100), L.P_REAL_TOPIC: "Orders", L.P_REAL_QID: "0",
        L.P_TIMER_ENQUEUE_MS: str(record.store_timestamp_ms + 1), L.P_TIMER_DEQUEUE_MS: str(T0 + 100),
    }  # fmt: skip
    store.put_messages(
        [svc.transform(Message("Orders", b"p", lookalike, born_timestamp_ms=T0 + 7))]
    )
    svc.crash()
    store.crash()
    store, svc = open_service(store_dir, clock)
    assert svc.stats.reconciled == 0 and svc.pending_count == 1
    clock.advance(100)
    assert svc.run_once() == 1
    assert bodies(store, "Orders") == [b"p", b"p"]  # the look-alike and the real delivery
    store.shutdown()
