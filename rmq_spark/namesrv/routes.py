"""RouteInfoManager: which brokers serve which topics, as a RocketMQ NameServer keeps it.

Two kinds of brokers are known:

- the **local** broker (the rmq-broker process this NameServer runs in): its topics are read live
  from its store, so a topic created a moment ago has a route at once.  With auto-creation on, a
  topic no broker has yet gets a route to it (the default queue count), as RocketMQ's ``TBW102``
  default route lets a producer send to a new topic.
- **registered** brokers (REGISTER_BROKER from other rmq-broker or Apache RocketMQ brokers): their
  topic tables come with each registration and expire when the broker stops heartbeating
  (``heartbeatTimeoutMillis``, default 120 s) or its connection closes.

Answers are the JSON documents of RocketMQ's ``TopicRouteData`` and ``ClusterInfo``.  ``brokerAddrs``
keys are written quoted (standard JSON); fastjson reads both forms.
"""

from __future__ import annotations

import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BrokerEntry", "LocalBroker", "QueueData", "RouteInfoManager"]

BROKER_TIMEOUT_MS = 120_000  # RouteInfoManager.DEFAULT_BROKER_CHANNEL_EXPIRED_TIME
MASTER_ID = 0  # MixAll.MASTER_ID


@dataclass(frozen=True)
class QueueData:
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json(self, broker_name: str) -> dict[str, Any]:
        return {"brokerName": broker_name, "readQueueNums": self.read_queue_nums,
                "writeQueueNums": self.write_queue_nums, "perm": self.perm,
                "topicSysFlag": self.topic_sys_flag}  # fmt: skip


@dataclass
class BrokerEntry:
    """A registered broker: its identity and the topics it last reported."""

    cluster: str
    broker_name: str
    broker_addr: str
    broker_id: int
    topics: dict[str, QueueData] = field(default_factory=dict)
    last_update_ms: int = 0
    timeout_ms: int = BROKER_TIMEOUT_MS
    connection_id: int | None = None


@dataclass
class LocalBroker:
    """The broker of this process: ``topics()`` gives its current topic -> QueueData;
    ``route_for_new(topic)`` the QueueData a topic it has not created yet would get (None when it
    would refuse the topic)."""

    cluster: str
    broker_name: str
    broker_addr: str
    topics: Callable[[], dict[str, QueueData]]
    route_for_new: Callable[[str], QueueData | None]


def broker_data(cluster: str, name: str, addrs: dict[int, str]) -> dict[str, Any]:
    return {"cluster": cluster, "brokerName": name, "brokerAddrs": {str(k): v for k, v in sorted(addrs.items())},
            "enableActingMaster": False}  # fmt: skip


class RouteInfoManager:
    def __init__(self, local: LocalBroker | None = None, now_ms: Callable[[], int] | None = None) -> None:
        self.local = local
        self._now_ms = now_ms or (lambda: int(time.time() * 1000))
        self._lock = threading.Lock()
        # broker address -> entry
        self._brokers: dict[str, BrokerEntry] = {}

    # --- registration ---------------------------------------------------------------------------
    def register(self, entry: BrokerEntry) -> None:
        entry.last_update_ms = self._now_ms()
        with self._lock:
            self._brokers[entry.broker_addr] = entry

    def unregister(self, broker_addr: str, broker_name: str | None = None) -> bool:
        with self._lock:
            entry = self._brokers.get(broker_addr)
            if entry is None or (broker_name and entry.broker_name != broker_name):
                return False
            del self._brokers[broker_addr]
            return True

    def delete_topic(self, topic: str, cluster: str | None = None) -> None:
        """DELETE_TOPIC_IN_NAMESRV: forget ``topic`` in the tables brokers (of ``cluster``) reported."""
        with self._lock:
            for entry in self._brokers.values():
                if cluster is None or entry.cluster == cluster:
                    entry.topics.pop(topic, None)

    def connection_closed(self, connection_id: int) -> None:
        with self._lock:
            for addr in [a for a, e in self._brokers.items() if e.connection_id == connection_id]:
                del self._brokers[addr]

    def _live(self) -> list[BrokerEntry]:
        now = self._now_ms()
        with self._lock:
            dead = [a for a, e in self._brokers.items() if now - e.last_update_ms > e.timeout_ms]
            for a in dead:
                del self._brokers[a]
            return list(self._brokers.values())

    # --- queries --------------------------------------------------------------------------------
    def _tables(self) -> tuple[dict[str, tuple[str, dict[int, str]]], list[tuple[str, Callable[[], dict[str, QueueData]]]]]:
        """broker name -> (cluster, {id: addr}); and (broker name, its topics) of every master."""
        names: dict[str, tuple[str, dict[int, str]]] = {}
        topic_sources: list[tuple[str, Callable[[], dict[str, QueueData]]]] = []
        if self.local is not None:
            loc = self.local
            names[loc.broker_name] = (loc.cluster, {MASTER_ID: loc.broker_addr})
            topic_sources.append((loc.broker_name, loc.topics))
        for e in self._live():
            cluster, addrs = names.setdefault(e.broker_name, (e.cluster, {}))
            addrs[e.broker_id] = e.broker_addr
            if e.broker_id == MASTER_ID:
                topic_sources.append((e.broker_name, (lambda t=e.topics: t)))
        return names, topic_sources

    def topic_route(self, topic: str) -> dict[str, Any] | None:
        """TopicRouteData of ``topic``, or None when no broker has it."""
        names, sources = self._tables()
        queue_datas = []
        for broker_name, topics in sources:
            qd = topics().get(topic)
            if qd is not None:
                queue_datas.append(qd.to_json(broker_name))
        if not queue_datas and self.local is not None:
            # no broker has it: the local one would create it on the first send
            qd = self.local.route_for_new(topic)
            if qd is not None:
                queue_datas.append(qd.to_json(self.local.broker_name))
        if not queue_datas:
            return None
        queue_datas.sort(key=lambda q: q["brokerName"])
        brokers = sorted({q["brokerName"] for q in queue_datas})
        return {
            "brokerDatas": [broker_data(names[b][0], b, names[b][1]) for b in brokers],
            "filterServerTable": {},
            "queueDatas": queue_datas,
        }

    def cluster_info(self) -> dict[str, Any]:
        names, _ = self._tables()
        clusters: dict[str, list[str]] = {}
        for name, (cluster, _addrs) in names.items():
            clusters.setdefault(cluster, []).append(name)
        return {
            "brokerAddrTable": {n: broker_data(c, n, a) for n, (c, a) in sorted(names.items())},
            "clusterAddrTable": {c: sorted(ns) for c, ns in sorted(clusters.items())},
        }

    def topic_list(self) -> list[str]:
        _, sources = self._tables()
        out: set[str] = set()
        for _name, topics in sources:
            out.update(topics())
        return sorted(out)

    def topics_of_cluster(self, cluster: str) -> list[str]:
        names, sources = self._tables()
        out: set[str] = set()
        for name, topics in sources:
            if names[name][0] == cluster:
                out.update(topics())
        return sorted(out)


def queue_data_table(topic_configs: Iterable[dict[str, Any]]) -> dict[str, QueueData]:
    """topic -> QueueData from RocketMQ TopicConfig JSON objects (a registration's table)."""
    out = {}
    for c in topic_configs:
        name = c.get("topicName")
        if isinstance(name, str):
            out[name] = QueueData(int(c.get("readQueueNums", 0)), int(c.get("writeQueueNums", 0)),
                                  int(c.get("perm", 6)), int(c.get("topicSysFlag", 0)))  # fmt: skip
    return out


# A compressed REGISTER_BROKER body (``RegisterBrokerBody.encode(true)``, a broker's
# ``compressedRegister=true``): zlib deflate of
#   int32 len + DataVersion JSON | int32 topics | per topic: int32 len + TopicConfig.encode()
#   (``name read write perm filterType``, space-separated) | int32 len + filter server JSON | ...
_LEN = struct.Struct(">i")


def compressed_topic_table(body: bytes) -> dict[str, QueueData]:
    """topic -> QueueData of a compressed registration body; ValueError when it does not parse."""
    try:
        data = zlib.decompress(body)
    except zlib.error as e:
        raise ValueError(f"compressed body does not inflate: {e}") from None

    def chunk(pos: int) -> tuple[bytes, int]:
        if pos + 4 > len(data):
            raise ValueError(f"compressed body truncated at byte {pos}")
        (n,) = _LEN.unpack_from(data, pos)
        if n < 0 or pos + 4 + n > len(data):
            raise ValueError(f"compressed body: a length of {n} at byte {pos} runs past its end")
        return data[pos + 4 : pos + 4 + n], pos + 4 + n

    _version, pos = chunk(0)
    if pos + 4 > len(data):
        raise ValueError("compressed body has no topic count")
    (count,) = _LEN.unpack_from(data, pos)
    pos += 4
    out = {}
    for _ in range(max(count, 0)):
        raw, pos = chunk(pos)
        fields = raw.decode("utf-8", errors="replace").split(" ")
        if len(fields) < 4:
            raise ValueError(f"compressed body: topic config {raw[:80]!r} has {len(fields)} fields")
        out[fields[0]] = QueueData(int(fields[1]), int(fields[2]), int(fields[3]))
    return out
