"""Every put path held to the general one byte for byte.

The same messages go into fresh stores under the same frozen clock, each store through one path,
and the stores' CommitLog, ConsumeQueue and index files must be identical to those of the general
path (one :meth:`MessageStore.put_message` per message):

* the store's paths: small batches (encoded record by record with struct), large batches
  (column by column with numpy and Arrow), checked rows (``put_rows``: the broker's sends and
  its one-record put ``try_put_row``) and bodies sharing their properties (``put_bodies``);
* the services' paths that patch stored bytes instead of decoding and encoding records again:
  committed halves (``encode_commits``) and delay-level and timer re-delivery
  (``patch_redelivery``), each against its decode-and-encode path.

A path that wrote one different byte anywhere (a flag, a property order, an offset) fails here.
"""

from __future__ import annotations

import os
import random
from zlib import crc32

import numpy as np
import pytest

from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.core import BrokerCore
from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.message import Message, tags_code
from rmq_spark.store.properties import encode_properties
from rmq_spark.store.store import MessageStore, StoreConfig

T0 = 1_700_000_000_000
LONG_TOPIC = (
    "%RETRY%" + "g" * 125
)  # a TOPICLEN of two bytes (MAGIC_V2): only retry topics are that long


def store_files(root: str) -> dict[str, bytes]:
    out = {}
    for sub in (L.COMMITLOG_DIR, L.CONSUMEQUEUE_DIR, L.INDEX_DIR):
        for r, _, names in os.walk(os.path.join(root, sub)):
            for name in names:
                path = os.path.join(r, name)
                with open(path, "rb") as f:
                    out[os.path.relpath(path, root)] = f.read()
    return out


def assert_same_files(root: str, general_root: str) -> None:
    got, want = store_files(root), store_files(general_root)
    assert sorted(got) == sorted(want)
    assert any(n.startswith(L.COMMITLOG_DIR + os.sep) for n in want)
    for name, data in want.items():
        assert got[name] == data, name


def varied(n: int, seed: int = 3) -> list[Message]:
    """Messages of three topics (one with a two-byte TOPICLEN): empty to 3 KiB bodies, tags,
    keys, user properties, born times, IPv4 and IPv6 born hosts, flags, each with its UNIQ_KEY."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        props: dict[str, str] = {}
        if i % 3:
            props[L.P_TAGS] = f"t{i % 4}"
        if i % 4 == 1:
            props[L.P_KEYS] = f"order-{i} shared"
        if i % 5 == 2:
            props.update({"n": str(i), "region": "eu-west"})
        props[L.P_UNIQ_KEY] = f"0A000001{i:024X}"
        out.append(
            Message(
                topic=("A", "B", LONG_TOPIC)[i % 3],
                body=rng.randbytes(rng.choice((0, 1, 17, 100, 1000, 3000))),
                properties=props,
                queue_id=0 if i % 3 == 2 else i % 4,  # a retry topic has one queue
                flag=i % 7,
                born_timestamp_ms=T0 - 1000 + i,
                born_host=("10.1.2.3", "::1", "192.168.0.7")[i % 3] if i % 11 == 3 else "10.1.2.3",
                born_port=40000 + i,
            )
        )
    return out


def row_of(m: Message) -> tuple:
    """``m`` as the broker's checked row (its properties encoded with their UNIQ_KEY)."""
    p = dict(m.properties)
    return (m.topic, m.queue_id, m.body, p, encode_properties(p), tags_code(p.get(L.P_TAGS)), m.flag,
            m.sys_flag, m.born_timestamp_ms, m.born_host, m.born_port, m.reconsume_times,
            m.prepared_transaction_offset)  # fmt: skip


def chunks(seq: list, size: int) -> list[list]:
    return [seq[i : i + size] for i in range(0, len(seq), size)]


def open_store(root: str, crc: bool) -> MessageStore:
    cfg = StoreConfig(commitlog_segment_bytes=4 << 20, cq_segment_units=1000, append_prop_crc=crc)
    return MessageStore(root, cfg, clock=FakeClock(T0))


def general(store: MessageStore, msgs: list[Message]) -> None:
    for m in msgs:
        assert store.put_message(m).ok


PATHS = {
    "small batches": lambda s, ms: [s.put_messages(c) for c in chunks(ms, 7)],
    "large batches": lambda s, ms: [s.put_messages(c) for c in chunks(ms, 150)],
    "one batch": lambda s, ms: [s.put_messages(ms)],
    "checked rows, one each": lambda s, ms: [s.put_rows([row_of(m)]) for m in ms],
    "checked rows, a few each": lambda s, ms: [
        s.put_rows([row_of(m) for m in c]) for c in chunks(ms, 5)
    ],
}


@pytest.mark.parametrize("crc", [True, False], ids=["record-crc", "no-crc"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_store_put_paths_write_the_bytes_of_the_general_path(tmp_path, path, crc):
    msgs = varied(330)
    with open_store(str(tmp_path / "general"), crc) as s:
        general(s, [Message(**vars(m)) for m in msgs])
    with open_store(str(tmp_path / "path"), crc) as s:
        results = PATHS[path](s, [Message(**vars(m)) for m in msgs])
        assert all(r.ok for r in results)
        if path.startswith("checked rows, one"):
            assert s._one_by_one
    assert_same_files(str(tmp_path / "path"), str(tmp_path / "general"))


@pytest.mark.parametrize("form", ["list", "views", "arrow"])
@pytest.mark.parametrize("lengths", ["varied", "equal"])
@pytest.mark.parametrize("n", [5, 128, 129, 700], ids=lambda n: f"{n}-bodies")
def test_put_bodies_writes_the_bytes_of_the_general_path(tmp_path, n, lengths, form):
    """Bodies as bytes, as bytearrays and memoryviews, or as an Arrow column (a sink's rows:
    bodies of one length are copied from its buffer), of varied lengths or one."""
    import pyarrow as pa

    rng = random.Random(n)
    bodies = [
        rng.randbytes(rng.choice((0, 9, 64, 64, 64)) if lengths == "varied" else 64)
        for _ in range(n)
    ]
    props = {L.P_TAGS: "bulk", L.P_KEYS: "k1 k2", "src": "sensor-7"}
    given = {
        "list": bodies,
        "views": [bytearray(b) if i % 2 else memoryview(b) for i, b in enumerate(bodies)],
        "arrow": pa.array([b"x", *bodies], pa.binary()).slice(1),  # an offset too
    }[form]
    with open_store(str(tmp_path / "path"), True) as s:
        r = s.put_bodies("Bulk", 2, given, props, born_timestamp_ms=T0 - 5)
        assert r.ok and len(r.uniq_keys) == n
        uniq = list(r.uniq_keys)
    msgs = [
        Message("Bulk", b, {**props, L.P_UNIQ_KEY: u}, queue_id=2, born_timestamp_ms=T0 - 5)
        for b, u in zip(bodies, uniq, strict=True)
    ]
    with open_store(str(tmp_path / "general"), True) as s:
        general(s, msgs)
    assert_same_files(str(tmp_path / "path"), str(tmp_path / "general"))


@pytest.mark.parametrize("bad, problem", [
    ("text", "message body must be bytes, not str"),
    (None, "message body is null"),
    (b"x" * 65, "message body is 65 bytes; the limit is 64 bytes"),
])  # fmt: skip
@pytest.mark.parametrize("n", [3, 200])
def test_put_bodies_refuses_a_bad_body_among_good_ones_and_stores_none(tmp_path, bad, problem, n):
    from rmq_spark.errors import MessageIllegalError

    with MessageStore(
        str(tmp_path / "s"), StoreConfig(body_max_bytes=64), clock=FakeClock(T0)
    ) as s:
        bodies = [b"ok"] * n
        bodies[n // 2] = bad
        with pytest.raises(MessageIllegalError, match=problem):
            s.put_bodies("Bulk", 0, bodies)
        assert s.max_offset("Bulk", 0) == 0


@pytest.mark.parametrize("lengths", ["varied", "equal"])
def test_put_bodies_with_row_properties_writes_the_bytes_of_the_general_path(tmp_path, lengths):
    """Each row with its own properties (built column-wise, as the sink builds them) and its body
    from an Arrow column: the records the general path writes of the same messages."""
    import pyarrow as pa

    from rmq_spark.store.rowprops import row_properties

    n = 300
    rng = random.Random(7)
    bodies = [
        rng.randbytes(rng.choice((0, 9, 64)) if lengths == "varied" else 64) for _ in range(n)
    ]
    tags = [f"t{i % 3}" if i % 5 else None for i in range(n)]
    keys = [f"order-{i} c{i % 7}" if i % 4 else None for i in range(n)]
    user = [[("region", f"r{i % 16}")] if i % 6 else [] for i in range(n)]
    props = row_properties(
        n, properties=pa.array(user, pa.map_(pa.string(), pa.string())),
        named={L.P_TAGS: pa.array(tags, pa.string()), L.P_KEYS: pa.array(keys, pa.string())},
    )  # fmt: skip
    with open_store(str(tmp_path / "path"), True) as s:
        r = s.put_bodies("Rows", 1, pa.array(bodies, pa.binary()), props, born_timestamp_ms=T0 - 5)
        assert r.ok
        uniq = list(r.uniq_keys)
    msgs = []
    for i in range(n):
        p = dict(user[i])
        if tags[i]:
            p[L.P_TAGS] = tags[i]
        if keys[i]:
            p[L.P_KEYS] = keys[i]
        p[L.P_UNIQ_KEY] = uniq[i]
        msgs.append(Message("Rows", bodies[i], p, queue_id=1, born_timestamp_ms=T0 - 5))
    with open_store(str(tmp_path / "general"), True) as s:
        general(s, msgs)
    assert_same_files(str(tmp_path / "path"), str(tmp_path / "general"))


# --- the services' byte-patching paths ------------------------------------------------------------
def open_core(root: str, crc: bool) -> tuple[BrokerCore, FakeClock]:
    clock = FakeClock(T0)
    cfg = BrokerConfig(
        store=StoreConfig(
            commitlog_segment_bytes=4 << 20, cq_segment_units=1000, append_prop_crc=crc
        ),
        delay_levels="1s 2s 3s",
    )
    return BrokerCore(root, cfg, clock=clock, start_services=False), clock


@pytest.mark.parametrize("crc", [True, False], ids=["record-crc", "no-crc"])
def test_committed_halves_patched_write_the_bytes_of_decoding_and_encoding(
    tmp_path, crc, monkeypatch
):
    from rmq_spark.services.transaction import service as txn

    msgs = [m for m in varied(300, seed=8) if m.topic != LONG_TOPIC]
    roots = {}
    for fast in (True, False):
        root = roots[fast] = str(tmp_path / ("patched" if fast else "general"))
        if not fast:  # the commit encoder declines: every real message is decoded and encoded
            monkeypatch.setattr(txn, "encode_commits", lambda *a, **k: None)
        core, clock = open_core(root, crc)
        try:
            offsets = []
            for c in chunks([Message(**vars(m)) for m in msgs], 50):
                r = core.transactions.prepare(c, "pg")
                assert r.ok
                offsets += r.append.phys_offsets.tolist()
            clock.advance(7)
            for c in chunks(offsets, 120):
                assert core.transactions.commit_group(c).ok
        finally:
            core.shutdown()
        monkeypatch.undo()
    assert_same_files(roots[True], roots[False])


@pytest.mark.parametrize("crc", [True, False], ids=["record-crc", "no-crc"])
@pytest.mark.parametrize("service", ["schedule", "timer"])
def test_redelivery_patched_writes_the_bytes_of_decoding_and_encoding(tmp_path, crc, service):
    # IPv4 hosts: a round holding an IPv6 one is re-written the general way as a whole
    msgs = [m for m in varied(300, seed=9) if m.topic != LONG_TOPIC and ":" not in m.born_host]
    rng = random.Random(4)
    for m in msgs:
        if service == "schedule":
            m.properties[L.P_DELAY] = str(rng.randint(1, 3))
        else:
            m.properties[L.P_TIMER_DELIVER_MS] = str(T0 + rng.randint(1, 3000))
    roots = {}
    for fast in (True, False):
        root = roots[fast] = str(tmp_path / ("patched" if fast else "general"))
        core, clock = open_core(root, crc)
        svc = getattr(core, service)
        svc.patch_min_msgs = 1 if fast else 10**9  # every round patched, or none
        try:
            for c in chunks([Message(**vars(m)) for m in msgs], 40):
                assert core.store.put_messages([core.transform(m) for m in c]).ok
            clock.advance(10_000)
            assert svc.run_once() == len(msgs)
            assert svc.stats.patched == (len(msgs) if fast else 0)
        finally:
            core.shutdown()
    assert_same_files(roots[True], roots[False])


@pytest.mark.parametrize("prop_crc", [False, True])
def test_finalize_of_one_record_then_records_of_one_size_writes_what_record_by_record_does(
    prop_crc,
):
    """A group commit's batch (its op message, then real messages of one size) is finalized with
    strided stores after the first record: the bytes are those of finalizing each record alone."""
    from rmq_spark.store.encode import encode_columns
    from rmq_spark.store.encoded import SMALL_BATCH
    from rmq_spark.store.properties import encode_properties

    n = SMALL_BATCH * 3
    bodies = [b"an op message body of another size"] + [b"x" * 50] * n
    props = [{"UNIQ_KEY": "OP"}] + [{"UNIQ_KEY": f"ID{i:05d}"} for i in range(n)]
    args = (["OP_TOPIC"] + ["Real"] * n, [0] + [i % 4 for i in range(n)], bodies, props,
            [encode_properties(p) for p in props])  # fmt: skip
    fast, slow = encode_columns(*args, prop_crc=prop_crc), encode_columns(*args, prop_crc=prop_crc)
    phys = np.cumsum(fast.sizes.astype(np.int64)) - fast.sizes + 4096
    qoffs = np.arange(n + 1, dtype=np.int64) + 7
    fast.finalize(phys, qoffs, 1_700_000_000_123)
    for i in range(n + 1):
        slow._finalize_record(int(slow.rel_pos[i]), int(slow.sizes[i]), int(slow.store_ts_pos[i]), int(phys[i]),
                              int(qoffs[i]), 1_700_000_000_123)  # fmt: skip
    assert bytes(fast.buf) == bytes(slow.buf)


@pytest.mark.parametrize("lengths", ["varied", "equal"])
def test_real_messages_made_with_the_halves_body_crcs_are_the_bytes_made_without(tmp_path, lengths):
    """A commit's real messages are encoded from the bodies their halves were just made of, and
    take the halves' BODYCRCs instead of hashing the bodies again: the same bytes either way."""
    import pyarrow as pa

    from rmq_spark.services.transaction.halves import body_halves
    from rmq_spark.store.message import new_uniq_ids_array

    rng = random.Random(11)
    n = 500
    bodies = [
        rng.randbytes(rng.choice((0, 5, 64)) if lengths == "varied" else 64) for _ in range(n)
    ]
    ids = new_uniq_ids_array(n)
    phys = np.arange(n, dtype=np.int64) * 1000
    with open_store(str(tmp_path / "s"), True) as s:
        for given in (bodies, pa.array(bodies, pa.binary())):
            halves = body_halves(s, T0, "Real", 1, given, {L.P_TAGS: "t"}, "g", ids)
            crcs = halves.body_crcs()
            assert crcs.tolist() == [crc32(b) & 0x7FFFFFFF for b in bodies]
            plain = body_halves(s, T0, "Real", 1, given, {L.P_TAGS: "t"}, "g", ids, phys)
            reused = body_halves(s, T0, "Real", 1, given, {L.P_TAGS: "t"}, "g", ids, phys, crcs)
            assert bytes(reused.buf) == bytes(plain.buf)
