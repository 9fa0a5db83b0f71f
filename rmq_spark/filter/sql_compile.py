"""SQL92 filter compiler: lark tree -> plain tuples, with RocketMQ's parse-time checks.

:func:`_compile_sql` parses an expression and compiles it to a tree of plain tuples
(picklable, shipped to Spark executors) and the set of property names it reads.  Expressions are
at most ``MAX_EXPRESSION_CHARS`` long, and the outcome of the last 256 is cached, failures like
successes: a client repeating a bad expression costs one parse, not one per request.  The compiler
rejects, with the position of the offending subexpression, what RocketMQ rejects when it builds
the expression: non-boolean conditions, ``NULL`` compared with ``=``, booleans and strings
ordered with ``<``, empty or reversed constant ``BETWEEN`` ranges, ``IN`` without a property,
out-of-range literals and too deep nesting.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import cast

from lark import Token, Tree
from lark.exceptions import UnexpectedInput

from rmq_spark.errors import FilterExpressionError
from rmq_spark.filter._common import (
    _DOUBLE_MAX,
    _INT32_MAX,
    _INT64_MAX,
    Node,
    Plan,
    _check_expression_size,
    _int32,
)
from rmq_spark.filter.sql_eval import _compare
from rmq_spark.filter.sql_parse import _parser, _sql_error, _syntax_error

_MAX_DEPTH = 200

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

# Node and Plan (the types of the above) are defined in _common: the evaluators share them.

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

    def error(self, reason: str, where: _Expr | Tree[Token] | Token) -> FilterExpressionError:
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
            numeric = low.kind in _NUMERIC_KINDS and high.kind in _NUMERIC_KINDS
            if (
                numeric
                and _compare(_plan(high.kind, low.kind, False), high.node[2], low.node[2]) < 0
            ):
                raise self.error("BETWEEN lower bound is greater than upper bound", low)
        if negated:
            first, second = self.ordering("<", value, low), self.ordering(">", value, high)
            return self.boolean(("or", first.node, second.node), value)
        first, second = self.ordering(">=", value, low), self.ordering("<=", value, high)
        return self.boolean(("and", first.node, second.node), value)

    # tree walk -------------------------------------------------------------------------------

    def compile(self, tree: Tree[Token] | Token, depth: int = 0) -> _Expr:
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
            return self.decimal(cast(Token, kids[0]), line, column)  # the grammar's one token
        if rule == "float_lit":
            number = float(str(kids[0]))
            if number > _DOUBLE_MAX:
                raise self.error(f"{kids[0]} is greater than {_DOUBLE_MAX!r}", tree)
            return _Expr(("const", "double", number), "double", line, column, constant=True)
        if rule in ("true_lit", "false_lit", "null_lit"):
            value = {"true_lit": True, "false_lit": False, "null_lit": None}[rule]
            kind = "null" if value is None else "bool"
            node: Node = ("const", kind, value)
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
            node = ("isnull", child.node)
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
        digits = text[:-1] if text[-1] in "lL" else text
        # a long has at most 19 digits: refuse longer ones before converting (Python refuses to
        # convert more than 4300 digits, and the conversion is quadratic below that)
        if len(digits) > 19 or int(digits) > _INT64_MAX:
            raise self.error(f"{text} is out of the range of a long", token)
        value = int(digits)
        kind = "int" if value <= _INT32_MAX else "long"
        return _Expr(("const", kind, value), kind, line, column, constant=True)


def _unquote(token: Token | Tree[Token]) -> str:
    return str(token)[1:-1].replace("''", "'")


_CACHE_ENTRIES = 256
_cache: OrderedDict[str, tuple[Node, frozenset[str]] | FilterExpressionError] = OrderedDict()
_cache_lock = threading.Lock()


def _compile_sql(text: str) -> tuple[Node, frozenset[str]]:
    """(tree, property names) of ``text``; FilterExpressionError when it is malformed or too long."""
    _check_expression_size("SQL92", text)
    with _cache_lock:
        outcome = _cache.get(text)
        if outcome is not None:
            _cache.move_to_end(text)
    if outcome is None:
        try:
            outcome = _compile_uncached(text)
        except FilterExpressionError as e:
            outcome = e
        with _cache_lock:
            _cache[text] = outcome
            while len(_cache) > _CACHE_ENTRIES:
                _cache.popitem(last=False)
    if isinstance(outcome, FilterExpressionError):
        raise FilterExpressionError(str(outcome))
    return outcome


def _compile_uncached(text: str) -> tuple[Node, frozenset[str]]:
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc) from None
    except RecursionError:
        raise FilterExpressionError("invalid SQL92 filter expression: nested too deeply") from None
    compiler = _Compiler(text)
    try:
        top = compiler.compile(tree)
    except RecursionError:
        raise FilterExpressionError("invalid SQL92 filter expression: nested too deeply") from None
    return compiler.as_boolean(top).node, frozenset(compiler.names)
