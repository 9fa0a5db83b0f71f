"""``--metrics-listen HOST:PORT``: the broker's metrics in Prometheus format at ``/metrics``, under
RocketMQ's names, types and labels (apache/rocketmq ``BrokerMetricsConstant``,
``DefaultStoreMetricsConstant``, ``RemotingMetricsConstant``; the 5.x observability docs), so
dashboards and alerts made for a RocketMQ broker work unchanged.

Every metric carries ``cluster``, ``node_type`` (``broker``) and ``node_id`` (the broker name).

==========================================  =========  ==============================================
metric                                      type       labels besides cluster, node_type, node_id
==========================================  =========  ==============================================
rocketmq_messages_in_total                  counter    topic, message_type (Normal FIFO Delay
                                                       Transaction)
rocketmq_throughput_in_total                counter    topic, message_type (bytes of bodies)
rocketmq_message_size                       histogram  topic, message_type (bytes; le 1 KiB 4 KiB
                                                       512 KiB 1 MiB 2 MiB 4 MiB +Inf)
rocketmq_messages_out_total                 counter    topic, consumer_group
rocketmq_throughput_out_total               counter    topic, consumer_group (bytes of records)
rocketmq_send_to_dlq_messages_total         counter    topic, consumer_group
rocketmq_rpc_latency                        histogram  protocol_type, request_code, response_code (ms)
rocketmq_consumer_lag_messages              gauge      topic, consumer_group
rocketmq_consumer_lag_latency               gauge      topic, consumer_group (ms since the oldest
                                                       message not yet consumed was stored)
rocketmq_consumer_inflight_messages         gauge      topic, consumer_group (received, not acked)
rocketmq_consumer_ready_messages            gauge      topic, consumer_group (lag less in flight)
rocketmq_consumer_connections               gauge      consumer_group (remoting clients)
rocketmq_producer_connections               gauge      (remoting producers)
rocketmq_storage_size                       gauge      storage_type, storage_medium (bytes)
rocketmq_storage_flush_behind_bytes         gauge
rocketmq_storage_dispatch_behind_bytes      gauge
rocketmq_storage_message_reserve_time       gauge      (ms since the oldest stored message)
rocketmq_timing_messages                    gauge      (timer messages waiting for their time)
rocketmq_half_messages                      gauge      (half messages not yet checked back)
rmq_spark_commitlog_segments                gauge      (CommitLog segment files)
rmq_spark_delay_backlog_messages            gauge      delay_level (delayed messages not yet due)
rmq_spark_metrics_dropped_series            gauge      metric (label sets left out of this scrape:
                                                       over MAX_SERIES_PER_METRIC)
==========================================  =========  ==============================================

Counters are counted as things happen (:class:`rmq_spark.services.traffic.Traffic`, per batch);
everything else is computed when scraped, by :class:`BrokerCollector`.

Label values a client names are bounded, so no client can make a scrape large or slow (20,000
unknown request codes and 5,000 made-up group names once made one 36 MiB and 13 s, past
Prometheus' 10 s timeout): a remoting request code RocketMQ does not define is counted as
``request_code="unknown"`` (a response code likewise); per-group series are served only for
groups that exist (committed offsets, or a subscribed remoting client, as
GET_ALL_SUBSCRIPTIONGROUP_CONFIG lists them), and the (topic, group) pairs counted are at most
``MAX_TRAFFIC_PAIRS``; every metric has at most ``MAX_SERIES_PER_METRIC`` label sets per scrape
(groups with a connected client first), the rest counted in ``rmq_spark_metrics_dropped_series``.
``/metrics`` itself is served by :mod:`rmq_spark.broker.metrics_http`: a deadline per connection
and a bounded number of connections.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from rmq_spark.broker.metrics_http import (
    MAX_SCRAPE_CONNECTIONS,
    SCRAPE_TIMEOUT_S,
    MetricsHttpServer,
)
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.services.traffic import RPC_BUCKETS_MS, SIZE_BUCKETS, Traffic
from rmq_spark.store import layout as L

__all__ = [
    "MAX_SERIES_PER_METRIC",
    "MAX_TRAFFIC_PAIRS",
    "BoundedTraffic",
    "BrokerCollector",
    "MetricsServer",
]

BASE = ("cluster", "node_type", "node_id")
# the transaction check's progress (rmq_spark.services.transaction.check)
CHECK_GROUP = "CID_RMQ_SYS_TRANS"
# the one label value of every request or response code RocketMQ does not define
UNKNOWN = "unknown"
# label sets per metric and scrape: 1,000 (topic, group) pairs are ~150 KiB of text for the four lag
# gauges, a scrape well under a second; a larger cluster's dashboards aggregate anyway
MAX_SERIES_PER_METRIC = 1000
# (topic, group) pairs counted as delivered or moved to a DLQ (memory: ~200 bytes each)
MAX_TRAFFIC_PAIRS = 10_000
_REQUEST_CODES = frozenset(int(c) for c in RequestCode)
_RESPONSE_CODES = frozenset(int(c) for c in ResponseCode)


def request_label(code: int) -> str:
    """A remoting request code's ``request_code`` label: its number when RocketMQ defines it."""
    return str(code) if code in _REQUEST_CODES else UNKNOWN


def response_label(code: int) -> str:
    return str(code) if code in _RESPONSE_CODES else UNKNOWN


class BoundedTraffic:
    """:class:`Traffic` with the label sets a client names bounded: remoting request codes by
    :func:`request_label`, (topic, group) pairs delivered or moved to a DLQ at ``max_pairs`` (a new
    pair past it is not counted: ``dropped`` says how many calls).  Sends pass straight through
    (their topics exist before a send is stored)."""

    def __init__(self, traffic: Traffic, max_pairs: int = MAX_TRAFFIC_PAIRS) -> None:
        self.traffic = traffic
        self.max_pairs = max_pairs
        self.dropped = 0
        self.sent = traffic.sent  # the send path: one attribute lookup, no wrapper call
        self.snapshot = traffic.snapshot

    def request(self, protocol: str, code: int | str, response: int | str, ms: float) -> None:
        if protocol == "remoting":
            code = request_label(int(code))
            response = response_label(int(response))
        self.traffic.request(protocol, code, response, ms)

    def _room(self, table: dict[tuple[str, str], Any], topic: str, group: str) -> bool:
        if (topic, group) in table or len(table) < self.max_pairs:
            return True
        self.dropped += 1
        return False

    def delivered(self, topic: str, group: str, n: int, nbytes: int) -> None:
        if self._room(self.traffic.messages_out, topic, group):
            self.traffic.delivered(topic, group, n, nbytes)

    def to_dlq(self, topic: str, group: str, n: int = 1) -> None:
        if self._room(self.traffic.dlq, topic, group):
            self.traffic.to_dlq(topic, group, n)


def _capped(
    items: Sequence[Any], limit: int, dropped: dict[str, int], *families: Metric
) -> Sequence[Any]:
    """The first ``limit`` of ``items``; how many were left out is counted for each family."""
    if len(items) <= limit:
        return items
    for f in families:
        # a counter's family name is kept without its _total by prometheus_client
        name = f.name + "_total" if f.type == "counter" else f.name
        dropped[name] = dropped.get(name, 0) + len(items) - limit
    return items[:limit]


def _bounds(buckets: tuple[float, ...]) -> list[str]:
    return [repr(float(b)) for b in buckets] + ["+Inf"]


def _histogram(family: HistogramMetricFamily, labels: list[str], buckets: tuple[float, ...],
               counts: list[int], total: float) -> None:  # fmt: skip
    cumulative, running = [], 0
    for bound, c in zip(_bounds(buckets), counts, strict=True):
        running += c
        cumulative.append((bound, running))
    family.add_metric(labels, cumulative, total)


def _dir_bytes(root: str) -> int:
    total = 0
    for here, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(here, name)).st_blocks * 512
            except OSError:
                pass
    return total


class BrokerCollector(Collector):
    """The broker's metrics, read at scrape time from the store, its services, the pop state and
    the remoting clients."""

    def __init__(self, core: Any, traffic: Traffic, *, cluster: str, node_id: str, pop: Any = None,
                 clients: Any = None) -> None:  # fmt: skip
        self.core = core
        self.store = core.store
        self.traffic = traffic
        self.base = [cluster, "broker", node_id]
        self.pop = pop
        self.clients = clients
        self.max_series = MAX_SERIES_PER_METRIC

    def describe(self) -> list[Metric]:
        return []  # computed when scraped: no fixed description

    def collect(self) -> Iterator[Metric]:
        dropped: dict[str, int] = {}
        consumers = dict(self.clients.consumers) if self.clients is not None else {}
        in_flight = self.pop.inflight_by_topic() if self.pop is not None else {}
        existing = set(self.store.offsets.groups()) | set(consumers)
        live = set(consumers) | {g for g, _t in in_flight}
        yield from self._traffic(existing, live, dropped)
        yield from self._consumers(consumers, in_flight, live, dropped)
        yield from self._storage()
        gone = GaugeMetricFamily("rmq_spark_metrics_dropped_series",
                                 "Label sets left out of this scrape (over the limit per metric)",
                                 labels=[*BASE, "metric"])  # fmt: skip
        for name, n in sorted(dropped.items()):
            gone.add_metric([*self.base, name], n)
        yield gone

    # --- counted as it happens ------------------------------------------------------------------
    def _traffic(
        self, existing: set[str], live: set[str], dropped: dict[str, int]
    ) -> Iterator[Metric]:
        snap = self.traffic.snapshot()
        b, cap = self.base, self.max_series
        msg_in = CounterMetricFamily(
            "rocketmq_messages_in_total",
            "Messages produced",
            labels=[*BASE, "topic", "message_type"],
        )
        thr_in = CounterMetricFamily(
            "rocketmq_throughput_in_total",
            "Bytes produced",
            labels=[*BASE, "topic", "message_type"],
        )
        for (topic, mtype), (n, nbytes) in _capped(
            sorted(snap["in"].items()), cap, dropped, msg_in, thr_in
        ):
            msg_in.add_metric([*b, topic, mtype], n)
            thr_in.add_metric([*b, topic, mtype], nbytes)
        size = HistogramMetricFamily("rocketmq_message_size", "Sizes of the messages produced (bytes)",
                                     labels=[*BASE, "topic", "message_type"])  # fmt: skip
        for (topic, mtype), (counts, total) in _capped(
            sorted(snap["sizes"].items()), cap, dropped, size
        ):
            _histogram(size, [*b, topic, mtype], SIZE_BUCKETS, counts, total)

        def of_groups(table: dict[tuple[str, str], Any]) -> list[tuple[tuple[str, str], Any]]:
            """Only groups that exist; those with a client first."""
            rows = [(k, v) for k, v in table.items() if k[1] in existing]
            return sorted(rows, key=lambda kv: (kv[0][1] not in live, kv[0]))

        out_labels = [*BASE, "topic", "consumer_group"]
        msg_out = CounterMetricFamily(
            "rocketmq_messages_out_total", "Messages consumed", labels=out_labels
        )
        thr_out = CounterMetricFamily(
            "rocketmq_throughput_out_total", "Bytes consumed", labels=out_labels
        )
        for (topic, group), (n, nbytes) in _capped(
            of_groups(snap["out"]), cap, dropped, msg_out, thr_out
        ):
            msg_out.add_metric([*b, topic, group], n)
            thr_out.add_metric([*b, topic, group], nbytes)
        dlq = CounterMetricFamily(
            "rocketmq_send_to_dlq_messages_total", "Messages moved to a DLQ", labels=out_labels
        )
        for (topic, group), n in _capped(of_groups(snap["dlq"]), cap, dropped, dlq):
            dlq.add_metric([*b, topic, group], n)
        rpc = HistogramMetricFamily("rocketmq_rpc_latency", "Time to answer a request (ms)",
                                    labels=[*BASE, "protocol_type", "request_code", "response_code"])  # fmt: skip
        for (proto, code, resp), (counts, total) in _capped(
            sorted(snap["rpc"].items()), cap, dropped, rpc
        ):
            _histogram(rpc, [*b, proto, code, resp], RPC_BUCKETS_MS, counts, total)
        yield from (msg_in, thr_in, size, msg_out, thr_out, dlq, rpc)

    # --- consumer groups ------------------------------------------------------------------------
    def _store_time(self, topic: str, queue_id: int, offset: int) -> int:
        cq = self.store.consume_queue(topic, queue_id)
        if cq is None or offset < cq.min_offset or offset >= cq.max_offset:
            return 0
        unit = cq.unit(offset)
        return max(0, self.store.commitlog.store_timestamp(unit[0])) if unit is not None else 0

    def _consumers(self, consumers: dict[str, Any], in_flight: dict[tuple[str, str], int], live: set[str],
                   dropped: dict[str, int]) -> Iterator[Metric]:  # fmt: skip
        store, b = self.store, self.base
        labels = [*BASE, "topic", "consumer_group"]
        lag = GaugeMetricFamily(
            "rocketmq_consumer_lag_messages", "Messages not yet consumed", labels=labels
        )
        latency = GaugeMetricFamily("rocketmq_consumer_lag_latency",
                                    "Age of the oldest message not yet consumed (ms)", labels=labels)  # fmt: skip
        inflight = GaugeMetricFamily("rocketmq_consumer_inflight_messages", "Messages received and not yet acked",
                                     labels=labels)  # fmt: skip
        ready = GaugeMetricFamily(
            "rocketmq_consumer_ready_messages", "Messages ready to be consumed", labels=labels
        )
        now = int(time.time() * 1000)
        topics = store.topics.topics
        pairs = [(g, t) for g, t in store.offsets.pairs()
                 if g != CHECK_GROUP and t in topics and not L.is_system_topic(t)]  # fmt: skip
        pairs.sort(key=lambda gt: (gt[0] not in live, gt))
        for group, topic in _capped(pairs, self.max_series, dropped, lag, latency, inflight, ready):
            committed = store.offsets.query_topic(group, topic)
            config = topics.get(topic)
            if not committed or config is None:
                continue
            behind, oldest = 0, 0
            for q in range(config.read_queue_nums):
                at = max(committed.get(q, 0), 0)
                n = max(0, store.max_offset(topic, q) - max(at, store.min_offset(topic, q)))
                if n:
                    behind += n
                    t = self._store_time(topic, q, max(at, store.min_offset(topic, q)))
                    oldest = t if not oldest or (t and t < oldest) else oldest
            flying = in_flight.get((group, topic), 0)
            lag.add_metric([*b, topic, group], behind)
            latency.add_metric([*b, topic, group], max(0, now - oldest) if oldest else 0)
            inflight.add_metric([*b, topic, group], flying)
            ready.add_metric([*b, topic, group], max(0, behind - flying))
        yield from (lag, latency, inflight, ready)
        connections = GaugeMetricFamily("rocketmq_consumer_connections", "Connected consumers (remoting)",
                                        labels=[*BASE, "consumer_group"])  # fmt: skip
        producers = GaugeMetricFamily(
            "rocketmq_producer_connections", "Connected producers (remoting)", labels=BASE
        )
        if self.clients is not None:
            for name, g in _capped(
                sorted(consumers.items()), self.max_series, dropped, connections
            ):
                connections.add_metric([*b, name], len(g.clients))
            producers.add_metric(b, sum(len(c) for c in list(self.clients.producers.values())))
        yield from (connections, producers)

    # --- the store ------------------------------------------------------------------------------
    def _storage(self) -> Iterator[Metric]:
        store, b = self.store, self.base
        cl = store.commitlog

        def gauge(
            name: str,
            text: str,
            value: float,
            extra: tuple[str, ...] = (),
            values: tuple[str, ...] = (),
        ) -> Metric:
            g = GaugeMetricFamily(name, text, labels=[*BASE, *extra])
            g.add_metric([*b, *values], value)
            return g

        yield gauge("rocketmq_storage_size", "Bytes the store takes on disk", _dir_bytes(store.root),
                    ("storage_type", "storage_medium"), ("local", "disk"))  # fmt: skip
        yield gauge("rocketmq_storage_flush_behind_bytes", "CommitLog bytes not yet flushed",
                    max(0, cl.max_offset - cl.flushed_offset))  # fmt: skip
        yield gauge("rocketmq_storage_dispatch_behind_bytes", "CommitLog bytes not yet dispatched to the queues",
                    max(0, cl.max_offset - store.dispatched_offset))  # fmt: skip
        oldest = cl.store_timestamp(cl.min_offset) if cl.max_offset > cl.min_offset else 0
        now = int(time.time() * 1000)
        yield gauge("rocketmq_storage_message_reserve_time", "Age of the oldest stored message (ms)",
                    max(0, now - oldest) if oldest > 0 else 0)  # fmt: skip
        yield gauge("rmq_spark_commitlog_segments", "CommitLog segment files", len(list(cl.mfq)))
        timer = getattr(self.core, "timer", None)
        yield gauge("rocketmq_timing_messages", "Timer messages waiting for their delivery time",
                    timer.pending_count if timer is not None else 0)  # fmt: skip
        half = max(
            0,
            store.max_offset(L.TRANS_HALF_TOPIC, 0)
            - max(0, store.offsets.query(CHECK_GROUP, L.TRANS_HALF_TOPIC, 0)),
        )
        yield gauge(
            "rocketmq_half_messages", "Half (transactional) messages not yet checked back", half
        )
        delay = GaugeMetricFamily("rmq_spark_delay_backlog_messages", "Delayed messages not yet delivered",
                                  labels=[*BASE, "delay_level"])  # fmt: skip
        schedule = getattr(self.core, "schedule", None)
        if schedule is not None:
            for q, delivered in sorted(dict(schedule.offsets).items()):
                delay.add_metric(
                    [*b, str(q + 1)], max(0, store.max_offset(L.SCHEDULE_TOPIC, q) - delivered)
                )
        yield delay


class MetricsServer:
    """``/metrics`` over HTTP on ``listen`` (its own registry: nothing of the process's default),
    each connection with a deadline of ``timeout_s``, at most ``max_connections`` at once."""

    def __init__(self, listen: str, collector: BrokerCollector, *, timeout_s: float = SCRAPE_TIMEOUT_S,
                 max_connections: int = MAX_SCRAPE_CONNECTIONS) -> None:  # fmt: skip
        host, _, port = listen.rpartition(":")
        self.collector = collector
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.http = MetricsHttpServer(host, int(port), self.registry, timeout_s=timeout_s,
                                      max_connections=max_connections)  # fmt: skip
        self.host = host
        self.port = self.http.port
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        with self._lock:
            self.http.stop()


def start_metrics(broker: Any) -> MetricsServer:
    """Count the broker's traffic (its ``core.traffic`` must be set before it serves; it is bounded
    here, :class:`BoundedTraffic`) and serve ``/metrics`` on ``broker.options.metrics_listen``."""
    traffic = broker.core.traffic
    if not isinstance(traffic, BoundedTraffic):
        traffic = broker.core.traffic = BoundedTraffic(traffic)
    broker.service.pop.traffic = traffic
    remoting = broker.remoting
    clients = None
    if remoting is not None:
        remoting.pull.traffic = traffic
        clients = remoting.clients

        def observe(code: int, response: int, ms: float) -> None:
            traffic.request("remoting", code, response, ms)

        remoting.broker_server.processor.observe = observe

    def observe_grpc(method: str, code: str, ms: float) -> None:
        traffic.request("grpc", method, code, ms)

    broker.access.observe = observe_grpc  # every gRPC call on the port (broker/access.py)
    collector = BrokerCollector(broker.core, traffic.traffic, cluster=broker.options.cluster_name,
                                node_id=broker.core.config.broker_name, pop=broker.service.pop,
                                clients=clients)  # fmt: skip
    return MetricsServer(broker.options.metrics_listen, collector)
