"""Filter and lookup benchmark: filtered bulk reads and IndexFile key lookups, each next to a peer
measured in the same run.

    python bench/filter_bench.py [--quick]

One store holds N messages (1 000 000; 200 000 with ``--quick``) of one queue with 100-byte
bodies, a tag drawn from five values (TagA..TagE), a numeric property ``a`` (0..9), a string
property ``b`` (x, y, z, w) and a unique key ``KEYS=key-<i>``; the IndexFile is built as they are
stored (``IndexService`` dispatcher).

Bulk reads (``store.read_arrow`` of the whole queue, all source columns, best of 3):

- unfiltered (the peer of the filtered reads);
- tag filter ``TagA || TagB`` (ConsumeQueue tagsCode mask, then the tag string);
- SQL92 filter ``a > 5 AND b IN ('x','y')`` (vectorized over the properties map).

Each is printed as messages scanned/s, rows returned, and the ratio to the unfiltered read.

Key lookups (random existing keys, each returning the message read from the CommitLog):

- ``MessageQuery.by_key`` and ``MessageQuery.by_unique_id`` through the IndexFile;
- peer 1: a sqlite table (key, uniq, CommitLog offset) with an index on each, the offset found
  then read with ``store.look_message_by_offset`` (same work after the lookup);
- peer 2: a scan of the keys column (Arrow ``equal`` over all N keys), then the same read.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench._util import Timer, scratch_dir
from rmq_spark.filter import SqlFilter, TagFilter
from rmq_spark.store.index.service import IndexService
from rmq_spark.store.message import Message
from rmq_spark.store.query import MessageQuery
from rmq_spark.store.store import MessageStore, StoreConfig

SEGMENT = 256 * 1024 * 1024
TOPIC = "Filt"
TAGS = ["TagA", "TagB", "TagC", "TagD", "TagE"]
B_VALUES = ["x", "y", "z", "w"]
TAG_EXPR = "TagA || TagB"
SQL_EXPR = "a > 5 AND b IN ('x','y')"
PUT_BATCH = 1024


def fill(store: MessageStore, count: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Store ``count`` messages; returns their tag, a and b choices (for the expected counts)."""
    rng = np.random.default_rng(seed)
    tags = rng.integers(0, len(TAGS), count)
    a_vals = rng.integers(0, 10, count)
    b_vals = rng.integers(0, len(B_VALUES), count)
    bodies = [os.urandom(100) for _ in range(64)]
    tag_l, a_l, b_l = tags.tolist(), a_vals.tolist(), b_vals.tolist()
    for i in range(0, count, PUT_BATCH):
        msgs = [
            Message(
                TOPIC,
                bodies[k % 64],
                {
                    "TAGS": TAGS[tag_l[k]],
                    "KEYS": f"key-{k}",
                    "a": str(a_l[k]),
                    "b": B_VALUES[b_l[k]],
                },
            )
            for k in range(i, min(count, i + PUT_BATCH))
        ]
        assert store.put_messages(msgs).ok
    return tags, a_vals, b_vals


def best_read(store: MessageStore, count: int, **kw: object) -> tuple[float, int]:
    """(best seconds of 3, rows returned) for a read of the whole queue."""
    runs, rows = [], -1
    for _ in range(3):
        with Timer() as t:
            b = store.read_arrow(TOPIC, 0, 0, count, **kw)
        runs.append(t.seconds)
        rows = b.num_rows
    return min(runs), rows


def read_section(store: MessageStore, count: int, expected: dict[str, int]) -> None:
    print(f"\n== Bulk read of {count:,} messages to Arrow (all source columns, best of 3) ==")
    store.read_arrow(TOPIC, 0, 0, min(count, 10_000))  # warm
    base_s, base_rows = best_read(store, count)
    assert base_rows == count
    cases = [
        ("unfiltered (peer)", base_s, base_rows),
        (f"tag {TAG_EXPR}", *best_read(store, count, tag_filter=TagFilter.parse(TAG_EXPR))),
        (f"sql {SQL_EXPR}", *best_read(store, count, sql_filter=SqlFilter.parse(SQL_EXPR))),
    ]
    assert cases[1][2] == expected["tag"] and cases[2][2] == expected["sql"]
    print(f"{'read':36} {'scanned msgs/s':>15} {'rows':>10} {'rows/s':>13} {'vs unfiltered':>14}")
    for name, secs, rows in cases:
        print(
            f"{name:36} {count / secs:15,.0f} {rows:10,} {rows / secs:13,.0f} "
            f"{base_s / secs:13.2f}x"
        )


def sqlite_peer(d: str, store: MessageStore, count: int) -> sqlite3.Connection:
    """A table of every message's key, unique id and CommitLog offset, indexed on key and id."""
    batch = store.read_arrow(TOPIC, 0, 0, count, columns=["keys", "msgId", "commitLogOffset"])
    db = sqlite3.connect(os.path.join(d, "peer.sqlite3"))
    db.execute("PRAGMA journal_mode=OFF")
    db.execute("PRAGMA synchronous=OFF")
    db.execute("CREATE TABLE m (key TEXT, uniq TEXT, phys INTEGER)")
    db.executemany(
        "INSERT INTO m VALUES (?, ?, ?)",
        zip(
            batch.column("keys").to_pylist(),
            batch.column("msgId").to_pylist(),
            batch.column("commitLogOffset").to_pylist(),
            strict=True,
        ),
    )
    db.execute("CREATE INDEX m_key ON m (key)")
    db.execute("CREATE INDEX m_uniq ON m (uniq)")
    db.commit()
    return db


def rate(fn, items: list) -> float:  # type: ignore[no-untyped-def, type-arg]
    """Lookups/s of ``fn`` over ``items`` (each must find its message)."""
    with Timer() as t:
        for x in items:
            assert fn(x), x
    return len(items) / t.seconds


def lookup_section(d: str, store: MessageStore, count: int, lookups: int, scans: int) -> None:
    print(f"\n== Lookups of random existing messages ({lookups:,} each; the scan peer {scans}) ==")
    rng = random.Random(7)
    picks = [rng.randrange(count) for _ in range(lookups)]
    q = MessageQuery(store)
    ids_batch = store.read_arrow(TOPIC, 0, 0, count, columns=["msgId", "keys", "commitLogOffset"])
    all_ids = ids_batch.column("msgId").to_pylist()
    keys = [f"key-{k}" for k in picks]
    uniqs = [all_ids[k] for k in picks]
    db = sqlite_peer(d, store, count)
    read = store.look_message_by_offset

    def sql_by(column: str):  # type: ignore[no-untyped-def]
        stmt = f"SELECT phys FROM m WHERE {column} = ?"
        return lambda v: [read(p) for (p,) in db.execute(stmt, (v,))]

    key_col, phys_col = ids_batch.column("keys"), ids_batch.column("commitLogOffset")
    id_col = ids_batch.column("msgId")

    def scan_by(col: pa.Array):  # type: ignore[no-untyped-def]
        return lambda v: [read(p) for p in phys_col.filter(pc.equal(col, v)).to_pylist()]

    q.by_key(TOPIC, keys[0])  # warm
    rows = [
        (
            "by key",
            rate(lambda k: q.by_key(TOPIC, k), keys),
            rate(sql_by("key"), keys),
            rate(scan_by(key_col), keys[:scans]),
        ),
        (
            "by unique id",
            rate(lambda u: q.by_unique_id(u, TOPIC), uniqs),
            rate(sql_by("uniq"), uniqs),
            rate(scan_by(id_col), uniqs[:scans]),
        ),
    ]
    db.close()
    print(
        f"{'lookup':14} {'IndexFile/s':>12} {'sqlite/s':>10} {'vs sqlite':>10} "
        f"{'scan/s':>9} {'vs scan':>9}"
    )
    for name, ours, lite, scan in rows:
        print(
            f"{name:14} {ours:12,.0f} {lite:10,.0f} {ours / lite:9.2f}x "
            f"{scan:9,.1f} {ours / scan:8.0f}x"
        )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smaller counts (a smoke run)")
    args = ap.parse_args()
    count = 200_000 if args.quick else 1_000_000
    lookups, scans = (2_000, 20) if args.quick else (10_000, 50)
    extra = {"index_slots": max(1024, count), "index_entries": 2 * count + 16}
    with scratch_dir("filter") as d:
        root = os.path.join(d, "store")
        with MessageStore(
            root,
            StoreConfig(commitlog_segment_bytes=SEGMENT, extra=extra),
            dispatchers=[IndexService],
        ) as store:
            with Timer() as t:
                tags, a_vals, b_vals = fill(store, count, seed=11)
            print(f"stored {count:,} messages (with the IndexFile) in {t.seconds:.1f} s")
            expected = {
                "tag": int(np.isin(tags, [0, 1]).sum()),
                "sql": int(((a_vals > 5) & np.isin(b_vals, [0, 1])).sum()),
            }
            read_section(store, count, expected)
            lookup_section(d, store, count, lookups, scans)


if __name__ == "__main__":
    main()
