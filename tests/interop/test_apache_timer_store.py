"""Timer messages across the two brokers' stores, both ways, against a real Apache RocketMQ 5.5.0
(issue 29, item 2): a timer message delivered before the stop is never delivered again by the
other broker, and one still pending is delivered by it exactly once, at its time.

- rmq-broker -> Apache: rmq-broker's store (:class:`MessageStore` + :class:`TimerService` on the
  real clock) takes a timer message due in 2 s and one due in 20 s, delivers the first, and stops
  cleanly, or crashes (no final checkpoint, as kill -9) once a checkpoint counts the delivery.
  Apache starts on the store; then a marker timer message is sent to Apache, due after the second
  one: Apache delivers slots in time order, so once the marker is in its topic, any second
  delivery Apache would make has been made.
- Apache -> rmq-broker: Apache takes the same two messages, delivers the first, and is stopped
  with SIGTERM, or SIGKILLed once its ``config/timercheck`` counts the delivery (Apache itself
  loses up to a second of progress otherwise: at least once).  rmq-broker's store and timer open
  the store and deliver the second message once, at its time.

Every wait is on a condition (a topic's count, a checkpoint's field) with a generous deadline.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from _apache import ApacheRocketMQ, remoting_request
from _apache_store import create_topic, send_one, start_broker

from rmq_spark.remoting.client import RemotingClient
from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.timer.service import TimerService
from rmq_spark.store import layout as L
from rmq_spark.store import timerfiles
from rmq_spark.store.clock import SystemClock
from rmq_spark.store.message import Message
from rmq_spark.store.store import MessageStore, StoreConfig

TOPIC = "TimerMoveT"
SEGMENT = 1 << 20
STORE = {"commitlog_segment_bytes": SEGMENT, "cq_segment_units": 1000}
GET_MAX_OFFSET = 30
DEADLINE_S = 120.0


def wait_for(what: str, cond: Callable[[], object], timeout_s: float = DEADLINE_S) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout_s}s")
        time.sleep(0.1)


def delivered(store_dir: Path) -> Counter[str]:
    """How many times each UNIQ_KEY is in ``TOPIC`` queue 0 (read offline)."""
    with MessageStore(str(store_dir), StoreConfig(**STORE), start_services=False) as s:
        got = s.get_messages(TOPIC, 0, 0, max_msgs=1000).messages
        return Counter(m.uniq_key for m in got)


def apache_count(addr: str) -> int:
    header, _ = remoting_request(addr, GET_MAX_OFFSET, {"topic": TOPIC, "queueId": "0"})
    return int(header.get("extFields", {}).get("offset", 0)) if header.get("code") == 0 else 0


def read_time(root: Path) -> int:
    """``lastReadTimeMs`` of the store's timer checkpoint (0 without one)."""
    check = timerfiles.read_check(str(root))
    return check.last_read_ms if check is not None else 0


def timer_message(uniq: str, due_ms: int) -> dict[str, str]:
    return {"UNIQ_KEY": uniq, "TIMER_DELIVER_MS": str(due_ms), "TAGS": "Timer", "WAIT": "true"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("apache-timer")
    conf = {"mappedFileSizeCommitLog": str(SEGMENT), "mappedFileSizeConsumeQueue": str(1000 * 20)}
    c = ApacheRocketMQ(work, brokers=(), broker_config=conf)
    c.start()
    try:
        yield c, work
    finally:
        c.close()


# --- rmq-broker -> Apache -------------------------------------------------------------------------
def _rmq_writes(root: Path, *, crash: bool) -> tuple[str, str, int]:
    """rmq-broker's store with a delivered timer message and a pending one; returns their ids and
    the pending one's time."""
    cfg = BrokerConfig(store=StoreConfig(**STORE), broker_name="rmq")
    clock = SystemClock()
    store = MessageStore(str(root), cfg.store, clock=clock)
    svc = TimerService(store, cfg, clock, checkpoint_interval_ms=200)
    svc.start()
    now = clock.now_ms()
    due_b = now + 20_000
    two = ((b"early", "E" * 32, now + 2000), (b"late", "F" * 32, due_b))
    msgs = [svc.transform(Message(TOPIC, b, timer_message(uniq, due))) for b, uniq, due in two]
    assert store.put_messages(msgs).ok
    wait_for("rmq-broker delivers the early message", lambda: store.max_offset(TOPIC, 0) == 1)
    if crash:
        # a checkpoint counts the delivery (every 200 ms): a crash after it loses nothing
        wait_for("a checkpoint after the delivery", lambda: read_time(root) > now + 1000)
        svc.crash()
        store.crash()
    else:
        svc.shutdown()
        store.shutdown()
    return "E" * 32, "F" * 32, due_b


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "crashed"])
def test_apache_resumes_rmq_brokers_timer(cluster, crash: bool) -> None:
    c, work = cluster
    name = f"r2a-{'crash' if crash else 'clean'}"
    store = work / name / "store"
    early, late, due_late = _rmq_writes(store, crash=crash)
    assert delivered(store) == Counter({early: 1})
    start_broker(c, name)
    addr = c.broker_addr(name)
    create_topic(addr, TOPIC, 1)
    marker = "A" * 32
    with RemotingClient(addr, 10.0) as client:
        due_marker = max(due_late, int(time.time() * 1000)) + 2000
        send_one(client, TOPIC, 0, b"marker", timer_message(marker, due_marker))
    wait_for("Apache delivers the marker", lambda: apache_count(addr) >= 3, timeout_s=DEADLINE_S)
    c.stop_broker(name)
    got = delivered(store)
    assert got == Counter({early: 1, late: 1, marker: 1}), got
    # Apache read rmq-broker's checkpoint (its store log names the file it found)
    logs = "".join(p.read_text(errors="replace") for p in (work / "home" / "logs").rglob("*.log"))
    assert f"timer checkpoint file exists, {store / 'config' / 'timercheck'}" in logs


# --- Apache -> rmq-broker -------------------------------------------------------------------------
@pytest.mark.parametrize("kill", [False, True], ids=["clean", "killed"])
def test_rmq_broker_resumes_apaches_timer(cluster, kill: bool) -> None:
    c, work = cluster
    name = f"a2r-{'kill' if kill else 'clean'}"
    store = work / name / "store"
    start_broker(c, name)
    addr = c.broker_addr(name)
    create_topic(addr, TOPIC, 1)
    now = int(time.time() * 1000)
    early, late = "E" * 32, "F" * 32
    due_late = now + 45_000  # Apache's SIGTERM shutdown alone takes some 11 s
    with RemotingClient(addr, 10.0) as client:
        send_one(client, TOPIC, 0, b"early", timer_message(early, now + 2000))
        send_one(client, TOPIC, 0, b"late", timer_message(late, due_late))
    wait_for("Apache delivers the early message", lambda: apache_count(addr) >= 1)
    # Apache's own checkpoint (flushed every second) counts the delivery before the stop
    wait_for("Apache's checkpoint after the delivery", lambda: read_time(store) > now + 2000)
    c.stop_broker(name, kill=kill)
    assert time.time() * 1000 < due_late, "the late one came due before Apache stopped (slow)"
    cfg = BrokerConfig(store=StoreConfig(**STORE), broker_name=name)
    clock = SystemClock()
    s = MessageStore(str(store), cfg.store, clock=clock)
    try:
        svc = TimerService(s, cfg, clock, checkpoint_interval_ms=200)
        assert svc.pending_count == 1  # the late one, from Apache's timerlog
        svc.start()
        wait_for("rmq-broker delivers the late message", lambda: s.max_offset(TOPIC, 0) >= 2)
        assert clock.now_ms() >= due_late // 1000 * 1000
        svc.shutdown()
    finally:
        s.shutdown()
    got = delivered(store)
    assert got == Counter({early: 1, late: 1}), got
    props = {}
    with MessageStore(str(store), StoreConfig(**STORE), start_services=False) as s2:
        for m in s2.get_messages(TOPIC, 0, 0, max_msgs=10).messages:
            props[m.uniq_key] = m.properties
    assert props[late].get(L.P_REAL_TOPIC) == TOPIC
