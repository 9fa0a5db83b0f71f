"""SQL92 filter, vectorized evaluation over an Arrow ``map<string, string>`` column.

:class:`_VectorEvaluator` computes, for a whole column of message properties at once, what
``sql_eval`` computes one message at a time: every node becomes a :class:`_Vec` of values, a
validity mask (``null`` is invalid) and an error mask (where the Java evaluator would have
thrown, honouring the short circuit of ``AND``/``OR``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq_spark.filter._common import _INT32_MAX, _INT32_MIN, _JAVA_TRIM_CHARS, Node, Plan
from rmq_spark.filter.sql_eval import _DOUBLE_SYNTAX, _INT_SYNTAX, _ORDER_OPS

_INT_RE2 = f"^(?:{_INT_SYNTAX})$"
_DOUBLE_RE2 = f"^(?:{_DOUBLE_SYNTAX})$"
_NULL_STRING = pa.scalar(None, type=pa.string())


class _Vec(NamedTuple):
    """One value per row: ``data`` (a string Arrow array for kind "str", else numpy), where
    it is non-null (``valid``) and where the Java evaluator would have thrown (``err``)."""

    kind: str
    data: Any
    valid: np.ndarray
    err: np.ndarray


def _np_bool(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), dtype=bool)


def _v_parse_long(strings: pa.Array, bits: int) -> tuple[np.ndarray, np.ndarray]:
    ok = _np_bool(pc.match_substring_regex(strings, _INT_RE2))
    norm = pc.replace_substring_regex(strings, r"^\+", "")
    norm = pc.replace_substring_regex(norm, r"^(-?)0+([0-9])", r"\1\2")
    digits = pc.replace_substring_regex(norm, "^-", "")
    count = pc.fill_null(pc.utf8_length(digits), 0).to_numpy(zero_copy_only=False)
    if bits == 64:  # 19 digits may or may not fit: compare the digit strings
        negative = pc.starts_with(norm, "-")
        within = pc.if_else(
            negative,
            pc.less_equal(digits, "9223372036854775808"),
            pc.less_equal(digits, "9223372036854775807"),
        )
        ok &= (count < 19) | ((count == 19) & _np_bool(within))
    else:
        ok &= count <= 10
    values = pc.cast(pc.if_else(pa.array(ok), norm, _NULL_STRING), pa.int64())
    numbers = pc.fill_null(values, 0).to_numpy(zero_copy_only=False)
    if bits == 32:
        ok &= (numbers >= _INT32_MIN) & (numbers <= _INT32_MAX)
    return numbers, ok


def _v_parse_double(strings: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    trimmed = pc.utf8_trim(strings, characters=_JAVA_TRIM_CHARS)
    ok = _np_bool(pc.match_substring_regex(trimmed, _DOUBLE_RE2))
    plain = pc.replace_substring_regex(trimmed, "[fFdD]$", "")
    values = pc.cast(pc.if_else(pa.array(ok), plain, _NULL_STRING), pa.float64())
    return pc.fill_null(values, 0.0).to_numpy(zero_copy_only=False), ok


def _v_double_order_key(values: np.ndarray) -> np.ndarray:
    keys = np.ascontiguousarray(values, dtype=np.float64).view(np.int64).copy()
    keys[np.isnan(values)] = 0x7FF8000000000000
    return keys ^ ((keys >> 63) & 0x7FFFFFFFFFFFFFFF)


class _VectorEvaluator:
    def __init__(self, maps: pa.Array) -> None:
        self.maps = maps
        self.n = len(maps)
        self.columns: dict[str, pa.Array] = {}
        self.converted: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}

    def zeros(self) -> np.ndarray:
        return np.zeros(self.n, dtype=bool)

    def ones(self) -> np.ndarray:
        return np.ones(self.n, dtype=bool)

    def column(self, name: str) -> pa.Array:
        if name not in self.columns:
            key = pa.scalar(name, type=self.maps.type.key_type)
            values = pc.map_lookup(self.maps, key, "last")
            if values.type != pa.string():
                values = values.cast(pa.string())
            self.columns[name] = values
        return self.columns[name]

    def boolean(self, data: np.ndarray, valid: np.ndarray, err: np.ndarray) -> _Vec:
        return _Vec("bool", data & valid, valid, err)

    def eval(self, node: Node) -> _Vec:
        tag = node[0]
        if tag == "const":
            return self.constant(node[1], node[2])
        if tag == "prop":
            column = self.column(node[1])
            return _Vec("str", column, _np_bool(pc.is_valid(column)), self.zeros())
        if tag in ("and", "or"):
            left, right = self.eval(node[1]), self.eval(node[2])
            left_false, right_false = left.valid & ~left.data, right.valid & ~right.data
            if tag == "and":
                false = left_false | right_false
                valid = false | (left.valid & right.valid)
                err = left.err | (~left_false & right.err)
                return self.boolean(valid & ~false, valid, err)
            true = left.data | right.data
            valid = true | (left.valid & right.valid)
            return self.boolean(true, valid, left.err | (~left.data & right.err))
        if tag == "not":
            child = self.eval(node[1])
            return self.boolean(~child.data, child.valid, child.err)
        if tag == "eq":
            left, right = self.eval(node[2]), self.eval(node[3])
            both = left.valid & right.valid
            sign, cmp_err = self.compare(node[1], left, right, node[2], node[3])
            data = np.where(both, sign == 0, ~left.valid & ~right.valid)
            valid = left.valid | ~right.valid
            return self.boolean(data, valid, left.err | right.err | (both & cmp_err))
        if tag == "cmp":
            _, op, plan, left_node, right_node = node
            left, right = self.eval(left_node), self.eval(right_node)
            both = left.valid & right.valid
            sign, cmp_err = self.compare(plan, left, right, left_node, right_node)
            err = left.err | (left.valid & right.err) | (both & cmp_err)
            return self.boolean(_ORDER_OPS[op](sign), both, err)
        if tag == "isnull":
            child = self.eval(node[1])
            return self.boolean(~child.valid, self.ones(), child.err)
        if tag == "in":
            column = self.column(node[1])
            found = _np_bool(pc.is_in(column, value_set=pa.array(node[2], type=pa.string())))
            return self.boolean(found != node[3], _np_bool(pc.is_valid(column)), self.zeros())
        if tag == "match":
            return self.match(node)
        if tag == "cast":
            present = _np_bool(pc.is_valid(self.column(node[1])))
            return self.boolean(self.zeros(), present, self.zeros())
        if tag == "neg":
            child = self.eval(node[1])
            return _Vec("null", self.zeros(), self.zeros(), child.err)
        raise AssertionError(f"unknown node {tag}")

    def constant(self, kind: str, value: Any) -> _Vec:
        if kind == "null":
            return _Vec("null", self.zeros(), self.zeros(), self.zeros())
        if kind == "str":
            data: Any = pa.repeat(pa.scalar(value, type=pa.string()), self.n)
        elif kind == "bool":
            data = np.full(self.n, value, dtype=bool)
        else:
            data = np.full(self.n, value, dtype=np.float64 if kind == "double" else np.int64)
        return _Vec(kind, data, self.ones(), self.zeros())

    def match(self, node: Node) -> _Vec:
        _, op, kind, child_node, search, negated = node
        if not search:
            return self.boolean(self.zeros(), self.ones(), self.zeros())
        child = self.eval(child_node)
        if kind != "str":
            return self.boolean(self.zeros(), self.ones(), child.err)
        if op == "contains":
            found = pc.match_substring(child.data, search)
        elif op == "startswith":
            found = pc.starts_with(child.data, search)
        else:
            found = pc.ends_with(child.data, search)
        data = (_np_bool(found) != negated) & child.valid
        return self.boolean(data, self.ones(), child.err)

    def convert(self, vec: _Vec, conversion: str | None, node: Node) -> tuple[Any, np.ndarray]:
        if conversion is None:
            return vec.data, self.ones()
        if conversion == "float":
            return vec.data.astype(np.float64), self.ones()
        if conversion == "bool":
            return _np_bool(pc.equal(pc.ascii_lower(vec.data), "true")), self.ones()
        cache_key = (node[1], conversion) if node[0] == "prop" else None
        if cache_key is not None and cache_key in self.converted:
            return self.converted[cache_key]
        if conversion == "double":
            result = _v_parse_double(vec.data)
        else:
            result = _v_parse_long(vec.data, 32 if conversion == "int32" else 64)
        if cache_key is not None:
            self.converted[cache_key] = result
        return result

    def compare(
        self, plan: Plan, left: _Vec, right: _Vec, left_node: Node, right_node: Node
    ) -> tuple[np.ndarray, np.ndarray]:
        """Sign of Java's ``compare(left, right)`` per row, and where it throws.  Only rows
        where both sides are valid are meaningful."""
        domain, left_conv, right_conv = plan
        if domain == "less":
            return np.full(self.n, -1, dtype=np.int8), self.zeros()
        if domain in ("fail", "never"):
            return np.zeros(self.n, dtype=np.int8), self.ones()
        a, a_ok = self.convert(left, left_conv, left_node)
        b, b_ok = self.convert(right, right_conv, right_node)
        if domain == "str":
            sign = np.where(_np_bool(pc.equal(a, b)), 0, 1).astype(np.int8)
        else:
            if domain == "double":
                a, b = _v_double_order_key(a), _v_double_order_key(b)
            sign = (a > b).astype(np.int8) - (a < b).astype(np.int8)
        return sign, ~(a_ok & b_ok)


def _check_map_type(array: pa.Array) -> None:
    kind = array.type
    string_like = (pa.types.is_string, pa.types.is_large_string)
    if not (
        pa.types.is_map(kind)
        and any(test(kind.key_type) for test in string_like)
        and any(test(kind.item_type) for test in string_like)
    ):
        raise TypeError(f"SqlFilter.mask needs a map<string, string> array, got {kind}")
