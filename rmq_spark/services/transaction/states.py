"""The vocabulary of transactions: what a producer or a check-back asks (:class:`TransactionAction`),
what ending a half answers (:class:`EndTxStatus`), the state of a transaction (:class:`TxnState`),
and where a half is (:class:`HalfRef`)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rmq_spark.errors import MessageIllegalError
from rmq_spark.store.store import PutResult


class TransactionAction(enum.Enum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


class EndTxStatus(enum.Enum):
    SUCCESS = "SUCCESS"
    NOT_HANDLED = "NOT_HANDLED"  # action UNKNOWN: nothing to do
    NOT_FOUND = "NOT_FOUND"  # no half message at that CommitLog offset
    PRODUCER_GROUP_MISMATCH = "PRODUCER_GROUP_MISMATCH"
    QUEUE_OFFSET_MISMATCH = "QUEUE_OFFSET_MISMATCH"  # tranStateTableOffset
    TRANSACTION_ID_MISMATCH = "TRANSACTION_ID_MISMATCH"
    ILLEGAL_OPERATION = "ILLEGAL_OPERATION"  # a producer's end after its CHECK_IMMUNITY time
    ALREADY_COMMITTED = "ALREADY_COMMITTED"
    ALREADY_ROLLED_BACK = "ALREADY_ROLLED_BACK"
    ALREADY_RESOLVED = "ALREADY_RESOLVED"  # ended by an op that does not say how
    IN_PROGRESS = "IN_PROGRESS"  # another end of the same transaction is being written
    EXPIRED = "EXPIRED"  # a half stored longer ago than the store keeps files (file reserved time)
    CONFLICT = "CONFLICT"  # a group mixes pending and ended halves (or commits and rollbacks)
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"  # written (so ended), not yet durable


class TxnState(enum.Enum):
    PENDING = "PENDING"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    RESOLVED = "RESOLVED"  # an op without TRAN_OP_ACTION (written by another tool)
    NOT_FOUND = "NOT_FOUND"


@dataclass(frozen=True)
class HalfRef:
    """Where a half message is, and what ending it checks: the fields other than the CommitLog
    offset are checked when given (RocketMQ's ``checkPrepareMessage``: producer group,
    tranStateTableOffset, transaction id; the topic by the broker's EndTransaction)."""

    commitlog_offset: int
    queue_offset: int | None = None
    producer_group: str | None = None
    transaction_id: str | None = None
    topic: str | None = None


@dataclass
class GroupResult:
    status: EndTxStatus
    put: PutResult | None = None
    transaction_ids: Sequence[str] = field(default_factory=list)  # the transactions this call ended
    rejected: dict[int, EndTxStatus] = field(default_factory=dict)  # CommitLog offset -> why

    @property
    def ok(self) -> bool:
        return self.status is EndTxStatus.SUCCESS


def as_action(value: Any) -> TransactionAction:
    """A TransactionAction from itself, an enum with the same member names, or a string
    (``COMMIT_MESSAGE`` / ``ROLLBACK_MESSAGE`` / ``UNKNOW`` as RocketMQ's LocalTransactionState)."""
    if isinstance(value, TransactionAction):
        return value
    name = str(getattr(value, "name", None) or value).upper()
    name = {"COMMIT_MESSAGE": "COMMIT", "ROLLBACK_MESSAGE": "ROLLBACK", "UNKNOW": "UNKNOWN"}.get(
        name, name
    )
    try:
        return TransactionAction[name]
    except KeyError:
        raise MessageIllegalError(
            f"transaction action {value!r} is not COMMIT, ROLLBACK or UNKNOWN"
        ) from None
