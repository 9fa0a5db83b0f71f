"""The one fault table (``broker/codes.py``): each fault's RocketMQ code (MessagingService) and
gRPC status (connector service) come from the same row, and the connector names an RmqError's
class in its ``rmq-error`` trailer (what its client re-raises)."""

from __future__ import annotations

import grpc
import pytest

from rmq_spark.broker import codes
from rmq_spark.broker.codes import Code, RpcStatusError
from rmq_spark.errors import (
    AuthenticationError,
    ConfigError,
    CorruptStoreError,
    FilterExpressionError,
    IllegalGroupError,
    IllegalTopicError,
    MessageIllegalError,
    PermissionDeniedError,
    RmqError,
    StoreError,
)

SC = grpc.StatusCode


@pytest.mark.parametrize(
    ("exc", "code", "grpc_status", "trailer"),
    [
        (
            AuthenticationError("not signed"),
            Code.UNAUTHORIZED,
            SC.UNAUTHENTICATED,
            "AuthenticationError",
        ),
        (
            PermissionDeniedError("may not"),
            Code.FORBIDDEN,
            SC.PERMISSION_DENIED,
            "PermissionDeniedError",
        ),
        (IllegalTopicError("../x"), Code.ILLEGAL_TOPIC, SC.INVALID_ARGUMENT, "IllegalTopicError"),
        (
            IllegalGroupError("../x"),
            Code.ILLEGAL_CONSUMER_GROUP,
            SC.INVALID_ARGUMENT,
            "IllegalGroupError",
        ),
        (
            FilterExpressionError("bad tag"),
            Code.ILLEGAL_FILTER_EXPRESSION,
            SC.INVALID_ARGUMENT,
            "FilterExpressionError",
        ),
        (
            MessageIllegalError("too big"),
            Code.BAD_REQUEST,
            SC.INVALID_ARGUMENT,
            "MessageIllegalError",
        ),
        (ConfigError("unknown option"), Code.BAD_REQUEST, SC.INVALID_ARGUMENT, "ConfigError"),
        (
            CorruptStoreError("bad record", "f", 7),
            Code.INTERNAL_SERVER_ERROR,
            SC.DATA_LOSS,
            "CorruptStoreError",
        ),
        (StoreError("shut down"), Code.INTERNAL_SERVER_ERROR, SC.FAILED_PRECONDITION, "StoreError"),
        (RmqError("other"), Code.INTERNAL_SERVER_ERROR, SC.INTERNAL, "RmqError"),
        (ValueError("malformed"), Code.BAD_REQUEST, SC.INVALID_ARGUMENT, None),
        (UnicodeError("bad text"), Code.BAD_REQUEST, SC.INVALID_ARGUMENT, None),
        (TypeError("missing field"), Code.BAD_REQUEST, SC.INTERNAL, None),
        (OverflowError("too large"), Code.BAD_REQUEST, SC.INTERNAL, None),
        (KeyError("query_id"), Code.INTERNAL_SERVER_ERROR, SC.INTERNAL, None),
    ],
)
def test_each_fault_maps_to_one_row_for_both_services(exc, code, grpc_status, trailer):
    assert codes.status_of(exc).code == code
    status, name, detail = codes.connector_fault(exc)
    assert (status, name) == (grpc_status, trailer)
    if isinstance(exc, (RmqError, ValueError)):
        assert detail == str(exc)
    else:
        assert detail == f"{type(exc).__name__}: {exc}"


def test_rpc_status_error_keeps_its_code_on_the_messaging_service():
    exc = RpcStatusError(Code.TOPIC_NOT_FOUND, "no route")
    assert (codes.status_of(exc).code, codes.status_of(exc).message) == (
        Code.TOPIC_NOT_FOUND,
        "no route",
    )
    assert codes.connector_fault(exc)[:2] == (SC.INTERNAL, "RpcStatusError")


def test_code_and_message_type_spell_out_every_enum_value():
    """``Code`` and ``MessageType`` name each value of their protobuf enum, as the same int: a
    value added to the protocol (or one mistyped here) fails this test, not a request."""
    from rocketmq.grpc_protocol import definition_pb2 as D

    from rmq_spark.broker.messages import MessageType

    for ours, enum in ((Code, D.Code), (MessageType, D.MessageType)):
        spelled = {k: v for k, v in vars(ours).items() if k.isupper()}
        assert spelled == {name: int(value) for name, value in enum.items()}
        assert all(type(v) is int for v in spelled.values())  # plain ints, for the hot path
    assert Code.Name(Code.OK) == "OK"
