"""The sink's committer thread: the group commits of committed batches, one after another.

A batch is committed once its commit record is durable (``sink.SinkService.commit_batch``, the
commit point); the group commit that makes all its messages visible at once is queued here and
run on one thread, in the order of the commit records, while Spark goes on with the next
micro-batch.  A read plans after :meth:`GroupCommitter.wait_visible` (it sees every batch
committed before it asked), the check-back is told to wait while an attempt's group commit is
queued or running (:meth:`GroupCommitter.committing`), an abort of a committed attempt waits for
it, and a clean stop finishes the queue.  A group commit that fails leaves the halves pending:
the check-back commits them from the batch's commit record.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable

import numpy as np

from rmq_spark.errors import StoreError
from rmq_spark.store.encoded import EncodedBatch

__all__ = ["VISIBLE_WAIT_S", "GroupCommit", "GroupCommitter"]

log = logging.getLogger("rmq_spark.sink")

VISIBLE_WAIT_S = 60.0  # how long a read waits for the group commits of batches committed before it
RECENT_JOBS = 4096  # finished group commits remembered (an abort of a committed attempt asks)


class GroupCommit:
    """The group commit of one committed batch: its halves (CommitLog offsets), the properties
    each must carry (None: this process stored them all), and, for halves stored with their real
    messages, those (offsets in the order kept, queue offsets, ids, records)."""

    __slots__ = ("attempt", "batch_id", "encoded", "error", "expect", "halves", "phys")

    def __init__(
        self,
        attempt: str,
        batch_id: int,
        halves: list[int],
        expect: dict[str, str] | None,
        phys: np.ndarray | None,
        encoded: tuple[list[int], list[str], list[EncodedBatch]] | None,
    ) -> None:
        self.attempt, self.batch_id, self.halves, self.expect = attempt, batch_id, halves, expect
        self.phys, self.encoded = phys, encoded
        self.error: Exception | None = None


class GroupCommitter:
    """Runs ``run(job)`` for each queued :class:`GroupCommit`, in order, on a thread of its own."""

    def __init__(self, run: Callable[[GroupCommit], None]) -> None:
        self._run = run
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._jobs: deque[GroupCommit] = deque()
        self._committing: dict[str, GroupCommit] = {}  # attempt -> its job, queued or running
        self._recent: OrderedDict[str, GroupCommit] = OrderedDict()  # attempt -> its finished job
        self._taken = self._done = 0
        self._thread: threading.Thread | None = None
        self.closed = False

    def enqueue(self, job: GroupCommit) -> None:
        with self._lock:
            if self.closed:
                raise StoreError("the broker is stopping: the batch will be replayed")
            self._jobs.append(job)
            self._committing[job.attempt] = job
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="rmq-sink-committer", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()

    def committing(self, attempt: str) -> bool:
        """Is the group commit of ``attempt`` queued or running?"""
        return attempt in self._committing

    def wait_committed(self, attempt: str) -> GroupCommit | None:
        """The group commit of ``attempt``, once done (waited for if queued or running; None if
        this process ran none for it lately): an abort of a committed attempt whose commit
        answer was lost asks, and must not end its halves a second time."""
        with self._lock:
            if attempt in self._committing:
                self._changed.wait_for(lambda: attempt not in self._committing)
            return self._recent.get(attempt)

    def wait_visible(self, timeout_s: float = VISIBLE_WAIT_S) -> None:
        """Wait until the group commits of every batch committed so far are done."""
        with self._lock:
            target = self._taken + len(self._jobs)
            if not self._changed.wait_for(lambda: self._done >= target, timeout_s):
                raise StoreError(f"committed sink batches were not visible after {timeout_s:.0f}s")

    def close(self) -> None:
        """Finish the jobs queued so far and take no more."""
        with self._lock:
            self.closed = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._jobs and not self.closed:
                    self._changed.wait()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
                self._taken += 1
            try:
                self._run(job)
            except Exception as e:  # noqa: BLE001 - the halves stay pending: the check-back commits them from the record
                job.error = e
                log.error("the group commit of batch %d (attempt %s, %d messages) failed: %s; the broker's check-back "
                          "commits them from the batch's commit record", job.batch_id, job.attempt, len(job.halves), e)  # fmt: skip
            job.phys = job.encoded = None  # remembered done: its messages are not kept (an
            job.halves = []  # abort of an attempt whose job failed gets its halves from Spark)
            with self._lock:
                self._committing.pop(job.attempt, None)
                self._recent[job.attempt] = job
                while len(self._recent) > RECENT_JOBS:
                    self._recent.popitem(last=False)
                self._done += 1
                self._changed.notify_all()
