"""The broker's bulk Arrow stream (``ReadArrow``, what ``readPath=arrow``/``auto`` reads remotely)
with each Arrow IPC compression, on loopback, in the same run.

    python bench/arrow_stream_bench.py [--messages N] [--runs R] [--bodies bench|random]

N messages (default 2 000 000) of 100 B in 4 queues are served by a broker process; two reader
threads (as Spark's ``local[2]``) read every queue's rows through ``ReadArrow`` with compression
``none``, ``lz4`` and ``zstd``, interleaved, best of R runs after a warm-up.  ``--bodies bench``
stores the Spark bench's bodies (64 distinct random ones, so a batch compresses well);
``--bodies random`` a random body per message (the bodies do not compress; the other 13 columns
still do).  Printed per compression: rows/s on loopback, bytes on the wire per row, the ratio to
``none``, and what the wire alone allows on a 1 Gbit/s and a 10 Gbit/s link (rows/s = bandwidth /
bytes per row): a read goes at the lower of the loopback rate (CPU) and the link's.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._util import Timer, scratch_dir

BODY_BYTES = 100
QUEUES = 4
COMPRESSIONS = ("none", "lz4", "zstd")
LINKS = (("1 Gbit/s", 125e6), ("10 Gbit/s", 1.25e9))


def fill(root: str, n: int, random_bodies: bool) -> None:
    from rmq_spark.services.config import BrokerConfig
    from rmq_spark.services.core import BrokerCore
    from rmq_spark.store.store import StoreConfig

    distinct = [os.urandom(BODY_BYTES) for _ in range(64)]
    chunk = 100_000
    with BrokerCore(root, BrokerConfig(store=StoreConfig(commitlog_segment_bytes=1 << 30))) as core:
        done = 0
        while done < n:
            k = min(chunk, n - done)
            bodies = (
                [os.urandom(BODY_BYTES) for _ in range(k)]
                if random_bodies
                else [distinct[i % 64] for i in range(k)]
            )
            core.store.put_bodies("Bench", (done // chunk) % QUEUES, bodies, {"TAGS": "bench"})
            done += k
        core.store.flush_all()


def read_all(endpoint: str, ends: dict[int, int], compression: str) -> tuple[int, int]:
    """Every queue read through ReadArrow by two threads; (rows, bytes on the wire)."""
    from rmq_spark.broker.connector import codec
    from rmq_spark.broker.connector import protocol as P
    from rmq_spark.broker.connector.client import InternalClient

    totals = [0, 0]
    lock = threading.Lock()

    def reader(queues: list[int]) -> None:
        client = InternalClient(endpoint)
        rows = wire = 0
        try:
            for q in queues:
                req = P.ReadArrowRequest(
                    topic="Bench", queue_id=q, start=0, end=ends[q], compression=compression
                )
                for chunk in client._stub(P.READ_ARROW)(req.encode(), timeout=600):
                    wire += len(chunk)
                    rows += codec.load_batch(chunk).num_rows
        finally:
            client.close()
        with lock:
            totals[0] += rows
            totals[1] += wire

    threads = [
        threading.Thread(target=reader, args=([q for q in ends if q % 2 == k],)) for k in (0, 1)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return totals[0], totals[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bodies", choices=["bench", "random"], default="bench")
    args = ap.parse_args()
    from rmq_spark.broker.testing import BrokerProcess
    from rmq_spark.store.reader import StoreReader

    with scratch_dir("arrow-stream-bench-") as work:
        store = os.path.join(work, "store")
        with Timer() as t:
            fill(store, args.messages, args.bodies == "random")
        r = StoreReader(store)
        ends = {q: r.max_offset("Bench", q) for q in range(QUEUES)}
        r.close()
        print(
            f"store: {sum(ends.values()):,} messages of {BODY_BYTES} B ({args.bodies} bodies) written in {t.seconds:.1f}s"
        )
        best: dict[str, float] = dict.fromkeys(COMPRESSIONS, 0.0)
        wire: dict[str, float] = {}
        with BrokerProcess(
            store, start_timeout_s=300, log_path=os.path.join(work, "broker.log")
        ) as broker:
            for run in range(args.runs + 1):  # run 0 warms up
                line = []
                for c in COMPRESSIONS:
                    with Timer() as t:
                        rows, nbytes = read_all(broker.endpoints, ends, c)
                    if rows != sum(ends.values()):
                        raise RuntimeError(
                            f"{c}: read {rows:,} rows, the store holds {sum(ends.values()):,}"
                        )
                    wire[c] = nbytes / rows
                    if run:
                        best[c] = max(best[c], rows / t.seconds)
                        line.append(f"{c} {t.seconds:.2f}s")
                if run:
                    print(f"  run {run}: " + ", ".join(line))
        print(
            "ReadArrow on loopback, 2 reader threads (rows/s, best run; wire-bound rate = link / bytes per row):"
        )
        print(
            f"  {'compression':<12} {'rows/s':>12} {'vs none':>8} {'B/row':>7} "
            + " ".join(f"{name + ' link':>16}" for name, _ in LINKS)
        )
        for c in COMPRESSIONS:
            links = " ".join(f"{bw / wire[c]:>16,.0f}" for _, bw in LINKS)
            print(
                f"  {c:<12} {best[c]:>12,.0f} {best[c] / best['none']:>7.2f}x {wire[c]:>7.1f} {links}"
            )


if __name__ == "__main__":
    main()
