"""Transactional, retried and dead-lettered messages carried by the store from one broker to the
other, both ways, against a real Apache RocketMQ 5.5.0 (issue 29, item 4).

Each direction runs one workload on the writing broker over the remoting protocol
(:class:`~rmq_spark.cluster.ClusterClient`), stops it cleanly, and starts the other broker on the
same store directory:

- three half messages of producer group ``PGROUP``: one committed, one rolled back, one left
  pending (its producer gone without an answer);
- two plain messages of the topic that consumer group ``GROUP`` sends back: one with delay level 5
  (1 minute: it waits in ``SCHEDULE_TOPIC_XXXX`` for ``%RETRY%GROUP`` when the writer stops), one
  with delay level -1 (straight to ``%DLQ%GROUP``);
- ``GROUP``'s committed offset of the topic's queue.

The opening broker must then: check the pending half back with a new producer of the group (whose
answer, COMMIT, puts it in the topic once), never check the ended halves (it reads the other's op
queue), deliver the committed one once and the rolled-back one never; deliver the retry to
``%RETRY%GROUP`` once, at its time; keep the DLQ message readable; answer the group's offset.
What each broker stored is read back from the files once both stopped
(:class:`~rmq_spark.store.reader.StoreReader`).

And rmq-broker killed with SIGKILL in the middle of a loop of every kind of message
(:class:`EveryKind`: batches, tags, keys, a compressed body, delay levels 1 and 4, timer
messages, messages retried and dead-lettered, committed, rolled-back and pending halves): Apache
opens its store, checks the halves back, delivers the delayed and timer messages and the retries,
and the Java client reads every message rmq-broker acknowledged (topic, retry and DLQ topics)
through Apache once, with the id and queue offset rmq-broker answered, its body and properties.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timezone
from pathlib import Path

import pytest
from _apache import ApacheRocketMQ
from _apache_store import (
    RMQ_QUICK_CHECKS,
    EveryKind,
    answering_checks,
    check_every_kind,
    cluster_client,
    end_half,
    java_read_all,
    send_back,
    start_broker,
    wait_until,
)
from _java import JavaPrograms

from rmq_spark.broker.testing import BrokerProcess
from rmq_spark.cluster import ClusterClient
from rmq_spark.cluster.wire import TRANSACTION_PREPARED_TYPE
from rmq_spark.store.reader import StoreReader

REPO = Path(__file__).resolve().parents[2]
TOPIC = "DirectionT"
KILLED_TOPIC = "DirectionKilledT"
KILLED_PGROUP = "DirectionKilledPG"
GROUP = "DirectionG"
PGROUP = "DirectionPG"
RETRY = f"%RETRY%{GROUP}"
DLQ = f"%DLQ%{GROUP}"
RETRY_LEVEL = 5  # 1 minute, Apache's and rmq-broker's default levels
RETRY_DELAY_MS = 60_000
SEGMENT = 64 * 1024 * 1024  # the harness's mappedFileSizeCommitLog
# a half nobody answers is checked again and again (Apache puts it back each time): never
# dropped here
APACHE_CONFIG = {"transactionCheckMax": "100000"}
READY = re.compile(r"rmq-broker listening on \S+ store=\S+ remoting=(\S+) namesrv=(\S+)")
WAIT_S = float(os.environ.get("RMQ_APACHE_START_TIMEOUT_S", "60")) * 3


@dataclass
class Workload:
    """What the writer stored: UNIQ_KEYs by role, when the retry was sent back."""

    committed: str = ""
    rolled_back: str = ""
    pending: str = ""
    retried: str = ""
    dead: str = ""
    sent_back_ms: int = 0
    checked: list[str] = field(default_factory=list)  # halves the opener asked about


class RmqBroker:
    """``python -m rmq_spark.broker`` on a store: its remoting and NameServer addresses."""

    def __init__(self, store: Path, *flags: str) -> None:
        self.log = store.parent / f"rmq-broker-{time.monotonic_ns()}.log"
        cmd = [
            sys.executable,
            "-m",
            "rmq_spark.broker",
            "--store",
            str(store),
            "--listen",
            "127.0.0.1:0",
            "--commitlog-segment-bytes",
            str(SEGMENT),
            *flags,
        ]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO
            )
        deadline = time.monotonic() + WAIT_S
        while True:
            m = READY.search(self.log.read_text(errors="replace"))
            if m:
                self.addr, self.namesrv = m.group(1), m.group(2)
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"rmq-broker did not start:\n{tail}")
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM (a clean stop), then SIGKILL if it hangs; the exit code must be 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        assert code == 0, self.log.read_text(errors="replace")[-3000:]


def _half(client: ClusterClient, b: str, uniq: str):  # type: ignore[no-untyped-def]
    r = client.send_message(
        b,
        PGROUP,
        TOPIC,
        0,
        f"half {uniq}".encode(),
        {"TRAN_MSG": "true", "PGROUP": PGROUP, "UNIQ_KEY": uniq, "WAIT": "true"},
        sys_flag=TRANSACTION_PREPARED_TYPE,
        queue_nums=1,
    )
    assert r.status == "SEND_OK"
    return r


def write(namesrv: str, b: str) -> Workload:
    """The workload on the writing broker at ``b`` (``host:port``)."""
    salt = os.urandom(5).hex().upper()
    w = Workload(*(f"{salt}{role}".rjust(32, "0") for role in ("C0", "B0", "P0", "E0", "D0")))
    with cluster_client(namesrv, b) as client:
        client.create_topic(b, TOPIC, 1)
        committed, rolled_back, _pending = (
            _half(client, b, u) for u in (w.committed, w.rolled_back, w.pending)
        )
        end_half(client, b, PGROUP, committed, True)
        end_half(client, b, PGROUP, rolled_back, False)
        wait_until(
            "the committed half in the topic",
            lambda: client.get_max_offset(b, TOPIC, 0) == 1,
            WAIT_S,
        )
        retried, dead = (
            client.send_message(
                b,
                "DirectionPlain",
                TOPIC,
                0,
                f"plain {u}".encode(),
                {"UNIQ_KEY": u, "WAIT": "true"},
                queue_nums=1,
            )
            for u in (w.retried, w.dead)
        )
        w.sent_back_ms = int(time.time() * 1000)
        send_back(client, b, GROUP, TOPIC, retried, RETRY_LEVEL)
        send_back(client, b, GROUP, TOPIC, dead, -1)
        client.update_consumer_offset(b, GROUP, TOPIC, 0, 3)
        assert client.query_consumer_offset(b, GROUP, TOPIC, 0) == 3
        wait_until(
            "the retry waiting in SCHEDULE_TOPIC_XXXX",
            lambda: client.get_max_offset(b, "SCHEDULE_TOPIC_XXXX", RETRY_LEVEL - 1) >= 1,
            WAIT_S,
        )
        wait_until(
            "the dead letter in %DLQ%", lambda: client.get_max_offset(b, DLQ, 0) >= 1, WAIT_S
        )
        assert client.get_max_offset(b, TOPIC, 0) == 3  # the committed one and the two plain ones
    came_due = w.sent_back_ms + RETRY_DELAY_MS - 5_000
    assert int(time.time() * 1000) < came_due, "too slow: the retry came due before the stop"
    return w


def open_and_check(namesrv: str, b: str, w: Workload) -> None:
    """On the opening broker at ``b``: a new producer of the group answers COMMIT to every check."""
    with answering_checks(namesrv, b, PGROUP, lambda _uniq: True) as (client, checked):
        # the group's offset carried over
        assert client.query_consumer_offset(b, GROUP, TOPIC, 0) == 3
        wait_until(
            "the pending half committed by the check-back",
            lambda: client.get_max_offset(b, TOPIC, 0) >= 4,
            WAIT_S,
        )
        wait_until(
            "the retry delivered to %RETRY%",
            lambda: client.get_max_offset(b, RETRY, 0) >= 1,
            RETRY_DELAY_MS / 1000 + WAIT_S,
        )
        assert client.get_max_offset(b, DLQ, 0) == 1
        client.heartbeat(b, producer_groups=[PGROUP])
    w.checked += checked


def _stored(store: Path, topic: str) -> list[dict]:
    r = StoreReader(str(store))
    try:
        out = []
        for q in r.queue_ids(topic):
            for batch in r.read_chunks(topic, q, r.min_offset(topic, q), r.max_offset(topic, q)):
                out += batch.to_pylist()
        return out
    finally:
        r.close()


def check_store(store: Path, w: Workload) -> None:
    in_topic = Counter(r["msgId"] for r in _stored(store, TOPIC))
    assert in_topic == Counter({w.committed: 1, w.pending: 1, w.retried: 1, w.dead: 1}), in_topic
    retry = _stored(store, RETRY)
    assert [dict(r["properties"]).get("UNIQ_KEY") for r in retry] == [w.retried]
    stored = retry[0]["storeTimestamp"]
    stored_ms = stored.replace(tzinfo=stored.tzinfo or timezone.utc).timestamp() * 1000
    due_ms = w.sent_back_ms + RETRY_DELAY_MS - 1_000  # its time (1 s for the level's rounding)
    early = due_ms - stored_ms
    assert stored_ms >= due_ms, f"the retry was delivered {early:.0f} ms before its time"
    assert [dict(r["properties"]).get("UNIQ_KEY") for r in _stored(store, DLQ)] == [w.dead]
    # only the pending half was checked back: the ended ones never asked about
    assert w.checked and set(w.checked) == {w.pending}, w.checked


def _counted_delays(store: Path, level: int) -> int:
    """How many messages of delay ``level`` ``config/delayOffset.json`` counts as delivered."""
    try:
        data = json.loads((store / "config" / "delayOffset.json").read_text())
    except (OSError, ValueError):
        return 0
    return int(data.get("offsetTable", {}).get(str(level), 0))


def write_killed(store: Path) -> EveryKind:
    """Every kind of message in a loop on rmq-broker, killed with SIGKILL in the middle of it:
    delay level 1 first, until ``delayOffset.json`` counts those delivered (Apache, at least once
    after a crash, delivers again what it does not count, as it does after its own crash); then
    delay level 4 (30 s) and timer messages due in 30 s, still waiting at the kill."""
    store.mkdir(parents=True)
    flags = ("--commitlog-segment-bytes", str(SEGMENT))
    with BrokerProcess(str(store), *flags, start_timeout_s=WAIT_S) as rmq:
        w = EveryKind(
            str(rmq.namesrv_endpoint), str(rmq.remoting_endpoint), KILLED_TOPIC, 4, KILLED_PGROUP
        )
        w.start()
        w.wait_rounds(3, WAIT_S)
        w.delay_level = None
        w.wait_rounds(w.rounds + 1, WAIT_S)  # none in flight
        level_1 = w.delays_sent[1]
        wait_until(
            "delayOffset.json counts the level-1 deliveries",
            lambda: _counted_delays(store, 1) >= level_1,
            WAIT_S,
        )
        w.delay_level = 4
        w.timer_s = 30  # and timer messages, still waiting at the kill
        since = time.monotonic()
        w.wait_delays(4, 4, WAIT_S)
        rmq.kill()  # SIGKILL while the loop still sends
        assert time.monotonic() - since < 25, (
            "too slow: level 4 and timers came due before the kill"
        )
        w.stop()
    assert len(w.acked) >= 400 and w.timers_sent >= 2
    return w


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """Apache brokers ``opens`` (on a store rmq-broker writes before it starts) and ``writes``."""
    work = tmp_path_factory.mktemp("apache-direction")
    store = work / "opens" / "store"
    store.mkdir(parents=True)
    rmq = RmqBroker(store)
    try:
        w = write(rmq.namesrv, rmq.addr)
    finally:
        rmq.stop()
    c = ApacheRocketMQ(work, brokers=("opens", "writes"), broker_config=APACHE_CONFIG)
    c.start()
    try:
        yield c, work, w
    finally:
        c.close()


def test_rmq_store_opened_by_apache(cluster) -> None:
    c, work, w = cluster
    open_and_check(c.namesrv_addr, c.broker_addr("opens"), w)
    c.stop_broker("opens")
    check_store(work / "opens" / "store", w)


def test_rmq_store_killed_mid_workload_opened_by_apache(
    cluster, programs: JavaPrograms, java_home: Path
) -> None:
    """Every message rmq-broker acknowledged before its SIGKILL read once through Apache by the
    Java client: the pending halves checked back (the rolled-back ones answered ROLLBACK), the
    delayed ones delivered by Apache (those rmq-broker delivered not again)."""
    c, work, _ = cluster
    w = write_killed(work / "opens-killed" / "store")
    start_broker(c, "opens-killed")  # Apache on it
    b = c.broker_addr("opens-killed")
    with answering_checks(c.namesrv_addr, b, KILLED_PGROUP, w.decide):
        served = java_read_all(
            programs, java_home, c.namesrv_addr, "DirectionKilledG", w.expected(), WAIT_S
        )
    check_every_kind(served, w)


def test_apache_store_opened_by_rmq(cluster) -> None:
    c, work, _ = cluster
    w = write(c.namesrv_addr, c.broker_addr("writes"))
    c.stop_broker("writes")
    store = work / "writes" / "store"
    rmq = RmqBroker(store, *RMQ_QUICK_CHECKS)
    try:
        open_and_check(rmq.namesrv, rmq.addr, w)
    finally:
        rmq.stop()
    check_store(store, w)
