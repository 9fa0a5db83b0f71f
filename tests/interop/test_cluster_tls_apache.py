"""The connector with ``namesrvAddr`` and ``tls=true`` against a real Apache RocketMQ 5.5.0 whose
NameServer and broker enforce TLS (``tls.server.mode=enforcing``, a test CA's certificate; the
broker registers with the NameServer over TLS): a batch write and a batch read succeed; without
``tls`` the error names the address and says the server may require TLS; a client trusting
another CA is refused naming ``tlsCaFile``."""

from __future__ import annotations

import ssl

import pytest
from _apache import ApacheRocketMQ, tls_properties
from _tls import Certs, make_certs

from rmq_spark.cluster import BrokerUnreachableError, ClusterClient, TlsConfig
from rmq_spark.remoting.command import RemotingCommand

TOPIC = "TlsInterop"
UPDATE_AND_CREATE_TOPIC = 17


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, certs):
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    props = tls_properties(certs.server_cert, certs.server_key)
    apache = ApacheRocketMQ(tmp_path_factory.mktemp("apache-tls"), brokers=("broker-a",),
                            cluster="TlsCluster", jvm_properties=props, tls_context=ctx)  # fmt: skip
    with apache:
        tls = TlsConfig(ca_file=str(certs.ca))
        with ClusterClient(apache.namesrv_addr, tls=tls) as c:
            ext = {"topic": TOPIC, "defaultTopic": "TBW102", "readQueueNums": "4",
                   "writeQueueNums": "4", "perm": "6", "topicFilterType": "SINGLE_TAG",
                   "topicSysFlag": "0", "order": "false"}  # fmt: skip
            addr = apache.broker_addr("broker-a")
            r = c.pool.get(addr).request(RemotingCommand(UPDATE_AND_CREATE_TOPIC, ext), 10)
            assert r.code == 0, r.remark
        apache.wait_route(TOPIC)
        yield apache


def test_batch_write_and_read_over_tls(spark, cluster, certs):
    opts = {"namesrvAddr": cluster.namesrv_addr, "tls": "true", "tlsCaFile": str(certs.ca)}
    rows = [(f"k{i}", f"tls-{i}") for i in range(40)]
    df = spark.createDataFrame(rows, "key string, body string")
    df.write.format("rmq").options(**opts).option("topic", TOPIC).mode("append").save()
    read = spark.read.format("rmq").options(**opts).option("topics", TOPIC).load()
    got = read.select("body", "brokerName").collect()
    assert sorted(r.body for r in got) == sorted(f"tls-{i}".encode() for i in range(40))
    assert {r.brokerName for r in got} == {"broker-a"}


def test_without_tls_the_error_names_the_address_and_tls(cluster):
    ns = cluster.namesrv_addr
    with ClusterClient(ns, timeout_s=5) as c, pytest.raises(BrokerUnreachableError) as e:
        c.route(TOPIC)
    assert ns in str(e.value) and "may require TLS" in str(e.value), str(e.value)


def test_another_ca_is_refused_naming_the_option(cluster, certs):
    ns = cluster.namesrv_addr
    with ClusterClient(ns, timeout_s=5, tls=TlsConfig(ca_file=str(certs.other_ca))) as c:
        with pytest.raises(BrokerUnreachableError) as e:
            c.route(TOPIC)
    assert ns in str(e.value) and "certificate verify failed" in str(e.value)
    assert "tlsCaFile" in str(e.value)
