"""Golden bytes for the CommitLog record, properties, ids and hashes."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from rmq_spark.store import layout as L
from rmq_spark.store.encode import encode_columns
from rmq_spark.store.encoded import SMALL_BATCH
from rmq_spark.store.hashing import java_string_hash
from rmq_spark.store.message import UniqIdGenerator, decode_offset_msg_id, offset_msg_id, tags_code
from rmq_spark.store.properties import decode_properties, encode_properties
from rmq_spark.store.record import (
    RecordCheck,
    blank_record,
    check_record,
    crc32_ranges,
    decode_record,
    record_length,
)

BORN_MS = 1_700_000_000_123
PROPS = {"TAGS": "TAG1", "KEYS": str(BORN_MS)}


def golden_record(phys: int, qoff: int, store_ms: int) -> bytes:
    """The reference example written field by field, independently of the encoder."""
    body = bytes(range(32))
    props = f"TAGS\x01TAG1\x02KEYS\x01{BORN_MS}\x02".encode()
    assert len(props) == 29
    topic = b"FooBar"
    out = b"".join(
        [
            struct.pack(">i", 158),  # 1 TOTALSIZE
            struct.pack(">I", 0xDAA320A7),  # 2 MAGICCODE v1
            struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF),  # 3 BODYCRC
            struct.pack(">i", 3),  # 4 QUEUEID
            struct.pack(">i", 7),  # 5 FLAG
            struct.pack(">q", qoff),  # 6 QUEUEOFFSET
            struct.pack(">q", phys),  # 7 PHYSICALOFFSET
            struct.pack(">i", 0),  # 8 SYSFLAG
            struct.pack(">q", BORN_MS),  # 9 BORNTIMESTAMP
            bytes([10, 0, 0, 1]) + struct.pack(">i", 5555),  # 10 BORNHOST
            struct.pack(">q", store_ms),  # 11 STORETIMESTAMP
            bytes([127, 0, 0, 1]) + struct.pack(">i", 10911),  # 12 STOREHOST
            struct.pack(">i", 2),  # 13 RECONSUMETIMES
            struct.pack(">q", 0),  # 14 PREPARED TRANSACTION OFFSET
            struct.pack(">i", 32) + body,  # 15 BODY
            bytes([6]) + topic,  # 16 TOPIC
            struct.pack(">h", 29) + props,  # 17 PROPERTIES
        ]
    )
    assert len(out) == 158
    return out


def encode_example(n: int = 1):
    return encode_columns(
        ["FooBar"] * n,
        [3] * n,
        [bytes(range(32))] * n,
        [PROPS] * n,
        [encode_properties(PROPS)] * n,
        flags=7,
        born_timestamps=BORN_MS,
        born_hosts=bytes([10, 0, 0, 1]),
        born_ports=5555,
        reconsume_times=2,
        store_host=bytes([127, 0, 0, 1]),
        store_port=10911,
    )


@pytest.mark.parametrize(
    "n", [10, SMALL_BATCH + 72]
)  # a few records are encoded with struct, more with numpy
def test_reference_example_is_158_bytes_golden(n):
    b = encode_example(n)
    phys = np.arange(n, dtype=np.int64) * 158
    b.finalize(phys, np.arange(n), 1_700_000_000_999)
    assert len(b.buf) == 158 * n  # ReputMessageServiceTest: 10 messages -> max phy offset 1580
    for i in range(n):
        assert bytes(b.buf[i * 158 : (i + 1) * 158]) == golden_record(i * 158, i, 1_700_000_000_999)
    assert record_length(0, 32, 6, 29) == 158


def test_few_and_many_record_encoders_write_the_same_bytes():
    rng = np.random.default_rng(5)
    n = SMALL_BATCH + 40
    topics = [f"T{i % 3}" if i % 7 else "%RETRY%" + "g" * 150 for i in range(n)]
    bodies = [rng.bytes(int(k)) for k in rng.integers(0, 300, n)]
    props = [{"TAGS": f"tag{i % 4}", "KEYS": f"k{i}", "UNIQ_KEY": f"{i:032X}"} for i in range(n)]
    hosts = [bytes(15) + b"\x01" if i % 5 == 0 else bytes([10, 0, 0, i]) for i in range(n)]
    cols = {
        "flags": rng.integers(0, 9, n), "sys_flags": rng.integers(0, 2, n) * L.TRANSACTION_COMMIT_TYPE,
        "born_timestamps": rng.integers(1, 2**40, n), "born_ports": rng.integers(0, 65535, n),
        "reconsume_times": rng.integers(0, 16, n), "prepared_offsets": rng.integers(0, 2**40, n),
    }  # fmt: skip
    enc = [encode_properties(p) for p in props]
    qids = rng.integers(0, 8, n)
    many = encode_columns(topics, qids, bodies, props, enc, born_hosts=hosts, store_host=bytes([1, 2, 3, 4]),
                        store_port=9, prop_crc=True, **cols)  # fmt: skip
    few_bufs = []
    for a in range(0, n, 4):
        part = {k: v[a : a + 4] for k, v in cols.items()}
        few = encode_columns(topics[a : a + 4], qids[a : a + 4], bodies[a : a + 4], props[a : a + 4],
                           enc[a : a + 4], born_hosts=hosts[a : a + 4], store_host=bytes([1, 2, 3, 4]),
                           store_port=9, prop_crc=True, **part)  # fmt: skip
        np.testing.assert_array_equal(few.sizes, many.sizes[a : a + 4])
        np.testing.assert_array_equal(few.sys_flags, many.sys_flags[a : a + 4])
        np.testing.assert_array_equal(few.tags_codes, many.tags_codes[a : a + 4])
        np.testing.assert_array_equal(few.store_ts_pos, many.store_ts_pos[a : a + 4])
        few.finalize(
            many.rel_pos[a : a + 4] + 1000, np.arange(a, min(a + 4, n)), 77
        )  # the last: fewer
        few_bufs.append(bytes(few.buf))
    many.finalize(many.rel_pos + 1000, np.arange(n), 77)
    assert b"".join(few_bufs) == bytes(many.buf)


def _few_chunks(topic, bodies, props, enc, store_host, phys, prop_crc):
    """The same records through the struct encoder, 4 at a time."""
    out = []
    for a in range(0, len(bodies), 4):
        few = encode_columns(topic, 1, bodies[a : a + 4], props[a : a + 4], enc[a : a + 4],
                           born_timestamps=5, store_host=store_host, store_port=9, prop_crc=prop_crc)  # fmt: skip
        few.finalize(phys[a : a + 4], np.arange(a, min(a + 4, len(bodies))), 77)  # the last: fewer
        out.append(bytes(few.buf))
    return b"".join(out)


@pytest.mark.parametrize("body_sizes", [(100, 101), (0, 300), (1500, 3000)])
def test_columnar_encoder_with_record_crc_matches_the_struct_encoder(body_sizes):
    """IPv4 records through the numpy path: one size (strided 2-D assembly and finalize), mixed
    small sizes (Arrow join) or mixed large ones (one copy per body); every record CRC checks."""
    rng = np.random.default_rng(11)
    n = SMALL_BATCH + 30
    bodies = [rng.bytes(int(k)) for k in rng.integers(*body_sizes, n)]
    props = [{"TAGS": "t", "UNIQ_KEY": f"{i:032X}"} for i in range(n)]
    enc = [encode_properties(p) for p in props]
    many = encode_columns("Topic", 1, bodies, props, enc, born_timestamps=5, store_host=bytes([1, 2, 3, 4]),
                        store_port=9, prop_crc=True)  # fmt: skip
    phys = many.rel_pos + 4096
    want = _few_chunks("Topic", bodies, props, enc, bytes([1, 2, 3, 4]), phys, True)
    many.finalize(phys, np.arange(n), 77)
    assert bytes(many.buf) == want
    pos = 0
    for i in range(n):
        kind, size, reason = check_record(many.buf, pos, len(many.buf), force_prop_crc=True)
        assert (kind, reason) == (RecordCheck.VALID, "")
        m = decode_record(many.buf, pos)
        assert (m.body, m.queue_offset, m.commitlog_offset) == (bodies[i], i, int(phys[i]))
        pos += size


def test_fixed_width_properties_path_matches_the_struct_encoder():
    """``put_bodies``' form: properties as one 2-D array of equal-length rows."""
    n = SMALL_BATCH + 8
    bodies = [bytes([i % 251]) * 64 for i in range(n)]
    props = [{"TAGS": "x", "UNIQ_KEY": f"{i:032X}"} for i in range(n)]
    enc = [encode_properties(p) for p in props]
    rows = np.frombuffer(b"".join(enc), dtype=np.uint8).reshape(n, len(enc[0]))
    many = encode_columns("Topic", 1, bodies, props, rows, born_timestamps=5, store_host=bytes([1, 2, 3, 4]),
                        store_port=9, prop_crc=True)  # fmt: skip
    phys = many.rel_pos + 100
    want = _few_chunks("Topic", bodies, props, enc, bytes([1, 2, 3, 4]), phys, True)
    many.finalize(phys, np.arange(n), 77)
    assert bytes(many.buf) == want


def test_small_batch_columns_are_lists_until_read():
    b = encode_example(3)
    assert b.sizes.dtype == np.int32 and b.tags_codes.dtype == np.int64
    np.testing.assert_array_equal(b.rel_pos, [0, 158, 316])
    assert b.queue_ids.tolist() == [3, 3, 3]


def test_decode_round_trip_and_check():
    b = encode_example(2)
    b.finalize(np.array([0, 158]), np.array([0, 1]), 42)
    kind, size, _ = check_record(b.buf, 158, len(b.buf))
    assert (kind, size) == (RecordCheck.VALID, 158)
    m = decode_record(b.buf, 158)
    assert m.topic == "FooBar" and m.queue_id == 3 and m.flag == 7 and m.queue_offset == 1
    assert (
        m.commitlog_offset == 158 and m.store_timestamp_ms == 42 and m.born_timestamp_ms == BORN_MS
    )
    assert m.born_host == "10.0.0.1" and m.born_port == 5555 and m.reconsume_times == 2
    assert m.properties == PROPS and m.body == bytes(range(32))
    assert m.msg_id == offset_msg_id(bytes([127, 0, 0, 1]), 10911, 158)


def test_ipv6_hosts_add_12_bytes_each_and_round_trip():
    v6 = bytes(15) + b"\x01"
    b = encode_columns(
        ["T"], [0], [b"abc"], [{}], [b""], born_hosts=v6, born_ports=1, store_host=v6, store_port=2
    )
    assert (
        b.sizes[0]
        == record_length(L.FLAG_BORNHOST_V6 | L.FLAG_STOREHOST_V6, 3, 1, 0)
        == 84 + 24 + 4 + 3 + 1 + 1 + 2
    )
    b.finalize(np.array([0]), np.array([5]), 99)
    m = decode_record(b.buf, 0)
    assert m.born_host == "::1" and m.store_host == "::1" and m.store_timestamp_ms == 99
    assert m.sys_flag & L.FLAG_BORNHOST_V6 and m.sys_flag & L.FLAG_STOREHOST_V6
    assert len(m.msg_id) == 56
    assert check_record(b.buf, 0, len(b.buf))[0] == RecordCheck.VALID


def test_long_retry_topic_uses_magic_v2():
    topic = "%RETRY%" + "g" * 200
    b = encode_columns([topic], [0], [b"x"], [{}], [b""])
    b.finalize(np.array([0]), np.array([0]), 1)
    assert struct.unpack_from(">I", b.buf, 4)[0] == L.MAGIC_V2
    assert decode_record(b.buf, 0).topic == topic
    assert check_record(b.buf, 0, len(b.buf))[0] == RecordCheck.VALID


def test_blank_record_and_checks():
    blank = blank_record(1000)
    assert blank == struct.pack(">iI", 1000, 0xCBD43194)
    buf = bytearray(1000)
    buf[:8] = blank
    assert check_record(buf, 0, 1000)[:2] == (RecordCheck.BLANK, 1000)
    assert check_record(bytearray(100), 0, 100)[0] == RecordCheck.END
    b = encode_example()
    b.finalize(np.array([0]), np.array([0]), 1)
    corrupt = bytearray(b.buf)
    corrupt[100] ^= 0xFF  # inside the body
    kind, _, reason = check_record(corrupt, 0, len(corrupt))
    assert kind == RecordCheck.INVALID and "CRC" in reason
    assert check_record(corrupt, 0, len(corrupt), check_crc=False)[0] == RecordCheck.VALID
    bad_magic = bytearray(b.buf)
    bad_magic[4] = 0
    assert "magic" in check_record(bad_magic, 0, len(bad_magic))[2]


def test_properties_encoding_follows_rocketmq():
    assert encode_properties({"a": "1", "b": None, "c": "3"}) == b"a\x011\x02c\x013\x02"
    assert encode_properties({L.TRANSIENT_PREFIX + "x": "1"}) == b""
    assert decode_properties(b"k1\x01v1\x02k2\x01v2\x02") == {"k1": "v1", "k2": "v2"}
    assert decode_properties("k1\x01v1") == {"k1": "v1"}
    for text in ["", " ", "aaa", "k1\x01", "\x01v1"]:
        assert decode_properties(text) == {}, text


def test_java_hash_and_tags_code():
    assert java_string_hash("") == 0
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("中文") == 20013 * 31 + 25991  # U+4E2D U+6587
    for s in ["a" * 20, "TagA || TagB", "😀x", "überlong" * 9]:
        assert java_string_hash(s) == _java_ref(s)
    assert tags_code(None) == 0 and tags_code("") == 0 and tags_code("TagA") == 2598919


def _java_ref(s: str) -> int:
    h = 0
    for ch in s:
        for unit in (
            [ord(ch)]
            if ord(ch) < 0x10000
            else [0xD800 + ((ord(ch) - 0x10000) >> 10), 0xDC00 + ((ord(ch) - 0x10000) & 0x3FF)]
        ):
            h = (h * 31 + unit) % (1 << 32)
    return h - (1 << 32) if h >= 1 << 31 else h


def test_offset_msg_id_round_trip():
    mid = offset_msg_id(bytes([192, 168, 0, 1]), 10911, 123456789)
    assert mid == "C0A8000100002A9F00000000075BCD15"
    assert decode_offset_msg_id(mid) == (bytes([192, 168, 0, 1]), 10911, 123456789)
    with pytest.raises(ValueError, match="32 or 56"):
        decode_offset_msg_id("abc")


def test_uniq_ids_are_unique_and_well_formed():
    gen = UniqIdGenerator()
    ids = gen.next_ids(70_000)  # wraps the 16-bit counter once
    assert all(len(i) == 32 for i in ids[:10])
    assert len(set(ids[:65536])) == 65536
    assert ids[0][:8] == "7F000001"


@pytest.mark.parametrize(
    "lengths",
    [
        [187] * 500,  # one length: gathered at once
        [10, 300, 10, 4096, 300, 1] * 50,  # a few lengths: gathered per length
        list(range(1, 40)) * 3,  # many lengths: read in place
        [5000, 20, 5000],  # longer than GATHER_CRC_BYTES: read in place
        [0, 7, 0],  # empty ranges
        [],
    ],
)
def test_crc32_ranges_is_utilall_crc32_of_each_range(lengths):
    rng = np.random.default_rng(len(lengths))
    buf = rng.integers(0, 256, sum(lengths) + 64 * len(lengths) + 1, dtype=np.uint8)
    gaps = rng.integers(0, 64, len(lengths))
    lo = (
        np.cumsum(np.r_[0, np.add(lengths, gaps)[:-1]]).astype(np.int64)
        if lengths
        else np.zeros(0, np.int64)
    )
    hi = lo + np.asarray(lengths, dtype=np.int64)
    got = crc32_ranges(buf, lo, hi)
    want = [
        zlib.crc32(buf[a:b].tobytes()) & 0x7FFFFFFF
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True)
    ]
    assert got.dtype == np.int64 and got.tolist() == want
