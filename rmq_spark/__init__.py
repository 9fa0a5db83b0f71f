"""rmq_spark: a RocketMQ-style message store and broker in Python, readable from PySpark as ``rmq``."""

from __future__ import annotations

import importlib
from typing import Any

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

# heavy parts (grpc, pyspark) load on first use: ``rmq_spark.Broker``, ``rmq_spark.register(spark)``
_LAZY = {
    "Broker": ("rmq_spark.broker.server", "Broker"),
    "register": ("rmq_spark.datasource", "register"),
    "BrokerCore": ("rmq_spark.services.core", "BrokerCore"),
    "BrokerConfig": ("rmq_spark.services.core", "BrokerConfig"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rmq_spark' has no attribute {name!r}")


__all__ = [
    "Broker",
    "BrokerConfig",
    "BrokerCore",
    "ConfigError",
    "CorruptStoreError",
    "FilterExpressionError",
    "MessageIllegalError",
    "RmqError",
    "StoreError",
    "StoreLockedError",
    "__version__",
    "register",
]
