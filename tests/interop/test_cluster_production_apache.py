"""Format rmq with ``namesrvAddr`` against a real Apache RocketMQ 5.5.0 run as production clusters
are: access control, group offsets, namespaces.

ACL: 5.5.0 has no plain ACL 1.0 any more (no ``PlainAccessValidator``; ``aclEnable`` is read by
nothing).  Its ACL 2.0 (``authenticationEnabled`` / ``authorizationEnabled``, users and policies)
checks remoting requests signed exactly as ACL 1.0's ``AclClientRPCHook`` signs them, and
``migrateAuthFromV1Enabled`` turns a ``plain_acl.yml`` into users and policies at start: the
broker here is started with ACL 2.0 and the accounts of a plain ACL 1.0 file (``admin`` a super
user; ``stranger`` with PUB|SUB on another topic only), and ``spark`` gets an ACL 2.0 policy
(AUTH_CREATE_ACL): Pub, Sub and Get on topic AclT, Sub and Get on every group.  ACL 2.0 wants
Get beside Sub for a reader: GET_MAX_OFFSET, GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP and
QUERY_CONSUMER_OFFSET are Get requests (their headers' ``@RocketMQAction``), which a migrated
``PUB|SUB`` does not grant.

One NameServer and one broker serve the module's tests (the group-offset and namespace tests
run as the ``admin`` account).
"""

from __future__ import annotations

import json
import logging
import time

import pytest
from _apache import ApacheRocketMQ

from rmq_spark.cluster import ClusterClient, Credentials
from rmq_spark.datasource.cluster.planner import consumer_data

pytestmark = pytest.mark.spark

ADMIN = Credentials("admin", "adm-Secret-7c1a")
SPARK_SECRET = "spk-Secret-93fb"
WRONG_SECRET = "wrong-Secret-5d2e"
STRANGER_SECRET = "str-Secret-e40c"
PLAIN_ACL = f"""\
accounts:
  - accessKey: admin
    secretKey: {ADMIN.secret_key}
    admin: true
  - accessKey: spark
    secretKey: {SPARK_SECRET}
    admin: false
  - accessKey: stranger
    secretKey: {STRANGER_SECRET}
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - OtherT=PUB|SUB
"""
AUTH = "org.apache.rocketmq.auth."
AUTH_CREATE_ACL = 3006
ACL_CONFIG = {
    "authenticationEnabled": "true",
    "authorizationEnabled": "true",
    "authenticationProvider": AUTH + "authentication.provider.DefaultAuthenticationProvider",
    "authenticationMetadataProvider": AUTH
    + "authentication.provider.LocalAuthenticationMetadataProvider",
    "authorizationProvider": AUTH + "authorization.provider.DefaultAuthorizationProvider",
    "authorizationMetadataProvider": AUTH
    + "authorization.provider.LocalAuthorizationMetadataProvider",
    "migrateAuthFromV1Enabled": "true",
    "innerClientAuthenticationCredentials": json.dumps(
        {"accessKey": "admin", "secretKey": ADMIN.secret_key}
    ),
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ApacheRocketMQ(
        tmp_path_factory.mktemp("apache-acl"), brokers=("broker-a",), broker_config=ACL_CONFIG
    )
    (c.home / "conf").mkdir(parents=True, exist_ok=True)
    (c.home / "conf" / "plain_acl.yml").write_text(PLAIN_ACL)
    c.start()
    try:
        policy = {
            "subject": "User:spark",
            "policies": [
                {
                    "policyType": "Custom",
                    "entries": [
                        {
                            "resource": "Topic:AclT",
                            "actions": ["Pub", "Sub", "Get"],
                            "decision": "Allow",
                        },
                        {"resource": "Group:*", "actions": ["Sub", "Get"], "decision": "Allow"},
                    ],
                }
            ],
        }
        with ClusterClient(c.namesrv_addr, credentials=ADMIN) as admin:
            admin.cluster_brokers()
            admin.invoke(
                "broker-a", AUTH_CREATE_ACL, {"subject": "User:spark"}, json.dumps(policy).encode()
            )
        yield c
    finally:
        c.close()


def make_topic(cluster, topic: str, queues: int = 4) -> str:
    with ClusterClient(cluster.namesrv_addr, credentials=ADMIN) as c:
        c.create_topic("broker-a", topic, queues)
    cluster.wait_route(topic)
    return "broker-a"


def send(cluster, topic: str, bodies: list[str], queues: int = 4) -> None:
    with ClusterClient(cluster.namesrv_addr, credentials=ADMIN) as c:
        c.route(topic, refresh=True)
        for i, b in enumerate(bodies):
            c.send_message("broker-a", "pg", topic, i % queues, b.encode(), {})


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
    q.awaitTermination(600)
    assert q.exception() is None, q.exception()
    return sorted(got)


def test_signed_reads_writes_commits_and_clear_refusals(spark, cluster, tmp_path, caplog):
    ns = cluster.namesrv_addr
    make_topic(cluster, "AclT")
    spark_opts = {"namesrvAddr": ns, "accessKey": "spark", "secretKey": SPARK_SECRET}
    rows = spark.createDataFrame([(f"w{i}".encode(),) for i in range(12)], "body binary")
    rows.write.format("rmq").options(**spark_opts).option("topic", "AclT").mode("append").save()
    got = (
        spark.read.format("rmq")
        .options(**spark_opts)
        .option("topics", "AclT")
        .load()
        .select("body")
        .collect()
    )
    assert sorted(r.body for r in got) == sorted(f"w{i}".encode() for i in range(12))
    s = (
        spark.readStream.format("rmq")
        .options(**spark_opts)
        .option("topics", "AclT")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "4")
        .option("consumerGroup", "acl-cg")
        .load()
    )
    assert stream_all(s, str(tmp_path / "ck")) == sorted((f"w{i}".encode(),) for i in range(12))
    with ClusterClient(ns, credentials=ADMIN) as c:
        committed = sum(
            c.query_consumer_offset("broker-a", "acl-cg", "AclT", q) or 0 for q in range(4)
        )
    assert 0 < committed <= 12  # the stream commits one batch late

    caplog.set_level(logging.DEBUG, logger="rmq_spark")
    addr = cluster.broker_addr("broker-a")
    for key, secret in (("spark", WRONG_SECRET), ("stranger", STRANGER_SECRET)):
        opts = {"namesrvAddr": ns, "accessKey": key, "secretKey": secret}
        with pytest.raises(Exception) as read_err:
            spark.read.format("rmq").options(**opts).option("topics", "AclT").load().collect()
        with pytest.raises(Exception) as write_err:
            rows.limit(1).write.format("rmq").options(**opts).option("topic", "AclT").mode(
                "append"
            ).save()
        with ClusterClient(ns, credentials=Credentials(key, secret)) as c:
            with pytest.raises(Exception) as commit_err:
                c.update_consumer_offset("broker-a", "acl-cg", "AclT", 0, 1)
        for err, request in (
            (read_err, "GET_MAX_OFFSET (30)"),
            (write_err, "SEND_BATCH_MESSAGE (320)"),
            (commit_err, "UPDATE_CONSUMER_OFFSET (15)"),
        ):
            text = str(err.value)
            assert request in text and f"broker-a at {addr}" in text and "AclT" in text, text
            assert "NO_PERMISSION (16)" in text, text
            assert secret not in text
    assert (
        WRONG_SECRET not in caplog.text
        and STRANGER_SECRET not in caplog.text
        and SPARK_SECRET not in caplog.text
    )


def test_group_offsets_start_each_queue(spark, cluster, tmp_path):
    ns = cluster.namesrv_addr
    make_topic(cluster, "GrpT")
    send(cluster, "GrpT", [f"m{i}" for i in range(40)])  # 10 per queue
    with ClusterClient(ns, credentials=ADMIN) as c:
        # as a Java consumer: its heartbeat makes the group (Apache refuses offsets of unknown groups)
        c.route("GrpT", refresh=True)
        c.heartbeat("broker-a", consumers=[consumer_data("app-cg", ["GrpT"], None)])
        c.update_consumer_offset("broker-a", "app-cg", "GrpT", 0, 3)
        c.update_consumer_offset("broker-a", "app-cg", "GrpT", 1, 7)
        deadline = time.monotonic() + 30  # the broker answers the offset as soon as it has it
        while (
            c.query_consumer_offset("broker-a", "app-cg", "GrpT", 1) != 7
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
    base = {
        "namesrvAddr": ns,
        "accessKey": "admin",
        "secretKey": ADMIN.secret_key,
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
    # the connector's own commits, then a stream of the same group starting exactly there
    first = (
        spark.readStream.format("rmq")
        .options(**{**base, "consumerGroup": "spark-cg"})
        .option("startingOffsetsFallback", "earliest")
        .option("maxOffsetsPerTrigger", "12")
        .load()
    )
    assert len(stream_all(first, str(tmp_path / "ck1"))) == 40
    with ClusterClient(ns, credentials=ADMIN) as c:
        at = {q: c.query_consumer_offset("broker-a", "spark-cg", "GrpT", q) for q in range(4)}
    assert (
        0 < sum(v or 0 for v in at.values()) < 40
    )  # one batch late: the last batch is not committed
    then = spark.readStream.format("rmq").options(**{**base, "consumerGroup": "spark-cg"}).load()
    want = sorted((q, o) for q in range(4) if at[q] is not None for o in range(at[q], 10))
    assert stream_all(then, str(tmp_path / "ck2"), "queueId,queueOffset") == want


def test_namespace_maps_topics_and_groups(spark, cluster, tmp_path):
    ns = cluster.namesrv_addr
    make_topic(cluster, "prod%NsT")
    opts = {
        "namesrvAddr": ns,
        "accessKey": "admin",
        "secretKey": ADMIN.secret_key,
        "namespace": "prod",
    }
    rows = spark.createDataFrame([(f"n{i}".encode(),) for i in range(8)], "body binary")
    rows.write.format("rmq").options(**opts).option("topic", "NsT").mode("append").save()
    with ClusterClient(ns, credentials=ADMIN) as c:
        assert sum(c.get_max_offset("broker-a", "prod%NsT", q) for q in range(4)) == 8
    got = (
        spark.read.format("rmq")
        .options(**opts)
        .option("topics", "NsT")
        .load()
        .select("topic", "body")
        .collect()
    )
    assert sorted(tuple(r) for r in got) == sorted(("NsT", f"n{i}".encode()) for i in range(8))
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
    with ClusterClient(ns, credentials=ADMIN) as c:
        assert (
            sum(
                c.query_consumer_offset("broker-a", "prod%cg", "prod%NsT", q) or 0 for q in range(4)
            )
            > 0
        )
        assert all(
            c.query_consumer_offset("broker-a", "cg", "prod%NsT", q) is None for q in range(4)
        )
