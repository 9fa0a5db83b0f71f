"""Small pieces shared by the TAG and SQL92 filters.

Java's ``String.trim`` and ``long.intValue`` semantics, the numeric limits of Java's ``int``,
``long`` and ``double``, joining the per-chunk masks of a ``ChunkedArray``, and the types of a
compiled SQL92 tree (its node shapes are drawn in ``sql_compile``), which the compiler and both
evaluators share.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from rmq_spark.errors import FilterExpressionError

# Java String.trim() strips every character <= U+0020.
_JAVA_TRIM_CHARS = "".join(map(chr, range(0x21)))


def _int32(value: int) -> int:
    """Java ``long.intValue()``: keep the low 32 bits, sign-extended."""
    return ((value + 0x80000000) & 0xFFFFFFFF) - 0x80000000


_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_DOUBLE_MAX = 1.7976931348623157e308


def _concat_masks(parts: list[pa.Array]) -> pa.BooleanArray:
    if not parts:
        return pa.array([], type=pa.bool_())
    return pa.concat_arrays(parts)


# a compiled SQL92 node, and a comparison plan (domain, left_conversion, right_conversion)
Node = tuple[Any, ...]
Plan = tuple[str, str | None, str | None]


# The longest subscription expression (TAG or SQL92) accepted, in characters.  RocketMQ sets no
# limit; selectors in use are well under 1 KiB.  Parsing is linear but slow in Python: lark takes
# about 15 us per character of SQL92 (16 KiB: about 0.25 s, so the broker parses off its event
# loop and caches the outcome), a TAG expression about 0.3 us per character (16 KiB: 5 ms).
MAX_EXPRESSION_CHARS = 16 * 1024


def _check_expression_size(kind: str, text: str) -> None:
    if len(text) > MAX_EXPRESSION_CHARS:
        raise FilterExpressionError(
            f"the {kind} filter expression is {len(text)} characters long; the limit is {MAX_EXPRESSION_CHARS}"
        )
