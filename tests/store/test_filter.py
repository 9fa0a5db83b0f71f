"""Tests of rmq_spark.filter: TAG and SQL92 message filters.

Expected values follow RocketMQ's Java code (``filter/`` module, ``FilterAPI``,
``ExpressionMessageFilter``).  The property-based test checks ``SqlFilter.mask`` and
``SqlFilter.matches`` against ``JavaModel``, an independent evaluator written here in the
shape of the Java classes (values tagged with their Java class, ``__compare`` spelled out).
"""

from __future__ import annotations

import math
import pickle
import re
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_spark.errors import FilterExpressionError, RmqError
from rmq_spark.filter import SqlFilter, TagFilter, java_string_hash, make_filter

MAP_TYPE = pa.map_(pa.string(), pa.string())


def props_array(rows: list[Mapping[str, str] | None]) -> pa.Array:
    return pa.array([None if row is None else list(row.items()) for row in rows], type=MAP_TYPE)


def evaluate_both(expression: str, rows: list[Mapping[str, str] | None]) -> list[bool]:
    """matches() per row, after asserting that mask() agrees with it."""
    sql = SqlFilter.parse(expression)
    one_by_one = [sql.matches(row) for row in rows]
    vectorized = sql.mask(props_array(rows))
    assert vectorized.type == pa.bool_() and vectorized.null_count == 0
    assert vectorized.to_pylist() == one_by_one, expression
    return one_by_one


def check(expression: str, row: Mapping[str, str] | None) -> bool:
    return evaluate_both(expression, [row])[0]


# ---------------------------------------------------------------------------------------------
# java_string_hash
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("TagA", 2598919),
        ("hello", 99162322),
        ("Aa", 2112),
        ("BB", 2112),
        ("polygenelubricants", -(2**31)),  # the classic Integer.MIN_VALUE hash
        ("中文", 646394),  # 31 * 0x4E2D + 0x6587
        ("😀", 31 * 0xD83D + 0xDE00),  # a surrogate pair hashes as two UTF-16 code units
        ("\0", 0),
    ],
)
def test_java_string_hash_known_values(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


@given(st.text(max_size=40))
def test_java_string_hash_matches_the_polynomial(text: str) -> None:
    units = struct.unpack(
        f"<{len(text.encode('utf-16-le', 'surrogatepass')) // 2}H",
        text.encode("utf-16-le", "surrogatepass"),
    )
    total = sum(u * pow(31, len(units) - 1 - i, 2**32) for i, u in enumerate(units)) % 2**32
    expected = total - 2**32 if total >= 2**31 else total
    assert java_string_hash(text) == expected
    assert -(2**31) <= java_string_hash(text) < 2**31


# ---------------------------------------------------------------------------------------------
# TagFilter
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("expression", [None, "", "*"])
def test_tag_match_all(expression: str | None) -> None:
    tag_filter = TagFilter.parse(expression)
    assert tag_filter.match_all
    assert tag_filter.matches(None) and tag_filter.matches("anything")
    assert tag_filter.matches_code(0) and tag_filter.matches_code(12345)
    assert tag_filter.mask_codes(np.array([0, 1, -5], dtype=np.int64)).all()
    assert tag_filter.mask(pa.array(["x", None])).to_pylist() == [True, True]


def test_tag_expression_split_and_trimmed() -> None:
    tag_filter = TagFilter.parse("  TagA ||TagB||   || TagC  ")
    assert not tag_filter.match_all
    assert tag_filter.tags == frozenset({"TagA", "TagB", "TagC"})
    assert tag_filter.codes == frozenset(java_string_hash(t) for t in ("TagA", "TagB", "TagC"))
    assert tag_filter.matches("TagB") and not tag_filter.matches("TagD")
    assert not tag_filter.matches(None) and not tag_filter.matches("tagb")
    assert tag_filter.matches_code(2598919) and not tag_filter.matches_code(0)


def test_tag_single_pipe_is_part_of_the_tag() -> None:
    assert TagFilter.parse("a|||b").tags == frozenset({"a", "|b"})  # Java split("\\|\\|")
    assert TagFilter.parse("a|b").tags == frozenset({"a|b"})


@pytest.mark.parametrize("expression", ["||", " ", " || "])
def test_tag_blank_pieces_match_nothing(expression: str) -> None:
    tag_filter = TagFilter.parse(expression)
    assert not tag_filter.match_all and tag_filter.tags == frozenset()
    assert not tag_filter.matches("x") and not tag_filter.matches_code(0)
    assert tag_filter.mask(pa.array(["x", None, ""])).to_pylist() == [False] * 3


def test_tag_hash_collision_passes_codes_but_not_the_string_check() -> None:
    tag_filter = TagFilter.parse("Aa")
    assert tag_filter.matches_code(java_string_hash("BB"))
    assert not tag_filter.matches("BB")


def test_tag_codes_compare_as_java_int_value() -> None:
    tag_filter = TagFilter.parse("TagA")
    code = java_string_hash("TagA")
    assert tag_filter.matches_code(code + (5 << 32))  # Long.intValue() keeps the low 32 bits
    codes = np.array([code, code + (5 << 32), 0, -1, code + 1], dtype=np.int64)
    assert tag_filter.mask_codes(codes).tolist() == [True, True, False, False, False]
    assert tag_filter.mask_codes(codes).tolist() == [tag_filter.matches_code(int(c)) for c in codes]


def test_tag_mask_agrees_with_matches() -> None:
    tag_filter = TagFilter.parse("TagA || 中文")
    tags = ["TagA", None, "TagB", "中文", "", "taga"]
    expected = [tag_filter.matches(t) for t in tags]
    assert expected == [True, False, False, True, False, False]
    assert tag_filter.mask(pa.array(tags)).to_pylist() == expected
    assert tag_filter.mask(pa.array(tags, type=pa.large_string())).to_pylist() == expected
    assert tag_filter.mask(pa.array(tags).dictionary_encode()).to_pylist() == expected
    chunked = pa.chunked_array([pa.array(tags[:2]), pa.array(tags[2:])])
    assert tag_filter.mask(chunked).to_pylist() == expected
    assert tag_filter.mask(pa.array([None, None], type=pa.null())).to_pylist() == [False, False]
    codes = np.array([java_string_hash(t) if t else 0 for t in tags], dtype=np.int64)
    assert tag_filter.mask_codes(codes).tolist() == [tag_filter.matches_code(c) for c in codes]


# ---------------------------------------------------------------------------------------------
# make_filter, pickling
# ---------------------------------------------------------------------------------------------


def test_make_filter_types() -> None:
    assert make_filter("TAG", "TagA") == TagFilter.parse("TagA")
    assert make_filter("tag", "*").match_all
    assert isinstance(make_filter("", "*"), TagFilter)
    sql = make_filter("sql92", "a > 1")
    assert isinstance(sql, SqlFilter) and sql.property_names == frozenset({"a"})
    with pytest.raises(FilterExpressionError, match="SQL"):
        make_filter("XPATH", "a")
    with pytest.raises(FilterExpressionError, match="line 1, column 1"):
        make_filter("SQL92", "")


def test_filters_pickle() -> None:
    sql = SqlFilter.parse("a BETWEEN 1 AND 3 OR b IN ('x', 'y') OR c CONTAINS 'q'")
    clone = pickle.loads(pickle.dumps(sql))
    assert clone == sql and clone.tree == sql.tree
    rows = [{"a": "2"}, {"b": "y"}, {"c": "aqa"}, {"a": "9"}]
    assert [clone.matches(r) for r in rows] == [True, True, True, False]
    tag = TagFilter.parse("A || B")
    assert pickle.loads(pickle.dumps(tag)) == tag


def test_filter_expression_error_is_in_the_tree() -> None:
    assert issubclass(FilterExpressionError, RmqError)
    assert issubclass(FilterExpressionError, ValueError)


# ---------------------------------------------------------------------------------------------
# SQL92: every construct
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "row", "expected"),
    [
        # comparisons, numeric conversion of string properties
        ("a = 3", {"a": "3"}, True),
        ("a = 3", {"a": "+3"}, True),
        ("a = 3", {"a": "003"}, True),
        ("a <> 3", {"a": "4"}, True),
        ("a <> 3", {"a": "3"}, False),
        ("a > 5", {"a": "10"}, True),
        ("a > 5", {"a": "5"}, False),
        ("a >= 5", {"a": "5"}, True),
        ("a < 5", {"a": "-7"}, True),
        ("a <= 5", {"a": "6"}, False),
        ("a > 3.14", {"a": "3.1415"}, True),
        ("a > 3.1E10", {"a": "31415000000.0"}, True),
        ("a > 2", {"a": "2.5"}, False),  # Integer.valueOf("2.5") throws: dropped
        ("a > 2.0", {"a": "2.5"}, True),
        ("a > 2.0", {"a": " 2.5 "}, True),  # Double.valueOf trims
        ("a > 2.0", {"a": "2.5f"}, True),
        ("a > 2", {"a": " 3"}, False),  # Integer.valueOf does not trim
        ("a = 2147483648", {"a": "2147483648"}, True),  # a Long literal uses Long.valueOf
        ("a = 1", {"a": "2147483648"}, False),  # out of int range: throws
        ("a > 2.0", {"a": "NaN"}, True),  # Double.compareTo: NaN is the greatest
        ("a = 0.0", {"a": "-0.0"}, False),  # and -0.0 < 0.0
        ("a < 0.0", {"a": "-0.0"}, True),
        ("a > 1", {"a": "abc"}, False),
        ("a > b", {"a": "20", "b": "10"}, True),
        ("a > b", {"a": "10", "b": "20"}, False),
        ("a > b", {"a": "2.5", "b": "2"}, True),  # property vs property: both Double.valueOf
        ("a > b", {"a": "x", "b": "2"}, False),
        ("a = b", {"a": "3.14", "b": "3.14"}, True),
        ("a = b", {"a": "1", "b": "1.0"}, False),  # = between properties compares strings
        ("a <> b", {"a": "3.14", "b": "3.141"}, True),
        ("1 < a", {"a": "2"}, True),
        ("a > -3", {"a": "-2"}, True),
        ("a > - -3", {"a": "2"}, False),
        ("a > +3", {"a": "4"}, True),
        ("a = 10L", {"a": "10"}, True),
        # strings, booleans
        ("a = 'hello'", {"a": "hello"}, True),
        ("a = 'it''s'", {"a": "it's"}, True),
        ("a = 'x'", {"a": "X"}, False),
        ("a = TRUE", {"a": "TRUE"}, True),
        ("a = true", {"a": "yes"}, False),
        ("a = FALSE", {"a": "yes"}, True),  # Boolean.valueOf("yes") is false
        ("a=TRUE OR b=FALSE", {"a": "true", "b": "false"}, True),
        ("a=TRUE OR b=FALSE", {"a": "false", "b": "true"}, False),
        ("TRUE = a", {"a": "true"}, False),  # Java ClassCastException: dropped
        ("1 = TRUE", {}, False),
        ("TRUE", {}, True),
        ("FALSE", {}, False),
        ("NULL", {}, False),
        ("NOT NULL", {}, False),
        ("TRUE = FALSE", {}, False),
        ("(a = '1') = TRUE", {"a": "1"}, True),
        ("'1' = 1", {}, True),
        # BETWEEN / NOT BETWEEN
        ("a BETWEEN 2 AND 10", {"a": "2"}, True),
        ("a BETWEEN 2 AND 10", {"a": "10"}, True),
        ("a BETWEEN 2 AND 10", {"a": "11"}, False),
        ("a BETWEEN 2 AND 10", {"a": "abc"}, False),
        ("a BETWEEN 1.5 AND 2", {"a": "1.75"}, False),  # <= 2 converts with Integer.valueOf
        ("a NOT BETWEEN 2 AND 10", {"a": "1"}, True),
        ("a NOT BETWEEN 2 AND 10", {"a": "5"}, False),
        ("a NOT BETWEEN 2 AND 10", {}, False),
        ("a BETWEEN -1 AND -5", {"a": "-3"}, False),  # negations are not checked at parse time
        ("a BETWEEN b AND c", {"a": "2", "b": "1", "c": "3"}, True),
        # IN / NOT IN
        ("a IN ('3', '4', '5')", {"a": "4"}, True),
        ("a IN ('3', '4', '5')", {"a": "6"}, False),
        ("a NOT IN ('3', '4', '5')", {"a": "6"}, True),
        ("a NOT IN ('3', '4', '5')", {"a": "3"}, False),
        ("a NOT IN ('3')", {}, False),
        ("NOT (a IN ('3'))", {}, False),
        ("(a) IN ('3')", {"a": "3"}, True),
        # IS NULL / IS NOT NULL
        ("a IS NULL", {}, True),
        ("a IS NULL", {"a": ""}, False),
        ("a IS NOT NULL", {"a": ""}, True),
        ("a IS NOT NULL", {"abc": "2"}, False),
        ("a is null OR a='hello'", {}, True),
        ("a is null OR a='hello'", {"a": "abc"}, False),
        ("a is not null and a='hello'", {"a": "hello"}, True),
        ("(a > 1) IS NULL", {}, True),
        # CONTAINS / STARTSWITH / ENDSWITH and NOT forms
        ("a CONTAINS 'x'", {"a": "axb"}, True),
        ("a STARTSWITH 'ax'", {"a": "axb"}, True),
        ("a ENDSWITH 'xb'", {"a": "axb"}, True),
        ("a NOT CONTAINS 'x'", {"a": "axb"}, False),
        ("a NOT STARTSWITH 'b'", {"a": "axb"}, True),
        ("a NOT ENDSWITH 'a'", {"a": "axb"}, True),
        ("a CONTAINS ''", {"a": "axb"}, False),
        ("a NOT CONTAINS ''", {"a": "axb"}, False),
        ("a CONTAINS 'x'", {}, False),
        ("a NOT CONTAINS 'x'", {}, False),
        ("NOT (a CONTAINS 'x')", {}, True),
        ("'axb' CONTAINS 'x'", {}, True),
        ("' ' STARTSWITH ' '", {}, True),
        ("'s' ENDSWITH '\\'", {}, False),
        ("a CONTAINS '.'", {"a": "a.b"}, True),
        ("a CONTAINS '%'", {"a": "abc"}, False),
        ("a STARTSWITH '中'", {"a": "中文"}, True),
        ("a ENDSWITH '😀'", {"a": "x😀"}, True),
        ("(a = '1') CONTAINS 'x'", {"a": "1"}, False),
        # AND / OR / NOT / parentheses, three-valued logic
        ("a=3 and b<>4 And c>5 AND d<=4", {"a": "3", "b": "5", "c": "6", "d": "4"}, True),
        ("a=3 or b<>4 Or c>5 OR d<=4", {"a": "2", "b": "4", "c": "5", "d": "5"}, False),
        ("a = 1 OR b = 2", {"b": "2"}, True),
        ("NOT (a = 1)", {"a": "2"}, True),
        ("NOT (a = 1)", {}, False),  # NOT null stays null
        ("NOT (a > 1 AND b = 'x')", {"b": "y"}, True),  # null AND false = false
        ("NOT (a > 1 OR b = 'x')", {"b": "y"}, False),  # null OR false = null
        ("NOT a = 1", {"a": "1"}, False),  # parsed as (NOT a) = 1
        ("NOT a", {"a": "x"}, True),  # a bare property is FALSE when present
        ("NOT a", {}, False),
        ("a", {"a": "true"}, False),
        ("((a = '1'))", {"a": "1"}, True),
        ("a = 1 AND b = 2 OR c = 3", {"c": "3"}, True),
        ("a = 1 OR b = 2 AND c = 3", {"a": "1"}, True),
        # errors abort the whole evaluation, with Java's short circuit
        ("a > 1 OR b = 'x'", {"a": "abc", "b": "x"}, False),
        ("b = 'x' OR a > 1", {"a": "abc", "b": "x"}, True),
        ("b = 'y' AND a > 1", {"a": "abc", "b": "x"}, False),
        ("NOT (a > 1)", {"a": "abc"}, False),
        ("a IS NULL OR a > 1", {"a": "abc"}, False),
        # missing properties
        ("a = b", {}, True),  # two nulls are equal in doCreateEqual
        ("a = b", {"b": "1"}, False),
        ("a <> b", {"b": "1"}, False),  # left null: null
        ("a <> b", {"a": "1"}, True),  # right null: FALSE, NOT -> TRUE
        ("a > 1", {}, False),
        ("-a = 5", {"a": "-5"}, False),  # negating a string gives null
        ("-a IS NULL", {"a": "5"}, True),
        # keywords are case-insensitive, property names are not; comments are skipped
        ("a between 1 AnD 3 aNd b iS nOt NuLl", {"a": "2", "b": ""}, True),
        ("A = '1'", {"a": "1"}, False),
        ("$p_1 = '1'", {"$p_1": "1"}, True),
        ("a = 1 -- trailing comment", {"a": "1"}, True),
        ("a /* x */ = /* y */ 1", {"a": "1"}, True),
        ("a\n=\t1\r\n\fAND b = 2", {"a": "1", "b": "2"}, True),
        # system properties are ordinary properties
        ("TAGS = 'TagA' AND KEYS IS NOT NULL", {"TAGS": "TagA", "KEYS": "k"}, True),
        ("a > 0.0", {"a": "0.5"}, True),
    ],
)
def test_sql_constructs(expression: str, row: dict[str, str], expected: bool) -> None:
    assert check(expression, row) is expected


def test_sql_null_map_is_an_empty_map() -> None:
    assert evaluate_both("a IS NULL", [None, {}, {"a": "1"}]) == [True, True, False]


def test_sql_duplicate_keys_last_one_wins() -> None:
    array = pa.array([[("a", "1"), ("a", "2")]], type=MAP_TYPE)
    assert SqlFilter.parse("a = '2'").mask(array).to_pylist() == [True]
    assert SqlFilter.parse("a = '2'").matches(dict(array.to_pylist()[0])) is True


def test_sql_mask_chunked_large_and_sliced() -> None:
    rows: list[Mapping[str, str] | None] = [{"a": str(i)} for i in range(10)] + [None]
    sql = SqlFilter.parse("a BETWEEN 3 AND 6 OR a IS NULL")
    expected = [sql.matches(r) for r in rows]
    chunked = pa.chunked_array([props_array(rows[:4]), props_array(rows[4:])])
    assert sql.mask(chunked).to_pylist() == expected
    assert sql.mask(pa.chunked_array([], type=MAP_TYPE)).to_pylist() == []
    assert sql.mask(props_array(rows).slice(2, 5)).to_pylist() == expected[2:7]
    large = props_array(rows).cast(pa.map_(pa.large_string(), pa.large_string()))
    assert sql.mask(large).to_pylist() == expected
    with pytest.raises(TypeError):
        sql.mask(pa.array(["a"]))


def test_sql_property_names() -> None:
    sql = SqlFilter.parse("a > 1 AND (b IN ('x') OR NOT c) AND d IS NULL")
    assert sql.property_names == frozenset({"a", "b", "c", "d"})


# ---------------------------------------------------------------------------------------------
# SQL92: malformed expressions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "reason", "line", "column"),
    [
        ("", "unexpected end", 1, 1),
        ("   ", "unexpected end", 1, 4),
        ("a = 'abc", "unterminated string", 1, 5),
        ("a = 1 AND", "unexpected end", 1, 10),
        ("a = 1 AND\n  AND b = 2", "unexpected 'AND'", 2, 3),
        ("a != 1", "unexpected character '!'", 1, 3),
        ("a == 1", "unexpected '='", 1, 4),
        ("a ~ 1", "unexpected character '~'", 1, 3),
        ("a = 1)", "unexpected ')'", 1, 6),
        ("(a = 1", "unexpected end", 1, 7),
        ("a IN ()", "unexpected ')'", 1, 7),
        ("a IN (1)", "unexpected '1'", 1, 7),
        ("a CONTAINS x", "unexpected 'x'", 1, 12),
        ("a CONTAINS 123", "unexpected '123'", 1, 12),
        ("'axb' CONTAINS ", "unexpected end", 1, 16),
        ("a BETWEEN 1", "unexpected end", 1, 12),
        ("a = 07", "unexpected '7'", 1, 6),
        ("and = 1", "unexpected 'and'", 1, 1),
        ("a > 'x'", "cannot be compared", 1, 5),
        ("'x' < a", "cannot be compared", 1, 1),
        ("a > TRUE", "cannot be compared", 1, 5),
        ("(a > 1) > 2", "cannot be compared", 1, 2),
        ("a BETWEEN 'a' AND 'b'", "cannot be compared", 1, 11),
        ("a BETWEEN 10 AND 2", "lower bound is greater", 1, 11),
        ("a BETWEEN NULL AND 2", "cannot be NULL", 1, 11),
        ("a = NULL", "NULL cannot be compared", 1, 5),
        ("TRUE = 1", "boolean cannot be compared", 1, 8),
        ("5", "will not result in a boolean", 1, 1),
        ("'x'", "will not result in a boolean", 1, 1),
        ("a = 1 AND 5", "will not result in a boolean", 1, 11),
        ("NOT -a", "will not result in a boolean", 1, 5),
        ("'x' IN ('x')", "IN needs a property", 1, 1),
        ("a > 9223372036854775808", "out of the range", 1, 5),
        ("a > 1e999", "greater than", 1, 5),
        ("a.b = 1", "unexpected character '.'", 1, 2),
    ],
)
def test_sql_malformed(expression: str, reason: str, line: int, column: int) -> None:
    with pytest.raises(FilterExpressionError) as info:
        SqlFilter.parse(expression)
    message = str(info.value)
    assert reason in message
    assert f"line {line}, column {column}" in message
    excerpt_line, caret_line = message.splitlines()[-2:]
    assert caret_line.strip() == "^"
    source_line = expression.split("\n")[line - 1]
    assert excerpt_line[4:] == source_line
    assert caret_line.index("^") - 4 == column - 1


def test_sql_deep_nesting_is_an_error_not_a_crash() -> None:
    with pytest.raises(FilterExpressionError, match="nested"):
        SqlFilter.parse("NOT " * 3000 + "a")  # within the 16 Ki characters an expression may have
    assert SqlFilter.parse("NOT " * 100 + "a").matches({"a": "1"}) is False
    assert SqlFilter.parse("NOT " * 101 + "a").matches({"a": "1"}) is True
    deep_parens = SqlFilter.parse("(" * 3000 + "a = 1" + ")" * 3000)  # parentheses add no depth
    assert deep_parens.mask(props_array([{"a": "1"}, {}])).to_pylist() == [True, False]


def test_sql_long_line_excerpt_is_windowed() -> None:
    expression = "a = 1 AND " * 20 + "b >"
    with pytest.raises(FilterExpressionError) as info:
        SqlFilter.parse(expression)
    excerpt, caret = str(info.value).splitlines()[-2:]
    assert len(excerpt) <= 84 and excerpt[caret.index("^") - 1 : caret.index("^")] == ">"


# ---------------------------------------------------------------------------------------------
# Property-based: mask() == matches() == an independent model of the Java evaluator
# ---------------------------------------------------------------------------------------------


class JavaThrows(Exception):
    """The Java evaluator throws; the broker logs and drops the message."""


JVal = tuple[str, Any]  # (Java class name, Python value)


def java_int_valueof(s: str, bits: int) -> int:
    body = s[1:] if s[:1] in ("+", "-") else s
    if not body or any(c not in "0123456789" for c in body):
        raise JavaThrows
    value = int(body) * (-1 if s[0] == "-" else 1)
    if value < -(2 ** (bits - 1)) or value >= 2 ** (bits - 1):
        raise JavaThrows
    return value


_JAVA_FLOAT = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?[fFdD]?)", re.ASCII
)


def java_double_valueof(s: str) -> float:
    t = s
    while t and ord(t[0]) <= 32:
        t = t[1:]
    while t and ord(t[-1]) <= 32:
        t = t[:-1]
    if not _JAVA_FLOAT.fullmatch(t):
        raise JavaThrows
    if t[-1] in "fFdD":
        t = t[:-1]
    return float(t)


def java_double_compare(a: float, b: float) -> int:
    if a < b:
        return -1
    if a > b:
        return 1

    def bits(x: float) -> int:
        return 0x7FF8000000000000 if math.isnan(x) else struct.unpack(">q", struct.pack(">d", x))[0]

    return (bits(a) > bits(b)) - (bits(a) < bits(b))


def java_compare(left: JVal, right: JVal) -> int:
    """``ComparisonExpression.__compare`` with convertStringExpressions = true."""
    (lc, lv), (rc, rv) = left, right
    if lc != rc:
        if lc == "Boolean":
            if rc == "String":
                raise JavaThrows  # Boolean.valueOf((String) lv): ClassCastException
            return -1
        if lc == "Integer":
            if rc == "Long":
                lc = "Long"
            elif rc == "Double":
                lc, lv = "Double", float(lv)
            elif rc == "String":
                rc, rv = "Integer", java_int_valueof(rv, 32)
            else:
                return -1
        elif lc == "Long":
            if rc == "Integer":
                rc = "Long"
            elif rc == "Double":
                lc, lv = "Double", float(lv)
            elif rc == "String":
                rc, rv = "Long", java_int_valueof(rv, 64)
            else:
                return -1
        elif lc == "Double":
            if rc in ("Integer", "Long"):
                rc, rv = "Double", float(rv)
            elif rc == "String":
                rc, rv = "Double", java_double_valueof(rv)
            else:
                return -1
        elif lc == "String":
            if rc == "Boolean":
                lv = lv.lower() == "true" if lv.isascii() else False
            elif rc == "Integer":
                lv = java_int_valueof(lv, 32)
            elif rc == "Long":
                lv = java_int_valueof(lv, 64)
            elif rc == "Double":
                lv = java_double_valueof(lv)
            else:
                return -1
            lc = rc
    if lc == "Double":
        return java_double_compare(lv, rv)
    if lc == "String":
        lv, rv = lv.encode("utf-16-be", "surrogatepass"), rv.encode("utf-16-be", "surrogatepass")
    return (lv > rv) - (lv < rv)


class JavaModel:
    """Evaluates a generated AST the way RocketMQ's expression classes do."""

    def __init__(self, props: Mapping[str, str] | None) -> None:
        self.props = props or {}

    def matches(self, ast: tuple[Any, ...]) -> bool:
        try:
            return self.boolean(ast) is True
        except JavaThrows:
            return False

    def value(self, ast: tuple[Any, ...]) -> JVal | None:
        tag = ast[0]
        if tag in ("prop", "boolprop"):  # "(a)" as an operand is the property, not a cast
            v = self.props.get(ast[1])
            return None if v is None else ("String", v)
        if tag == "lit":
            return (ast[1], ast[2]) if ast[2] is not None else None
        if tag == "neg":
            inner = self.value(ast[1])
            if inner is None or inner[0] not in ("Integer", "Long", "Double"):
                return None
            return (inner[0], -inner[1])
        b = self.boolean(ast)
        return None if b is None else ("Boolean", b)

    def equal(self, left: tuple[Any, ...], right: tuple[Any, ...]) -> bool | None:
        lv, rv = self.value(left), self.value(right)
        if (lv is None) != (rv is None):
            return None if lv is None else False
        if lv is None or lv == rv:
            return True
        return java_compare(lv, rv) == 0  # type: ignore[arg-type]

    def order(self, op: str, left: tuple[Any, ...], right: tuple[Any, ...]) -> bool | None:
        lv = self.value(left)
        if lv is None:
            return None
        rv = self.value(right)
        if rv is None:
            return None
        if lv[0] == rv[0] == "String":
            c = java_double_compare(java_double_valueof(lv[1]), java_double_valueof(rv[1]))
        else:
            c = java_compare(lv, rv)
        return {"<": c < 0, "<=": c <= 0, ">": c > 0, ">=": c >= 0}[op]

    @staticmethod
    def negate(b: bool | None) -> bool | None:
        return None if b is None else not b

    def boolean(self, ast: tuple[Any, ...]) -> bool | None:
        tag = ast[0]
        if tag == "and":
            left = self.boolean(ast[1])
            if left is False:
                return False
            right = self.boolean(ast[2])
            if right is False:
                return False
            return None if None in (left, right) else True
        if tag == "or":
            left = self.boolean(ast[1])
            if left is True:
                return True
            right = self.boolean(ast[2])
            if right is True:
                return True
            return None if None in (left, right) else False
        if tag == "not":
            return self.negate(self.boolean(ast[1]))
        if tag == "boollit":
            return ast[1]
        if tag == "boolprop":
            return None if self.props.get(ast[1]) is None else False
        if tag == "eq":
            return self.equal(ast[1], ast[2])
        if tag == "ne":
            return self.negate(self.equal(ast[1], ast[2]))
        if tag == "cmp":
            return self.order(ast[1], ast[2], ast[3])
        if tag == "between":
            _, value, low, high, negated = ast
            if negated:
                ast_or = ("or", ("cmp", "<", value, low), ("cmp", ">", value, high))
                return self.boolean(ast_or)
            return self.boolean(("and", ("cmp", ">=", value, low), ("cmp", "<=", value, high)))
        if tag == "in":
            v = self.props.get(ast[1])
            return None if v is None else ((v in ast[2]) != ast[3])
        if tag == "like":
            _, op, operand, search, negated = ast
            if not search:
                return False
            v = self.value(operand)
            if v is None or v[0] != "String":
                return False
            found = {
                "CONTAINS": search in v[1],
                "STARTSWITH": v[1].startswith(search),
                "ENDSWITH": v[1].endswith(search),
            }[op]
            return found != negated
        if tag == "isnull":
            is_null = self.value(ast[1]) is None
            return (not is_null) if ast[2] else is_null
        raise AssertionError(tag)


# --- generating valid expressions and rendering them to SQL text ---

NAMES = ["a", "b", "c"]
STRING_POOL = [
    "",
    "0",
    "1",
    "-1",
    "2",
    "10",
    "+3",
    "007",
    "1.5",
    "-2.5",
    "1e3",
    "1E3",
    " 4 ",
    "5.",
    ".5",
    "2f",
    "3D",
    "NaN",
    "-NaN",
    "Infinity",
    "-Infinity",
    "true",
    "TRUE",
    "false",
    "abc",
    "a'b",
    "2147483647",
    "2147483648",
    "-2147483649",
    "9223372036854775807",
    "9223372036854775808",
    "99999999999999999999",
    "-0",
    "-0.0",
    "0.0",
    "0x10",
    "0x1p3",
    "1_000",
    "\u0661\u0662",
    "\t7\n",
    "x1",
    "1x",
    "中文",
    "😀",
]
SEARCH_POOL = ["", "a", "1", "x1", "'", "中", "😀", ".", "0"]

prop_ast = st.builds(lambda n: ("prop", n), st.sampled_from(NAMES))
int_lit = st.sampled_from([0, 1, 2, 3, 5, 7, 10, 100, 2147483647]).map(
    lambda v: ("lit", "Integer", v)
)
long_lit = st.sampled_from([2147483648, 3000000000, 9223372036854775807]).map(
    lambda v: ("lit", "Long", v)
)
double_lit = st.sampled_from([0.0, 0.5, 1.5, 2.0, 3.14, 1e3, 1e-3, 1e20]).map(
    lambda v: ("lit", "Double", v)
)
number_lit = st.one_of(int_lit, long_lit, double_lit)
string_lit = st.sampled_from(STRING_POOL[:30]).map(lambda v: ("lit", "String", v))
bool_lit = st.sampled_from([True, False]).map(lambda v: ("lit", "Boolean", v))


def orderable(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Operands RocketMQ accepts around <, >, BETWEEN: no string/boolean literals, no boolean
    expressions (negations of anything are allowed)."""
    return st.one_of(
        prop_ast,
        number_lit,
        st.builds(lambda x: ("neg", x), st.one_of(prop_ast, number_lit, inner)),
    )


def boolean_asts() -> st.SearchStrategy[Any]:
    def extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        operand = st.one_of(
            prop_ast,
            number_lit,
            string_lit,
            bool_lit,
            inner,
            st.builds(lambda x: ("neg", x), st.one_of(prop_ast, number_lit)),
        )
        order_operand = orderable(st.one_of(string_lit, inner))

        def eq_pair(left: Any, right: Any) -> Any:
            # RocketMQ rejects NULL operands and a boolean literal left of another literal.
            left, right = (("prop", "a") if x == ("boollit", None) else x for x in (left, right))

            def is_bool_literal(x: Any) -> bool:
                return x[0] == "boollit" or (x[0] == "lit" and x[1] == "Boolean")

            if (
                is_bool_literal(left)
                and right[0] in ("lit", "boollit")
                and not is_bool_literal(right)
            ):
                return (right, left)
            return (left, right)

        def between(value: Any, low: Any, high: Any, negated: bool) -> Any:
            if low[0] == high[0] == "lit" and java_compare(high[1:], low[1:]) < 0:
                low, high = high, low
            return ("between", value, low, high, negated)

        return st.one_of(
            st.builds(
                lambda op, lr: (op, *lr),
                st.sampled_from(["eq", "ne"]),
                st.builds(eq_pair, operand, operand),
            ),
            st.builds(
                lambda op, x, y: ("cmp", op, x, y),
                st.sampled_from(["<", "<=", ">", ">="]),
                order_operand,
                order_operand,
            ),
            st.builds(
                between,
                order_operand,
                st.one_of(prop_ast, number_lit),
                st.one_of(prop_ast, number_lit),
                st.booleans(),
            ),
            st.builds(
                lambda n, vs, neg: ("in", n, tuple(vs), neg),
                st.sampled_from(NAMES),
                st.lists(st.sampled_from(STRING_POOL), min_size=1, max_size=4),
                st.booleans(),
            ),
            st.builds(
                lambda op, x, s, neg: ("like", op, x, s, neg),
                st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]),
                st.one_of(prop_ast, string_lit, inner, number_lit),
                st.sampled_from(SEARCH_POOL),
                st.booleans(),
            ),
            st.builds(lambda x, neg: ("isnull", x, neg), operand, st.booleans()),
            st.builds(lambda x, y: ("and", x, y), inner, inner),
            st.builds(lambda x, y: ("or", x, y), inner, inner),
            st.builds(lambda x: ("not", x), inner),
        )

    leaves = st.one_of(
        st.builds(lambda n: ("boolprop", n), st.sampled_from(NAMES)),
        st.sampled_from([True, False, None]).map(lambda v: ("boollit", v)),
        st.builds(
            lambda n, v: ("eq", ("prop", n), v),
            st.sampled_from(NAMES),
            st.one_of(string_lit, number_lit),
        ),
        st.builds(
            lambda op, n, v: ("cmp", op, ("prop", n), v),
            st.sampled_from(["<", ">="]),
            st.sampled_from(NAMES),
            number_lit,
        ),
    )
    return st.recursive(leaves, extend, max_leaves=10)


class Renderer:
    def __init__(self, upper: list[bool]) -> None:
        self.upper = upper
        self.i = 0

    def kw(self, word: str) -> str:
        self.i += 1
        return word.upper() if self.upper[self.i % len(self.upper)] else word.lower()

    def literal(self, cls: str, v: Any) -> str:
        if cls == "String":
            return "'" + v.replace("'", "''") + "'"
        if cls == "Boolean":
            return self.kw("TRUE" if v else "FALSE")
        return repr(v) if cls == "Double" else str(v)

    def value(self, ast: Any) -> str:
        tag = ast[0]
        if tag == "prop":
            return ast[1]
        if tag == "lit":
            return self.literal(ast[1], ast[2])
        if tag == "neg":
            return "-(" + self.value(ast[1]) + ")"
        return "(" + self.boolean(ast) + ")"

    def boolean(self, ast: Any) -> str:
        tag = ast[0]
        b = self.value
        if tag in ("and", "or"):
            return f"({self.boolean(ast[1])}) {self.kw(tag)} ({self.boolean(ast[2])})"
        if tag == "not":
            return f"{self.kw('not')} ({self.boolean(ast[1])})"
        if tag == "boollit":
            return self.kw({True: "TRUE", False: "FALSE", None: "NULL"}[ast[1]])
        if tag == "boolprop":
            return ast[1]
        if tag in ("eq", "ne"):
            return f"{b(ast[1])} {'=' if tag == 'eq' else '<>'} {b(ast[2])}"
        if tag == "cmp":
            return f"{b(ast[2])} {ast[1]} {b(ast[3])}"
        if tag == "between":
            _, value, low, high, negated = ast
            kw = (self.kw("not") + " " if negated else "") + self.kw("between")
            return f"{b(value)} {kw} {b(low)} {self.kw('and')} {b(high)}"
        if tag == "in":
            items = ", ".join(self.literal("String", v) for v in ast[2])
            return f"{ast[1]} {self.kw('not') + ' ' if ast[3] else ''}{self.kw('in')} ({items})"
        if tag == "like":
            _, op, operand, search, negated = ast
            neg = self.kw("not") + " " if negated else ""
            return f"{b(operand)} {neg}{self.kw(op)} {self.literal('String', search)}"
        if tag == "isnull":
            middle = self.kw("is") + (" " + self.kw("not") if ast[2] else "")
            return f"{b(ast[1])} {middle} {self.kw('null')}"
        raise AssertionError(tag)


property_rows = st.lists(
    st.one_of(
        st.none(),
        st.dictionaries(
            st.sampled_from(NAMES),
            st.one_of(st.sampled_from(STRING_POOL), st.text(max_size=3)),
            max_size=3,
        ),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ast=boolean_asts(), rows=property_rows, upper=st.lists(st.booleans(), min_size=1, max_size=5)
)
def test_sql_mask_equals_matches_equals_java_model(
    ast: Any, rows: list[dict[str, str] | None], upper: list[bool]
) -> None:
    expression = Renderer(upper).boolean(ast)
    sql = SqlFilter.parse(expression)
    model = [JavaModel(row).matches(ast) for row in rows]
    one_by_one = [sql.matches(row) for row in rows]
    vectorized = sql.mask(props_array(rows)).to_pylist()
    assert one_by_one == model, expression
    assert vectorized == one_by_one, expression


@settings(max_examples=200, deadline=None)
@given(
    value=st.one_of(st.sampled_from(STRING_POOL), st.text(max_size=6)),
    literal=st.one_of(number_lit, string_lit, bool_lit),
    op=st.sampled_from(["=", "<>", "<", "<=", ">", ">="]),
)
def test_sql_single_comparison_against_java_model(value: str, literal: Any, op: str) -> None:
    if op not in ("=", "<>") and literal[1] not in ("Integer", "Long", "Double"):
        literal = ("lit", "Double", 1.5)
    ast: Any = {"=": ("eq",), "<>": ("ne",)}.get(op, ("cmp", op))
    ast = (*ast, ("prop", "a"), literal)
    expression = Renderer([True]).boolean(ast)
    row = {"a": value}
    assert check(expression, row) is JavaModel(row).matches(ast), (expression, value)
