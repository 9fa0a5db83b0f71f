"""Format rmq with ``namesrvAddr`` against rmq-broker's NameServer and remoting port as production
clusters run: ``--acl`` (requests signed as the Java client's AclClientRPCHook; allowed reads,
writes and commits; refusals that name the broker, its address, the request, the resource and
the code, never the secret), ``startingOffsets=group`` (through the remoting port and through
rmq-broker's own ``endpoints``) and ``namespace``."""

from __future__ import annotations

import json
import logging

import pytest

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.cluster import ClusterClient, Credentials

pytestmark = pytest.mark.spark

ADMIN = Credentials("admin", "adm-Secret-7c1")
SPARK_SECRET = "spk-Secret-93f"
WRONG_SECRET = "wrong-Secret-5d2"
STRANGER_SECRET = "str-Secret-e40"
ACCOUNTS = {"accounts": [
    {"accessKey": "admin", "secretKey": ADMIN.secret_key, "admin": True},
    {"accessKey": "spark", "secretKey": SPARK_SECRET, "topicPerms": ["AclT=PUB|SUB"], "groupPerms": ["acl-cg=SUB"],
     "defaultGroupPerm": "SUB"},
    {"accessKey": "stranger", "secretKey": STRANGER_SECRET, "topicPerms": ["OtherT=PUB|SUB"]},
]}  # fmt: skip


def _broker(root, acl: bool):
    if acl:
        (root / "acl.json").write_text(json.dumps(ACCOUNTS))
    opts = BrokerOptions(
        listen="127.0.0.1:0",
        remoting_listen="127.0.0.1:0",
        namesrv_listen="127.0.0.1:0",
        acl_path=str(root / "acl.json") if acl else None,
    )
    return Broker(str(root / "store"), options=opts)


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    with _broker(tmp_path_factory.mktemp("acl"), acl=True) as b:
        yield b


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with _broker(tmp_path_factory.mktemp("plain"), acl=False) as b:
        yield b


def put(
    ns: str, topic: str, bodies: list[str], creds: Credentials | None = None, queues: int = 4
) -> str:
    """The topic with ``queues`` queues, ``bodies`` sent round robin; returns the broker's name."""
    with ClusterClient(ns, credentials=creds) as c:
        (name,) = c.cluster_brokers()
        c.create_topic(name, topic, queues)
        c.route(topic, refresh=True)
        for i, b in enumerate(bodies):
            c.send_message(name, "pg", topic, i % queues, b.encode(), {})
    return name


def stream_all(df, checkpoint: str, select: str = "body") -> list[tuple]:
    got: list[tuple] = []

    def collect(batch_df, batch_id: int) -> None:
        got.extend(tuple(r) for r in batch_df.selectExpr(*select.split(",")).collect())

    q = (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    return sorted(got)


# -- ACL ---------------------------------------------------------------------------------------------


def test_signed_reads_writes_and_commits_pass(spark, acl_broker, tmp_path):
    ns = acl_broker.namesrv_endpoint
    name = put(ns, "AclT", [], ADMIN)
    creds = {"namesrvAddr": ns, "accessKey": "spark", "secretKey": SPARK_SECRET}
    rows = spark.createDataFrame([(f"w{i}".encode(),) for i in range(12)], "body binary")
    rows.write.format("rmq").options(**creds).option("topic", "AclT").mode("append").save()
    got = (
        spark.read.format("rmq")
        .options(**creds)
        .option("topics", "AclT")
        .load()
        .select("body", "brokerName")
    )
    assert sorted(tuple(r) for r in got.collect()) == sorted(
        (f"w{i}".encode(), name) for i in range(12)
    )
    s = (
        spark.readStream.format("rmq")
        .options(**creds)
        .option("topics", "AclT")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "4")
        .option("consumerGroup", "acl-cg")
        .load()
    )
    assert stream_all(s, str(tmp_path / "ck")) == sorted((f"w{i}".encode(),) for i in range(12))
    with ClusterClient(ns, credentials=ADMIN) as c:
        committed = sum(c.query_consumer_offset(name, "acl-cg", "AclT", q) or 0 for q in range(4))
    assert 0 < committed <= 12  # the stream commits one batch late


@pytest.mark.parametrize("who", ["wrong secret", "no permission"])
def test_refusals_name_broker_request_resource_and_code_never_the_secret(
    spark, acl_broker, who, caplog
):
    ns = acl_broker.namesrv_endpoint
    put(ns, "AclT", ["x"], ADMIN)
    key, secret = (
        ("spark", WRONG_SECRET) if who == "wrong secret" else ("stranger", STRANGER_SECRET)
    )
    opts = {"namesrvAddr": ns, "accessKey": key, "secretKey": secret}
    caplog.set_level(logging.DEBUG, logger="rmq_spark")
    with pytest.raises(Exception) as read_err:
        spark.read.format("rmq").options(**opts).option("topics", "AclT").load().collect()
    rows = spark.createDataFrame([(b"y",)], "body binary")
    with pytest.raises(Exception) as write_err:
        rows.write.format("rmq").options(**opts).option("topic", "AclT").mode("append").save()
    with ClusterClient(ns, credentials=Credentials(key, secret)) as c:
        (name,) = c.cluster_brokers()
        with pytest.raises(Exception) as commit_err:
            c.update_consumer_offset(name, "acl-cg", "AclT", 0, 1)
    addr = acl_broker.remoting_endpoint
    for err, request in (
        (read_err, "GET_MAX_OFFSET (30)"),
        (write_err, "SEND_BATCH_MESSAGE (320)"),
        (commit_err, "UPDATE_CONSUMER_OFFSET (15)"),
    ):
        text = str(err.value)
        assert request in text and f"at {addr}" in text and "AclT" in text, text
        assert "NO_PERMISSION (16)" in text, text
        assert secret not in text
    assert secret not in caplog.text


# -- startingOffsets=group ---------------------------------------------------------------------------


def test_group_offsets_start_each_queue_through_namesrv_addr(spark, broker, tmp_path):
    ns = broker.namesrv_endpoint
    name = put(ns, "GrpT", [f"m{i}" for i in range(40)])  # 10 per queue
    with ClusterClient(ns) as c:
        c.update_consumer_offset(name, "app-cg", "GrpT", 0, 3)
        c.update_consumer_offset(name, "app-cg", "GrpT", 1, 7)
    base = {
        "namesrvAddr": ns,
        "topics": "GrpT",
        "startingOffsets": "group",
        "consumerGroup": "app-cg",
    }

    def batch(**extra: str) -> list[tuple]:
        df = (
            spark.read.format("rmq")
            .options(**base, **extra)
            .load()
            .select("queueId", "queueOffset")
        )
        return sorted(tuple(r) for r in df.collect())

    committed = [(0, o) for o in range(3, 10)] + [(1, o) for o in range(7, 10)]
    assert batch() == sorted(
        committed + [(q, o) for q in (2, 3) for o in range(10)]
    )  # batch fallback: earliest
    assert batch(startingOffsetsFallback="latest") == committed
    s = spark.readStream.format("rmq").options(**base).load()  # a stream's fallback: latest
    assert stream_all(s, str(tmp_path / "ck"), "queueId,queueOffset") == committed
    # the connector's own commits: a stream of group spark-cg, then another starting from them
    first = (
        spark.readStream.format("rmq")
        .option("namesrvAddr", ns)
        .option("topics", "GrpT")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "12")
        .option("consumerGroup", "spark-cg")
        .load()
    )
    stream_all(first, str(tmp_path / "ck1"))
    with ClusterClient(ns) as c:
        at = {q: c.query_consumer_offset(name, "spark-cg", "GrpT", q) for q in range(4)}
    assert (
        0 < sum(v or 0 for v in at.values()) < 40
    )  # one batch late: the last batch is not committed
    then = spark.readStream.format("rmq").options(**{**base, "consumerGroup": "spark-cg"}).load()
    want = sorted((q, o) for q in range(4) for o in range(at[q], 10) if at[q] is not None)
    assert stream_all(then, str(tmp_path / "ck2"), "queueId,queueOffset") == want


def test_group_offsets_start_each_queue_through_endpoints(spark, broker, tmp_path):
    from rmq_spark.broker.connector.client import InternalClient

    put(broker.namesrv_endpoint, "GrpE", [f"m{i}" for i in range(20)])  # 5 per queue
    with InternalClient(broker.endpoints) as c:
        c.commit_offsets("app-e", {"GrpE": {"0": 2, "3": 4}})
    base = {
        "endpoints": broker.endpoints,
        "topics": "GrpE",
        "startingOffsets": "group",
        "consumerGroup": "app-e",
    }
    df = spark.read.format("rmq").options(**base).load().select("queueId", "queueOffset")
    committed = [(0, o) for o in range(2, 5)] + [(3, 4)]
    assert sorted(tuple(r) for r in df.collect()) == sorted(
        committed + [(q, o) for q in (1, 2) for o in range(5)]
    )
    s = spark.readStream.format("rmq").options(**base).load()
    assert stream_all(s, str(tmp_path / "ck"), "queueId,queueOffset") == committed


# -- namespace ---------------------------------------------------------------------------------------


def test_namespace_maps_topics_and_groups_as_the_java_client(spark, broker, tmp_path):
    ns = broker.namesrv_endpoint
    name = put(ns, "prod%NsT", [])
    opts = {"namesrvAddr": ns, "namespace": "prod"}
    rows = spark.createDataFrame([(f"n{i}".encode(),) for i in range(8)], "body binary")
    rows.write.format("rmq").options(**opts).option("topic", "NsT").mode("append").save()
    with ClusterClient(ns) as c:  # stored under the namespaced name
        assert sum(c.get_max_offset(name, "prod%NsT", q) for q in range(4)) == 8
        assert "NsT" not in c.topics()
    got = (
        spark.read.format("rmq")
        .options(**opts)
        .option("topics", "NsT")
        .load()
        .select("topic", "body", "queueId", "queueOffset")
        .collect()
    )
    assert sorted(tuple(r)[:2] for r in got) == sorted(("NsT", f"n{i}".encode()) for i in range(8))
    pattern = (
        spark.read.format("rmq")
        .options(**opts)
        .option("topicPattern", "Ns.*")
        .load()
        .select("topic")
    )
    assert {r.topic for r in pattern.collect()} == {"NsT"}
    q0 = max(range(4), key=lambda q: sum(r.queueId == q for r in got))
    start = json.dumps(
        {"NsT": {name: {str(q0): 1}}}
    )  # offsets name the topic without the namespace
    part = (
        spark.read.format("rmq")
        .options(**opts)
        .option("topics", "NsT")
        .option("startingOffsets", start)
        .load()
        .select("queueId", "queueOffset")
        .collect()
    )
    assert sorted(tuple(r) for r in part) == sorted(
        (r.queueId, r.queueOffset) for r in got if (r.queueId, r.queueOffset) != (q0, 0)
    )
    s = (
        spark.readStream.format("rmq")
        .options(**opts)
        .option("topics", "NsT")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "3")
        .option("consumerGroup", "cg")
        .load()
    )
    assert stream_all(s, str(tmp_path / "ck"), "topic,body") == sorted(
        ("NsT", f"n{i}".encode()) for i in range(8)
    )
    with ClusterClient(ns) as c:
        assert (
            sum(c.query_consumer_offset(name, "prod%cg", "prod%NsT", q) or 0 for q in range(4)) > 0
        )
        assert all(c.query_consumer_offset(name, "cg", "prod%NsT", q) is None for q in range(4))
    again = (
        spark.readStream.format("rmq")
        .options(**opts)
        .option("topics", "NsT")
        .option("startingOffsets", "group")
        .option("consumerGroup", "cg")
        .load()
    )
    rest = stream_all(again, str(tmp_path / "ck2"), "topic,body")
    assert rest and {t for t, _ in rest} == {"NsT"} and len(rest) < 8
