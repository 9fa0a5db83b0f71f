"""rmq-broker's store opening a store a real Apache RocketMQ 5.5.0 broker wrote, both ways.

One Apache cluster per module (a NameServer and three brokers, CommitLog segments of 64 KiB and
ConsumeQueue files of 100 units, so BLANK records end segments and queues span files):

- ``clean``: plain single sends, batches, tags and keys over four queues; stopped with SIGTERM;
  served with the sizes given, and with the default configuration (sizes taken from the files).
- ``killed``: the same workload in a loop, the broker killed with SIGKILL in the middle of it.
- ``rt``: started on a store rmq-broker's store wrote first; Apache appends an acknowledged
  message, is stopped; rmq-broker's store reopens it.  While it runs, rmq-broker's store refuses
  to open the store Apache holds (Apache's POSIX lock), naming it.

Every message Apache acknowledged must then be served by :class:`MessageStore` exactly once, with
the id (offsetMsgId) and queue offset Apache answered, the body and the properties sent.  Before
issue 29 the store cut Apache's records ("record CRC property missing") and served none.
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from _apache import ApacheRocketMQ
from _apache_store import create_topic, send_batch, send_one

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


@dataclass
class Acked:
    """A message Apache acknowledged: what it answered and what was sent."""

    uniq: str
    queue_id: int
    queue_offset: int
    msg_id: str  # offsetMsgId
    body: bytes
    properties: dict[str, str]


def _send_round(c: RemotingClient, topic: str, salt: str, n: int, acked: list[Acked]) -> int:
    """One round: a batch of 20 per queue (tags, keys, a property), then a single send per queue
    (keys only, a unicode property) and a zlib-compressed body.  Appends what was acknowledged."""
    for q in range(QUEUES):
        msgs = []
        for _ in range(20):
            uniq = f"{salt}{n:08X}".rjust(32, "0")[-32:]
            props = {
                "TAGS": f"Tag{n % 3}",
                "KEYS": f"k{n} order-{n % 7}",
                "i": str(n),
                "UNIQ_KEY": uniq,
                "WAIT": "true",
            }
            msgs.append((f"batch {n} ".encode() * (1 + n % 9), props))
            n += 1
        ext = send_batch(c, topic, q, msgs)
        ids = ext["msgId"].split(",")
        first = int(ext["queueOffset"])
        for i, (body, props) in enumerate(msgs):
            acked.append(
                Acked(props["UNIQ_KEY"], int(ext["queueId"]), first + i, ids[i], body, props)
            )
    for q in range(QUEUES):
        uniq = f"{salt}{n:08X}".rjust(32, "0")[-32:]
        props = {"UNIQ_KEY": uniq, "WAIT": "true", "KEYS": f"single-{n}", "city": "Zürich"}
        body = f"single {n}".encode()
        ext = send_one(c, topic, q, body, props)
        acked.append(
            Acked(uniq, int(ext["queueId"]), int(ext["queueOffset"]), ext["msgId"], body, props)
        )
        n += 1
    uniq = f"{salt}{n:08X}".rjust(32, "0")[-32:]
    big = bytes(range(256)) * 40 + b"compressed!"
    props = {"UNIQ_KEY": uniq, "TAGS": "Big", "WAIT": "true"}
    ext = send_one(c, topic, 0, zlib.compress(big, 5), props, sys_flag=1)
    acked.append(
        Acked(uniq, int(ext["queueId"]), int(ext["queueOffset"]), ext["msgId"], big, props)
    )
    return n + 1


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


def _served(store: Path, topic: str, config: StoreConfig | None = None) -> dict[str, tuple]:
    """Every message of ``topic`` :class:`MessageStore` serves, by UNIQ_KEY (none twice)."""
    out: dict[str, tuple] = {}
    with MessageStore(str(store), config or StoreConfig(**STORE)) as s:
        for q in range(QUEUES):
            offset = s.min_offset(topic, q)
            while offset < s.max_offset(topic, q):
                got = s.get_messages(topic, q, offset, max_msgs=64).messages
                assert got, (q, offset)
                for m in got:
                    assert m.uniq_key not in out, m.uniq_key
                    body = zlib.decompress(m.body) if m.sys_flag & 1 else m.body
                    out[m.uniq_key] = (
                        m.queue_id,
                        m.queue_offset,
                        m.msg_id,
                        body,
                        dict(m.properties),
                    )
                offset = got[-1].queue_offset + 1
    return out


def _check(served: dict[str, tuple], acked: list[Acked]) -> None:
    assert acked
    for a in acked:
        assert a.uniq in served, (
            f"acknowledged {a.uniq} (queue {a.queue_id} offset {a.queue_offset}) not served"
        )
        qid, qoff, msg_id, body, props = served[a.uniq]
        assert (qid, qoff, msg_id) == (a.queue_id, a.queue_offset, a.msg_id), a.uniq
        assert body == a.body, a.uniq
        for k, v in a.properties.items():
            if k != "WAIT":
                assert props.get(k) == v, (a.uniq, k)


def _segments(store: Path) -> list[str]:
    return sorted(os.listdir(store / "commitlog"))


def test_store_apache_stopped_cleanly_is_served_whole(apache) -> None:
    cluster, work, _ = apache
    addr = cluster.broker_addr("clean")
    create_topic(addr, TOPIC, QUEUES)
    acked: list[Acked] = []
    n = 0
    with RemotingClient(addr, 10.0) as c:
        for _ in range(12):
            n = _send_round(c, TOPIC, os.urandom(6).hex().upper(), n, acked)
    cluster.stop_broker("clean")
    store = work / "clean" / "store"
    segments = _segments(store)
    assert len(segments) >= 3  # BLANK records end the first ones
    served = _served(store, TOPIC)
    _check(served, acked)
    assert len(served) == len(acked)
    assert _segments(store) == segments
    # Apache's broker.conf set both sizes (64 KiB segments, 100-unit ConsumeQueue files): the
    # default configuration (1 GiB, 300,000 units) takes them from the files.  Before: "segment
    # is 65536 bytes, expected 1073741824"
    assert _served(store, TOPIC, StoreConfig()) == served
    assert _segments(store) == segments


def test_store_of_an_apache_killed_mid_workload_serves_every_acknowledged_message(apache) -> None:
    cluster, work, _ = apache
    addr = cluster.broker_addr("killed")
    create_topic(addr, TOPIC, QUEUES)
    acked: list[Acked] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def workload() -> None:
        n = 0
        salt = os.urandom(6).hex().upper()
        try:
            with RemotingClient(addr, 10.0) as c:
                while not stop.is_set():
                    n = _send_round(c, TOPIC, salt, n, acked)
        except (OSError, RuntimeError, TimeoutError) as e:  # the broker went away mid-request
            errors.append(e)

    t = threading.Thread(target=workload)
    t.start()
    deadline = time.monotonic() + 120
    while len(acked) < 600 and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(acked) >= 600, errors
    cluster.stop_broker("killed", kill=True)  # SIGKILL while the loop still sends
    stop.set()
    t.join(60)
    assert not t.is_alive()
    store = work / "killed" / "store"
    assert (store / "abort").exists()  # a crash, as Apache sees it
    _check(_served(store, TOPIC), list(acked))


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
    _check(served, acked)
    assert len(served) == 121
    with MessageStore(str(store), StoreConfig(**STORE)) as s:  # and ours append after it
        r = s.put_message(Message(RT_TOPIC, b"rmq again", {"TAGS": "r"}, queue_id=1))
        assert r.ok and r.append.queue_offsets[0] == 31
    assert len(_served(store, RT_TOPIC)) == 122
