"""The Spark data source ``rmq``: RocketMQ topics as a streaming and batch source and sink.

``format("rmq")`` is found by pyspark without registration (the top-level module
``pyspark_rmq`` exports :class:`RmqDataSource` as ``DefaultSource``); :func:`register` registers
it explicitly in a session.  The options are documented on :class:`RmqDataSource`.

Importing this package does not import pyspark (the broker uses some of its modules): the data
source class is loaded on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RmqDataSource", "register"]


def register(spark: Any) -> None:
    """Register ``format("rmq")`` in ``spark`` (a SparkSession)."""
    from rmq_spark.datasource.source import RmqDataSource

    spark.dataSource.register(RmqDataSource)


def __getattr__(name: str) -> Any:
    if name == "RmqDataSource":
        from rmq_spark.datasource.source import RmqDataSource

        return RmqDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
