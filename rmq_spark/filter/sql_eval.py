"""SQL92 filter, per-message evaluation: Java's conversions and comparisons, one value at a time.

:func:`_eval` walks a compiled tree (see ``sql_compile``) for one message's properties the way
RocketMQ's Java evaluator does, left-to-right with short circuits; where Java would throw it
raises :class:`_JavaError` and the message is dropped.  The conversion syntaxes defined here are
shared with the vectorized evaluator in ``sql_mask``.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Mapping
from typing import Any

from rmq_spark.filter._common import _JAVA_TRIM_CHARS, Node, Plan

# Java conversions, scalar (the vectorized twins are in sql_mask; both follow the same regexes)

_INT_SYNTAX = "[+-]?[0-9]+"  # Integer/Long.parseLong, ASCII digits only
_DOUBLE_SYNTAX = (  # Double.valueOf after trim(), without the hexadecimal form
    r"[+-]?(NaN|Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[fFdD]?)"
)
_INT_RE = re.compile(_INT_SYNTAX)
_DOUBLE_RE = re.compile(_DOUBLE_SYNTAX)


class _JavaError(Exception):
    """The Java evaluator would throw here: the message is dropped."""


def _parse_long(value: str, bits: int) -> int:
    if _INT_RE.fullmatch(value) is None:
        raise _JavaError(value)
    number = int(value)
    if not -(1 << (bits - 1)) <= number < (1 << (bits - 1)):
        raise _JavaError(value)
    return number


def _parse_double(value: str) -> float:
    text = value.strip(_JAVA_TRIM_CHARS)
    if _DOUBLE_RE.fullmatch(text) is None:
        raise _JavaError(value)
    return float(text[:-1] if text[-1] in "fFdD" else text)


def _parse_bool(value: str) -> bool:
    return value.isascii() and value.lower() == "true"


def _double_order_key(value: float) -> int:
    """An int64 whose order is ``Double.compareTo``'s total order."""
    if math.isnan(value):
        bits = 0x7FF8000000000000
    else:
        (bits,) = struct.unpack("<q", struct.pack("<d", value))
    return bits ^ ((bits >> 63) & 0x7FFFFFFFFFFFFFFF)


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "int32": lambda v: _parse_long(v, 32),
    "int64": lambda v: _parse_long(v, 64),
    "double": _parse_double,
    "bool": _parse_bool,
    "float": float,
}


def _compare(plan: Plan, left: Any, right: Any) -> int:
    domain, left_conv, right_conv = plan
    if domain == "less":
        return -1
    if domain in ("fail", "never"):
        raise _JavaError(domain)
    if left_conv is not None:
        left = _CONVERT[left_conv](left)
    if right_conv is not None:
        right = _CONVERT[right_conv](right)
    if domain == "double":
        left, right = _double_order_key(left), _double_order_key(right)
    return (left > right) - (left < right)


_ORDER_OPS: dict[str, Callable[[Any], Any]] = {
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
}

_STRING_OPS: dict[str, Callable[[str, str], bool]] = {
    "contains": lambda s, x: x in s,
    "startswith": str.startswith,
    "endswith": str.endswith,
}


def _eval(node: Node, props: Mapping[str, str]) -> Any:
    """Evaluate one node for one message, Java style (short circuit, exceptions)."""
    tag = node[0]
    if tag == "const":
        return node[2]
    if tag == "prop":
        value = props.get(node[1])
        return value if isinstance(value, str) else None
    if tag == "and":
        left = _eval(node[1], props)
        if left is False:
            return False
        right = _eval(node[2], props)
        if right is False:
            return False
        return None if left is None or right is None else True
    if tag == "or":
        left = _eval(node[1], props)
        if left is True:
            return True
        right = _eval(node[2], props)
        if right is True:
            return True
        return None if left is None or right is None else False
    if tag == "not":
        value = _eval(node[1], props)
        return None if value is None else not value
    if tag == "eq":
        left, right = _eval(node[2], props), _eval(node[3], props)
        if left is None or right is None:
            return True if left is None and right is None else (None if left is None else False)
        return _compare(node[1], left, right) == 0
    if tag == "cmp":
        left = _eval(node[3], props)
        if left is None:
            return None
        right = _eval(node[4], props)
        if right is None:
            return None
        return _ORDER_OPS[node[1]](_compare(node[2], left, right))
    if tag == "isnull":
        return _eval(node[1], props) is None
    if tag == "in":
        value = props.get(node[1])
        if not isinstance(value, str):
            return None
        return (value in node[2]) != node[3]
    if tag == "match":
        _, op, kind, child, search, negated = node
        if not search:
            return False
        value = _eval(child, props)
        if kind != "str" or value is None:
            return False
        return _STRING_OPS[op](value, search) != negated
    if tag == "cast":
        return False if isinstance(props.get(node[1]), str) else None
    if tag == "neg":
        _eval(node[1], props)
        return None
    raise AssertionError(f"unknown node {tag}")
