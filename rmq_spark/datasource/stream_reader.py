"""The streaming source: offsets, admission control, Trigger.AvailableNow, lag, group commits.

Runs in Spark's long-lived planning worker on the driver (``initialOffset``, ``latestOffset``,
``partitions``, ``commit``, ``reportLatestOffset``); ``read`` runs on executors with a different,
unpickled instance and sees only its :class:`~rmq_spark.datasource.read.partition.QueueRange`.

* ``latestOffset`` takes the max offsets from ONE atomic broker snapshot, so a sink micro-batch
  (published under the same lock) is in a planned batch entirely or not at all; it never moves
  backwards and returns ``start`` itself when nothing is new.
* Admission control as Kafka's: ``maxOffsetsPerTrigger`` splits the limit across queues in
  proportion to their backlog; ``minOffsetsPerTrigger`` skips triggers until enough is there or
  ``maxTriggerDelay`` has passed since the last batch.  A ``ReadAllAvailable`` limit from Spark
  (Trigger.Once) overrides both.
* Trigger.AvailableNow: ``prepareForTriggerAvailableNow`` snapshots the target; batches honour
  the limits and never pass the target.
* ``commit(end)`` commits ``end`` to ``consumerGroup`` when set.  Spark calls it while planning
  the *next* batch, so the group's offsets lag one batch (and the last batch of a run is not
  committed until the query runs again).
* pyspark 4.0/4.1 have no admission control: :class:`SourceAdmittedStreamReader` applies the
  limits itself (:class:`~rmq_spark.datasource.releases.SourceAdmission`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from rmq_spark.datasource import offsets as O
from rmq_spark.datasource.options import SourceOptions
from rmq_spark.datasource.planning import Planner
from rmq_spark.datasource.read.partition import DataLossError, QueueRange, split_range
from rmq_spark.datasource.releases import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SourceAdmission,
    SupportsTriggerAvailableNow,
    arrow_schema,
)
from rmq_spark.datasource.scan import read_range
from rmq_spark.datasource.tasks import task_started


def _now_ms() -> int:
    return int(time.time() * 1000)


WAIT = -1  # admitted_rows: wait for more (minOffsetsPerTrigger, before maxTriggerDelay)


def default_read_limit(opts: SourceOptions) -> ReadLimit:
    """The read limit the options ask for (Spark passes it back to ``latestOffset``)."""
    if opts.max_offsets_per_trigger is not None:
        return ReadMaxRows(opts.max_offsets_per_trigger)
    if opts.min_offsets_per_trigger is not None:
        return ReadMinRows(opts.min_offsets_per_trigger)
    return ReadAllAvailable()


def admitted_rows(
    opts: SourceOptions, limit: ReadLimit, available: int, available_now: bool, last_batch_ms: int
) -> int | None:
    """Admission control of a micro-batch with ``available`` rows: how many it may take (None:
    all), or :data:`WAIT` while fewer than ``minOffsetsPerTrigger`` wait less than
    ``maxTriggerDelay`` (never under AvailableNow, which must finish)."""
    if isinstance(limit, ReadAllAvailable):
        return None
    if (
        opts.min_offsets_per_trigger is not None
        and available < opts.min_offsets_per_trigger
        and not available_now
        and _now_ms() - last_batch_ms < opts.max_trigger_delay_ms
    ):
        return WAIT
    max_rows = opts.max_offsets_per_trigger
    if isinstance(limit, ReadMaxRows):
        max_rows = limit.max_rows if max_rows is None else min(max_rows, limit.max_rows)
    return max_rows


class RmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self.planner = Planner(opts)
        self._initial: O.Offsets | None = None
        self._target: O.Offsets | None = None
        self._latest: O.Offsets | None = None
        self._last_batch_ms = _now_ms()
        self._arrow_schema: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_arrow_schema"] = None
        return state

    # --- offsets ----------------------------------------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:
        if self._initial is None:
            hi, lo = self.planner.snapshot()
            self._initial = self.planner.resolve_start(self.opts.starting, hi, lo)
        return O.canonical(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        return default_read_limit(self.opts)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target, _ = self.planner.snapshot()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        hi, _lo = self.planner.snapshot()
        self._latest = hi
        start = O.canonical(start)
        self._check_shrink(start, hi)
        latest = hi
        if self._target is not None:
            latest = self._cap_to_target(latest, start)
        end = O.not_before(latest, start)
        available = O.total_rows(start, end)
        if available == 0:
            return start
        rows = admitted_rows(
            self.opts, limit, available, self._target is not None, self._last_batch_ms
        )
        if rows == WAIT:
            return start
        if rows is not None:
            end = O.not_before(O.rate_limit(start, end, rows), start)
        if O.same(end, start):
            return start
        self._last_batch_ms = _now_ms()
        return end

    def _cap_to_target(self, latest: O.Offsets, start: O.Offsets) -> O.Offsets:
        """Never past the AvailableNow target; queues born after it read nothing."""
        target = self._target or {}
        out: dict[str, dict[int, int]] = {}
        for t, q, e in O.queue_list(latest):
            tv = O.get(target, t, q)
            if tv is None:
                tv = O.get(start, t, q, 0) or 0
            out.setdefault(t, {})[q] = min(e, tv)
        return O.canonical(out)

    def _check_shrink(self, start: O.Offsets, hi: O.Offsets) -> None:
        """A queue whose end is now below where we are: the store lost data (or was replaced)."""
        if not self.opts.fail_on_data_loss:
            return
        for t, q, s in O.queue_list(start):
            e = O.get(hi, t, q)
            if e is not None and e < s:
                raise DataLossError(
                    f"queue {t}/{q} now ends at offset {e}, below the {s} already read: the store lost "
                    "data or was replaced; set failOnDataLoss=false to continue from its end"
                )

    def reportLatestOffset(self) -> dict[str, Any] | None:
        if self._latest is None:
            self._latest, _ = self.planner.snapshot()
        return O.canonical(self._latest)

    # --- planning and reading -------------------------------------------------------------------------------
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        ctx = self.planner.read_context()
        out: list[InputPartition] = []
        for t, q, e in O.queue_list(end):
            s = O.get(start, t, q, 0) or 0  # a queue new in this batch starts at its beginning
            s = min(s, e)  # batch 0 replayed after a restart can start past its end
            out.extend(split_range(t, q, s, e, ctx, self.opts.max_records_per_partition))
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        task_started()
        if self._arrow_schema is None:
            self._arrow_schema = arrow_schema(self.schema)
        if not isinstance(partition, QueueRange):
            return iter(())  # Spark's stand-in partition when there is nothing to read
        return read_range(partition, self._arrow_schema)

    def commit(self, end: dict[str, Any]) -> None:
        group = self.opts.consumer_group
        if group is not None:
            offsets = O.canonical(end)
            self.planner.call(lambda c: c.commit_offsets(group, offsets))

    def stop(self) -> None:
        self.planner.close()


class SourceAdmittedStreamReader(SourceAdmission, RmqStreamReader):
    """The stream on releases without admission control (pyspark 4.0, 4.1)."""
