"""rmq-broker's store opening a store a real Apache RocketMQ 5.5.0 broker wrote, both ways.

One Apache cluster per module (a NameServer and three brokers, CommitLog segments of 64 KiB and
ConsumeQueue files of 100 units, so BLANK records end segments and queues span files):

- ``clean``: plain single sends, batches, tags and keys over four queues; stopped with SIGTERM;
  served with the sizes given, and with the default configuration (sizes taken from the files).
- ``killed``: every kind of message in a loop (:class:`EveryKind`: batches, tags, keys, a
  compressed body, delay levels 1 and then 3, timer messages, messages retried and
  dead-lettered, committed, rolled-back and pending halves), the
  broker killed with SIGKILL in the middle of it.  A real rmq-broker process opens the crashed
  store: it checks the halves back, delivers the delayed messages (those Apache delivered but had
  not yet counted in ``delayOffset.json`` not again), and the Java client reads the topic through
  it; rmq-broker appends a round of its own and stops; Apache starts on the store again and the
  Java client reads every message of both through Apache (the round trip).
- ``rt``: started on a store rmq-broker's store wrote first; Apache appends an acknowledged
  message, is stopped; rmq-broker's store reopens it.  While it runs, rmq-broker's store refuses
  to open the store Apache holds (Apache's POSIX lock), naming it.

Every message Apache acknowledged must then be served by :class:`MessageStore` (and for
``killed`` by the Java client through rmq-broker) exactly once, with the id (offsetMsgId) and
queue offset Apache answered, the body and the properties sent.  Before
issue 29 the store cut Apache's records ("record CRC property missing") and served none.
"""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path

import pytest
from _apache import ApacheRocketMQ
from _apache_store import (
    RMQ_QUICK_CHECKS,
    Acked,
    EveryKind,
    Served,
    answering_checks,
    check_every_kind,
    check_served_once,
    cluster_client,
    create_topic,
    java_read_all,
    send_one,
    start_broker,
)
from _java import JavaPrograms

from rmq_spark.broker.testing import BrokerProcess
from rmq_spark.errors import StoreLockedError
from rmq_spark.remoting.client import RemotingClient
from rmq_spark.store.message import Message
from rmq_spark.store.store import MessageStore, StoreConfig

TOPIC = "ApacheOpenT"
RT_TOPIC = "RoundTripT"
QUEUES = 4
SEGMENT = 64 * 1024
CQ_UNITS = 100
STORE = {"commitlog_segment_bytes": SEGMENT, "cq_segment_units": CQ_UNITS}
START_S = float(os.environ.get("RMQ_APACHE_START_TIMEOUT_S", "60")) * 3


def _rmq_store(path: Path) -> Path:
    """rmq-broker's store, written before Apache starts on it (the round trip)."""
    with MessageStore(str(path), StoreConfig(**STORE)) as s:
        for i in range(120):
            r = s.put_message(
                Message(
                    RT_TOPIC,
                    f"rmq {i}".encode() * 20,
                    {"TAGS": f"r{i % 2}", "KEYS": f"rk{i}"},
                    queue_id=i % QUEUES,
                )
            )
            assert r.ok
    return path


@pytest.fixture(scope="module")
def apache(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("apache-open")
    rt_store = _rmq_store(work / "rt" / "store")
    cluster = ApacheRocketMQ(
        work,
        brokers=("clean", "killed", "rt"),
        broker_config={
            "mappedFileSizeCommitLog": str(SEGMENT),
            "mappedFileSizeConsumeQueue": str(CQ_UNITS * 20),
        },
    )
    cluster.start()
    try:
        yield cluster, work, rt_store
    finally:
        cluster.close()


def _served(store: Path, topic: str, config: StoreConfig | None = None) -> dict[str, list[Served]]:
    """Every message of ``topic`` :class:`MessageStore` serves, by UNIQ_KEY."""
    out: dict[str, list[Served]] = {}
    with MessageStore(str(store), config or StoreConfig(**STORE)) as s:
        for q in range(QUEUES):
            offset = s.min_offset(topic, q)
            while offset < s.max_offset(topic, q):
                got = s.get_messages(topic, q, offset, max_msgs=64).messages
                assert got, (q, offset)
                for m in got:
                    body = zlib.decompress(m.body) if m.sys_flag & 1 else m.body
                    out.setdefault(m.uniq_key, []).append(
                        Served(m.queue_id, m.queue_offset, m.msg_id, body, dict(m.properties))
                    )
                offset = got[-1].queue_offset + 1
    return out


def _segments(store: Path) -> list[str]:
    return sorted(os.listdir(store / "commitlog"))


def test_store_apache_stopped_cleanly_is_served_whole(apache) -> None:
    cluster, work, _ = apache
    addr = cluster.broker_addr("clean")
    w = EveryKind(cluster.namesrv_addr, addr, TOPIC, QUEUES, "CleanPG", plain=True)
    with cluster_client(cluster.namesrv_addr, addr) as client:
        client.create_topic(addr, TOPIC, QUEUES)
        for _ in range(12):
            w.round(client)
    acked = w.acked
    cluster.stop_broker("clean")
    store = work / "clean" / "store"
    segments = _segments(store)
    assert len(segments) >= 3  # BLANK records end the first ones
    served = _served(store, TOPIC)
    check_served_once(served, acked)
    assert len(served) == len(acked)
    assert _segments(store) == segments
    # Apache's broker.conf set both sizes (64 KiB segments, 100-unit ConsumeQueue files): the
    # default configuration (1 GiB, 300,000 units) takes them from the files.  Before: "segment
    # is 65536 bytes, expected 1073741824"
    assert _served(store, TOPIC, StoreConfig()) == served
    assert _segments(store) == segments


def test_store_of_an_apache_killed_mid_workload_serves_every_acknowledged_message(
    apache, programs: JavaPrograms, java_home: Path
) -> None:
    cluster, work, _ = apache
    w = EveryKind(cluster.namesrv_addr, cluster.broker_addr("killed"), TOPIC, QUEUES, "KilledPG")
    w.start()
    w.wait_rounds(5, START_S)  # delay level 1: Apache delivers them, counts them every 10 s
    w.delay_level = 3  # 10 s: still waiting in SCHEDULE_TOPIC_XXXX at the kill
    w.timer_s = 30  # and timer messages, still waiting in Apache's timer wheel
    since = time.monotonic()
    w.wait_delays(3, 4, START_S)
    cluster.stop_broker("killed", kill=True)  # SIGKILL while the loop still sends
    assert time.monotonic() - since < 25, "too slow: the timer messages came due before the kill"
    w.stop()
    store = work / "killed" / "store"
    assert (store / "abort").exists()  # a crash, as Apache sees it
    acked = list(w.acked)
    assert len(acked) >= 600 and w.delays_sent[1] >= 10 and w.delays_sent[3] >= 4
    assert w.timers_sent >= 2
    flags = ("--commitlog-segment-bytes", str(SEGMENT), *RMQ_QUICK_CHECKS)
    with (
        BrokerProcess(str(store), *flags, start_timeout_s=START_S) as rmq,
        answering_checks(
            str(rmq.namesrv_endpoint), str(rmq.remoting_endpoint), "KilledPG", w.decide
        ),
    ):
        namesrv = str(rmq.namesrv_endpoint)
        served = java_read_all(programs, java_home, namesrv, "KilledG", w.expected(), START_S)
        check_every_kind(served, w)
        # and rmq-broker's own appends, for the way back
        more = EveryKind(namesrv, str(rmq.remoting_endpoint), TOPIC, QUEUES, "KilledPG", plain=True)
        with cluster_client(namesrv, more.b) as client:
            more.round(client)
    assert rmq.proc.returncode == 0, rmq.log_tail()
    check_served_once(_served(store, TOPIC), acked + more.acked, w.rolled_back)
    w.acked += more.acked
    # the round trip: Apache again on the store, after rmq-broker's recovery, check-backs,
    # deliveries and appends; a half rmq-broker committed and Apache checked again would be
    # committed twice (served twice), a delayed or timer message delivered again likewise
    start_broker(cluster, "killed")
    addr = cluster.broker_addr("killed")
    with answering_checks(cluster.namesrv_addr, addr, "KilledPG", w.decide):
        served = java_read_all(
            programs, java_home, cluster.namesrv_addr, "KilledBackG", w.expected(), START_S
        )
    check_every_kind(served, w)


def test_round_trip_keeps_what_apache_appended_to_our_store(apache) -> None:
    cluster, _work, store = apache
    addr = cluster.broker_addr("rt")
    pid = cluster.brokers["rt"].pid
    with pytest.raises(StoreLockedError) as e:  # Apache holds it: refused, naming it
        MessageStore(str(store), StoreConfig(**STORE))
    assert f"pid {pid}" in str(e.value) and str(store / "lock") in str(e.value)
    create_topic(addr, RT_TOPIC, QUEUES)
    acked: list[Acked] = []
    with RemotingClient(addr, 10.0) as c:
        props = {"UNIQ_KEY": "A" * 32, "TAGS": "fromApache", "KEYS": "apache-1", "WAIT": "true"}
        ext = send_one(c, RT_TOPIC, 1, b"appended by Apache", props)
        acked.append(
            Acked(
                "A" * 32,
                int(ext["queueId"]),
                int(ext["queueOffset"]),
                ext["msgId"],
                b"appended by Apache",
                props,
            )
        )
    assert acked[0].queue_offset == 30  # after rmq-broker's 30 messages of queue 1
    cluster.stop_broker("rt")
    served = _served(store, RT_TOPIC)
    check_served_once(served, acked)
    assert len(served) == 121
    with MessageStore(str(store), StoreConfig(**STORE)) as s:  # and ours append after it
        r = s.put_message(Message(RT_TOPIC, b"rmq again", {"TAGS": "r"}, queue_id=1))
        assert r.ok and r.append.queue_offsets[0] == 31
    assert len(_served(store, RT_TOPIC)) == 122
