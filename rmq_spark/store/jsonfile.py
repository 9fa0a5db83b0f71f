"""Atomic JSON config files: write a temp file, fsync, rename; keep ``<file>.bak`` of the
previous content and fall back to it when the file is damaged (as RocketMQ's ConfigManager).

A file that parses is read through :class:`JsonObject`, whose typed getters check each value as it
is taken: a wrong type or an out-of-range value is a :class:`~rmq_spark.errors.ConfigError` naming
the file and the key (``config file .../topics.json: key 'topicConfigTable.T.readQueueNums': -5 is
not between 1 and 1024``), never a bare ``TypeError`` from deep inside a loader.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from rmq_spark.errors import ConfigError, CorruptStoreError

_UNQUOTED_INT_KEY = re.compile(r'([{,]\s*)(-?\d+)(\s*:)')


def write_json_atomic(path: str, data: Any) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = json.dumps(data, indent=2, sort_keys=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(path):
        os.replace(path, f"{path}.bak")
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_json(path: str) -> Any | None:
    """The file's content, its ``.bak`` if the file is missing or damaged, or None if neither."""
    errors = []
    for candidate in (path, f"{path}.bak"):
        if not os.path.exists(candidate):
            continue
        try:
            with open(candidate, encoding="utf-8") as f:
                text = f.read()
            # RocketMQ (fastjson) writes integer map keys unquoted
            return json.loads(_UNQUOTED_INT_KEY.sub(r'\1"\2"\3', text))
        except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
            errors.append(f"{candidate}: {e}")
    if errors:
        raise CorruptStoreError("; ".join(errors), path, 0)
    return None


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


class JsonObject:
    """A JSON object read from ``path`` (``key``: where it sits in the file, dotted), with getters
    that check what they return; every failure is a ConfigError naming the file and the key."""

    def __init__(self, path: str, value: Any, key: str = "") -> None:
        self.path = path
        self.key = key
        if not isinstance(value, dict):
            raise self.error("", f"must be a JSON object, not {_kind(value)}")
        self.data: dict[str, Any] = value

    @classmethod
    def load(cls, path: str) -> JsonObject | None:
        """The file's top-level object (see :func:`read_json`), or None when there is no file."""
        data = read_json(path)
        return None if data is None else cls(path, data)

    def _name(self, name: str) -> str:
        return f"{self.key}.{name}" if self.key and name else (self.key or name)

    def error(self, name: str, problem: str) -> ConfigError:
        key = self._name(name)
        return ConfigError(f"config file {self.path}: " + (f"key {key!r}: " if key else "") + problem)

    def __contains__(self, name: str) -> bool:
        return name in self.data

    def obj(self, name: str) -> JsonObject:
        """A nested object (absent or null: an empty one)."""
        value = self.data.get(name)
        return JsonObject(self.path, {} if value is None else value, self._name(name))

    def items(self) -> list[tuple[str, Any]]:
        return list(self.data.items())

    def int(self, name: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
        value = self.data.get(name, default)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(name, f"{value!r} is not an integer")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f"between {lo} and {hi}" if lo is not None and hi is not None else (
                f"at least {lo}" if lo is not None else f"at most {hi}"
            )
            raise self.error(name, f"{value} is not {bounds}")
        return value

    def str(self, name: str, default: str) -> str:
        value = self.data.get(name, default)
        if not isinstance(value, str):
            raise self.error(name, f"{value!r} is not a string")
        return value

    def bool(self, name: str, default: bool) -> bool:
        value = self.data.get(name, default)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise self.error(name, f"{value!r} is not a boolean")
        return value

    def str_map(self, name: str) -> dict[str, str]:
        """An object of string values (absent or null: empty)."""
        nested = self.obj(name)
        out = {}
        for k, v in nested.items():
            if not isinstance(v, str):
                raise nested.error(k, f"{v!r} is not a string")
            out[k] = v
        return out
