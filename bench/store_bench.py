"""Store benchmark: appends, group-commit sync flush and bulk reads, each next to a peer measured
in the same run.

    python bench/store_bench.py [--quick]

Peers: a raw sequential write of the same bytes (the disk's limit), the Python durable queues
persist-queue and litequeue doing the same puts (single puts: the CPU time of litequeue puts of
the same messages), one write+fdatasync per message (sync flush without group commit), and
pyarrow reading the same bodies from a Parquet file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa
import pyarrow.parquet as pq

from bench._util import Timer, scratch_dir
from rmq_spark.store.message import Message
from rmq_spark.store.store import MessageStore, StoreConfig

SEGMENT = 256 * 1024 * 1024


def bodies_of(size: int, count: int) -> list[bytes]:
    distinct = [os.urandom(size) for _ in range(64)]
    return [distinct[i % 64] for i in range(count)]


def bench_ours(d: str, bodies: list[bytes], batch: int) -> tuple[float, int]:
    with MessageStore(d, StoreConfig(commitlog_segment_bytes=SEGMENT)) as s:
        with Timer() as t:
            for i in range(0, len(bodies), batch):
                s.put_bodies("Bench", 0, bodies[i : i + batch], {"TAGS": "bench"})
            s.flush_all()
        nbytes = s.commitlog.max_offset
    return t.seconds, nbytes


def bench_raw(d: str, nbytes: int, chunks: int) -> float:
    data = os.urandom(min(nbytes, 64 << 20))
    chunk = max(1, nbytes // chunks)
    fd = os.open(os.path.join(d, "raw"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with Timer() as t:
            written = 0
            while written < nbytes:
                n = min(chunk, nbytes - written)
                off = written % len(data)
                piece = data[off : off + n] if off + n <= len(data) else data[:n]
                written += os.write(fd, piece)
            os.fdatasync(fd)
    finally:
        os.close(fd)
    return t.seconds


def bench_persist_queue(d: str, bodies: list[bytes]) -> float:
    import persistqueue

    q = persistqueue.Queue(os.path.join(d, "pq"), autosave=False, chunksize=10_000)
    with Timer() as t:
        for b in bodies:
            q.put(b)
        q._saveinfo()
        os.sync()
    return t.seconds


def bench_litequeue(d: str, bodies: list[bytes], batch: int) -> float:
    import litequeue

    q = litequeue.LiteQueue(os.path.join(d, "lq.sqlite3"))
    texts = [b.decode("latin-1") for b in bodies]
    with Timer() as t:
        for i in range(0, len(texts), batch):
            with q.transaction():
                for m in texts[i : i + batch]:
                    q.put(m)
    q.close()
    return t.seconds


def put_section(quick: bool) -> None:
    print("\n== Single puts of producer messages (async flush): CPU per put ==")
    n = 3000 if quick else 20_000
    body = os.urandom(500)
    props = {"TAGS": "TagA", "KEYS": "order-1234"}
    with scratch_dir("lq1") as d:
        import litequeue

        q = litequeue.LiteQueue(os.path.join(d, "lq.sqlite3"))
        text = body.decode("latin-1")
        for _ in range(200):
            q.put(text)
        t0 = time.thread_time()
        for _ in range(n):
            q.put(text)
        peer_us = (time.thread_time() - t0) / n * 1e6
        q.close()
    print(f"{'case':34} {'ours us/put':>12} {'litequeue us/put':>17} {'vs peer':>8}")
    for per_put in (1, 4):
        with (
            scratch_dir("put") as d,
            MessageStore(d, StoreConfig(commitlog_segment_bytes=SEGMENT)) as s,
        ):
            batches = [
                [Message("Put", body, dict(props), queue_id=k % 4) for k in range(per_put)]
                for _ in range(n + 200)
            ]
            for msgs in batches[:200]:
                s.put_messages(msgs)
            t0 = time.thread_time()
            for msgs in batches[200:]:
                s.put_messages(msgs)
            ours_us = (time.thread_time() - t0) / n * 1e6
        label = f"put of {per_put} x 500 B (TAGS, KEYS)"
        print(
            f"{label:34} {ours_us:12.1f} {peer_us * per_put:17.1f} {peer_us * per_put / ours_us:7.2f}x"
        )


def append_section(quick: bool) -> None:
    print("\n== Appends (async flush, flushed at the end) ==")
    print(
        f"{'case':34} {'ours msgs/s':>14} {'ours MB/s':>10} {'raw MB/s':>10} {'vs raw':>7} "
        f"{'persist-q/s':>12} {'litequeue/s':>12} {'vs best py':>10}"
    )
    for size, count in (
        (100, 200_000 if quick else 1_000_000),
        (4096, 20_000 if quick else 100_000),
    ):
        peer_count = min(count, 20_000)
        peer_bodies = bodies_of(size, peer_count)
        with scratch_dir("pq") as d:
            pq_rate = peer_count / bench_persist_queue(d, peer_bodies)
        for batch in (32, 256, 1024):
            bodies = bodies_of(size, count)
            with scratch_dir("ours") as d:
                secs, nbytes = bench_ours(d, bodies, batch)
            with scratch_dir("raw") as d:
                raw_secs = bench_raw(d, nbytes, max(1, count // batch))
            with scratch_dir("lq") as d:
                lq_rate = peer_count / bench_litequeue(d, peer_bodies, batch)
            ours = count / secs
            best_py = max(pq_rate, lq_rate)
            print(
                f"{f'{size} B bodies, batch {batch}':34} {ours:14,.0f} {nbytes / secs / 1e6:10,.0f} "
                f"{nbytes / raw_secs / 1e6:10,.0f} {raw_secs / secs:7.2f} {pq_rate:12,.0f} "
                f"{lq_rate:12,.0f} {ours / best_py:9.1f}x"
            )


def sync_section(quick: bool) -> None:
    print("\n== Sync flush with group commit (one 100 B message per put) ==")
    with scratch_dir("fsync") as d:
        fd = os.open(os.path.join(d, "f"), os.O_WRONLY | os.O_CREAT, 0o644)
        n = 300 if quick else 1000
        with Timer() as t:
            for _ in range(n):
                os.write(fd, b"x" * 200)
                os.fdatasync(fd)
        os.close(fd)
        per_msg_fsync = n / t.seconds
    print(f"peer: one write+fdatasync per message: {per_msg_fsync:,.0f} msgs/s")
    print(
        f"{'producers':>10} {'msgs/s':>12} {'vs peer':>8} {'p50 ms':>8} {'p99 ms':>8} {'puts/fsync':>10}"
    )
    seconds = 1.5 if quick else 3.0
    for producers in (1, 8, 64):
        with (
            scratch_dir("sync") as d,
            MessageStore(d, StoreConfig(commitlog_segment_bytes=SEGMENT, flush="sync")) as s,
        ):
            stop = time.monotonic() + seconds
            lat: list[float] = []
            lock = threading.Lock()
            count = [0]

            # this round's state bound now (the threads are joined before the next round)
            def producer(
                k: int,
                stop: float = stop,
                lock: threading.Lock = lock,
                lat: list[float] = lat,
                count: list[int] = count,
            ) -> None:
                mine = []
                body = os.urandom(100)
                while time.monotonic() < stop:
                    t0 = time.perf_counter()
                    r = s.put_message(Message("Sync", body, queue_id=k % 4))
                    assert r.ok
                    mine.append(time.perf_counter() - t0)
                with lock:
                    lat.extend(mine)
                    count[0] += len(mine)

            threads = [threading.Thread(target=producer, args=(k,)) for k in range(producers)]
            t0 = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            rate = count[0] / (time.perf_counter() - t0)
            # group commit: how many puts one fdatasync round made durable
            rounds, served = s.group_commit_stats()
            lat.sort()
            p50 = statistics.median(lat) * 1000
            p99 = lat[int(len(lat) * 0.99) - 1] * 1000
            print(
                f"{producers:>10} {rate:12,.0f} {rate / per_msg_fsync:7.1f}x {p50:8.2f} {p99:8.2f} "
                f"{served / max(1, rounds):10.1f}"
            )


def read_section(quick: bool) -> None:
    print("\n== Bulk read to Arrow from the page cache (100 B bodies) ==")
    count = 300_000 if quick else 1_000_000
    bodies = bodies_of(100, count)
    with scratch_dir("read") as d:
        with MessageStore(d, StoreConfig(commitlog_segment_bytes=SEGMENT)) as s:
            for i in range(0, count, 4096):
                s.put_bodies("Read", 0, bodies[i : i + 4096], {"TAGS": "t", "KEYS": "k"})
            s.read_arrow("Read", 0, 0, 10_000)  # warm
            runs = []
            for _ in range(3):
                with Timer() as t:
                    b = s.read_arrow("Read", 0, 0, count)
                runs.append(t.seconds)
            assert b.num_rows == count
            ours = count / min(runs)
            body_only = []
            path = os.path.join(d, "bodies.parquet")
            pq.write_table(pa.table({"body": pa.array(bodies, pa.binary())}), path)
            pq.read_table(path)  # warm
            for _ in range(3):
                with Timer() as t:
                    tbl = pq.read_table(path)
                body_only.append(t.seconds)
            assert tbl.num_rows == count
            peer = count / min(body_only)
    print(f"ours (all 14 source columns): {ours:12,.0f} msgs/s")
    print(f"peer (Parquet, body column) : {peer:12,.0f} msgs/s")
    print(f"ratio                       : {ours / peer:12.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller counts (a smoke run)")
    ap.add_argument("--only", choices=["put", "append", "sync", "read"], help="run one section")
    args = ap.parse_args()
    sections = {
        "put": put_section,
        "append": append_section,
        "sync": sync_section,
        "read": read_section,
    }
    for name, fn in sections.items():
        if args.only in (None, name):
            fn(args.quick)


if __name__ == "__main__":
    main()
