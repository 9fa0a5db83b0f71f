"""The batch source over a RocketMQ cluster (``namesrvAddr``): ``[startingOffsets,
endingOffsets)`` of every (topic, broker, queue) of the subscription, planned once from one
snapshot of every broker (a broker that does not answer is asked again until
``brokerUnavailableTimeout``, then the read fails naming it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from rmq_spark.datasource.cluster import offsets as C
from rmq_spark.datasource.cluster.planner import ClusterPlanner, resolve
from rmq_spark.datasource.cluster.read import ClusterRange, read_rows, split_cluster_range
from rmq_spark.datasource.cluster.stream import read_context
from rmq_spark.datasource.options import SourceOptions, StartKind
from rmq_spark.datasource.read.partition import DataLossError
from rmq_spark.datasource.releases import arrow_schema
from rmq_spark.datasource.tasks import task_started
from rmq_spark.errors import ConfigError


def check_named(
    option: str, given: C.Flat, subscribed: list[str], hi: C.Flat, description: str
) -> None:
    """Every queue an offsets option names is one of this read's."""
    for t, b, q in sorted(given):
        if t not in subscribed:
            raise ConfigError(
                f"option {option!r} names topic {t!r}, which this read does not subscribe to ({description})"
            )
        if (t, b, q) not in hi:
            have = sorted({k[1] for k in hi if k[0] == t})
            queues = sorted(k[2] for k in hi if k[0] == t and k[1] == b)
            raise ConfigError(
                f"option {option!r} names queue {q} of broker {b!r} for topic {t!r}, which the cluster's routes do "
                f"not have: the topic is on brokers {have}"
                + (f", {b} has queues {queues}" if queues else "")
            )


class ClusterBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self.planner = ClusterPlanner(opts)
        self._arrow_schema: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_arrow_schema"] = None
        return state

    def partitions(self) -> list[InputPartition]:
        o = self.opts
        try:
            topics = self.planner.topics()
            snap = self.planner.snapshot_all(topics)
            hi, lo = snap.hi, snap.lo
            given_start = (
                self.planner.given(o.starting.offsets) if o.starting.kind is StartKind.JSON else {}
            )
            given_end = (
                self.planner.given(o.ending.offsets)
                if not o.ending.latest and o.ending.offsets
                else {}
            )
            for name, given in (("startingOffsets", given_start), ("endingOffsets", given_end)):
                check_named(name, given, topics, hi, o.subscription.describe())
            start = self.planner.resolve_start(o.starting, snap)
            if o.ending.timestamp_ms is not None:
                end = self.planner.offsets_at(o.ending.timestamp_ms, hi)
            else:
                end = {**hi, **resolve(given_end, snap)}
            ctx = read_context(o)
            out: list[InputPartition] = []
            for k in sorted(end):
                t, b, q = k
                s, e, top = start.get(k, lo.get(k, 0)), end[k], hi[k]
                for opt, v in (
                    ("startingOffsets", given_start.get(k)),
                    ("endingOffsets", given_end.get(k)),
                ):
                    if v is not None and v >= 0 and v > top:
                        raise ConfigError(
                            f"option {opt!r}: offset {v} of topic {t} broker {b} queue {q} is past the "
                            f"end of the queue, whose next offset is {top}"
                        )
                if s > e:
                    raise ConfigError(
                        f"Beginning offset {s} is after the ending offset {e} for topic {t} broker {b} "
                        f"queue {q}: give a startingOffsets (or startingTimestamp) before the "
                        "endingOffsets (or endingTimestamp)"
                    )
                first = lo.get(k, 0)
                if s < first:
                    if o.fail_on_data_loss:
                        raise DataLossError(
                            f"startingOffsets asks for offset {s} of queue {t}/{b}/{q}, which now starts at {first}; "
                            "set failOnDataLoss=false to read from there"
                        )
                    s = first
                out.extend(
                    split_cluster_range(t, b, q, s, min(e, top), ctx, o.max_records_per_partition)
                )
            return out
        finally:
            self.planner.close()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        task_started()
        if self._arrow_schema is None:
            self._arrow_schema = arrow_schema(self.schema)
        if not isinstance(partition, ClusterRange):
            return iter(())
        return read_rows(partition, self._arrow_schema)
