"""How groups of halves ended, remembered by CommitLog offset rather than by transaction id.

The service remembers how each transaction ended (``TransactionService._state``: id -> state),
so that a second end of it, by its producer or by the check-back, is refused instead of writing
its messages twice.  A Spark sink's batch ends a few hundred thousand halves at once: one entry
per id cost about 200 bytes a message and a tenth of a second of hashing per 200,000, and kept
72 hours of them (the file reserved time), which a sink writing 100,000 messages a second
cannot afford.  Halves their caller stored itself and ends in one group (``commit_encoded``,
``commit_own``: the sink's, never copied by the check-back) are remembered here instead, as one
sorted array of their CommitLog offsets per group: 8 bytes a message, looked up with a binary
search.  A group is forgotten once the check-back has walked past all its halves (nothing walks
them again; a producer ending one would need the sink's producer group) or after the file
reserved time.
"""

from __future__ import annotations

import numpy as np

from rmq_spark.services.transaction.states import TxnState

__all__ = ["EndedRuns"]


class EndedRuns:
    """Groups of ended halves: (when, their highest half queue offset, sorted CommitLog offsets,
    how they ended).  Replaced, never changed in place: readers need no lock."""

    def __init__(self) -> None:
        self._runs: tuple[tuple[int, int, np.ndarray, TxnState], ...] = ()

    def __len__(self) -> int:
        """Halves remembered."""
        return sum(len(r[2]) for r in self._runs)

    def add(self, now_ms: int, max_queue_offset: int, phys: np.ndarray, state: TxnState) -> None:
        self._runs = (
            *self._runs,
            (now_ms, max_queue_offset, np.sort(np.asarray(phys, dtype=np.int64)), state),
        )

    def state_of(self, phys: int) -> TxnState | None:
        for _ms, _q, arr, state in reversed(self._runs):
            i = int(np.searchsorted(arr, phys))
            if i < len(arr) and int(arr[i]) == phys:
                return state
        return None

    def states_of(self, phys: np.ndarray) -> list[TxnState | None] | None:
        """:meth:`state_of` of many halves (None: none of them is remembered)."""
        runs = self._runs
        if not runs or len(phys) == 0:
            return None
        out: list[TxnState | None] | None = None
        for _ms, _q, arr, state in runs:
            at = np.minimum(np.searchsorted(arr, phys), len(arr) - 1)
            hit = np.flatnonzero(arr[at] == phys)
            if len(hit):
                if out is None:
                    out = [None] * len(phys)
                for i in hit.tolist():
                    out[i] = state
        return out

    def forget(self, checked_below: int, older_than_ms: int) -> None:
        """Drop the groups whose halves all lie below the check-back's half offset
        ``checked_below``, and those that ended before ``older_than_ms``."""
        kept = tuple(r for r in self._runs if r[1] >= checked_below and r[0] >= older_than_ms)
        if len(kept) != len(self._runs):
            self._runs = kept
