"""The embedded broker: with only ``path``, a broker process for that store is started on demand.

Every Spark process that needs the broker (the driver's planning worker, executor workers, the
sink's commit worker) calls :func:`ensure_broker`.  Under an exclusive lock on
``{path}/embedded.lock`` it reuses the broker named in ``{path}/broker.endpoint`` when that one
answers, and otherwise starts ``python -m rmq_spark.broker --store PATH --listen 127.0.0.1:0
--idle-exit-s N`` in its own session, waits for its ready line and records it.  The broker exits
by itself after N idle seconds, so none is left running once the queries are done.

A store Apache RocketMQ wrote is opened as ``rmq-broker --store`` opens it; what that would refuse
(:func:`check_servable_store`: a kind of store it cannot serve, segment files that disagree, a
store Apache's broker holds) is refused first, naming it, before anything is written in the
store.  A batch read of such a store starts nothing: it is planned from its files
(:class:`~rmq_spark.datasource.read.offline.OfflineClient`).

``broker.endpoint`` (UTF-8 JSON, rewritten atomically)::

    ┌──────────┬──────────────────────┬─────────────┬──────────────────────────┐
    │ version  │ endpoint             │ pid         │ started_ms               │
    │ 1        │ "127.0.0.1:PORT"     │ broker pid  │ epoch ms of the start    │
    └──────────┴──────────────────────┴─────────────┴──────────────────────────┘
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rmq_spark.broker.connector.client import BrokerUnavailableError, InternalClient
from rmq_spark.errors import ConfigError, StoreError

ENDPOINT_FILE = "broker.endpoint"
LOCK_FILE = "embedded.lock"
LOG_FILE = "broker.log"
RECORD_VERSION = 1
READY = re.compile(r"rmq-broker listening on (\S+:\d+) store=")
START_TIMEOUT_S = 60.0
BROKER_MODULE = "rmq_spark.broker"

_known: dict[str, str] = {}  # path -> endpoint verified by this process
_known_lock = threading.Lock()


class EmbeddedBrokerError(StoreError):
    """The embedded broker could not be started (the message carries its log's tail)."""


@dataclass(frozen=True)
class BrokerRecord:
    endpoint: str
    pid: int
    started_ms: int


def read_record(path: str) -> BrokerRecord | None:
    try:
        with open(os.path.join(path, ENDPOINT_FILE), encoding="utf-8") as f:
            d = json.load(f)
        return BrokerRecord(str(d["endpoint"]), int(d["pid"]), int(d["started_ms"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_record(path: str, rec: BrokerRecord) -> None:
    tmp = os.path.join(path, ENDPOINT_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(
            {
                "version": RECORD_VERSION,
                "endpoint": rec.endpoint,
                "pid": rec.pid,
                "started_ms": rec.started_ms,
            },
            f,
        )
    os.replace(tmp, os.path.join(path, ENDPOINT_FILE))


def _answers(endpoint: str, root: str, credentials: dict[str, str | None] | None = None) -> bool:
    """Does a broker for store ``root`` answer at ``endpoint``?  A broker with an ACL tells its
    store path to admin accounts only: for others the broker named in the record file must be
    the process running on ``root``."""
    client = InternalClient(endpoint, timeout_s=5.0, **(credentials or {}))
    try:
        info = client.info()
        if not info.get("store_root"):
            rec = read_record(root)
            return (
                rec is not None
                and rec.endpoint == endpoint
                and pid_alive(rec.pid)
                and _is_broker(rec.pid, root)
            )
        return os.path.realpath(info.get("store_root", "")) == os.path.realpath(root)
    except (BrokerUnavailableError, StoreError):
        return False
    finally:
        client.close()


def check_store_path(path: str, create: bool) -> None:
    """``path`` can hold a store: a directory (created when ``create``; a batch read never
    creates a store), never a file.  ConfigError names the option and what is wrong."""
    here = os.path.abspath(path)
    while True:
        if os.path.exists(here):
            if not os.path.isdir(here):
                what = (
                    "is a file"
                    if here == os.path.abspath(path)
                    else f"lies under {here}, which is a file"
                )
                raise ConfigError(f"option 'path': {path} {what}, not a store directory")
            break
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    if not create and not os.path.isdir(path):
        raise ConfigError(
            f"option 'path': store directory {path} does not exist (a batch read never creates a store: "
            "write to it first, or give the path of an existing store)"
        )


_FLOCK = struct.Struct("@hhqqi4x")  # struct flock on 64-bit Linux: type, whence, start, len, pid


def _posix_lock_holder(lock_path: str) -> int | None:
    """The pid holding a classic POSIX record lock on byte 0 of ``lock_path`` (Apache RocketMQ's
    ``FileChannel.tryLock``), found without taking any lock; None when there is none, or the
    holder is an rmq-broker (its open-file-description lock reports no pid: the broker started
    here says who it is itself)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return None
    try:
        got = fcntl.fcntl(fd, fcntl.F_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
    except OSError:
        return None
    finally:
        os.close(fd)
    kind, _, _, _, pid = _FLOCK.unpack(got)
    return pid if kind != fcntl.F_UNLCK and pid > 0 else None


def check_servable_store(path: str) -> None:
    """The embedded broker opens a store Apache RocketMQ wrote as ``rmq-broker --store`` does
    (:mod:`rmq_spark.store.apache`); what it would refuse at start is refused here first, by
    name and before anything is written in the store: a kind of store it cannot serve
    (:func:`~rmq_spark.store.apache.check_servable`), segment files that disagree on their size,
    and a store a broker holds with Apache's POSIX lock on ``{path}/lock``."""
    from rmq_spark.store.apache import (
        ApacheStoreError,
        check_servable,
        is_apache_store,
        segment_sizes,
    )

    if not os.path.isdir(path):
        return
    try:
        check_servable(path)
        if is_apache_store(path):
            segment_sizes(path)
    except ApacheStoreError as e:
        raise ConfigError(f"option 'path': {e}") from None
    holder = _posix_lock_holder(os.path.join(path, "lock"))
    if holder is not None:
        raise ConfigError(
            f"option 'path': store directory {path} is in use by another process (pid {holder}), such "
            f"as an Apache RocketMQ broker, which holds the POSIX lock on {os.path.join(path, 'lock')}; "
            "one broker owns a store at a time: stop it, or read and write its cluster with option "
            "'namesrvAddr'"
        )


def ensure_broker(
    path: str,
    flags: tuple[tuple[str, str], ...] = (),
    idle_exit_s: float = 30.0,
    credentials: dict[str, str | None] | None = None,
    create: bool = True,
) -> str:
    """The endpoint of a live broker on store ``path``, starting one if needed (on a directory
    that does not exist only when ``create``: a sink's or a stream's, never a batch read's;
    ``credentials``: how to sign the calls that check it answers)."""
    root = os.path.realpath(path)
    with _known_lock:
        ep = _known.get(root)
    if ep is not None and _answers(ep, root, credentials):
        return ep
    check_store_path(path, create)
    check_servable_store(path)  # before anything is written in it
    os.makedirs(root, exist_ok=True)
    fd = os.open(os.path.join(root, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        rec = read_record(root)
        if rec is not None and _answers(rec.endpoint, root, credentials):
            ep = rec.endpoint
        else:
            ep = _start(root, flags, idle_exit_s).endpoint
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    with _known_lock:
        _known[root] = ep
    return ep


def _start(root: str, flags: tuple[tuple[str, str], ...], idle_exit_s: float) -> BrokerRecord:
    cmd = [
        sys.executable,
        "-m",
        BROKER_MODULE,
        "--store",
        root,
        "--listen",
        "127.0.0.1:0",
        "--idle-exit-s",
        f"{idle_exit_s:g}",
    ]
    for flag, value in flags:
        cmd += [f"--{flag}", value]
    log_path = os.path.join(root, LOG_FILE)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            cwd=root,
        )
    # reap it when it exits while this process lives (no zombie); init adopts it otherwise
    threading.Thread(target=proc.wait, name=f"rmq-embedded-reaper-{proc.pid}", daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        text = _read_text(log_path)
        m = READY.search(text)
        if m:
            rec = BrokerRecord(m.group(1), proc.pid, int(time.time() * 1000))
            _write_record(root, rec)
            return rec
        if proc.poll() is not None:
            raise EmbeddedBrokerError(
                f"the embedded broker for {root} exited with code {proc.returncode}: {_tail(text)}"
            )
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    raise EmbeddedBrokerError(
        f"the embedded broker for {root} did not start in {START_TIMEOUT_S:.0f}s: {_tail(_read_text(log_path))}"
    )


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:]) or "(no output)"


def stop_broker(path: str, timeout_s: float = 15.0) -> bool:
    """Stop the embedded broker of ``path`` (SIGTERM, then SIGKILL); True if one was running."""
    root = os.path.realpath(path)
    rec = read_record(root)
    with _known_lock:
        _known.pop(root, None)
    if rec is None or not pid_alive(rec.pid) or not _is_broker(rec.pid, root):
        return False
    os.kill(rec.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and pid_alive(rec.pid):
        time.sleep(0.05)
    if pid_alive(rec.pid):
        os.kill(rec.pid, signal.SIGKILL)
    return True


def _is_broker(pid: int, root: str) -> bool:
    """Is ``pid`` the broker of ``root`` (and not another process that got its pid)?"""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode("utf-8", errors="replace").split("\0")
    except OSError:
        return True  # no /proc: trust the record
    return BROKER_MODULE in args and root in args


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def endpoint_of(connection) -> str:  # type: ignore[no-untyped-def]
    """The broker endpoint for a :class:`rmq_spark.datasource.options.Connection`."""
    if connection.endpoints:
        return str(connection.endpoints).split(",")[0].strip()
    return ensure_broker(
        connection.path,
        connection.broker_flags,
        connection.idle_exit_s,
        connection.credentials,
        getattr(connection, "create_store", True),
    )


def broker_endpoint(ctx) -> str:  # type: ignore[no-untyped-def]
    """The broker an executor asks (PullMessage, bulk read) for a planned range's
    :class:`~rmq_spark.datasource.read.partition.ReadContext`.  An embedded broker listens on
    127.0.0.1 of the driver's machine: it is found (or started again) through the store there,
    never on another machine."""
    conn = ctx.connection
    if conn.endpoints:
        return str(conn.endpoints).split(",")[0].strip()
    if ctx.store_host is not None and ctx.store_host != socket.gethostname():
        raise StoreError(
            f"the embedded broker of {conn.path} runs on {ctx.store_host}, not on "
            f"{socket.gethostname()}: on a cluster, start rmq-broker and pass option 'endpoints'"
        )
    return endpoint_of(conn)


def client_for(connection) -> InternalClient:  # type: ignore[no-untyped-def]
    """A client of the connection's broker, signing its calls with the connection's keys; for a
    batch read of a store Apache RocketMQ wrote, the offline planner over its files instead."""
    if (
        connection.endpoints is None
        and connection.path is not None
        and not getattr(connection, "create_store", True)
    ):
        from rmq_spark.store.apache import is_apache_store

        if is_apache_store(connection.path):
            from rmq_spark.datasource.read.offline import OfflineClient

            return OfflineClient(connection.path)  # type: ignore[return-value]
    return InternalClient(endpoint_of(connection), **connection.credentials)


T = TypeVar("T")


class BrokerLink:
    """A lazily opened client for a Connection; picklable (the channel is not).  In embedded
    mode a broker that went away (it exits when idle) is started again, once per call."""

    def __init__(self, connection) -> None:  # type: ignore[no-untyped-def]
        self.connection = connection
        self._client: InternalClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"connection": self.connection, "_client": None}

    @property
    def embedded(self) -> bool:
        return self.connection.endpoints is None and self.connection.path is not None

    def call(self, fn: Callable[[InternalClient], T]) -> T:
        for attempt in (0, 1):
            if self._client is None:
                self._client = client_for(self.connection)
            try:
                return fn(self._client)
            except BrokerUnavailableError:
                self.close()
                if attempt == 1 or not self.embedded:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
