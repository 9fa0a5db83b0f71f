"""``ReadArrow`` decoded in worker processes on the broker's host, so that Spark partitions read
in parallel do not queue behind one GIL.

Decoding a queue range (the CRC and layout checks, then the columns) is CPU work in Python and
numpy.  In the broker's process, the reads of all partitions would share one interpreter lock:
an executor reading the store files itself decodes in its own process, a remote executor would
wait for the broker.  So the broker hands each ``ReadArrow`` to a *read worker*: a process of its
own (``python -m rmq_spark.broker.connector.readers STORE``) holding a read-only
:class:`rmq_spark.store.reader.StoreReader` of the broker's store (mapped shared, so it sees what
the broker has dispatched the moment it is there), exactly what an executor beside the broker
would run.  The broker checks the request (access, filters, range) and forwards the worker's
chunks to the caller as they come; reading them from the pipe releases the lock.

Workers start on the first ``ReadArrow`` (in the background: until one is ready, reads decode in
the broker's process, as they do when all workers are busy) and stay for the next reads.  A
worker whose caller went away mid-stream is stopped (it may be blocked writing) and another
started.  A worker not ready within ``START_TIMEOUT_S`` is killed, so a start stuck (an import
blocked, say) does not hold a worker's place for good.  Workers exit when the broker's end of their
pipe closes, however the broker ends.

Pipe protocol: one JSON request per line on the worker's stdin; frames on its stdout, each a
kind byte and a 64-bit big-endian length: ``R`` ready, ``C`` a chunk (one Arrow IPC stream, as
:func:`rmq_spark.broker.connector.codec.dump_batch` makes it), ``D`` done, ``E`` an error (JSON:
type, message, path, position).
"""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from rmq_spark import errors as E
from rmq_spark.broker.connector import codec
from rmq_spark.store.reader import chunk_bounds

__all__ = ["READ_STEP", "WIRE_BYTES", "WIRE_ROWS", "ReadWorkers", "default_workers", "wire_chunks"]

log = logging.getLogger("rmq_spark.broker")

# The store is read READ_STEP units at a time (the size of the batches the files path yields:
# a step of 262,144 units decoded about 20% slower per row, its columns no longer in cache) and
# each batch shipped in messages of at most WIRE_ROWS rows and about WIRE_BYTES of bodies and
# properties: grpc's Python stream is several times faster with messages of a few MB than of
# tens of MB (measured on loopback, 1M rows, 2 readers: 1.33M rows/s at 8,192 rows a message,
# 0.69M at 16,384, 0.18M at 65,536, 0.08M at 262,144).  The executor hands each message's batch
# to Spark as it is (joining them into 65,536-row batches cost a copy of every row and read no
# faster: 5 M messages, 0.78x the files path joined, 0.90x not, runs side by side).
READ_STEP = 65_536
READ_INFLATED_MAX = 64 << 20  # bodies of one step of rows, once inflated
WIRE_ROWS = 8_192
WIRE_BYTES = 4 << 20

_FRAME = struct.Struct(">cQ")
READY, CHUNK, DONE, ERROR = b"R", b"C", b"D", b"E"


def default_workers() -> int:
    """One read worker per CPU of the broker's host (at least 2)."""
    return max(2, os.cpu_count() or 2)


def wire_chunks(
    read: Callable[..., pa.RecordBatch], start: int, end: int, compression: str | None
) -> Iterator[bytes]:
    """The ``ReadArrow`` messages of ``[start, end)``: ``read(a, b, max_inflated=, next_offset=)``
    gives rows from ``a`` towards ``b``, ending where compressed bodies would pass
    :data:`READ_INFLATED_MAX` once inflated (a few KiB of zlib can hold 4 MiB: a step of rows is
    bounded by what it holds in memory, not by its count), and the offset to go on from."""
    pos = start
    while pos < end:
        stop = min(end, pos + READ_STEP)
        resume: list[int] = []
        batch = read(pos, stop, max_inflated=READ_INFLATED_MAX, next_offset=resume)
        for a, b in chunk_bounds(_row_bytes(batch), WIRE_ROWS, WIRE_BYTES):
            yield codec.dump_batch(batch.slice(a, b - a), compression)
        pos = min(stop, resume[0]) if resume else stop


def _row_bytes(batch: pa.RecordBatch) -> np.ndarray:
    """Bytes of each row's variable-width columns: the body, and its properties' keys and values."""
    import pyarrow.compute as pc

    n = batch.num_rows
    sizes = np.zeros(n, dtype=np.int64)
    names = batch.schema.names
    if n and "body" in names:
        sizes += np.asarray(pc.binary_length(batch.column("body")).fill_null(0), dtype=np.int64)
    if n and "properties" in names:
        props = batch.column("properties")
        entry = np.asarray(pc.binary_length(props.keys), dtype=np.int64) + np.asarray(
            pc.binary_length(props.items).fill_null(0), dtype=np.int64
        )
        upto = np.concatenate([[0], np.cumsum(entry)])
        offsets = np.asarray(props.offsets, dtype=np.int64)
        sizes += upto[offsets[1:]] - upto[offsets[:-1]]
    return sizes


START_TIMEOUT_S = 60.0  # a worker not ready by then is killed (its start slot freed)


def _worker_command(root: str) -> list[str]:
    return [sys.executable, "-m", __name__, root]


class _Worker:
    def __init__(self, root: str) -> None:
        cmd = _worker_command(root)
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, close_fds=True
        )
        self.pid = self.proc.pid

    def ready(self, timeout_s: float) -> None:
        """Waits for the worker's READY frame; one not ready in ``timeout_s`` is killed."""
        late = threading.Event()

        def kill() -> None:
            late.set()
            self.proc.kill()

        timer = threading.Timer(timeout_s, kill)
        timer.daemon = True
        timer.start()
        try:
            kind, data = self.frame()
        except E.StoreError:
            if late.is_set():
                raise E.StoreError(
                    f"read worker {self.pid} was not ready in {timeout_s:g}s; killed"
                ) from None
            raise
        finally:
            timer.cancel()
        if kind != READY:
            raise E.StoreError(f"read worker {self.pid} started with {kind!r}: {data[:200]!r}")

    def frame(self) -> tuple[bytes, bytes]:
        out: BinaryIO = self.proc.stdout  # type: ignore[assignment]
        head = out.read(_FRAME.size)
        if len(head) < _FRAME.size:
            raise E.StoreError(f"read worker {self.pid} exited (code {self.proc.poll()})")
        kind, n = _FRAME.unpack(head)
        data = out.read(n) if n else b""
        if len(data) < n:
            raise E.StoreError(
                f"read worker {self.pid} exited in the middle of a chunk (code {self.proc.poll()})"
            )
        return kind, data

    def request(self, job: dict[str, Any]) -> None:
        self.proc.stdin.write(json.dumps(job).encode() + b"\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a killed process always goes
            log.warning("read worker %d did not exit after SIGKILL", self.pid)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()  # type: ignore[union-attr]
            except OSError:
                pass


class ReadWorkers:
    """Up to ``workers`` read worker processes for the store at ``root``."""

    def __init__(self, root: str, workers: int, start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.root = root
        self.limit = workers
        self.start_timeout_s = start_timeout_s
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._starting = 0
        self._lock = threading.Lock()
        self._closed = False

    @property
    def started(self) -> int:
        with self._lock:
            return len(self._idle) + len(self._busy)

    def pids(self) -> list[int]:
        with self._lock:
            return [w.pid for w in [*self._idle, *self._busy]]

    def chunks(self, job: dict[str, Any], here: Callable[[], Iterator[bytes]]) -> Iterator[bytes]:
        """The messages of ``job`` (topic, queue_id, start, end, tags, sql, compression,
        force_prop_crc) from a free worker, else from ``here()`` (decoded in the broker's
        process): when none is free, and when the worker dies before its first message.  A
        worker is started in the background while fewer than ``workers`` run and none is idle."""
        dead: list[_Worker] = []
        with self._lock:
            worker = None
            while not self._closed and self._idle and worker is None:
                worker = self._idle.pop()
                if worker.proc.poll() is not None:  # died while idle
                    dead.append(worker)
                    worker = None
            if worker is not None:
                self._busy.add(worker)
            if not self._closed:
                if not self._idle and len(self._busy) + self._starting < self.limit:
                    self._starting += 1
                    threading.Thread(
                        target=self._start_one, name="rmq-read-worker-start", daemon=True
                    ).start()
        for w in dead:
            log.warning("read worker %d exited (code %s); another starts", w.pid, w.proc.returncode)
            w.stop()
        return here() if worker is None else self._serve(worker, job, here)

    def _start_one(self) -> None:
        worker = None
        try:
            worker = _Worker(self.root)
            worker.ready(self.start_timeout_s)
        except Exception as exc:  # noqa: BLE001 - the reads go on in the broker's process
            log.warning("a read worker for %s did not start: %s", self.root, exc)
            if worker is not None:
                worker.stop()
            worker = None
        with self._lock:
            self._starting -= 1
            if worker is not None and not self._closed:
                self._idle.append(worker)
                return
        if worker is not None:
            worker.stop()

    def _serve(
        self, worker: _Worker, job: dict[str, Any], here: Callable[[], Iterator[bytes]]
    ) -> Iterator[bytes]:
        clean = False
        try:
            try:
                worker.request(job)
                kind, data = worker.frame()
            except (OSError, E.StoreError) as exc:  # it died idle: nothing was sent yet
                log.warning("read worker %d is gone (%s); reading %s/%s in the broker", worker.pid, exc,
                            job["topic"], job["queue_id"])  # fmt: skip
                kind = b""
            if not kind:
                yield from here()
                return
            while True:
                if kind == CHUNK:
                    yield data
                elif kind == DONE:
                    clean = True
                    return
                elif kind == ERROR:
                    clean = True
                    raise _error(json.loads(data))
                else:
                    raise E.StoreError(f"read worker {worker.pid} sent a frame of kind {kind!r}")
                kind, data = worker.frame()
        finally:
            with self._lock:
                self._busy.discard(worker)
                keep = clean and not self._closed and worker.proc.poll() is None
                if keep:
                    self._idle.append(worker)
            if not keep:  # a caller gone mid-stream, a dead worker, a stop: never reused
                worker.stop()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._idle = [*self._idle, *self._busy], []
        for w in workers:
            w.stop()


def _error(doc: dict[str, Any]) -> Exception:
    kind, message = str(doc.get("type", "")), str(doc.get("message", ""))
    if kind == "CorruptStoreError":
        return E.CorruptStoreError(message, str(doc.get("path", "")), int(doc.get("position", -1)))
    cls = getattr(E, kind, None)
    if isinstance(cls, type) and issubclass(cls, E.StoreError) and cls is not E.CorruptStoreError:
        try:
            return cls(message)
        except TypeError:
            pass
    return E.StoreError(message)


# --- the worker process -----------------------------------------------------------------------------------
def _write(out: BinaryIO, kind: bytes, data: bytes = b"") -> None:
    out.write(_FRAME.pack(kind, len(data)))
    if data:
        out.write(data)


def _serve_job(reader: Any, job: dict[str, Any], out: BinaryIO) -> None:
    from rmq_spark.filter.options import make_filters

    topic, qid = str(job["topic"]), int(job["queue_id"])
    tag_filter, sql_filter = make_filters(job.get("tags"), job.get("sql"))
    force = bool(job.get("force_prop_crc", False))

    def read(a: int, b: int, **bounds: Any) -> pa.RecordBatch:
        return reader.read_arrow(
            topic, qid, a, b, tag_filter, sql_filter, force_prop_crc=force, **bounds
        )

    for chunk in wire_chunks(read, int(job["start"]), int(job["end"]), job.get("compression")):
        _write(out, CHUNK, chunk)
    _write(out, DONE)


def main(argv: list[str]) -> int:
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # nothing printed by accident can break the frames
    from rmq_spark.store.reader import StoreReader

    try:
        reader = StoreReader(argv[0])
        _write(out, READY)
        for line in sys.stdin.buffer:
            job = json.loads(line)
            try:
                _serve_job(reader, job, out)
            except (BrokenPipeError, ConnectionResetError):
                raise
            except Exception as exc:  # noqa: BLE001 - every failure goes back to the broker
                doc = {"type": type(exc).__name__, "message": str(exc),
                       "path": getattr(exc, "path", ""), "position": getattr(exc, "position", -1)}  # fmt: skip
                _write(out, ERROR, json.dumps(doc).encode())
    except (BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        pass  # the broker went away or stopped this worker
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
