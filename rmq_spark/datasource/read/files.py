"""Reading a planned range from the store files, when this machine holds the broker's store
directory: :class:`rmq_spark.store.reader.StoreReader` (read-only, vectorized, large Arrow
batches), one per store and executor process."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

from rmq_spark.datasource.read.partition import QueueRange, ReadContext, check_loss, filters_for

__all__ = ["READ_CHUNK_BYTES", "READ_CHUNK_ROWS", "files_readable", "read_files", "store_reader"]

# batches handed to Spark: big enough to amortize per-batch costs, small enough to stay in cache
# and far below Arrow's 2 GiB per binary column whatever the message size
READ_CHUNK_ROWS = 65_536
READ_CHUNK_BYTES = 32 << 20

_readers: dict[str, Any] = {}  # store root -> StoreReader, per executor process
_readers_lock = threading.Lock()


def files_readable(ctx: ReadContext) -> bool:
    """Can this process open the broker's store files?"""
    root = ctx.store_root
    if root is None:
        return False
    if ctx.store_host is not None and ctx.store_host != socket.gethostname():
        return False
    return os.path.isdir(os.path.join(root, "commitlog")) and os.access(root, os.R_OK)


def store_reader(root: str) -> Any:
    from rmq_spark.store.reader import StoreReader

    with _readers_lock:
        r = _readers.get(root)
        if r is None:
            r = StoreReader(root)
            _readers[root] = r
        return r


def read_files(p: QueueRange) -> Iterator[Any]:
    """The rows of ``p`` read from the store files, as Arrow record batches."""
    reader = store_reader(p.ctx.store_root)  # type: ignore[arg-type]
    start = check_loss(p, reader.min_offset(p.topic, p.queue_id))
    tag_filter, sql_filter = filters_for(p.ctx.tags, p.ctx.sql)
    if p.bounds.tags_in is not None and tag_filter is None:
        from rmq_spark.filter import TagFilter

        tag_filter = TagFilter.parse(" || ".join(p.bounds.tags_in)) if p.bounds.tags_in else None
    yield from reader.read_chunks(
        p.topic, p.queue_id, start, p.end, tag_filter, sql_filter, READ_CHUNK_ROWS, READ_CHUNK_BYTES
    )
