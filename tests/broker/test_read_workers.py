"""ReadArrow decoded by read worker processes (rmq_spark.broker.connector.readers): the same rows
as the broker's own decoding, errors with their file and position, workers replaced when a
caller leaves mid-stream or a worker dies, and stopped with the broker."""

from __future__ import annotations

import os
import signal
import time
from concurrent import futures

import pyarrow as pa
import pytest

from rmq_spark.broker.connector.client import InternalClient
from rmq_spark.broker.testing import InternalServer
from rmq_spark.errors import CorruptStoreError
from rmq_spark.services.core import BrokerCore
from rmq_spark.store.reader import StoreReader


class Served(InternalServer):
    def __init__(self, root: str, read_workers: int) -> None:
        super().__init__(root, read_workers=read_workers, client_timeout_s=60)

    @property
    def readers(self):  # type: ignore[no-untyped-def]
        return self.connector.readers

    def wait_workers(self, n: int) -> list[int]:
        deadline = time.monotonic() + 60
        while self.readers.started < n:
            assert time.monotonic() < deadline, "read workers did not start"
            time.sleep(0.05)
        return self.readers.pids()


@pytest.fixture
def served(store_dir):
    s = Served(store_dir, read_workers=2)
    yield s
    s.close()


def fill(core: BrokerCore, topic: str = "W", n: int = 30_000) -> None:
    s = core.store
    for q in range(2):
        for tag in ("a", "b"):
            s.put_bodies(
                topic,
                q,
                [f"{topic}-{q}-{tag}-{i}".encode() for i in range(n // 4)],
                {"TAGS": tag, "k": tag},
            )
    s.flush_all()


def read(client: InternalClient, topic: str, q: int, start: int, end: int, **kw) -> pa.Table:  # type: ignore[no-untyped-def]
    return pa.Table.from_batches(list(client.read_arrow(topic, q, start, end, **kw)))


def test_workers_read_the_rows_the_broker_reads(served):
    fill(served.core)
    first = read(served.client, "W", 0, 0, 15_000)  # no worker is ready yet: decoded in the broker
    pids = served.wait_workers(1)
    assert all(p != os.getpid() for p in pids)
    again = read(served.client, "W", 0, 0, 15_000)
    assert served.readers.started >= 1
    assert again.equals(first) and again.num_rows == 15_000
    want = pa.Table.from_batches([served.core.store.read_arrow("W", 1, 100, 14_000)])
    assert read(served.client, "W", 1, 100, 14_000).equals(want)
    # the filters are the broker's: a tag expression and SQL92
    tagged = read(served.client, "W", 1, 0, 15_000, tags="b")
    assert tagged.num_rows == 7_500 and set(tagged.column("tags").to_pylist()) == {"b"}
    sql = read(served.client, "W", 0, 0, 15_000, sql="k = 'a'")
    assert sql.num_rows == 7_500 and set(sql.column("tags").to_pylist()) == {"a"}
    # compressed streams decode to the same rows
    assert read(served.client, "W", 0, 0, 15_000, compression="zstd").equals(first)


def test_reads_in_parallel_use_several_workers(served):
    fill(served.core)
    read(served.client, "W", 0, 0, 10)
    served.wait_workers(1)
    read(served.client, "W", 0, 0, 10)  # the busy worker asks for a second
    served.wait_workers(2)
    with futures.ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda q: read(served.client, "W", q, 0, 15_000), (0, 1)))
    assert [t.num_rows for t in got] == [15_000, 15_000]
    assert served.readers.started == 2


def test_a_corrupt_record_read_by_a_worker_names_its_file_and_position(served):
    fill(served.core)
    read(served.client, "W", 0, 0, 10)
    served.wait_workers(1)
    r = StoreReader(served.core.store.root)
    phys = r.read_arrow("W", 0, 500, 501).column("commitLogOffset")[0].as_py()
    r.close()
    mf = served.core.store.commitlog.mfq.find(phys)
    pos = phys - mf.from_offset
    mf.mm[pos + 120] ^= 0xFF  # a byte of the record (about 170 bytes long)
    with pytest.raises(CorruptStoreError) as err:
        read(served.client, "W", 0, 0, 15_000)
    assert mf.path in str(err.value) and f"position {pos}" in str(err.value)
    assert read(served.client, "W", 0, 600, 700).num_rows == 100  # the worker serves on


def test_a_caller_leaving_mid_stream_or_a_worker_dying_costs_no_read(served):
    fill(served.core, n=60_000)
    read(served.client, "W", 0, 0, 10)
    (first,) = served.wait_workers(1)
    stream = served.client.read_arrow("W", 0, 0, 30_000)
    next(stream)
    stream.close()  # the caller goes away with most of the range unread
    deadline = time.monotonic() + 30
    while first in served.readers.pids():
        assert time.monotonic() < deadline, "the abandoned worker was not stopped"
        time.sleep(0.05)
    assert (
        read(served.client, "W", 0, 0, 30_000).num_rows == 30_000
    )  # in the broker, or a new worker
    pids = served.wait_workers(2)
    for pid in pids:  # workers dying while idle (the OOM killer, an operator)
        os.kill(pid, signal.SIGKILL)
    for pid in pids:
        while not _gone(pid):
            time.sleep(0.01)
    assert read(served.client, "W", 0, 0, 30_000).num_rows == 30_000  # read in the broker instead
    assert read(served.client, "W", 1, 0, 30_000).num_rows == 30_000
    served.wait_workers(1)
    assert read(served.client, "W", 1, 0, 100).num_rows == 100


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"  # a zombie until the broker waits for it
    except FileNotFoundError:
        return True


def test_a_deleted_topic_created_again_is_read_afresh_by_a_worker(served):
    fill(served.core, "D", n=4_000)
    read(served.client, "D", 0, 0, 10)
    served.wait_workers(1)
    assert read(served.client, "D", 0, 0, 2_000).num_rows == 2_000
    served.core.store.delete_topic("D")
    served.core.store.put_bodies("D", 0, [b"new-0", b"new-1"])
    served.core.store.flush_all()
    got = read(served.client, "D", 0, 0, 2)
    assert got.column("body").to_pylist() == [b"new-0", b"new-1"]


def test_the_broker_stop_stops_its_workers(store_dir):
    s = Served(store_dir, read_workers=2)
    try:
        fill(s.core, n=400)
        read(s.client, "W", 0, 0, 10)
        pids = s.wait_workers(1)
    finally:
        s.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_no_workers_reads_in_the_broker(store_dir):
    s = Served(store_dir, read_workers=0)
    try:
        fill(s.core, n=400)
        assert read(s.client, "W", 0, 0, 100).num_rows == 100
        assert s.readers is None
    finally:
        s.close()


def test_the_read_workers_flag(tmp_path):
    from rmq_spark.broker.options import parse_args
    from rmq_spark.errors import ConfigError

    assert parse_args(["--store", str(tmp_path)]).options.read_workers == -1  # one per CPU
    assert parse_args(["--store", str(tmp_path), "--read-workers", "0"]).options.read_workers == 0
    assert parse_args(["--store", str(tmp_path), "--read-workers", "6"]).options.read_workers == 6
    with pytest.raises(ConfigError, match="read-workers"):
        parse_args(["--store", str(tmp_path), "--read-workers", "-2"])


def test_large_messages_are_shipped_a_few_mb_at_a_time(served):
    from rmq_spark.broker.connector.readers import WIRE_BYTES

    big = [bytes([i]) * (1 << 20) for i in range(24)]  # 24 bodies of 1 MiB
    served.core.store.put_bodies("L", 0, big, {"KEYS": "k"})
    served.core.store.flush_all()
    for _ in range(2):  # in the broker, then (once one is up) in a worker
        batches = list(served.client.read_arrow("L", 0, 0, 24))
        assert [b for batch in batches for b in batch.column("body").to_pylist()] == big
        assert len(batches) >= 24 * (1 << 20) // (WIRE_BYTES + (1 << 20))
        assert all(
            pa.Table.from_batches([b]).column("body").nbytes <= WIRE_BYTES + (1 << 20)
            for b in batches
        )
        served.wait_workers(1)


def test_a_worker_stuck_at_its_start_is_killed_and_its_place_taken(store_dir, monkeypatch):
    """A worker that never says it is ready (its start blocked) is killed after the start timeout;
    meanwhile reads decode in the broker, and the next read starts a worker in its place."""
    import sys

    from rmq_spark.broker.connector import readers as R

    workers = R.ReadWorkers(store_dir, 1, start_timeout_s=1.0)
    stuck = [sys.executable, "-c", "import time; time.sleep(3600)"]
    monkeypatch.setattr(R, "_worker_command", lambda root: stuck)
    started: list[int] = []
    real_init = R._Worker.__init__

    def init(self, root):  # type: ignore[no-untyped-def]
        real_init(self, root)
        started.append(self.pid)

    monkeypatch.setattr(R._Worker, "__init__", init)
    try:
        here = lambda: iter([b"here"])  # noqa: E731
        assert list(workers.chunks({}, here)) == [b"here"]  # no worker ready: read in the broker
        deadline = time.monotonic() + 30
        while workers._starting:
            assert time.monotonic() < deadline, "the stuck worker's start was not given up"
            time.sleep(0.05)
        assert len(started) == 1 and workers.started == 0
        with pytest.raises(ChildProcessError):
            os.waitpid(started[0], os.WNOHANG)  # killed and reaped
        monkeypatch.setattr(
            R, "_worker_command", lambda root: [sys.executable, "-m", R.__name__, root]
        )
        assert list(workers.chunks({}, here)) == [b"here"]  # a new start
        while workers.started < 1:
            assert time.monotonic() < deadline + 30, "no worker started in the stuck one's place"
            time.sleep(0.05)
        assert len(started) == 2 and workers.pids() == started[1:]
    finally:
        workers.close()
