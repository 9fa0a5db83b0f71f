"""rmq_spark: a RocketMQ-style message store and broker in Python, readable from PySpark as ``rmq``."""

from __future__ import annotations

from rmq_spark.errors import (
    ConfigError,
    CorruptStoreError,
    FilterExpressionError,
    MessageIllegalError,
    RmqError,
    StoreError,
    StoreLockedError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "CorruptStoreError",
    "FilterExpressionError",
    "MessageIllegalError",
    "RmqError",
    "StoreError",
    "StoreLockedError",
    "__version__",
]
