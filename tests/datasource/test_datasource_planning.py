"""The stream reader's driver-side planning, called directly (as Spark's planning worker does)
against an in-process broker: initial offsets, admission control, AvailableNow, offsets that
never move backwards, data loss, partitions.  No SparkSession."""

from __future__ import annotations

import time

import pytest
from test_datasource_internal import Broker

from rmq_spark.datasource import offsets as O
from rmq_spark.datasource.options import parse_source_options
from rmq_spark.datasource.read.partition import DataLossError, QueueRange
from rmq_spark.datasource.releases import ReadAllAvailable, ReadMaxRows, ReadMinRows
from rmq_spark.datasource.schema import SOURCE_FIELDS
from rmq_spark.datasource.stream_reader import RmqStreamReader
from rmq_spark.datasource.testing import produce


@pytest.fixture
def broker(store_dir):
    b = Broker(store_dir)
    yield b
    b.close()


def reader(broker: Broker, **options: str) -> RmqStreamReader:
    opts = {"endpoints": f"127.0.0.1:{broker.port}", "topics": "T", **options}
    return RmqStreamReader(parse_source_options(opts, streaming=True), SOURCE_FIELDS)


def fill(broker: Broker, per_queue: dict[int, int], topic: str = "T") -> None:
    for q, n in per_queue.items():
        if n:
            produce(broker.client, topic, [f"{q}-{i}" for i in range(n)], queueId=[q] * n)


def test_initial_offsets(broker):
    fill(broker, {0: 3, 1: 5})
    assert reader(broker).initialOffset() == {"T": {"0": 3, "1": 5, "2": 0, "3": 0}}
    assert reader(broker, startingOffsets="earliest").initialOffset() == {
        "T": {"0": 0, "1": 0, "2": 0, "3": 0}
    }
    r = reader(broker, startingOffsets='{"T": {"1": 2, "0": -1}}')
    assert r.initialOffset() == {"T": {"0": 3, "1": 2, "2": 0, "3": 0}}
    mark = int(time.time() * 1000) + 5
    time.sleep(0.02)
    fill(broker, {0: 1})
    assert reader(broker, startingTimestamp=str(mark)).initialOffset() == {
        "T": {"0": 3, "1": 5, "2": 0, "3": 0}
    }
    # cached: the second call (Spark makes two) answers the same even when data arrived between
    r = reader(broker)
    first = r.initialOffset()
    fill(broker, {2: 4})
    assert r.initialOffset() == first


def test_latest_offset_returns_start_itself_when_nothing_is_new(broker):
    fill(broker, {0: 2})
    r = reader(broker, startingOffsets="earliest")
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {"T": {"0": 2, "1": 0, "2": 0, "3": 0}}
    assert O.to_json(r.latestOffset(end, ReadAllAvailable())) == O.to_json(end)
    # keys arriving in another order (JSON round trip) still give the canonical text back
    shuffled = {"T": dict(reversed(list(end["T"].items())))}
    assert list(r.latestOffset(shuffled, ReadAllAvailable())["T"]) == ["0", "1", "2", "3"]


def test_max_offsets_per_trigger(broker):
    fill(broker, {0: 90, 1: 10})
    r = reader(broker, startingOffsets="earliest", maxOffsetsPerTrigger="20")
    assert r.getDefaultReadLimit() == ReadMaxRows(20)
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert end == {"T": {"0": 18, "1": 2, "2": 0, "3": 0}}
    total, s = O.total_rows(start, end), end
    while True:
        e = r.latestOffset(s, r.getDefaultReadLimit())
        if O.same(e, s):
            break
        assert O.total_rows(s, e) <= 21
        total += O.total_rows(s, e)
        s = e
    assert total == 100
    # Trigger.Once hands ReadAllAvailable: everything at once, whatever the options say
    assert r.latestOffset(start, ReadAllAvailable()) == {"T": {"0": 90, "1": 10, "2": 0, "3": 0}}


def test_min_offsets_per_trigger_waits_until_max_trigger_delay(broker):
    fill(broker, {0: 3})
    r = reader(broker, startingOffsets="earliest", minOffsetsPerTrigger="5", maxTriggerDelay="1h")
    assert r.getDefaultReadLimit() == ReadMinRows(5)
    start = r.initialOffset()
    assert O.same(r.latestOffset(start, r.getDefaultReadLimit()), start)  # 3 < 5: skip the trigger
    fill(broker, {1: 2})
    assert O.total_rows(start, r.latestOffset(start, r.getDefaultReadLimit())) == 5
    s2 = r.latestOffset(start, ReadAllAvailable())
    fill(broker, {0: 1})
    assert O.same(
        r.latestOffset(s2, r.getDefaultReadLimit()), s2
    )  # 1 < 5 and the delay has not passed
    r._last_batch_ms -= 3_600_001  # an hour later: take what there is
    assert O.total_rows(s2, r.latestOffset(s2, r.getDefaultReadLimit())) == 1


def test_available_now_never_passes_its_target(broker):
    fill(broker, {0: 10})
    r = reader(
        broker, startingOffsets="earliest", maxOffsetsPerTrigger="4", minOffsetsPerTrigger="3"
    )
    r.prepareForTriggerAvailableNow()
    fill(broker, {0: 5, 3: 2})  # after the target: not for this run
    s = r.initialOffset()
    sizes = []
    while True:
        e = r.latestOffset(s, r.getDefaultReadLimit())
        if O.same(e, s):
            break
        sizes.append(O.total_rows(s, e))
        s = e
    assert sizes == [4, 4, 2]  # the last one is below minOffsetsPerTrigger: AvailableNow must end
    assert s == {"T": {"0": 10, "1": 0, "2": 0, "3": 0}}


def test_new_topics_and_queues(broker):
    fill(broker, {0: 1}, topic="P1")
    r = RmqStreamReader(
        parse_source_options(
            {"endpoints": f"127.0.0.1:{broker.port}", "topicPattern": "P[0-9]+"}, streaming=True
        ),
        SOURCE_FIELDS,
    )
    start = r.initialOffset()
    assert list(start) == ["P1"]
    fill(broker, {1: 2}, topic="P22")
    fill(broker, {0: 1}, topic="Q")
    end = r.latestOffset(start, ReadAllAvailable())
    assert list(end) == ["P1", "P22"] and end["P22"]["1"] == 2
    parts = r.partitions(start, end)
    assert [(p.topic, p.queue_id, p.start, p.end) for p in parts] == [("P22", 1, 0, 2)]
    a = RmqStreamReader(
        parse_source_options(
            {"endpoints": f"127.0.0.1:{broker.port}", "assign": '{"P22": [1, 3]}'}, streaming=True
        ),
        SOURCE_FIELDS,
    )
    assert a.initialOffset() == {"P22": {"1": 2, "3": 0}}


def test_offsets_never_move_backwards_and_loss_is_reported(broker):
    fill(broker, {0: 4})
    r = reader(broker)
    ahead = {"T": {"0": 9, "1": 0, "2": 0, "3": 0}}  # as if the store had lost offsets 4..8
    with pytest.raises(DataLossError, match="below the 9 already read"):
        r.latestOffset(ahead, ReadAllAvailable())
    lenient = reader(broker, failOnDataLoss="false")
    assert lenient.latestOffset(ahead, ReadAllAvailable()) is not None
    assert lenient.latestOffset(ahead, ReadAllAvailable())["T"]["0"] == 9


def test_partitions_split_and_clamp(broker):
    fill(broker, {0: 10, 1: 3})
    r = reader(broker, maxRecordsPerPartition="4")
    parts = r.partitions({"T": {"0": 1, "1": 5}}, {"T": {"0": 10, "1": 3, "2": 0}})
    got = [(p.queue_id, p.start, p.end) for p in parts]
    assert got == [(0, 1, 5), (0, 5, 9), (0, 9, 10)]  # queue 1: start past end (batch-0 replay)
    assert all(
        isinstance(p, QueueRange) and p.ctx.store_root == broker.core.store.root for p in parts
    )


def test_report_latest_offset_and_group_commit(broker):
    fill(broker, {0: 2, 2: 1})
    r = reader(broker, consumerGroup="spark-g")
    assert r.reportLatestOffset() == {"T": {"0": 2, "1": 0, "2": 1, "3": 0}}
    r.commit({"T": {"0": 2, "2": 1}})
    assert broker.client.query_offsets("spark-g", ["T"]) == {"T": {"0": 2, "2": 1}}


def test_executors_off_the_brokers_host_read_through_its_bulk_read_by_default(broker, monkeypatch):
    """readPath=auto: a partition read where the store files are out of reach (another host)
    goes through the broker's bulk Arrow read, not PullMessage, and gives the rows the files give."""
    from dataclasses import replace

    from rmq_spark.datasource import scan

    fill(broker, {0: 7, 1: 4})
    r = reader(broker, startingOffsets="earliest")
    parts = r.partitions({"T": {"0": 0, "1": 0}}, {"T": {"0": 7, "1": 4}})

    def rows(partitions: list) -> list[tuple]:
        return sorted((b["queueId"], b["queueOffset"], b["body"]) for p in partitions for t in r.read(p)
                      for b in t.to_pylist())  # fmt: skip

    local = rows(parts)
    assert len(local) == 11
    elsewhere = [replace(p, ctx=replace(p.ctx, store_host="another-host")) for p in parts]
    monkeypatch.setattr(
        scan, "read_pull", lambda p: pytest.fail("auto must not fall back to PullMessage")
    )
    called = []
    real = scan.read_arrow
    monkeypatch.setattr(scan, "read_arrow", lambda p: called.append(p) or real(p))
    assert rows(elsewhere) == local
    assert len(called) == len(parts)
