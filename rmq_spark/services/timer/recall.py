"""Recall handles of timer messages (RocketMQ 5's RecallMessage): built when a timer message
is stored, parsed when a producer recalls it."""

from __future__ import annotations

import base64
import binascii
import enum
from dataclasses import dataclass

from rmq_spark.errors import RmqError

__all__ = [
    "HANDLE_VERSION",
    "RecallError",
    "RecallFailure",
    "RecallHandle",
    "build_recall_handle",
    "parse_recall_handle",
]

HANDLE_VERSION = "v1"


# --- recall handles -------------------------------------------------------------------------------
class RecallFailure(enum.Enum):
    INVALID_HANDLE = "INVALID_HANDLE"
    TOPIC_MISMATCH = "TOPIC_MISMATCH"
    BROKER_MISMATCH = "BROKER_MISMATCH"
    TIMESTAMP_INVALID = "TIMESTAMP_INVALID"  # already due (so delivered) or too far ahead
    NOT_FOUND = "NOT_FOUND"  # nothing pending under this handle: delivered, recalled or never sent


class RecallError(RmqError, ValueError):
    """A recall that cannot be done; ``reason`` says why."""

    def __init__(self, reason: RecallFailure, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class RecallHandle:
    topic: str
    broker_name: str
    timestamp_ms: int  # TIMER_OUT_MS + 1 of the message
    message_id: str  # its UNIQ_KEY


def build_recall_handle(topic: str, broker_name: str, timestamp_ms: int, message_id: str) -> str:
    """``RecallMessageHandle.HandleV1.buildHandle``: URL-safe Base64 (padded) of the five fields."""
    raw = " ".join((HANDLE_VERSION, topic, broker_name, str(timestamp_ms), message_id))
    return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii")


def parse_recall_handle(handle: str) -> RecallHandle:
    """Decode a handle (padded or not); :class:`RecallError` INVALID_HANDLE when it is not one."""
    if not handle or not isinstance(handle, str):
        raise RecallError(RecallFailure.INVALID_HANDLE, "recall handle is empty")
    try:
        text = handle.strip()
        raw = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True).decode(
            "utf-8"
        )
    except (binascii.Error, ValueError):
        raise RecallError(
            RecallFailure.INVALID_HANDLE, "recall handle is not URL-safe Base64"
        ) from None
    items = raw.split(" ")
    if len(items) < 5 or items[0] != HANDLE_VERSION:
        raise RecallError(
            RecallFailure.INVALID_HANDLE, f"recall handle is not a {HANDLE_VERSION} handle"
        )
    if not items[3].lstrip("-").isdigit():
        raise RecallError(
            RecallFailure.INVALID_HANDLE, f"recall handle timestamp {items[3]!r} is not a number"
        )
    return RecallHandle(items[1], items[2], int(items[3]), items[4])
