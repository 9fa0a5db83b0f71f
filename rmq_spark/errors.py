"""The exception tree of rmq_spark.

Every fault the project raises derives from :class:`RmqError`.  Expected outcomes of normal
operations (a put that found the queue full, a read past the end) are status enums instead;
see ``rmq_spark.store.status``.
"""

from __future__ import annotations

__all__ = [
    "RmqError",
    "ConfigError",
    "MessageIllegalError",
    "StoreError",
    "CorruptStoreError",
    "StoreLockedError",
    "FilterExpressionError",
]


class RmqError(Exception):
    """Root of every error raised by rmq_spark."""


class ConfigError(RmqError, ValueError):
    """An option, flag or configuration value is unknown, missing or invalid."""


class MessageIllegalError(RmqError, ValueError):
    """A message breaks a rule (topic name, body size, properties size, batch rules)."""


class StoreError(RmqError):
    """The store cannot do what was asked (I/O failure, store shut down, ...)."""


class CorruptStoreError(StoreError):
    """A store file holds bytes that are not a valid record; names the file and position."""

    def __init__(self, message: str, path: str = "", position: int = -1) -> None:
        super().__init__(message)
        self.path = path
        self.position = position


class StoreLockedError(StoreError):
    """Another process owns the store directory."""


class FilterExpressionError(RmqError, ValueError):
    """A tag or SQL92 filter expression cannot be parsed."""
