"""Delayed delivery benchmark: timer messages and delay levels due over a window, delivered by
the services' own threads on the real clock.

    python bench/delay_bench.py [--count 100000] [--spread-s 10] [--quick]

Phases (each on a fresh store in a scratch directory):
  timer-spread  ``count`` timer messages (100-byte bodies) due uniformly over ``spread-s`` seconds
  timer-burst   ``count`` timer messages all due at the same instant (drain rate)
  delay-levels  ``count`` messages with levels ``1s 2s ... 10s`` sent in one burst (due over 10 s)
For each: delivery lateness (store time of the delivered message - its TIMER_OUT_MS) p50/p99/max,
and deliveries/s = delivered ÷ CPU time of the service's delivering rounds (its capacity on one
core, robust to other load on the machine; the burst phase also gives the wall-clock drain rate).  Peer, same run: plain ``put_messages`` of the
same messages with no delay (what the store takes as ordinary sends), and the ratio.
Goal (issue): p99 lateness ≤ 50 ms while delivering ≥ 50,000 msgs/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench._util import Timer, scratch_dir
from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.schedule.service import ScheduleService, store_rules
from rmq_spark.services.timer.service import TimerService
from rmq_spark.store.message import Message
from rmq_spark.store.store import MessageStore, StoreConfig

TOPIC = "DelayBench"
QUEUES = 4
SEGMENT = 256 * 1024 * 1024
BATCH = 1000


def make_messages(count: int, extra: list[dict[str, str]]) -> list[Message]:
    body = os.urandom(100)
    return [
        Message(TOPIC, body, {"TAGS": "bench", "KEYS": f"k{i}", **extra[i]}, queue_id=i % QUEUES)
        for i in range(count)
    ]


def lateness_ms(store: MessageStore) -> tuple[np.ndarray, np.ndarray, int]:
    """(store time - TIMER_OUT_MS, store times, distinct message ids) of the delivered."""
    late, stored, ids = [], [], set()
    for q in range(QUEUES):
        b = store.read_arrow(
            TOPIC,
            q,
            0,
            store.max_offset(TOPIC, q),
            columns=["msgId", "storeTimestamp", "deliverTimestamp"],
        )
        st = pc.cast(b.column("storeTimestamp"), pa.int64()).to_numpy(zero_copy_only=False)
        dv = pc.cast(b.column("deliverTimestamp"), pa.int64()).to_numpy(zero_copy_only=False)
        late.append((st - dv) // 1000)
        stored.append(st // 1000)
        ids.update(b.column("msgId").to_pylist())
    return np.concatenate(late), np.concatenate(stored), len(ids)


def delivered_count(store: MessageStore) -> int:
    return sum(store.max_offset(TOPIC, q) for q in range(QUEUES))


def run_phase(
    name: str, count: int, cfg: BrokerConfig, props_for, use_timer: bool, timeout_s: float
) -> dict:
    with scratch_dir("delay-") as d:
        store = MessageStore(d, cfg.store, tags_code_rules=store_rules(cfg))
        svc = (TimerService if use_timer else ScheduleService)(store, cfg, store.clock)
        svc.start()
        plain = make_messages(count, [{}] * count)
        t0 = store.clock.now_ms()
        for m, extra in zip(plain, props_for(count, t0), strict=True):
            m.properties.update(extra)
        msgs = [svc.transform(m) for m in plain]
        for i in range(0, count, BATCH):
            store.put_messages(msgs[i : i + BATCH])
        stored_ms = store.clock.now_ms()
        deadline = time.monotonic() + timeout_s
        while delivered_count(store) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        svc.shutdown()
        late, stored, distinct = lateness_ms(store)
        due = stored - late
        if use_timer:
            first_due = min(int(m.properties.get("TIMER_OUT_MS", 0) or 0) for m in msgs)
            if stored_ms > first_due:
                print(f"note: {name}: storing ended {stored_ms - first_due} ms after the first due")
        nan = float("nan")
        res = {
            "name": name,
            "delivered": len(late),
            "distinct": distinct,
            "window_s": (int(due.max()) - int(due.min())) / 1000 if len(due) else nan,
            "p50": float(np.percentile(late, 50)) if len(late) else nan,
            "p99": float(np.percentile(late, 99)) if len(late) else nan,
            "max": float(late.max()) if len(late) else nan,
            "busy_s": svc.stats.busy_s,
            "patched": svc.stats.patched,
            "drain_s": (int(stored.max()) - int(due.min())) / 1000 if len(due) else nan,
        }
        store.shutdown()
        return res


def peer_plain_puts(count: int, cfg: BrokerConfig) -> float:
    with scratch_dir("plain-") as d, MessageStore(d, cfg.store) as store:
        msgs = make_messages(count, [{}] * count)
        with Timer() as t:
            for i in range(0, count, BATCH):
                store.put_messages(msgs[i : i + BATCH])
        return count / t.seconds


def timer_store_rate(count: int, cfg: BrokerConfig) -> float:
    """Timer messages transformed and stored per second (no delivery running): how long a phase
    needs to store its messages, so that all are stored before the first is due -- else the
    lateness measures the producer still storing, not the delivery."""
    with scratch_dir("calib-") as d, MessageStore(d, cfg.store) as store:
        svc = TimerService(store, cfg, store.clock)
        due = str(store.clock.now_ms() + 3_600_000)
        msgs = make_messages(count, [{"TIMER_DELIVER_MS": due}] * count)
        with Timer() as t:
            msgs = [svc.transform(m) for m in msgs]
            for i in range(0, count, BATCH):
                store.put_messages(msgs[i : i + BATCH])
        return count / t.seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--spread-s", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true", help="10,000 messages over 3 s")
    args = ap.parse_args()
    count, spread_ms = args.count, int(args.spread_s * 1000)
    if args.quick:
        count, spread_ms = 10_000, 3000
    cfg = BrokerConfig(store=StoreConfig(commitlog_segment_bytes=SEGMENT))
    peer_plain_puts(min(count, 5000), cfg)  # warm-up
    peer = peer_plain_puts(count, cfg)
    # time to transform and store them all before the first is due (3x the measured need: the
    # machine's load varies)
    sample = min(count, 20_000)
    lead_ms = int(1000 + 3000 * count / timer_store_rate(sample, cfg))
    rng = np.random.default_rng(7)

    def spread(n: int, t0: int) -> list[dict[str, str]]:
        due = t0 + lead_ms + rng.integers(0, spread_ms, n)
        return [{"TIMER_DELIVER_MS": str(int(x))} for x in due]

    def fast(n: int, t0: int) -> list[dict[str, str]]:  # the goal's rate: 50,000 due per second
        due = t0 + lead_ms + rng.integers(0, max(1, n * 1000 // 50_000), n)
        return [{"TIMER_DELIVER_MS": str(int(x))} for x in due]

    def burst(n: int, t0: int) -> list[dict[str, str]]:
        return [{"TIMER_DELIVER_MS": str(t0 + lead_ms)}] * n

    levels_cfg = BrokerConfig(
        store=StoreConfig(commitlog_segment_bytes=SEGMENT),
        delay_levels=" ".join(f"{k}s" for k in range(1, 11)),
    )

    def levels(n: int, t0: int) -> list[dict[str, str]]:
        return [{"DELAY": str(int(x))} for x in rng.integers(1, 11, n)]

    timeout_s = (lead_ms + spread_ms) / 1000 + 60
    results = [
        run_phase("timer-spread", count, cfg, spread, True, timeout_s),
        run_phase("timer-50k/s", count, cfg, fast, True, timeout_s),
        run_phase("timer-burst", count, cfg, burst, True, timeout_s),
        run_phase("delay-levels", count, levels_cfg, levels, False, timeout_s + 10),
    ]
    print(
        f"delayed delivery: {count:,} messages of 100 B per phase, {QUEUES} queues, "
        f"services on their own threads, real clock (load average {os.getloadavg()[0]:.1f})"
    )
    head = ("phase", "due over", "p50 ms", "p99 ms", "max ms", "cpu s", "msgs/cpu s", "vs put")
    print("{:14} {:>9} {:>7} {:>7} {:>7} {:>7} {:>12} {:>7}".format(*head))
    for r in results:
        rate = r["delivered"] / r["busy_s"] if r["busy_s"] else float("nan")
        print(
            f"{r['name']:14} {r['window_s']:>8.1f}s {r['p50']:>7.1f} {r['p99']:>7.1f} "
            f"{r['max']:>7.1f} {r['busy_s']:>7.2f} {rate:>12,.0f} {rate / peer:>6.2f}x"
        )
    burst_r = results[2]
    print(
        f"timer-burst: {burst_r['delivered']:,} due at one instant drained in "
        f"{burst_r['drain_s']:.2f} s = {burst_r['delivered'] / burst_r['drain_s']:,.0f} msgs/s"
    )
    print(f"peer, same run: plain put_messages of the same messages: {peer:,.0f} msgs/s")
    ok = all(r["delivered"] == r["distinct"] == count for r in results)
    print(
        "every phase: each message delivered exactly once"
        if ok
        else "MISMATCH: "
        + ", ".join(f"{r['name']}={r['delivered']}/{r['distinct']} of {count}" for r in results)
    )


if __name__ == "__main__":
    main()
