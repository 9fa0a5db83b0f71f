"""Every byte of a small store flipped, and every range of it zeroed, in every file kind
(CommitLog, ConsumeQueue, index, checkpoint, config JSON, the marker of the write in flight), of a cleanly stopped store and of a
crashed one: the store either refuses to open naming a file and a position, or serves exactly the
acknowledged messages intact (every queue read record by record and in bulk, every key and
unique id looked up in the index, the consumer offsets and topic configs as committed); a read
may refuse too, with a file and a position, but never returns a wrong, empty or missing message.

In the crashed store the records past the checkpoint that no valid record follows may be cut (a
torn tail is indistinguishable from a write that never reached the disk): the acknowledged
messages less such a suffix are what must be served.

Cases: 8,739 (6,860 flipped bytes and 1,879 zeroed ranges, about half in each state; the test
prints its tally by file kind and outcome, and fails if a state runs fewer than 3,500).  Flips
cover every byte a file holds data in and every 32nd byte of its zero-filled tail (the same code
sees every tail byte: past the end of the log, of the checkpoint's fields); zeroed ranges are
whole files, aligned windows of 4, 20, 64 and 512 bytes, and each CommitLog record whole, its
header, its body and properties, its CRC property.  One bit is flipped per byte (bit ``i % 8`` of
byte ``i``): the subtle damage, a size off by a power of two, a digit turned into another.  Runs
in-process in about 35 s of CPU (3.7 ms a case), with fsync turned off (durability is not what
is tested here) and the store in /dev/shm when there is one.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field

import pytest

from rmq_spark.errors import CorruptStoreError
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.index.service import IndexService
from rmq_spark.store.message import Message
from rmq_spark.store.query import MessageQuery
from rmq_spark.store.store import MessageStore, StoreConfig

CONFIG = {
    "commitlog_segment_bytes": 4096,
    "cq_segment_units": 8,
    "extra": {"index_slots": 4, "index_entries": 16},
    "flush_interval_ms": 3_600_000,
}
TAIL_STEP = 32  # a flip every 32nd byte of a zero-filled tail
GROUP = "G"
MESSAGES = [  # (topic, queue, body, key)
    ("A", 0, b"alpha-0", "k0"),
    ("A", 1, b"alpha-1-longer", "k1"),
    ("B", 0, b"", "k2"),
    ("A", 0, b"alpha-0-second", "k3"),
    ("A", 1, bytes(range(40)), "k4"),
    ("B", 0, b"b" * 3, "k5"),
]
CASES: dict[str, int] = {}


@dataclass
class Acked:
    """What the store acknowledged, in CommitLog order, and what a crash may take."""

    rows: list[tuple[str, int, int, bytes, str, str, int]] = field(default_factory=list)  # + offset
    durable_end: int = 0  # CommitLog bytes the checkpoint vouches for
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)


def open_store(d: str, **kw) -> MessageStore:
    return MessageStore(
        d,
        StoreConfig(**{**CONFIG, **kw}),
        clock=FakeClock(1_700_000_000_000),
        dispatchers=[IndexService],
        start_services=kw.pop("start_services", False),
    )


def build(d: str, crashed: bool) -> Acked:
    acked = Acked()
    s = MessageStore(
        d,
        StoreConfig(**CONFIG, flush="sync" if crashed else "async"),
        clock=FakeClock(1_700_000_000_000),
        dispatchers=[IndexService],
    )
    for i, (topic, qid, body, key) in enumerate(MESSAGES):
        r = s.put_message(Message(topic, body, {"KEYS": key, "TAGS": f"t{i % 2}"}, queue_id=qid))
        assert r.ok
        acked.rows.append(
            (
                topic,
                qid,
                r.append.queue_offsets[0],
                body,
                key,
                r.uniq_keys[0],
                r.append.wrote_offset,
            )
        )
        if i == 2:
            s.offsets.commit(GROUP, "A", 0, 1, persist=True)
            acked.offsets[("A", 0)] = 1
            if crashed:
                s.flush_all()
                acked.durable_end = s.commitlog.max_offset
    if crashed:
        s.crash()
    else:
        s.shutdown()
        acked.durable_end = 1 << 40  # everything
    return acked


def snapshot(d: str) -> dict[str, bytes]:
    out = {}
    for base, _, files in os.walk(d):
        for name in files:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, d)] = f.read()
    return out


def restore(d: str, files: dict[str, bytes]) -> None:
    shutil.rmtree(d, ignore_errors=True)
    for rel, data in files.items():
        path = os.path.join(d, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def data_extent(data: bytes) -> int:
    """Bytes up to the last non-zero one (the rest is a zero-filled tail)."""
    return len(data.rstrip(b"\0"))


def flips(data: bytes):
    live = data_extent(data)
    for i in range(len(data)):
        if i < live + 8 or i % TAIL_STEP == 0:
            yield i, bytes([data[i] ^ (1 << (i % 8))])


def zero_ranges(data: bytes, rel: str, record_extents: list[tuple[int, int]]):
    live = data_extent(data)
    seen = set()
    ranges = [(0, len(data))]
    for width in (4, 20, 64, 512):
        ranges += [(a, min(a + width, len(data))) for a in range(0, live, width)]
    if rel.startswith("commitlog"):
        for a, b in record_extents:
            ranges += [(a, b), (a, a + 88), (a + 88, b), (b - 20, b)]
    for a, b in ranges:
        if (a, b) not in seen and any(data[a:b]):
            seen.add((a, b))
            yield a, b


class Failure(AssertionError):
    pass


def check_refusal(e: CorruptStoreError, d: str) -> None:
    if not e.path.startswith(d) or e.position < 0 or e.path not in str(e):
        raise Failure(
            f"refused without a file and position: {e!r} path={e.path!r} pos={e.position}"
        )


def served_ok(acked: Acked, served_offsets: set[int], crashed: bool) -> bool:
    """Served exactly the acknowledged, less (crashed) a suffix past the checkpoint."""
    want = [r[-1] for r in acked.rows]
    if served_offsets == set(want):
        return True
    if not crashed:
        return False
    kept = [o for o in want if o in served_offsets]
    return (
        len(served_offsets) == len(kept)
        and kept == want[: len(kept)]
        and all(o >= acked.durable_end for o in want[len(kept) :])
    )


def verify(d: str, acked: Acked, crashed: bool) -> str:
    """Open the damaged store and hold it to the invariant; what happened, for the tally."""
    try:
        s = open_store(d)
    except CorruptStoreError as e:
        check_refusal(e, d)
        return "refused to open"
    outcome = "served"
    try:
        served: set[int] = set()
        by_queue: dict[tuple[str, int], list[tuple]] = {}
        for row in acked.rows:
            by_queue.setdefault((row[0], row[1]), []).append(row)
        for (topic, qid), rows in by_queue.items():
            try:
                got = s.get_messages(topic, qid, 0, max_msgs=100).messages
                arrow = s.read_arrow(topic, qid, 0, s.max_offset(topic, qid)).to_pylist()
            except CorruptStoreError as e:
                check_refusal(e, d)
                outcome = "refused a read"
                served.update(r[-1] for r in rows)  # nothing served from this queue: nothing wrong
                continue
            for i, (m, a) in enumerate(zip(got, arrow, strict=True)):
                row = rows[i] if i < len(rows) else None
                if (
                    row is None
                    or (
                        m.topic,
                        m.queue_id,
                        m.queue_offset,
                        m.body,
                        m.keys,
                        m.uniq_key,
                        m.commitlog_offset,
                    )
                    != row
                ):
                    raise Failure(f"get_messages served a wrong message {m!r} for {row}")
                if (
                    a["topic"],
                    a["queueId"],
                    a["queueOffset"],
                    a["body"],
                    a["keys"],
                    a["msgId"],
                    a["commitLogOffset"],
                ) != row:
                    raise Failure(f"read_arrow served a wrong row {a} for {row}")
            if len(got) != len(arrow):
                raise Failure(
                    f"{topic}/{qid}: get_messages served {len(got)}, read_arrow {len(arrow)}"
                )
            served.update(m.commitlog_offset for m in got)
        if not served_ok(acked, served, crashed):
            raise Failure(
                f"served CommitLog offsets {sorted(served)}, acknowledged {[r[-1] for r in acked.rows]}"
            )
        q = MessageQuery(s)
        for topic, _qid, _qoff, body, key, uniq, phys in acked.rows:
            if phys not in served or (crashed and phys >= s.commitlog.max_offset):
                continue
            try:
                hits = q.by_key(topic, key)
                one = q.by_unique_id(uniq, topic)
            except CorruptStoreError as e:
                check_refusal(e, d)
                outcome = "refused a read"
                continue
            if [(m.commitlog_offset, m.body) for m in hits] != [(phys, body)]:
                raise Failure(
                    f"by_key({topic}, {key}) gave {[m.commitlog_offset for m in hits]}, want [{phys}]"
                )
            if one is None or (one.commitlog_offset, one.body) != (phys, body):
                raise Failure(f"by_unique_id({uniq}) gave {one!r}")
        for (topic, qid), off in acked.offsets.items():
            if s.offsets.query(GROUP, topic, qid) != off:
                raise Failure(
                    f"consumer offset of {topic}/{qid} is {s.offsets.query(GROUP, topic, qid)}, committed {off}"
                )
        for topic in ("A", "B"):
            cfg = s.topics.get(topic)
            if cfg is None or (cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm) != (4, 4, 6):
                raise Failure(f"topic config of {topic} is {cfg!r}")
    finally:
        s.shutdown()
    return outcome


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)


@pytest.mark.parametrize("state", ["clean", "crashed"])
def test_every_byte_flipped_and_every_range_zeroed(tmp_path, state):
    crashed = state == "crashed"
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        tmp_path = tmp_path_in_memory = tempfile.mkdtemp(
            prefix="rmq-corrupt-", dir="/dev/shm"
        )  # msync is free
    else:
        tmp_path_in_memory = None
    try:
        logging.disable(logging.CRITICAL)  # thousands of damage reports
        _run(str(tmp_path), state, crashed)
    finally:
        logging.disable(logging.NOTSET)
        if tmp_path_in_memory:
            shutil.rmtree(tmp_path_in_memory, ignore_errors=True)


def _run(tmp_path: str, state: str, crashed: bool) -> None:
    base = os.path.join(tmp_path, "base")
    acked = build(base, crashed)
    files = snapshot(base)
    files.pop("lock", None)
    d = os.path.join(tmp_path, "s")
    offs = [r[-1] for r in acked.rows]
    log_end = data_extent(files["commitlog/" + "0" * 20])
    record_extents = list(zip(offs, [*offs[1:], log_end], strict=True))
    tally: dict[str, int] = {}
    failures: list[str] = []
    restore(d, files)
    assert verify(d, acked, crashed) == "served"  # the undamaged store
    for rel in sorted(files):
        if rel in ("abort",):
            continue
        data = files[rel]
        cases = [("flip", i, i + 1, b) for i, b in flips(data)]
        cases += [("zero", a, b, bytes(b - a)) for a, b in zero_ranges(data, rel, record_extents)]
        for kind, a, b, patch in cases:
            restore(d, {**files, rel: data[:a] + patch + data[b:]})
            try:
                outcome = verify(d, acked, crashed)
            except Exception as e:  # noqa: BLE001 - every escape is a finding
                failures.append(f"{rel} {kind} [{a}, {b}): {type(e).__name__}: {e}"[:400])
                outcome = "FAILED"
            key = f"{rel.split('/')[0]} {kind}: {outcome}"
            tally[key] = tally.get(key, 0) + 1
    CASES[state] = sum(tally.values())
    for k in sorted(tally):
        print(f"{state:8s} {k}: {tally[k]}")
    assert CASES[state] > 3500, tally
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(
        failures[:: max(1, len(failures) // 60)]
    )
