"""What the installed pyspark release offers the data source, found by trying it (never by its
version string), and the stand-ins where it lacks something.

=========================  =====  =====  ======  =============================================
capability                 4.0    4.1    4.2+    without it
=========================  =====  =====  ======  =============================================
:data:`FILTER_PUSHDOWN`    no     yes    yes     a batch read plans every subscribed queue's
                                                 range; Spark applies every predicate
:data:`ADMISSION_CONTROL`  no     no     yes     ``maxOffsetsPerTrigger`` / ``minOffsetsPerTrigger``
                                                 enforced by the source itself (it tracks where
                                                 the query is); ``Trigger.AvailableNow`` with
                                                 either is refused by name
stream Arrow writer        no     yes    yes     the stream writer is an Arrow writer of the
                                                 batch kind, which 4.0's worker feeds Arrow too
``to_arrow_schema(tz)``    no     no     yes     ``timestamp_utc=True``: the same UTC schema
=========================  =====  =====  ======  =============================================
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import datasource as _ds
from pyspark.sql.pandas.types import to_arrow_schema as _to_arrow_schema
from pyspark.sql.types import StructType

from rmq_spark.errors import ConfigError

__all__ = [
    "ADMISSION_CONTROL",
    "FILTER_PUSHDOWN",
    "ReadAllAvailable",
    "ReadLimit",
    "ReadMaxRows",
    "ReadMinRows",
    "SourceAdmission",
    "StreamArrowWriterBase",
    "SupportsTriggerAvailableNow",
    "arrow_schema",
]

FILTER_PUSHDOWN = hasattr(_ds, "Filter")
"""``pyspark.sql.datasource`` has the filter classes (``reader.pushFilters``): pyspark 4.1+."""

if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )

    ADMISSION_CONTROL = True
else:
    try:
        from pyspark.sql.streaming.datasource import (
            ReadAllAvailable,
            ReadLimit,
            ReadMaxRows,
            ReadMinRows,
            SupportsTriggerAvailableNow,
        )

        ADMISSION_CONTROL = True
    except ImportError:  # pyspark 4.0, 4.1: latestOffset() takes no start and no limit

        class SupportsTriggerAvailableNow:
            """Stand-in: Spark never calls ``prepareForTriggerAvailableNow`` on these releases."""

        class ReadLimit:
            """Stand-in for pyspark 4.2's read limits: the source applies them itself."""

        @dataclass(frozen=True)
        class ReadAllAvailable(ReadLimit):
            pass

        @dataclass(frozen=True)
        class ReadMaxRows(ReadLimit):
            max_rows: int

        @dataclass(frozen=True)
        class ReadMinRows(ReadLimit):
            min_rows: int

        ADMISSION_CONTROL = False
"""Spark passes ``latestOffset`` its start and a read limit (``pyspark.sql.streaming.datasource``,
``SupportsTriggerAvailableNow``): pyspark 4.2+."""

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as StreamArrowWriterBase
elif hasattr(_ds, "DataSourceStreamArrowWriter"):
    StreamArrowWriterBase = _ds.DataSourceStreamArrowWriter
else:  # pyspark 4.0: its write worker feeds Arrow to any Arrow writer

    class StreamArrowWriterBase(_ds.DataSourceStreamWriter, _ds.DataSourceArrowWriter):
        """A stream writer that pyspark 4.0 feeds Arrow batches: its write worker checks
        ``isinstance(writer, DataSourceArrowWriter)`` for streaming writes too."""


_TZ_KEYWORD = "timezone" in inspect.signature(_to_arrow_schema).parameters


def arrow_schema(schema: StructType) -> Any:
    """``schema`` as Arrow, timestamps in UTC (4.2+ names the zone, 4.0/4.1 take a flag)."""
    if _TZ_KEYWORD:
        return _to_arrow_schema(schema, timezone="UTC")
    return _to_arrow_schema(schema, timestamp_utc=True)  # type: ignore[call-arg]


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


class SourceAdmission:
    """Admission control in the source itself, for releases whose Spark calls ``latestOffset()``
    with neither the start of the next batch nor a read limit (as Spark's Kafka source did before
    admission control): the source keeps where the query is -- the end of the last batch it
    planned (``partitions``) or answered (``latestOffset``); on a restart Spark tells it with an
    empty ``partitions(end, end)`` of the last planned batch before asking for offsets -- and
    applies its own ``maxOffsetsPerTrigger`` / ``minOffsetsPerTrigger``.

    ``Trigger.AvailableNow`` on these releases asks ``latestOffset()`` once, before it says where
    the query is, and runs to that answer: with a limit that is one limited batch and a query that
    ends with messages unread.  The source refuses it by name when it sees it (a batch planned from
    a start other than the one it answered from); ``rmq_spark.register(spark)`` also refuses it
    when the query starts (:func:`rmq_spark.datasource.refuse_limited_available_now`).

    Mixed in before a stream reader whose ``latestOffset(start, limit)`` is that of pyspark 4.2+.
    """

    _position: dict[str, Any] | None = None
    _blind_start: dict[str, Any] | None = None

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        me: Any = self
        if start is None:
            if self._position is None:  # Spark has not said where the query is
                self._blind_start = start = me.initialOffset()
            else:
                start = self._position
        end: dict[str, Any] = super().latestOffset(  # type: ignore[misc]
            start, me.getDefaultReadLimit() if limit is None else limit
        )
        self._position = end
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Any:
        blind, self._blind_start = self._blind_start, None
        if blind is not None and not _same(start, blind) and self._limited():
            raise ConfigError(AVAILABLE_NOW_REFUSED)
        self._position = end
        return super().partitions(start, end)  # type: ignore[misc]

    def _limited(self) -> bool:
        return not isinstance(self.getDefaultReadLimit(), ReadAllAvailable)  # type: ignore[attr-defined]


AVAILABLE_NOW_REFUSED = (
    "Trigger.AvailableNow with maxOffsetsPerTrigger or minOffsetsPerTrigger needs pyspark 4.2 or "
    "later (admission control of Python data sources): this release would run one limited batch "
    "and end with messages unread. Use a processing-time trigger, or AvailableNow without limits "
    "(one batch of everything available)"
)
