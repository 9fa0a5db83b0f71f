"""TLS with ``namesrvAddr`` against rmq-broker serving TLS (``--tls-cert`` / ``--tls-key``) on its
remoting port and NameServer: the cluster client and the connector (batch write, batch read, the
planner committing a consumer group) over TLS; a plain client, a client trusting another CA and
a client without the certificate a broker requires are refused with errors naming the address
and the option to look at; the options are validated up front."""

from __future__ import annotations

import pytest
from _tls import Certs, make_certs

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.cluster import BrokerUnreachableError, ClusterClient, TlsConfig
from rmq_spark.cluster.channel import PullChannel
from rmq_spark.datasource.cluster.planner import ClusterPlanner
from rmq_spark.datasource.cluster_options import sink_options
from rmq_spark.datasource.options import parse_source_options
from rmq_spark.errors import ConfigError
from rmq_spark.remoting.tls import ClientAuth, ServerTls, TlsMode
from rmq_spark.store.pulled import records_arrow

TOPIC = "TlsT"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _broker(path: str, tls: ServerTls) -> Broker:
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0",
                         namesrv_listen="127.0.0.1:0", tls=tls)  # fmt: skip
    return Broker(path, options=opts)


@pytest.fixture(scope="module")
def broker(tmp_path_factory, certs):
    tls = ServerTls(str(certs.server_cert), str(certs.server_key))
    with _broker(str(tmp_path_factory.mktemp("store")), tls) as b:
        yield b


def _tls(certs: Certs, **kw: object) -> TlsConfig:
    return TlsConfig(ca_file=str(certs.ca), **kw)  # type: ignore[arg-type]


def test_client_routes_sends_and_pulls_over_tls(broker, certs):
    tls = _tls(certs, hostname_check=True)
    with ClusterClient(broker.namesrv_endpoint, tls=tls) as c:
        (name,) = c.route(TOPIC).brokers
        sent = c.send_batch(name, "pg", TOPIC, 0, [(b"a", {}, 0), (b"b", {}, 0)])
        assert sent.status == "SEND_OK"
        body = c.pull(name, TOPIC, 0, 0, 32, "g").body
        assert records_arrow(body).column("body").to_pylist() == [b"a", b"b"]
        addr = c.broker_addr(name, TOPIC)
    with PullChannel(addr, name, TOPIC, 0, "g", tls=tls) as ch:
        r = ch.result(ch.send(0, 32))
        assert records_arrow(r.body).column("body").to_pylist() == [b"a", b"b"]


def test_a_plain_client_is_refused_naming_the_address_and_tls(broker):
    ns = broker.namesrv_endpoint
    with ClusterClient(ns, timeout_s=5) as c, pytest.raises(BrokerUnreachableError) as e:
        c.route(TOPIC)
    assert ns in str(e.value) and "may require TLS" in str(e.value)
    assert "tls=true" in str(e.value)


def test_another_ca_is_refused_naming_the_address_and_the_option(broker, certs):
    ns = broker.namesrv_endpoint
    wrong = TlsConfig(ca_file=str(certs.other_ca))
    with ClusterClient(ns, timeout_s=5, tls=wrong) as c, pytest.raises(BrokerUnreachableError) as e:
        c.route(TOPIC)
    assert ns in str(e.value) and "certificate verify failed" in str(e.value)
    assert "tlsCaFile" in str(e.value)


def test_a_broker_requiring_client_certificates(tmp_path, certs):
    tls = ServerTls(str(certs.server_cert), str(certs.server_key), str(certs.ca),
                    TlsMode.ENFORCING, ClientAuth.REQUIRE)  # fmt: skip
    with _broker(str(tmp_path / "store"), tls) as b:
        ns = b.namesrv_endpoint
        with ClusterClient(ns, timeout_s=5, tls=_tls(certs)) as c:
            with pytest.raises(BrokerUnreachableError) as e:
                c.route(TOPIC)
            assert ns in str(e.value)
        with_cert = _tls(certs, cert_file=str(certs.client_cert), key_file=str(certs.client_key))
        with ClusterClient(ns, timeout_s=5, tls=with_cert) as c:
            assert c.route(TOPIC).brokers


def test_permissive_serves_plain_and_tls_on_one_port_and_the_host_name_check(tmp_path, certs):
    """The broker shows a certificate for elsewhere.invalid: a client checking host names
    refuses it naming the option; one that does not (Java's default) goes on."""
    tls = ServerTls(str(certs.elsewhere_cert), str(certs.elsewhere_key), mode=TlsMode.PERMISSIVE)
    with _broker(str(tmp_path / "store"), tls) as b:
        for client_tls in (None, _tls(certs)):
            with ClusterClient(b.namesrv_endpoint, timeout_s=5, tls=client_tls) as c:
                (name,) = c.route(TOPIC).brokers
                assert c.get_max_offset(name, TOPIC, 0) >= 0
        checked = _tls(certs, hostname_check=True)
        with ClusterClient(b.namesrv_endpoint, timeout_s=5, tls=checked) as c:
            with pytest.raises(BrokerUnreachableError) as e:
                c.route(TOPIC)
        assert "tlsHostnameCheck" in str(e.value) and b.namesrv_endpoint in str(e.value)


def test_options_are_validated_naming_the_option(certs, tmp_path):
    base = {"namesrvAddr": "127.0.0.1:9876", "topics": "T"}

    def parse(**kw: str) -> object:
        return parse_source_options({**base, **kw}, streaming=False)

    conn = parse(tls="true", tlsCaFile=str(certs.ca)).connection  # type: ignore[attr-defined]
    assert conn.tls == TlsConfig(ca_file=str(certs.ca))
    assert parse(tls="false").connection.tls is None  # type: ignore[attr-defined]
    cases = {
        "option 'tls' must be true or false": {"tls": "maybe"},
        "option 'tlsCaFile' needs option 'tls=true'": {"tlsCaFile": str(certs.ca)},
        "option 'tlsCaFile': '/nonexistent.pem' is not a file": {
            "tls": "true",
            "tlsCaFile": "/nonexistent.pem",
        },
        "option 'tlsKeyFile' needs option 'tlsCertFile'": {
            "tls": "true",
            "tlsKeyFile": str(certs.client_key),
        },
        "option 'tlsHostnameCheck' must be true or false": {
            "tls": "true",
            "tlsHostnameCheck": "sure",
        },
        "option 'tlsCaFile': cannot load": {"tls": "true", "tlsCaFile": str(certs.client_key)},
        "options 'tlsCertFile' / 'tlsKeyFile'": {
            "tls": "true",
            "tlsCertFile": str(certs.client_cert),
            "tlsKeyFile": str(certs.server_cert),
        },
    }
    for message, opts in cases.items():
        with pytest.raises(ConfigError, match=message):
            parse(**opts)
    with pytest.raises(ConfigError, match="option 'tls' applies to a RocketMQ cluster"):
        parse_source_options({"endpoints": "127.0.0.1:1", "topics": "T", "tls": "true"}, False)
    sink = sink_options(
        {"namesrvAddr": "127.0.0.1:9876", "tls": "true", "tlsCaFile": str(certs.ca)}, False
    )
    assert sink.connection.tls == TlsConfig(ca_file=str(certs.ca))


@pytest.mark.spark
def test_connector_writes_reads_and_commits_over_tls(spark, broker, certs):
    opts = {"namesrvAddr": broker.namesrv_endpoint, "tls": "true", "tlsCaFile": str(certs.ca)}
    rows = [(f"k{i}", f"m{i}") for i in range(30)]
    df = spark.createDataFrame(rows, "key string, body string")
    df.write.format("rmq").options(**opts).option("topic", "TlsSpark").mode("append").save()
    read = spark.read.format("rmq").options(**opts).option("topics", "TlsSpark").load()
    got = sorted(r.body for r in read.select("body").collect())
    assert got == sorted(f"m{i}".encode() for i in range(30))
    # the planner's client: a stream's commit of its consumer group, and its planning
    planner = ClusterPlanner(parse_source_options({**opts, "topics": "TlsSpark"}, streaming=True))
    try:
        name = planner.client.route("TlsSpark").queues[0].broker_name
        planner.commit("cg-tls", {("TlsSpark", name, 0): 3})
    finally:
        planner.close()
    with ClusterClient(broker.namesrv_endpoint, tls=_tls(certs)) as c:
        assert c.query_consumer_offset(name, "cg-tls", "TlsSpark", 0) == 3
