"""Stored records as the services that re-write them read them: in bulk, decoded into columns
(:func:`read_records`), and the property keys a delivery reads, drops and adds."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rmq_spark.errors import StoreError
from rmq_spark.store import layout as L
from rmq_spark.store.message import host_bytes
from rmq_spark.store.properties import CRC_KEY, decode_properties
from rmq_spark.store.record import HEADER_V4, decode_record, verify_record

if TYPE_CHECKING:
    from rmq_spark.store.store import MessageStore

_HOSTS_V6 = L.FLAG_BORNHOST_V6 | L.FLAG_STOREHOST_V6
_STRUCT_CODES = {"i4": "i", "u4": "I", "i8": "q", "V4": "4s"}
_HEADER = struct.Struct(">" + "".join(_STRUCT_CODES[d[1][-2:]] for d in HEADER_V4.descr))
assert _HEADER.size == HEADER_V4.itemsize
_H = {d[0]: i for i, d in enumerate(HEADER_V4.descr)}
_H_MAGIC, _H_FLAG, _H_SYS_FLAG, _H_BORN_TS = (
    _H["magic"],
    _H["flag"],
    _H["sys_flag"],
    _H["born_timestamp"],
)
_H_BORN_HOST, _H_BORN_PORT, _H_RECONSUME = _H["born_host"], _H["born_port"], _H["reconsume_times"]
_H_PREPARED, _H_BODY_LEN = _H["prepared_offset"], _H["body_len"]
_H_STORE_TS = _H["store_timestamp"]
_CRC_KEY = CRC_KEY
# what a delivery reads from a record's properties, and what it removes before adding its own:
# a delivered copy keeps every property of its source, as Apache's ScheduleMessageService and
# TimerMessageStore store it (DELAY, REAL_TOPIC, REAL_QID, TIMER_* included); only the record CRC
# goes (written again if on)
DELIVERY_KEYS = (L.P_REAL_TOPIC, L.P_REAL_QID, L.P_TAGS, L.P_KEYS, L.P_UNIQ_KEY, _CRC_KEY)
DELIVERY_DROP = (_CRC_KEY,)
_RECORD_HEAD = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE (record.py's diagram)


# the properties the delay and timer put hooks act on: a message without any of them passes
# through them unchanged
DELIVERY_REQUEST_KEYS = (L.P_DELAY, L.P_TIMER_DELIVER_MS, L.P_TIMER_DELAY_SEC, L.P_TIMER_DELAY_MS)


# --- reading stored records in bulk ---------------------------------------------------------------
@dataclass
class StoredRecords:
    """What it takes to write stored records again, one entry per record, in request order."""

    bodies: list[bytes]
    properties: list[dict[str, str]]
    flags: np.ndarray
    sys_flags: np.ndarray
    born_timestamps: np.ndarray
    store_timestamps: np.ndarray
    born_hosts: list[bytes]
    born_ports: np.ndarray
    reconsume_times: np.ndarray
    prepared_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.bodies)


def read_records(store: MessageStore, phys: np.ndarray, sizes: np.ndarray) -> StoredRecords:
    """The records at CommitLog offsets ``phys`` (``sizes`` long), in that order.  One ``struct``
    unpack of the fixed header per record (its format derived from ``record.HEADER_V4``, the one
    definition): cheaper than numpy gathers for the few dozen records of a typical round."""
    n = len(phys)
    bodies: list[bytes] = []
    props: list[dict[str, str]] = []
    heads: list[tuple[Any, ...]] = []  # one HEADER_V4 tuple per record
    mfq = store.commitlog.mfq
    unpack = _HEADER.unpack_from
    force_crc = store.commitlog.force_prop_crc
    mf = None
    for offset, size in zip(
        np.asarray(phys, dtype=np.int64).tolist(),
        np.asarray(sizes, dtype=np.int64).tolist(),
        strict=True,
    ):
        if mf is None or not mf.from_offset <= offset < mf.end_offset:
            mf = mfq.find(offset)
            if mf is None:
                raise StoreError(f"CommitLog offset {offset} is outside the log")
            mm = mf.mm
        pos = offset - mf.from_offset
        why = verify_record(mm, pos, mf.wrote_position, offset, size, force_crc)
        if why:  # never re-written with a fresh CRC: a damaged record would pass for a sound one
            raise store.commitlog.corrupt(offset, why)
        h = unpack(mm, pos)
        if h[_H_SYS_FLAG] & _HOSTS_V6:  # IPv6 hosts move the later fields: rare, decoded in full
            m = decode_record(mm, pos)
            bodies.append(m.body)
            props.append(m.properties)
            v = list(h)
            v[_H_FLAG], v[_H_SYS_FLAG], v[_H_BORN_TS] = m.flag, m.sys_flag, m.born_timestamp_ms
            v[_H_STORE_TS] = m.store_timestamp_ms
            v[_H_BORN_HOST], v[_H_BORN_PORT] = host_bytes(m.born_host), m.born_port
            v[_H_RECONSUME], v[_H_PREPARED] = m.reconsume_times, m.prepared_transaction_offset
            heads.append(tuple(v))
            continue
        heads.append(h)
        p = pos + _HEADER.size
        q = p + h[_H_BODY_LEN]
        bodies.append(mm[p:q])
        if h[_H_MAGIC] == L.MAGIC_V2:
            q += 2 + ((mm[q] << 8) | mm[q + 1])
        else:
            q += 1 + mm[q]
        props.append(decode_properties(mm[q + 2 : q + 2 + ((mm[q] << 8) | mm[q + 1])]))
    cols = list(zip(*heads, strict=True)) if heads else [()] * len(_H)

    def col(i: int, dtype: type) -> np.ndarray:
        return np.array(cols[i], dtype=dtype).reshape(n)

    return StoredRecords(
        bodies=bodies,
        properties=props,
        flags=col(_H_FLAG, np.int32),
        sys_flags=col(_H_SYS_FLAG, np.int32),
        born_timestamps=col(_H_BORN_TS, np.int64),
        store_timestamps=col(_H_STORE_TS, np.int64),
        born_hosts=list(cols[_H_BORN_HOST]),
        born_ports=col(_H_BORN_PORT, np.int32),
        reconsume_times=col(_H_RECONSUME, np.int32),
        prepared_offsets=col(_H_PREPARED, np.int64),
    )
