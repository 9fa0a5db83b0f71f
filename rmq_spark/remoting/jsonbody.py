"""Bodies of remoting commands are fastjson documents.  Two quirks matter when reading and
writing them from Python:

- fastjson writes the numeric keys of a ``Map<Long, ...>`` unquoted (``{0:"127.0.0.1:10911"}``);
  :func:`loads` quotes them before parsing.
- a map whose keys are objects (``Map<MessageQueue, TopicOffset>`` in TopicStatsTable and
  ConsumeStats) is written with the key object in place of a string; :func:`object_key_map`
  writes one, which fastjson reads back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

__all__ = ["dumps", "loads", "object_key_map"]

_UNQUOTED_NUMERIC_KEY = re.compile(rb"([{,])\s*(-?\d+)\s*:")


def loads(body: bytes) -> Any:
    """Parse a fastjson body (ValueError when it is not JSON even after quoting numeric keys)."""
    try:
        return json.loads(body)
    except ValueError:
        return json.loads(_UNQUOTED_NUMERIC_KEY.sub(rb'\1"\2":', body))


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def object_key_map(items: Iterable[tuple[dict[str, Any], Any]]) -> str:
    """``{{"k":..}:value,...}``: a fastjson map keyed by objects, as raw JSON text."""
    parts = [
        f"{json.dumps(k, separators=(',', ':'), sort_keys=True)}:{json.dumps(v, separators=(',', ':'))}"
        for k, v in items
    ]
    return "{" + ",".join(parts) + "}"
