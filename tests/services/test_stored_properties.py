"""What the broker stores for a send and a send-back, as Apache RocketMQ 5.x stores it (issue 29
item 3; the same against a real Apache broker: tests/interop/test_apache_properties.py)."""

from __future__ import annotations

from types import SimpleNamespace

from rocketmq.grpc_protocol import definition_pb2 as D

from rmq_spark.broker.messages import parse_send
from rmq_spark.remoting.codes import RequestCode as R
from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.send import SendProcessor
from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.core import BrokerCore
from rmq_spark.services.transaction.states import EndTxStatus, TransactionAction
from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.config import TopicConfig
from rmq_spark.store.message import Message, host_bytes, offset_msg_id
from rmq_spark.store.properties import encode_properties
from rmq_spark.store.store import StoreConfig

T0 = 1_700_000_000_000
CONN = SimpleNamespace(peer="127.0.0.1:50000")
STAMPS = {"CLUSTER": "ClusterX", "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}


def open_core(root: str) -> tuple[BrokerCore, SendProcessor]:
    cfg = BrokerConfig(store=StoreConfig(commitlog_segment_bytes=1 << 20, cq_segment_units=1000))
    core = BrokerCore(root, cfg, FakeClock(T0), start_services=False)
    return core, SendProcessor(core, "broker-a", "ClusterX")


def send(
    proc: SendProcessor, topic: str, props: dict[str, str], reconsume: int = 0
) -> RemotingCommand:
    fields = {"producerGroup": "PG", "topic": topic, "queueId": "0", "sysFlag": "0", "bornTimestamp": str(T0),
              "flag": "0", "reconsumeTimes": str(reconsume), "properties": encode_properties(props).decode()}  # fmt: skip
    return proc.send(CONN, RemotingCommand(R.SEND_MESSAGE, fields, b"body"))


def test_a_remoting_send_stores_cluster_region_and_trace_switch(store_dir):
    core, proc = open_core(store_dir)
    try:
        assert send(proc, "T", {L.P_TAGS: "a", L.P_WAIT: "true"}).code == ResponseCode.SUCCESS
        (m,) = core.store.get_messages("T", 0, 0).messages
        assert {k: m.properties[k] for k in STAMPS} == STAMPS
        assert m.properties[L.P_WAIT] == "true"  # stored as the client sent it (5.x)
    finally:
        core.shutdown()


def test_a_grpc_send_stores_them_too():
    pm = D.Message(body=b"x")
    pm.topic.name = "T"
    pm.system_properties.message_id = "01ABC"
    pm.system_properties.body_encoding = D.Encoding.IDENTITY
    out = parse_send(
        pm, TopicConfig("T"), now_ms=T0, body_max_bytes=64, max_delay_ms=1000, cluster="ClusterX"
    )
    assert {k: out.properties[k] for k in STAMPS} == STAMPS


def test_send_back_stores_what_apache_stores(store_dir):
    """CONSUMER_SEND_MSG_BACK of a committed transactional message: the original's properties
    plus RETRY_TOPIC, WAIT=false, DELAY=level (retry) or 0 (DLQ) and ORIGIN_MESSAGE_ID = the
    original's offsetMsgId (the request's originMsgId is not used); SYSFLAG and TRAN_MSG kept,
    and no half is made of either copy."""
    core, proc = open_core(store_dir)
    try:
        half = Message("T", b"orig", {L.P_TAGS: "a", L.P_TRAN_MSG: "true", L.P_PGROUP: "PG"},
                       sys_flag=L.TRANSACTION_PREPARED_TYPE)  # fmt: skip
        r = core.send([half])
        status = core.transactions.end_transaction(
            int(r.append.phys_offsets[0]),
            int(r.append.queue_offsets[0]),
            "PG",
            None,
            TransactionAction.COMMIT,
        )
        assert status is EndTxStatus.SUCCESS
        (orig,) = core.store.get_messages("T", 0, 0).messages
        assert (
            orig.transaction_type == L.TRANSACTION_COMMIT_TYPE
            and orig.properties[L.P_TRAN_MSG] == "true"
        )
        for level, group in ((2, "G1"), (-1, "G2")):
            back = {"offset": str(orig.commitlog_offset), "group": group, "delayLevel": str(level),
                    "originMsgId": "NOT-USED", "maxReconsumeTimes": "16"}  # fmt: skip
            assert (
                proc.send_back(CONN, RemotingCommand(R.CONSUMER_SEND_MSG_BACK, back)).code
                == ResponseCode.SUCCESS
            )
        added = {
            L.P_RETRY_TOPIC: "T",
            L.P_WAIT: "false",
            L.P_ORIGIN_MESSAGE_ID: offset_msg_id(
                host_bytes(orig.store_host), orig.store_port, orig.commitlog_offset
            ),
        }
        own = {k: v for k, v in orig.properties.items() if k != "__CRC32#"}
        (retry,) = core.store.get_messages(L.SCHEDULE_TOPIC, 1, 0).messages  # level 2, on its way
        (dlq,) = core.store.get_messages("%DLQ%G2", 0, 0).messages
        strip = ("__CRC32#", L.P_REAL_TOPIC, L.P_REAL_QID)  # the retry's routing to its delay level
        assert {k: v for k, v in retry.properties.items() if k not in strip} == {
            **own,
            **added,
            L.P_DELAY: "2",
        }
        assert (retry.properties[L.P_REAL_TOPIC], retry.properties[L.P_REAL_QID]) == (
            "%RETRY%G1",
            "0",
        )
        assert {k: v for k, v in dlq.properties.items() if k != "__CRC32#"} == {
            **own,
            **added,
            L.P_DELAY: "0",
        }
        for copy in (retry, dlq):
            assert copy.transaction_type == L.TRANSACTION_COMMIT_TYPE and copy.reconsume_times == 1
        assert core.store.max_offset(L.TRANS_HALF_TOPIC, 0) == 1  # the original's half only
    finally:
        core.shutdown()
