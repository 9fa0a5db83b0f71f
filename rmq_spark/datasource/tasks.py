"""What every task of the data source does first in Spark's Python worker."""

from __future__ import annotations

import gc


def task_started() -> None:
    """Move the objects alive at a task's start to the collector's permanent generation
    (``gc.freeze``).  Spark's Python worker runs a full ``gc.collect()`` after every task
    (``pyspark/daemon.py``); in a worker that has imported pyarrow, grpc and this package that
    walks some 50,000 objects, 15-25 ms a task.  Frozen, they are no longer walked: the collection
    after the task sees what the task made.  Objects frozen are still freed when their last
    reference goes; only garbage in reference cycles among them would be kept, and the worker's
    collection just before a task has removed that."""
    gc.freeze()
