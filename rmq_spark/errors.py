"""The exception tree of rmq_spark.

Every fault the project raises derives from :class:`RmqError`.  Expected outcomes of normal
operations (a put that found the queue full, a read past the end) are status enums instead;
see ``rmq_spark.store.status``.
"""

from __future__ import annotations

__all__ = [
    "AccessDeniedError",
    "AuthenticationError",
    "ConfigError",
    "CorruptStoreError",
    "DiskFullError",
    "FilterExpressionError",
    "IllegalGroupError",
    "IllegalTopicError",
    "MessageIllegalError",
    "PermissionDeniedError",
    "RmqError",
    "StoreError",
    "StoreLockedError",
]


class RmqError(Exception):
    """Root of every error raised by rmq_spark."""


class ConfigError(RmqError, ValueError):
    """An option, flag or configuration value is unknown, missing or invalid."""


class MessageIllegalError(RmqError, ValueError):
    """A message breaks a rule (topic name, body size, properties size, batch rules)."""


class IllegalTopicError(MessageIllegalError):
    """A topic name a client may not use here: malformed, too long, a system topic, or a retry /
    dead-letter topic given to a producer (RocketMQ's ILLEGAL_TOPIC)."""


class IllegalGroupError(MessageIllegalError):
    """A consumer group name that is malformed or too long (RocketMQ's ILLEGAL_CONSUMER_GROUP)."""


class AccessDeniedError(RmqError):
    """The broker's access control refused a request."""


class AuthenticationError(AccessDeniedError):
    """The request is not signed by a known account: no or malformed ``authorization`` header,
    unknown access key, wrong signature, or a signed date outside the broker's window
    (RocketMQ's UNAUTHORIZED)."""


class PermissionDeniedError(AccessDeniedError):
    """The signing account lacks the permission the request needs (RocketMQ's FORBIDDEN)."""


class StoreError(RmqError):
    """The store cannot do what was asked (I/O failure, store shut down, ...)."""


class CorruptStoreError(StoreError):
    """A store file holds bytes that are not a valid record; names the file and position."""

    def __init__(self, message: str, path: str = "", position: int = -1) -> None:
        super().__init__(message)
        self.path = path
        self.position = position


class DiskFullError(StoreError):
    """The store's filesystem has no space left (ENOSPC, EDQUOT) for a write; names the file.
    Nothing was changed: the write fails, reads go on (RocketMQ answers SERVICE_NOT_AVAILABLE
    when its disk is full)."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class StoreLockedError(StoreError):
    """Another process owns the store directory."""


class FilterExpressionError(RmqError, ValueError):
    """A tag or SQL92 filter expression cannot be parsed."""
