"""Encoders of CommitLog records (:mod:`rmq_spark.store.record` defines the layout): from columns,
vectorized with numpy and Arrow (:func:`encode_columns`), from lists of Python values with struct
(:func:`encode_lists`, :func:`encode_messages`), and one IPv4 record for the broker's one-message send
(:func:`encode_v4_record` / :func:`place_v4_record`).  Every encoder writes the same bytes for the same message
(``tests/store/test_put_paths.py`` holds them to it).

Why this module is long: one concept, the record encoders, whose fast paths stand beside the
general one they must match byte for byte; its imports, wrapped one name a line, take 22 lines."""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from zlib_ng.zlib_ng import crc32

from rmq_spark.store import layout as L
from rmq_spark.store.dispatch import as_list
from rmq_spark.store.encoded import SMALL_BATCH, EncodedBatch
from rmq_spark.store.message import Message, host_bytes, tags_code
from rmq_spark.store.properties import PROP_CRC_BYTES, PROP_CRC_PLACEHOLDER, PROP_CRC_PREFIX
from rmq_spark.store.record import (
    HEADER_V4,
    HOST_V6_EXTRA,
    POS_BODY_V4,
    POS_BORN_HOST,
    POS_QUEUE_OFFSET,
    POS_STORE_TIMESTAMP_V4,
)

_INT = struct.Struct(">i")
_SHORT = struct.Struct(">H")
_HEAD1 = struct.Struct(">iIiiiqqiq")  # total..born timestamp (48 bytes)
_TS = struct.Struct(">q")
_QP = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET
_MID = struct.Struct(">iqi")  # reconsume, prepared offset, body len (after store host)
_HEAD_V4 = struct.Struct(">iIiiiqqiq4siq4siiqi")  # the whole fixed part with IPv4 hosts + BODYLEN
assert _HEAD_V4.size == HEADER_V4.itemsize

# records at least this long on average are assembled with one copy per body (memcpy-bound);
# shorter ones through Arrow's element-wise join (call-overhead-bound)
LARGE_RECORD_BYTES = 1024


def _assemble_large(  # type: ignore[no-untyped-def]
    headers: np.ndarray, bodies: Sequence[bytes], body_lens: np.ndarray, tails, total: int
) -> bytearray:
    n = len(bodies)
    out = bytearray(total)
    arr = np.frombuffer(out, dtype=np.uint8)
    sizes = (
        POS_BODY_V4
        + body_lens
        + (
            tails.shape[1]
            if isinstance(tails, np.ndarray)
            else np.fromiter(map(len, tails), np.int64, n)
        )
    )
    starts = np.cumsum(sizes) - sizes
    arr[starts[:, None] + np.arange(POS_BODY_V4)] = headers.view(np.uint8).reshape(n, POS_BODY_V4)
    mv = memoryview(out)
    for p, b in zip((starts + POS_BODY_V4).tolist(), bodies, strict=True):
        mv[p : p + len(b)] = b
    tail_at = starts + POS_BODY_V4 + body_lens
    if isinstance(tails, np.ndarray):
        arr[tail_at[:, None] + np.arange(tails.shape[1])] = tails
    else:
        for p, t in zip(tail_at.tolist(), tails, strict=True):
            mv[p : p + len(t)] = t
    del arr, mv
    return out


def _assemble_uniform(
    headers: np.ndarray, bodies: Sequence[bytes] | np.ndarray, body_len: int, tails2d: np.ndarray
) -> bytearray:
    """Records of one size (equal bodies, equal tails) as rows of a 2-D array: three strided
    copies, no per-record call.  ``bodies``: a list, or already an (n, body_len) uint8 array."""
    n = len(bodies)
    width = POS_BODY_V4 + body_len + tails2d.shape[1]
    out = bytearray(n * width)
    rows = np.frombuffer(out, dtype=np.uint8).reshape(n, width)
    rows[:, :POS_BODY_V4] = headers.view(np.uint8).reshape(n, POS_BODY_V4)
    if body_len:
        if not isinstance(bodies, np.ndarray):
            bodies = np.frombuffer(b"".join(bodies), dtype=np.uint8).reshape(n, body_len)
        rows[:, POS_BODY_V4 : POS_BODY_V4 + body_len] = bodies
    rows[:, POS_BODY_V4 + body_len :] = tails2d
    del rows
    return out


def _equal_bodies(bodies: pa.Array) -> np.ndarray | None:
    """The bodies of an Arrow binary column as the rows of an (n, length) uint8 view of its
    buffer, when they all have one length (else None)."""
    if bodies.null_count or bodies.type not in (pa.binary(), pa.large_binary()):
        return None
    n = len(bodies)
    width = np.int64 if bodies.type == pa.large_binary() else np.int32
    offsets = np.frombuffer(bodies.buffers()[1], dtype=width)[bodies.offset : bodies.offset + n + 1]
    length = int(offsets[1] - offsets[0])
    if (
        length <= 0
        or int(offsets[-1] - offsets[0]) != n * length
        or not bool((np.diff(offsets) == length).all())
    ):
        return None
    return np.frombuffer(bodies.buffers()[2], dtype=np.uint8)[
        int(offsets[0]) : int(offsets[-1])
    ].reshape(n, length)


def encode_columns(
    topics: Sequence[str] | str,
    queue_ids: Sequence[int] | np.ndarray | int,
    bodies: Sequence[bytes] | pa.BinaryArray,
    properties: Sequence[dict[str, str]],
    encoded_properties: Sequence[bytes] | np.ndarray,
    *,
    flags: Sequence[int] | np.ndarray | int = 0,
    sys_flags: Sequence[int] | np.ndarray | int = 0,
    born_timestamps: Sequence[int] | np.ndarray | int = 0,
    born_hosts: Sequence[bytes] | bytes = b"\x7f\x00\x00\x01",
    born_ports: Sequence[int] | np.ndarray | int = 0,
    reconsume_times: Sequence[int] | np.ndarray | int = 0,
    prepared_offsets: Sequence[int] | np.ndarray | int = 0,
    store_host: bytes = b"\x7f\x00\x00\x01",
    store_port: int = 0,
    prop_crc: bool = False,
    tags_codes: np.ndarray | Sequence[int] | None = None,
    keys: list[str | None] | None = None,
    uniq_keys: Sequence[str | None] | None = None,
    body_crcs: np.ndarray | None = None,
) -> EncodedBatch:
    """Encode ``n`` records into one buffer. Per-record arguments are sequences of length ``n``
    or a scalar shared by all (``topics`` too).  ``encoded_properties`` may be a 2-D uint8 array
    when every record's properties have the same length (the columnar fast path), or an Arrow
    binary array (properties built column-wise, :mod:`rmq_spark.store.rowprops`: a shared topic,
    ``tags_codes``, ``keys`` and ``uniq_keys`` given, ``properties`` read only when asked for).
    IPv6 hosts set their sysflag bits automatically.  ``bodies`` may be an Arrow binary column:
    bodies of one length are then copied and checked from its buffer (no bytes object each).
    ``body_crcs``: the bodies' BODYCRCs when known (records of bodies encoded before)."""
    n = len(bodies)
    body_rows = None  # (n, length) uint8 view of the bodies when they all have one length
    if isinstance(bodies, pa.Array):
        body_rows = _equal_bodies(bodies) if n > SMALL_BATCH else None
        if body_rows is None:
            bodies = bodies.to_pylist()
    if isinstance(encoded_properties, pa.Array) and n > SMALL_BATCH:
        assert (
            isinstance(topics, str)
            and tags_codes is not None
            and keys is not None
            and uniq_keys is not None
        )
    elif isinstance(encoded_properties, pa.Array):
        encoded_properties = encoded_properties.to_pylist()
    if 0 < n <= SMALL_BATCH and not isinstance(encoded_properties, np.ndarray):
        return _encode_columns_few(
            topics, queue_ids, bodies, properties, encoded_properties, flags, sys_flags,
            born_timestamps, born_hosts, born_ports, reconsume_times, prepared_offsets,
            store_host, store_port, prop_crc, tags_codes,
        )  # fmt: skip
    shared_topic = isinstance(topics, str)
    topic_list = [topics] * n if isinstance(topics, str) else list(topics)
    sflags = _col(sys_flags, n, np.int32) & ~(L.FLAG_BORNHOST_V6 | L.FLAG_STOREHOST_V6)
    if isinstance(born_hosts, (bytes, bytearray)):
        bhosts: list[bytes] | None = None
        v6_born = np.full(n, len(born_hosts) == 16)
    else:
        bhosts = list(born_hosts)
        v6_born = np.fromiter((len(h) == 16 for h in bhosts), dtype=bool, count=n)
    sflags = sflags | np.where(v6_born, L.FLAG_BORNHOST_V6, 0).astype(np.int32)
    if len(store_host) == 16:
        sflags |= L.FLAG_STOREHOST_V6
    # TOPIC + PROPERTIES ("tail") of each record
    fixed_props = isinstance(encoded_properties, np.ndarray)
    if shared_topic:
        tb = topics.encode("utf-8")  # type: ignore[union-attr]
        v2 = len(tb) > 127
        magics = np.full(n, L.MAGIC_V2 if v2 else L.MAGIC_V1, dtype=np.uint32)
        topic_field = (_SHORT.pack(len(tb)) if v2 else bytes((len(tb),))) + tb
    if shared_topic and fixed_props:
        props2d = cast(np.ndarray, encoded_properties)  # fixed_props
        plen = props2d.shape[1] + (PROP_CRC_BYTES if prop_crc else 0)
        head = np.frombuffer(topic_field + _SHORT.pack(plen), dtype=np.uint8)
        width = len(head) + plen
        tails2d = np.empty((n, width), dtype=np.uint8)
        tails2d[:, : len(head)] = head
        tails2d[:, len(head) : len(head) + props2d.shape[1]] = props2d
        if prop_crc:
            tails2d[:, width - PROP_CRC_BYTES :] = np.frombuffer(
                PROP_CRC_PLACEHOLDER, dtype=np.uint8
            )
        tails = None
        tail_lens = np.full(n, width, dtype=np.int64)
        props_bytes = None
    elif shared_topic and isinstance(encoded_properties, pa.Array):
        # TOPIC + PROPERTIES joined by Arrow: the topic field, each record's 2-byte length, its bytes
        props_arr = encoded_properties
        if prop_crc:
            props_arr = pc.binary_join_element_wise(props_arr, pa.scalar(PROP_CRC_PLACEHOLDER, pa.binary()),
                                                    pa.scalar(b"", pa.binary()))  # fmt: skip
        plens = pc.binary_length(props_arr).to_numpy(zero_copy_only=False).astype(np.int64)
        prefix = np.asarray(plens, dtype=">u2").view(np.uint8).reshape(n, 2)
        prefix_arr = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(2), n, [None, pa.py_buffer(prefix.copy())]
        )
        tails_arrow = pc.binary_join_element_wise(
            pa.scalar(topic_field, pa.binary()), prefix_arr.cast(pa.binary()), props_arr, pa.scalar(b"", pa.binary())
        )  # fmt: skip
        tail_lens = len(topic_field) + 2 + plens
        props_bytes = tails_arrow  # (an Arrow array: the tails themselves)
        tails = None
    else:
        props_bytes = [bytes(p) for p in encoded_properties]
        if prop_crc:
            props_bytes = [pb + PROP_CRC_PLACEHOLDER for pb in props_bytes]
        tail_list = []
        if not shared_topic:
            magics = np.empty(n, dtype=np.uint32)
        for i, pb in enumerate(props_bytes):
            if shared_topic:
                tail_list.append(topic_field + _SHORT.pack(len(pb)) + pb)
                continue
            tbi = topic_list[i].encode("utf-8")
            if len(tbi) > 127:
                magics[i] = L.MAGIC_V2
                tail_list.append(_SHORT.pack(len(tbi)) + tbi + _SHORT.pack(len(pb)) + pb)
            else:
                magics[i] = L.MAGIC_V1
                tail_list.append(bytes((len(tbi),)) + tbi + _SHORT.pack(len(pb)) + pb)
        tails = None
        tail_lens = np.fromiter(map(len, tail_list), dtype=np.int64, count=n)
    if body_rows is not None:
        body_lens = np.full(n, body_rows.shape[1], dtype=np.int64)
    else:
        body_lens = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
    if body_crcs is not None and len(body_crcs) == n:
        crcs = np.asarray(body_crcs, dtype=np.int64)
    elif body_rows is not None:
        items = body_rows.reshape(-1).view(
            f"V{body_rows.shape[1]}"
        )  # a void item a body: crc32 reads those fastest
        crcs = np.fromiter(map(crc32, items), np.int64, n) & 0x7FFFFFFF
    else:
        crcs = np.array(list(map(crc32, bodies)), dtype=np.int64) & 0x7FFFFFFF
    if tags_codes is None:
        tags_codes = np.fromiter(
            (tags_code(p.get(L.P_TAGS)) for p in properties), dtype=np.int64, count=n
        )
    qids = _col(queue_ids, n, np.int32)

    if n > SMALL_BATCH and not v6_born.any() and len(store_host) == 4:
        sizes = POS_BODY_V4 + body_lens + tail_lens
        h = np.zeros(n, dtype=HEADER_V4)
        h["total_size"] = sizes
        h["magic"] = magics
        h["body_crc"] = crcs
        h["queue_id"] = qids
        h["flag"] = _col(flags, n, np.int32)
        h["sys_flag"] = sflags
        h["born_timestamp"] = _col(born_timestamps, n, np.int64)
        if bhosts is None:
            h["born_host"] = np.frombuffer(bytes(born_hosts), dtype="V4")[0]  # type: ignore[arg-type]
        elif n:
            h["born_host"] = np.frombuffer(b"".join(bhosts), dtype="V4")
        h["born_port"] = _col(born_ports, n, np.int32)
        h["store_host"] = np.frombuffer(store_host, dtype="V4")[0]
        h["store_port"] = store_port
        h["reconsume_times"] = _col(reconsume_times, n, np.int32)
        h["prepared_offset"] = _col(prepared_offsets, n, np.int64)
        h["body_len"] = body_lens
        total = int(sizes.sum())
        arrow_tails = isinstance(props_bytes, pa.Array)
        if arrow_tails:
            tail_list = props_bytes  # type: ignore[assignment]
        if body_rows is not None and total >= n * LARGE_RECORD_BYTES:
            bodies = bodies.to_pylist()  # type: ignore[union-attr]
        if total >= n * LARGE_RECORD_BYTES:
            if props_bytes is None:
                big_tails = tails2d
            else:  # tail_list is bound whenever props_bytes is given
                big_tails = tail_list.to_pylist() if arrow_tails else tail_list  # type: ignore[attr-defined,assignment]
            buf = _assemble_large(h, bodies, body_lens, big_tails, total)
        elif props_bytes is None and n and int(body_lens.min()) == int(body_lens.max()):
            buf = _assemble_uniform(
                h, body_rows if body_rows is not None else bodies, int(body_lens[0]), tails2d
            )
        else:
            if props_bytes is None:
                tails = pa.FixedSizeBinaryArray.from_buffers(
                    pa.binary(tails2d.shape[1]), n, [None, pa.py_buffer(tails2d)]
                ).cast(pa.binary())
            elif arrow_tails:
                tails = tail_list
            else:
                tails = pa.array(tail_list, pa.binary())
            headers = pa.FixedSizeBinaryArray.from_buffers(
                pa.binary(POS_BODY_V4), n, [None, pa.py_buffer(h)]
            ).cast(pa.binary())
            # one C++ pass interleaves header, body and tail of every record
            joined = pc.binary_join_element_wise(
                headers,
                bodies if isinstance(bodies, pa.Array) else pa.array(bodies, pa.binary()),
                tails,
                pa.scalar(b"", pa.binary()),
            )
            buf = bytearray(memoryview(joined.buffers()[2])[:total]) if n else bytearray()
        store_ts_pos = np.full(n, POS_STORE_TIMESTAMP_V4, dtype=np.int64)
    else:
        if isinstance(bodies, pa.Array):
            bodies = bodies.to_pylist()
        hosts = bhosts if bhosts is not None else [bytes(born_hosts)] * n  # type: ignore[arg-type]
        if isinstance(props_bytes, pa.Array):
            tail_list = props_bytes.to_pylist()
        tail_py = tail_list if props_bytes is not None else [r.tobytes() for r in tails2d]
        flg = _col(flags, n, np.int32)
        bts = _col(born_timestamps, n, np.int64)
        bports = _col(born_ports, n, np.int32)
        rts = _col(reconsume_times, n, np.int32)
        prep = _col(prepared_offsets, n, np.int64)
        chunks = []
        sizes = np.empty(n, dtype=np.int64)
        store_ts_pos = np.empty(n, dtype=np.int64)
        for i in range(n):
            sf = int(sflags[i])
            size = POS_BODY_V4 + int(body_lens[i]) + int(tail_lens[i])
            size += HOST_V6_EXTRA if sf & L.FLAG_BORNHOST_V6 else 0
            size += HOST_V6_EXTRA if sf & L.FLAG_STOREHOST_V6 else 0
            sizes[i] = size
            store_ts_pos[i] = POS_BORN_HOST + len(hosts[i]) + 4
            chunks.append(
                _HEAD1.pack(
                    size,
                    int(magics[i]),
                    int(crcs[i]),
                    int(qids[i]),
                    int(flg[i]),
                    0,
                    0,
                    sf,
                    int(bts[i]),
                )
                + hosts[i]
                + _INT.pack(int(bports[i]))
                + _TS.pack(0)
                + store_host
                + _INT.pack(store_port)
                + _MID.pack(int(rts[i]), int(prep[i]), int(body_lens[i]))
                + bodies[i]
                + tail_py[i]
            )
        buf = bytearray(b"".join(chunks))
    sizes = sizes.astype(np.int64)
    rel_pos = np.cumsum(sizes) - sizes
    if properties is None or len(properties) != n:
        raise ValueError("properties must give one dict per record")
    if keys is not None and uniq_keys is not None:  # given with properties built column-wise
        return EncodedBatch(
            buf=buf, rel_pos=rel_pos, sizes=sizes.astype(np.int32), store_ts_pos=store_ts_pos, queue_ids=qids,
            topics=topic_list, tags_codes=tags_codes, sys_flags=sflags, keys=keys, uniq_keys=uniq_keys,
            properties=properties, prop_crc=prop_crc,
        )  # fmt: skip
    return EncodedBatch(
        buf=buf,
        rel_pos=rel_pos,
        sizes=sizes.astype(np.int32),
        store_ts_pos=store_ts_pos,
        queue_ids=qids,
        topics=topic_list,
        tags_codes=tags_codes,
        sys_flags=sflags,
        # fixed-width properties (put_bodies) share one dict: its keys, and UNIQ_KEYs set by the caller
        keys=[p.get(L.P_KEYS) for p in properties]
        if not fixed_props
        else [properties[0].get(L.P_KEYS) if n else None] * n,
        uniq_keys=[p.get(L.P_UNIQ_KEY) for p in properties]
        if not fixed_props
        else [properties[0].get(L.P_UNIQ_KEY) if n else None] * n,
        properties=list(properties),
        prop_crc=prop_crc,
    )


def _encode_columns_few(  # type: ignore[no-untyped-def]
    topics,
    queue_ids,
    bodies,
    properties,
    encoded_properties,
    flags,
    sys_flags,
    born_timestamps,
    born_hosts,
    born_ports,
    reconsume_times,
    prepared_offsets,
    store_host,
    store_port,
    prop_crc,
    tags_codes,
) -> EncodedBatch:
    """:func:`encode_columns` of a few records in plain Python with struct (the same bytes: numpy's
    per-call cost dominates at this size)."""
    n = len(bodies)
    if properties is None or len(properties) != n:
        raise ValueError("properties must give one dict per record")
    topic_list = [topics] * n if isinstance(topics, str) else list(topics)
    hosts = (
        [bytes(born_hosts)] * n if isinstance(born_hosts, (bytes, bytearray)) else list(born_hosts)
    )
    codes = (
        as_list(tags_codes)
        if tags_codes is not None
        else [tags_code(p.get(L.P_TAGS)) for p in properties]
    )
    return _encode_rows(
        topic_list, _lst(queue_ids, n), bodies, properties, [bytes(p) for p in encoded_properties],
        _lst(flags, n), _lst(sys_flags, n), _lst(born_timestamps, n), hosts, _lst(born_ports, n),
        _lst(reconsume_times, n), _lst(prepared_offsets, n), store_host, store_port, prop_crc, codes,
    )  # fmt: skip


def encode_messages(
    msgs: Sequence[Message],
    encoded_properties: list[bytes],
    born_default_ms: int,
    store_host: bytes,
    store_port: int,
    prop_crc: bool,
) -> EncodedBatch:
    """Records of a few checked :class:`~rmq_spark.store.message.Message` objects (their
    properties already encoded; ``born_default_ms`` for a message without a born time)."""
    props = [m.properties for m in msgs]
    return _encode_rows(
        [m.topic for m in msgs], [m.queue_id for m in msgs],
        [m.body if m.body.__class__ is bytes else bytes(m.body) for m in msgs], props,
        encoded_properties, [m.flag for m in msgs], [m.sys_flag for m in msgs],
        [m.born_timestamp_ms or born_default_ms for m in msgs], [host_bytes(m.born_host) for m in msgs],
        [m.born_port for m in msgs], [m.reconsume_times for m in msgs],
        [m.prepared_transaction_offset for m in msgs], store_host, store_port, prop_crc,
        [tags_code(p.get(L.P_TAGS)) for p in props],
    )  # fmt: skip


# One record to write, as the columns of :func:`encode_lists` / :func:`encode_columns`: topic, queue id,
# body, properties, the properties encoded (with their UNIQ_KEY), tagsCode, flag, sys flag, born
# time, born host, born port, reconsume times, prepared transaction offset.
Row = tuple[str, int, bytes, dict[str, str], bytes, int, int, int, int, str, int, int, int]


# the sys flag of a record with IPv4 born and store hosts (the IPv6 host bits cleared)
V4_SYS_FLAG_MASK = ~(L.FLAG_BORNHOST_V6 | L.FLAG_STOREHOST_V6)
_FIXED_PARTS = POS_BODY_V4 + 2  # + the body, + PROPERTIES_LENGTH's properties


def encode_lists(
    topics: Sequence[str],
    queue_ids: Sequence[int],
    bodies: Sequence[bytes],
    properties: Sequence[dict[str, str]],
    encoded_properties: Sequence[bytes],
    tags_codes: Sequence[int],
    flags: Sequence[int],
    sys_flags: Sequence[int],
    born_timestamps: Sequence[int],
    born_hosts: Sequence[str],
    born_ports: Sequence[int],
    reconsume_times: Sequence[int],
    prepared_offsets: Sequence[int],
    store_host: bytes,
    store_port: int,
    prop_crc: bool,
) -> EncodedBatch:
    """Records of a few checked messages given as columns (lists or tuples of Python values;
    bodies bytes, born hosts as text, properties encoded with their UNIQ_KEY), encoded one by one
    as :func:`encode_messages` does, without Message objects."""
    return _encode_rows(
        list(topics), list(queue_ids), bodies, properties, encoded_properties, flags, sys_flags,
        born_timestamps, [host_bytes(h) for h in born_hosts], born_ports, reconsume_times,
        prepared_offsets, store_host, store_port, prop_crc, list(tags_codes),
    )  # fmt: skip


def _encode_rows(  # type: ignore[no-untyped-def]
    topic_list,
    qids,
    bodies,
    properties,
    encoded_properties,
    flg,
    sfl,
    bts,
    hosts,
    bports,
    rts,
    prep,
    store_host,
    store_port,
    prop_crc,
    codes,
) -> EncodedBatch:
    """The record loop of a few records, every argument a list of Python values."""
    store_v6 = len(store_host) == 16
    store_field = store_host + _INT.pack(store_port)
    crc_tail = PROP_CRC_PLACEHOLDER if prop_crc else b""
    chunks: list[bytes] = []
    sizes, ts_pos, flags_out, rel, at = [], [], [], [], 0
    keep, fixed = V4_SYS_FLAG_MASK, _FIXED_PARTS
    for i, body in enumerate(bodies):
        magic, tfield = _topic_field(topic_list[i])
        pb = encoded_properties[i] + crc_tail
        host = hosts[i]
        sf = sfl[i] & keep
        size = fixed + len(body) + len(tfield) + len(pb)
        if len(host) == 4 and not store_v6:
            head = _HEAD_V4.pack(
                size, magic, crc32(body) & 0x7FFFFFFF, qids[i], flg[i], 0, 0, sf, bts[i], host,
                bports[i], 0, store_host, store_port, rts[i], prep[i], len(body),
            )  # fmt: skip
        else:
            if len(host) == 16:
                sf |= L.FLAG_BORNHOST_V6
                size += HOST_V6_EXTRA
            if store_v6:
                sf |= L.FLAG_STOREHOST_V6
                size += HOST_V6_EXTRA
            head = (
                _HEAD1.pack(size, magic, crc32(body) & 0x7FFFFFFF, qids[i], flg[i], 0, 0, sf, bts[i])
                + host + _INT.pack(bports[i]) + _TS.pack(0) + store_field
                + _MID.pack(rts[i], prep[i], len(body))
            )  # fmt: skip
        chunks += (head, body, tfield, _SHORT.pack(len(pb)), pb)
        sizes.append(size)
        ts_pos.append(POS_BORN_HOST + len(host) + 4)
        flags_out.append(sf)
        rel.append(at)
        at += size
    return EncodedBatch(
        buf=bytearray(b"".join(chunks)),
        rel_pos=rel,
        sizes=sizes,
        store_ts_pos=ts_pos,
        queue_ids=qids,
        topics=topic_list,
        tags_codes=codes,
        sys_flags=flags_out,
        keys=[p.get(L.P_KEYS) for p in properties],
        uniq_keys=[p.get(L.P_UNIQ_KEY) for p in properties],
        properties=list(properties),
        prop_crc=prop_crc,
    )


def encode_v4_record(
    topic: str,
    queue_id: int,
    body: bytes,
    encoded_properties: bytes,
    flag: int,
    sys_flag: int,
    born_ms: int,
    born_host: bytes,
    born_port: int,
    reconsume_times: int,
    prepared_offset: int,
    store_host: bytes,
    store_port: int,
    prop_crc: bool,
) -> bytearray | None:
    """One checked record with IPv4 born and store hosts (``sys_flag`` masked with
    ``V4_SYS_FLAG_MASK``), as :func:`encode_lists` encodes it; QUEUEOFFSET, PHYSICALOFFSET,
    STORETIMESTAMP and the properties' CRC are left for :func:`place_v4_record`.  None for an IPv6
    host (the batch encoders handle those)."""
    if len(born_host) != 4 or len(store_host) != 4:
        return None
    magic, tfield = _topic_field(topic)
    pb = encoded_properties + PROP_CRC_PLACEHOLDER if prop_crc else encoded_properties
    blen = len(body)
    head = _HEAD_V4.pack(
        _FIXED_PARTS + blen + len(tfield) + len(pb), magic, crc32(body) & 0x7FFFFFFF, queue_id, flag, 0, 0,
        sys_flag, born_ms, born_host, born_port, 0, store_host, store_port, reconsume_times, prepared_offset, blen,
    )  # fmt: skip
    return bytearray().join((head, body, tfield, _SHORT.pack(len(pb)), pb))


def place_v4_record(
    buf: bytearray, queue_offset: int, phys: int, store_ts_ms: int, prop_crc: bool
) -> None:
    """Write the offsets and store time of an :func:`encode_v4_record` record (and its CRC)."""
    _QP.pack_into(buf, POS_QUEUE_OFFSET, queue_offset, phys)
    _TS.pack_into(buf, POS_STORE_TIMESTAMP_V4, store_ts_ms)
    if prop_crc:
        end = len(buf) - PROP_CRC_BYTES
        at = end + len(PROP_CRC_PREFIX)
        buf[at : at + 10] = (b"%010d" % (crc32(buf[:end]) & 0x7FFFFFFF))[::-1]


@functools.lru_cache(maxsize=1024)
def _topic_bytes(topic: str) -> bytes:
    return topic.encode("utf-8")


@functools.lru_cache(maxsize=1024)
def _topic_field(topic: str) -> tuple[int, bytes]:
    """The record's magic code and TOPIC field (length byte, or short for a long name, + name)."""
    tb = _topic_bytes(topic)
    if len(tb) > 127:
        return L.MAGIC_V2, _SHORT.pack(len(tb)) + tb
    return L.MAGIC_V1, bytes((len(tb),)) + tb


def _lst(value: Any, n: int) -> list[int]:
    if isinstance(value, (int, np.integer)):
        return [int(value)] * n
    out = value.tolist() if isinstance(value, np.ndarray) else [int(v) for v in value]
    if len(out) != n:
        raise ValueError(f"expected {n} values, got {len(out)}")
    return out


def _col(value, n: int, dtype) -> np.ndarray:  # type: ignore[no-untyped-def]
    if isinstance(value, (int, np.integer)):
        return np.full(n, value, dtype=dtype)
    arr = np.asarray(value, dtype=dtype)
    if arr.shape != (n,):
        raise ValueError(f"expected {n} values, got {arr.shape}")
    return arr
