"""Atomic JSON config files: write a temp file, fsync, rename; keep ``<file>.bak`` of the
previous content and fall back to it when the file is damaged (as RocketMQ's ConfigManager)."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from rmq_spark.errors import CorruptStoreError

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
        except (OSError, ValueError) as e:
            errors.append(f"{candidate}: {e}")
    if errors:
        raise CorruptStoreError("; ".join(errors), path, 0)
    return None
