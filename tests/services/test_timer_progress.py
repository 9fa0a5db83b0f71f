"""The timer's progress kept as Apache RocketMQ keeps it (:mod:`rmq_spark.services.timer.progress`):
what each checkpoint writes (Apache's resume rule applied to it gives exactly the pending set),
a restart after each state change, a store whose progress Apache wrote, an older rmq-broker's
``timercheck.json``, and a crash at each step of a checkpoint's write."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.timer import progress
from rmq_spark.services.timer.service import TIMER_CHECK_FILE, TimerService
from rmq_spark.store import layout as L
from rmq_spark.store import timerfiles as tf
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.message import Message
from rmq_spark.store.store import MessageStore, StoreConfig

T0 = 1_700_000_000_000
DAY = 86_400_000


def open_service(root: str, clock: FakeClock) -> tuple[MessageStore, TimerService]:
    cfg = BrokerConfig(
        store=StoreConfig(commitlog_segment_bytes=1 << 20, cq_segment_units=1000),
        timer_max_delay_s=3 * 86400,
        broker_name="broker-a",
    )
    store = MessageStore(root, cfg.store, clock=clock, start_services=False)
    return store, TimerService(store, cfg, clock)


def send(store: MessageStore, svc: TimerService, delays_ms: list[int]) -> list[str | None]:
    out = [
        svc.transform(Message("Orders", b"%d" % d, {L.P_TIMER_DELAY_MS: str(d)})) for d in delays_ms
    ]
    assert store.put_messages(out).ok
    return [svc.recall_handle(m) for m in out]


def bodies(store: MessageStore) -> list[bytes]:
    return [m.body for m in store.get_messages("Orders", 0, 0, max_msgs=1000).messages]


def reopen(root: str, clock: FakeClock, store: MessageStore, svc: TimerService, *, crash: bool):
    if crash:
        svc.checkpoint()  # what the checkpoint thread writes within a second
        svc.crash()
        store.crash()
    else:
        svc.shutdown()
        store.shutdown()
    return open_service(root, clock)


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "crash"])
def test_restart_after_each_state_change_delivers_each_message_once(store_dir, crash):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    handles = send(store, svc, [1500, 2500, 4000, 2 * DAY + 12 * 3600_000])
    store, svc = reopen(store_dir, clock, store, svc, crash=crash)  # all four pending
    assert svc.pending_count == 4 and bodies(store) == []
    clock.advance(1600)
    assert svc.run_once() == 1
    store, svc = reopen(store_dir, clock, store, svc, crash=crash)  # one delivered
    assert svc.pending_count == 3
    assert svc.run_once() == 0 and bodies(store) == [b"1500"]
    svc.recall("Orders", handles[2])  # the 4000 one
    store, svc = reopen(store_dir, clock, store, svc, crash=crash)  # one recalled
    clock.advance(2500)  # T0 + 4100
    assert svc.run_once() == 1
    store, svc = reopen(store_dir, clock, store, svc, crash=crash)
    assert bodies(store) == [b"1500", b"2500"] and svc.pending_count == 1
    clock.advance(3 * DAY)
    assert svc.run_once() == 1
    store, svc = reopen(store_dir, clock, store, svc, crash=crash)  # all done
    assert svc.pending_count == 0 and svc.run_once() == 0
    assert bodies(store) == [b"1500", b"2500", b"%d" % (2 * DAY + 12 * 3600_000)]
    store.shutdown()


def test_checkpoint_is_what_apache_resumes_from(store_dir):
    clock = FakeClock(T0 + 400)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [200, 900, 1300, 2 * DAY + 12 * 3600_000])
    clock.advance(300)  # T0 + 700: the first delivered, the 900 one pending in the same slot
    assert svc.run_once() == 1
    svc.checkpoint()
    check = tf.read_check(store_dir)
    # due T0+600 (delivered), T0+1300, T0+1700, T0+400+2.5 days; read from slot T0 (now), every
    # record below 4 enqueued
    assert (check.last_read_ms, check.queue_offset, check.master_offset) == (T0, 4, 4)
    assert check.rmq_commitlog_offset == store.commitlog.max_offset
    rec = tf.recover(store_dir, T0 + 700)
    assert rec.read_ms == T0 and rec.end == check.flush_pos
    # the three pending in queue-offset order, the last naming the record at offset 3; the one
    # 2.5 days ahead rolled as Apache rolls it (to one day ahead: half the 2-day window)
    delayed = (rec.pending["write_ms"] + rec.pending["delta"]).tolist()
    assert delayed == [T0 + 1300, T0 + 1700, T0 + DAY]
    assert rec.pending["magic"].tolist() == [1, 1, 1 | tf.MAGIC_ROLL]
    assert int(rec.last_unit["phys"]) == int(rec.pending["phys"][-1])
    wheel = tf.read_wheel(store_dir)
    used = wheel[wheel["q"] != 0]
    assert sorted(used["q"].tolist()) == [T0 // 1000 + 1, (T0 + DAY) // 1000]
    assert sorted(used["num"].tolist()) == [1, 2]
    store.shutdown()


def test_last_record_delivered_gets_a_unit_in_a_past_slot(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [5000, 1000])  # offset 1 (1000) is delivered first
    clock.advance(1000)
    assert svc.run_once() == 1
    svc.checkpoint()
    files, end = tf.read_timerlog(store_dir)
    u = np.concatenate([x for _, x in files])
    assert len(u) == 2 and end == tf.read_check(store_dir).flush_pos
    sentinel = u[-1]
    at = int(sentinel["write_ms"]) + int(sentinel["delta"])
    assert at == T0 + 1000 - progress.SENTINEL_BEFORE_MS
    rec = tf.recover(store_dir, T0 + 1000)
    assert len(rec.pending) == 1 and int(rec.last_unit["phys"]) == int(sentinel["phys"])
    store.shutdown()


def test_each_checkpoint_is_a_new_generation_and_the_old_files_go(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [1000, 2000])
    svc.checkpoint()
    first = os.listdir(tf.timerlog_dir(store_dir))
    clock.advance(1000)
    assert svc.run_once() == 1
    svc.checkpoint()
    second = os.listdir(tf.timerlog_dir(store_dir))
    assert len(first) == len(second) == 1
    assert int(second[0]) == int(first[0]) + tf.TIMERLOG_FILE_SIZE
    for _ in range(3):  # rounds with nothing due: the checkpoint ticks find nothing changed
        clock.advance(300)
        assert svc.run_once() == 0
    assert os.listdir(tf.timerlog_dir(store_dir)) == second
    store.shutdown()


def _write_apache_files(
    root: str,
    store: MessageStore,
    *,
    last_read: int,
    unit_offsets: list[int],
    next_offset: int,
    delivered: int = 0,
) -> None:
    """The files Apache RocketMQ leaves: one unit per CQ offset of ``unit_offsets`` (chained per
    slot), read time ``last_read``, every record below ``next_offset`` enqueued."""
    cq = store.consume_queue(L.TIMER_TOPIC, 0)
    cu = cq.units(0, cq.max_offset)
    rows = []
    last_in_slot: dict[int, int] = {}
    for i, off in enumerate(unit_offsets):
        msg = store.get_messages(L.TIMER_TOPIC, 0, off, max_msgs=1).messages[0]
        t = int(msg.properties[L.P_TIMER_OUT_MS])
        rows.append(
            (
                tf.UNIT_SIZE,
                last_in_slot.get(t // 1000, -1),
                1,
                T0,
                t - T0,
                int(cu["offset"][off]),
                int(cu["size"][off]),
                0,
                0,
            )
        )
        last_in_slot[t // 1000] = i * 52
    u = np.array(rows, dtype=tf.UNIT)
    end = tf.write_timerlog(root, 0, u)
    tf.write_check(root, tf.TimerCheck(last_read, end, next_offset, next_offset, 0, T0, 5))
    with open(os.path.join(root, "config", "timermetrics"), "w") as f:
        json.dump({"timingCount": {}}, f)


def test_store_whose_timer_progress_apache_wrote_resumes_from_it(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [500, 1500, 3500, 2500, 4500])  # offsets 0..4
    svc.crash()
    store.crash()
    assert tf.recover(store_dir, T0) is None  # crashed before any checkpoint: no progress file
    cfg = StoreConfig(commitlog_segment_bytes=1 << 20, cq_segment_units=1000)
    store = MessageStore(store_dir, cfg, clock=clock, start_services=False)
    # Apache delivered 500 and 1500 (slots before T0 + 2000), enqueued 0..3; 4 not yet enqueued
    _write_apache_files(
        store_dir, store, last_read=T0 + 2000, unit_offsets=[0, 1, 2, 3], next_offset=4
    )
    store.shutdown()
    clock.advance(2000)
    store, svc = open_service(store_dir, clock)
    assert svc.pending_count == 3  # 3500, 2500 from the timerlog; 4500 from the queue
    clock.advance(3000)
    assert svc.run_once() == 3
    assert sorted(bodies(store)) == [b"2500", b"3500", b"4500"]
    store.shutdown()


def test_older_rmq_brokers_timercheck_json_is_read_once_then_replaced(store_dir):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [100, 200, 300])
    clock.advance(200)
    assert svc.run_once() == 2
    svc.crash()
    store.crash()
    assert tf.recover(store_dir, T0) is None
    legacy = os.path.join(store_dir, "config", TIMER_CHECK_FILE)
    with open(legacy, "w") as f:  # what the older broker wrote: W=0, M=3, T=T0+200
        json.dump(
            {
                "queueOffset": 0,
                "doneQueueOffset": 3,
                "doneTimeMs": T0 + 200,
                "commitLogOffset": 0,
                "version": 1,
            },
            f,
        )
    store, svc = open_service(store_dir, clock)
    assert svc.pending_count == 1
    svc.checkpoint()
    assert not os.path.exists(legacy) and tf.read_check(store_dir) is not None
    store.shutdown()


@pytest.mark.parametrize("step", ["unlink", "write_wheel", "write_check"])
def test_crash_at_each_step_of_a_checkpoint_loses_nothing_and_repeats_nothing(
    store_dir, monkeypatch, step
):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [1000, 2000, 3000])
    svc.checkpoint()
    clock.advance(1000)
    assert svc.run_once() == 1  # 1000 delivered after the checkpoint

    class Died(BaseException):
        pass

    def die(*args, **kw):
        raise Died

    target = progress.os if step == "unlink" else progress.tf
    monkeypatch.setattr(target, step, die)
    with pytest.raises(Died):
        svc.checkpoint()
    monkeypatch.undo()
    svc.crash()
    store.crash()
    store, svc = open_service(store_dir, clock)
    assert svc.pending_count == 2
    clock.advance(5000)
    assert svc.run_once() == 2
    assert bodies(store) == [b"1000", b"2000", b"3000"]
    store.shutdown()


def test_a_failed_write_is_retried_without_stale_slots(store_dir, monkeypatch):
    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [1000, 2000, 3000])
    svc.checkpoint()
    clock.advance(1000)
    assert svc.run_once() == 1

    def full(*args, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(progress.tf, "write_check", full)
    with pytest.raises(OSError):
        svc.checkpoint()  # units and wheel of a generation written, its checkpoint not
    monkeypatch.undo()
    clock.advance(1000)
    assert svc.run_once() == 1
    svc.checkpoint()
    files = sorted(int(n) for n in os.listdir(tf.timerlog_dir(store_dir)))
    assert len(files) == 1
    wheel = tf.read_wheel(store_dir)
    used = wheel[wheel["q"] != 0]
    assert len(used) == 1 and (used["last"] >= files[0]).all()  # only the live generation's slot
    svc.crash()
    store.crash()
    store, svc = open_service(store_dir, clock)
    assert svc.pending_count == 1
    store.shutdown()


def test_a_store_with_timer_progress_files_is_still_rmq_brokers(store_dir):
    """The progress files are no marker of an Apache store (rmq-broker writes them); Apache's
    ``config/timermetrics`` is."""
    from rmq_spark.store.apache import is_apache_store

    clock = FakeClock(T0)
    store, svc = open_service(store_dir, clock)
    send(store, svc, [1000])
    svc.checkpoint()
    store.shutdown()
    assert os.path.exists(tf.check_path(store_dir)) and os.path.exists(tf.wheel_path(store_dir))
    assert not is_apache_store(store_dir)
    with open(os.path.join(store_dir, "config", "timermetrics"), "w") as f:
        f.write("{}")
    assert is_apache_store(store_dir)
