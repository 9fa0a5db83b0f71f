"""A full disk (issue 17 item 8): ENOSPC injected at every write of a short run, through a shim
around the calls that take space (``posix_fallocate``, ``write``, ``pwrite``, ``mkdir``) for files
of the store, the disk staying full from there on.  The invariants, for every injection point:

* a put either succeeds or raises :class:`DiskFullError` and changes nothing (it never shows up
  later, no queue offset is lost);
* reads of everything acknowledged go on while the disk is full;
* shutdown on the full disk raises nothing;
* a restart on the full disk starts (and serves) or refuses with a DiskFullError naming a file;
* once there is space again the store holds exactly the acknowledged messages, intact, and takes
  new ones.

Segments, ConsumeQueue files and index files are preallocated with ``posix_fallocate`` when made
(before any offset is handed out), so a mapped write never meets a hole on a full disk (SIGBUS).
"""

from __future__ import annotations

import errno
import os

import pytest

from rmq_spark.errors import DiskFullError
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.index.service import IndexService
from rmq_spark.store.message import Message
from rmq_spark.store.query import MessageQuery
from rmq_spark.store.store import MessageStore, StoreConfig

CONFIG = {
    "commitlog_segment_bytes": 4096,
    "cq_segment_units": 8,
    "extra": {"index_slots": 4, "index_entries": 8},
}


class FullDisk:
    """The shim: calls on files under ``root`` count, and from call ``fail_from`` on they fail
    with ENOSPC (None: never)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: str) -> None:
        self.root = os.path.realpath(root)
        self.calls = 0
        self.fail_from: int | None = None
        self.failed = 0
        self._allocated: dict[str, list[tuple[int, int]]] = {}  # path -> ranges given blocks
        real = {name: getattr(os, name) for name in ("posix_fallocate", "write", "pwrite", "mkdir")}
        for name, fn in real.items():
            monkeypatch.setattr(os, name, self._wrap(name, fn))

    def _ours(self, name: str, arg: object) -> bool:
        if name == "mkdir":
            path = os.path.realpath(os.fspath(arg))  # type: ignore[arg-type]
        else:
            try:
                path = os.readlink(f"/proc/self/fd/{arg}")
            except OSError:
                return False
        return path.startswith(self.root)

    def _wrap(self, name, fn):  # type: ignore[no-untyped-def]
        def call(*args, **kw):  # type: ignore[no-untyped-def]
            if self._ours(name, args[0]):
                self.calls += 1
                full = self.fail_from is not None and self.calls > self.fail_from
                if full and not (name == "posix_fallocate" and self._has_blocks(*args)):
                    self.failed += 1
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                if name == "posix_fallocate":
                    self._allocated.setdefault(self._path(args[0]), []).append(
                        (args[1], args[1] + args[2])
                    )
            return fn(*args, **kw)

        return call

    def _path(self, fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    def _has_blocks(self, fd: int, start: int, length: int) -> bool:
        """A full filesystem still allocates a range whose blocks are all there (a no-op)."""
        pos = start
        for a, b in sorted(self._allocated.get(self._path(fd), [])):
            if a <= pos < b:
                pos = b
        return pos >= start + length


def open_store(d: str) -> MessageStore:
    return MessageStore(d, StoreConfig(**CONFIG), clock=FakeClock(), dispatchers=[IndexService])


def workload(
    s: MessageStore, acked: dict[tuple[str, int], list[bytes]], refused: list[str]
) -> None:
    """A short run: single puts, batches and bulk puts to new and old queues, rolling segments of
    the CommitLog, ConsumeQueues and index; consumer offsets saved; reads after every put."""
    steps = [
        lambda i: s.put_message(Message("A", b"one-%d" % i, {"KEYS": f"k{i}"}, queue_id=i % 2)),
        lambda i: s.put_messages(
            [Message("B", b"batch-%d-%d" % (i, k) * 3, queue_id=0) for k in range(5)]
        ),
        lambda i: s.put_bodies(f"C{i % 3}", 1, [b"bulk-%d-%d" % (i, k) * 20 for k in range(12)]),
    ]
    for i in range(24):
        step = steps[i % 3]
        try:
            r = step(i)
        except DiskFullError as e:
            refused.append(str(e))
            continue
        assert r.ok
        for m in _placed(s, r):
            acked.setdefault((m.topic, m.queue_id), []).append(m.body)
        if i % 5 == 4:
            try:
                s.offsets.commit("G", "A", 0, len(acked.get(("A", 0), [])), persist=True)
            except DiskFullError as e:
                refused.append(str(e))
        check_reads(s, acked)


def _placed(s: MessageStore, r):  # type: ignore[no-untyped-def]
    return [s.look_message_by_offset(p) for p in r.append.phys_list()]


def check_reads(s: MessageStore, acked: dict[tuple[str, int], list[bytes]]) -> None:
    for (topic, qid), bodies in acked.items():
        got = s.get_messages(topic, qid, 0, max_msgs=1000).messages
        assert [m.body for m in got] == bodies, (topic, qid)
        assert (
            s.read_arrow(topic, qid, 0, len(bodies), columns=["body"]).column("body").to_pylist()
            == bodies
        )


def test_disk_full_at_every_write_of_a_short_run(tmp_path, monkeypatch):
    root = str(tmp_path)
    disk = FullDisk(monkeypatch, root)
    d0 = os.path.join(root, "dry")
    with open_store(d0) as s:
        workload(s, {}, [])
    writes = disk.calls
    assert writes > 50
    outcomes = {"refused to start": 0, "full from a put": 0, "restart on the full disk refused": 0}
    for k in range(writes):
        d = os.path.join(root, f"s{k}")
        acked: dict[tuple[str, int], list[bytes]] = {}
        refused: list[str] = []
        disk.calls, disk.fail_from = 0, k
        try:
            s = open_store(d)
        except DiskFullError as e:
            assert e.path.startswith(d), e
            outcomes["refused to start"] += 1
        else:
            workload(s, acked, refused)
            s.shutdown()  # on the full disk: no exception
            outcomes["full from a put"] += bool(refused)
            assert all("no space left" in r for r in refused)
        try:  # a restart on the still full disk: starts and serves, or refuses naming a file
            with open_store(d) as s:
                check_reads(s, acked)
        except DiskFullError as e:
            assert e.path.startswith(d), e
            outcomes["restart on the full disk refused"] += 1
        disk.fail_from = None  # space again: exactly what was acknowledged, and new puts
        with open_store(d) as s:
            check_reads(s, acked)
            assert {k for k in s.queue_keys() if s.max_offset(*k)} == set(acked), k
            for (topic, qid), _bodies in acked.items():
                keys = [m.keys for m in s.get_messages(topic, qid, 0, max_msgs=1000).messages]
                if topic == "A":
                    for key in keys:
                        assert [m.keys for m in MessageQuery(s).by_key("A", key)] == [key]
            assert s.put_message(Message("A", b"after", queue_id=0)).ok
    print(f"{writes} injection points: {outcomes}")
