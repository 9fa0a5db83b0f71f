"""The real messages a commit writes, made by patching the halves' bytes (:func:`encode_commits`):
the byte-patching re-write of :mod:`rmq_spark.services.redelivery.patch` applied to halves."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rmq_spark.services.redelivery.patch import ParsedRecords, encode_redelivery, parse_records
from rmq_spark.store import layout as L
from rmq_spark.store.encoded import EncodedBatch
from rmq_spark.store.properties import CRC_KEY

if TYPE_CHECKING:
    from rmq_spark.store.store import MessageStore

# a committed half's real message: the half's properties without REAL_TOPIC / REAL_QID, TRAN_MSG=true
# kept, as Apache RocketMQ 5.5.0 stores it (compared in tests/interop/test_apache_properties.py);
# the record CRC is written again if on
_COMMIT_DROP = (L.P_REAL_TOPIC, L.P_REAL_QID, CRC_KEY)
_COMMIT_KEYS = (
    L.P_TAGS,
    L.P_KEYS,
    L.P_UNIQ_KEY,
    L.P_REAL_TOPIC,
    L.P_REAL_QID,
    L.P_TRAN_MSG,
    CRC_KEY,
)


def commit_keys(hooked: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The properties :func:`encode_commits` parses (a lookup may parse them first)."""
    return _COMMIT_KEYS + tuple(k for k in hooked if k not in _COMMIT_KEYS)


def encode_commits(
    store: MessageStore,
    phys: np.ndarray,
    sizes: np.ndarray | None,
    hooked: tuple[str, ...] = (),
    parsed: ParsedRecords | None = None,
) -> EncodedBatch | None:
    """The real messages a commit of the halves at ``phys``/``sizes`` writes, made by patching the
    halves' bytes: topic and queue from ``REAL_TOPIC``/``REAL_QID`` (those removed from the
    properties, ``TRAN_MSG`` kept), SYSFLAG COMMIT, PREPAREDTRANSACTIONOFFSET the half's offset.
    None when a half needs the general path: unusual bytes, one of the properties ``hooked`` (a
    put hook must see it), a real queue out of range (the general path names the error).
    ``parsed``: the halves already parsed with :func:`commit_keys` (then ``sizes`` is unused)."""
    rec = parsed if parsed is not None else parse_records(store, phys, sizes, commit_keys(hooked))  # type: ignore[arg-type]  # sizes given when parsed is not
    if rec is None:
        return None
    if hooked and np.isin(rec.seg_key, [rec.keys.index(k) for k in hooked]).any():
        return None
    real, raw_qids, uniq = (rec.values(k) for k in (L.P_REAL_TOPIC, L.P_REAL_QID, L.P_UNIQ_KEY))
    tags, words = rec.values(L.P_TAGS), rec.values(L.P_KEYS)
    if real is None or raw_qids is None or uniq is None or tags is None or words is None:
        return None
    if None in real or None in uniq or None in raw_qids:
        return None
    try:
        qids = np.array(raw_qids, dtype=np.int64)
    except ValueError:
        return None
    for t in set(real):
        cfg = store.topics.get_or_create(t)  # type: ignore[arg-type]  # no None: returned above
        if ((qids < 0) | (qids >= max(cfg.write_queue_nums, cfg.read_queue_nums)))[
            np.asarray(real) == t
        ].any():
            return None
    flags = (rec.head["sys_flag"] & ~L.TRANSACTION_MASK) | L.TRANSACTION_COMMIT_TYPE
    return encode_redelivery(
        store, rec, _COMMIT_DROP, real, qids, [b""] * len(rec), tags, words, uniq,  # type: ignore[arg-type]
        sys_flags=flags, prepared_offsets=np.asarray(phys, dtype=np.int64),
    )  # fmt: skip
