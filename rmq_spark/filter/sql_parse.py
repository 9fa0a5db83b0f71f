"""SQL92 filter syntax: the ``lark`` grammar and syntax error messages with positions.

:func:`_parser` parses an expression into a lark tree (``sql_compile`` turns it into the plain
tuples the evaluators run); :func:`_sql_error` builds a :class:`FilterExpressionError` naming the
line and column with a caret excerpt, and :func:`_syntax_error` does so for lark's exceptions.
"""

from __future__ import annotations

import functools
import re

from lark import Lark
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from rmq_spark.errors import FilterExpressionError

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
        at = exc.pos_in_stream if exc.pos_in_stream is not None else len(text)
        char = text[at] if at < len(text) else ""
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
