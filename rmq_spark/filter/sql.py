"""RocketMQ's SQL92 filter (``ExpressionType.SQL92``): :class:`SqlFilter`.

Parsing and checking live in ``sql_parse`` and ``sql_compile``, per-message evaluation in
``sql_eval`` and vectorized evaluation in ``sql_mask``; the semantics are described in the
package docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from rmq_spark.filter._common import Node, _concat_masks
from rmq_spark.filter.sql_compile import _compile_sql
from rmq_spark.filter.sql_eval import _eval, _JavaError
from rmq_spark.filter.sql_mask import _check_map_type, _VectorEvaluator


@dataclass(frozen=True)
class SqlFilter:
    """A parsed SQL92 property filter (RocketMQ ``ExpressionType.SQL92``)."""

    expression: str
    tree: Node = field(repr=False, compare=False)
    property_names: frozenset[str] = field(repr=False, compare=False, default=frozenset())

    @classmethod
    def parse(cls, expression: str) -> SqlFilter:
        """Parse and check ``expression``; raise :class:`FilterExpressionError` (with line,
        column and a caret excerpt) when it is malformed."""
        text = expression or ""
        tree, names = _compile_sql(text)
        return cls(text, tree, names)

    def matches(self, properties: Mapping[str, str] | None) -> bool:
        """Whether one message with these user/system properties passes the filter."""
        try:
            return _eval(self.tree, properties or {}) is True
        except _JavaError:
            return False

    def matches_message(self, message: Any) -> bool:
        """:meth:`matches` on a stored message's properties (the store's filter seam)."""
        return self.matches(message.properties)

    def mask(self, properties: pa.Array | pa.ChunkedArray) -> pa.BooleanArray:
        """:meth:`matches` for every row of a ``map<string, string>`` column (a null map is an
        empty one); returns a BooleanArray without nulls."""
        if isinstance(properties, pa.ChunkedArray):
            return _concat_masks([self.mask(chunk) for chunk in properties.chunks])
        _check_map_type(properties)
        result = _VectorEvaluator(properties).eval(self.tree)
        return pa.array(result.data & result.valid & ~result.err, type=pa.bool_())
