"""The Spark data source ``rmq``: RocketMQ topics as a streaming and batch source and sink.

``format("rmq")`` is found by pyspark without registration (the top-level module
``pyspark_rmq`` exports :class:`RmqDataSource` as ``DefaultSource``); :func:`register` registers
it explicitly in a session.  The options are documented on :class:`RmqDataSource`.

Importing this package does not import pyspark (the broker uses some of its modules): the data
source class is loaded on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RmqDataSource", "activate_session_on_write", "register"]


def register(spark: Any) -> None:
    """Register ``format("rmq")`` in ``spark`` (a SparkSession), for writes from any Python
    thread too (:func:`activate_session_on_write`)."""
    from rmq_spark.datasource.source import RmqDataSource

    spark.dataSource.register(RmqDataSource)
    activate_session_on_write()


# Spark looks the format of a write (DataFrameWriter.save, DataStreamWriter.start) up in the JVM
# thread's *active* session (DataSource.lookupDataSource: SparkSession.getActiveSession), not in
# the session of the DataFrame; the JVM thread that serves a new Python thread (pyspark's pinned
# thread mode) has none, so a Python data source -- registered or found as ``pyspark_rmq`` -- is
# DATA_SOURCE_NOT_FOUND there.  A read looks in its own session and works.  pyspark itself makes
# a session active in its thread when it creates a DataFrame; these methods do the same first.
_WRITE_METHODS = (
    ("pyspark.sql.readwriter", "DataFrameWriter", ("save", "saveAsTable", "insertInto")),
    ("pyspark.sql.streaming.readwriter", "DataStreamWriter", ("start", "toTable")),
)


def activate_session_on_write() -> None:
    """Make the writer's session the active one of its JVM thread when a write starts (classic
    pyspark; a Spark Connect session needs nothing).  Idempotent."""
    import functools
    import importlib

    for module_name, class_name, methods in _WRITE_METHODS:
        cls = getattr(importlib.import_module(module_name), class_name, None)
        for name in methods:
            original = getattr(cls, name, None)
            if original is None or getattr(original, "_rmq_activates_session", False):
                continue

            @functools.wraps(original)
            def method(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
                _activate(getattr(self, "_spark", None))
                return __original(self, *args, **kwargs)

            method._rmq_activates_session = True  # type: ignore[attr-defined]  # noqa: SLF001 - our own marker on pyspark's method
            setattr(cls, name, method)


def _activate(spark: Any) -> None:
    jsession = getattr(spark, "_jsparkSession", None)
    jvm = getattr(spark, "_jvm", None)
    if jsession is None or jvm is None:
        return
    from pyspark.sql import SparkSession

    SparkSession._get_j_spark_session_class(jvm).setActiveSession(jsession)  # noqa: SLF001 - pyspark has no public way to set the JVM's active session


def __getattr__(name: str) -> Any:
    if name == "RmqDataSource":
        from rmq_spark.datasource.source import RmqDataSource

        return RmqDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
