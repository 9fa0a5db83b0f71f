"""``rmq-broker --namesrv ADDR`` registering with a NameServer that runs ``--acl`` (issue 28): the
broker signs what it sends to NameServers (REGISTER_BROKER, UNREGISTER_BROKER) as the Java
clients' ``AclClientRPCHook`` signs, with ``--namesrv-access-key`` / ``--namesrv-secret-key``,
``RMQ_NAMESRV_ACCESS_KEY`` / ``RMQ_NAMESRV_SECRET_KEY`` or the config key
``innerClientAuthenticationCredentials`` (Apache RocketMQ 5.3+'s).  Before, it registered unsigned
and could not register with such a NameServer at all.

It appears in routes only when its credentials are an admin's; otherwise it is refused, with one
clear log line that never holds the secret; it leaves (a signed UNREGISTER_BROKER) when it stops
and registers again when it restarts on the same store."""

from __future__ import annotations

import json
import re
import time

import pytest

from rmq_spark.broker.options import BrokerOptions, parse_args
from rmq_spark.broker.server import Broker
from rmq_spark.broker.testing import BrokerProcess
from rmq_spark.errors import ConfigError
from rmq_spark.remoting import jsonbody
from rmq_spark.remoting.client import RemotingClient, request
from rmq_spark.remoting.codes import RequestCode as R
from rmq_spark.remoting.codes import ResponseCode as C
from rmq_spark.remoting.command import RemotingCommand

ACL = {"accounts": [
    {"accessKey": "root", "secretKey": "root-secret-7f3a", "admin": True},
    {"accessKey": "alice", "secretKey": "alice-secret-9c1e", "defaultTopicPerm": "PUB|SUB"},
]}  # fmt: skip
PEER = "peer-b"
PEER_TOPIC = "OnPeerB"
ENV = ("RMQ_NAMESRV_ACCESS_KEY", "RMQ_NAMESRV_SECRET_KEY")


@pytest.fixture
def namesrv(tmp_path):
    """An rmq-broker whose NameServer runs with --acl."""
    (tmp_path / "acl.json").write_text(json.dumps(ACL))
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen="127.0.0.1:0",
                         acl_path=str(tmp_path / "acl.json"))  # fmt: skip
    with Broker(str(tmp_path / "ns-store"), options=opts) as b:
        yield b


def _peer(tmp_path, namesrv, *flags: str) -> BrokerProcess:
    return BrokerProcess(str(tmp_path / "peer-store"), "--broker-name", PEER, "--namesrv", namesrv.namesrv_endpoint,
                         "--no-namesrv", "--read-workers", "0", *flags,
                         log_path=str(tmp_path / "peer.log"))  # fmt: skip


def _wait(condition, what: str, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"not in {timeout_s}s: {what}"
        time.sleep(0.05)


def _brokers(namesrv) -> dict:
    answer = request(namesrv.namesrv_endpoint, R.GET_BROKER_CLUSTER_INFO)
    return jsonbody.loads(answer.body)["brokerAddrTable"]


def _route_names(namesrv, topic: str) -> set[str]:
    answer = request(namesrv.namesrv_endpoint, R.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    return (
        {q["brokerName"] for q in jsonbody.loads(answer.body)["queueDatas"]}
        if answer.code == C.SUCCESS
        else set()
    )


def _log(path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.parametrize(("how", "remark", "hint"), [
    ("unsigned", "the request is not signed (AccessKey and Signature are missing): access control is on",
     "that NameServer's access control needs an admin account's signature: give rmq-broker "
     "--namesrv-access-key and --namesrv-secret-key (or RMQ_NAMESRV_ACCESS_KEY and RMQ_NAMESRV_SECRET_KEY)"),
    ("not an admin", "accessKey alice is not an admin account: request code 103 needs one",
     "this broker signs as access key alice, which needs to be an admin account of that NameServer's ACL"),
    ("wrong secret", "Check signature failed for accessKey=root",
     "this broker signs as access key root, which needs to be an admin account of that NameServer's ACL"),
], ids=["unsigned", "not an admin", "wrong secret"])  # fmt: skip
def test_a_broker_without_an_admins_credentials_is_refused_with_a_clear_log_line(
    tmp_path, monkeypatch, namesrv, how, remark, hint
):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    flags: tuple[str, ...] = ()
    secret = None
    if how == "not an admin":  # the flags
        secret = "alice-secret-9c1e"
        flags = ("--namesrv-access-key", "alice", "--namesrv-secret-key", secret)
    elif how == "wrong secret":  # Apache RocketMQ 5.3+'s broker.conf key, in a config file
        secret = "not-the-root-secret"
        conf = tmp_path / "broker.conf"
        conf.write_text(
            f'innerClientAuthenticationCredentials={{"accessKey":"root","secretKey":"{secret}"}}\n'
        )
        flags = ("--config", str(conf))
    processor = namesrv.remoting.namesrv_server.processor
    gate, refusals = processor.before, []

    def counting_gate(conn, req):
        answer = gate(conn, req)
        if req.code == R.REGISTER_BROKER:
            refusals.append(None if answer is None else answer.code)
        return answer

    monkeypatch.setattr(processor, "before", counting_gate)
    with _peer(tmp_path, namesrv, *flags) as peer:
        line = _wait(lambda: re.search(r".*refused the registration of peer-b.*", _log(tmp_path / "peer.log")),
                     "the refusal logged")  # fmt: skip
        assert line.group(0).endswith(f"refused the registration of {PEER} ({peer.remoting_endpoint}): code 16, "
                                      f"{remark}; {hint}")  # fmt: skip
        assert (
            f" WARNING rmq_spark.remoting: the NameServer {namesrv.namesrv_endpoint} refused"
            in line.group(0)
        )
        assert PEER not in _brokers(namesrv)
        # created on the peer: it registers again at once, and is refused again, logged once
        with RemotingClient(peer.remoting_endpoint) as c:
            create = {"topic": PEER_TOPIC, "readQueueNums": "2", "writeQueueNums": "2", "perm": "6"}
            assert c.request(RemotingCommand(R.UPDATE_AND_CREATE_TOPIC, create)).code == C.SUCCESS
        _wait(lambda: len(refusals) >= 2, "a registration after the topic change")
        assert set(refusals) == {C.NO_PERMISSION}
        assert PEER not in _brokers(namesrv) and PEER not in _route_names(namesrv, PEER_TOPIC)
        assert _log(tmp_path / "peer.log").count("refused the registration") == 1
    log = _log(tmp_path / "peer.log")
    assert secret is None or secret not in log


def test_a_broker_with_an_admins_credentials_registers_leaves_and_registers_again(
    tmp_path, monkeypatch, namesrv
):
    monkeypatch.setenv(ENV[0], "root")
    monkeypatch.setenv(
        ENV[1], "root-secret-7f3a"
    )  # the environment: the secret is not in the process list
    unregistered: list[tuple] = []
    routes = namesrv.remoting.routes
    real_unregister = routes.unregister

    def unregister(addr, name=None):
        unregistered.append((addr, name))
        return real_unregister(addr, name)

    monkeypatch.setattr(routes, "unregister", unregister)
    peer = _peer(tmp_path, namesrv)
    try:
        addr = peer.remoting_endpoint
        _wait(
            lambda: _brokers(namesrv).get(PEER, {}).get("brokerAddrs") == {"0": addr},
            "peer-b registered",
        )
        with RemotingClient(addr) as c:
            create = {"topic": PEER_TOPIC, "readQueueNums": "2", "writeQueueNums": "2", "perm": "6"}
            assert c.request(RemotingCommand(R.UPDATE_AND_CREATE_TOPIC, create)).code == C.SUCCESS
        _wait(
            lambda: PEER in _route_names(namesrv, PEER_TOPIC), "the peer's new topic routed to it"
        )
    finally:
        assert peer.stop() == 0
    # it left with a signed UNREGISTER_BROKER (an unsigned one never reaches the handler)
    assert unregistered == [(addr, PEER)]
    assert PEER not in _brokers(namesrv) and PEER_TOPIC not in json.dumps(_brokers(namesrv))
    # restarted on the same store: registered again, its topic routed to it
    with _peer(tmp_path, namesrv) as again:
        _wait(
            lambda: PEER in _route_names(namesrv, PEER_TOPIC),
            "the restarted peer's topic routed to it",
        )
        assert _brokers(namesrv)[PEER]["brokerAddrs"] == {"0": again.remoting_endpoint}
    log = _log(tmp_path / "peer.log")
    assert "root-secret-7f3a" not in log and "refused" not in log


def test_credentials_options(tmp_path, monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    store = ["--store", str(tmp_path / "s")]
    assert parse_args(store).options.namesrv_credentials is None
    flags = parse_args([*store, "--namesrv-access-key", "a", "--namesrv-secret-key", "flag-secret"])
    assert (flags.options.namesrv_credentials.access_key, flags.options.namesrv_credentials.secret_key) == (
        "a", "flag-secret")  # fmt: skip
    assert "flag-secret" not in repr(flags.options)
    conf = tmp_path / "b.json"
    conf.write_text(
        json.dumps(
            {"innerClientAuthenticationCredentials": {"accessKey": "c", "secretKey": "conf-s"}}
        )
    )
    assert parse_args([*store, "--config", str(conf)]).options.namesrv_credentials.access_key == "c"
    monkeypatch.setenv(ENV[0], "e")
    monkeypatch.setenv(ENV[1], "env-s")
    # flags win, then the environment, then the config file
    assert (
        parse_args([*store, "--config", str(conf)]).options.namesrv_credentials.secret_key
        == "env-s"
    )
    both = [
        *store,
        "--config",
        str(conf),
        "--namesrv-access-key",
        "a",
        "--namesrv-secret-key",
        "flag-secret",
    ]
    assert parse_args(both).options.namesrv_credentials.secret_key == "flag-secret"
    monkeypatch.delenv(ENV[0])
    with pytest.raises(ConfigError, match="an access key and its secret key go together") as e:
        parse_args(store)
    assert "env-s" not in str(e.value)
    monkeypatch.delenv(ENV[1])
    conf.write_text('innerClientAuthenticationCredentials={"accessKey": "c", "secret": "leaked?"}')
    with pytest.raises(ConfigError) as e:
        parse_args([*store, "--config", str(conf)])
    assert str(e.value) == ('the config key innerClientAuthenticationCredentials must be a JSON '
                            'object {"accessKey": "...", "secretKey": "..."}')  # fmt: skip
    assert "leaked" not in str(e.value)
    conf.write_text(json.dumps({"namesrv-secret-key": 12345}))
    with pytest.raises(ConfigError) as e:
        parse_args([*store, "--config", str(conf)])
    assert "12345" not in str(e.value)
