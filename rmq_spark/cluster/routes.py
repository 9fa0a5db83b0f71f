"""A topic's route as the NameServer answers GET_ROUTEINFO_BY_TOPIC (``TopicRouteData``).

The body is fastjson: a client older than V4_9_4 gets Long map keys unquoted
(``"brokerAddrs":{0:"host:port"}``); the client asks for standard JSON and copes with both.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from rmq_spark.remoting.codes import Perm

__all__ = ["BrokerData", "QueueData", "TopicRoute", "parse_route"]

MASTER_ID = 0
_BARE_KEY = re.compile(r"([{,])\s*(-?\d+)\s*:")


@dataclass(frozen=True)
class BrokerData:
    cluster: str
    name: str
    addrs: dict[int, str]  # brokerId -> address; 0 is the master

    @property
    def master(self) -> str | None:
        return self.addrs.get(MASTER_ID)

    @property
    def read_addr(self) -> str | None:
        """Where reads go: the master, else the slave of the lowest id (as the Java consumer's
        ``findBrokerAddressInSubscribe`` falls back to any replica of the broker group)."""
        if MASTER_ID in self.addrs:
            return self.addrs[MASTER_ID]
        return self.addrs[min(self.addrs)] if self.addrs else None


@dataclass(frozen=True)
class QueueData:
    broker_name: str
    read_queues: int
    write_queues: int
    perm: int
    topic_sys_flag: int = 0

    @property
    def readable(self) -> bool:
        return bool(self.perm & Perm.READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & Perm.WRITE)


@dataclass(frozen=True)
class TopicRoute:
    topic: str
    brokers: dict[str, BrokerData]  # by broker name
    queues: tuple[QueueData, ...]
    order_conf: str | None = None

    def read_queues(self) -> list[tuple[str, int]]:
        """``(brokerName, queueId)`` of every readable queue, brokers sorted by name."""
        out: list[tuple[str, int]] = []
        for q in sorted(self.queues, key=lambda q: q.broker_name):
            if q.readable:
                out.extend((q.broker_name, i) for i in range(q.read_queues))
        return out

    def write_queues(self) -> list[tuple[str, int]]:
        """``(brokerName, queueId)`` of every writable queue of a broker with a master."""
        out: list[tuple[str, int]] = []
        for q in sorted(self.queues, key=lambda q: q.broker_name):
            b = self.brokers.get(q.broker_name)
            if q.writable and b is not None and b.master:
                out.extend((q.broker_name, i) for i in range(q.write_queues))
        return out


def parse_route(topic: str, body: bytes) -> TopicRoute:
    text = body.decode("utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = json.loads(_BARE_KEY.sub(r'\1"\2":', text))
    brokers = {}
    for b in data.get("brokerDatas") or []:
        addrs = {int(k): str(v) for k, v in (b.get("brokerAddrs") or {}).items()}
        brokers[b["brokerName"]] = BrokerData(b.get("cluster", ""), b["brokerName"], addrs)
    queues = tuple(
        QueueData(
            q["brokerName"],
            int(q.get("readQueueNums", 0)),
            int(q.get("writeQueueNums", 0)),
            int(q.get("perm", 0)),
            int(q.get("topicSysFlag", 0)),
        )
        for q in data.get("queueDatas") or []
    )
    return TopicRoute(topic, brokers, queues, data.get("orderTopicConf"))
