"""Message filters: RocketMQ's TAG expressions and SQL92 property expressions.

Two filter types, as in RocketMQ (``ExpressionType.TAG`` / ``ExpressionType.SQL92``):

``TagFilter``
    ``*``, empty or ``None`` subscribes to everything; otherwise the expression is split on
    ``||`` and every piece is trimmed (Java ``String.trim``: characters <= U+0020); empty pieces
    are dropped.  The broker matches the ConsumeQueue ``tagsCode`` against the set of
    ``java_string_hash(tag)`` (:meth:`TagFilter.matches_code`, :meth:`TagFilter.mask_codes`) and
    the client re-checks the tag string because hash codes collide (:meth:`TagFilter.matches`,
    :meth:`TagFilter.mask`).  An expression whose pieces are all blank (``"||"``, ``" "``)
    matches nothing, exactly as RocketMQ builds it.

``SqlFilter``
    RocketMQ's JMS-selector subset, parsed with a ``lark`` LALR grammar and compiled to a tree
    of plain tuples (picklable, shipped to Spark executors).  Evaluated one message at a time
    (:meth:`SqlFilter.matches`) or vectorized over an Arrow ``map<string, string>`` column
    (:meth:`SqlFilter.mask`); both give the same answer for every row.

SQL92 semantics (those of ``org.apache.rocketmq.filter``, checked against its sources):

* Property values are strings; a missing property is ``null``.  Logic is three-valued
  (``AND``/``OR`` Kleene, ``NOT null`` is ``null``) and the final ``null`` means "no match".
* ``<``, ``<=``, ``>``, ``>=`` with a ``null`` operand give ``null``.  Between two properties
  both are converted with Java ``Double.valueOf``; against a literal the property is converted to
  the literal's type (``Integer.valueOf`` for an integer literal in int32 range,
  ``Long.valueOf`` for a larger one, ``Double.valueOf`` for a decimal literal).
* ``=`` converts the same way, except property-to-property and property-to-string-literal,
  which compare strings.  ``x = TRUE`` is ``x`` equalsIgnoreCase ``"true"``.  When exactly one
  side is ``null`` the result is ``null`` if it is the left side and ``FALSE`` if it is the right
  side; two ``null`` sides are equal (so ``a = b`` holds when both are missing).  ``<>`` is
  ``NOT (=)``.  Doubles compare like ``Double.compareTo`` (``NaN`` equals itself and is the
  greatest value, ``-0.0 < 0.0``).
* A conversion that fails (``a > 5`` with ``a = 'abc'``, ``a = 5`` with ``a = '5.0'``) throws
  in RocketMQ, and the broker then drops the message whatever the rest of the expression says,
  honouring Java's left-to-right short circuit of ``AND``/``OR``.  Both evaluators model that as
  an "error" lane that turns the whole row into "no match".
* ``IN``/``NOT IN`` on a missing property is ``null``; ``CONTAINS``, ``STARTSWITH``,
  ``ENDSWITH`` and their ``NOT`` forms are ``FALSE`` on a missing property or an empty search
  string (so ``NOT (a CONTAINS 'x')`` matches messages without ``a``).
* ``NOT`` binds tighter than comparisons, as in RocketMQ's grammar: ``NOT a = 1`` is
  ``(NOT a) = 1``; write ``NOT (a = 1)``.  A bare property used as a boolean is ``FALSE`` when
  present and ``null`` when missing.
* There is no ``!=`` operator; ``--`` line comments and ``/* */`` block comments are skipped.

Limits: an expression of either type is at most ``MAX_EXPRESSION_CHARS`` (16 Ki) characters
(RocketMQ sets none); an SQL92 parse's outcome is cached, failures like successes.

Deliberate differences from the Java code: decimal literals ``0.0`` and other values below
``Double.MIN_VALUE`` are accepted (RocketMQ rejects them); a trailing ``--`` comment needs no
newline; integer conversion accepts ASCII digits only (Java's ``Character.digit`` also takes
other Unicode decimal digits) and ``Double.valueOf``'s hexadecimal form (``0x1p3``) counts as
not a number.
"""

# Layout: ``tag`` (TagFilter), ``sql`` (SqlFilter), ``sql_parse`` (grammar, syntax errors),
# ``sql_compile`` (tree compiler and RocketMQ's parse-time checks), ``sql_eval`` (per-message
# evaluator and Java conversions), ``sql_mask`` (vectorized pyarrow evaluator), ``_common``
# (Java trim/intValue/limits, mask concatenation).

from __future__ import annotations

from rmq_spark.errors import FilterExpressionError
from rmq_spark.filter._common import MAX_EXPRESSION_CHARS
from rmq_spark.filter._common import Node as Node
from rmq_spark.filter._common import Plan as Plan
from rmq_spark.filter.sql import SqlFilter
from rmq_spark.filter.tag import SUB_ALL, TagFilter
from rmq_spark.store.hashing import java_string_hash

__all__ = [
    "EXPRESSION_TYPE_SQL92",
    "EXPRESSION_TYPE_TAG",
    "MAX_EXPRESSION_CHARS",
    "SUB_ALL",
    "SqlFilter",
    "TagFilter",
    "java_string_hash",
    "make_filter",
]

EXPRESSION_TYPE_TAG = "TAG"
EXPRESSION_TYPE_SQL92 = "SQL92"

# The classes keep the module path they had before this package was split, so that pickles (and
# anything else naming a class by module and qualname) read ``rmq_spark.filter.TagFilter``.
TagFilter.__module__ = __name__
SqlFilter.__module__ = __name__


def make_filter(expression_type: str | None, expression: str | None) -> TagFilter | SqlFilter:
    """The filter for a subscription: type ``TAG`` (also ``None``/``""``, as in RocketMQ) or
    ``SQL92``, case-insensitive; any other type raises :class:`FilterExpressionError`."""
    kind = (expression_type or EXPRESSION_TYPE_TAG).upper()
    if kind == EXPRESSION_TYPE_TAG:
        return TagFilter.parse(expression)
    if kind == EXPRESSION_TYPE_SQL92:
        return SqlFilter.parse(expression or "")
    raise FilterExpressionError(
        f"unknown filter expression type {expression_type!r} (expected TAG or SQL92)"
    )
