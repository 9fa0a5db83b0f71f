"""Access control: the ACL file, the HMAC-SHA1 signature the official clients send, and
per-topic / per-group permissions, against a real broker process."""

from __future__ import annotations

import json
import logging

import grpc
import pytest
from rocketmq import FilterExpression, Message, Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as D
from rocketmq.grpc_protocol import service_pb2 as S
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.exception import ForbiddenException

from rmq_spark.access.auth import AccessControl, Perm
from rmq_spark.broker.testing import BrokerProcess, client_configuration, metadata
from rmq_spark.errors import AuthenticationError, ConfigError, PermissionDeniedError

ACL = {
    "accounts": [
        {
            "accessKey": "app",
            "secretKey": "app-secret",
            "defaultTopicPerm": "PUB|SUB",
            "topicPerms": ["Audit=SUB", "Vault=DENY"],
            "groupPerms": {"blocked": "DENY"},
        },
        {"accessKey": "root", "secretKey": "root-secret", "admin": True},
    ]
}


def test_acl_parsing_and_checks():
    acl = AccessControl.from_dict(ACL)
    app = acl.authenticate(dict(metadata(access_key="app", secret_key="app-secret")))
    assert app.topic_perm("Orders") == Perm.PUB | Perm.SUB and app.topic_perm("Vault") == Perm.DENY
    acl.authorize(app, topic="Audit", need=Perm.SUB, group="g")
    for kw in ({"topic": "Audit", "need": Perm.PUB}, {"topic": "Vault"}, {"group": "blocked"}):
        with pytest.raises(PermissionDeniedError):
            acl.authorize(app, **kw)
    # the signature's hex case does not matter (Node sends upper case)
    md = dict(metadata(access_key="root", secret_key="root-secret"))
    md["authorization"] = (
        md["authorization"]
        .replace("Signature=", "Signature=")
        .upper()
        .replace("MQV2-HMAC-SHA1", "MQv2-HMAC-SHA1")
    )
    md["authorization"] = (
        md["authorization"]
        .replace("CREDENTIAL=ROOT", "Credential=root")
        .replace("SIGNEDHEADERS=X-MQ-DATE-TIME", "SignedHeaders=x-mq-date-time")
        .replace("SIGNATURE=", "Signature=")
    )
    assert acl.authenticate(md).admin
    for bad in (
        {},
        dict(metadata(access_key="app", secret_key="wrong")),
        dict(metadata(access_key="who", secret_key="x")),
    ):
        with pytest.raises(AuthenticationError):
            acl.authenticate(bad)
    for broken in (
        {},
        {"accounts": [{"accessKey": "a"}]},
        {"accounts": [{"accessKey": "a", "secretKey": "b", "topicPerms": ["x=WRITE"]}]},
    ):
        with pytest.raises(ConfigError):
            AccessControl.from_dict(broken)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    d = tmp_path_factory.mktemp("acl")
    path = d / "acl.json"
    path.write_text(json.dumps(ACL))
    b = BrokerProcess(str(d / "store"), "--acl", str(path), "--min-invisible-s", "1")
    yield b
    assert b.stop() == 0


def msg(topic: str) -> Message:
    m = Message()
    m.topic = topic
    m.body = b"secret stuff"
    return m


def test_the_right_secret_is_accepted(broker):
    cfg = client_configuration(broker.endpoints, "app", "app-secret")
    p = Producer(cfg, ("Orders",))
    p.startup()
    c = SimpleConsumer(cfg, "billing", {"Orders": FilterExpression()}, await_duration=2)
    c.startup()
    try:
        r = p.send(msg("Orders"))
        got = []
        for _ in range(5):
            got += c.receive(8, 5)
            if got:
                break
        assert [m.message_id for m in got] == [r.message_id]
        c.ack(got[0])
        with pytest.raises(ForbiddenException):
            p.send(msg("Audit"))  # SUB only
    finally:
        c.shutdown()
        p.shutdown()


def test_a_wrong_secret_is_rejected(broker, caplog):
    p = Producer(client_configuration(broker.endpoints, "app", "not-the-secret"), ("Orders",))
    with caplog.at_level(logging.ERROR, logger="rocketmq-python-client"):
        p.startup()
        try:
            # the client turns the UNAUTHORIZED answer to its route query into this, and logs it
            with pytest.raises(Exception, match="failed to fetch topic:Orders route"):
                p.send(msg("Orders"))
        finally:
            p.shutdown()
    assert any(
        "signature of access key 'app' does not match" in r.getMessage() for r in caplog.records
    )
    with grpc.insecure_channel(broker.endpoints) as ch:
        stub = MessagingServiceStub(ch)
        req = S.QueryRouteRequest(topic=D.Resource(name="Orders"))
        assert (
            stub.QueryRoute(req, metadata=metadata(), timeout=10).status.code == D.Code.UNAUTHORIZED
        )
        assert (
            stub.QueryRoute(
                req, metadata=metadata(access_key="root", secret_key="root-secret"), timeout=10
            ).status.code
            == D.Code.OK
        )
        (cmd,) = list(stub.Telemetry(iter([S.TelemetryCommand()]), metadata=metadata(), timeout=10))
        assert cmd.status.code == D.Code.UNAUTHORIZED
