"""The store checkpoint: a 4096-byte file of longs, RocketMQ's layout plus two of our own.

::

    0   physicMsgTimestamp   store time of the last flushed CommitLog message
    8   logicsMsgTimestamp   store time of the last flushed ConsumeQueue message
    16  indexMsgTimestamp    store time of the last flushed index entry
    24  masterFlushedOffset  (RocketMQ HA; unused here, kept 0)
    32  confirmPhyOffset     CommitLog bytes known durable (everything below survived a crash)
    40  dispatchedOffset     CommitLog offset up to which ConsumeQueues/index are durable
    48  magic "RMQSPCK2"     this extension's version ("RMQSPCK1": the same without the CRC)
    56  crc32                of bytes 0 .. 55

A checkpoint whose CRC does not match (or whose magic is damaged) is logged, naming the file,
and read as none: recovery then scans the whole CommitLog, checking every record, instead of
trusting offsets that may be wrong.  (Apache RocketMQ opening a store this one wrote rewrites bytes
0..39 and leaves ours: the CRC then no longer matches, read the same way.)

Apache RocketMQ's own checkpoint (bytes 40.. zero) is read for what it says
(:attr:`StoreCheckpoint.written_by_apache`): its physicMsgTimestamp is the store time of the last
record it flushed, so recovery knows the records stored up to then are durable.  Its
confirmPhyOffset is the start of the last record at its previous recovery, no durable bound, and
our offsets are unknown: recovery checks the whole CommitLog.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct

from zlib_ng.zlib_ng import crc32

from rmq_spark.store import layout as L
from rmq_spark.store.mapped import allocate

CHECKPOINT_BYTES = 4096
CHECKPOINT_MAGIC = b"RMQSPCK2"
CHECKPOINT_MAGIC_V1 = b"RMQSPCK1"  # without the CRC
_FIELDS = struct.Struct(">qqqqqq8s")
_CRC = struct.Struct(">I")
log = logging.getLogger("rmq_spark.store")


class StoreCheckpoint:
    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, L.CHECKPOINT_FILE)
        exists = os.path.exists(self.path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(self._fd).st_size != CHECKPOINT_BYTES:
                os.ftruncate(self._fd, CHECKPOINT_BYTES)
            allocate(
                self._fd, 0, CHECKPOINT_BYTES, self.path
            )  # a full disk: an error, not a SIGBUS
        except BaseException:
            os.close(self._fd)
            raise
        self._mm = mmap.mmap(self._fd, CHECKPOINT_BYTES)
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        self.confirm_phy_offset = 0
        self.dispatched_offset = 0
        self.written_by_apache = False  # Apache RocketMQ's checkpoint (see the module's text)
        if exists:
            (
                self.physic_msg_timestamp,
                self.logics_msg_timestamp,
                self.index_msg_timestamp,
                _master,
                self.confirm_phy_offset,
                self.dispatched_offset,
                magic,
            ) = _FIELDS.unpack_from(self._mm, 0)
            crc = _CRC.unpack_from(self._mm, _FIELDS.size)[0]
            sound = (
                magic == CHECKPOINT_MAGIC and crc == crc32(self._mm[: _FIELDS.size])
            ) or magic == CHECKPOINT_MAGIC_V1
            if not sound:
                if magic != bytes(8):  # not RocketMQ's (nor a fresh file): damaged
                    log.error(
                        "%s: the checkpoint is damaged (magic %r, CRC %08x), or Apache RocketMQ rewrote its "
                        "fields; recovery checks the whole CommitLog",
                        self.path,
                        magic,
                        crc,
                    )
                    self.physic_msg_timestamp = self.logics_msg_timestamp = (
                        self.index_msg_timestamp
                    ) = 0
                else:
                    self.written_by_apache = self.physic_msg_timestamp > 0
                # our offsets are unknown
                self.confirm_phy_offset = 0
                self.dispatched_offset = 0

    @property
    def min_timestamp(self) -> int:
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    def flush(self) -> None:
        _FIELDS.pack_into(
            self._mm,
            0,
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            0,
            self.confirm_phy_offset,
            self.dispatched_offset,
            CHECKPOINT_MAGIC,
        )
        _CRC.pack_into(self._mm, _FIELDS.size, crc32(self._mm[: _FIELDS.size]))
        self._mm.flush()

    def close(self) -> None:
        self._mm.close()
        os.close(self._fd)
