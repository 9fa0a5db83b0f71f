"""The source's ``tags`` and ``sql`` options as store filters (``rmq_spark.filter``).

The tag filter is checked on the ConsumeQueue's tagsCode first and then on the tag itself; the
SQL92 filter on the properties column.  A message a filter drops leaves a gap in the queue
offsets: that is filtering, never data loss.
"""

from __future__ import annotations

from typing import Any

from rmq_spark.errors import ConfigError, FilterExpressionError


def make_filters(tags: str | None, sql: str | None) -> tuple[Any | None, Any | None]:
    """(tag filter or None, SQL filter or None); a bad expression raises ConfigError."""
    if tags is None and sql is None:
        return None, None
    from rmq_spark.filter import SqlFilter, TagFilter

    tag_filter = sql_filter = None
    if tags is not None:
        try:
            tag_filter = TagFilter.parse(tags)
        except FilterExpressionError as e:
            raise ConfigError(f"option 'tags': {e}") from None
        if getattr(tag_filter, "match_all", False):
            tag_filter = None
        elif not tag_filter.tags:
            raise ConfigError(
                f"option 'tags': {tags!r} names no tag; give tags like 'TagA || TagB', or '*' for every message"
            )
    if sql is not None:
        try:
            sql_filter = SqlFilter.parse(sql)
        except FilterExpressionError as e:
            raise ConfigError(f"option 'sql': {e}") from None
    return tag_filter, sql_filter
