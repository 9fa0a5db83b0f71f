"""The timer wheel: pending timer records by delivery slot, in memory."""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["ENTRY", "KIND_DELETE", "KIND_MESSAGE", "TimerWheel"]

# one pending timer record in memory
ENTRY = np.dtype(
    [("deliver_ms", "<i8"), ("offset", "<i8"), ("phys", "<i8"), ("size", "<i4"), ("kind", "<i1")]
)
KIND_MESSAGE = 0
KIND_DELETE = 1  # a recall's delete record


# --- the wheel ------------------------------------------------------------------------------------
class TimerWheel:
    """Pending entries (``ENTRY`` arrays) bucketed by ``deliver_ms // slot_ms``; a heap of slot
    numbers orders the buckets.  Adding and popping work on whole arrays."""

    def __init__(self, slot_ms: int) -> None:
        self.slot_ms = max(1, int(slot_ms))
        self._slots: dict[int, list[np.ndarray]] = {}
        self._heap: list[int] = []
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, entries: np.ndarray) -> None:
        n = len(entries)
        if n == 0:
            return
        slots = entries["deliver_ms"] // self.slot_ms
        if (slots == slots[0]).all():
            groups = [(int(slots[0]), entries)]
        else:
            order = np.argsort(slots, kind="stable")
            s = slots[order]
            cuts = np.flatnonzero(s[1:] != s[:-1]) + 1
            groups = [
                (int(s[a]), entries[order[a:b]])
                for a, b in zip(np.r_[0, cuts], np.r_[cuts, n], strict=True)
            ]
        for sid, arr in groups:
            bucket = self._slots.get(sid)
            if bucket is None:
                self._slots[sid] = [arr]
                heapq.heappush(self._heap, sid)
            else:
                bucket.append(arr)
        self._count += n

    def _bucket(self, sid: int) -> np.ndarray:
        bucket = self._slots[sid]
        if len(bucket) > 1:
            bucket[:] = [np.concatenate(bucket)]
        return bucket[0]

    def next_ms(self) -> int | None:
        if not self._heap:
            return None
        return int(self._bucket(self._heap[0])["deliver_ms"].min())

    def pop_due(self, now_ms: int) -> np.ndarray:
        """Every entry due at ``now_ms``, ordered by (deliver_ms, queue offset)."""
        out = []
        limit = now_ms // self.slot_ms
        while self._heap and self._heap[0] <= limit:
            sid = self._heap[0]
            arr = self._bucket(sid)
            due = np.ones(len(arr), dtype=bool) if sid < limit else arr["deliver_ms"] <= now_ms
            if due.all():
                out.append(arr)
                heapq.heappop(self._heap)
                del self._slots[sid]
                continue
            out.append(arr[due])
            self._slots[sid] = [arr[~due]]
            break
        if not out:
            return np.zeros(0, ENTRY)
        due_all = np.concatenate(out) if len(out) > 1 else out[0]
        self._count -= len(due_all)
        return due_all[np.lexsort((due_all["offset"], due_all["deliver_ms"]))]

    def find(self, deliver_ms: int) -> np.ndarray:
        sid = deliver_ms // self.slot_ms
        if sid not in self._slots:
            return np.zeros(0, ENTRY)
        arr = self._bucket(sid)
        return arr[arr["deliver_ms"] == deliver_ms]

    def entries(self) -> np.ndarray:
        """Every pending entry (a copy)."""
        if not self._slots:
            return np.zeros(0, ENTRY)
        return np.concatenate([self._bucket(sid) for sid in self._slots])

    def min_offset(self) -> int | None:
        if not self._slots:
            return None
        return min(int(self._bucket(sid)["offset"].min()) for sid in self._slots)
