"""What pop consumption remembers per (consumer group, queue), and the file that keeps the acks.

A queue of a group is a line of offsets:

    base                       frontier                          max offset
     │ done · in-flight · pending │  not read yet                    │
  ───┴────────────────────────────┴──────────────────────────────────┴──
  every offset < base is done (acked, filtered out, moved to the retry or DLQ topic)

- ``done``: finished offsets >= base (acks arrive out of order), as disjoint intervals;
- ``inflight``: delivered and invisible until a deadline (receipt handle);
- ``pending``: read but held back — a FIFO message whose message group has an earlier message
  in flight, a FIFO message waiting for redelivery, or a retry-topic message for another topic.

``base`` is also the group's committed offset in ``consumerOffset.json``.  The acks above it are
kept in ``config/popState.json`` (written atomically about once a second and at a clean stop):

    {"version": 1,
     "queues": [{"group": G, "topic": T, "queueId": Q, "base": B, "done": [[lo, hi), ...]}, ...]}

After a restart a group resumes at ``base`` and skips the ``done`` offsets; what was in flight is
delivered again.
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rmq_spark.errors import CorruptStoreError
from rmq_spark.store import layout as L
from rmq_spark.store.jsonfile import read_json, write_json_atomic

__all__ = [
    "MAIN",
    "RETRY",
    "GroupState",
    "InFlight",
    "OffsetSet",
    "Pending",
    "PopStateFile",
    "QueueState",
]

POP_STATE_FILE = "popState.json"
POP_STATE_VERSION = 1

# which queue of a group a receipt handle points into
MAIN = 0  # a queue of the topic the client named
RETRY = 1  # the group's retry topic %RETRY%{group}, queue 0


class OffsetSet:
    """A set of queue offsets held as sorted, disjoint, non-touching ``[lo, hi)`` intervals."""

    __slots__ = ("_hi", "_lo")

    def __init__(self, intervals: list[list[int]] | None = None) -> None:
        self._lo: list[int] = []
        self._hi: list[int] = []
        for lo, hi in intervals or ():
            self.add_range(int(lo), int(hi))

    def add(self, offset: int) -> None:
        self.add_range(offset, offset + 1)

    def add_range(self, lo: int, hi: int) -> None:
        if lo >= hi:
            return
        i = bisect_left(self._hi, lo)  # first interval ending at or after lo (overlap or touch)
        j = bisect_right(self._lo, hi)  # intervals starting at or before hi
        if i < j:
            lo = min(lo, self._lo[i])
            hi = max(hi, self._hi[j - 1])
        self._lo[i:j] = [lo]
        self._hi[i:j] = [hi]

    def __contains__(self, offset: int) -> bool:
        i = bisect_right(self._lo, offset) - 1
        return i >= 0 and offset < self._hi[i]

    def __bool__(self) -> bool:
        return bool(self._lo)

    def advance(self, base: int) -> int:
        """Drop what lies below ``base``; return ``base`` moved past an interval that starts there."""
        k = bisect_right(self._hi, base)
        if k:
            del self._lo[:k], self._hi[:k]
        if self._lo and self._lo[0] <= base:
            base = self._hi[0]
            del self._lo[0], self._hi[0]
        return base

    def intervals(self) -> list[list[int]]:
        return [[lo, hi] for lo, hi in zip(self._lo, self._hi, strict=True)]


@dataclass(slots=True)
class InFlight:
    """A delivered message, invisible to the group until ``deadline_ms``."""

    offset: int
    phys: int
    size: int
    reconsume: int  # delivery_attempt - 1
    msg_group: str | None
    origin: str  # the topic the client sees
    deadline_ms: int
    handle: str
    client_id: str
    auto_renew: bool


@dataclass(slots=True)
class Pending:
    """A message read from the queue but not delivered yet."""

    phys: int
    size: int
    msg_group: str | None
    reconsume: int
    origin: str


class QueueState:
    """One queue of one consumer group (see the module docstring)."""

    __slots__ = (
        "base",
        "dirty",
        "done",
        "frontier",
        "groups",
        "inflight",
        "kind",
        "pending",
        "queue_id",
        "topic",
    )

    def __init__(
        self, topic: str, queue_id: int, kind: int, base: int, done: OffsetSet | None = None
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.kind = kind
        self.done = done or OffsetSet()
        self.base = self.done.advance(base)
        self.frontier = self.base
        self.inflight: dict[int, InFlight] = {}
        self.pending: dict[int, Pending] = {}
        self.groups: Counter[str] = Counter()  # message groups with a message in flight
        self.dirty = False

    def finish(self, offset: int) -> None:
        """Mark one offset done (acked, moved away, or not wanted)."""
        self.finish_range(offset, offset + 1)

    def finish_range(self, lo: int, hi: int) -> None:
        if hi <= self.base:
            return
        if lo <= self.base:
            self.base = self.done.advance(hi)
        else:
            self.done.add_range(lo, hi)
        self.dirty = True

    def skip_to(self, offset: int) -> None:
        """The queue's messages below ``offset`` are gone: start there."""
        if offset > self.base:
            self.base = self.done.advance(offset)
        for off in [o for o in self.inflight if o < self.base]:
            self.untrack(self.inflight.pop(off))
        for off in [o for o in self.pending if o < self.base]:
            del self.pending[off]
        self.frontier = max(self.frontier, self.base)
        self.dirty = True

    def track(self, entry: InFlight) -> None:
        self.inflight[entry.offset] = entry
        if entry.msg_group is not None:
            self.groups[entry.msg_group] += 1

    def untrack(self, entry: InFlight) -> None:
        g = entry.msg_group
        if g is not None:
            n = self.groups[g] - 1
            if n > 0:
                self.groups[g] = n
            else:
                del self.groups[g]

    def snapshot(self) -> dict[str, Any]:
        return {"base": self.base, "done": self.done.intervals()}


class GroupState:
    """The queues of one consumer group, under the group's lock, and its round-robin position."""

    __slots__ = ("lock", "name", "queues", "rr")

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.queues: dict[tuple[int, str, int], QueueState] = {}  # (MAIN | RETRY, topic, queue id)
        self.rr = 0


class PopStateFile:
    """``config/popState.json``: the acks above each queue's committed offset."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, L.CONFIG_DIR, POP_STATE_FILE)
        self._loaded: dict[tuple[str, str, int], tuple[int, OffsetSet]] = {}
        data = read_json(self.path)
        if not data:
            return
        if data.get("version") != POP_STATE_VERSION:
            raise CorruptStoreError(
                f"{self.path}: version {data.get('version')!r} is not {POP_STATE_VERSION}",
                self.path,
                0,
            )
        for i, q in enumerate(data.get("queues") or ()):
            try:
                key = (str(q["group"]), str(q["topic"]), int(q["queueId"]))
                self._loaded[key] = (int(q["base"]), OffsetSet(q.get("done") or []))
            except (KeyError, TypeError, ValueError) as e:
                raise CorruptStoreError(
                    f"{self.path}: queue entry {i} is malformed: {e}", self.path, i
                ) from None

    def take(self, group: str, topic: str, queue_id: int) -> tuple[int, OffsetSet] | None:
        """The saved (base, done) of a queue, once (the live state owns it afterwards)."""
        return self._loaded.pop((group, topic, queue_id), None)

    def write(self, queues: list[tuple[str, str, int, dict[str, Any]]]) -> None:
        rows = [{"group": g, "topic": t, "queueId": q, **snap} for g, t, q, snap in queues]
        # saved queues not touched since the start are kept as they were
        for (g, t, q), (base, done) in self._loaded.items():
            rows.append(
                {"group": g, "topic": t, "queueId": q, "base": base, "done": done.intervals()}
            )
        rows.sort(key=lambda r: (r["group"], r["topic"], r["queueId"]))
        write_json_atomic(self.path, {"version": POP_STATE_VERSION, "queues": rows})
