"""rmq-broker with ``--acl``: the Java clients with RocketMQ's AclClientRPCHook (plain ACL,
HmacSHA1 signatures over the request's ext fields and body) send and consume with accounts that
have the permissions, and are refused (NO_PERMISSION) with a wrong secret or without the
permission; the same ACL file governs the gRPC side."""

from __future__ import annotations

import json

import pytest
from _java import CLIENT_VERSION_5X, CLIENT_VERSION_DEFAULT

ACCOUNTS = {"accounts": [
    {"accessKey": "writer", "secretKey": "w-secret-123", "topicPerms": ["AclOrders4=PUB", "AclOrders5=PUB"]},
    {"accessKey": "reader", "secretKey": "r-secret-123", "topicPerms": ["AclOrders4=SUB", "AclOrders5=SUB"],
     "groupPerms": ["acl_readers4=SUB", "acl_readers5=SUB"], "defaultGroupPerm": "DENY"},
]}  # fmt: skip


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    from rmq_spark.broker.testing import BrokerProcess

    root = tmp_path_factory.mktemp("acl-broker")
    (root / "acl.json").write_text(json.dumps(ACCOUNTS))
    b = BrokerProcess(str(root / "store"), "--acl", str(root / "acl.json"))
    yield b
    b.stop()


@pytest.mark.parametrize("client", [CLIENT_VERSION_DEFAULT, CLIENT_VERSION_5X])
def test_signed_clients_pass_and_the_rest_are_refused(acl_broker, programs, java_home, client):
    major = client.split(".")[0]
    topic, group = f"AclOrders{major}", f"acl_readers{major}"

    def run(**opts: str):  # type: ignore[no-untyped-def]
        args = ["--namesrv", acl_broker.namesrv_endpoint, "--topic", topic, "--count", "3"]
        for k, v in opts.items():
            args += [f"--{k.replace('_', '-')}", v]
        return programs.run("acl-clients", *args, home=java_home, timeout_s=90)

    ok = run(
        group=group,
        access_key="writer",
        secret_key="w-secret-123",
        consume_as="reader:r-secret-123",
    )
    sent = ok.events("sent")
    assert [e["status"] for e in sent] == ["SEND_OK"] * 3
    assert sorted(e["msgId"] for e in ok.events("received")) == sorted(e["msgId"] for e in sent)

    for creds in ({"access_key": "writer", "secret_key": "wrong"}, {"access_key": "reader", "secret_key": "r-secret-123"},
                  {"access_key": "nobody", "secret_key": "x"}):  # fmt: skip
        refused = run(group=group, **creds)
        assert not refused.events("sent")
        errors = refused.events("send-error")
        assert [e["code"] for e in errors] == [16] * 3, errors  # NO_PERMISSION
    # a reader without SUB on the group reads nothing
    denied = programs.run("acl-clients", "--namesrv", acl_broker.namesrv_endpoint, "--topic", topic, "--count", "1",
                          "--group", "acl_strangers", "--access-key", "writer", "--secret-key", "w-secret-123",
                          "--consume-as", "reader:r-secret-123", "--timeout-s", "5", home=java_home, check=False,
                          timeout_s=60)  # fmt: skip
    assert denied.returncode == 3 and not denied.events("received")
