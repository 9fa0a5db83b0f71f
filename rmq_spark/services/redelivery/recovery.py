"""Recovery of the re-writing services: which sources a delivery already wrote, found by scanning
the CommitLog from a checkpoint (:func:`scan_sources`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rmq_spark.store import layout as L
from rmq_spark.services.redelivery.records import _RECORD_HEAD, read_records

if TYPE_CHECKING:
    from rmq_spark.store.store import MessageStore

# --- recovery: which sources were already delivered -----------------------------------------------
def scan_sources(store: MessageStore, start: int, key: str) -> list[str]:
    """Values of property ``key`` in every delivered record from CommitLog offset ``start`` (a
    record boundary).  Segments are searched for the key with ``mmap.find`` first; records are
    walked only where it occurs.  Records still routed through a system topic (they carry
    ``REAL_TOPIC``, which delivery removes) do not count."""
    marker = key.encode() + b"\x01"
    mfq = store.commitlog.mfq
    start = max(start, mfq.min_offset)
    hits_phys: list[int] = []
    hits_size: list[int] = []
    for mf in list(mfq.files):
        if mf.end_offset <= start:
            continue
        pos = max(0, start - mf.from_offset)
        limit = mf.wrote_position
        mm = mf.mm
        last = mm.rfind(marker, pos, limit)
        if last < 0:
            continue
        while pos + 8 <= limit and pos <= last:
            size, magic = _RECORD_HEAD.unpack_from(mm, pos)
            if magic not in (L.MAGIC_V1, L.MAGIC_V2) or size <= 0 or pos + size > limit:
                break  # a BLANK filler or the end of the written bytes
            if mm.find(marker, pos, pos + size) >= 0:
                hits_phys.append(mf.from_offset + pos)
                hits_size.append(size)
            pos += size
    if not hits_phys:
        return []
    src = read_records(store, np.asarray(hits_phys), np.asarray(hits_size))
    # a key found only in a body has no value here
    return [p[key] for p in src.properties if key in p and L.P_REAL_TOPIC not in p]
