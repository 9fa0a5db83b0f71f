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

import errno
import fcntl
import os
import struct
from typing import Any

from rmq_spark.errors import StoreError
from rmq_spark.store import layout as L
from rmq_spark.store.inflate import COMPRESSION_MASK, inflate_bodies
from rmq_spark.store.jsonfile import read_json

__all__ = [
    "COMPRESSION_MASK",
    "ApacheStoreError",
    "check_apache_store",
    "check_servable",
    "inflate_bodies",
    "is_apache_store",
    "lock_like_apache",
    "segment_sizes",
    "topic_queue_nums",
]

# files only Apache RocketMQ writes in a store root (4.x: config/consumerFilter.json and
# subscriptionGroup.json; 5.x adds config/timermetrics, rocksdbstore/ and compaction/).  The timer
# progress files (config/timercheck, timerlog/, timerwheel) are no marker: rmq-broker writes them too
# (rmq_spark.services.timer.progress)
_MARKERS = (
    os.path.join(L.CONFIG_DIR, "consumerFilter.json"),
    os.path.join(L.CONFIG_DIR, "subscriptionGroup.json"),
    os.path.join(L.CONFIG_DIR, "timermetrics"),
    "rocksdbstore",
    "compaction",
)
BATCH_CQ_SEGMENT_BYTES = 300_000 * 46  # mappedFileSizeConsumeQueue of a batch ConsumeQueue
CQ_EXT_DIR = "consumequeue_ext"  # StorePathConfigHelper.getStorePathConsumeQueueExt
MIN_SEGMENT_BYTES = 4096  # the smallest CommitLog segment the store takes


class ApacheStoreError(StoreError):
    """A store Apache RocketMQ wrote holds something this reader cannot read."""


def is_apache_store(root: str) -> bool:
    """Was the store at ``root`` written by Apache RocketMQ (not rmq-broker)?"""
    return any(os.path.exists(os.path.join(root, m)) for m in _MARKERS)


def topic_queue_nums(root: str) -> dict[str, dict[str, Any]]:
    """``config/topics.json`` (or its ``.bak``): topic -> its config object (readQueueNums,
    attributes, ...); empty when the broker never wrote one."""
    data = read_json(os.path.join(root, L.CONFIG_DIR, L.TOPICS_FILE)) or {}
    table = data.get("topicConfigTable") if isinstance(data, dict) else None
    return (
        {str(t): c for t, c in table.items() if isinstance(c, dict)}
        if isinstance(table, dict)
        else {}
    )


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
    for topic in (
        topics if topics is not None else sorted(os.listdir(cq)) if os.path.isdir(cq) else []
    ):
        attrs = configs.get(topic, {}).get("attributes") or {}
        batch = str(attrs.get("queue.type", attrs.get("+queue.type", ""))).lower() == "batchcq"
        batch = batch or os.path.isdir(
            os.path.join(root, "batchconsumequeue", topic)
        )  # where Apache keeps them
        d = os.path.join(cq, topic)
        if not batch and os.path.isdir(d):
            for q in os.listdir(d):
                files = sorted(os.listdir(os.path.join(d, q))) if q.isdigit() else []
                if (
                    files
                    and os.path.getsize(os.path.join(d, q, files[0])) == BATCH_CQ_SEGMENT_BYTES
                ):
                    batch = True
                    break
        if batch:
            raise ApacheStoreError(
                f"topic {topic!r} of {root} uses a batch ConsumeQueue (queue.type=BatchCQ: 46-byte units of "
                "inner-batch records), which this reader does not read; read it through the broker with "
                "'namesrvAddr' instead"
            )


# regular files RocksDB keeps in its directory (Apache's RocksDB ConsumeQueues live in
# consumequeue/ itself, where a topic is a directory: a file of these names is unambiguous)
_ROCKSDB_FILES = ("CURRENT", "IDENTITY", "LOCK")
_ROCKSDB_PREFIXES = ("LOG", "MANIFEST-", "OPTIONS-")
_ROCKSDB_SUFFIXES = (".sst", ".log")


def _is_rocksdb_file(name: str) -> bool:
    return (
        name in _ROCKSDB_FILES
        or name.startswith(_ROCKSDB_PREFIXES)
        or name.endswith(_ROCKSDB_SUFFIXES)
    )


def _nonempty_dir(path: str) -> bool:
    try:
        with os.scandir(path) as it:
            return any(True for _ in it)
    except (FileNotFoundError, NotADirectoryError):
        return False


def _has_data_file(path: str) -> bool:
    """Any non-empty regular file under ``path``."""
    for dirpath, _dirs, files in os.walk(path):
        if any(os.path.getsize(os.path.join(dirpath, f)) > 0 for f in files):
            return True
    return False


def check_servable(root: str) -> None:
    """Raise :class:`ApacheStoreError` naming what of the store at ``root`` the broker cannot
    serve: the store kinds Apache RocketMQ writes beyond the plain CommitLog, ConsumeQueue and
    JSON config files.  Reads only (nothing under ``root`` is created, changed or removed): it
    runs before the store takes its lock or recovers anything.

    Refused: ConsumeQueues in RocksDB (``storeType=defaultRocksDB``, also with double write),
    RocksDB config managers (``config/topics/``, ``config/rdb/``, ...), batch ConsumeQueues
    (``batchconsumequeue/``, ``queue.type=BatchCQ``), compaction topics
    (``cleanup.policy=COMPACTION``, ``compaction/compactionLog/``), a DLedger CommitLog
    (``{group}-{selfId}/data/``), controller mode (``epochFileCheckpoint``, ``brokerIdentity``),
    the tiered store (``config/tieredStoreMetadata.json``, ``tiered_index_file/``), and
    ConsumeQueues without a CommitLog (``storePathCommitLog`` elsewhere, multi-path), and a
    ConsumeQueue extension (``consumequeue_ext/``, ``enableConsumeQueueExt``: the units' tag
    codes are addresses in it, so filtering by tag hash and Apache's later reads of units this
    broker appended would both go wrong)."""
    if not os.path.isdir(root):
        return

    def refuse(what: str, evidence: str) -> None:
        raise ApacheStoreError(
            f"{root}: the store holds {what} ({evidence}), which rmq-broker cannot serve; it refuses to start "
            "before writing anything: serve this store with Apache RocketMQ"
        )

    cq = os.path.join(root, L.CONSUMEQUEUE_DIR)
    if os.path.isdir(cq):
        for name in sorted(os.listdir(cq)):
            if _is_rocksdb_file(name) and os.path.isfile(os.path.join(cq, name)):
                refuse(
                    "ConsumeQueues in RocksDB (storeType=defaultRocksDB)", os.path.join(cq, name)
                )
    config = os.path.join(root, L.CONFIG_DIR)
    for sub in ("topics", "consumerOffsets", "subscriptionGroups", "rdb"):
        if os.path.isdir(os.path.join(config, sub)):
            refuse(
                "RocksDB configuration (configManagerVersion / RocksDB config managers)",
                os.path.join(config, sub),
            )
    batch = os.path.join(root, "batchconsumequeue")
    if _nonempty_dir(batch):
        refuse("batch ConsumeQueues (queue.type=BatchCQ)", batch)
    for topic, conf in sorted(topic_queue_nums(root).items()):
        attrs = conf.get("attributes") or {}
        if not isinstance(attrs, dict):
            continue
        qtype = str(attrs.get("queue.type", attrs.get("+queue.type", ""))).lower()
        if qtype == "batchcq":
            refuse(
                f"topic {topic!r} with a batch ConsumeQueue",
                "attribute queue.type=BatchCQ in config/topics.json",
            )
        policy = str(attrs.get("cleanup.policy", attrs.get("+cleanup.policy", ""))).lower()
        if policy == "compaction":
            refuse(
                f"compaction topic {topic!r}",
                "attribute cleanup.policy=COMPACTION in config/topics.json",
            )
    cq_ext = os.path.join(root, CQ_EXT_DIR)
    if _has_data_file(cq_ext):  # its units' tag codes are ext addresses, not tag hashes
        refuse("a ConsumeQueue extension (enableConsumeQueueExt=true)", cq_ext)
    compaction_log = os.path.join(root, "compaction", "compactionLog")
    if _has_data_file(compaction_log):
        refuse("compaction topics", compaction_log)
    for name in ("epochFileCheckpoint", "brokerIdentity"):
        if os.path.exists(os.path.join(root, name)):
            refuse("a controller-mode (auto-switch HA) broker's state", os.path.join(root, name))
    for name in (os.path.join(L.CONFIG_DIR, "tieredStoreMetadata.json"), "tiered_index_file"):
        if os.path.exists(os.path.join(root, name)):
            refuse(
                "a tiered store (messageStorePlugIn TieredMessageStore)", os.path.join(root, name)
            )
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if (
            "-" in name
            and os.path.isdir(os.path.join(d, "data"))
            and os.path.isdir(os.path.join(d, "index"))
        ):
            refuse("a DLedger CommitLog (enableDLegerCommitLog=true)", d)
    cl = os.path.join(root, L.COMMITLOG_DIR)
    if not os.path.isdir(cl) and is_apache_store(root) and os.path.isdir(cq) and _has_data_file(cq):
        refuse(
            "ConsumeQueues but no CommitLog in commitlog/ (storePathCommitLog elsewhere, or several CommitLog "
            "paths)",
            cl,
        )


def _segment_files(directory: str) -> list[tuple[int, str, int]]:
    """(start offset, path, size) of the segment files of ``directory`` (20-digit names), in
    offset order; a zero-length file (a segment being created) is left out."""
    try:
        names = sorted(n for n in os.listdir(directory) if len(n) == 20 and n.isdigit())
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for n in names:
        path = os.path.join(directory, n)
        size = os.path.getsize(path)
        if size:
            out.append((int(n), path, size))
    return out


def segment_sizes(root: str) -> tuple[int | None, int | None]:
    """The CommitLog segment size in bytes and the ConsumeQueue file size in units (20 bytes)
    the files under ``root`` were written with: Apache RocketMQ's ``mappedFileSizeCommitLog`` /
    ``mappedFileSizeConsumeQueue`` (1 GiB and 300,000 units unless broker.conf says otherwise),
    or this store's own; None where no file tells.  A segment's name is its start offset and
    its size is the store's segment size, so the files must agree: every CommitLog segment one
    size, each starting where the one before ends, every ConsumeQueue file one size, a multiple
    of 20 bytes.  Otherwise :class:`ApacheStoreError` names the file and what was found.  Reads
    only.  The store takes them for a store Apache wrote (:func:`is_apache_store`); in one of its
    own a segment of another size than configured stays corruption."""
    cl_bytes = None
    files = _segment_files(os.path.join(root, L.COMMITLOG_DIR))
    for i, (offset, path, size) in enumerate(files):
        if cl_bytes is None:
            if size < MIN_SEGMENT_BYTES:
                raise ApacheStoreError(
                    f"{path}: CommitLog segment of {size} bytes, less than {MIN_SEGMENT_BYTES}: a segment "
                    "cut short, not a mappedFileSizeCommitLog; the store cannot be served as it is"
                )
            cl_bytes, first = size, path
        elif size != cl_bytes:
            raise ApacheStoreError(
                f"{path}: CommitLog segment of {size} bytes, but {first} is {cl_bytes}: one store's "
                "segments are all one size (mappedFileSizeCommitLog); the store cannot be served as it is"
            )
        if i and offset != files[i - 1][0] + cl_bytes:
            before = files[i - 1][0]
            raise ApacheStoreError(
                f"{path}: CommitLog segment starts at {offset}, but the one before starts at {before} "
                f"and segments are {cl_bytes} bytes (mappedFileSizeCommitLog): expected {before + cl_bytes}"
            )
    cq_bytes = None
    cq = os.path.join(root, L.CONSUMEQUEUE_DIR)
    for topic in sorted(os.listdir(cq)) if os.path.isdir(cq) else []:
        tdir = os.path.join(cq, topic)
        for q in sorted(os.listdir(tdir)) if os.path.isdir(tdir) else []:
            qfiles = _segment_files(os.path.join(tdir, q))
            if not qfiles:
                continue
            _, path, size = qfiles[0]
            if size % L.CQ_UNIT_BYTES:
                raise ApacheStoreError(
                    f"{path}: ConsumeQueue file of {size} bytes, not a whole number of "
                    f"{L.CQ_UNIT_BYTES}-byte units (mappedFileSizeConsumeQueue)"
                )
            if cq_bytes is None:
                cq_bytes, first = size, path
            elif size != cq_bytes:
                raise ApacheStoreError(
                    f"{path}: ConsumeQueue file of {size} bytes, but {first} is {cq_bytes}: one store's "
                    "ConsumeQueue files are all one size (mappedFileSizeConsumeQueue); the store cannot be "
                    "served as it is"
                )
    return cl_bytes, (cq_bytes // L.CQ_UNIT_BYTES if cq_bytes else None)


_FLOCK = struct.Struct("@hhqqi4x")  # struct flock on 64-bit Linux: type, whence, start, len, pid


def lock_like_apache(fd: int) -> str | None:
    """Take the lock Apache RocketMQ takes on ``{root}/lock`` (``FileChannel.tryLock(0, 1,
    false)``: a POSIX record lock, exclusive, on byte 0), without waiting; None when taken, else
    who holds it.  On Linux POSIX record locks and ``flock`` do not exclude each other, so the store
    takes both.  The lock is an open-file-description lock (``F_OFD_SETLK``), which conflicts with
    Apache's process lock but is not dropped when this process closes another descriptor of the
    file (a classic POSIX lock is); ``lockf`` where OFD locks do not exist."""
    ofd = getattr(fcntl, "F_OFD_SETLK", None)
    try:
        if ofd is not None:
            fcntl.fcntl(fd, ofd, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
        else:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        return None
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            raise
    try:
        got = fcntl.fcntl(fd, fcntl.F_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
        pid = _FLOCK.unpack(got)[4]
        return f"pid {pid}" if pid > 0 else "another process"
    except OSError:
        return "another process"
