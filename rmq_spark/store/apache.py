"""A store directory written by Apache RocketMQ, read offline: how to tell it from ours, what of it
the bulk reader (:mod:`rmq_spark.store.reader`) reads as it is, and what it refuses and why.

Apache's CommitLog records, ConsumeQueue units, segment naming and the ``config/topics.json``
shape are the ones this store writes, so :class:`~rmq_spark.store.reader.StoreReader` maps them
as they are.  The differences, and what is done about each:

┌──────────────────────────────────────────┬──────────────────────────────────────────────────┐
│ Apache RocketMQ                          │ here                                             │
├──────────────────────────────────────────┼──────────────────────────────────────────────────┤
│ CommitLog segments of 1 GiB (any size    │ the segment size is taken from the first file    │
│ by mappedFileSizeCommitLog)              │                                                  │
│ bodies the client compressed (sysflag    │ inflated on read, bounded by the body limit      │
│ COMPRESSED, type in bits 8-10)           │ (:mod:`rmq_spark.store.inflate`): zlib (type 0   │
│                                          │ or 3); LZ4 and ZSTD with the lz4 / zstandard     │
│                                          │ packages, or an error naming the package; a body │
│                                          │ that does not inflate is served as stored        │
│ V2 records (2-byte topic length, topics  │ read (topic length > 127 bytes, as Apache picks) │
│ over 127 bytes), IPv6 born/store hosts   │                                                  │
│ ConsumeQueue ext (enableConsumeQueueExt) │ the tag code is an ext address: rows are kept    │
│                                          │ for the exact filter on the TAGS property        │
│ old CommitLog files deleted (retention)  │ a queue's first readable offset is the first     │
│ while ConsumeQueue units still point     │ unit at or past the CommitLog's first byte       │
│ there                                    │                                                  │
│ checkpoint, abort, lock, index, timer    │ not needed for reading: ignored (a running       │
│ wheel/log, config/*.json, rocksdbstore/  │ broker's lock is left alone)                     │
│ batch ConsumeQueue (queue.type=BatchCQ)  │ refused: 46-byte units of inner-batch records    │
│ ConsumeQueues in RocksDB                 │ refused: no consumequeue/ files to read          │
│ (storeType=defaultRocksDB)               │                                                  │
└──────────────────────────────────────────┴──────────────────────────────────────────────────┘

A running broker keeps appending: what a read plans is what its ConsumeQueues held then.
"""

from __future__ import annotations

import os

from rmq_spark.errors import StoreError
from rmq_spark.store import layout as L
from rmq_spark.store.inflate import COMPRESSION_MASK, inflate_bodies
from rmq_spark.store.jsonfile import read_json

__all__ = [
    "ApacheStoreError",
    "is_apache_store",
    "check_apache_store",
    "topic_queue_nums",
    "inflate_bodies",
    "COMPRESSION_MASK",
]

# files only Apache RocketMQ writes in a store root (4.x: config/consumerFilter.json and
# subscriptionGroup.json; 5.x adds the timer wheel, rocksdbstore/ and compaction/)
_MARKERS = (
    os.path.join(L.CONFIG_DIR, "consumerFilter.json"),
    os.path.join(L.CONFIG_DIR, "subscriptionGroup.json"),
    os.path.join(L.CONFIG_DIR, "timercheck"),
    "timerwheel",
    "rocksdbstore",
    "compaction",
)
BATCH_CQ_SEGMENT_BYTES = 300_000 * 46  # mappedFileSizeConsumeQueue of a batch ConsumeQueue


class ApacheStoreError(StoreError):
    """A store Apache RocketMQ wrote holds something this reader cannot read."""


def is_apache_store(root: str) -> bool:
    """Was the store at ``root`` written by Apache RocketMQ (not rmq-broker)?"""
    return any(os.path.exists(os.path.join(root, m)) for m in _MARKERS)


def topic_queue_nums(root: str) -> dict[str, dict]:
    """``config/topics.json`` (or its ``.bak``): topic -> its config object (readQueueNums,
    attributes, ...); empty when the broker never wrote one."""
    data = read_json(os.path.join(root, L.CONFIG_DIR, L.TOPICS_FILE)) or {}
    table = data.get("topicConfigTable") if isinstance(data, dict) else None
    return {str(t): c for t, c in table.items() if isinstance(c, dict)} if isinstance(table, dict) else {}


def check_apache_store(root: str, topics: list[str] | None = None) -> None:
    """Raise :class:`ApacheStoreError` naming what of the store at ``root`` cannot be read
    (for ``topics``, or every topic)."""
    cl = os.path.join(root, L.COMMITLOG_DIR)
    cq = os.path.join(root, L.CONSUMEQUEUE_DIR)
    if not os.path.isdir(cl):
        raise ApacheStoreError(
            f"{root} has no commitlog/ directory: give the broker's storePathRootDir (a store whose "
            "storePathCommitLog points elsewhere cannot be read with 'path')"
        )
    has_log = any(n.isdigit() and os.path.getsize(os.path.join(cl, n)) for n in os.listdir(cl))
    if has_log and not (os.path.isdir(cq) and os.listdir(cq)):
        raise ApacheStoreError(
            f"{root} has CommitLog files but no consumequeue/ files: its broker keeps ConsumeQueues in "
            "RocksDB (storeType=defaultRocksDB), which this reader does not read; read it through the "
            "broker with 'namesrvAddr' instead"
        )
    configs = topic_queue_nums(root)
    for topic in topics if topics is not None else sorted(os.listdir(cq)) if os.path.isdir(cq) else []:
        attrs = configs.get(topic, {}).get("attributes") or {}
        batch = str(attrs.get("queue.type", attrs.get("+queue.type", ""))).lower() == "batchcq"
        d = os.path.join(cq, topic)
        if not batch and os.path.isdir(d):
            for q in os.listdir(d):
                files = sorted(os.listdir(os.path.join(d, q))) if q.isdigit() else []
                if files and os.path.getsize(os.path.join(d, q, files[0])) == BATCH_CQ_SEGMENT_BYTES:
                    batch = True
                    break
        if batch:
            raise ApacheStoreError(
                f"topic {topic!r} of {root} uses a batch ConsumeQueue (queue.type=BatchCQ: 46-byte units of "
                "inner-batch records), which this reader does not read; read it through the broker with "
                "'namesrvAddr' instead"
            )
