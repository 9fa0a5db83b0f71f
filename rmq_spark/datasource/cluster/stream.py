"""The streaming source over a RocketMQ cluster (``namesrvAddr``): offsets per (topic, broker,
queue), admission control as the store source's, new queues and brokers picked up, brokers that
went away waited for.

* ``latestOffset`` asks the NameServers for fresh routes and every queue's max offset.  A queue
  that appears (a new broker, more read queues) joins at its first offset, as Kafka's source
  takes new partitions from the earliest.  A queue whose broker does not answer, or is gone from
  the routes, keeps its offset (the other brokers go on); after ``brokerUnavailableTimeout`` the
  query fails naming the broker (``failOnDataLoss=false``: its queues are dropped instead).
* ``commit(end)`` commits to ``consumerGroup`` with UPDATE_CONSUMER_OFFSET (one batch late, as
  Spark calls it while planning the next batch), so ``mqadmin consumerProgress`` shows the lag.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from rmq_spark.cluster import ClusterError
from rmq_spark.cluster.namespace import wrap
from rmq_spark.datasource.cluster import offsets as C
from rmq_spark.datasource.cluster.planner import (
    DEFAULT_GROUP,
    NAMESRV_DOWN,
    ClusterPlanner,
    Snapshot,
    unavailable_message,
)
from rmq_spark.datasource.cluster.read import (
    ClusterRange,
    ClusterReadContext,
    read_rows,
    split_cluster_range,
)
from rmq_spark.datasource.options import SourceOptions
from rmq_spark.datasource.read.partition import DataLossError
from rmq_spark.datasource.releases import (
    ReadLimit,
    SourceAdmission,
    SupportsTriggerAvailableNow,
    arrow_schema,
)
from rmq_spark.datasource.stream_reader import WAIT, admitted_rows, default_read_limit
from rmq_spark.datasource.tasks import task_started

log = logging.getLogger("rmq_spark.datasource.cluster")


def _now_ms() -> int:
    return int(time.time() * 1000)


def read_context(opts: SourceOptions) -> ClusterReadContext:
    ns = opts.connection.namespace
    return ClusterReadContext(
        namesrv_addr=opts.connection.namesrv_addr or "",
        group=wrap(ns, opts.consumer_group or DEFAULT_GROUP),
        tags=opts.tags,
        sql=opts.sql,
        fail_on_data_loss=opts.fail_on_data_loss,
        avro_schema=opts.avro_schema,
        pull_batch_size=opts.pull_batch_size,
        unavailable_timeout_ms=opts.broker_unavailable_timeout_ms,
        credentials=opts.connection.cluster_credentials(),
        namespace=ns,
        tls=opts.connection.tls,
    )


class ClusterStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self.planner = ClusterPlanner(opts)
        self._initial: C.Flat | None = None
        self._target: C.Flat | None = None
        self._latest: C.Flat | None = None
        self._lo: C.Flat = {}
        self._down_since: dict[str, float] = {}
        self._last_batch_ms = _now_ms()
        self._arrow_schema: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_arrow_schema"] = None
        return state

    # --- offsets ---------------------------------------------------------------------------------

    def _snapshot(self) -> Snapshot:
        snap = self.planner.snapshot()
        self._lo.update(snap.lo)
        return snap

    def initialOffset(self) -> dict[str, Any]:
        if self._initial is None:
            snap = self.planner.snapshot_all()
            self._lo.update(snap.lo)
            self._initial = self.planner.resolve_start(self.opts.starting, snap)
        return C.nested(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        return default_read_limit(self.opts)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = dict(self.planner.snapshot_all().hi)

    def _check_brokers(self, start: C.Flat, snap: Snapshot) -> C.Flat:
        """Queues of ``start`` whose broker did not answer keep their offset, for at most
        ``brokerUnavailableTimeout``; returns ``start`` (without the queues given up on)."""
        now = time.monotonic()
        missing = {
            b for (_, b, _) in start if b in snap.down or not any(k[1] == b for k in snap.hi)
        }
        for b in list(self._down_since):
            if b not in missing:
                log.info("broker %s answers again", b)
                del self._down_since[b]
        timeout_s = self.opts.broker_unavailable_timeout_ms / 1000
        for b in missing:
            since = self._down_since.setdefault(b, now)
            if now - since <= timeout_s:
                continue
            why = {
                b: snap.down.get(b)
                or snap.down.get(NAMESRV_DOWN)
                or "it is in no route of the subscribed topics"
            }
            if self.opts.fail_on_data_loss:
                raise ClusterError(
                    unavailable_message(why, self.opts.broker_unavailable_timeout_ms)
                    + "; set failOnDataLoss=false to go on without its queues",
                    broker=b,
                )
            log.warning("giving up on broker %s: %s", b, why[b])
            start = {k: v for k, v in start.items() if k[1] != b}
        return start

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        snap = self._snapshot()
        begin = C.flat(start)
        self._check_shrink(begin, snap.hi)
        begin = self._check_brokers(begin, snap)
        # a queue new since ``start`` (a new broker, more queues) counts from its first offset
        base = {**{k: snap.lo.get(k, 0) for k in snap.hi if k not in begin}, **begin}
        latest = dict(snap.hi)
        if self._target is not None:
            latest = C.cap(latest, self._target, base)
        end = C.not_before(latest, base)
        self._latest = C.not_before(snap.hi, begin)
        available = C.total_rows(base, end)
        if available == 0 and set(end) == set(begin):
            return C.nested(begin)
        if available:
            rows = admitted_rows(
                self.opts, limit, available, self._target is not None, self._last_batch_ms
            )
            if rows == WAIT:
                return C.nested(begin)
            if rows is not None:
                end = C.not_before(C.rate_limit(base, end, rows), base)
        self._last_batch_ms = _now_ms()
        return C.nested(end)

    def _check_shrink(self, start: C.Flat, hi: C.Flat) -> None:
        if not self.opts.fail_on_data_loss:
            return
        for k, s in start.items():
            e = hi.get(k)
            if e is not None and e < s:
                raise DataLossError(
                    f"queue {k[0]}/{k[1]}/{k[2]} now ends at offset {e}, below the {s} already read: the broker "
                    "lost messages or was replaced; set failOnDataLoss=false to continue from its end"
                )

    def reportLatestOffset(self) -> dict[str, Any] | None:
        if self._latest is None:
            self._latest = dict(self.planner.snapshot().hi)
        return C.nested(self._latest)

    # --- planning and reading ------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, stop = C.flat(start), C.flat(end)
        if any(k not in begin for k in stop) and not all(
            k in self._lo for k in stop if k not in begin
        ):
            self._lo.update(
                self.planner.snapshot().lo
            )  # a replay in a new process: new queues' first offsets
        ctx = read_context(self.opts)
        out: list[InputPartition] = []
        for k in sorted(stop):
            e = stop[k]
            s = begin[k] if k in begin else self._lo.get(k, 0)
            s = min(s, e)
            out.extend(
                split_cluster_range(
                    k[0], k[1], k[2], s, e, ctx, self.opts.max_records_per_partition
                )
            )
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        task_started()
        if self._arrow_schema is None:
            self._arrow_schema = arrow_schema(self.schema)
        if not isinstance(partition, ClusterRange):
            return iter(())
        return read_rows(partition, self._arrow_schema)

    def commit(self, end: dict[str, Any]) -> None:
        group = self.opts.consumer_group
        if group is not None:
            self.planner.commit(group, C.flat(end))

    def stop(self) -> None:
        self.planner.close()


class SourceAdmittedClusterStreamReader(SourceAdmission, ClusterStreamReader):
    """The cluster stream on releases without admission control (pyspark 4.0, 4.1)."""
