"""Transactions over remoting (``EndTransactionProcessor``, ``Broker2Client``):

- END_TRANSACTION (usually oneway): commit or roll back the half message at ``commitLogOffset``
  through the broker's transaction service, exactly as a gRPC EndTransaction does.
- the check-back: :class:`RemotingTransactionChecker` sends CHECK_TRANSACTION_STATE (oneway) over
  the connection of a live producer of the half's producer group, its body the half as a record
  with its real topic and queue; the producer answers with END_TRANSACTION
  (``fromTransactionCheck=true``).  A half of a group with no remoting producer is left to the
  next checker (the gRPC one): both protocols share one transaction service.
"""

from __future__ import annotations

import logging
from typing import Any

from rmq_spark.remoting.clients import ClientManager
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.headers import fields_of
from rmq_spark.remoting.requests import may_publish
from rmq_spark.remoting.server import Connection
from rmq_spark.services.transaction.states import EndTxStatus, TransactionAction
from rmq_spark.store import layout as L
from rmq_spark.store.encode import V4_SYS_FLAG_MASK, encode_v4_record, place_v4_record
from rmq_spark.store.message import MessageExt, host_bytes
from rmq_spark.store.properties import encode_properties

__all__ = [
    "CompositeChecker",
    "RemotingTransactionChecker",
    "end_transaction_handler",
    "record_bytes",
]

log = logging.getLogger("rmq_spark.remoting.transaction")

# MessageSysFlag's transaction types as the client names its decision
_ACTIONS = {
    L.TRANSACTION_COMMIT_TYPE: TransactionAction.COMMIT,
    L.TRANSACTION_ROLLBACK_TYPE: TransactionAction.ROLLBACK,
    L.TRANSACTION_NOT_TYPE: TransactionAction.UNKNOWN,
}
_FAILED = {
    EndTxStatus.NOT_FOUND: "Find prepared transaction message failed",
    EndTxStatus.PRODUCER_GROUP_MISMATCH: "The producer group wrong",
    EndTxStatus.QUEUE_OFFSET_MISMATCH: "The transaction state table offset wrong",
    EndTxStatus.TRANSACTION_ID_MISMATCH: "The transaction id wrong",
    EndTxStatus.ILLEGAL_OPERATION: "the producer's decision came after the check immunity time",
    EndTxStatus.EXPIRED: "the prepared message is older than the store keeps",
    EndTxStatus.CONFLICT: "the transaction conflicts with another end",
}


def record_bytes(m: MessageExt, store_port: int) -> bytes:
    """``m`` encoded as a CommitLog record (``MessageDecoder.encode``): what a check-back's body
    and a VIEW_MESSAGE_BY_ID answer carry when the stored record itself cannot be sent."""
    props = encode_properties({k: v for k, v in m.properties.items() if k != "__CRC32#"})
    buf = encode_v4_record(m.topic, m.queue_id, m.body, props, m.flag, m.sys_flag & V4_SYS_FLAG_MASK,
                     m.born_timestamp_ms, host_bytes(m.born_host), m.born_port, m.reconsume_times,
                     m.prepared_transaction_offset, host_bytes(m.store_host), m.store_port or store_port,
                     False)  # fmt: skip
    if buf is None:
        raise ValueError("IPv6 hosts are not supported in check-back bodies")
    place_v4_record(buf, m.queue_offset, m.commitlog_offset, m.store_timestamp_ms, False)
    return bytes(buf)


def end_transaction_handler(core: Any) -> Any:
    def handle(conn: Connection, req: RemotingCommand) -> RemotingCommand:
        svc = core.transactions
        if svc is None:
            return req.response(
                ResponseCode.SYSTEM_ERROR, "the transaction service is not installed"
            )
        f = fields_of(req.ext_fields)
        kind = f.int("commitOrRollback")
        action = _ACTIONS.get(kind)
        if action is None:
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"commitOrRollback {kind} is not 0, 8 or 12"
            )
        if action is TransactionAction.UNKNOWN:
            return req.response(
                ResponseCode.SUCCESS
            )  # nothing decided yet: the check-back asks later
        if req.account is not None and not req.account.admin:
            # deciding a half publishes (or discards) a message of its real topic: PUB on it, as gRPC
            half = core.store.look_message_by_offset(f.long("commitLogOffset"))
            topic = half.properties.get(L.P_REAL_TOPIC, half.topic) if half is not None else None
            if topic is not None and not may_publish(req.account, topic):
                return req.response(ResponseCode.NO_PERMISSION, f"No PUB permission for topic {topic} "
                                                                f"(accessKey {req.account.access_key})")  # fmt: skip
        status = svc.end_transaction(
            f.long("commitLogOffset"), f.long("tranStateTableOffset", -1) if "tranStateTableOffset" in
            req.ext_fields else None, f.str("producerGroup"), f.opt("msgId") or None, action,
            f.bool("fromTransactionCheck"),
        )  # fmt: skip
        if status in (EndTxStatus.SUCCESS, EndTxStatus.NOT_HANDLED, EndTxStatus.FLUSH_DISK_TIMEOUT,
                      EndTxStatus.ALREADY_COMMITTED, EndTxStatus.ALREADY_ROLLED_BACK, EndTxStatus.ALREADY_RESOLVED,
                      EndTxStatus.IN_PROGRESS):  # fmt: skip
            return req.response(ResponseCode.SUCCESS)
        return req.response(ResponseCode.SYSTEM_ERROR, _FAILED.get(status, status.value))

    return handle


class RemotingTransactionChecker:
    """Asks a remoting producer of the half's group (see the module docstring)."""

    def __init__(self, clients: ClientManager, store_port: int) -> None:
        self.clients = clients
        self.store_port = store_port

    def check(self, producer_group: str, half: MessageExt) -> bool:
        topic = half.properties.get(L.P_REAL_TOPIC, half.topic)
        # the check-back carries the half: only to producers that may publish to its topic (with
        # --acl any account can claim a producer group in its heartbeat)
        conns = [c for c in self.clients.producer_connections(producer_group)
                 if may_publish(c.attrs.get("account"), topic)]  # fmt: skip
        if not conns:
            return False
        uniq = half.properties.get(L.P_UNIQ_KEY) or half.msg_id
        header = {
            "tranStateTableOffset": str(half.queue_offset),
            "commitLogOffset": str(half.commitlog_offset),
            "msgId": uniq,
            "transactionId": half.properties.get(L.P_TRANSACTION_ID) or uniq,
            "offsetMsgId": half.msg_id,
        }
        body = record_bytes(half, self.store_port)
        for conn in conns:
            if conn.send_oneway(
                RemotingCommand(RequestCode.CHECK_TRANSACTION_STATE, dict(header), body)
            ):
                return True
        return False


class CompositeChecker:
    """Asks each checker in turn until one reached a producer."""

    def __init__(self, *checkers: Any) -> None:
        self.checkers = [c for c in checkers if c is not None]

    def check(self, producer_group: str, half: MessageExt) -> bool:
        for c in self.checkers:
            try:
                if c.check(producer_group, half):
                    return True
            except Exception:
                log.exception("transaction checker %r failed", c)
        return False
