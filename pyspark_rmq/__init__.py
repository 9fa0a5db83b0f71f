"""Makes ``format("rmq")`` available in every SparkSession where this package is importable:
pyspark looks for top-level ``pyspark_*`` modules that export a ``DefaultSource``."""

from __future__ import annotations

from rmq_spark.datasource.source import RmqDataSource as DefaultSource

__all__ = ["DefaultSource"]
