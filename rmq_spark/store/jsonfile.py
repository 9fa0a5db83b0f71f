"""Atomic JSON config files, each kept twice and checked on load.

A write goes to ``<file>`` and then to ``<file>.bak`` (RocketMQ's ConfigManager name), each through a
temp file, fsync and rename, so both hold the current content; each carries a CRC32 of its data
under :data:`CHECKSUM_KEY` (an extra top-level key, which RocketMQ's readers ignore).  A load takes
the first copy whose checksum holds: a damaged file, even one whose damage leaves valid JSON (a
digit flipped in an offset), is told apart and the other copy read, with a log line naming the
damaged file.  Files without a checksum (written by RocketMQ or an older version) are read as
before: the file, else its ``.bak``.  A full disk raises :class:`DiskFullError`.

A file that parses is read through :class:`JsonObject`, whose typed getters check each value as it
is taken: a wrong type or an out-of-range value is a :class:`~rmq_spark.errors.ConfigError` naming
the file and the key (``config file .../topics.json: key 'topicConfigTable.T.readQueueNums': -5 is
not between 1 and 1024``), never a bare ``TypeError`` from deep inside a loader.

A big table (topics.json's) can be kept encoded entry by entry (:class:`EncodedTable`): it is
written from its entries' cached text, for the file and for the checksum alike, so a rewrite
encodes only the entries that changed and joins strings for the rest.
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import re
from typing import Any

from zlib_ng.zlib_ng import crc32

from rmq_spark.errors import ConfigError, CorruptStoreError
from rmq_spark.store.mapped import is_no_space, make_dirs, no_space

log = logging.getLogger("rmq_spark.store")

CHECKSUM_KEY = "rmqSparkCrc32"
_UNQUOTED_INT_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


# levels of the file laid out one key a line (the tables' entries: a topic, a topic@group); below
# them each value is one line.  json.dumps with ``indent`` runs Python's pure encoder: 3,000 topics
# took 0.5 s a write, most of a heartbeat naming 1,000 new groups; this layout takes the C encoder.
_LAID_OUT_LEVELS = 2


def _not_json(value: Any) -> Any:
    if isinstance(value, Encoded):
        raise ValueError(
            f"the encoded entry {value.key!r} outside an EncodedTable: an EncodedTable at "
            f"level {_LAID_OUT_LEVELS - 1} holds it"
        )
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


_ONE_LINE = json.JSONEncoder(sort_keys=True, ensure_ascii=True, default=_not_json)
# the checksum's form: json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=_not_json
)


class Encoded:
    """One entry of a table (a topic's config under its name), encoded once both ways
    :func:`write_json_atomic` writes it: ``line``, the line the file holds (an entry of the last
    laid-out level: its value is one line), and ``canonical``, ``"key":value`` as the checksum
    reads it.  Kept in an :class:`EncodedTable`."""

    __slots__ = ("canonical", "key", "line")

    def __init__(self, key: str, value: Any) -> None:
        self.key = key
        name = _CANONICAL.encode(key)
        self.line: str = f"{_PAD * _LAID_OUT_LEVELS}{name}: {_ONE_LINE.encode(value)}"
        self.canonical: str = f"{name}:{_CANONICAL.encode(value)}"


class EncodedTable(dict[str, Encoded]):
    """A table whose entries are kept encoded (each under its own key: :meth:`put`).  Placed in
    ``data`` at the last laid-out level (topics.json's ``topicConfigTable``), it is written as
    the plain table would be, byte for byte and with the same checksum, by joining its entries'
    text: a rewrite encodes nothing but the entries that changed."""

    def put(self, entry: Encoded) -> None:
        self[entry.key] = entry


_PAD = "  "


def _joined(table: EncodedTable, level: int, canonical: bool) -> str:
    if level != _LAID_OUT_LEVELS - 1:
        top = _LAID_OUT_LEVELS - 1
        raise ValueError(f"an EncodedTable at level {level}: it is written only at level {top}")
    if not table:
        return "{}"
    if canonical:
        return "{" + ",".join([table[k].canonical for k in sorted(table)]) + "}"
    return "{\n" + ",\n".join([table[k].line for k in sorted(table)]) + "\n" + _PAD * level + "}"


def _canonical(value: Any, level: int = 0) -> str:
    """``value`` in the checksum's form (json.dumps sorted and compact); the laid-out levels
    joined from their entries, so an :class:`EncodedTable` is its entries' cached text."""
    if value.__class__ is EncodedTable:
        return _joined(value, level, canonical=True)
    laid_out = isinstance(value, dict) and value and level < _LAID_OUT_LEVELS
    if laid_out and all(k.__class__ is str for k in value):
        key = _CANONICAL.encode
        items = [f"{key(k)}:{_canonical(value[k], level + 1)}" for k in sorted(value)]
        return "{" + ",".join(items) + "}"
    return _CANONICAL.encode(value)


def _checksum(data: Any) -> str:
    return f"{crc32(_canonical(data).encode()):08x}"


def _layout(value: Any, level: int = 0) -> str:
    if value.__class__ is EncodedTable:
        return _joined(value, level, canonical=False)
    if isinstance(value, dict) and value and level < _LAID_OUT_LEVELS:
        pad = _PAD * (level + 1)
        key = _ONE_LINE.encode
        items = [f"{pad}{key(str(k))}: {_layout(value[k], level + 1)}" for k in sorted(value)]
        return "{\n" + ",\n".join(items) + "\n" + _PAD * level + "}"
    return _ONE_LINE.encode(value)


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    """Write the object ``data`` to ``path`` and its copy ``path.bak``, each atomically."""
    make_dirs(os.path.dirname(path))
    body = {k: v for k, v in data.items() if k != CHECKSUM_KEY}
    text = _layout({**body, CHECKSUM_KEY: _checksum(body)}).encode()
    for target in (path, f"{path}.bak"):
        _replace(target, text)
    dfd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _replace(target: str, text: bytes) -> None:
    tmp = f"{target}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(text)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if is_no_space(e):
            raise no_space(target, e) from None
        raise


def read_json(path: str) -> Any | None:
    """The content of the first of ``path``, ``path.bak`` whose checksum holds; without checksums,
    the first that parses; None if neither exists.  Both damaged: :class:`CorruptStoreError`."""
    errors: list[str] = []
    unchecked: list[Any] = []
    ours = False  # a copy carried a checksum: ours, so one without is damaged too
    for candidate in (path, f"{path}.bak"):
        if not os.path.exists(candidate):
            continue
        try:
            with open(candidate, "rb") as f:
                text = f.read().decode("utf-8")
            # RocketMQ (fastjson) writes integer map keys unquoted
            data = json.loads(_UNQUOTED_INT_KEY.sub(r'\1"\2"\3', text))
        except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
            errors.append(f"{candidate}: {e}")
            continue
        want = data.pop(CHECKSUM_KEY, None) if isinstance(data, dict) else None
        if want is None:
            unchecked.append(data)
            continue
        ours = True
        if want != _checksum(data):
            errors.append(f"{candidate}: checksum {want!r} does not match its content")
            continue
        if errors or unchecked:
            log.error(
                "%s is damaged (%s); its copy %s is read",
                path,
                "; ".join(errors) or "no checksum",
                candidate,
            )
        return data
    if unchecked and not ours:
        return unchecked[0]
    if errors or unchecked:
        raise CorruptStoreError(
            "; ".join(errors) or f"{path}: no copy has a valid checksum", path, 0
        )
    return None


def _kind(value: Any) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
    }.get(type(value), "a number")


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
        return ConfigError(
            f"config file {self.path}: " + (f"key {key!r}: " if key else "") + problem
        )

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
            bounds = (
                f"between {lo} and {hi}"
                if lo is not None and hi is not None
                else (f"at least {lo}" if lo is not None else f"at most {hi}")
            )
            raise self.error(name, f"{value} is not {bounds}")
        return value

    def str(self, name: str, default: str) -> str:
        value = self.data.get(name, default)
        if not isinstance(value, str):
            raise self.error(name, f"{value!r} is not a string")
        return value

    def bool(self, name: builtins.str, default: bool) -> bool:
        value = self.data.get(name, default)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise self.error(name, f"{value!r} is not a boolean")
        return value

    def str_map(self, name: builtins.str) -> dict[builtins.str, builtins.str]:
        """An object of string values (absent or null: empty)."""
        nested = self.obj(name)
        out = {}
        for k, v in nested.items():
            if not isinstance(v, str):
                raise nested.error(k, f"{v!r} is not a string")
            out[k] = v
        return out
