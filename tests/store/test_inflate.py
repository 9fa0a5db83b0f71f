"""Issue 28 item 12: every inflation is bounded by the body limit, a body flagged COMPRESSED that
the readers cannot read is refused at the send, and a poison record already stored (flagged
COMPRESSED, its body not zlib, or a zlib bomb) does not stop a bulk read of its range: the other
records are served, it is served with its body as stored, and a WARNING names its file and
position."""

from __future__ import annotations

import logging
import os
import sys
import zlib

import pytest

from rmq_spark.errors import MessageIllegalError
from rmq_spark.remoting.lookup import raw_record
from rmq_spark.store import inflate as I
from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.inflate import (
    InflateError,
    check_compressed_body,
    compression_type,
    inflate,
    inflate_body,
    inflate_gzip,
)
from rmq_spark.store.message import Message
from rmq_spark.store.pulled import records_arrow
from rmq_spark.store.reader import StoreReader
from rmq_spark.store.store import MessageStore, StoreConfig

BOMB = zlib.compress(bytes(256 << 20), 9)  # ~256 KiB of zlib that inflates to 256 MiB
assert 200_000 < len(BOMB) < 300_000


class _Spy:
    """``zlib`` for the inflate module, recording how many bytes each inflation produced in all."""

    def __init__(self) -> None:
        self.produced: list[int] = []
        self.error = zlib.error
        self.MAX_WBITS = zlib.MAX_WBITS

    def decompressobj(self, wbits: int):  # type: ignore[no-untyped-def]
        real, produced = zlib.decompressobj(wbits), self.produced
        produced.append(0)

        class Obj:
            def decompress(self, data, max_length=0):  # type: ignore[no-untyped-def]
                out = real.decompress(data, max_length)
                produced[-1] += len(out)
                return out

            @property
            def eof(self) -> bool:
                return real.eof

            @property
            def unconsumed_tail(self) -> bytes:
                return real.unconsumed_tail

        return Obj()


@pytest.mark.parametrize("limit", [1000, 1 << 20, L.BODY_MAX_BYTES])
def test_a_bomb_is_refused_having_inflated_no_more_than_the_limit(monkeypatch, limit):
    spy = _Spy()
    monkeypatch.setattr(I, "zlib", spy)
    with pytest.raises(InflateError, match=f"inflates to more than {limit} bytes"):
        inflate(BOMB, limit)
    assert spy.produced == [limit + 1]  # the one byte over that tells the limit is crossed, no more
    assert inflate(zlib.compress(bytes(limit)), limit) == bytes(limit)  # exactly the limit: served
    with pytest.raises(InflateError, match="more than"):
        inflate(zlib.compress(bytes(limit + 1)), limit)
    assert spy.produced[1:] == [limit, limit + 1]


def test_the_default_limit_is_the_body_limit_and_named():
    with pytest.raises(InflateError, match=r"more than 4194304 bytes \(4 MiB, the body limit\)"):
        inflate(BOMB)
    with pytest.raises(InflateError, match="more than 4194304 bytes"):
        inflate_body(BOMB, L.FLAG_COMPRESSED)


@pytest.mark.parametrize(
    "data, why",
    [
        (b"not zlib at all", "not valid zlib data .*incorrect header check"),
        (zlib.compress(b"hello world" * 50)[:-6], "not valid zlib data .*truncated"),
        (b"", "not valid zlib data"),
        (zlib.compress(b"x")[:2], "not valid zlib data"),
    ],
)
def test_what_is_not_a_whole_zlib_stream_is_refused_naming_it(data, why):
    with pytest.raises(InflateError, match=why) as e:
        inflate(data, what="the REGISTER_BROKER body")
    assert str(e.value).startswith("the REGISTER_BROKER body is not valid zlib data")
    assert isinstance(e.value, MessageIllegalError) and isinstance(e.value, ValueError)


def test_sound_streams_inflate_as_zlib_does():
    raw = os.urandom(5000) + bytes(20000)
    assert inflate(zlib.compress(raw)) == raw
    assert (
        inflate(zlib.compress(raw) + b"after the stream") == raw
    )  # as zlib.decompress / Java ignore it
    gz = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    member = gz.compress(raw) + gz.flush()
    assert inflate_gzip(member) == raw
    with pytest.raises(InflateError, match="not valid gzip data"):
        inflate_gzip(zlib.compress(raw))
    gz = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    with pytest.raises(InflateError, match="more than 1000 bytes"):
        inflate_gzip(gz.compress(bytes(5000)) + gz.flush(), 1000)


def test_compression_types_of_the_sysflag():
    assert compression_type(L.FLAG_COMPRESSED) == 0  # a 4.x client: zlib
    assert compression_type(L.FLAG_COMPRESSED | 3 << 8) == I.ZLIB
    raw = b"abc" * 3000
    for flag in (L.FLAG_COMPRESSED, L.FLAG_COMPRESSED | 3 << 8):
        assert inflate_body(zlib.compress(raw), flag) == raw
    assert inflate_body(b"\x01\x02", 0) == b"\x01\x02"  # not flagged: as it is
    for kind in (4, 5, 6, 7):
        with pytest.raises(InflateError, match=f"unknown compression type {kind}"):
            inflate_body(zlib.compress(raw), L.FLAG_COMPRESSED | kind << 8)


def test_check_compressed_body_refuses_what_the_readers_cannot_read(monkeypatch):
    limit = L.BODY_MAX_BYTES
    check_compressed_body(b"not zlib", 0, limit)  # not flagged: not checked
    check_compressed_body(b"not zlib", L.FLAG_BORNHOST_V6, limit)
    check_compressed_body(zlib.compress(bytes(limit)), L.FLAG_COMPRESSED, limit)
    refused = [
        (b"not zlib", L.FLAG_COMPRESSED, "flagged COMPRESSED, is not valid zlib data"),
        (BOMB, L.FLAG_COMPRESSED, "inflates to more than 4194304 bytes"),
        (zlib.compress(bytes(limit + 1)), L.FLAG_COMPRESSED | 3 << 8, "inflates to more than"),
        (zlib.compress(b"x"), L.FLAG_COMPRESSED | 6 << 8, "unknown compression type 6"),
    ]
    for body, flag, why in refused:
        with pytest.raises(MessageIllegalError, match=why):
            check_compressed_body(body, flag, limit)
    with pytest.raises(MessageIllegalError, match="more than 100 bytes"):
        check_compressed_body(zlib.compress(bytes(101)), L.FLAG_COMPRESSED, 100)
    # a codec whose package is not installed here: the readers could not read it either
    monkeypatch.setitem(sys.modules, "lz4", None)
    monkeypatch.setitem(sys.modules, "lz4.frame", None)
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(
        MessageIllegalError, match="install the 'lz4' package; this broker cannot check it"
    ):
        check_compressed_body(b"\x04\x22\x4d\x18", L.FLAG_COMPRESSED | I.LZ4 << 8, limit)
    with pytest.raises(MessageIllegalError, match="install the 'zstandard' package"):
        check_compressed_body(b"\x28\xb5\x2f\xfd", L.FLAG_COMPRESSED | I.ZSTD << 8, limit)
    with pytest.raises(I.CodecUnavailableError, match="install the 'lz4' package"):
        inflate_body(b"\x04\x22\x4d\x18", L.FLAG_COMPRESSED | I.LZ4 << 8)


# --- a poison record in a store --------------------------------------------------------------------

TOPIC = "Poison"
GOOD = b"inflated " * 1000
POISON_AT = {3: b"this body is not zlib", 5: BOMB, 7: zlib.compress(GOOD)[:-5]}


def _messages() -> list[Message]:
    out = []
    for i in range(10):
        if i in POISON_AT:
            out.append(Message(TOPIC, POISON_AT[i], {"n": str(i)}, sys_flag=L.FLAG_COMPRESSED))
        elif i == 8:
            out.append(
                Message(TOPIC, zlib.compress(GOOD), {"n": str(i)}, sys_flag=L.FLAG_COMPRESSED)
            )
        else:
            out.append(Message(TOPIC, b"plain %d" % i, {"n": str(i)}))
    return out


def _want(i: int) -> bytes:
    return POISON_AT.get(i, GOOD if i == 8 else b"plain %d" % i)


def _check_rows(batch, caplog, first: int = 0) -> None:  # type: ignore[no-untyped-def]
    rows = batch.to_pylist()
    assert [r["queueOffset"] for r in rows] == list(range(first, 10))
    assert [r["body"] for r in rows] == [_want(i) for i in range(first, 10)]
    warned = [r.getMessage() for r in caplog.records if r.name == "rmq_spark.store.inflate"]
    assert warned and all(
        r.levelno == logging.WARNING for r in caplog.records if r.name == "rmq_spark.store.inflate"
    )
    text = " ".join(warned)
    assert "served with the body as stored" in text
    assert (
        "is not valid zlib data (Error -3" in text and "inflates to more than 4194304 bytes" in text
    )
    assert "truncated stream" in text


@pytest.fixture
def poisoned(store_dir):
    with MessageStore(
        store_dir, StoreConfig(commitlog_segment_bytes=4 << 20), clock=FakeClock()
    ) as s:
        for m in _messages():  # stored as a store written before the send was checked holds them
            assert s.put_message(m).ok
        yield s


def test_a_bulk_read_of_a_range_holding_poison_records_serves_every_record(poisoned, caplog):
    s = poisoned
    caplog.set_level(logging.WARNING, "rmq_spark.store.inflate")
    _check_rows(s.read_arrow(TOPIC, 0, 0, 10), caplog)
    cq = s.consume_queue(TOPIC, 0)
    path = s.commitlog.mfq.find(cq.unit(3)[0]).path
    assert f"{path} position {cq.unit(3)[0]} ({TOPIC}/0 offset 3)" in caplog.text
    caplog.clear()
    _check_rows(s.read_arrow(TOPIC, 0, 3, 10), caplog, first=3)


def test_the_files_path_reader_serves_the_range_in_chunks(poisoned, caplog):
    """Spark's files path (rmq_spark.datasource.read.files): StoreReader.read_chunks."""
    caplog.set_level(logging.WARNING, "rmq_spark.store.inflate")
    reader = StoreReader(poisoned.root)
    try:
        chunks = list(reader.read_chunks(TOPIC, 0, 0, 10, max_rows=2))
        assert len(chunks) == 5
        import pyarrow as pa

        _check_rows(pa.Table.from_batches(chunks).combine_chunks().to_batches()[0], caplog)
    finally:
        reader.close()


def test_a_pulled_buffer_holding_poison_records_serves_every_record(poisoned, caplog):
    """The cluster read of a PULL_MESSAGE body (rmq_spark.store.pulled)."""
    caplog.set_level(logging.WARNING, "rmq_spark.store.inflate")
    cq = poisoned.consume_queue(TOPIC, 0)
    data = b"".join(raw_record(poisoned, cq.unit(q)[0]) for q in range(10))
    _check_rows(records_arrow(data), caplog)
    assert f"CommitLog offset {cq.unit(5)[0]}, {TOPIC}/0 offset 5" in caplog.text


def test_readarrow_of_a_broker_serves_the_range(tmp_path, caplog):
    """The broker's ReadArrow (the connector reader a stream uses) over the poison records."""
    from rmq_spark.broker.connector.client import InternalClient
    from rmq_spark.broker.options import BrokerOptions
    from rmq_spark.broker.server import Broker

    caplog.set_level(logging.WARNING, "rmq_spark.store.inflate")
    opts = BrokerOptions(listen="127.0.0.1:0", remoting_listen=None, namesrv_listen=None)
    with Broker(str(tmp_path / "store"), options=opts) as b:
        for m in _messages():
            assert b.store.put_message(m).ok
        c = InternalClient(b.endpoints)
        try:
            import pyarrow as pa

            got = pa.Table.from_batches(list(c.read_arrow(TOPIC, 0, 0, 10))).sort_by("queueOffset")
        finally:
            c.close()
    assert got.column("queueOffset").to_pylist() == list(range(10))
    assert got.column("body").to_pylist() == [_want(i) for i in range(10)]


def test_the_grpc_pull_read_path_bounds_gzip_bodies(monkeypatch, caplog):
    """rmq_spark.datasource.read.pull: a GZIP-encoded body is inflated within the body limit; a
    bomb or a body that is not gzip is served as sent (and logged), the other rows as always."""
    from rocketmq.grpc_protocol import definition_pb2 as D
    from rocketmq.grpc_protocol import service_pb2 as S
    from rocketmq.grpc_protocol import service_pb2_grpc as G

    from rmq_spark.datasource.options import Connection
    from rmq_spark.datasource.read.partition import QueueRange, ReadContext
    from rmq_spark.datasource.read.pull import read_pull

    def gz(data: bytes) -> bytes:
        c = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
        return c.compress(data) + c.flush()

    gz_bomb = gz(bytes(64 << 20))
    bodies = [(b"plain", D.Encoding.IDENTITY), (gz(GOOD), D.Encoding.GZIP), (gz_bomb, D.Encoding.GZIP),
              (b"not gzip", D.Encoding.GZIP)]  # fmt: skip

    class Stub:
        def __init__(self, channel) -> None:  # type: ignore[no-untyped-def]
            pass

        def QueryOffset(self, req, **kw):  # type: ignore[no-untyped-def]
            return S.QueryOffsetResponse(status=D.Status(code=D.Code.OK), offset=0)

        def PullMessage(self, req, **kw):  # type: ignore[no-untyped-def]
            for i, (body, enc) in enumerate(bodies):
                m = D.Message(topic=D.Resource(name=TOPIC), body=body)
                m.system_properties.message_id = f"ID{i}"
                m.system_properties.queue_id = 0
                m.system_properties.queue_offset = i
                m.system_properties.body_encoding = enc
                yield S.PullMessageResponse(message=m)
            yield S.PullMessageResponse(next_offset=len(bodies))

    monkeypatch.setattr(G, "MessagingServiceStub", Stub)
    caplog.set_level(logging.WARNING, "rmq_spark.datasource.read.pull")
    ctx = ReadContext(Connection(endpoints="127.0.0.1:9"), None, None)
    batches = list(read_pull(QueueRange(TOPIC, 0, 0, len(bodies), ctx)))
    got = [b for batch in batches for b in batch.column("body").to_pylist()]
    assert got == [b"plain", GOOD, gz_bomb, b"not gzip"]
    assert f"{TOPIC}/0 offset 2: the GZIP body inflates to more than 4194304 bytes" in caplog.text
    assert f"{TOPIC}/0 offset 3: the GZIP body is not valid gzip data" in caplog.text


# --- many bodies within the limit: a chunk bounded by stored bytes is bounded once inflated too -----


def test_inflate_bodies_with_a_budget_stops_before_the_body_that_passes_it():
    import numpy as np
    import pyarrow as pa

    mib = zlib.compress(bytes(1 << 20))
    bodies = pa.array([b"p" * 100, mib, mib, b"p" * 100, mib, mib], pa.binary())
    flags = np.array([0, 1, 1, 0, 1, 1], dtype=np.int32)
    assert len(I.inflate_bodies(bodies, flags)) == 6  # no budget: every row
    got = I.inflate_bodies(bodies, flags, budget=(2 << 20) + 100)
    assert got.to_pylist() == [b"p" * 100, bytes(1 << 20), bytes(1 << 20), b"p" * 100]
    one = I.inflate_bodies(bodies.slice(1), flags[1:], budget=10)  # the first row always
    assert one.to_pylist() == [bytes(1 << 20)]


@pytest.mark.parametrize("tags", [None, "a"])
def test_read_chunks_bounds_the_inflated_bodies_of_a_batch(store_dir, tags):
    from rmq_spark.filter import TagFilter

    n, body = 60, zlib.compress(bytes(1 << 20))  # 1 KiB stored, 1 MiB inflated each
    with MessageStore(
        store_dir, StoreConfig(commitlog_segment_bytes=4 << 20), clock=FakeClock()
    ) as s:
        s.put_messages([Message(TOPIC, body if i % 3 else b"plain %d" % i, {"TAGS": "ab"[i % 4 == 1]},
                                sys_flag=L.FLAG_COMPRESSED if i % 3 else 0) for i in range(n)])  # fmt: skip
        reader = StoreReader(store_dir)
        try:
            flt = TagFilter.parse(tags) if tags else None
            batches = list(reader.read_chunks(TOPIC, 0, 0, n, tag_filter=flt, max_bytes=4 << 20))
        finally:
            reader.close()
    want = [i for i in range(n) if tags is None or i % 4 != 1]
    got = [o for b in batches for o in b.column("queueOffset").to_pylist()]
    assert got == want  # every row once, in order
    assert all(b.column("body").to_pylist() == [bytes(1 << 20) if o % 3 else b"plain %d" % o
                                                for o in b.column("queueOffset").to_pylist()] for b in batches)  # fmt: skip
    sizes = [sum(len(x) for x in b.column("body").to_pylist()) for b in batches]
    assert len(batches) >= 9 and max(sizes) <= (4 << 20) + 100


@pytest.mark.parametrize("where", ["store", "reader"])
def test_readarrow_steps_are_bounded_by_the_inflated_size_of_their_bodies(
    store_dir, monkeypatch, where
):
    """The connector's ReadArrow (wire_chunks): a step of rows ends where its compressed bodies
    would pass READ_INFLATED_MAX once inflated, not after READ_STEP rows whatever they hold."""
    import rmq_spark.broker.connector.readers as readers

    monkeypatch.setattr(readers, "READ_INFLATED_MAX", 4 << 20)
    n, body = 30, zlib.compress(bytes(1 << 20))  # 1 KiB stored, 1 MiB inflated each
    with MessageStore(
        store_dir, StoreConfig(commitlog_segment_bytes=4 << 20), clock=FakeClock()
    ) as s:
        s.put_messages([Message(TOPIC, body if i % 2 else b"plain %d" % i, {}, sys_flag=L.FLAG_COMPRESSED if i % 2 else 0)
                        for i in range(n)])  # fmt: skip
        src = StoreReader(store_dir) if where == "reader" else s
        steps: list[int] = []

        def read(a: int, b: int, **bounds):  # type: ignore[no-untyped-def]
            batch = src.read_arrow(TOPIC, 0, a, b, **bounds)
            steps.append(sum(len(x) for x in batch.column("body").to_pylist()))
            return batch

        from rmq_spark.broker.connector import codec

        try:
            chunks = list(readers.wire_chunks(read, 0, n, None))
        finally:
            if where == "reader":
                src.close()
    rows = [r for c in chunks for r in codec.load_batch(c).to_pylist()]
    assert [r["queueOffset"] for r in rows] == list(range(n))  # every row once, in order
    assert [r["body"] for r in rows] == [
        bytes(1 << 20) if i % 2 else b"plain %d" % i for i in range(n)
    ]
    assert len(steps) >= 4 and max(steps) <= (4 << 20) + 100
