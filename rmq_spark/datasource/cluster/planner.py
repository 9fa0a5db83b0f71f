"""What the driver asks a RocketMQ cluster while planning a ``namesrvAddr`` read: the subscribed
topics, their routes (asked again at every snapshot, so queues and brokers that appear are
picked up), every queue's min and max offsets, offsets by time, and the group's commits.

A broker that does not answer (down, or no longer in the routes) is reported by
:meth:`ClusterPlanner.snapshot` instead of failing it: the stream keeps its queues where they
were and waits for it (``brokerUnavailableTimeout``); a batch read retries, then fails naming it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from rmq_spark.cluster import BrokerUnreachableError, ClusterClient, ClusterError
from rmq_spark.cluster.namespace import in_namespace, unwrap, wrap
from rmq_spark.datasource.cluster import offsets as C
from rmq_spark.datasource.options import SourceOptions, StartKind, StartSpec
from rmq_spark.remoting.codes import ResponseCode

log = logging.getLogger("rmq_spark.datasource.cluster")
T = TypeVar("T")
SNAPSHOT_THREADS = 8
# topics of RocketMQ itself, never matched by topicPattern
_SYSTEM = re.compile(
    r"^(%RETRY%|%DLQ%|RMQ_SYS_|rmq_sys_|SCHEDULE_TOPIC_|TBW102$|BenchmarkTest$|OFFSET_MOVED_EVENT$|"
    r"SELF_TEST_TOPIC$|TRANS_CHECK_MAX_TIME_TOPIC$)"
)
DEFAULT_GROUP = "rmq-spark-reader"
NAMESRV_DOWN = "*"  # Snapshot.down's key when no NameServer answered


@dataclass
class Snapshot:
    hi: C.Flat  # next offset to be written, per queue that answered
    lo: C.Flat  # first offset still stored
    down: dict[str, str]  # broker name -> why it did not answer


class ClusterPlanner:
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.ns = opts.connection.namespace  # topics and groups as the brokers know them: ns%name
        self._client: ClusterClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "_client": None}

    @property
    def client(self) -> ClusterClient:
        if self._client is None:
            self._client = ClusterClient(
                self.opts.connection.namesrv_addr or "",
                credentials=self.opts.connection.cluster_credentials(),
                tls=self.opts.connection.tls,
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- what to read ---------------------------------------------------------------------------

    def topics(self) -> list[str]:
        """The subscribed topics as the brokers name them (with the namespace, if any)."""
        sub, ns = self.opts.subscription, self.ns
        if sub.pattern is not None:
            rx = re.compile(sub.pattern)
            try:
                known = self.client.topics()
            except ClusterError as e:
                if e.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                    raise
                raise ClusterError(
                    f"topicPattern needs the list of every topic, which {self.opts.connection.namesrv_addr} does not "
                    f"serve ({e}): a RocketMQ proxy's remoting port does not; name the topics with "
                    "`topics` or `assign`, or give namesrvAddr the NameServers",
                    code=e.code,
                ) from None
            return [
                t
                for t in known
                if (ns is None or in_namespace(ns, t))
                and rx.fullmatch(unwrap(ns, t))
                and not _SYSTEM.match(unwrap(ns, t))
            ]
        if sub.assign:
            return [wrap(ns, t) for t, _ in sub.assign]
        return [wrap(ns, t) for t in sub.topics]

    def given(self, offsets: Any) -> C.Flat:
        """Offsets an option gives (topics as the application names them), keyed as the brokers
        name the topics."""
        return {(wrap(self.ns, t), b, q): o for (t, b, q), o in C.flat(offsets).items()}

    def queues(self, topics: Iterable[str]) -> tuple[list[C.Key], dict[str, str]]:
        """Every readable (topic, broker, queue) of the fresh routes; brokers without a master."""
        assign = {wrap(self.ns, t): set(q) for t, q in self.opts.subscription.assign}
        keys: list[C.Key] = []
        down: dict[str, str] = {}
        for t in topics:
            route = self.client.route(t, refresh=True)
            for b, q in route.read_queues():
                if t in assign and q not in assign[t]:
                    continue
                if not route.brokers.get(b) or not route.brokers[b].read_addr:
                    down[b] = f"broker {b} has neither master nor slave in the route of {t}"
                    continue
                keys.append((t, b, q))
        return keys, down

    def _each(
        self, keys: list[C.Key], fn: Callable[[C.Key], T]
    ) -> tuple[dict[C.Key, T], dict[str, str]]:
        """``fn(key)`` for every key, in parallel; keys of a broker that did not answer are left out."""
        out: dict[C.Key, T] = {}
        down: dict[str, str] = {}

        def one(k: C.Key) -> tuple[C.Key, T | None, str | None]:
            if k[1] in down:
                return k, None, down[k[1]]
            try:
                return k, fn(k), None
            except BrokerUnreachableError as e:
                down[k[1]] = str(e)
                return k, None, str(e)

        if not keys:
            return out, down
        with ThreadPoolExecutor(min(SNAPSHOT_THREADS, len(keys))) as pool:
            for k, v, err in pool.map(one, keys):
                if err is not None:
                    down[k[1]] = err
                else:
                    out[k] = v  # type: ignore[assignment]
        return out, down

    def snapshot(self, topics: list[str] | None = None) -> Snapshot:
        try:
            topics = self.topics() if topics is None else topics
            keys, down = self.queues(topics)
        except BrokerUnreachableError as e:  # no NameServer answered: no broker is known now
            return Snapshot({}, {}, {NAMESRV_DOWN: str(e)})
        c = self.client
        both, down2 = self._each(
            keys, lambda k: (c.get_max_offset(k[1], k[0], k[2]), c.get_min_offset(k[1], k[0], k[2]))
        )
        down.update(down2)
        return Snapshot(
            {k: v[0] for k, v in both.items()}, {k: v[1] for k, v in both.items()}, down
        )

    def snapshot_all(self, topics: list[str] | None = None) -> Snapshot:
        """A snapshot of every broker: one that does not answer is asked again until
        ``brokerUnavailableTimeout``, then a :class:`ClusterError` names it."""
        deadline = time.monotonic() + self.opts.broker_unavailable_timeout_ms / 1000
        delay = 0.5
        while True:
            snap = self.snapshot(topics)
            if not snap.down:
                return snap
            if time.monotonic() > deadline:
                raise ClusterError(
                    unavailable_message(snap.down, self.opts.broker_unavailable_timeout_ms)
                )
            log.warning("brokers not answering, retrying: %s", snap.down)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def offsets_at(self, timestamp_ms: int, keys: Iterable[C.Key]) -> C.Flat:
        """Per queue, the first offset stored at or after ``timestamp_ms`` (SEARCH_OFFSET_BY_TIMESTAMP)."""
        c = self.client
        found, down = self._each(
            list(keys), lambda k: c.search_offset(k[1], k[0], k[2], timestamp_ms)
        )
        if down:
            raise ClusterError(f"searching offsets by time failed: {unavailable_message(down, 0)}")
        return found

    def resolve_start(self, spec: StartSpec, snap: Snapshot) -> C.Flat:
        if spec.kind is StartKind.EARLIEST:
            return dict(snap.lo)
        if spec.kind is StartKind.LATEST:
            return dict(snap.hi)
        if spec.kind is StartKind.TIMESTAMP:
            return self.offsets_at(spec.timestamp_ms or 0, snap.hi)
        if spec.kind is StartKind.GROUP:
            return self.group_start(spec, snap)
        out = dict(snap.lo)  # the queues the JSON names; others of the subscription at the earliest
        out.update(resolve(self.given(spec.offsets), snap))
        return out

    def group_start(self, spec: StartSpec, snap: Snapshot) -> C.Flat:
        """``startingOffsets=group``: each queue at ``consumerGroup``'s committed offset
        (QUERY_CONSUMER_OFFSET), a queue without one at ``startingOffsetsFallback``; an offset past
        the queue's end (a broker that lost messages) starts at the end."""
        group = wrap(self.ns, self.opts.consumer_group or DEFAULT_GROUP)
        c = self.client
        found, down = self._each(
            list(snap.hi), lambda k: c.query_consumer_offset(k[1], group, k[0], k[2])
        )
        if down:
            raise ClusterError(
                f"reading the committed offsets of consumer group {group} failed: "
                f"{unavailable_message(down, 0)}"
            )
        out = dict(snap.hi if spec.fallback is StartKind.LATEST else snap.lo)
        for k, o in found.items():
            if o is None or o < 0:
                continue
            if o > snap.hi[k]:
                log.warning(
                    "consumer group %s committed offset %d of %s/%s/%d, past the queue's end %d: starting "
                    "at the end",
                    group,
                    o,
                    k[0],
                    k[1],
                    k[2],
                    snap.hi[k],
                )
                o = snap.hi[k]
            out[k] = o
        return out

    def commit(self, group: str, offsets: C.Flat) -> None:
        """UPDATE_CONSUMER_OFFSET of every queue (what ``mqadmin consumerProgress`` shows); a
        broker that does not answer is skipped (the next commit carries the offsets on)."""
        c = self.client
        group = wrap(self.ns, group)
        topics_of: dict[str, set[str]] = {}
        for t, b, _ in offsets:
            topics_of.setdefault(b, set()).add(t)
        for b, topics in sorted(topics_of.items()):
            # a pull consumer's heartbeat: the broker makes the group's retry topic, which
            # mqadmin consumerProgress routes by, and lists the group as online
            try:
                c.heartbeat(b, consumers=[consumer_data(group, sorted(topics), self.opts.tags)])
            except ClusterError as e:
                log.warning("consumerGroup %s: heartbeat to %s failed: %s", group, b, e)

        def update(k: C.Key) -> None:
            try:
                c.update_consumer_offset(k[1], group, k[0], k[2], offsets[k])
            except ClusterError as e:
                if e.code != ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST:
                    raise
                # a broker knows a group once it pulled for it or had its heartbeat; a RocketMQ
                # proxy keeps heartbeats to itself, and a queue with nothing to read was never
                # pulled: one pull at the offset makes the group known (autoCreateSubscriptionGroup)
                c.pull(k[1], k[0], k[2], offsets[k], 1, group)
                c.update_consumer_offset(k[1], group, k[0], k[2], offsets[k])

        _, down = self._each(list(offsets), update)
        if down:
            log.warning("consumerGroup %s: offsets not committed to %s", group, down)


def consumer_data(group: str, topics: list[str], tags: str | None) -> dict[str, Any]:
    """``ConsumerData`` of a heartbeat, as DefaultLitePullConsumer sends it (subscribed, pulling)."""
    sub = tags or "*"
    return {
        "groupName": group,
        "consumeType": "CONSUME_ACTIVELY",
        "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
        "unitMode": False,
        "subscriptionDataSet": [
            {
                "classFilterMode": False,
                "topic": t,
                "subString": sub,
                "tagsSet": [],
                "codeSet": [],
                "subVersion": int(time.time() * 1000),
                "expressionType": "TAG",
            }
            for t in topics
        ],
    }


def resolve(given: C.Flat, snap: Snapshot) -> C.Flat:
    """-2 (earliest) and -1 (latest) in user offsets as numbers."""
    out = {}
    for k, o in given.items():
        if o == C.EARLIEST:
            o = snap.lo.get(k, 0)
        elif o == C.LATEST:
            o = snap.hi.get(k, 0)
        out[k] = o
    return out


def unavailable_message(down: dict[str, str], timeout_ms: int) -> str:
    what = "; ".join(f"{b}: {why}" for b, why in sorted(down.items()))
    after = f" for {timeout_ms / 1000:g}s (option brokerUnavailableTimeout)" if timeout_ms else ""
    return f"brokers {', '.join(sorted(down))} of the cluster did not answer{after}: {what}"
