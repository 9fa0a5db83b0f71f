"""Re-writing stored records into their real topic: what the delay-level and timer services
deliver, by decoding records and encoding them again (:func:`encode_redelivered`,
:func:`put_redelivered`); larger rounds patch the bytes instead (:mod:`.patch`), with the same
result byte for byte.  Also the real queue of a message (:func:`resolve_queue`,
:func:`resolve_queues`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rmq_spark.errors import MessageIllegalError
from rmq_spark.services.redelivery.records import StoredRecords
from rmq_spark.store import layout as L
from rmq_spark.store.encode import encode_columns
from rmq_spark.store.encoded import EncodedBatch
from rmq_spark.store.message import host_bytes, new_uniq_ids
from rmq_spark.store.properties import PROP_CRC_BYTES, encode_properties
from rmq_spark.store.validation import check_topic

if TYPE_CHECKING:
    from rmq_spark.store.store import MessageStore, PutResult


# --- writing redelivered records ------------------------------------------------------------------
def resolve_queue(
    store: MessageStore, topic: str, queue_id: str | int | None, cache: dict[str, int]
) -> int:
    """The queue a redelivered message goes to: its ``REAL_QID``, folded into the topic's queue
    count when the topic shrank.  Raises an :class:`RmqError` when the topic cannot take it
    (invalid name, missing with auto-creation off)."""
    nq = cache.get(topic)
    if nq is None:
        check_topic(topic, allow_system=True)
        cfg = store.topics.get_or_create(topic)
        nq = cache[topic] = max(cfg.write_queue_nums, cfg.read_queue_nums, 1)
    try:
        qid = int(queue_id) if queue_id is not None else 0
    except ValueError:
        qid = 0
    return qid if 0 <= qid < nq else qid % nq


def put_redelivered(
    store: MessageStore,
    src: StoredRecords,
    rows: list[int],
    topics: list[str],
    queue_ids: list[int],
    properties: list[dict[str, str]],
) -> PutResult:
    """Write records ``rows`` of ``src`` again, to ``topics``/``queue_ids`` with ``properties``, as
    ONE CommitLog write (one batch: visible together).  Topics must have been resolved with
    :func:`resolve_queue`."""
    return store.put_encoded(encode_redelivered(store, src, rows, topics, queue_ids, properties))


def encode_redelivered(
    store: MessageStore,
    src: StoredRecords,
    rows: list[int],
    topics: list[str],
    queue_ids: list[int],
    properties: list[dict[str, str]],
) -> EncodedBatch:
    """The batch :func:`put_redelivered` writes (the general path: decoded properties)."""
    encoded = [encode_properties(p) for p in properties]
    limit = L.PROPERTY_MAX_BYTES - (PROP_CRC_BYTES if store.config.append_prop_crc else 0)
    for e in encoded:
        if len(e) > limit:
            raise MessageIllegalError(
                f"redelivered message properties are {len(e)} bytes; the limit is {limit}"
            )
    missing = [i for i, p in enumerate(properties) if L.P_UNIQ_KEY not in p]
    if missing:
        for i, uid in zip(missing, new_uniq_ids(len(missing)), strict=True):
            properties[i][L.P_UNIQ_KEY] = uid
            encoded[i] = encode_properties(properties[i])
    idx = np.asarray(rows, dtype=np.int64)
    shared = topics[0] if topics.count(topics[0]) == len(topics) else None
    batch = encode_columns(
        shared if shared is not None else topics,
        queue_ids,
        [src.bodies[i] for i in rows],
        properties,
        encoded,
        flags=src.flags[idx],
        sys_flags=src.sys_flags[idx],
        born_timestamps=src.born_timestamps[idx],
        born_hosts=[src.born_hosts[i] for i in rows],
        born_ports=src.born_ports[idx],
        reconsume_times=src.reconsume_times[idx],
        prepared_offsets=src.prepared_offsets[idx],
        store_host=host_bytes(store.config.store_host),
        store_port=store.config.store_port,
        prop_crc=store.config.append_prop_crc,
    )
    return batch


def resolve_queues(
    store: MessageStore, topics: list[str], queue_ids: list[str | None], cache: dict[str, int]
) -> np.ndarray:
    """:func:`resolve_queue` of many records (each distinct topic and queue text parsed once)."""
    for t in set(topics):
        if t not in cache:
            resolve_queue(store, t, 0, cache)
    parsed: dict[str | None, int] = {}
    for raw in set(queue_ids):
        try:
            parsed[raw] = int(raw) if raw is not None else 0
        except ValueError:
            parsed[raw] = 0
    n = len(topics)
    nq = np.fromiter(map(cache.__getitem__, topics), dtype=np.int64, count=n)
    q = np.fromiter(map(parsed.__getitem__, queue_ids), dtype=np.int64, count=n)
    return np.where((q >= 0) & (q < nq), q, q % nq)
