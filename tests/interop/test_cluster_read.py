"""Format rmq reading a RocketMQ cluster with ``namesrvAddr``: against a real Apache RocketMQ
(a NameServer and two brokers from Maven Central's jars) and against rmq-broker through its
remoting port and NameServer (``target``: the same tests, the same assertions).

Messages are sent with the project's cluster client (SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE, as
the Java producer sends them) spread over every broker; mqadmin checks the group's progress.
"""

from __future__ import annotations

import glob
import json
import os
import threading
import time

import pytest

from rmq_spark.cluster import ClusterClient

pytestmark = pytest.mark.spark


def _wait(condition, what: str, timeout_s: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def make_topic(target, topic: str, queues: int = 4) -> list[str]:
    """The topic on every broker of the target's cluster; returns the broker names."""
    with ClusterClient(target.namesrv_addr) as c:
        brokers = c.cluster_brokers()
        for b in brokers:
            c.create_topic(b, topic, queues)
    target.wait_route(topic)
    with ClusterClient(target.namesrv_addr) as c:
        _wait(
            lambda: set(c.route(topic, refresh=True).brokers) == set(brokers),
            f"route of {topic} on {brokers}",
            60,
        )
    return sorted(brokers)


def send(
    target,
    topic: str,
    bodies: list[str],
    *,
    brokers: list[str] | None = None,
    queues: int = 4,
    props: dict[str, str] | None = None,
) -> dict[str, list[str]]:
    """``bodies`` in batches, round robin over (broker, queue); returns broker -> bodies sent there."""
    out: dict[str, list[str]] = {}
    with ClusterClient(target.namesrv_addr) as c:
        names = brokers or sorted(c.route(topic, refresh=True).brokers)
        slots = [(b, q) for b in names for q in range(queues)]
        per: dict[tuple[str, int], list[str]] = {}
        for i, body in enumerate(bodies):
            per.setdefault(slots[i % len(slots)], []).append(body)
        for (b, q), group in per.items():
            for i in range(0, len(group), 200):
                chunk = group[i : i + 200]
                c.send_batch(
                    b,
                    "spark-test-p",
                    topic,
                    q,
                    [(x.encode(), {"TAGS": x.split("-")[0], **(props or {})}, 0) for x in chunk],
                )
            out.setdefault(b, []).extend(group)
    return out


def reader(spark, target, topic: str, stream: bool = False, **options: str):
    r = (
        (spark.readStream if stream else spark.read)
        .format("rmq")
        .option("namesrvAddr", target.namesrv_addr)
    )
    r = r.option("topics", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def run_batches(df, checkpoint: str, select: str) -> dict[int, list]:
    got: dict[int, list] = {}

    def collect(batch_df, batch_id: int) -> None:
        got[batch_id] = sorted(tuple(r) for r in batch_df.selectExpr(*select.split(",")).collect())

    q = (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(600)
    assert q.exception() is None, q.exception()
    return got


def test_batch_and_stream_over_every_broker_with_replays(spark, target, names, tmp_path):
    topic = f"{names}_T"[-60:]
    brokers = make_topic(target, topic)
    sent = send(target, topic, [f"a-{i}" for i in range(400)])
    assert sorted(sent) == brokers
    cols = "brokerName,queueId,queueOffset,body,msgId"
    rows = sorted(
        tuple(r) for r in reader(spark, target, topic).selectExpr(*cols.split(",")).collect()
    )
    assert sorted(r[3].decode() for r in rows) == sorted(f"a-{i}" for i in range(400))
    assert {r[0] for r in rows} == set(brokers)
    assert {(r[0], r[3].decode()) for r in rows} == {(b, x) for b, xs in sent.items() for x in xs}
    assert (
        sorted(
            tuple(r) for r in reader(spark, target, topic).selectExpr(*cols.split(",")).collect()
        )
        == rows
    )

    # offsets name the broker; endingOffsets with -1 (latest)
    first = brokers[0]
    bounded = reader(
        spark,
        target,
        topic,
        startingOffsets=json.dumps({topic: {first: {"0": 10}}}),
        endingOffsets=json.dumps({topic: {first: {"0": 20, "1": -1}}}),
    ).select("brokerName", "queueId", "queueOffset")
    got = sorted(tuple(r) for r in bounded.collect())
    assert [r for r in got if r[0] == first and r[1] == 0] == [(first, 0, o) for o in range(10, 20)]
    assert len(got) == 400 - 10 - (len(sent[first]) // 4 - 20)

    # a stream in limited batches: every message once; batch N replayed after a lost commit is identical
    ck = str(tmp_path / "ck")
    df = reader(
        spark, target, topic, stream=True, startingOffsets="earliest", maxOffsetsPerTrigger="120"
    )
    batches = run_batches(df, ck, cols)
    assert sorted(r for b in batches.values() for r in b) == rows
    last = max(batches)
    assert last >= 3
    for f in glob.glob(os.path.join(ck, "commits", f"{last}")) + glob.glob(
        os.path.join(ck, "commits", f".{last}.crc")
    ):
        os.remove(f)
    mark = int(time.time() * 1000)
    time.sleep(0.05)
    send(target, topic, [f"b-{i}" for i in range(60)])
    again = run_batches(df, ck, cols)
    assert again[last] == batches[last]
    assert sorted(r[3].decode() for b, rs in again.items() if b > last for r in rs) == sorted(
        f"b-{i}" for i in range(60)
    )
    offsets = json.loads(
        (tmp_path / "ck" / "offsets" / str(max(again))).read_text().splitlines()[-1]
    )
    assert (
        sorted(offsets[topic]) == brokers
        and sum(o for qs in offsets[topic].values() for o in qs.values()) == 460
    )

    # startingTimestamp: SEARCH_OFFSET_BY_TIMESTAMP on every queue of every broker
    since = reader(spark, target, topic, startingTimestamp=str(mark)).select("body").collect()
    assert sorted(r.body.decode() for r in since) == sorted(f"b-{i}" for i in range(60))


def test_filters_consumer_group_and_mqadmin_progress(spark, target, java, names, tmp_path):
    topic, group = f"{names}_T"[-60:], f"{names}_G"[-60:]
    make_topic(target, topic, queues=2)
    send(
        target,
        topic,
        [f"{'TagA' if i % 3 == 0 else 'TagB'}-{i}" for i in range(90)],
        queues=2,
        props={"k": "v"},
    )
    tagged = reader(spark, target, topic, tags="TagA").select("tags", "body").collect()
    assert sorted(r.body.decode() for r in tagged) == sorted(f"TagA-{i}" for i in range(0, 90, 3))
    with ClusterClient(target.namesrv_addr) as c:
        b0 = sorted(c.route(topic).brokers)[0]
        c.send_message(b0, "spark-test-p", topic, 0, b"sql-hit", {"TAGS": "TagC", "n": "7"})
    by_sql = reader(spark, target, topic, sql="n > 5").select("body").collect()
    assert [r.body for r in by_sql] == [b"sql-hit"]

    df = reader(
        spark,
        target,
        topic,
        stream=True,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="40",
        consumerGroup=group,
    )
    run_batches(df, str(tmp_path / "ck"), "body")
    with ClusterClient(target.namesrv_addr) as c:
        route = c.route(topic)
        committed = {
            (b, q): c.query_consumer_offset(b, group, topic, q) or 0 for b, q in route.read_queues()
        }
        ends = {(b, q): c.get_max_offset(b, topic, q) for b, q in route.read_queues()}
    lag = sum(ends.values()) - sum(committed.values())
    assert (
        0 < lag < 91
    )  # Spark commits batch N-1 while planning batch N: the last is not committed yet
    # one mqadmin run may time out on a loaded machine (it prints the exception and exits 0): again
    runs: list[str] = []

    def progress_printed() -> bool:
        runs.append(java.mqadmin("consumerProgress", "-g", group))
        return "Diff Total:" in runs[-1]

    _wait(progress_printed, "mqadmin consumerProgress printing the group's progress")
    progress = runs[-1]
    assert f"Diff Total: {lag}" in progress, progress
    assert all(b in progress for b, _ in committed)


def test_delayed_messages_appear_after_their_delay(spark, target, names, tmp_path):
    topic = f"{names}_T"[-60:]
    brokers = make_topic(target, topic, queues=2)  # queue 1 of every broker stays idle
    with ClusterClient(target.namesrv_addr) as c:
        for b in brokers:
            c.send_message(b, "spark-test-p", topic, 0, f"now-{b}".encode(), {"TAGS": "now"})
            c.send_message(
                b, "spark-test-p", topic, 0, f"later-{b}".encode(), {"TAGS": "later", "DELAY": "2"}
            )
    got: list = []

    def collect(batch_df, _id: int) -> None:
        got.extend(batch_df.select("body", "bornTimestamp", "storeTimestamp").collect())

    q = (
        reader(spark, target, topic, stream=True, startingOffsets="earliest")
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        _wait(lambda: len(got) >= 2 * len(brokers) or q.exception() is not None, "every message")
    finally:
        q.stop()
    assert q.exception() is None
    by_body = {r.body.decode(): r for r in got}
    assert sorted(by_body) == sorted(
        [f"now-{b}" for b in brokers] + [f"later-{b}" for b in brokers]
    )
    for b in brokers:  # level 2 is 5 s: stored into the topic when it was due
        r = by_body[f"later-{b}"]
        assert (r.storeTimestamp - r.bornTimestamp).total_seconds() >= 5


def test_stream_goes_on_while_a_broker_restarts(spark, apache_cluster, names, tmp_path):
    """Apache RocketMQ only (two brokers): broker-b stopped mid-stream; broker-a's messages keep
    coming, broker-b's queues wait at their offsets; restarted, broker-b's new and old messages
    are read; every message exactly once."""

    class _T:
        namesrv_addr = apache_cluster.namesrv_addr

        @staticmethod
        def wait_route(topic: str) -> None:
            apache_cluster.wait_route(topic)

    target = _T()
    topic = f"{names}_T"[-60:]
    make_topic(target, topic, queues=2)
    send(target, topic, [f"one-{i}" for i in range(100)], queues=2)
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def collect(batch_df, _id: int) -> None:
        rows = [
            (r.brokerName, r.body.decode()) for r in batch_df.select("brokerName", "body").collect()
        ]
        with lock:
            seen.extend(rows)

    q = (
        reader(
            spark,
            target,
            topic,
            stream=True,
            startingOffsets="earliest",
            brokerUnavailableTimeout="10m",
        )
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        _wait(lambda: len(seen) >= 100 or q.exception() is not None, "first 100")
        apache_cluster.stop_broker("broker-b")
        send(target, topic, [f"two-{i}" for i in range(50)], brokers=["broker-a"], queues=2)
        _wait(
            lambda: len(seen) >= 150 or q.exception() is not None,
            "broker-a's messages while broker-b is down",
        )
        apache_cluster.start_broker("broker-b")
        apache_cluster.wait_route(topic)
        send(target, topic, [f"three-{i}" for i in range(50)], queues=2)
        _wait(
            lambda: len(seen) >= 200 or q.exception() is not None, "every message after the restart"
        )
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    bodies = sorted(b for _, b in seen)
    assert bodies == sorted(
        [f"one-{i}" for i in range(100)]
        + [f"two-{i}" for i in range(50)]
        + [f"three-{i}" for i in range(50)]
    )
    assert {b for b, x in seen if x.startswith("two-")} == {"broker-a"}
    assert {b for b, x in seen if x.startswith("three-")} == {"broker-a", "broker-b"}


def test_sql92_on_the_executor_where_the_broker_refuses_it(spark, names, tmp_path):
    """An Apache RocketMQ broker with ``enablePropertyFilter=false`` answers an SQL92 pull with
    SYSTEM_ERROR: the read filters on the executor instead, with the same rows."""
    from _apache import ApacheRocketMQ

    topic = f"{names}_T"[-60:]
    with ApacheRocketMQ(
        tmp_path / "apache",
        brokers=("broker-nf",),
        cluster="NoFilter",
        broker_config={"enablePropertyFilter": "false"},
    ) as cluster:
        make_topic(cluster, topic, queues=2)
        with ClusterClient(cluster.namesrv_addr) as c:
            for i in range(20):
                c.send_message(
                    "broker-nf",
                    "p",
                    topic,
                    i % 2,
                    f"m{i}".encode(),
                    {"TAGS": "A" if i % 2 else "B", "n": str(i)},
                )
            refused = None
            try:
                c.pull(
                    "broker-nf", topic, 0, 0, 32, "g", expression="n > 1", expression_type="SQL92"
                )
            except Exception as e:  # noqa: BLE001 -- the broker's answer is what is checked
                refused = e
            assert refused is not None and "SQL92" in str(refused), refused
        got = reader(spark, cluster, topic, sql="n >= 15", tags="A").select("body").collect()
        assert sorted(r.body for r in got) == [b"m15", b"m17", b"m19"]
