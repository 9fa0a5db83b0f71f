"""What the broker knows of its remoting clients (``ProducerManager``, ``ConsumerManager`` and
``RebalanceLockManager`` of apache/rocketmq):

- producers by group, with their connection: CHECK_TRANSACTION_STATE goes to one of them;
- consumer groups from HEART_BEAT: their clients (GET_CONSUMER_LIST_BY_GROUP; a change of
  membership is announced to every member with NOTIFY_CONSUMER_IDS_CHANGED so they rebalance),
  their subscriptions (a push consumer's pull names none: the broker filters with the one its
  heartbeat registered), message model and consume type;
- queue locks of orderly consumers (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ), held 60 s unless renewed.

A client goes away when it unregisters, when its connection closes, or after
``CLIENT_EXPIRE_MS`` without a heartbeat.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rmq_spark.remoting.codes import RequestCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.server import Connection

__all__ = ["ClientManager", "ConsumerGroup", "MessageQueueKey", "Subscription"]

log = logging.getLogger("rmq_spark.remoting.clients")

CLIENT_EXPIRE_MS = 120_000  # ConsumerManager.CHANNEL_EXPIRED_TIMEOUT
# a line per group a client joins, up to this many a heartbeat; then one line for the rest (a
# heartbeat may name 1,024 groups: a line each was 1,024 lines, and ~0.2 s, per heartbeat)
JOINED_LOGGED = 5
LOCK_MAX_LIVE_MS = 60_000  # rocketmq.broker.rebalance.lockMaxLiveTime
NOTIFY = RequestCode.NOTIFY_CONSUMER_IDS_CHANGED

MessageQueueKey = tuple[str, str, int]  # topic, brokerName, queueId


@dataclass(frozen=True)
class Subscription:
    topic: str
    expression: str
    expression_type: str = "TAG"
    sub_version: int = 0


@dataclass
class ConsumerGroup:
    name: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    # client id -> (connection, last heartbeat ms, language, version)
    clients: dict[str, tuple[Connection, int, str, int]] = field(default_factory=dict)
    subscriptions: dict[str, Subscription] = field(default_factory=dict)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _log_left(left: list[tuple[str, str]], why: str) -> None:
    """One line per group left, for the first :data:`JOINED_LOGGED`, then one for the rest (a
    client of 1,000 groups whose connection closes: one line, not 1,000 on the event loop)."""
    for name, cid in left[:JOINED_LOGGED]:
        log.info("consumer group %s: client %s left (%s)", name, cid, why)
    if len(left) > JOINED_LOGGED:
        more = left[JOINED_LOGGED:]
        log.info("%d more consumer groups (%s ...): their clients left (%s)",
                 len(more), ", ".join(n for n, _ in more[:3]), why)  # fmt: skip


class ClientManager:
    def __init__(self, now_ms: Callable[[], int] = _now_ms) -> None:
        self.now_ms = now_ms
        self._lock = threading.Lock()
        # producer group -> client id -> (connection, last heartbeat ms)
        self.producers: dict[str, dict[str, tuple[Connection, int]]] = {}
        self.consumers: dict[str, ConsumerGroup] = {}
        # consumer group -> queue -> (client id, last lock ms)
        self._locks: dict[str, dict[MessageQueueKey, tuple[str, int]]] = {}

    # --- heartbeats -----------------------------------------------------------------------------
    def heartbeat(
        self, conn: Connection, data: dict[str, Any], language: str = "JAVA", version: int = 0
    ) -> list[str]:
        """Register what a HeartbeatData names; returns the consumer groups whose membership
        changed (to be notified)."""
        client_id = str(data.get("clientID") or "")
        if not client_id:
            raise ValueError("HeartbeatData has no clientID")
        conn.attrs["client_id"] = client_id
        now = self.now_ms()
        changed = []
        joined: list[str] = []
        with self._lock:
            for p in data.get("producerDataSet") or []:
                producer = str((p or {}).get("groupName") or "")
                if producer:
                    self.producers.setdefault(producer, {})[client_id] = (conn, now)
            for c in data.get("consumerDataSet") or []:
                c = c or {}
                name = str(c.get("groupName") or "")
                if not name:
                    continue
                group = self.consumers.get(name)
                if group is None:
                    group = self.consumers[name] = ConsumerGroup(name)
                group.consume_type = str(c.get("consumeType") or group.consume_type)
                group.message_model = str(c.get("messageModel") or group.message_model)
                group.consume_from_where = str(
                    c.get("consumeFromWhere") or group.consume_from_where
                )
                subs = {}
                for s in c.get("subscriptionDataSet") or []:
                    s = s or {}
                    topic = str(s.get("topic") or "")
                    if topic:
                        subs[topic] = Subscription(
                            topic,
                            str(s.get("subString") or "*"),
                            str(s.get("expressionType") or "TAG"),
                            int(s.get("subVersion") or 0),
                        )
                if subs or not group.subscriptions:
                    group.subscriptions = subs
                old = group.clients.get(client_id)
                if old is None or old[0] is not conn:
                    changed.append(name)
                    if old is None:
                        joined.append(name)
                group.clients[client_id] = (conn, now, language, version)
        for name in joined[:JOINED_LOGGED]:
            log.info("consumer group %s: client %s joined (%s)", name, client_id, conn.peer)
        if len(joined) > JOINED_LOGGED:
            more = joined[JOINED_LOGGED:]
            log.info("%d more consumer groups (%s ...): client %s joined (%s)",
                     len(more), ", ".join(more[:3]), client_id, conn.peer)  # fmt: skip
        return changed

    def unregister(self, conn: Connection, client_id: str, producer_group: str | None,
                   consumer_group: str | None) -> list[str]:  # fmt: skip
        """UNREGISTER_CLIENT: ``client_id`` leaves the groups, when it was registered over ``conn``
        (as RocketMQ unregisters the requesting channel only: one client cannot remove another)."""
        changed = []
        with self._lock:
            producers = self.producers.get(producer_group or "")
            if producers is not None and producers.get(client_id, (None,))[0] is conn:
                del producers[client_id]
            group = self.consumers.get(consumer_group or "")
            if group is not None and group.clients.get(client_id, (None,))[0] is conn:
                del group.clients[client_id]
                changed.append(group.name)
                log.info("consumer group %s: client %s left (unregistered)", group.name, client_id)
        return changed

    def connection_closed(self, conn: Connection) -> list[str]:
        """Forget everything registered over ``conn``; the consumer groups that changed."""
        changed: list[str] = []
        left: list[tuple[str, str]] = []
        with self._lock:
            for clients in self.producers.values():
                for cid in [c for c, (cn, _) in clients.items() if cn is conn]:
                    del clients[cid]
            for name, group in self.consumers.items():
                gone = [c for c, v in group.clients.items() if v[0] is conn]
                for cid in gone:
                    del group.clients[cid]
                    left.append((name, cid))
                if gone:
                    changed.append(name)
        _log_left(left, "connection closed")
        return changed

    def expire(self) -> list[str]:
        """Drop clients silent for CLIENT_EXPIRE_MS; the consumer groups that changed."""
        deadline = self.now_ms() - CLIENT_EXPIRE_MS
        changed: list[str] = []
        left: list[tuple[str, str]] = []
        with self._lock:
            for clients in self.producers.values():
                for cid in [c for c, (_, t) in clients.items() if t < deadline]:
                    del clients[cid]
            for name, group in self.consumers.items():
                gone = [c for c, v in group.clients.items() if v[1] < deadline]
                for cid in gone:
                    del group.clients[cid]
                    left.append((name, cid))
                if gone:
                    changed.append(name)
        _log_left(left, f"silent for {CLIENT_EXPIRE_MS // 1000} s")
        return changed

    # --- queries --------------------------------------------------------------------------------
    def consumer_ids(self, group: str) -> list[str]:
        with self._lock:
            g = self.consumers.get(group)
            return sorted(g.clients) if g else []

    def consumer_group(self, group: str) -> ConsumerGroup | None:
        return self.consumers.get(group)

    def subscription(self, group: str, topic: str) -> Subscription | None:
        g = self.consumers.get(group)
        return g.subscriptions.get(topic) if g else None

    def producer_connections(self, group: str) -> list[Connection]:
        with self._lock:
            return [c for c, _ in (self.producers.get(group) or {}).values() if not c.closed]

    def notify_ids_changed(self, group: str) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED (oneway) to every member of ``group``."""
        with self._lock:
            g = self.consumers.get(group)
            conns = [v[0] for v in g.clients.values()] if g else []
        for conn in conns:
            conn.send_oneway(
                RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})
            )

    def notify_many(self, groups: list[str]) -> None:
        """:meth:`notify_ids_changed` of each of ``groups``, the notices to one connection written
        together (a heartbeat naming 1,000 new groups: one write to its connection)."""
        by_conn: dict[Connection, list[RemotingCommand]] = {}
        with self._lock:
            for group in groups:
                g = self.consumers.get(group)
                for conn, *_ in g.clients.values() if g else ():
                    notice = {"consumerGroup": group}
                    by_conn.setdefault(conn, []).append(RemotingCommand(NOTIFY, notice))
        for conn, notices in by_conn.items():
            conn.send_oneway_many(notices)

    # --- orderly consumption's queue locks ------------------------------------------------------
    def try_lock(
        self, group: str, client_id: str, queues: list[MessageQueueKey]
    ) -> list[MessageQueueKey]:
        now = self.now_ms()
        locked = []
        with self._lock:
            table = self._locks.setdefault(group, {})
            for mq in queues:
                holder = table.get(mq)
                if holder is None or holder[0] == client_id or now - holder[1] > LOCK_MAX_LIVE_MS:
                    table[mq] = (client_id, now)
                    locked.append(mq)
        return locked

    def unlock(self, group: str, client_id: str, queues: list[MessageQueueKey]) -> None:
        with self._lock:
            table = self._locks.get(group) or {}
            for mq in queues:
                holder = table.get(mq)
                if holder is not None and holder[0] == client_id:
                    del table[mq]
