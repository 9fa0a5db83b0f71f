"""REGISTER_BROKER requests that a real Apache RocketMQ 5.5.0 NameServer refuses are refused by
rmq-broker's NameServer too, the way a user sees it: the same response code (SYSTEM_ERROR), and
the broker absent from cluster info afterwards.  rmq-broker's answer names the problem where
Apache's is a Java exception's text.

Apache's NameServer has no access control (5.5.0: neither ``NamesrvConfig`` nor its processors
know an ACL or authentication setting, only the brokers and the proxy do), so it cannot be run
with ``--acl`` as rmq-broker's NameServer can; what is checked here is that a registration signed
as ``AclClientRPCHook`` signs (``rmq-broker --namesrv-access-key``, the role of Apache's
``innerClientAuthenticationCredentials``) still registers with it.

What rmq-broker refuses beyond Apache (measured here with 5.5.0: Apache registers a brokerId of
-1, an address without a port, a topic ``../x`` and 2,000,000,000 queues, and keeps a
``heartbeatTimeoutMillis`` of 2^62 as given) is in ``tests/remoting/test_namesrv_hardening.py``.
"""

from __future__ import annotations

import json
import time
import zlib

import pytest
from _apache import ApacheRocketMQ

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.cluster.acl import Credentials
from rmq_spark.remoting import jsonbody
from rmq_spark.remoting.client import RemotingClient
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.services.config import BrokerConfig

pytestmark = pytest.mark.interop

GOOD = json.dumps({"topicConfigSerializeWrapper": {
    "topicConfigTable": {"T": {"topicName": "T", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}},
    "dataVersion": {"counter": 1, "stateVersion": 0, "timestamp": 0}}, "filterServerList": []}).encode()  # fmt: skip
WRONG_TYPE = b'{"topicConfigSerializeWrapper": {"topicConfigTable": {"T": {"readQueueNums": "x"}}}}'
# case -> (extra header fields, body, what rmq-broker's answer names)
REFUSED = {
    "crc32 mismatch": ({"bodyCrc32": "12345"}, GOOD, "crc32 not match"),
    "not JSON": ({}, b"not json at all", "neither JSON nor deflated"),
    "JSON nested 200,000 deep": ({}, b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
    "compressed, not deflate": ({"compressed": "true"}, b"\x78garbage", "not valid zlib data"),
    "a queue count of the wrong type": ({}, WRONG_TYPE, "readQueueNums 'x' is not a number"),
    "a JSON string": ({}, b'"a string"', "not a RegisterBrokerBody object"),
}  # fmt: skip


@pytest.fixture(scope="module")
def namesrvs(tmp_path_factory):
    d = tmp_path_factory.mktemp("namesrv-interop")
    with ApacheRocketMQ(d / "apache", brokers=()) as apache:
        opts = BrokerOptions(
            listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen="127.0.0.1:0"
        )
        with Broker(str(d / "rmq"), options=opts) as rmq:
            yield {"apache": apache.namesrv_addr, "rmq-broker": rmq.namesrv_endpoint}


def _brokers(addr: str) -> set[str]:
    with RemotingClient(addr, timeout_s=10) as c:
        answer = c.request(RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO, version=401))
    return set(jsonbody.loads(answer.body)["brokerAddrTable"])


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_apache_refuses_rmq_broker_refuses(namesrvs, case):
    extra, body, named = REFUSED[case]
    name = "peer-" + str(zlib.crc32(case.encode()))
    header = {"brokerName": name, "brokerAddr": "10.9.9.9:10911", "clusterName": "Peers", "haServerAddr": "10.9.9.9:10911",
              "brokerId": "0", "heartbeatTimeoutMillis": "120000", "compressed": "false", **extra}  # fmt: skip
    answers = {}
    for server, addr in namesrvs.items():
        with RemotingClient(
            addr, timeout_s=30
        ) as c:  # kept open: a broker leaves with its connection
            answers[server] = c.request(
                RemotingCommand(RequestCode.REGISTER_BROKER, dict(header), body, version=401)
            )
            assert name not in _brokers(addr), f"{server} registered {name} ({case})"
    assert answers["apache"].code == answers["rmq-broker"].code == ResponseCode.SYSTEM_ERROR, {
        s: (a.code, (a.remark or "")[:120]) for s, a in answers.items()}  # fmt: skip
    remark = answers["rmq-broker"].remark or ""
    assert named in remark and "Error:" not in remark and "Exception" not in remark, remark


def test_a_signed_rmq_broker_registers_with_apaches_namesrv(namesrvs, tmp_path):
    """rmq-broker signing its REGISTER_BROKER (AccessKey and Signature beside the header) is
    registered by Apache's NameServer as any broker is, with its address, and leaves when it stops."""
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_addrs=(namesrvs["apache"],),
                         namesrv_credentials=Credentials("rocketmq2", "12345678"))  # fmt: skip
    config = BrokerConfig()
    config.broker_name = "rmq-signed"
    with Broker(str(tmp_path / "signed"), config=config, options=opts) as b:
        deadline = time.monotonic() + 30
        while "rmq-signed" not in _brokers(namesrvs["apache"]):
            assert time.monotonic() < deadline, "rmq-signed never appeared in Apache's cluster info"
            time.sleep(0.1)
        with RemotingClient(namesrvs["apache"], timeout_s=10) as c:
            info = jsonbody.loads(
                c.request(RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO, version=401)).body
            )
        assert info["brokerAddrTable"]["rmq-signed"]["brokerAddrs"] == {"0": b.remoting_endpoint}
    deadline = time.monotonic() + 30
    while "rmq-signed" in _brokers(
        namesrvs["apache"]
    ):  # UNREGISTER_BROKER (signed) and the closed connection
        assert time.monotonic() < deadline, (
            "rmq-signed stayed in Apache's cluster info after it stopped"
        )
        time.sleep(0.1)
