"""The Spark data source ``rmq``: RocketMQ topics as a streaming and batch source and sink.

``format("rmq")`` is found by pyspark without registration (the top-level module
``pyspark_rmq`` exports :class:`RmqDataSource` as ``DefaultSource``); :func:`register` registers
it explicitly in a session.  The options are documented on :class:`RmqDataSource`.

Importing this package does not import pyspark (the broker uses some of its modules): the data
source class is loaded on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "RmqDataSource",
    "activate_session_on_write",
    "refuse_limited_available_now",
    "register",
]


def register(spark: Any) -> None:
    """Register ``format("rmq")`` in ``spark`` (a SparkSession), for writes from any Python
    thread too (:func:`activate_session_on_write`)."""
    from rmq_spark.datasource.source import RmqDataSource

    try:
        spark.dataSource.register(RmqDataSource)
    except Exception as e:
        # pyspark 4.0 refuses to register a name its discovery found (pyspark_rmq): the same class
        condition = getattr(e, "getCondition", None)
        if condition is None or condition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise
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
    pyspark; a Spark Connect session needs nothing), and refuse a stream that the release cannot
    run as asked (:func:`refuse_limited_available_now`).  Idempotent."""
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
                refuse_limited_available_now(self)
                _activate(getattr(self, "_spark", None))
                return __original(self, *args, **kwargs)

            method._rmq_activates_session = True  # type: ignore[attr-defined]  # noqa: SLF001 - our own marker on pyspark's method
            setattr(cls, name, method)
    _record_available_now()


def _record_available_now() -> None:
    """``DataStreamWriter.trigger`` remembers on the writer whether it asked for AvailableNow
    (classic pyspark keeps the trigger in the JVM only)."""
    import functools

    from pyspark.sql.streaming.readwriter import DataStreamWriter

    original = DataStreamWriter.trigger
    if getattr(original, "_rmq_records_available_now", False):
        return

    @functools.wraps(original)
    def trigger(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._rmq_available_now = bool(kwargs.get("availableNow"))
        return original(self, *args, **kwargs)

    trigger._rmq_records_available_now = True  # type: ignore[attr-defined]  # noqa: SLF001 - our own marker on pyspark's method
    DataStreamWriter.trigger = trigger  # type: ignore[method-assign]


def refuse_limited_available_now(writer: Any) -> None:
    """Refuse a ``Trigger.AvailableNow`` stream that reads format rmq with ``maxOffsetsPerTrigger``
    or ``minOffsetsPerTrigger`` on a pyspark release without admission control of Python data
    sources (4.0, 4.1): it would run one limited batch and end with messages unread.  Looks at the
    writer's analyzed plan (classic pyspark); anything else passes."""
    if not getattr(writer, "_rmq_available_now", False):
        return
    from rmq_spark.datasource.releases import ADMISSION_CONTROL, AVAILABLE_NOW_REFUSED
    from rmq_spark.errors import ConfigError

    jdf = getattr(getattr(writer, "_df", None), "_jdf", None)
    if ADMISSION_CONTROL or jdf is None:
        return
    leaves = jdf.queryExecution().analyzed().collectLeaves().iterator()
    while leaves.hasNext():
        leaf = leaves.next()
        if leaf.nodeName() != "StreamingRelationV2" or leaf.sourceName() != "rmq":
            continue
        options = leaf.extraOptions()
        if options.containsKey("maxOffsetsPerTrigger") or options.containsKey(
            "minOffsetsPerTrigger"
        ):
            raise ConfigError(AVAILABLE_NOW_REFUSED)


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
