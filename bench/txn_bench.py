"""Transaction benchmark: prepare + commit against plain sends of the same messages, same run.

    .venv/bin/python bench/txn_bench.py [--quick]

For each batch size B, the same messages (256 B bodies, tags, keys, one user property) are
stored twice, each time in a fresh store on the same disk:

- plain: ``store.put_messages(batch)`` per batch (the peer);
- transactional: ``TransactionService.prepare(batch)`` then ``commit_group(halves)`` (one append
  of the op message and all real messages); with B = 1, ``end_transaction`` instead.

Printed: messages/s and per-batch latency p50/p99 (prepare + commit for the transactional run),
and the ratio transactional / plain.  Async flush (page cache, flushed at the end) and sync flush
(group commit, several producer threads).  Each figure is the best of interleaved repeats; the
producers' CPU time per message gives a second ratio that other load on the machine disturbs less.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._util import scratch_dir
from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.transaction.service import TransactionAction, TransactionService
from rmq_spark.store.message import Message
from rmq_spark.store.store import MessageStore, StoreConfig

SEGMENT = 256 * 1024 * 1024
BODIES = [os.urandom(256) for _ in range(64)]


def batches_of(count: int, batch: int) -> list[list[Message]]:
    """Fresh messages (a put adds UNIQ_KEY to their properties), built outside the timing."""
    out = []
    for i in range(0, count, batch):
        out.append(
            [
                Message(
                    "Bench",
                    BODIES[k % 64],
                    {"TAGS": f"t{k % 8}", "KEYS": f"k{k}", "order": str(k)},
                    queue_id=k % 4,
                )
                for k in range(i, min(count, i + batch))
            ]
        )
    return out


def plain(store: MessageStore, svc: TransactionService, msgs: list[Message]) -> None:
    assert store.put_messages(msgs).ok


def transactional(store: MessageStore, svc: TransactionService, msgs: list[Message]) -> None:
    r = svc.prepare(msgs, "BenchGroup")
    if len(msgs) == 1:
        st = svc.end_transaction(
            int(r.append.phys_offsets[0]),
            int(r.append.queue_offsets[0]),
            "BenchGroup",
            r.uniq_keys[0],
            TransactionAction.COMMIT,
        )
        assert st.value == "SUCCESS"
    else:
        assert svc.commit_group(r.append.phys_offsets.tolist()).ok


def run(
    kind, batches: list[list[Message]], flush: str, threads: int
) -> tuple[float, list[float], float]:  # type: ignore[no-untyped-def]
    """(messages/s, per-batch latencies in s, producer CPU s per message) for one fresh store."""
    with scratch_dir("txn") as d:
        store = MessageStore(d, StoreConfig(commitlog_segment_bytes=SEGMENT, flush=flush))
        svc = TransactionService(store, BrokerConfig())
        lat: list[float] = []
        cpu = [0.0]
        lock = threading.Lock()

        def worker(mine: list[list[Message]]) -> None:
            local = []
            c0 = time.thread_time()
            for msgs in mine:
                t0 = time.perf_counter()
                kind(store, svc, msgs)
                local.append(time.perf_counter() - t0)
            with lock:
                lat.extend(local)
                cpu[0] += time.thread_time() - c0

        parts = [batches[k::threads] for k in range(threads)]
        ts = [threading.Thread(target=worker, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        store.flush_all()
        secs = time.perf_counter() - t0
        n = sum(len(b) for b in batches)
        if kind is transactional:
            assert sum(store.max_offset("Bench", q) for q in range(4)) == n
        svc.shutdown()
        store.shutdown()
    return n / secs, lat, cpu[0] / n


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))] * 1000


def section(
    title: str, cases: list[tuple[int, int]], flush: str, threads: int, repeats: int
) -> None:
    print(f"\n== {title} ==")
    print(
        f"{'batch':>6} {'plain msg/s':>12} {'p50 ms':>7} {'p99 ms':>7} {'txn msg/s':>11} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'txn/plain':>9} {'cpu us/msg plain':>17} {'txn':>6} {'ratio':>6}"
    )
    for batch, count in cases:
        best: dict[str, tuple[float, list[float], float]] = {}
        for _ in range(repeats):  # interleaved; the best of each (the machine is shared)
            for name, kind in (("plain", plain), ("txn", transactional)):
                rate, lat, cpu = run(kind, batches_of(count, batch), flush, threads)
                old = best.get(name)
                best[name] = (
                    (max(rate, old[0]), lat if rate > old[0] else old[1], min(cpu, old[2]))
                    if old
                    else (rate, lat, cpu)
                )
        (pr, pl, pc), (tr, tl, tc) = best["plain"], best["txn"]
        print(
            f"{batch:>6} {pr:12,.0f} {pct(pl, 0.5):7.2f} {pct(pl, 0.99):7.2f} {tr:11,.0f} {pct(tl, 0.5):7.2f} "
            f"{pct(tl, 0.99):7.2f} {tr / pr:9.0%} {pc * 1e6:17.1f} {tc * 1e6:6.1f} {pc / tc:6.0%}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smaller counts (a smoke run)")
    args = ap.parse_args()
    scale, repeats = (1, 2) if args.quick else (8, 5)  # full: runs of a second or more each
    print(
        "txn/plain: wall-clock throughput ratio; ratio: the same from the producers' CPU time per message"
    )
    section(
        "Async flush, one producer (prepare+commit vs plain put of the same messages)",
        [(1, 1500 * scale), (32, 8000 * scale), (256, 16000 * scale)],
        "async",
        1,
        repeats,
    )
    section(
        "Sync flush (group commit), 4 producer threads",
        [(1, 400 * scale), (32, 4000 * scale)],
        "sync",
        4,
        repeats,
    )


if __name__ == "__main__":
    main()
