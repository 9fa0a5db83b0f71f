"""The broker's one-message send (``ProducerPath.send_one``: a plain message goes straight to the
store's one-record put, without the general path's message list, per-type answer or batch
objects) held to its general send path (``ProducerPath.send`` of the same message) byte for byte:
the same messages, sent through each path into its own store under the same injected clock,
leave identical CommitLog, ConsumeQueue and index files and get identical answers."""

from __future__ import annotations

import gzip
import os

from rocketmq.grpc_protocol import definition_pb2 as D
from rocketmq.grpc_protocol import service_pb2 as S

from rmq_spark.broker.producer import ProducerPath
from rmq_spark.broker.telemetry import ClientRegistry
from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.core import BrokerCore
from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.store import MessageStore, StoreConfig

CLIENT = "send-test-client"


def messages() -> list[D.Message]:
    """Plain messages (no group, no delivery time, not transactional) of two topics: bodies of
    many sizes (some gzip-encoded), tags, keys, user properties, born times and hosts, enough
    bytes to roll the small CommitLog and ConsumeQueue segments several times."""
    out = []
    for i in range(240):
        body = b"%d:" % i + b"b" * (40 + 53 * (i % 17))
        m = D.Message(topic=D.Resource(name=f"Send{i % 2}"))
        sp = m.system_properties
        if i % 9 == 4:
            m.body = gzip.compress(body, mtime=0)
            sp.body_encoding = D.Encoding.GZIP
        else:
            m.body = body
            sp.body_encoding = D.Encoding.IDENTITY
        sp.message_id = f"01AC11000100000000000000{i:08X}"
        sp.message_type = D.MessageType.NORMAL
        if i % 3:
            sp.tag = f"t{i % 3}"
        if i % 4 == 1:
            sp.keys.extend([f"order-{i}", "shared"])
        if i % 5 == 2:
            m.user_properties.update({"n": str(i), "region": "eu-west"})
        if i % 6 != 5:  # unset: the store's time
            sp.born_timestamp.FromMilliseconds(1_700_000_000_000 + 7 * i)
        if i % 11 == 3:
            sp.born_host = "::1" if i % 2 else "10.1.2.3"  # an IPv6 host: not the one-record put
        out.append(m)
    return out


def send_all(root: str, one: bool) -> tuple[list[S.SendMessageResponse], dict[str, int]]:
    """Send every message, one request each, through ``send_one`` (``one``) or ``send``; the
    answers, and how many went each way: the producer's plain one-message path, its general
    path, and (under either) the store's one-record put."""
    clock = FakeClock(1_700_000_100_000)
    store_cfg = StoreConfig(commitlog_segment_bytes=16 * 1024, cq_segment_units=50,
                            extra={"index_slots": 16, "index_entries": 64})  # fmt: skip
    core = BrokerCore(root, BrokerConfig(store=store_cfg), clock=clock, start_services=False)
    ways = {"plain": 0, "general": 0, "one_record": 0}
    try_put_row = core.store.try_put_row

    def counted_put(row):  # type: ignore[no-untyped-def]
        result = try_put_row(row)
        ways["one_record"] += result is not None
        return result

    core.store.try_put_row = counted_put  # type: ignore[method-assign]
    producer = ProducerPath(core, ClientRegistry())
    for way, name in (("plain", "_send_plain"), ("general", "_send_parsed")):

        def counted(*args, _way=way, _real=getattr(producer, name)):  # type: ignore[no-untyped-def]  # noqa: B008 - bound now, on purpose
            ways[_way] += 1
            return _real(*args)

        setattr(producer, name, counted)
    answers = []
    try:
        for pm in messages():
            cfg = core.store.topics.get_or_create(pm.topic.name)
            if one:
                answers.append(producer.send_one(pm, cfg, CLIENT, lambda: "10.0.0.9"))
            else:
                answers.append(producer.send([pm], [cfg], CLIENT, lambda: "10.0.0.9"))
            clock.advance(3)
    finally:
        core.store.shutdown()
    return answers, ways


def store_files(root: str) -> dict[str, bytes]:
    out = {}
    for sub in (L.COMMITLOG_DIR, L.CONSUMEQUEUE_DIR, L.INDEX_DIR):
        for r, _, names in os.walk(os.path.join(root, sub)):
            for name in names:
                path = os.path.join(r, name)
                with open(path, "rb") as f:
                    out[os.path.relpath(path, root)] = f.read()
    return out


def test_one_message_send_writes_the_bytes_and_answers_of_the_general_send(tmp_path):
    fast_root, general_root = str(tmp_path / "send_one"), str(tmp_path / "send")
    fast, fast_ways = send_all(fast_root, one=True)
    general, general_ways = send_all(general_root, one=False)
    assert (fast_ways["plain"], fast_ways["general"]) == (240, 0)
    assert (general_ways["plain"], general_ways["general"]) == (0, 240)
    # most were written by the store's one-record put; segment rolls and IPv6 hosts were not
    assert 150 <= fast_ways["one_record"] < 240

    assert [a.entries[0].message_id for a in fast] == [
        m.system_properties.message_id for m in messages()
    ]
    for i, (a, b) in enumerate(zip(fast, general, strict=True)):
        assert a.status.code == D.Code.OK, (i, a.status)
        assert a == b, i
        assert a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True), i

    fast_files, general_files = store_files(fast_root), store_files(general_root)
    assert sorted(fast_files) == sorted(general_files)
    for sub in (L.COMMITLOG_DIR, L.CONSUMEQUEUE_DIR, L.INDEX_DIR):
        assert any(n.startswith(sub + os.sep) for n in fast_files), sub
    assert sum(n.startswith(L.COMMITLOG_DIR + os.sep) for n in fast_files) > 2  # segments rolled
    for name, data in fast_files.items():
        assert data == general_files[name], name

    with MessageStore(
        fast_root, StoreConfig(commitlog_segment_bytes=16 * 1024, cq_segment_units=50)
    ) as s:
        got = s.get_messages("Send1", 0, 0, max_msgs=1).messages  # what was written reads back
        assert got and got[0].properties[L.P_UNIQ_KEY] == messages()[1].system_properties.message_id
