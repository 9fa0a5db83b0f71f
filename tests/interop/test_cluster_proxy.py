"""Format rmq through a RocketMQ 5 proxy (issue 31, item 4): ``namesrvAddr`` pointing at the
remoting port of Apache RocketMQ 5.5.0's ``ProxyStartup`` in cluster mode, in front of the
session's two-broker cluster.

The proxy answers GET_ROUTEINFO_BY_TOPIC with its own address for every broker name and forwards
each request to the broker its ``bname`` header names (which the connector sends on every
request, as the Java client does).  Writes, batch and stream reads, the stream's offset commits
and ``startingOffsets=group`` go through it with the same semantics as against the NameServers;
what was written and committed through the proxy is checked on the brokers themselves.  What a
proxy does not serve (the NameServer's topic list, so ``topicPattern``) is refused by name.
"""

from __future__ import annotations

import pytest
from _apache import ApacheProxy
from test_cluster_read import make_topic, reader, run_batches

from rmq_spark.cluster import ClusterClient

pytestmark = [pytest.mark.spark, pytest.mark.interop]

QUEUES = 2


@pytest.fixture(scope="module")
def proxy(apache_cluster, tmp_path_factory: pytest.TempPathFactory):
    with ApacheProxy(tmp_path_factory.mktemp("apache-proxy"), apache_cluster) as p:
        yield p


class _Target:
    def __init__(self, cluster) -> None:  # type: ignore[no-untyped-def]
        self.cluster = cluster
        self.namesrv_addr = cluster.namesrv_addr

    def wait_route(self, topic: str) -> None:
        self.cluster.wait_route(topic)


def test_write_read_stream_and_group_offsets_through_a_proxy(
    spark, apache_cluster, proxy, names, tmp_path
):
    topic, group = f"{names}_T"[-60:], f"{names}_G"[-60:]
    brokers = make_topic(_Target(apache_cluster), topic, queues=QUEUES)
    bodies = [f"p-{i}" for i in range(300)]
    spark.createDataFrame(
        [(b.encode(), b.split("-")[0]) for b in bodies], "body binary, tags string"
    ).write.format("rmq").option("namesrvAddr", proxy.remoting_addr).option("topic", topic).mode(
        "append"
    ).save()

    # on the brokers themselves (their NameServer): every row stored once
    with ClusterClient(apache_cluster.namesrv_addr) as c:
        ends = {(b, q): c.get_max_offset(b, topic, q) for b in brokers for q in range(QUEUES)}
    assert sum(ends.values()) == 300

    class _Proxied:
        namesrv_addr = proxy.remoting_addr

    rows = reader(spark, _Proxied, topic).select("brokerName", "queueId", "body").collect()
    assert sorted(r.body.decode() for r in rows) == sorted(bodies)
    per_queue: dict[tuple[str, int], int] = {}
    for r in rows:
        per_queue[(r.brokerName, r.queueId)] = per_queue.get((r.brokerName, r.queueId), 0) + 1
    assert per_queue == {k: n for k, n in ends.items() if n}  # as the brokers hold them

    # a stream through the proxy, committing its offsets as consumerGroup
    df = reader(
        spark,
        _Proxied,
        topic,
        stream=True,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="100",
        consumerGroup=group,
    )
    got = run_batches(df, str(tmp_path / "ck"), "body")
    assert sorted(b.decode() for rows_ in got.values() for (b,) in rows_) == sorted(bodies)
    with ClusterClient(apache_cluster.namesrv_addr) as c:  # the commits, seen on the brokers
        committed = {k: c.query_consumer_offset(k[0], group, topic, k[1]) or 0 for k in ends}
    lag = sum(ends.values()) - sum(committed.values())
    assert 0 < lag <= 100  # batch N-1 is committed while batch N is planned: the last one is not
    assert sum(committed.values()) >= 200

    # startingOffsets=group through the proxy: each queue from the group's committed offset
    rest = reader(spark, _Proxied, topic, startingOffsets="group", consumerGroup=group)
    assert rest.count() == lag


def test_what_a_proxy_does_not_serve_is_named(spark, proxy):
    with pytest.raises(Exception, match="topicPattern") as e:
        spark.read.format("rmq").option("namesrvAddr", proxy.remoting_addr).option(
            "topicPattern", "Any.*"
        ).load().collect()
    assert "proxy" in str(e.value) and proxy.remoting_addr in str(e.value)
