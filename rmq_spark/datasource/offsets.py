"""Source offsets: ``{"<topic>": {"<queueId>": <next offset to read>}}``.

Spark compares offsets as JSON *text*, so every offset this connector hands to Spark is built by
:func:`canonical`: topics sorted by name, queue ids sorted by number, values ints.  A
micro-batch reads exactly ``[start, end)`` of each ConsumeQueue.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

EARLIEST = -2
LATEST = -1

Offsets = dict[str, dict[str, int]]
QueueMap = Mapping[str, Mapping[int, int]] | Mapping[str, Mapping[str, int]]


def canonical(offsets: QueueMap) -> Offsets:
    """The one JSON shape: sorted topics, numerically sorted queue ids as strings, int values."""
    out: Offsets = {}
    for topic in sorted(offsets):
        queues = offsets[topic]
        out[topic] = {str(q): int(queues[q]) for q in sorted(queues, key=lambda k: int(k))}  # type: ignore[index]
    return out


def to_json(offsets: QueueMap) -> str:
    return json.dumps(canonical(offsets), separators=(",", ":"))


def queue_list(offsets: QueueMap) -> list[tuple[str, int, int]]:
    """``[(topic, queueId, offset)]`` in canonical order."""
    c = canonical(offsets)
    return [(t, int(q), o) for t, qs in c.items() for q, o in qs.items()]


def get(offsets: QueueMap, topic: str, queue_id: int, default: int | None = None) -> int | None:
    qs = offsets.get(topic)
    if qs is None:
        return default
    v = qs.get(str(queue_id), qs.get(queue_id))  # type: ignore[call-overload]
    return default if v is None else int(v)


def total_rows(start: QueueMap, end: QueueMap) -> int:
    """Offsets between ``start`` and ``end`` (queues missing from ``start`` count from 0)."""
    n = 0
    for t, q, e in queue_list(end):
        s = get(start, t, q, 0) or 0
        n += max(0, e - s)
    return n


def resolve(
    requested: QueueMap,
    min_offsets: QueueMap,
    max_offsets: QueueMap,
) -> Offsets:
    """Replace -2 (earliest) and -1 (latest) in user offsets with numbers from a snapshot."""
    out: dict[str, dict[int, int]] = {}
    for t, q, o in queue_list(requested):
        if o == EARLIEST:
            o = get(min_offsets, t, q, 0) or 0
        elif o == LATEST:
            o = get(max_offsets, t, q, 0) or 0
        out.setdefault(t, {})[q] = o
    return canonical(out)


def rate_limit(start: QueueMap, latest: QueueMap, limit: int) -> Offsets:
    """Kafka's ``rateLimit``: at most about ``limit`` offsets in all, split across queues in
    proportion to their backlog; a queue with data gets at least one."""
    sizes: dict[tuple[str, int], int] = {}
    for t, q, e in queue_list(latest):
        s = get(start, t, q, 0) or 0
        if e > s:
            sizes[(t, q)] = e - s
    total = float(sum(sizes.values()))
    if total < 1:
        return canonical(latest)
    out: dict[str, dict[int, int]] = {}
    for t, q, e in queue_list(latest):
        size = sizes.get((t, q))
        if size is None:
            out.setdefault(t, {})[q] = e
            continue
        begin = get(start, t, q, 0) or 0
        share = limit * (size / total)
        step = math.ceil(share) if share < 1 else math.floor(share)
        out.setdefault(t, {})[q] = min(e, begin + step)
    return canonical(out)


def cap(end: QueueMap, target: QueueMap) -> Offsets:
    """``end`` lowered to ``target`` queue by queue (Trigger.AvailableNow's snapshot); queues the
    target does not know keep ``end``."""
    out: dict[str, dict[int, int]] = {}
    for t, q, e in queue_list(end):
        tv = get(target, t, q)
        out.setdefault(t, {})[q] = e if tv is None else min(e, tv)
    return canonical(out)


def not_before(end: QueueMap, start: QueueMap) -> Offsets:
    """``end`` never below ``start`` (offsets never move backwards); keeps queues of both."""
    out: dict[str, dict[int, int]] = {}
    for t, q, s in queue_list(start):
        out.setdefault(t, {})[q] = s
    for t, q, e in queue_list(end):
        out.setdefault(t, {})[q] = max(e, out.get(t, {}).get(q, e))
    return canonical(out)


def same(a: QueueMap, b: QueueMap) -> bool:
    return to_json(a) == to_json(b)
