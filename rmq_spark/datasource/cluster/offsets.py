"""Source offsets of a RocketMQ cluster read: ``{"topic": {"brokerName": {"queueId": offset}}}``.

A queue of a cluster is (topic, broker name, queue id): queue ids repeat on every broker, so the
JSON names the broker, as rocketmq-spark's offsets did.  Inside, offsets are flat maps
``{(topic, broker, queueId): next offset}``; :func:`to_json` writes the one canonical text Spark
compares (sorted topics, brokers, numerically sorted queue ids).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

EARLIEST = -2
LATEST = -1

Key = tuple[str, str, int]
Flat = dict[Key, int]
Nested = dict[str, dict[str, dict[str, int]]]


def flat(nested: Mapping[str, Mapping[str, Mapping[str, int]]]) -> Flat:
    return {
        (t, b, int(q)): int(o)
        for t, bs in nested.items()
        for b, qs in bs.items()
        for q, o in qs.items()
    }


def nested(offsets: Mapping[Key, int]) -> Nested:
    out: Nested = {}
    for t, b, q in sorted(offsets):
        out.setdefault(t, {}).setdefault(b, {})[str(q)] = int(offsets[(t, b, q)])
    return out


def to_json(offsets: Mapping[Key, int]) -> str:
    return json.dumps(nested(offsets), separators=(",", ":"))


def total_rows(start: Mapping[Key, int], end: Mapping[Key, int]) -> int:
    return sum(max(0, e - start.get(k, 0)) for k, e in end.items())


def not_before(end: Mapping[Key, int], start: Mapping[Key, int]) -> Flat:
    """``end`` never below ``start``; queues of ``start`` missing from ``end`` (a broker down or
    gone from the routes) keep their place."""
    out = dict(start)
    for k, e in end.items():
        out[k] = max(e, out.get(k, e))
    return out


def rate_limit(start: Mapping[Key, int], latest: Mapping[Key, int], limit: int) -> Flat:
    """Kafka's ``rateLimit``: about ``limit`` offsets in all, split by backlog; each queue with
    data gets at least one."""
    sizes = {k: e - start.get(k, 0) for k, e in latest.items() if e > start.get(k, 0)}
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(latest)
    out = {}
    for k, e in latest.items():
        size = sizes.get(k)
        if size is None:
            out[k] = e
            continue
        share = limit * (size / total)
        out[k] = min(e, start.get(k, 0) + (math.ceil(share) if share < 1 else math.floor(share)))
    return out


def cap(end: Mapping[Key, int], target: Mapping[Key, int], start: Mapping[Key, int]) -> Flat:
    """``end`` lowered to ``target`` (Trigger.AvailableNow); queues born after it read nothing."""
    return {k: min(e, target.get(k, start.get(k, 0))) for k, e in end.items()}
