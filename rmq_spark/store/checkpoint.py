"""The store checkpoint: a 4096-byte file of longs, RocketMQ's layout plus two of our own.

::

    0   physicMsgTimestamp   store time of the last flushed CommitLog message
    8   logicsMsgTimestamp   store time of the last flushed ConsumeQueue message
    16  indexMsgTimestamp    store time of the last flushed index entry
    24  masterFlushedOffset  (RocketMQ HA; unused here, kept 0)
    32  confirmPhyOffset     CommitLog bytes known durable (everything below survived a crash)
    40  dispatchedOffset     CommitLog offset up to which ConsumeQueues/index are durable
    48  magic "RMQSPCK1"     this extension's version
"""

from __future__ import annotations

import mmap
import os
import struct

from rmq_spark.store import layout as L

CHECKPOINT_BYTES = 4096
CHECKPOINT_MAGIC = b"RMQSPCK1"
_FIELDS = struct.Struct(">qqqqqq8s")


class StoreCheckpoint:
    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, L.CHECKPOINT_FILE)
        exists = os.path.exists(self.path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size != CHECKPOINT_BYTES:
            os.ftruncate(self._fd, CHECKPOINT_BYTES)
        self._mm = mmap.mmap(self._fd, CHECKPOINT_BYTES)
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        self.confirm_phy_offset = 0
        self.dispatched_offset = 0
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
            if magic != CHECKPOINT_MAGIC:
                # a RocketMQ checkpoint (or a fresh file): our offsets are unknown
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
        self._mm.flush()

    def close(self) -> None:
        self._mm.close()
        os.close(self._fd)
