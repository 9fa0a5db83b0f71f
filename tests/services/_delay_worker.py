"""A broker stand-in for crash tests: opens a store with the schedule and timer services on the
real clock and delivers until it is killed (SIGKILL) or its deadline passes.

    python tests/services/_delay_worker.py ROOT CONFIG_JSON

CONFIG_JSON: {"delay_levels": "1s 2s", "segment_bytes": N, "batch_max_msgs": N, "deadline_s": S}.
Prints "ready" once the services run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.schedule.service import ScheduleService, store_rules
from rmq_spark.services.timer.service import TimerService
from rmq_spark.store.store import MessageStore, StoreConfig

# --- helpers for the tests: varied messages, and what a delivery wrote ----------------------------
_ODD_KEYS = ("REAL_TOPICX", "DELAYX", "TIMER_DELIVER_MS2", "UNIQ_KEYS", "A" * 16, "__CRC32", "k")


def varied_messages(rng, n: int, topics: list[str]) -> list:  # type: ignore[no-untyped-def]
    """``n`` messages with properties in varied order and keys that resemble the ones a delivery
    drops (the byte-patching path must tell them apart), bodies holding the separators."""
    from rmq_spark.store import layout as L
    from rmq_spark.store.message import Message

    out = []
    for i in range(n):
        props: dict[str, str] = {}
        keys = [*_ODD_KEYS, L.P_TAGS, L.P_KEYS, "x"]
        rng.shuffle(keys)
        for k in keys[: rng.randint(0, len(keys))]:
            props[k] = rng.choice(["v", "é€ß", "a b\x03c", str(rng.randint(-5, 10**12))])
        props[L.P_UNIQ_KEY] = f"U{i:08d}"  # the same in both stores
        body = bytes(rng.choice(b"\x00\x01\x02ab") for _ in range(rng.randint(0, 40)))
        out.append(Message(rng.choice(topics), body, props, queue_id=rng.randint(0, 9), flag=i))
    return out


def delivered_view(store, topics: list[str]) -> dict:  # type: ignore[no-untyped-def]
    """Every delivered message of ``topics``: queue -> [(fields, tags code), ...] in order."""
    view = {}
    for topic in topics:
        for q in range(16):
            msgs = store.get_messages(topic, q, 0, max_msgs=100_000).messages
            cq = store.consume_queue(topic, q)
            if not msgs or cq is None:
                continue
            codes = cq.units(0, len(msgs))["tags_code"].tolist()
            view[(topic, q)] = [
                (
                    m.body,
                    m.properties,
                    m.flag,
                    m.sys_flag,
                    m.born_timestamp_ms,
                    m.born_host,
                    m.reconsume_times,
                    m.store_host,
                    m.store_size,
                    code,
                )
                for m, code in zip(msgs, codes, strict=True)
            ]
    return view


def patched_and_general(tmp_path, crc: bool, open_service, send, prop: str, value, seed: int):  # type: ignore[no-untyped-def]
    """300 varied messages with ``prop`` = ``value(rng)`` delivered once by patching their bytes
    and once by decoding and encoding them, each in a fresh store: (views, patched counts)."""
    import random

    from rmq_spark.store.clock import FakeClock

    views, patched = [], []
    for fast in (True, False):
        clock = FakeClock(1_700_000_000_000)
        store, svc = open_service(str(tmp_path / str(fast)), clock, batch=64, append_prop_crc=crc)
        svc.patch_min_msgs = 1 if fast else 10**9  # every round patched, or none
        rng = random.Random(seed)
        msgs = varied_messages(rng, 300, ["Orders", "Pay"])
        for m in msgs:
            m.properties[prop] = value(rng)
        send(store, svc, msgs)
        clock.advance(10_000)
        assert svc.run_once() == 300
        views.append(delivered_view(store, ["Orders", "Pay"]))
        patched.append(svc.stats.patched)
        store.shutdown()
    return views, patched


def broker_config(conf: dict) -> BrokerConfig:
    return BrokerConfig(
        store=StoreConfig(
            commitlog_segment_bytes=conf["segment_bytes"],
            cq_segment_units=conf.get("cq_segment_units", 10_000),
        ),
        delay_levels=conf["delay_levels"],
    )


def delivered_ids(store: MessageStore, topic: str) -> Counter[str]:
    """How many times each message id (UNIQ_KEY) is in ``topic``, over all its queues."""
    cfg = store.topics.get(topic)
    out: Counter[str] = Counter()
    for q in range(cfg.read_queue_nums if cfg else 0):
        batch = store.read_arrow(topic, q, 0, store.max_offset(topic, q), columns=["msgId"])
        out.update(batch.column(0).to_pylist())
    return out


def run_and_kill(
    root: str, conf: dict, topic: str, targets: list[int], timeout_s: float = 20.0
) -> list[int]:
    """Start the worker on ``root`` once per target and SIGKILL it as soon as ``topic`` holds at
    least that many messages (seen from this process through a StoreReader), or after
    ``timeout_s``.  Returns the count seen at each kill."""
    from rmq_spark.store.reader import StoreReader

    seen = []
    for target in targets:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), root, json.dumps(conf)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            line = proc.stdout.readline() if proc.stdout else b""
            if line.strip() != b"ready":
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"worker did not start: {line!r} {err[-2000:]}")
            reader = StoreReader(root, cq_segment_units=conf.get("cq_segment_units", 10_000))
            deadline = time.monotonic() + timeout_s
            count = 0
            try:
                while time.monotonic() < deadline and proc.poll() is None:
                    count = sum(reader.max_offset(topic, q) for q in reader.queue_ids(topic))
                    if count >= target:
                        break
                    time.sleep(0.002)
            finally:
                reader.close()
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            seen.append(count)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            for f in (proc.stdout, proc.stderr):
                if f is not None:
                    f.close()
    return seen


def main() -> None:
    root, conf = sys.argv[1], json.loads(sys.argv[2])
    cfg = broker_config(conf)
    store = MessageStore(root, cfg.store, tags_code_rules=store_rules(cfg))
    services = [
        cls(
            store,
            cfg,
            store.clock,
            batch_max_msgs=conf["batch_max_msgs"],
            checkpoint_interval_ms=conf.get("checkpoint_interval_ms", 200),
        )
        for cls in (ScheduleService, TimerService)
    ]
    for svc in services:
        svc.start()
    print("ready", flush=True)
    deadline = time.monotonic() + conf.get("deadline_s", 30)
    while time.monotonic() < deadline:
        time.sleep(0.05)
    for svc in services:
        svc.shutdown()
    store.shutdown()


if __name__ == "__main__":
    main()
