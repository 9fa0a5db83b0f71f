"""One hostile client per availability class of issue 28 (15-19) beside a normal remoting client:
shared by ``tests/remoting/test_remoting_load.py`` (correctness: every request answered, nothing
lost, the broker alive) and ``bench/remoting_hostile_bench.py`` (the normal client's latency).

A broker is an ``rmq-broker`` process (``--flush sync``, remoting and NameServer on free ports, a
temporary store).  The normal client runs in a process of its own (so the hostile client's Python
work cannot delay it): on persistent connections, like a real client, it sends (SEND_MESSAGE_V2),
pulls what it sent (PULL_MESSAGE, no long poll) and looks up its route on the NameServer, timing
each request and checking each answer.  The classes:

- ``sql92``: pulls whose SQL92 subscription is 1 MiB (valid and not), one after another;
- ``heartbeat_groups``: HEART_BEATs that each name 1,000 new consumer groups;
- ``parked_polls``: 5,000 long polls parked on an empty queue, expiring together;
- ``pipelined_sends``: sync-flush sends of 256 KiB written back to back, answers read only after;
- ``register_compressed``: REGISTER_BROKER with ``compressed=true`` and 1 MiB of deflate;
- ``idle_connections``: 3,000 connections opened as fast as they are accepted, then left idle.

Every hostile client is bounded by a request count (and a time limit, a safety net only).
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import resource
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import _raw

from rmq_spark.broker.testing import BrokerProcess

NORMAL_TOPIC, PARK_TOPIC, FLOOD_TOPIC = "LoadNormal", "LoadPark", "LoadFlood"
NORMAL_GROUP = "load-normal"
KINDS = ("send", "pull", "route")
PULL_NO_NEW = 19  # PULL_NOT_FOUND: nothing new at that offset (a normal answer to a pull)


# --- the broker ---------------------------------------------------------------------------------------
def start_broker(workdir: str) -> BrokerProcess:
    """An rmq-broker (sync flush) with the topics of the normal and hostile clients."""
    b = BrokerProcess(
        os.path.join(workdir, "store"),
        "--flush",
        "sync",
        "--read-workers",
        "0",
        log_path=os.path.join(workdir, "broker.log"),
    )
    try:
        for t in (NORMAL_TOPIC, PARK_TOPIC, FLOOD_TOPIC):
            a = _raw.call(
                b.remoting_endpoint,
                17,
                {"topic": t, "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"},
                timeout_s=30,
            )
            if a.code != 0:
                raise RuntimeError(f"creating {t}: code {a.code} {a.remark}")
    except BaseException:
        b.stop()
        raise
    return b


# --- the normal client (in a process of its own) ------------------------------------------------------
def normal_client(broker: str, namesrv: str, conn: Any, timeout_s: float, pause_s: float) -> None:
    """Sends, pulls and looks up routes until told to stop, each request answered within
    ``timeout_s``; the parent sends a phase name to switch phase, "stop" to end.  Sends back
    ``(samples, errors, sent, read)``: samples ``(kind, phase, ms)``, the requests not answered
    with their normal answer, the bodies acknowledged and the bodies its pulls read back."""
    phase = "warmup"
    samples: list[tuple[str, str, float]] = []
    errors: list[str] = []
    sent: list[bytes] = []
    read: list[bytes] = []
    b = _raw.RawConnection(broker, timeout_s)
    n = _raw.RawConnection(namesrv, timeout_s)
    offset = 0
    i = 0

    def pull() -> Any:
        nonlocal offset
        a = b.call(
            11, _raw.pull_header(NORMAL_TOPIC, 0, offset, group=NORMAL_GROUP), timeout_s=timeout_s
        )
        if a.code == 0:
            read.extend(r.body for r in _raw.decode_records(a.body))
            offset = int(a.ext["nextBeginOffset"])
        return a

    try:
        while True:
            if conn.poll():
                msg = conn.recv()
                if msg == "stop":
                    break
                phase = msg
            for kind in KINDS:
                t0 = time.perf_counter()
                try:
                    if kind == "send":
                        body = b"normal %d" % i
                        a = b.call(
                            310,
                            _raw.send_v2_header(NORMAL_TOPIC, 0, {"KEYS": f"n{i}"}),
                            body,
                            timeout_s=timeout_s,
                        )
                        if a.code == 0:
                            sent.append(body)
                    elif kind == "pull":
                        a = pull()
                    else:
                        a = n.call(105, {"topic": NORMAL_TOPIC}, timeout_s=timeout_s)
                        if a.code == 0 and f'"{broker}"' not in a.body.decode("utf-8", "replace"):
                            errors.append(
                                f"{phase} route: the broker is not in the route: {a.body[:200]!r}"
                            )
                    ms = (time.perf_counter() - t0) * 1000
                    ok = (0, PULL_NO_NEW) if kind == "pull" else (0,)
                    if a.code not in ok:
                        errors.append(f"{phase} {kind}: code {a.code} {a.remark}")
                except (OSError, ValueError) as e:
                    ms = (time.perf_counter() - t0) * 1000
                    errors.append(f"{phase} {kind}: {type(e).__name__} {e}")
                    b.close()
                    n.close()
                    b = _raw.RawConnection(broker, timeout_s)
                    n = _raw.RawConnection(namesrv, timeout_s)
                samples.append((kind, phase, ms))
            i += 1
            time.sleep(pause_s)
        # read back what is left of the acknowledged sends
        for _ in range(len(sent) // 32 + 2):
            if len(read) >= len(sent):
                break
            pull()
    except (OSError, ValueError) as e:
        errors.append(f"read back: {type(e).__name__} {e}")
    finally:
        b.close()
        n.close()
        conn.send((samples, errors, sent, read))


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * 0.99))]


def sent_by_normal(broker: Any) -> int:
    """How many sends the normal client has made (one a round): its queue's max offset."""
    a = _raw.call(
        broker.remoting_endpoint, 30, {"topic": NORMAL_TOPIC, "queueId": "0"}, timeout_s=30
    )
    return int(a.ext["offset"]) if a.code == 0 else 0


def normal_rounds(broker: Any, n: int, pause_s: float, limit_s: float = 60.0) -> None:
    """Until the normal client has made ``n`` more rounds (or ``limit_s`` passed: a frozen broker
    shows in the samples)."""
    deadline = time.monotonic() + limit_s
    try:
        target = sent_by_normal(broker) + n
        while sent_by_normal(broker) < target and time.monotonic() < deadline:
            time.sleep(pause_s)
    except (OSError, ValueError):
        pass


# --- the hostile clients ------------------------------------------------------------------------------
@dataclass
class Load:
    """What a hostile client is allowed to do and what it got back."""

    count: int  # requests (or connections) at most
    seconds: float  # a safety net: stop after this long
    hold: Callable[[], None]  # called while idle connections are held open
    stop: threading.Event = field(default_factory=threading.Event)
    answers: collections.Counter[int] = field(default_factory=collections.Counter)
    remarks: dict[int, str] = field(default_factory=dict)
    made: int = 0

    def note(self, frame: Any) -> None:
        self.answers[frame.code] += 1
        self.remarks.setdefault(frame.code, frame.remark or "")

    def going(self, until: float) -> bool:
        return not self.stop.is_set() and self.made < self.count and time.monotonic() < until


def _sql(n: int, valid: bool) -> str:
    if valid:
        unit = "(a = 1 OR b > 2) AND "
        return unit * (n // len(unit)) + "c IS NOT NULL"
    return "a = 1 AND (" * (n // 11)


def hostile_sql92(broker: Any, load: Load) -> None:
    """Pulls with a 1 MiB SQL92 subscription, valid and not, one after another (each answer read)."""
    frames = [
        _raw.request(
            11,
            _raw.pull_header(
                PARK_TOPIC,
                0,
                0,
                group="load-sql",
                expression=_sql(1 << 20, v),
                expression_type="SQL92",
            ),
            opaque=k + 1,
        )
        for k, v in enumerate((True, False))
    ]
    until = time.monotonic() + load.seconds
    with _raw.RawConnection(broker.remoting_endpoint, 120) as c:
        while load.going(until):
            c.send(frames[load.made % 2])
            try:
                load.note(c.answer(load.made % 2 + 1, 120))
            except (OSError, ValueError):
                break
            load.made += 1


def hostile_heartbeat_groups(broker: Any, load: Load) -> None:
    """HEART_BEATs each naming 1,000 consumer groups never seen before."""
    until = time.monotonic() + load.seconds
    with _raw.RawConnection(broker.remoting_endpoint, 120) as c:
        while load.going(until):
            h = load.made
            groups = [
                {
                    "groupName": f"load-hb-{h}-{g}",
                    "consumeType": "CONSUME_PASSIVELY",
                    "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                    "unitMode": False,
                    "subscriptionDataSet": [
                        {
                            "topic": NORMAL_TOPIC,
                            "subString": "*",
                            "expressionType": "TAG",
                            "subVersion": 0,
                        }
                    ],
                }
                for g in range(1000)
            ]
            body = json.dumps(
                {
                    "clientID": f"load-hb-client-{h}",
                    "producerDataSet": [],
                    "consumerDataSet": groups,
                }
            ).encode()
            try:
                load.note(c.call(34, {}, body, timeout_s=120))
            except (OSError, ValueError):
                break
            load.made += 1


PARK_CONNECTIONS = 10


def hostile_parked_polls(broker: Any, load: Load) -> None:
    """``count`` long polls on an empty queue over 10 connections, all expiring 3 s from now
    (then every answer is read: each poll expires, or is refused at once)."""
    conns = [_raw.RawConnection(broker.remoting_endpoint, 30) for _ in range(PARK_CONNECTIONS)]
    per = load.count // PARK_CONNECTIONS
    try:
        for c in conns:
            c.send(
                b"".join(
                    _raw.request(
                        11,
                        _raw.pull_header(PARK_TOPIC, 0, 0, group="load-park", suspend_ms=3000),
                        opaque=j + 1,
                    )
                    for j in range(per)
                )
            )
        deadline = time.monotonic() + max(30.0, load.seconds)
        for c in conns:
            for _ in range(per):
                if load.stop.is_set() or time.monotonic() > deadline:
                    return
                try:
                    load.note(c.read_frame(max(0.1, deadline - time.monotonic())))
                except (OSError, ValueError):
                    break
                load.made += 1
    finally:
        for c in conns:
            c.close()


def hostile_pipelined_sends(broker: Any, load: Load) -> None:
    """Sync-flush sends of 256 KiB written back to back, no answer read while writing; then the
    answers are read (the broker answers each: stored, or SYSTEM_BUSY)."""
    body = os.urandom(256 << 10)
    frame = _raw.request(310, _raw.send_v2_header(FLOOD_TOPIC, 0, {"KEYS": "flood"}), body)
    c = _raw.RawConnection(broker.remoting_endpoint, 5)
    s = c.sock
    s.settimeout(None)  # a broker that stops reading us blocks this send: the timer ends it
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    timer = threading.Timer(load.seconds, lambda: s.shutdown(socket.SHUT_RDWR))
    timer.start()
    written = 0
    try:
        until = time.monotonic() + load.seconds
        while not load.stop.is_set() and written < load.count and time.monotonic() < until:
            try:
                s.sendall(frame)
            except OSError:
                break
            written += 1
        deadline = time.monotonic() + max(60.0, load.seconds)
        while load.made < written and time.monotonic() < deadline and not load.stop.is_set():
            try:
                load.note(c.read_frame(max(0.1, deadline - time.monotonic())))
            except (OSError, ValueError):
                break
            load.made += 1
    finally:
        timer.cancel()
        c.close()


_BOMB: list[bytes] = []


def register_bomb() -> bytes:
    """About 1 MiB of zlib (about 1 GiB of zeros inflated), a valid stream made in 0.1 s: after a
    full flush deflate forgets its history, so each further MiB of zeros compresses to the same
    bytes; the trailer is the Adler-32 of N zero bytes, ``(N % 65521) << 16 | 1``."""
    if not _BOMB:
        block = bytes(1 << 20)
        c = zlib.compressobj(9)
        head = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
        again = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
        end = c.flush()[:-4]  # the final (empty) block, then our own trailer
        n = 1 + ((1 << 20) - len(head)) // len(again) + 1
        total = (1 + n) << 20
        _BOMB.append(head + again * n + end + struct.pack(">I", (total % 65521) << 16 | 1))
    return _BOMB[0]


def hostile_register_compressed(broker: Any, load: Load) -> None:
    """REGISTER_BROKER with compressed=true and ~1 MiB of deflate."""
    body = register_bomb()
    header = {
        "brokerName": "load-fake",
        "brokerAddr": "127.0.0.1:1",
        "clusterName": "LoadCluster",
        "haServerAddr": "127.0.0.1:1",
        "brokerId": "0",
        "heartbeatTimeoutMillis": "30000",
        "enableActingMaster": "false",
        "compressed": "true",
        "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF),
    }
    until = time.monotonic() + load.seconds
    with _raw.RawConnection(broker.namesrv_endpoint, 120) as c:
        while load.going(until):
            try:
                load.note(c.call(103, header, body, timeout_s=120))
            except (OSError, ValueError):
                break
            load.made += 1


def hostile_idle_connections(broker: Any, load: Load) -> None:
    """``count`` connections opened (as fast as they are accepted), held idle during ``hold()``."""
    need = load.count + 512  # the broker's ends are in its own process
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(
            resource.RLIMIT_NOFILE,
            (min(need, hard) if hard != resource.RLIM_INFINITY else need, hard),
        )
    socks = []
    try:
        while not load.stop.is_set() and len(socks) < load.count:
            try:
                socks.append(socket.create_connection(_addr(broker.remoting_endpoint), timeout=5))
            except OSError:
                break  # refused past a connection limit: that is allowed
        load.made = len(socks)
        load.hold()
    finally:
        for s in socks:
            s.close()


def _addr(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


HOSTILE: dict[str, Callable[[Any, Load], None]] = {
    "sql92": hostile_sql92,
    "heartbeat_groups": hostile_heartbeat_groups,
    "parked_polls": hostile_parked_polls,
    "pipelined_sends": hostile_pipelined_sends,
    "register_compressed": hostile_register_compressed,
    "idle_connections": hostile_idle_connections,
}


# --- one run: the normal client's baseline, then beside the hostile client ------------------------------
@dataclass
class Run:
    kind: str
    load: Load
    hostile_s: float
    samples: list[tuple[str, str, float]]
    errors: list[str]
    sent: list[bytes]
    read: list[bytes]

    def ms(self, phase: str, kind: str | None = None) -> list[float]:
        return [ms for k, p, ms in self.samples if p == phase and kind in (None, k)]


def run_class(
    broker: Any,
    kind: str,
    *,
    count: int,
    seconds: float,
    timeout_s: float,
    pause_s: float,
    baseline_rounds: int,
    after_rounds: int,
    hold_rounds: int,
) -> Run:
    """The normal client (its own process) makes ``baseline_rounds`` rounds alone, then runs
    beside the hostile client ``kind`` (bounded by ``count`` and ``seconds``) and for
    ``after_rounds`` rounds after it stops; idle connections are held ``hold_rounds`` rounds."""
    if kind == "register_compressed":
        register_bomb()  # made before anything is timed
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(
        target=normal_client,
        args=(broker.remoting_endpoint, broker.namesrv_endpoint, child, timeout_s, pause_s),
        daemon=True,
    )
    proc.start()
    load = Load(count, seconds, lambda: normal_rounds(broker, hold_rounds, pause_s))
    try:
        _wait_for_rounds(proc, broker, pause_s)
        parent.send("baseline")
        normal_rounds(broker, baseline_rounds, pause_s)
        parent.send("hostile")
        hostile = threading.Thread(target=HOSTILE[kind], args=(broker, load), daemon=True)
        t0 = time.monotonic()
        hostile.start()
        hostile.join(seconds + 60)
        load.stop.set()
        hostile.join(
            5
        )  # a client still blocked on its answer is a daemon; the broker's stop ends it
        hostile_s = time.monotonic() - t0
        normal_rounds(broker, after_rounds, pause_s)  # requests queued behind the hostile load
        parent.send("stop")
        if not parent.poll(120):
            raise AssertionError("the normal client did not report")
        samples, errors, sent, read = parent.recv()
    finally:
        load.stop.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    return Run(kind, load, hostile_s, samples, errors, sent, read)


def _wait_for_rounds(proc: Any, broker: Any, pause_s: float) -> None:
    """Until the normal client is connected and running."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not proc.is_alive():
            raise AssertionError("the normal client died")
        if sent_by_normal(broker) >= 3:
            return
        time.sleep(pause_s)
    raise AssertionError("the normal client made no send in 60 s")
