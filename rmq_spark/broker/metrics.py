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
==========================================  =========  ==============================================

Counters are counted as things happen (:class:`rmq_spark.services.traffic.Traffic`, per batch);
everything else is computed when scraped, by :class:`BrokerCollector`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from rmq_spark.services.traffic import RPC_BUCKETS_MS, SIZE_BUCKETS, Traffic
from rmq_spark.store import layout as L

__all__ = ["BrokerCollector", "MetricsServer"]

BASE = ("cluster", "node_type", "node_id")
CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # the transaction check's progress (rmq_spark.services.transaction.check)


def _bounds(buckets: tuple[float, ...]) -> list[str]:
    return [repr(float(b)) for b in buckets] + ["+Inf"]


def _histogram(family: HistogramMetricFamily, labels: list[str], buckets: tuple[float, ...],
               counts: list[int], total: float) -> None:  # fmt: skip
    cumulative, running = [], 0
    for bound, c in zip(_bounds(buckets), counts):
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

    def describe(self) -> list[Metric]:
        return []  # computed when scraped: no fixed description

    def collect(self) -> Iterator[Metric]:
        yield from self._traffic()
        yield from self._consumers()
        yield from self._storage()

    # --- counted as it happens ------------------------------------------------------------------
    def _traffic(self) -> Iterator[Metric]:
        snap = self.traffic.snapshot()
        b = self.base
        msg_in = CounterMetricFamily("rocketmq_messages_in_total", "Messages produced", labels=[*BASE, "topic", "message_type"])
        thr_in = CounterMetricFamily("rocketmq_throughput_in_total", "Bytes produced", labels=[*BASE, "topic", "message_type"])
        for (topic, mtype), (n, nbytes) in sorted(snap["in"].items()):
            msg_in.add_metric([*b, topic, mtype], n)
            thr_in.add_metric([*b, topic, mtype], nbytes)
        size = HistogramMetricFamily("rocketmq_message_size", "Sizes of the messages produced (bytes)",
                                     labels=[*BASE, "topic", "message_type"])  # fmt: skip
        for (topic, mtype), (counts, total) in sorted(snap["sizes"].items()):
            _histogram(size, [*b, topic, mtype], SIZE_BUCKETS, counts, total)
        out_labels = [*BASE, "topic", "consumer_group"]
        msg_out = CounterMetricFamily("rocketmq_messages_out_total", "Messages consumed", labels=out_labels)
        thr_out = CounterMetricFamily("rocketmq_throughput_out_total", "Bytes consumed", labels=out_labels)
        for (topic, group), (n, nbytes) in sorted(snap["out"].items()):
            msg_out.add_metric([*b, topic, group], n)
            thr_out.add_metric([*b, topic, group], nbytes)
        dlq = CounterMetricFamily("rocketmq_send_to_dlq_messages_total", "Messages moved to a DLQ", labels=out_labels)
        for (topic, group), n in sorted(snap["dlq"].items()):
            dlq.add_metric([*b, topic, group], n)
        rpc = HistogramMetricFamily("rocketmq_rpc_latency", "Time to answer a request (ms)",
                                    labels=[*BASE, "protocol_type", "request_code", "response_code"])  # fmt: skip
        for (proto, code, resp), (counts, total) in sorted(snap["rpc"].items()):
            _histogram(rpc, [*b, proto, code, resp], RPC_BUCKETS_MS, counts, total)
        yield from (msg_in, thr_in, size, msg_out, thr_out, dlq, rpc)

    # --- consumer groups ------------------------------------------------------------------------
    def _store_time(self, topic: str, queue_id: int, offset: int) -> int:
        cq = self.store.consume_queue(topic, queue_id)
        if cq is None or offset < cq.min_offset or offset >= cq.max_offset:
            return 0
        unit = cq.unit(offset)
        return max(0, self.store.commitlog.store_timestamp(unit[0])) if unit is not None else 0

    def _consumers(self) -> Iterator[Metric]:
        store, b = self.store, self.base
        labels = [*BASE, "topic", "consumer_group"]
        lag = GaugeMetricFamily("rocketmq_consumer_lag_messages", "Messages not yet consumed", labels=labels)
        latency = GaugeMetricFamily("rocketmq_consumer_lag_latency",
                                    "Age of the oldest message not yet consumed (ms)", labels=labels)  # fmt: skip
        inflight = GaugeMetricFamily("rocketmq_consumer_inflight_messages", "Messages received and not yet acked",
                                     labels=labels)  # fmt: skip
        ready = GaugeMetricFamily("rocketmq_consumer_ready_messages", "Messages ready to be consumed", labels=labels)
        in_flight = self.pop.inflight_by_topic() if self.pop is not None else {}
        now = int(time.time() * 1000)
        topics = store.topics.topics
        for group in sorted(store.offsets.groups()):
            if group == CHECK_GROUP:
                continue
            for topic in sorted(t for t in topics if not L.is_system_topic(t)):
                committed = store.offsets.query_topic(group, topic)
                if not committed:
                    continue
                behind, oldest = 0, 0
                for q in range(topics[topic].read_queue_nums):
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
        consumers = GaugeMetricFamily("rocketmq_consumer_connections", "Connected consumers (remoting)",
                                      labels=[*BASE, "consumer_group"])  # fmt: skip
        producers = GaugeMetricFamily("rocketmq_producer_connections", "Connected producers (remoting)", labels=BASE)
        if self.clients is not None:
            for name, g in sorted(list(self.clients.consumers.items())):
                consumers.add_metric([*b, name], len(g.clients))
            producers.add_metric(b, sum(len(c) for c in list(self.clients.producers.values())))
        yield from (consumers, producers)

    # --- the store ------------------------------------------------------------------------------
    def _storage(self) -> Iterator[Metric]:
        store, b = self.store, self.base
        cl = store.commitlog

        def gauge(name: str, text: str, value: float, extra: tuple[str, ...] = (), values: tuple[str, ...] = ()) -> Metric:
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
        half = max(0, store.max_offset(L.TRANS_HALF_TOPIC, 0) - max(0, store.offsets.query(CHECK_GROUP, L.TRANS_HALF_TOPIC, 0)))
        yield gauge("rocketmq_half_messages", "Half (transactional) messages not yet checked back", half)
        delay = GaugeMetricFamily("rmq_spark_delay_backlog_messages", "Delayed messages not yet delivered",
                                  labels=[*BASE, "delay_level"])  # fmt: skip
        schedule = getattr(self.core, "schedule", None)
        if schedule is not None:
            for q, delivered in sorted(dict(schedule.offsets).items()):
                delay.add_metric([*b, str(q + 1)], max(0, store.max_offset(L.SCHEDULE_TOPIC, q) - delivered))
        yield delay


class MetricsServer:
    """``/metrics`` over HTTP on ``listen`` (its own registry: nothing of the process's default)."""

    def __init__(self, listen: str, collector: BrokerCollector) -> None:
        host, _, port = listen.rpartition(":")
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._server, self._thread = start_http_server(int(port), addr=host.strip("[]") or "0.0.0.0",
                                                       registry=self.registry)  # fmt: skip
        self.host = host
        self.port = int(self._server.server_address[1])
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        with self._lock:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)


def start_metrics(broker: Any) -> MetricsServer:
    """Count the broker's traffic (its ``core.traffic`` must be set before it serves) and serve
    ``/metrics`` on ``broker.options.metrics_listen``."""
    traffic = broker.core.traffic
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
    collector = BrokerCollector(broker.core, traffic, cluster=broker.options.cluster_name,
                                node_id=broker.core.config.broker_name, pop=broker.service.pop,
                                clients=clients)  # fmt: skip
    return MetricsServer(broker.options.metrics_listen, collector)
