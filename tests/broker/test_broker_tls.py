"""rmq-broker serving TLS (``--tls-cert`` / ``--tls-key``): the official Python gRPC client
producing and consuming over TLS, a plain gRPC client refused; the remoting port fed garbage, half
a TLS handshake, a plaintext frame and a hello cut short, never wedged (other clients are served
meanwhile and after; the stalled handshake is dropped); the flags validated naming the flag."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time

import grpc
import pytest
from _tls import Certs, make_certs
from rocketmq.grpc_protocol import definition_pb2 as D
from rocketmq.grpc_protocol import service_pb2 as S
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

import rmq_spark.remoting.tls as remoting_tls
from rmq_spark.broker.options import BrokerOptions, parse_args
from rmq_spark.broker.server import Broker
from rmq_spark.broker.testing import metadata
from rmq_spark.cluster import ClusterClient, TlsConfig
from rmq_spark.errors import ConfigError
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.tls import ServerTls, TlsMode

TOPIC = "TlsGrpc"

# the official client (tls_enable=True) trusts gRPC's roots: the test CA, by gRPC's own setting
OFFICIAL_CLIENT = """
import json, sys
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
endpoints, topic = sys.argv[1], sys.argv[2]
conf = lambda: ClientConfiguration(endpoints, Credentials("", ""), request_timeout=10)
p = Producer(conf(), (topic,), tls_enable=True)
p.startup()
ids = []
try:
    for i in range(3):
        m = Message()
        m.topic, m.body = topic, b"tls-%d" % i
        ids.append(p.send(m).message_id)
finally:
    p.shutdown()
c = SimpleConsumer(conf(), "tls-group", {topic: FilterExpression()}, await_duration=2, tls_enable=True)
c.startup()
got = []
try:
    for _ in range(20):
        if len(got) >= 3:
            break
        for m in c.receive(16, 30):
            got.append(m.body.decode())
            c.ack(m)
finally:
    c.shutdown()
print(json.dumps({"sent": len(ids), "got": sorted(got)}))
"""


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory, certs):
    tls = ServerTls(str(certs.server_cert), str(certs.server_key))
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0",
                         namesrv_listen="127.0.0.1:0", tls=tls)  # fmt: skip
    with Broker(str(tmp_path_factory.mktemp("store")), options=opts) as b:
        yield b


def test_ready_line_names_the_mode(broker):
    assert broker.ready_line().endswith(" tls=enforcing")


def test_official_grpc_client_produces_and_consumes_over_tls(broker, certs):
    env = {**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(certs.ca)}
    out = subprocess.run([sys.executable, "-c", OFFICIAL_CLIENT, broker.endpoints, TOPIC],
                         env=env, capture_output=True, text=True, timeout=90)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"sent": 3, "got": ["tls-0", "tls-1", "tls-2"]}


def test_plain_grpc_client_is_refused(broker, certs):
    req = S.QueryRouteRequest(topic=D.Resource(name=TOPIC))
    with grpc.insecure_channel(broker.endpoints) as ch:
        with pytest.raises(grpc.RpcError) as e:
            MessagingServiceStub(ch).QueryRoute(req, timeout=5)
    assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    creds = grpc.ssl_channel_credentials(certs.ca.read_bytes())
    with grpc.secure_channel(broker.endpoints, creds) as ch:
        answer = MessagingServiceStub(ch).QueryRoute(req, timeout=10, metadata=metadata())
    assert answer.status.code == D.Code.OK


def _client_hello() -> bytes:
    """The first flight of a TLS client, as bytes."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    hello = outgoing.read()
    assert hello[0] == 0x16
    return hello


def _closed_by_peer(s: socket.socket, timeout_s: float) -> bool:
    """Waits for the server to close ``s``: True on EOF (or reset), False if it stays open."""
    s.settimeout(timeout_s)
    try:
        while s.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def _route_ok(addr: str, certs: Certs) -> None:
    with ClusterClient(addr, timeout_s=10, tls=TlsConfig(ca_file=str(certs.ca))) as c:
        assert c.route(TOPIC).brokers


def test_hostile_bytes_on_the_tls_port_never_wedge_it(broker, certs, monkeypatch):
    monkeypatch.setattr(remoting_tls, "TLS_HANDSHAKE_TIMEOUT_S", 2.0)
    frame = RemotingCommand(code=105, ext_fields={"topic": TOPIC}).encode()
    hello = _client_hello()
    for addr in (broker.namesrv_endpoint, broker.remoting_endpoint):
        host, port = addr.rsplit(":", 1)
        half = socket.create_connection((host, int(port)))
        try:
            half.sendall(hello[: len(hello) // 2])  # half a hello, then silence
            for payload in (os.urandom(512), b"\x16\x03\x01\xff\xff" + b"\0" * 64, frame, hello):
                with socket.create_connection((host, int(port))) as s:
                    s.sendall(payload)
                    if payload is hello:
                        continue  # a hello cut short by the client's close
                    assert _closed_by_peer(s, 10), f"{payload[:8]!r} left open on {addr}"
            _route_ok(broker.namesrv_endpoint, certs)  # served while the half hello waits
            started = time.monotonic()
            assert _closed_by_peer(half, 15), "the stalled handshake was never dropped"
            assert time.monotonic() - started < 12
        finally:
            half.close()
    _route_ok(broker.namesrv_endpoint, certs)
    with ClusterClient(broker.namesrv_endpoint, tls=TlsConfig(ca_file=str(certs.ca))) as c:
        (name,) = c.route(TOPIC).brokers
        assert c.send_message(name, "pg", TOPIC, 0, b"after", {}).status == "SEND_OK"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tls-cert", "{cert}"], "--tls-cert needs --tls-key"),
        (["--tls-key", "{key}"], "--tls-key needs --tls-cert"),
        (["--tls-cert", "{cert}", "--tls-key", "/nonexistent"], "--tls-key '/nonexistent' is not a file"),
        (["--tls-cert", "{cert}", "--tls-key", "{key}", "--tls-mode", "strict"], "--tls-mode must be disabled, permissive or enforcing"),
        (["--tls-cert", "{cert}", "--tls-key", "{key}", "--tls-client-auth", "require"], "--tls-client-auth require needs --tls-ca"),
        (["--tls-cert", "{cert}", "--tls-key", "{ca}"], "cannot load the certificate and its key"),
        (["--tls-cert", "{cert}", "--tls-key", "{key}", "--tls-client-auth", "maybe", "--tls-ca", "{ca}"], "--tls-client-auth must be none, optional or require"),
    ],
)  # fmt: skip
def test_bad_tls_flags_are_named(tmp_path, certs, flags, message):
    files = {"cert": certs.server_cert, "key": certs.server_key, "ca": certs.ca}
    argv = ["--store", str(tmp_path / "s"), *(f.format(**files) for f in flags)]
    with pytest.raises(ConfigError, match=message):
        parse_args(argv)


def test_tls_flags(tmp_path, certs):
    base = ["--store", str(tmp_path / "s"), "--tls-cert", str(certs.server_cert),
            "--tls-key", str(certs.server_key)]  # fmt: skip
    tls = parse_args(base).options.tls
    assert tls is not None and tls.mode is TlsMode.ENFORCING and tls.client_auth.value == "none"
    tls = parse_args([*base, "--tls-ca", str(certs.ca), "--tls-mode", "permissive"]).options.tls
    assert tls is not None and tls.mode is TlsMode.PERMISSIVE and tls.client_auth.value == "require"
    assert parse_args([*base, "--tls-mode", "disabled"]).options.tls is None
    assert parse_args(["--store", str(tmp_path / "s")]).options.tls is None
