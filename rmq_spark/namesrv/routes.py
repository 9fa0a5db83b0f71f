"""RouteInfoManager: which brokers serve which topics, as a RocketMQ NameServer keeps it.

Two kinds of brokers are known:

- the **local** broker (the rmq-broker process this NameServer runs in): its topics are read live
  from its store, so a topic created a moment ago has a route at once.  With auto-creation on, a
  topic no broker has yet gets a route to it (the default queue count), as RocketMQ's ``TBW102``
  default route lets a producer send to a new topic.  No registration can replace it: a peer
  naming the local broker's name (with any brokerId) or its address is refused.
- **registered** brokers (REGISTER_BROKER from other rmq-broker or Apache RocketMQ brokers): their
  topic tables come with each registration and expire when the broker stops heartbeating
  (``heartbeatTimeoutMillis``, default 120 s, held to [10 s, 10 min]) or its connection closes.
  The registry is bounded (:class:`~rmq_spark.namesrv.limits.NamesrvLimits`): a registration
  past a bound is refused, never stored.

Answers are the JSON documents of RocketMQ's ``TopicRouteData`` and ``ClusterInfo``.  ``brokerAddrs``
keys are written quoted (standard JSON); fastjson reads both forms.  A route costs a look-up per
broker (the registry is bounded), never a walk of every topic; the topic lists walk every topic
and are served off the event loop.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rmq_spark.namesrv.limits import (
    DEFAULT_LIMITS,
    NamesrvLimits,
    RegistrationError,
    check_identity,
    clamp_timeout_ms,
)
from rmq_spark.remoting.codes import ResponseCode

__all__ = ["BrokerEntry", "LocalBroker", "QueueData", "RouteInfoManager", "queue_data"]

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


@functools.lru_cache(maxsize=4096)
def queue_data(read: int, write: int, perm: int, sys_flag: int = 0) -> QueueData:
    """A shared QueueData (thousands of topics of a registration have a handful of shapes)."""
    return QueueData(read, write, perm, sys_flag)


@dataclass
class BrokerEntry:
    """A registered broker: its identity and the topics it last reported (replaced, never
    changed in place: readers hold the mapping they were given)."""

    cluster: str
    broker_name: str
    broker_addr: str
    broker_id: int
    topics: Mapping[str, QueueData] = field(default_factory=dict)
    last_update_ms: int = 0
    timeout_ms: int = BROKER_TIMEOUT_MS
    connection_id: int | None = None


@dataclass
class LocalBroker:
    """The broker of this process: ``topics()`` gives its current topic -> QueueData;
    ``route_for_new(topic)`` the QueueData a topic it has not created yet would get (None when it
    would refuse the topic); ``topic(name)`` (optional) one topic's QueueData without building the
    whole table."""

    cluster: str
    broker_name: str
    broker_addr: str
    topics: Callable[[], Mapping[str, QueueData]]
    route_for_new: Callable[[str], QueueData | None]
    topic: Callable[[str], QueueData | None] | None = None

    def lookup(self, name: str) -> QueueData | None:
        return self.topic(name) if self.topic is not None else self.topics().get(name)


def broker_data(cluster: str, name: str, addrs: dict[int, str]) -> dict[str, Any]:
    return {"cluster": cluster, "brokerName": name, "brokerAddrs": {str(k): v for k, v in sorted(addrs.items())},
            "enableActingMaster": False}  # fmt: skip


# (broker name, one topic's QueueData, every topic) of a broker that serves topics
_Source = tuple[str, Callable[[str], "QueueData | None"], Callable[[], Mapping[str, QueueData]]]


class RouteInfoManager:
    def __init__(self, local: LocalBroker | None = None, now_ms: Callable[[], int] | None = None,
                 limits: NamesrvLimits = DEFAULT_LIMITS) -> None:  # fmt: skip
        self.local = local
        self.limits = limits
        self._now_ms = now_ms or (lambda: int(time.time() * 1000))
        self._lock = threading.Lock()
        # broker address -> entry
        self._brokers: dict[str, BrokerEntry] = {}
        self._topic_entries = 0  # sum of len(e.topics) over self._brokers

    # --- registration ---------------------------------------------------------------------------
    def check_not_local(self, broker_name: str | None, broker_addr: str | None, what: str) -> None:
        """RegistrationError (NO_PERMISSION) when a peer's request names the local broker."""
        loc = self.local
        if loc is None:
            return
        if broker_name == loc.broker_name:
            raise RegistrationError(
                f"{what}: brokerName {loc.broker_name!r} is this NameServer's own broker; "
                "another broker cannot register or unregister it",
                ResponseCode.NO_PERMISSION,
            )
        if broker_addr == loc.broker_addr:
            raise RegistrationError(f"{what}: brokerAddr {loc.broker_addr} is this NameServer's own broker "
                                    f"({loc.broker_name}); another broker cannot register or unregister it",
                                    ResponseCode.NO_PERMISSION)  # fmt: skip

    def register(self, entry: BrokerEntry) -> None:
        """Adds or refreshes ``entry`` (keyed by its address; one with the same name and id at
        another address is replaced, as RocketMQ's newest registration wins), or raises
        RegistrationError and changes nothing."""
        limits = self.limits
        check_identity(entry.cluster, entry.broker_name, entry.broker_addr, entry.broker_id, limits)
        self.check_not_local(entry.broker_name, entry.broker_addr, "REGISTER_BROKER")
        if len(entry.topics) > limits.max_topics_per_broker:
            raise RegistrationError(
                f"REGISTER_BROKER of {entry.broker_name} ({entry.broker_addr}) lists "
                f"{len(entry.topics)} topics; the limit is {limits.max_topics_per_broker}"
            )
        entry.timeout_ms = clamp_timeout_ms(entry.timeout_ms, limits)
        now = self._now_ms()
        entry.last_update_ms = now
        with self._lock:
            self._expire_locked(now)
            replaced = [a for a, e in self._brokers.items() if a == entry.broker_addr
                        or (e.broker_name == entry.broker_name and e.broker_id == entry.broker_id)]  # fmt: skip
            if len(self._brokers) - len(replaced) >= limits.max_brokers:
                raise RegistrationError(
                    f"REGISTER_BROKER of {entry.broker_name} ({entry.broker_addr}): this "
                    f"NameServer holds {limits.max_brokers} brokers, its limit"
                )
            entries = (
                self._topic_entries
                - sum(len(self._brokers[a].topics) for a in replaced)
                + len(entry.topics)
            )
            if entries > limits.max_topics_total:
                raise RegistrationError(
                    f"REGISTER_BROKER of {entry.broker_name} ({entry.broker_addr}): its "
                    f"{len(entry.topics)} topics would take the NameServer past "
                    f"{limits.max_topics_total} topic entries over all registered brokers"
                )
            for a in replaced:
                self._drop_locked(a)
            self._brokers[entry.broker_addr] = entry
            self._topic_entries += len(entry.topics)

    def unregister(self, broker_addr: str, broker_name: str | None = None) -> bool:
        self.check_not_local(broker_name, broker_addr, "UNREGISTER_BROKER")
        with self._lock:
            entry = self._brokers.get(broker_addr)
            if entry is None or (broker_name and entry.broker_name != broker_name):
                return False
            self._drop_locked(broker_addr)
            return True

    def delete_topic(self, topic: str, cluster: str | None = None) -> None:
        """DELETE_TOPIC_IN_NAMESRV: forget ``topic`` in the tables brokers (of ``cluster``) reported."""
        with self._lock:
            for entry in self._brokers.values():
                if (cluster is None or entry.cluster == cluster) and topic in entry.topics:
                    entry.topics = {k: v for k, v in entry.topics.items() if k != topic}
                    self._topic_entries -= 1

    def connection_closed(self, connection_id: int) -> None:
        with self._lock:
            for addr in [a for a, e in self._brokers.items() if e.connection_id == connection_id]:
                self._drop_locked(addr)

    def _drop_locked(self, addr: str) -> None:
        entry = self._brokers.pop(addr)
        self._topic_entries -= len(entry.topics)

    def _expire_locked(self, now: int) -> None:
        for a in [a for a, e in self._brokers.items() if now - e.last_update_ms > e.timeout_ms]:
            self._drop_locked(a)

    def _live(self) -> list[BrokerEntry]:
        with self._lock:
            self._expire_locked(self._now_ms())
            return list(self._brokers.values())

    @property
    def size(self) -> tuple[int, int]:
        """(registered brokers, topic entries over them)."""
        with self._lock:
            return len(self._brokers), self._topic_entries

    # --- queries --------------------------------------------------------------------------------
    def _tables(self) -> tuple[dict[str, tuple[str, dict[int, str]]], list[_Source]]:
        """broker name -> (cluster, {id: addr}); and the topic sources of every master."""
        names: dict[str, tuple[str, dict[int, str]]] = {}
        sources: list[_Source] = []
        if self.local is not None:
            loc = self.local
            names[loc.broker_name] = (loc.cluster, {MASTER_ID: loc.broker_addr})
            sources.append((loc.broker_name, loc.lookup, loc.topics))
        for e in self._live():
            _cluster, addrs = names.setdefault(e.broker_name, (e.cluster, {}))
            addrs[e.broker_id] = e.broker_addr
            if e.broker_id == MASTER_ID:
                t = e.topics  # this registration's table: replaced, never changed in place
                sources.append((e.broker_name, t.get, (lambda t=t: t)))  # type: ignore[misc]
        return names, sources

    def topic_route(self, topic: str) -> dict[str, Any] | None:
        """TopicRouteData of ``topic``, or None when no broker has it."""
        names, sources = self._tables()
        queue_datas = []
        for broker_name, lookup, _all in sources:
            qd = lookup(topic)
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
        for _name, _lookup, topics in sources:
            out.update(topics())
        return sorted(out)

    def topics_of_cluster(self, cluster: str) -> list[str]:
        names, sources = self._tables()
        out: set[str] = set()
        for name, _lookup, topics in sources:
            if names[name][0] == cluster:
                out.update(topics())
        return sorted(out)
