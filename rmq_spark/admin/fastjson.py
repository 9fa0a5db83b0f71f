"""Reading the bodies a RocketMQ broker writes with fastjson, which are not always JSON: a map keyed
by objects (``Map<MessageQueue, TopicOffset>`` in TopicStatsTable, ConsumeStats, ResetOffsetBody)
is written with the key object in place of a string, and numeric keys may go unquoted.

:func:`loads` parses such text: an object whose keys are all strings becomes a dict, one with
an object or number key a list of ``(key, value)`` pairs.

The text comes from a server, so it is read as a hostile peer's: nesting past ``MAX_DEPTH`` (what
RocketMQ writes nests five deep at most) is a :class:`FastjsonError`, as is text that is not
UTF-8, never a ``RecursionError``.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["MAX_DEPTH", "FastjsonError", "loads"]

MAX_DEPTH = 64

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_WS = re.compile(r"[ \t\n\r]*")
_scanstring = json.decoder.scanstring  # type: ignore[attr-defined]


class FastjsonError(ValueError):
    pass


def loads(body: bytes | str) -> Any:
    try:
        text = body.decode("utf-8") if isinstance(body, (bytes, bytearray)) else body
    except UnicodeDecodeError as e:
        raise FastjsonError(f"not UTF-8 at byte {e.start}") from None
    value, end = _value(text, _WS.match(text, 0).end(), 0)  # type: ignore[union-attr]
    end = _WS.match(text, end).end()  # type: ignore[union-attr]
    if end != len(text):
        raise FastjsonError(f"extra text at position {end}")
    return value


def _value(s: str, i: int, depth: int) -> tuple[Any, int]:
    if i >= len(s):
        raise FastjsonError("unexpected end of the document")
    c = s[i]
    if c in "{[" and depth >= MAX_DEPTH:
        raise FastjsonError(f"nested deeper than {MAX_DEPTH} levels at position {i}")
    if c == "{":
        return _object(s, i + 1, depth + 1)
    if c == "[":
        return _array(s, i + 1, depth + 1)
    if c == '"':
        return _string(s, i + 1)
    for word, val in (("true", True), ("false", False), ("null", None)):
        if s.startswith(word, i):
            return val, i + len(word)
    m = _NUMBER.match(s, i)
    if m is None:
        raise FastjsonError(f"unexpected {c!r} at position {i}")
    text = m.group()
    try:
        return (float(text) if any(ch in text for ch in ".eE") else int(text)), m.end()
    except ValueError:  # more digits than int() takes
        raise FastjsonError(f"number of {len(text)} characters at position {i}") from None


def _string(s: str, i: int) -> tuple[str, int]:
    try:
        return _scanstring(s, i)
    except ValueError as e:
        raise FastjsonError(
            f"bad string at position {i - 1}: {getattr(e, 'msg', 'does not parse')}"
        ) from None


def _skip(s: str, i: int) -> int:
    return _WS.match(s, i).end()  # type: ignore[union-attr]


def _object(s: str, i: int, depth: int) -> tuple[Any, int]:
    pairs: list[tuple[Any, Any]] = []
    i = _skip(s, i)
    if i < len(s) and s[i] == "}":
        return {}, i + 1
    while True:
        key, i = _value(s, _skip(s, i), depth)
        i = _skip(s, i)
        if i >= len(s) or s[i] != ":":
            raise FastjsonError(f"expected ':' at position {i}")
        val, i = _value(s, _skip(s, i + 1), depth)
        pairs.append((key, val))
        i = _skip(s, i)
        if i < len(s) and s[i] == ",":
            i += 1
            continue
        if i < len(s) and s[i] == "}":
            i += 1
            break
        raise FastjsonError(f"expected ',' or '}}' at position {i}")
    if all(isinstance(k, str) for k, _v in pairs):
        return dict(pairs), i
    return pairs, i


def _array(s: str, i: int, depth: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    i = _skip(s, i)
    if i < len(s) and s[i] == "]":
        return out, i + 1
    while True:
        val, i = _value(s, _skip(s, i), depth)
        out.append(val)
        i = _skip(s, i)
        if i < len(s) and s[i] == ",":
            i += 1
            continue
        if i < len(s) and s[i] == "]":
            return out, i + 1
        raise FastjsonError(f"expected ',' or ']' at position {i}")
