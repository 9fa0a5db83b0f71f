"""The data source on whichever pyspark release is installed (``make test-spark-versions`` runs
this module on 4.0, 4.1 and 4.2 too): what the release offers is found by trying it, and where it
lacks admission control the stream applies its limits itself, called as pyspark 4.0 and 4.1 call
it (``latestOffset()`` with no start and no limit; after a restart an empty
``partitions(end, end)`` of the last planned batch first), and refuses ``Trigger.AvailableNow``
with a limit by name."""

from __future__ import annotations

import importlib.util

import pyarrow as pa
import pyspark.sql.datasource as spark_datasource
import pytest
from test_datasource_internal import Broker
from test_datasource_planning import fill

import rmq_spark
from rmq_spark.datasource import offsets as O
from rmq_spark.datasource.embedded import stop_broker
from rmq_spark.datasource.options import parse_source_options
from rmq_spark.datasource.releases import (
    ADMISSION_CONTROL,
    FILTER_PUSHDOWN,
    arrow_schema,
)
from rmq_spark.datasource.schema import SOURCE_FIELDS
from rmq_spark.datasource.source import RmqDataSource
from rmq_spark.datasource.stream_reader import RmqStreamReader, SourceAdmittedStreamReader
from rmq_spark.datasource.testing import produce
from rmq_spark.errors import ConfigError


@pytest.fixture
def broker(store_dir):
    b = Broker(store_dir)
    yield b
    b.close()


def admitted(broker: Broker, **options: str) -> SourceAdmittedStreamReader:
    opts = {"endpoints": f"127.0.0.1:{broker.port}", "topics": "T", **options}
    return SourceAdmittedStreamReader(parse_source_options(opts, streaming=True), SOURCE_FIELDS)


def run_as_pyspark_4_0(r: SourceAdmittedStreamReader, start: dict | None = None) -> list[int]:
    """Spark 4.0's micro-batch loop over a source without admission control: latestOffset(),
    then the batch planned from where the last one ended; the rows of every batch."""
    sizes = []
    while True:
        end = r.latestOffset()
        begin = start if start is not None else r.initialOffset()
        if O.same(end, begin):
            return sizes
        r.partitions(begin, end)
        sizes.append(O.total_rows(begin, end))
        start = end


def test_the_release_is_known_by_what_it_offers():
    assert hasattr(spark_datasource, "EqualTo") == FILTER_PUSHDOWN
    assert (
        importlib.util.find_spec("pyspark.sql.streaming.datasource") is not None
    ) == ADMISSION_CONTROL
    stream = RmqDataSource({"endpoints": "127.0.0.1:1", "topics": "T"}).streamReader(SOURCE_FIELDS)
    assert isinstance(stream, SourceAdmittedStreamReader) != ADMISSION_CONTROL
    assert isinstance(stream, RmqStreamReader)
    ts = arrow_schema(SOURCE_FIELDS).field("storeTimestamp").type
    assert ts == pa.timestamp("us", tz="UTC")


def test_without_admission_control_the_source_limits_every_batch_itself(broker):
    fill(broker, {0: 90, 1: 10})
    sizes = run_as_pyspark_4_0(
        admitted(broker, startingOffsets="earliest", maxOffsetsPerTrigger="20")
    )
    assert sum(sizes) == 100 and len(sizes) >= 5 and all(n <= 21 for n in sizes)
    # no limit: everything in one batch
    assert run_as_pyspark_4_0(admitted(broker, startingOffsets="earliest")) == [100]


def test_after_a_restart_the_source_continues_from_the_batch_spark_names(broker):
    fill(broker, {0: 60})
    first = admitted(broker, startingOffsets="earliest", maxOffsetsPerTrigger="25")
    end = first.latestOffset()
    first.partitions(first.initialOffset(), end)
    assert O.total_rows(first.initialOffset(), end) == 25
    # a new query process: Spark names the end of the last planned batch before asking
    again = admitted(broker, startingOffsets="earliest", maxOffsetsPerTrigger="25")
    again.partitions(end, end)
    assert run_as_pyspark_4_0(again, end) == [25, 10]


def test_min_offsets_per_trigger_waits_without_admission_control(broker):
    fill(broker, {0: 3})
    r = admitted(broker, startingOffsets="earliest", minOffsetsPerTrigger="5", maxTriggerDelay="1h")
    start = r.initialOffset()
    assert O.same(r.latestOffset(), start)  # 3 < 5: no batch
    fill(broker, {1: 2})
    assert O.total_rows(start, r.latestOffset()) == 5


def test_available_now_with_a_limit_is_refused_when_the_source_sees_it(broker):
    """AvailableNow on 4.0/4.1 asks latestOffset() once, before Spark names where a restarted
    query is: the batch it then plans starts elsewhere."""
    fill(broker, {0: 40})
    first = admitted(broker, startingOffsets="earliest", maxOffsetsPerTrigger="10")
    end = first.latestOffset()
    first.partitions(first.initialOffset(), end)
    again = admitted(broker, startingOffsets="earliest", maxOffsetsPerTrigger="10")
    again.latestOffset()  # AvailableNow's one question, from the starting offsets
    with pytest.raises(ConfigError, match=r"Trigger\.AvailableNow .* needs pyspark 4\.2"):
        again.partitions(end, end)
    # without a limit its one answer is everything there is: nothing to refuse
    unlimited = admitted(broker, startingOffsets="earliest")
    assert O.total_rows(end, unlimited.latestOffset()) == 30
    unlimited.partitions(end, end)


@pytest.mark.spark
def test_available_now_with_a_limit_runs_in_limited_batches_or_is_refused_by_name(
    spark, store_dir, tmp_path
):
    """A release with admission control (4.2+) runs AvailableNow with ``maxOffsetsPerTrigger``
    as batches of at most the limit up to the end; one without (4.0, 4.1) cannot, and the query
    is refused by name when it starts."""
    rmq_spark.register(spark)
    produce(store_dir, "A", [f"m{i}" for i in range(30)])
    try:

        def stream(**options: str):
            r = (spark.readStream.format("rmq").option("path", store_dir).option("topics", "A")
                 .option("startingOffsets", "earliest"))  # fmt: skip
            for k, v in options.items():
                r = r.option(k, v)
            return r.load()

        limited = (stream(maxOffsetsPerTrigger="10").writeStream
                   .option("checkpointLocation", str(tmp_path / "ck1")).trigger(availableNow=True))  # fmt: skip
        if ADMISSION_CONTROL:
            batches: dict[int, int] = {}
            q = limited.foreachBatch(lambda b, i: batches.__setitem__(i, b.count())).start()
            q.awaitTermination(300)
            assert q.exception() is None, q.exception()
            assert sum(batches.values()) == 30 and max(batches.values()) <= 10, batches
        else:
            with pytest.raises(ConfigError, match=r"Trigger\.AvailableNow"):
                limited.format("noop").start()
        # without a limit Spark runs it as one batch of everything there is
        got: list = []
        q = (stream().writeStream.option("checkpointLocation", str(tmp_path / "ck2"))
             .foreachBatch(lambda b, _i: got.extend(b.select("body").collect()))
             .trigger(availableNow=True).start())  # fmt: skip
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
        assert sorted(r.body for r in got) == sorted(f"m{i}".encode() for i in range(30))
    finally:
        stop_broker(store_dir)
