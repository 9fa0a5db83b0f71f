"""rmq-admin against an rmq-broker with access control on (``--acl``): requests signed with
``--access-key``/``--secret-key`` (or RMQ_ACCESS_KEY / RMQ_SECRET_KEY) as Java's AclClientRPCHook
signs them; an admin account administers, a non-admin, an unsigned or a badly signed request gets
NO_PERMISSION, said plainly on one line (exit 1)."""

from __future__ import annotations

import json
import socket
import threading

import pytest
from _fake_server import FakeServer

from rmq_spark.admin.__main__ import main
from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.remoting.acl import ACCESS_KEY, SIGNATURE, sign
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand

ACCOUNTS = {"accounts": [
    {"accessKey": "alice", "secretKey": "alice-secret", "topicPerms": ["A=PUB|SUB"], "defaultTopicPerm": "DENY"},
    {"accessKey": "root", "secretKey": "root-secret", "admin": True},
]}  # fmt: skip


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    root = tmp_path_factory.mktemp("admin-acl")
    acl = root / "acl.json"
    acl.write_text(json.dumps(ACCOUNTS))
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen="127.0.0.1:0",
                         acl_path=str(acl))  # fmt: skip
    with Broker(str(root / "store"), options=opts) as b:
        yield b


@pytest.fixture(autouse=True)
def no_keys_in_the_environment(monkeypatch):
    monkeypatch.delenv("RMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("RMQ_SECRET_KEY", raising=False)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("via", ["-n", "-b"])
def test_an_admin_account_administers(capsys, broker, via):
    target = broker.namesrv_endpoint if via == "-n" else broker.remoting_endpoint
    topic = f"Signed{'N' if via == '-n' else 'B'}"
    code, out, err = _run(capsys, via, target, "--access-key", "root", "--secret-key", "root-secret", "--json",
                          "topics", "create", topic, "-q", "2")  # fmt: skip
    assert code == 0, err
    assert [r["topic"] for r in json.loads(out)] == [topic]
    cfg = broker.store.topics.get(topic)
    assert (cfg.read_queue_nums, cfg.write_queue_nums) == (2, 2)
    code, out, err = _run(
        capsys, via, target, "-a", "root", "-s", "root-secret", "--json", "topics", "list"
    )
    assert code == 0, err
    assert topic in {t["topic"] for t in json.loads(out)}


def test_the_keys_from_the_environment(capsys, broker, monkeypatch):
    monkeypatch.setenv("RMQ_ACCESS_KEY", "root")
    monkeypatch.setenv("RMQ_SECRET_KEY", "root-secret")
    code, _out, err = _run(
        capsys, "-n", broker.namesrv_endpoint, "topics", "create", "FromEnv", "-q", "1"
    )
    assert code == 0, err
    assert broker.store.topics.get("FromEnv") is not None
    # the command line wins over the environment
    code, _out, err = _run(capsys, "-n", broker.namesrv_endpoint, "-a", "alice", "-s", "alice-secret",
                           "topics", "create", "NotByAlice")  # fmt: skip
    assert code == 1 and "NO_PERMISSION" in err


@pytest.mark.parametrize(
    "keys, says",
    [
        (["-a", "alice", "-s", "alice-secret"], "alice"),  # signed, but no admin
        ([], "give --access-key and --secret-key"),  # not signed: how to sign is said
        (["-a", "root", "-s", "a-guess"], "signature"),  # an admin's key with a wrong secret
        (["-a", "mallory", "-s", "whatever"], "mallory"),  # no such account
    ],
)
def test_no_permission_is_said_plainly(capsys, broker, keys, says):
    code, out, err = _run(
        capsys, "-b", broker.remoting_endpoint, *keys, "topics", "create", "Refused", "-q", "1"
    )
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"rmq-admin: {broker.remoting_endpoint} answered NO_PERMISSION (16): "
    )
    assert says in lines[0] and "Traceback" not in err
    assert broker.store.topics.get("Refused") is None


def test_every_request_is_signed_as_acl_client_rpc_hook_signs_it(capsys):
    """What the broker checks, seen from the wire: AccessKey and Signature over every other ext
    field (sorted by name) and the body, on every request rmq-admin sends."""

    def reply(req: RemotingCommand, conn: socket.socket, stopping: threading.Event) -> None:
        body = (
            b"{}"
            if req.code == RequestCode.GET_BROKER_CLUSTER_INFO
            else b'{"table": {"brokerName": "b"}}'
        )
        conn.sendall(req.response(ResponseCode.SUCCESS, body=body).encode())

    with FakeServer(reply) as server:
        code, _out, err = _run(
            capsys, "-b", server.addr, "-a", "ak", "-s", "sk", "broker", "status"
        )
        assert code == 0, err
        code, _out, _err = _run(
            capsys, "-b", server.addr, "-a", "ak", "-s", "sk", "topics", "create", "T", "-q", "1"
        )
    assert code == 0
    assert len(server.requests) >= 3
    for req in server.requests:
        assert req.ext_fields[ACCESS_KEY] == "ak"
        assert req.ext_fields[SIGNATURE] == sign(req.ext_fields, req.body, "sk")
    create = next(r for r in server.requests if r.code == RequestCode.UPDATE_AND_CREATE_TOPIC)
    assert create.ext_fields["topic"] == "T"
