"""The remoting port's ACL matrix: every request code the broker serves x {no credentials, bad
signature, no permission, permission, admin}, each exact answer asserted (as
tests/broker/test_broker_access.py does for gRPC), and the bypasses a campaign found; then the
same for every code of the broker's NameServer (reads open to anyone, writes an admin's only).

The account ``alice`` may PUB|SUB topic ``A`` and use group ``gA`` only; ``root`` is an admin."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

import pytest

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.remoting.acl import ACCESS_KEY, SIGNATURE, sign
from rmq_spark.remoting.client import RemotingClient
from rmq_spark.remoting.codes import RequestCode as R
from rmq_spark.remoting.codes import ResponseCode as C
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.namesrv_requests import (
    GET_KV_CONFIG,
    NAMESRV_REQUESTS,
    PUT_KV_CONFIG,
    QUERY_DATA_VERSION,
)
from rmq_spark.remoting.requests import BROKER_REQUESTS

ACCOUNTS = {"accounts": [
    {"accessKey": "alice", "secretKey": "alice-secret", "topicPerms": ["A=PUB|SUB"], "defaultTopicPerm": "DENY",
     "groupPerms": ["gA=SUB"], "defaultGroupPerm": "DENY"},
    {"accessKey": "subber", "secretKey": "subber-secret", "defaultTopicPerm": "SUB", "defaultGroupPerm": "SUB",
     "groupPerms": ["gB=DENY"]},
    {"accessKey": "root", "secretKey": "root-secret", "admin": True},
]}  # fmt: skip
SECRETS = {a["accessKey"]: a["secretKey"] for a in ACCOUNTS["accounts"]}
SEP1, SEP2 = "\x01", "\x02"


def _props(**kv: str) -> str:
    return "".join(f"{k}{SEP1}{v}{SEP2}" for k, v in kv.items())


def _signed(
    code: int, fields: dict[str, str], body: bytes, ak: str | None, secret: str | None = None
) -> RemotingCommand:
    ext = dict(fields)
    if ak is not None:
        ext[ACCESS_KEY] = ak
        ext[SIGNATURE] = sign(ext, body, secret if secret is not None else SECRETS[ak])
    return RemotingCommand(code, ext, body, version=409)


def _send_v2(topic: str, props: str = "", group: str = "pg") -> dict[str, str]:
    return {
        "a": group,
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": "0",
        "f": "0",
        "g": "1",
        "h": "0",
        "i": props,
        "j": "0",
        "k": "false",
    }


def _batch(*bodies: bytes) -> bytes:
    out = b""
    for body in bodies:
        total = 20 + len(body) + 2
        out += struct.pack(">iiiii", total, 0, 0, 0, len(body)) + body + struct.pack(">h", 0)
    return out


def _offset_of(answer: RemotingCommand) -> int:
    assert answer.code == C.SUCCESS, answer.remark
    return int(answer.ext_fields["msgId"][-16:], 16)


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    root = tmp_path_factory.mktemp("acl_matrix")
    acl = root / "acl.json"
    acl.write_text(json.dumps(ACCOUNTS))
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen="127.0.0.1:0",
                         acl_path=str(acl))  # fmt: skip
    with Broker(str(root / "store"), options=opts) as b, RemotingClient(b.remoting_endpoint) as c:
        seeds = {}
        for topic in ("A", "B"):
            create = {"topic": topic, "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"}
            assert (
                c.request(_signed(R.UPDATE_AND_CREATE_TOPIC, create, b"", "root")).code == C.SUCCESS
            )
            seeds[topic] = _offset_of(
                c.request(_signed(R.SEND_MESSAGE_V2, _send_v2(topic), b"seed", "root"))
            )
            half = _props(TRAN_MSG="true", PGROUP="pg", UNIQ_KEY=f"half-{topic}")
            seeds["half-" + topic] = _offset_of(
                c.request(_signed(R.SEND_MESSAGE_V2, _send_v2(topic, half), b"h", "root"))
            )
        yield b, seeds


# one well-formed request per code, on (topic, group); the seeds give records' offsets
Builder = Callable[[str, str, dict], tuple[dict[str, str], bytes]]


def _pull(t: str, g: str, _s: dict) -> tuple[dict[str, str], bytes]:
    return ({"consumerGroup": g, "topic": t, "queueId": "0", "queueOffset": "0", "maxMsgNums": "4", "sysFlag": "4",
             "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0",
             "expressionType": "TAG"}, b"")  # fmt: skip


def _heartbeat(t: str, g: str, _s: dict) -> tuple[dict[str, str], bytes]:
    doc = {"clientID": "c1", "producerDataSet": [], "consumerDataSet": [
        {"groupName": g, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "subscriptionDataSet": [
             {"topic": t, "subString": "*", "expressionType": "TAG", "subVersion": 1}], "unitMode": False}]}  # fmt: skip
    return {}, json.dumps(doc).encode()


def _lock(t: str, g: str, _s: dict) -> tuple[dict[str, str], bytes]:
    return {}, json.dumps({"consumerGroup": g, "clientId": "c1",
                           "mqSet": [{"topic": t, "brokerName": "broker-a", "queueId": 0}]}).encode()  # fmt: skip


# fmt: off
BUILDERS: dict[int, Builder] = {
    R.SEND_MESSAGE: lambda t, g, s: ({"producerGroup": "pg", "topic": t, "defaultTopic": "TBW102",
                                      "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
                                      "bornTimestamp": "1", "flag": "0", "properties": ""}, b"m"),
    R.SEND_MESSAGE_V2: lambda t, g, s: (_send_v2(t), b"m"),
    R.SEND_BATCH_MESSAGE: lambda t, g, s: ({**_send_v2(t), "m": "true"}, _batch(b"one", b"two")),
    R.CONSUMER_SEND_MSG_BACK: lambda t, g, s: ({"offset": str(s[t]), "group": g, "delayLevel": "1",
                                                "originTopic": t, "maxReconsumeTimes": "16"}, b""),
    R.END_TRANSACTION: lambda t, g, s: ({"producerGroup": "pg",
                                         "commitLogOffset": str(s["half-" + t]), "commitOrRollback": "12",
                                         "fromTransactionCheck": "false", "msgId": f"half-{t}"}, b""),
    R.HEART_BEAT: _heartbeat,
    R.UNREGISTER_CLIENT: lambda t, g, s: ({"clientID": "c1", "consumerGroup": g}, b""),
    R.CHECK_CLIENT_CONFIG: lambda t, g, s: ({}, json.dumps({"group": g, "clientId": "c1", "subscriptionData": {
        "topic": t, "subString": "a > 1", "expressionType": "SQL92"}}).encode()),
    R.GET_CONSUMER_LIST_BY_GROUP: lambda t, g, s: ({"consumerGroup": g}, b""),
    R.QUERY_CONSUMER_OFFSET: lambda t, g, s: ({"consumerGroup": g, "topic": t, "queueId": "0"}, b""),
    R.UPDATE_CONSUMER_OFFSET: lambda t, g, s: ({"consumerGroup": g, "topic": t, "queueId": "0",
                                                "commitOffset": "0"}, b""),
    R.LOCK_BATCH_MQ: _lock,
    R.UNLOCK_BATCH_MQ: _lock,
    R.PULL_MESSAGE: _pull,
    R.LITE_PULL_MESSAGE: _pull,
    R.GET_MAX_OFFSET: lambda t, g, s: ({"topic": t, "queueId": "0"}, b""),
    R.GET_MIN_OFFSET: lambda t, g, s: ({"topic": t, "queueId": "0"}, b""),
    R.SEARCH_OFFSET_BY_TIMESTAMP: lambda t, g, s: ({"topic": t, "queueId": "0", "timestamp": "0"}, b""),
    R.GET_EARLIEST_MSG_STORETIME: lambda t, g, s: ({"topic": t, "queueId": "0"}, b""),
    R.VIEW_MESSAGE_BY_ID: lambda t, g, s: ({"offset": str(s[t])}, b""),
    R.QUERY_MESSAGE: lambda t, g, s: ({"topic": t, "key": "nokey", "maxNum": "4", "beginTimestamp": "0",
                                       "endTimestamp": str(1 << 62)}, b""),
    R.UPDATE_AND_CREATE_TOPIC: lambda t, g, s: ({"topic": t, "readQueueNums": "1", "writeQueueNums": "1",
                                                 "perm": "6"}, b""),
    R.GET_ALL_TOPIC_CONFIG: lambda t, g, s: ({}, b""),
    R.DELETE_TOPIC_IN_BROKER: lambda t, g, s: ({"topic": "Doomed" + t}, b""),
    R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: lambda t, g, s: ({}, b""),
    R.INVOKE_BROKER_TO_RESET_OFFSET: lambda t, g, s: ({"topic": t, "group": g, "timestamp": "-1",
                                                       "isForce": "true"}, b""),
    R.GET_BROKER_RUNTIME_INFO: lambda t, g, s: ({}, b""),
    R.GET_TOPIC_STATS_INFO: lambda t, g, s: ({"topic": t}, b""),
    R.GET_TOPIC_CONFIG: lambda t, g, s: ({"topic": t}, b""),
    R.GET_CONSUME_STATS: lambda t, g, s: ({"consumerGroup": g, "topic": t}, b""),
    R.GET_CONSUMER_CONNECTION_LIST: lambda t, g, s: ({"consumerGroup": g}, b""),
    R.GET_PRODUCER_CONNECTION_LIST: lambda t, g, s: ({"producerGroup": g}, b""),
    R.QUERY_TOPIC_CONSUME_BY_WHO: lambda t, g, s: ({"topic": t}, b""),
    R.QUERY_TOPICS_BY_CONSUMER: lambda t, g, s: ({"group": g}, b""),
    R.GET_ROUTEINFO_BY_TOPIC: lambda t, g, s: ({"topic": t}, b""),
}
# fmt: on

# codes any signed account may call (their answers carry no topic's or group's data, or only
# what the caller may see): "no permission" is not a case for them
AUTHENTICATED_ONLY = {R.GET_ALL_TOPIC_CONFIG, R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, R.GET_BROKER_RUNTIME_INFO,
                      R.GET_ROUTEINFO_BY_TOPIC}  # fmt: skip
ADMIN_ONLY = {R.UPDATE_AND_CREATE_TOPIC, R.DELETE_TOPIC_IN_BROKER, R.INVOKE_BROKER_TO_RESET_OFFSET}

# the answer of a permitted request (alice on A/gA; root on the same), when it is not SUCCESS
ANSWERS = {
    R.GET_CONSUMER_LIST_BY_GROUP: C.SYSTEM_ERROR,  # "no consumer for this group" (none online)
    R.QUERY_MESSAGE: C.QUERY_NOT_FOUND,
    R.GET_CONSUMER_CONNECTION_LIST: C.CONSUMER_NOT_ONLINE,
    R.GET_PRODUCER_CONNECTION_LIST: C.SYSTEM_ERROR,  # "the producer group[..] not exist"
    R.PULL_MESSAGE: C.SUCCESS,
}


def test_every_code_has_a_row_and_a_case(acl_broker):
    broker, _ = acl_broker
    served = set(broker.remoting.broker_server.processor.handlers)
    assert served == set(BROKER_REQUESTS)
    assert served == {int(c) for c in BUILDERS}


def _ask(
    broker,
    code: int,
    ak: str | None,
    topic: str,
    group: str,
    seeds: dict,
    secret: str | None = None,
):
    fields, body = BUILDERS[code](topic, group, seeds)
    with RemotingClient(broker.remoting_endpoint) as c:
        return c.request(_signed(code, fields, body, ak, secret))


@pytest.mark.parametrize("code", sorted(BUILDERS), ids=lambda c: R(c).name)
def test_acl_matrix(acl_broker, code):
    broker, seeds = acl_broker
    unsigned = _ask(broker, code, None, "A", "gA", seeds)
    assert (unsigned.code, "not signed" in (unsigned.remark or "")) == (C.NO_PERMISSION, True), (
        unsigned.remark
    )
    forged = _ask(broker, code, "alice", "A", "gA", seeds, secret="guess")
    assert (forged.code, "signature" in (forged.remark or "")) == (C.NO_PERMISSION, True), (
        forged.remark
    )
    unknown = _ask(broker, code, "mallory", "A", "gA", seeds, secret="x")
    assert unknown.code == C.NO_PERMISSION

    denied = _ask(broker, code, "alice", "B", "gB", seeds)
    permitted = _ask(broker, code, "alice", "A", "gA", seeds)
    if code in ADMIN_ONLY:
        assert denied.code == C.NO_PERMISSION and "admin" in denied.remark
        assert permitted.code == C.NO_PERMISSION and "admin" in permitted.remark
    elif code in AUTHENTICATED_ONLY:
        assert denied.code == permitted.code == ANSWERS.get(code, C.SUCCESS), (
            denied.remark,
            permitted.remark,
        )
    else:
        assert denied.code == C.NO_PERMISSION, (denied.code, denied.remark)
        assert "alice" in denied.remark
        assert permitted.code == ANSWERS.get(code, C.SUCCESS), (permitted.code, permitted.remark)
    admin = _ask(broker, code, "root", "B", "gB", seeds)
    assert admin.code == ANSWERS.get(code, C.SUCCESS), (admin.code, admin.remark)


# --- the bypasses, one by one ------------------------------------------------------------------
def _max_offset(c: RemotingClient, topic: str) -> int:
    answer = c.request(_signed(R.GET_MAX_OFFSET, {"topic": topic, "queueId": "0"}, b"", "root"))
    return int(answer.ext_fields["offset"])


def test_a_send_naming_two_topics_is_stored_where_it_was_authorized(acl_broker):
    broker, _ = acl_broker
    with RemotingClient(broker.remoting_endpoint) as c:
        before = _max_offset(c, "A"), _max_offset(c, "B")
        for code in (R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE):
            fields = (
                {**_send_v2("A"), "topic": "B", "m": "true"}
                if code == R.SEND_BATCH_MESSAGE
                else {**_send_v2("A"), "topic": "B"}
            )
            body = _batch(b"x") if code == R.SEND_BATCH_MESSAGE else b"x"
            assert c.request(_signed(code, fields, body, "alice")).code == C.SUCCESS
            # and the other way round: authorized on nothing it may use
            other = {**fields, "b": "B", "topic": "A"}
            assert c.request(_signed(code, other, body, "alice")).code == C.NO_PERMISSION
        assert (_max_offset(c, "A"), _max_offset(c, "B")) == (before[0] + 2, before[1])


def test_records_are_read_by_offset_only_with_their_topics_permission(acl_broker):
    broker, seeds = acl_broker
    with RemotingClient(broker.remoting_endpoint) as c:
        view = c.request(_signed(R.VIEW_MESSAGE_BY_ID, {"offset": str(seeds["A"])}, b"", "alice"))
        assert view.code == C.SUCCESS and b"seed" in view.body
        for offset in (
            seeds["B"],
            seeds["half-A"],
        ):  # another topic; an uncommitted half (a system topic)
            view = c.request(_signed(R.VIEW_MESSAGE_BY_ID, {"offset": str(offset)}, b"", "alice"))
            assert view.code == C.NO_PERMISSION and view.body == b""
        # a record of B copied into alice's own retry topic, which she could then read
        back = {
            "offset": str(seeds["B"]),
            "group": "gA",
            "delayLevel": "1",
            "maxReconsumeTimes": "16",
        }
        retry_before = (
            _max_offset(c, "%RETRY%gA")
            if c.request(_signed(R.GET_TOPIC_CONFIG, {"topic": "%RETRY%gA"}, b"", "root")).code
            == C.SUCCESS
            else 0
        )
        assert (
            c.request(_signed(R.CONSUMER_SEND_MSG_BACK, back, b"", "alice")).code == C.NO_PERMISSION
        )
        if retry_before:
            assert _max_offset(c, "%RETRY%gA") == retry_before


def test_system_retry_and_dead_letter_topics_follow_their_own_permission(acl_broker):
    broker, _ = acl_broker
    with RemotingClient(broker.remoting_endpoint) as c:
        # subber may SUB every topic by default, yet system topics are for admins
        for topic in ("RMQ_SYS_TRANS_HALF_TOPIC", "SCHEDULE_TOPIC_XXXX", "%RETRY%gB", "%DLQ%gB"):
            fields, _ = _pull(topic, "g1", {})
            answer = c.request(_signed(R.PULL_MESSAGE, fields, b"", "subber"))
            assert answer.code == C.NO_PERMISSION, (topic, answer.code, answer.remark)
        fields, _ = _pull("%RETRY%g1", "g1", {})
        assert c.request(_signed(R.PULL_MESSAGE, fields, b"", "subber")).code != C.NO_PERMISSION


def test_a_client_cannot_unregister_another_connections_client(acl_broker):
    broker, _ = acl_broker
    _fields, body = _heartbeat("A", "gA", {})
    with (
        RemotingClient(broker.remoting_endpoint) as one,
        RemotingClient(broker.remoting_endpoint) as two,
    ):
        assert one.request(_signed(R.HEART_BEAT, {}, body, "alice")).code == C.SUCCESS
        listed = {"consumerGroup": "gA"}
        assert json.loads(
            one.request(_signed(R.GET_CONSUMER_LIST_BY_GROUP, listed, b"", "alice")).body
        ) == {"consumerIdList": ["c1"]}
        assert two.request(_signed(R.UNREGISTER_CLIENT, {"clientID": "c1", "consumerGroup": "gA"}, b"",
                                   "alice")).code == C.SUCCESS  # fmt: skip
        assert json.loads(
            one.request(_signed(R.GET_CONSUMER_LIST_BY_GROUP, listed, b"", "alice")).body
        ) == {"consumerIdList": ["c1"]}
        # its own connection may
        assert one.request(_signed(R.UNREGISTER_CLIENT, {"clientID": "c1", "consumerGroup": "gA"}, b"",
                                   "alice")).code == C.SUCCESS  # fmt: skip
        assert (
            one.request(_signed(R.GET_CONSUMER_LIST_BY_GROUP, listed, b"", "alice")).code
            == C.SYSTEM_ERROR
        )


def test_transaction_check_backs_go_only_to_producers_that_may_publish_the_halfs_topic():
    from rmq_spark.access.auth import AccessControl
    from rmq_spark.remoting.clients import ClientManager
    from rmq_spark.remoting.transaction import RemotingTransactionChecker
    from rmq_spark.store.message import MessageExt

    acl = AccessControl.from_dict(ACCOUNTS)

    class Channel:  # the part of a Connection the checker uses: who signed, and what it was sent
        def __init__(self, account):
            self.attrs = {"account": account}
            self.closed = False
            self.sent = []

        def send_oneway(self, cmd):
            self.sent.append(cmd)
            return True

    clients = ClientManager()
    intruder, owner = Channel(acl.accounts["subber"]), Channel(acl.accounts["alice"])
    for conn, cid in ((intruder, "intruder"), (owner, "owner")):
        clients.heartbeat(conn, {"clientID": cid, "producerDataSet": [{"groupName": "pg"}]})
    half = MessageExt(topic="RMQ_SYS_TRANS_HALF_TOPIC", body=b"secret", properties={"REAL_TOPIC": "A",
                      "REAL_QID": "0", "UNIQ_KEY": "u1"}, store_host="127.0.0.1", commitlog_offset=0)  # fmt: skip
    checker = RemotingTransactionChecker(clients, 10911)
    for _ in range(4):
        assert checker.check("pg", half)
    assert intruder.sent == [] and len(owner.sent) == 4
    half_b = MessageExt(topic="RMQ_SYS_TRANS_HALF_TOPIC", body=b"secret", properties={"REAL_TOPIC": "B"},
                        store_host="127.0.0.1", commitlog_offset=0)  # fmt: skip
    assert not checker.check("pg", half_b) and intruder.sent == []


# --- the NameServer's codes ---------------------------------------------------------------------
# one well-formed request per NameServer code (rmq_spark.remoting.namesrv_requests); the broker
# registered is a peer (the local broker cannot be registered by anyone)
_PEER = {
    "brokerName": "peer-m",
    "brokerAddr": "10.1.1.1:10911",
    "clusterName": "Peers",
    "brokerId": "0",
}
_PEER_TOPIC = {"topicName": "OnPeer", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}
_PEER_BODY = json.dumps(
    {"topicConfigSerializeWrapper": {"topicConfigTable": {"OnPeer": _PEER_TOPIC}}}
).encode()
NAMESRV_BUILDERS: dict[int, tuple[dict[str, str], bytes]] = {
    R.GET_ROUTEINFO_BY_TOPIC: ({"topic": "A"}, b""),
    R.GET_BROKER_CLUSTER_INFO: ({}, b""),
    R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: ({}, b""),
    R.GET_TOPICS_BY_CLUSTER: ({"cluster": "DefaultCluster"}, b""),
    QUERY_DATA_VERSION: (_PEER, b'{"counter":1,"timestamp":0}'),
    GET_KV_CONFIG: ({"namespace": "ORDER_TOPIC_CONFIG", "key": "A"}, b""),
    R.REGISTER_BROKER: (
        {**_PEER, "heartbeatTimeoutMillis": "120000", "compressed": "false"},
        _PEER_BODY,
    ),
    R.UNREGISTER_BROKER: (_PEER, b""),
    R.DELETE_TOPIC_IN_NAMESRV: ({"topic": "OnPeer", "clusterName": "Peers"}, b""),
    PUT_KV_CONFIG: ({"namespace": "ORDER_TOPIC_CONFIG", "key": "A", "value": "peer-m:1"}, b""),
}
# the answer of each code when it is let through (GET_KV_CONFIG: no kv config is kept)
NAMESRV_ANSWERS = {GET_KV_CONFIG: C.QUERY_NOT_FOUND}
NAMESRV_ADMIN_ONLY = {
    R.REGISTER_BROKER,
    R.UNREGISTER_BROKER,
    R.DELETE_TOPIC_IN_NAMESRV,
    PUT_KV_CONFIG,
}
# identity -> (access key, secret to sign with); None: unsigned
IDENTITIES = {
    "no credentials": (None, None), "bad signature": ("root", "guess"), "unknown key": ("mallory", "x"),
    "no permission": ("subber", None), "permission": ("alice", None), "admin": ("root", None),
}  # fmt: skip


def _refusal(identity: str, code: int) -> str:
    """The exact remark of a write refused to ``identity``."""
    not_admin = "accessKey {} is not an admin account: request code {} needs one"
    return {
        "no credentials": "the request is not signed (AccessKey and Signature are missing): "
                          "access control is on",
        "bad signature": "Check signature failed for accessKey=root",
        "unknown key": "No acl config for mallory",
        "no permission": not_admin.format("subber", code),
        "permission": not_admin.format("alice", code),
    }[identity]  # fmt: skip


def test_every_namesrv_code_has_a_row_and_a_case(acl_broker):
    broker, _ = acl_broker
    served = set(broker.remoting.namesrv_server.processor.handlers)
    assert served == set(NAMESRV_REQUESTS) == {int(c) for c in NAMESRV_BUILDERS}
    assert {c for c, s in NAMESRV_REQUESTS.items() if not s.open} == NAMESRV_ADMIN_ONLY


@pytest.mark.parametrize("identity", list(IDENTITIES))
@pytest.mark.parametrize("code", sorted(NAMESRV_BUILDERS), ids=str)
def test_namesrv_acl_matrix(acl_broker, code, identity):
    """With --acl the NameServer's reads are served to anyone, signed or not (as RocketMQ's
    NameServer serves them), and its writes only to an admin's signature."""
    broker, _ = acl_broker
    ak, secret = IDENTITIES[identity]
    fields, body = NAMESRV_BUILDERS[code]
    with RemotingClient(broker.namesrv_endpoint) as c:
        answer = c.request(_signed(code, fields, body, ak, secret))
        if code in NAMESRV_ADMIN_ONLY and identity != "admin":
            assert (answer.code, answer.remark) == (C.NO_PERMISSION, _refusal(identity, code))
        else:
            assert answer.code == NAMESRV_ANSWERS.get(code, C.SUCCESS), (answer.code, answer.remark)
        if code == R.REGISTER_BROKER:
            registered = "peer-m" in json.loads(c.request(RemotingCommand(R.GET_BROKER_CLUSTER_INFO)).body)[
                "brokerAddrTable"]  # fmt: skip
            assert registered == (identity == "admin")
