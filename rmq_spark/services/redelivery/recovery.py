"""Recovery of the re-writing services: the delivered copies written from a checkpoint on, found by
scanning the CommitLog (:func:`scan_copies`).  A delivered copy carries only the properties Apache
RocketMQ stores on it (no marker of this broker's own): the services recognise their copies by
what Apache keeps -- the level (``DELAY``) or the timer's ``TIMER_OUT_MS`` / ``TIMER_ENQUEUE_MS``
-- and match them to their sources by unique id, born time and body (:func:`same_message`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rmq_spark.services.redelivery.records import _RECORD_HEAD, read_records
from rmq_spark.store import layout as L
from rmq_spark.store.message import MessageExt
from rmq_spark.store.record import decode_record

if TYPE_CHECKING:
    from rmq_spark.store.store import MessageStore

__all__ = ["same_message", "scan_copies", "timer_copies_of"]


# --- recovery: which sources were already delivered -----------------------------------------------
def scan_copies(store: MessageStore, start: int, key: str) -> list[MessageExt]:
    """Every record from CommitLog offset ``start`` (a record boundary) that carries property
    ``key`` and is stored in a topic other than a system topic (the schedule, timer and half
    topics hold the sources, not the copies), in CommitLog order.  Segments are searched for the
    key with ``mmap.find`` first; records are walked only where it occurs.  The prepared
    (half) and rolled-back transaction types are left out: no delivery writes them."""
    marker = key.encode() + b"\x01"
    mfq = store.commitlog.mfq
    start = max(start, mfq.min_offset)
    out: list[MessageExt] = []
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
                m = decode_record(mm, pos)
                if (
                    key in m.properties  # (a key found only in a body has no value here)
                    and not L.is_system_topic(m.topic)
                    and m.topic != L.TRANS_HALF_TOPIC
                    and m.sys_flag & L.TRANSACTION_MASK
                    not in (L.TRANSACTION_PREPARED_TYPE, L.TRANSACTION_ROLLBACK_TYPE)
                ):
                    out.append(m)
            pos += size
    return out


def same_message(copy: MessageExt, uniq: str | None, born_ms: int, body: bytes) -> bool:
    """Whether ``copy`` is a delivery of the source with this unique id, born time and body."""
    return (
        copy.properties.get(L.P_UNIQ_KEY) == uniq
        and copy.born_timestamp_ms == born_ms
        and copy.body == body
    )


def timer_copies_of(
    store: MessageStore, phys: np.ndarray, sizes: np.ndarray, deliver_ms: np.ndarray, start: int
) -> np.ndarray:
    """Which of the timer records at ``phys``/``sizes`` (due at ``deliver_ms``) have a delivered
    copy at CommitLog offset >= ``start``: a record outside the system topics with
    ``TIMER_DEQUEUE_MS``, the record's ``TIMER_OUT_MS``, its store time as ``TIMER_ENQUEUE_MS``,
    unique id, born time and body.  Each copy accounts for one record (a client's identical
    resends are told apart by their store times)."""
    done = np.zeros(len(phys), dtype=bool)
    copies: dict[tuple[int, int], list[MessageExt]] = {}
    for c in scan_copies(store, start, L.P_TIMER_DEQUEUE_MS):
        out, enq = (
            c.properties.get(L.P_TIMER_OUT_MS, ""),
            c.properties.get(L.P_TIMER_ENQUEUE_MS, ""),
        )
        if out.lstrip("-").isdigit() and enq.lstrip("-").isdigit():
            copies.setdefault((int(out), int(enq)), []).append(c)
    if not copies:
        return done
    outs = np.fromiter((k[0] for k in copies), np.int64, len(copies))
    cand = np.flatnonzero(np.isin(deliver_ms, outs))
    if len(cand) == 0:
        return done
    src = read_records(store, np.asarray(phys)[cand], np.asarray(sizes)[cand])
    for j, i in enumerate(cand.tolist()):
        p = src.properties[j]
        out = p.get(L.P_TIMER_OUT_MS, "")
        left = (
            copies.get((int(out), int(src.store_timestamps[j])))
            if out.lstrip("-").isdigit()
            else None
        )
        for k, c in enumerate(left or ()):
            if same_message(c, p.get(L.P_UNIQ_KEY), int(src.born_timestamps[j]), src.bodies[j]):
                done[i] = True
                del left[k]  # type: ignore[union-attr]
                break
    return done
