"""The one module that turns outcomes and faults into status codes, for both gRPC services.

Expected outcomes (store :class:`PutStatus` / :class:`GetStatus`, pop :class:`AckOutcome`, ...)
map through tables; faults (the :class:`rmq_spark.errors.RmqError` tree, and anything a hostile
request can make the decoding raise) map through ONE table, :data:`FAULT_CODES`, with a column
per service: :func:`status_of` reads RocketMQ's ``Code`` for the MessagingService (every handler
answers with ``status(code, message)`` and never lets an exception escape), and
:func:`connector_fault` reads the gRPC status the private connector service aborts with (and
names the RmqError class in its ``rmq-error`` trailer, so its client re-raises that class).

===============================  ===========================  ===================  =================
fault                            RocketMQ code                connector status     client sees
===============================  ===========================  ===================  =================
RpcStatusError(code)             that code                    INTERNAL             as the code says
AuthenticationError              UNAUTHORIZED                 UNAUTHENTICATED      Unauthorized
PermissionDeniedError            FORBIDDEN                    PERMISSION_DENIED    Forbidden
IllegalTopicError                ILLEGAL_TOPIC                INVALID_ARGUMENT     BadRequest
IllegalGroupError                ILLEGAL_CONSUMER_GROUP       INVALID_ARGUMENT     BadRequest
FilterExpressionError            ILLEGAL_FILTER_EXPRESSION    INVALID_ARGUMENT     BadRequest
MessageIllegalError              BAD_REQUEST                  INVALID_ARGUMENT     BadRequest
ConfigError                      BAD_REQUEST                  INVALID_ARGUMENT     BadRequest
DiskFullError                    INTERNAL_SERVER_ERROR        RESOURCE_EXHAUSTED   InternalError
CorruptStoreError                INTERNAL_SERVER_ERROR        DATA_LOSS            InternalError
StoreError                       INTERNAL_SERVER_ERROR        FAILED_PRECONDITION  InternalError
RmqError                         INTERNAL_SERVER_ERROR        INTERNAL             InternalError
ValueError, UnicodeError         BAD_REQUEST                  INVALID_ARGUMENT     BadRequest
TypeError, OverflowError         BAD_REQUEST                  INTERNAL             BadRequest
anything else                    INTERNAL_SERVER_ERROR        INTERNAL             InternalError
===============================  ===========================  ===================  =================

Transaction ends (:class:`EndTxStatus`) map in :func:`transaction_code`, recall failures
(:class:`RecallFailure`) in :func:`recall_code`.
"""

from __future__ import annotations

import enum
import logging
import traceback
from typing import NamedTuple

import grpc
from rocketmq.grpc_protocol import definition_pb2 as D

from rmq_spark.errors import (
    AuthenticationError,
    ConfigError,
    CorruptStoreError,
    DiskFullError,
    FilterExpressionError,
    IllegalGroupError,
    IllegalTopicError,
    MessageIllegalError,
    PermissionDeniedError,
    RmqError,
    StoreError,
)
from rmq_spark.services.timer.recall import RecallFailure
from rmq_spark.services.transaction.service import EndTxStatus
from rmq_spark.store.status import GetStatus, PutStatus

__all__ = [
    "FAULT_CODES",
    "AckOutcome",
    "Code",
    "RpcStatusError",
    "ack_code",
    "combined_code",
    "connector_fault",
    "get_code",
    "ok",
    "put_code",
    "recall_code",
    "status",
    "status_of",
    "transaction_code",
]

log = logging.getLogger("rmq_spark.broker")


class Code:
    """``apache.rocketmq.v2.Code`` as plain int attributes (protobuf's enum wrapper is slow on a
    hot path), plus ``Code.Name(value)``: every value of the enum, spelled out so that a type
    checker knows each name (tests/broker/test_broker_codes.py holds the list to the enum)."""

    Name = staticmethod(D.Code.Name)

    CODE_UNSPECIFIED = D.Code.CODE_UNSPECIFIED
    OK = D.Code.OK
    MULTIPLE_RESULTS = D.Code.MULTIPLE_RESULTS
    BAD_REQUEST = D.Code.BAD_REQUEST
    ILLEGAL_ACCESS_POINT = D.Code.ILLEGAL_ACCESS_POINT
    ILLEGAL_TOPIC = D.Code.ILLEGAL_TOPIC
    ILLEGAL_CONSUMER_GROUP = D.Code.ILLEGAL_CONSUMER_GROUP
    ILLEGAL_MESSAGE_TAG = D.Code.ILLEGAL_MESSAGE_TAG
    ILLEGAL_MESSAGE_KEY = D.Code.ILLEGAL_MESSAGE_KEY
    ILLEGAL_MESSAGE_GROUP = D.Code.ILLEGAL_MESSAGE_GROUP
    ILLEGAL_MESSAGE_PROPERTY_KEY = D.Code.ILLEGAL_MESSAGE_PROPERTY_KEY
    INVALID_TRANSACTION_ID = D.Code.INVALID_TRANSACTION_ID
    ILLEGAL_MESSAGE_ID = D.Code.ILLEGAL_MESSAGE_ID
    ILLEGAL_FILTER_EXPRESSION = D.Code.ILLEGAL_FILTER_EXPRESSION
    ILLEGAL_INVISIBLE_TIME = D.Code.ILLEGAL_INVISIBLE_TIME
    ILLEGAL_DELIVERY_TIME = D.Code.ILLEGAL_DELIVERY_TIME
    INVALID_RECEIPT_HANDLE = D.Code.INVALID_RECEIPT_HANDLE
    MESSAGE_PROPERTY_CONFLICT_WITH_TYPE = D.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    UNRECOGNIZED_CLIENT_TYPE = D.Code.UNRECOGNIZED_CLIENT_TYPE
    MESSAGE_CORRUPTED = D.Code.MESSAGE_CORRUPTED
    CLIENT_ID_REQUIRED = D.Code.CLIENT_ID_REQUIRED
    ILLEGAL_POLLING_TIME = D.Code.ILLEGAL_POLLING_TIME
    ILLEGAL_OFFSET = D.Code.ILLEGAL_OFFSET
    ILLEGAL_LITE_TOPIC = D.Code.ILLEGAL_LITE_TOPIC
    UNAUTHORIZED = D.Code.UNAUTHORIZED
    PAYMENT_REQUIRED = D.Code.PAYMENT_REQUIRED
    FORBIDDEN = D.Code.FORBIDDEN
    NOT_FOUND = D.Code.NOT_FOUND
    MESSAGE_NOT_FOUND = D.Code.MESSAGE_NOT_FOUND
    TOPIC_NOT_FOUND = D.Code.TOPIC_NOT_FOUND
    CONSUMER_GROUP_NOT_FOUND = D.Code.CONSUMER_GROUP_NOT_FOUND
    OFFSET_NOT_FOUND = D.Code.OFFSET_NOT_FOUND
    REQUEST_TIMEOUT = D.Code.REQUEST_TIMEOUT
    PAYLOAD_TOO_LARGE = D.Code.PAYLOAD_TOO_LARGE
    MESSAGE_BODY_TOO_LARGE = D.Code.MESSAGE_BODY_TOO_LARGE
    MESSAGE_BODY_EMPTY = D.Code.MESSAGE_BODY_EMPTY
    PRECONDITION_FAILED = D.Code.PRECONDITION_FAILED
    TOO_MANY_REQUESTS = D.Code.TOO_MANY_REQUESTS
    LITE_TOPIC_QUOTA_EXCEEDED = D.Code.LITE_TOPIC_QUOTA_EXCEEDED
    LITE_SUBSCRIPTION_QUOTA_EXCEEDED = D.Code.LITE_SUBSCRIPTION_QUOTA_EXCEEDED
    REQUEST_HEADER_FIELDS_TOO_LARGE = D.Code.REQUEST_HEADER_FIELDS_TOO_LARGE
    MESSAGE_PROPERTIES_TOO_LARGE = D.Code.MESSAGE_PROPERTIES_TOO_LARGE
    INTERNAL_ERROR = D.Code.INTERNAL_ERROR
    INTERNAL_SERVER_ERROR = D.Code.INTERNAL_SERVER_ERROR
    HA_NOT_AVAILABLE = D.Code.HA_NOT_AVAILABLE
    NOT_IMPLEMENTED = D.Code.NOT_IMPLEMENTED
    PROXY_TIMEOUT = D.Code.PROXY_TIMEOUT
    MASTER_PERSISTENCE_TIMEOUT = D.Code.MASTER_PERSISTENCE_TIMEOUT
    SLAVE_PERSISTENCE_TIMEOUT = D.Code.SLAVE_PERSISTENCE_TIMEOUT
    UNSUPPORTED = D.Code.UNSUPPORTED
    VERSION_UNSUPPORTED = D.Code.VERSION_UNSUPPORTED
    VERIFY_FIFO_MESSAGE_UNSUPPORTED = D.Code.VERIFY_FIFO_MESSAGE_UNSUPPORTED
    FAILED_TO_CONSUME_MESSAGE = D.Code.FAILED_TO_CONSUME_MESSAGE


class RpcStatusError(RmqError):
    """A request that must be answered with a specific RocketMQ status code (raised inside the
    broker's handlers and turned into the status of the response at the seam)."""

    def __init__(self, code: D.Code.ValueType, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class AckOutcome(enum.Enum):
    """What an ack / change-invisible-duration / forward-to-DLQ found for a receipt handle."""

    OK = "OK"
    INVALID_HANDLE = "INVALID_HANDLE"  # malformed, unknown, or superseded by a newer handle
    EXPIRED = "EXPIRED"  # the invisible time has passed: the message is being redelivered


_ACK_CODES = {
    AckOutcome.OK: (Code.OK, "OK"),
    AckOutcome.INVALID_HANDLE: (Code.INVALID_RECEIPT_HANDLE, "receipt handle is invalid or stale"),
    AckOutcome.EXPIRED: (Code.INVALID_RECEIPT_HANDLE, "receipt handle is expired"),
}

_PUT_CODES = {
    PutStatus.PUT_OK: Code.OK,
    PutStatus.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    PutStatus.SERVICE_NOT_AVAILABLE: Code.INTERNAL_SERVER_ERROR,
    PutStatus.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: Code.MESSAGE_PROPERTIES_TOO_LARGE,
    PutStatus.WHEEL_TIMER_MSG_ILLEGAL: Code.ILLEGAL_DELIVERY_TIME,
    PutStatus.UNKNOWN_ERROR: Code.INTERNAL_SERVER_ERROR,
}

_GET_CODES = {
    GetStatus.FOUND: Code.OK,
    GetStatus.NO_MATCHED_MESSAGE: Code.MESSAGE_NOT_FOUND,
    GetStatus.NO_MESSAGE_IN_QUEUE: Code.MESSAGE_NOT_FOUND,
    GetStatus.OFFSET_OVERFLOW_ONE: Code.MESSAGE_NOT_FOUND,
    GetStatus.NO_MATCHED_LOGIC_QUEUE: Code.MESSAGE_NOT_FOUND,
    GetStatus.OFFSET_TOO_SMALL: Code.ILLEGAL_OFFSET,
    GetStatus.OFFSET_OVERFLOW_BADLY: Code.ILLEGAL_OFFSET,
}


class FaultCode(NamedTuple):
    fault: type[BaseException]
    code: D.Code.ValueType  # RocketMQ's Code, answered by the MessagingService
    grpc_status: grpc.StatusCode  # what the connector service aborts with


_SC = grpc.StatusCode
# order matters: the first class an exception is an instance of wins
FAULT_CODES: tuple[FaultCode, ...] = (
    FaultCode(AuthenticationError, Code.UNAUTHORIZED, _SC.UNAUTHENTICATED),
    FaultCode(PermissionDeniedError, Code.FORBIDDEN, _SC.PERMISSION_DENIED),
    FaultCode(IllegalTopicError, Code.ILLEGAL_TOPIC, _SC.INVALID_ARGUMENT),
    FaultCode(IllegalGroupError, Code.ILLEGAL_CONSUMER_GROUP, _SC.INVALID_ARGUMENT),
    FaultCode(FilterExpressionError, Code.ILLEGAL_FILTER_EXPRESSION, _SC.INVALID_ARGUMENT),
    FaultCode(MessageIllegalError, Code.BAD_REQUEST, _SC.INVALID_ARGUMENT),
    FaultCode(ConfigError, Code.BAD_REQUEST, _SC.INVALID_ARGUMENT),
    # RocketMQ answers SERVICE_NOT_AVAILABLE when its disk is full; the gRPC protocol has no
    # such code: INTERNAL_SERVER_ERROR, the message saying the disk is full
    FaultCode(DiskFullError, Code.INTERNAL_SERVER_ERROR, _SC.RESOURCE_EXHAUSTED),
    FaultCode(CorruptStoreError, Code.INTERNAL_SERVER_ERROR, _SC.DATA_LOSS),
    FaultCode(StoreError, Code.INTERNAL_SERVER_ERROR, _SC.FAILED_PRECONDITION),
    FaultCode(RmqError, Code.INTERNAL_SERVER_ERROR, _SC.INTERNAL),
    # what decoding a malformed or hostile request raises
    FaultCode(UnicodeError, Code.BAD_REQUEST, _SC.INVALID_ARGUMENT),
    FaultCode(ValueError, Code.BAD_REQUEST, _SC.INVALID_ARGUMENT),
    FaultCode(TypeError, Code.BAD_REQUEST, _SC.INTERNAL),
    FaultCode(OverflowError, Code.BAD_REQUEST, _SC.INTERNAL),
)


def _fault_code(exc: BaseException) -> FaultCode | None:
    for row in FAULT_CODES:
        if isinstance(exc, row.fault):
            return row
    return None


def status(code: D.Code.ValueType = Code.OK, message: str = "OK") -> D.Status:
    """A Status; the message is never empty (clients log it)."""
    return D.Status(code=code, message=message or Code.Name(code))


_OK = D.Status(code=Code.OK, message="OK")


def ok() -> D.Status:
    """The OK status (one shared instance: assign it, never mutate it)."""
    return _OK


def status_of(exc: BaseException) -> D.Status:
    """The status a handler answers with when ``exc`` escaped from it."""
    if isinstance(exc, RpcStatusError):
        return status(exc.code, exc.message)
    row = _fault_code(exc)
    if row is not None:
        if isinstance(exc, DiskFullError):  # an operational fault, named in its message
            log.warning("refused: %s", exc)
        elif row.code == Code.INTERNAL_SERVER_ERROR:
            log.error("internal error: %s", exc, exc_info=exc)
        return status(row.code, str(exc) or type(exc).__name__)
    log.error("internal error: %r", exc, exc_info=exc)
    return status(Code.INTERNAL_SERVER_ERROR, f"internal error: {type(exc).__name__}: {exc}")


def connector_fault(exc: BaseException) -> tuple[grpc.StatusCode, str | None, str]:
    """How the connector service aborts a call ``exc`` escaped from: (gRPC status, the RmqError
    class name for the ``rmq-error`` trailer or ``None``, the details)."""
    row = _fault_code(exc)
    code = row.grpc_status if row is not None else grpc.StatusCode.INTERNAL
    name = type(exc).__name__ if isinstance(exc, RmqError) else None
    if isinstance(exc, (RmqError, ValueError)):
        detail = str(exc)
    else:
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return code, name, detail


def put_code(put_status: PutStatus) -> D.Code.ValueType:
    return _PUT_CODES.get(put_status, Code.INTERNAL_SERVER_ERROR)


def get_code(get_status: GetStatus) -> D.Code.ValueType:
    return _GET_CODES.get(get_status, Code.INTERNAL_SERVER_ERROR)


def ack_code(outcome: AckOutcome) -> tuple[D.Code.ValueType, str]:
    return _ACK_CODES[outcome]


def combined_code(codes: list[D.Code.ValueType]) -> D.Code.ValueType:
    """The top-level code of a multi-entry answer: the common code, or MULTIPLE_RESULTS."""
    if not codes:
        return Code.OK
    first = codes[0]
    return first if all(c == first for c in codes) else Code.MULTIPLE_RESULTS


def transaction_code(outcome: EndTxStatus, commit: bool) -> tuple[D.Code.ValueType, str]:
    """The code for what ``TransactionService.end_transaction`` answered.  Ending a transaction
    the same way twice is OK (a client retry, or the check-back and the client both answering)."""
    if outcome is EndTxStatus.SUCCESS or outcome is EndTxStatus.NOT_HANDLED:
        # UNKNOWN is a valid answer (as in RocketMQ): the half stays for the check-back
        return Code.OK, "OK"
    if outcome is EndTxStatus.ALREADY_COMMITTED:
        return (
            (Code.OK, "OK")
            if commit
            else (Code.BAD_REQUEST, "the transaction was already committed")
        )
    if outcome is EndTxStatus.ALREADY_ROLLED_BACK:
        return (
            (Code.OK, "OK")
            if not commit
            else (Code.BAD_REQUEST, "the transaction was already rolled back")
        )
    return _TXN_CODES.get(
        outcome, (Code.INTERNAL_SERVER_ERROR, f"ending the transaction failed: {outcome.value}")
    )


_TXN_CODES = {
    EndTxStatus.NOT_FOUND: (Code.INVALID_TRANSACTION_ID, "no half message for this transaction"),
    EndTxStatus.PRODUCER_GROUP_MISMATCH: (
        Code.INVALID_TRANSACTION_ID,
        "the half message belongs to another producer group",
    ),
    EndTxStatus.QUEUE_OFFSET_MISMATCH: (
        Code.INVALID_TRANSACTION_ID,
        "the half message is not at that queue offset",
    ),
    EndTxStatus.TRANSACTION_ID_MISMATCH: (
        Code.INVALID_TRANSACTION_ID,
        "the half message has another transaction id",
    ),
    EndTxStatus.ILLEGAL_OPERATION: (
        Code.BAD_REQUEST,
        "too late: past its check immunity time, the check-back decides",
    ),
    EndTxStatus.EXPIRED: (
        Code.INVALID_TRANSACTION_ID,
        "the half message is older than the store keeps transactions",
    ),
    EndTxStatus.ALREADY_RESOLVED: (Code.BAD_REQUEST, "the transaction was already ended"),
    EndTxStatus.CONFLICT: (Code.BAD_REQUEST, "the transaction conflicts with one already ended"),
    EndTxStatus.IN_PROGRESS: (
        Code.TOO_MANY_REQUESTS,
        "another end of this transaction is being written; retry",
    ),
    EndTxStatus.FLUSH_DISK_TIMEOUT: (Code.MASTER_PERSISTENCE_TIMEOUT, "ended, but not yet durable"),
}


_RECALL_CODES = {
    RecallFailure.INVALID_HANDLE: Code.BAD_REQUEST,
    RecallFailure.TOPIC_MISMATCH: Code.BAD_REQUEST,
    RecallFailure.BROKER_MISMATCH: Code.BAD_REQUEST,
    RecallFailure.TIMESTAMP_INVALID: Code.BAD_REQUEST,
    RecallFailure.NOT_FOUND: Code.NOT_FOUND,  # not MESSAGE_NOT_FOUND: the Python client takes that as success
}


def recall_code(reason: RecallFailure) -> D.Code.ValueType:
    return _RECALL_CODES.get(reason, Code.INTERNAL_SERVER_ERROR)
