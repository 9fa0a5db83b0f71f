"""Format rmq with ``namesrvAddr`` and ``accessKey`` / ``secretKey`` against a real Apache
RocketMQ with plain ACL 1.0 (issue 31, item 1): 5.1.4, the newest 5.x line that still has
``PlainAccessValidator`` (``aclEnable=true`` and ``conf/plain_acl.yml``; 5.5.0's ACL 2.0 is
``tests/interop/test_cluster_production_apache.py``).  4.9.x's broker cannot run its ACL on Java
17 (its service loader casts a Class to ``AccessValidator`` at start), so the 4.x line is left out.

Accounts: ``adminKey`` an admin; ``sparkKey`` PUB|SUB on topic AclT only (``defaultTopicPerm``
DENY, every group SUB).  Plain ACL 1.0 answers a refusal with SYSTEM_ERROR and its
``AclException`` text; the connector's error names the broker, its address, the request, the
topic and says that the broker's access control refused it, never the secret.
"""

from __future__ import annotations

import logging

import pytest
from _apache import ApacheRocketMQ
from test_cluster_production_apache import stream_all

from rmq_spark.cluster import ClusterClient, Credentials

pytestmark = [pytest.mark.spark, pytest.mark.interop]

VERSION = "5.1.4"
ADMIN = Credentials("adminKey", "adm-Secret-51a4")
SPARK_SECRET = "spk-Secret-51b7"
WRONG_SECRET = "wrong-Secret-51c9"
PLAIN_ACL = f"""\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: {ADMIN.access_key}
    secretKey: {ADMIN.secret_key}
    admin: true
  - accessKey: sparkKey
    secretKey: {SPARK_SECRET}
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - AclT=PUB|SUB
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ApacheRocketMQ(
        tmp_path_factory.mktemp("apache-acl1"),
        brokers=("broker-a",),
        version=VERSION,
        heap="200m",
        broker_config={"aclEnable": "true"},
    )
    (c.home / "conf").mkdir(parents=True, exist_ok=True)
    (c.home / "conf" / "plain_acl.yml").write_text(PLAIN_ACL)
    c.start()
    try:
        with ClusterClient(c.namesrv_addr, credentials=ADMIN) as admin:
            admin.cluster_brokers()
            for topic in ("AclT", "OtherT"):
                admin.create_topic("broker-a", topic, 4)
        c.wait_route("AclT")
        c.wait_route("OtherT")
        with ClusterClient(c.namesrv_addr, credentials=ADMIN) as admin:
            admin.route("OtherT", refresh=True)
            admin.send_message("broker-a", "pg", "OtherT", 0, b"not for spark", {})
        yield c
    finally:
        c.close()


def test_plain_acl_signed_reads_writes_commits_and_clear_refusals(spark, cluster, tmp_path, caplog):
    ns = cluster.namesrv_addr
    caplog.set_level(logging.DEBUG, logger="rmq_spark")
    opts = {"namesrvAddr": ns, "accessKey": "sparkKey", "secretKey": SPARK_SECRET}
    rows = spark.createDataFrame([(f"w{i}".encode(),) for i in range(12)], "body binary")
    rows.write.format("rmq").options(**opts).option("topic", "AclT").mode("append").save()
    got = spark.read.format("rmq").options(**opts).option("topics", "AclT").load().collect()
    assert sorted(r.body for r in got) == sorted(f"w{i}".encode() for i in range(12))
    s = (
        spark.readStream.format("rmq")
        .options(**opts)
        .option("topics", "AclT")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "4")
        .option("consumerGroup", "acl1-cg")
        .load()
    )
    assert stream_all(s, str(tmp_path / "ck")) == sorted((f"w{i}".encode(),) for i in range(12))
    with ClusterClient(ns, credentials=ADMIN) as c:
        committed = sum(
            c.query_consumer_offset("broker-a", "acl1-cg", "AclT", q) or 0 for q in range(4)
        )
    assert 0 < committed <= 12  # the stream commits one batch late
    again = (
        spark.read.format("rmq")
        .options(**opts)
        .option("topics", "AclT")
        .option("startingOffsets", "group")
        .option("consumerGroup", "acl1-cg")
        .load()
    )
    assert again.count() == 12 - committed

    addr = cluster.broker_addr("broker-a")
    refusals = []
    bad = {**opts, "secretKey": WRONG_SECRET}  # a wrong signature
    with pytest.raises(Exception) as e:
        spark.read.format("rmq").options(**bad).option("topics", "AclT").load().collect()
    refusals.append((e, "GET_MAX_OFFSET (30)", "AclT", "Check signature failed"))
    with pytest.raises(Exception) as e:  # a topic the account may not publish to
        rows.limit(1).write.format("rmq").options(**opts).option("topic", "OtherT").mode(
            "append"
        ).save()
    refusals.append((e, "SEND_BATCH_MESSAGE (320)", "OtherT", "No default permission"))
    with pytest.raises(Exception) as e:  # nor read (plain ACL checks the pull, not the offsets)
        spark.read.format("rmq").options(**opts).option("topics", "OtherT").load().collect()
    refusals.append((e, "PULL_MESSAGE (11)", "OtherT", "No default permission"))
    for err, request, topic, why in refusals:
        text = str(err.value)
        assert request in text and f"broker-a at {addr}" in text and topic in text, text
        assert why in text and "access control" in text, text
        assert WRONG_SECRET not in text and SPARK_SECRET not in text
    assert WRONG_SECRET not in caplog.text and SPARK_SECRET not in caplog.text
