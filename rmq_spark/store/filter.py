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

Deliberate differences from the Java code: decimal literals ``0.0`` and other values below
``Double.MIN_VALUE`` are accepted (RocketMQ rejects them); a trailing ``--`` comment needs no
newline; integer conversion accepts ASCII digits only (Java's ``Character.digit`` also takes
other Unicode decimal digits) and ``Double.valueOf``'s hexadecimal form (``0x1p3``) counts as
not a number.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from rmq_spark.errors import FilterExpressionError
from rmq_spark.store.message import java_string_hash

__all__ = [
    "EXPRESSION_TYPE_SQL92",
    "EXPRESSION_TYPE_TAG",
    "SUB_ALL",
    "SqlFilter",
    "TagFilter",
    "java_string_hash",
    "make_filter",
]

EXPRESSION_TYPE_TAG = "TAG"
EXPRESSION_TYPE_SQL92 = "SQL92"
SUB_ALL = "*"

# Java String.trim() strips every character <= U+0020.
_JAVA_TRIM_CHARS = "".join(map(chr, range(0x21)))


def _int32(value: int) -> int:
    """Java ``long.intValue()``: keep the low 32 bits, sign-extended."""
    return ((value + 0x80000000) & 0xFFFFFFFF) - 0x80000000


# ---------------------------------------------------------------------------------------------
# TAG
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TagFilter:
    """A parsed TAG subscription expression (``*``, ``TagA``, ``TagA || TagB``)."""

    expression: str
    match_all: bool
    tags: frozenset[str] = frozenset()
    codes: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, expression: str | None) -> TagFilter:
        """Build the filter as RocketMQ's ``FilterAPI.buildSubscriptionData`` does."""
        if expression is None or expression == "" or expression == SUB_ALL:
            return cls(SUB_ALL, True)
        pieces = (piece.strip(_JAVA_TRIM_CHARS) for piece in expression.split("||"))
        tags = frozenset(piece for piece in pieces if piece)
        return cls(expression, False, tags, frozenset(java_string_hash(t) for t in tags))

    def matches_code(self, tags_code: int) -> bool:
        """Broker-side check of one ConsumeQueue ``tagsCode`` (compared as Java ``intValue``)."""
        return self.match_all or _int32(int(tags_code)) in self.codes

    def matches(self, tag: str | None) -> bool:
        """Exact re-check on a message's tag string; an untagged message only matches ``*``."""
        return self.match_all or (tag is not None and tag in self.tags)

    def mask_codes(self, tags_codes: np.ndarray) -> np.ndarray:
        """:meth:`matches_code` over an integer array; returns a bool array."""
        codes = np.asarray(tags_codes)
        if self.match_all:
            return np.ones(codes.shape, dtype=bool)
        wanted = np.array(sorted(self.codes), dtype=np.int32)
        return np.isin(codes.astype(np.int64).astype(np.int32), wanted)

    def mask(self, tags: pa.Array | pa.ChunkedArray) -> pa.BooleanArray:
        """:meth:`matches` over a string array; a null tag matches only when ``match_all``."""
        if isinstance(tags, pa.ChunkedArray):
            return _concat_masks([self.mask(chunk) for chunk in tags.chunks])
        if self.match_all:
            return pa.array(np.ones(len(tags), dtype=bool))
        if pa.types.is_dictionary(tags.type):
            tags = tags.dictionary_decode()
        if pa.types.is_null(tags.type) or not self.tags:
            return pa.array(np.zeros(len(tags), dtype=bool))
        found = pc.is_in(tags, value_set=pa.array(sorted(self.tags), type=tags.type))
        return pc.fill_null(found, False)


# ---------------------------------------------------------------------------------------------
# SQL92: grammar
# ---------------------------------------------------------------------------------------------

# Mirrors SelectorParser.jj: or > and > equality (=, <>, IS [NOT] NULL) > comparison
# (<, >, BETWEEN, IN, CONTAINS, ...) > unary (+, -, NOT) > primary.  Operators chain to the
# left inside one level, as the JavaCC loops do.
_GRAMMAR = r"""
?start: or_expr

?or_expr: and_expr
        | or_expr _OR and_expr                           -> or_op

?and_expr: eq_expr
         | and_expr _AND eq_expr                         -> and_op

?eq_expr: cmp_expr
        | eq_expr _EQ cmp_expr                           -> eq_op
        | eq_expr _NE cmp_expr                           -> ne_op
        | eq_expr _IS NULL                               -> is_null
        | eq_expr _IS _NOT NULL                          -> is_not_null

?cmp_expr: unary
         | cmp_expr _GT unary                            -> gt
         | cmp_expr _GE unary                            -> ge
         | cmp_expr _LT unary                            -> lt
         | cmp_expr _LE unary                            -> le
         | cmp_expr _CONTAINS STRING                     -> contains
         | cmp_expr _NOT _CONTAINS STRING                -> not_contains
         | cmp_expr _STARTSWITH STRING                   -> startswith
         | cmp_expr _NOT _STARTSWITH STRING              -> not_startswith
         | cmp_expr _ENDSWITH STRING                     -> endswith
         | cmp_expr _NOT _ENDSWITH STRING                -> not_endswith
         | cmp_expr _BETWEEN unary _AND unary            -> between
         | cmp_expr _NOT _BETWEEN unary _AND unary       -> not_between
         | cmp_expr _IN _LPAR STRING (_COMMA STRING)* _RPAR        -> in_list
         | cmp_expr _NOT _IN _LPAR STRING (_COMMA STRING)* _RPAR   -> not_in_list

?unary: _PLUS unary
      | _MINUS unary                                     -> neg
      | _NOT unary                                       -> not_op
      | primary

?primary: STRING                                         -> string_lit
        | DECIMAL                                        -> decimal_lit
        | FLOAT                                          -> float_lit
        | TRUE                                           -> true_lit
        | FALSE                                          -> false_lit
        | NULL                                           -> null_lit
        | ID                                             -> prop
        | _LPAR or_expr _RPAR

_OR: "or"i
_AND: "and"i
_NOT: "not"i
_BETWEEN: "between"i
_IN: "in"i
_IS: "is"i
_CONTAINS: "contains"i
_STARTSWITH: "startswith"i
_ENDSWITH: "endswith"i
TRUE: "true"i
FALSE: "false"i
NULL: "null"i

_EQ: "="
_NE: "<>"
_GT: ">"
_GE: ">="
_LT: "<"
_LE: "<="
_PLUS: "+"
_MINUS: "-"
_LPAR: "("
_RPAR: ")"
_COMMA: ","

FLOAT.2: /[0-9]+\.[0-9]*(e[+-]?[0-9]+)?|\.[0-9]+(e[+-]?[0-9]+)?|[0-9]+e[+-]?[0-9]+/i
DECIMAL: /0|[1-9][0-9]*l?/i
STRING: /'(''|[^'])*'/
ID: /[a-z_$][a-z0-9_$]*/i

WS: /[ \t\n\r\f]+/
LINE_COMMENT: /--[^\n\r]*/
BLOCK_COMMENT: /\/\*[^*]*\*+([^\/*][^*]*\*+)*\//
%ignore WS
%ignore LINE_COMMENT
%ignore BLOCK_COMMENT
"""

_TOKEN_DESCRIPTIONS = {
    "STRING": "a string literal",
    "DECIMAL": "a number",
    "FLOAT": "a number",
    "ID": "a property name",
    "$END": "the end of the expression",
}

_MAX_DEPTH = 200
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_DOUBLE_MAX = 1.7976931348623157e308


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(
        _GRAMMAR,
        parser="lalr",
        lexer="basic",  # keywords stay reserved everywhere, as in JavaCC
        propagate_positions=True,
        maybe_placeholders=False,
        g_regex_flags=re.ASCII,
    )


def _excerpt(text: str, line: int, column: int) -> str:
    """The source line holding (line, column), 1-based, with a caret under the column."""
    lines = text.split("\n")
    source = lines[line - 1] if 0 < line <= len(lines) else ""
    source = source.rstrip("\r").replace("\t", " ")
    start = max(0, column - 1 - 50)
    snippet = source[start : start + 80]
    return f"    {snippet}\n    {' ' * (column - 1 - start)}^"


def _end_position(text: str) -> tuple[int, int]:
    lines = text.split("\n")
    return len(lines), len(lines[-1]) + 1


def _sql_error(text: str, reason: str, line: int, column: int) -> FilterExpressionError:
    return FilterExpressionError(
        f"invalid SQL92 filter expression: {reason} at line {line}, column {column}:\n"
        f"{_excerpt(text, line, column)}"
    )


def _describe_expected(expected: set[str]) -> str:
    names = set()
    for name in expected:
        if name in _TOKEN_DESCRIPTIONS:
            names.add(_TOKEN_DESCRIPTIONS[name])
            continue
        try:
            pattern = _parser().get_terminal(name).pattern
        except KeyError:
            names.add(name)
            continue
        names.add(f"'{pattern.value.upper()}'" if pattern.type == "str" else name)
    return ", ".join(sorted(names))


def _syntax_error(text: str, exc: UnexpectedInput) -> FilterExpressionError:
    if isinstance(exc, UnexpectedCharacters):
        char = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else ""
        reason = "unterminated string literal" if char == "'" else f"unexpected character {char!r}"
        return _sql_error(text, reason, exc.line, exc.column)
    if isinstance(exc, UnexpectedToken):
        expected = f" (expected {_describe_expected(set(exc.expected))})" if exc.expected else ""
        if exc.token.type == "$END":
            line, column = _end_position(text)
            return _sql_error(text, f"unexpected end of expression{expected}", line, column)
        reason = f"unexpected {exc.token.value!r}{expected}"
        return _sql_error(text, reason, exc.line, exc.column)
    line, column = _end_position(text)
    return _sql_error(text, "unexpected end of expression", line, column)


# ---------------------------------------------------------------------------------------------
# SQL92: compiler (lark tree -> plain tuples, with RocketMQ's parse-time checks)
# ---------------------------------------------------------------------------------------------
#
# Value kinds are static: "str" (property or string literal), "int" (Java Integer literal),
# "long" (Java Long literal), "double", "bool" (boolean literal or boolean expression) and
# "null" (the NULL literal, or a negation of something that is not a number).
#
# Compiled nodes (plain tuples):
#   ("const", kind, value)                  ("prop", name)
#   ("neg", child)                          -> always null; child is evaluated for its errors
#   ("cast", name)                          -> a property used as a boolean
#   ("not", child)  ("and", l, r)  ("or", l, r)  ("isnull", child)
#   ("eq", plan, l, r)                      -> RocketMQ's doCreateEqual
#   ("cmp", op, plan, l, r)                 -> op in < <= > >=
#   ("in", name, values, negated)
#   ("match", op, child_kind, child, search, negated)  -> op in contains/startswith/endswith
# A plan (domain, left_conversion, right_conversion) is the outcome of ComparisonExpression's
# type promotion for the two static kinds; see _plan.

Node = tuple[Any, ...]
Plan = tuple[str, Union[str, None], Union[str, None]]

_NUMERIC_KINDS = ("int", "long", "double")
_DOMAIN = {"int": "int", "long": "int", "double": "double", "bool": "bool", "str": "str"}
_PARSE_AS = {"int": "int32", "long": "int64", "double": "double"}


def _plan(left: str, right: str, ordering: bool) -> Plan:
    """How ``ComparisonExpression`` compares a ``left``-kind value with a ``right``-kind one.

    Domains: "str", "int", "double", "bool" (compare after the conversions), "less" (the types
    are incompatible and Java's ``__compare`` answers -1), "fail" (Java throws), "never" (one
    side is always null, so no comparison happens).  Conversions: "int32"/"int64"/"double"
    (Java ``Integer``/``Long``/``Double.valueOf`` of a string, may fail), "bool"
    (``Boolean.valueOf``), "float" (widen an integer to a double)."""
    if left == "null" or right == "null":
        return ("never", None, None)
    if left == right:
        if left == "str" and ordering:
            return ("double", "double", "double")
        return (_DOMAIN[left], None, None)
    if left == "bool":
        return ("fail" if right == "str" else "less", None, None)  # ClassCastException
    if right == "bool":
        return ("bool", "bool", None) if left == "str" else ("less", None, None)
    if left == "str":
        return (_DOMAIN[right], _PARSE_AS[right], None)
    if right == "str":
        return (_DOMAIN[left], None, _PARSE_AS[left])
    if "double" in (left, right):
        return (
            "double",
            None if left == "double" else "float",
            None if right == "double" else "float",
        )
    return ("int", None, None)


@dataclass(frozen=True)
class _Expr:
    """A compiled subexpression plus what RocketMQ's parse-time checks need to know."""

    node: Node
    kind: str
    line: int
    column: int
    constant: bool = False  # a Java ConstantExpression (a literal, not a negation)
    boolean: bool = False  # a Java BooleanExpression
    prop: bool = False  # a Java PropertyExpression


class _Compiler:
    def __init__(self, text: str) -> None:
        self.text = text
        self.names: set[str] = set()

    def error(self, reason: str, where: _Expr | Tree | Token) -> FilterExpressionError:
        if isinstance(where, _Expr):
            line, column = where.line, where.column
        elif isinstance(where, Token):
            line, column = where.line or 1, where.column or 1
        else:
            line, column = where.meta.line, where.meta.column
        return _sql_error(self.text, reason, line, column)

    # RocketMQ's checks -----------------------------------------------------------------------

    def as_boolean(self, e: _Expr) -> _Expr:
        if e.boolean:
            return e
        if e.prop:
            return _Expr(("cast", e.node[1]), "bool", e.line, e.column, boolean=True)
        raise self.error("expression will not result in a boolean value", e)

    def check_orderable(self, e: _Expr) -> None:
        if (e.constant and e.kind not in _NUMERIC_KINDS) or e.boolean:
            raise self.error("value cannot be compared with <, <=, >, >= or BETWEEN", e)

    def check_equatable(self, left: _Expr, right: _Expr) -> None:
        for e in (left, right):
            if e.constant and e.kind == "null":
                raise self.error("NULL cannot be compared, use IS NULL", e)
        if left.constant and right.constant and left.boolean and not right.boolean:
            raise self.error("a boolean cannot be compared with a non-boolean literal", right)

    # builders --------------------------------------------------------------------------------

    def boolean(self, node: Node, at: _Expr) -> _Expr:
        return _Expr(node, "bool", at.line, at.column, boolean=True)

    def equal(self, left: _Expr, right: _Expr) -> _Expr:
        self.check_equatable(left, right)
        plan = _plan(left.kind, right.kind, ordering=False)
        return self.boolean(("eq", plan, left.node, right.node), left)

    def ordering(self, op: str, left: _Expr, right: _Expr) -> _Expr:
        self.check_orderable(left)
        self.check_orderable(right)
        plan = _plan(left.kind, right.kind, ordering=True)
        return self.boolean(("cmp", op, plan, left.node, right.node), left)

    def between(self, value: _Expr, low: _Expr, high: _Expr, negated: bool) -> _Expr:
        if not negated and low.constant and high.constant:
            if low.kind == "null" or high.kind == "null":
                raise self.error("BETWEEN bounds cannot be NULL", low)
            if low.kind in _NUMERIC_KINDS and high.kind in _NUMERIC_KINDS:
                if _compare(_plan(high.kind, low.kind, False), high.node[2], low.node[2]) < 0:
                    raise self.error("BETWEEN lower bound is greater than upper bound", low)
        if negated:
            first, second = self.ordering("<", value, low), self.ordering(">", value, high)
            return self.boolean(("or", first.node, second.node), value)
        first, second = self.ordering(">=", value, low), self.ordering("<=", value, high)
        return self.boolean(("and", first.node, second.node), value)

    # tree walk -------------------------------------------------------------------------------

    def compile(self, tree: Tree | Token, depth: int = 0) -> _Expr:
        if depth > _MAX_DEPTH:
            raise self.error(f"expression nested deeper than {_MAX_DEPTH} levels", tree)
        assert isinstance(tree, Tree), tree
        rule = tree.data
        kids = tree.children
        line, column = tree.meta.line, tree.meta.column

        def sub(i: int) -> _Expr:
            return self.compile(kids[i], depth + 1)

        if rule == "string_lit":
            return _Expr(("const", "str", _unquote(kids[0])), "str", line, column, constant=True)
        if rule == "decimal_lit":
            return self.decimal(kids[0], line, column)
        if rule == "float_lit":
            value = float(str(kids[0]))
            if value > _DOUBLE_MAX:
                raise self.error(f"{kids[0]} is greater than {_DOUBLE_MAX!r}", tree)
            return _Expr(("const", "double", value), "double", line, column, constant=True)
        if rule in ("true_lit", "false_lit", "null_lit"):
            value = {"true_lit": True, "false_lit": False, "null_lit": None}[rule]
            kind = "null" if value is None else "bool"
            node = ("const", kind, value)
            return _Expr(node, kind, line, column, constant=True, boolean=True)
        if rule == "prop":
            name = str(kids[0])
            self.names.add(name)
            return _Expr(("prop", name), "str", line, column, prop=True)
        if rule == "neg":
            child = sub(0)
            if child.node[0] == "const" and child.kind in _NUMERIC_KINDS:
                negated = -child.node[2]
                if child.kind == "int":
                    negated = _int32(negated)
                return _Expr(("const", child.kind, negated), child.kind, line, column)
            return _Expr(("neg", child.node), "null", line, column)
        if rule == "not_op":
            child = self.as_boolean(sub(0))
            return _Expr(("not", child.node), "bool", line, column, boolean=True)
        if rule in ("and_op", "or_op"):
            left, right = self.as_boolean(sub(0)), self.as_boolean(sub(1))
            return self.boolean((rule[:-3], left.node, right.node), left)
        if rule == "eq_op":
            return self.equal(sub(0), sub(1))
        if rule == "ne_op":
            eq = self.equal(sub(0), sub(1))
            return self.boolean(("not", eq.node), eq)
        if rule in ("is_null", "is_not_null"):
            child = sub(0)
            node: Node = ("isnull", child.node)
            return self.boolean(node if rule == "is_null" else ("not", node), child)
        if rule in ("gt", "ge", "lt", "le"):
            op = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}[rule]
            return self.ordering(op, sub(0), sub(1))
        if rule in ("between", "not_between"):
            return self.between(sub(0), sub(1), sub(2), negated=rule == "not_between")
        if rule in ("in_list", "not_in_list"):
            left = sub(0)
            if not left.prop:
                raise self.error("IN needs a property on its left", left)
            values = tuple(_unquote(k) for k in kids[1:])
            return self.boolean(("in", left.node[1], values, rule == "not_in_list"), left)
        if rule.endswith(("contains", "startswith", "endswith")):
            left = sub(0)
            negated = rule.startswith("not_")
            op = rule[4:] if negated else rule
            node = ("match", op, left.kind, left.node, _unquote(kids[1]), negated)
            return self.boolean(node, left)
        raise AssertionError(f"unhandled grammar rule {rule}")

    def decimal(self, token: Token, line: int, column: int) -> _Expr:
        text = str(token)
        value = int(text[:-1] if text[-1] in "lL" else text)
        if value > _INT64_MAX:
            raise self.error(f"{text} is out of the range of a long", token)
        kind = "int" if value <= _INT32_MAX else "long"
        return _Expr(("const", kind, value), kind, line, column, constant=True)


def _unquote(token: Token | Tree) -> str:
    return str(token)[1:-1].replace("''", "'")


@functools.lru_cache(maxsize=256)
def _compile_sql(text: str) -> tuple[Node, frozenset[str]]:
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc) from None
    compiler = _Compiler(text)
    top = compiler.compile(tree)
    return compiler.as_boolean(top).node, frozenset(compiler.names)


# ---------------------------------------------------------------------------------------------
# Java conversions, scalar (the vectorized twins are below; both follow the same regexes)
# ---------------------------------------------------------------------------------------------

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
    if value != value:
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


# ---------------------------------------------------------------------------------------------
# Vectorized evaluation over an Arrow map<string, string> column
# ---------------------------------------------------------------------------------------------

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


def _concat_masks(parts: list[pa.Array]) -> pa.BooleanArray:
    if not parts:
        return pa.array([], type=pa.bool_())
    return pa.concat_arrays(parts)


def _check_map_type(array: pa.Array) -> None:
    kind = array.type
    string_like = (pa.types.is_string, pa.types.is_large_string)
    if not (
        pa.types.is_map(kind)
        and any(test(kind.key_type) for test in string_like)
        and any(test(kind.item_type) for test in string_like)
    ):
        raise TypeError(f"SqlFilter.mask needs a map<string, string> array, got {kind}")


# ---------------------------------------------------------------------------------------------
# SQL92: public class
# ---------------------------------------------------------------------------------------------


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

    def mask(self, properties: pa.Array | pa.ChunkedArray) -> pa.BooleanArray:
        """:meth:`matches` for every row of a ``map<string, string>`` column (a null map is an
        empty one); returns a BooleanArray without nulls."""
        if isinstance(properties, pa.ChunkedArray):
            return _concat_masks([self.mask(chunk) for chunk in properties.chunks])
        _check_map_type(properties)
        result = _VectorEvaluator(properties).eval(self.tree)
        return pa.array(result.data & result.valid & ~result.err, type=pa.bool_())


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
