"""What a gRPC consumer gets of a record a remoting producer compressed: the body inflated (the
Java client compresses bodies over 4 KiB and flags the record COMPRESSED; the proxy's client-side
decoding inflates it), never the zlib bytes marked IDENTITY; a poison record as stored."""

from __future__ import annotations

import gzip
import hashlib
import logging
import zlib

import pytest

from rmq_spark.broker.codes import Code, RpcStatusError
from rmq_spark.broker.messages import _decoded_body, to_proto
from rmq_spark.store import layout as L
from rmq_spark.store.message import MessageExt


def _ext(body: bytes, sys_flag: int) -> MessageExt:
    return MessageExt(
        topic="T", body=body, properties={"UNIQ_KEY": "u1"}, sys_flag=sys_flag, commitlog_offset=42
    )


def test_a_compressed_record_reaches_a_grpc_consumer_inflated():
    text = b"the producer's own bytes " * 400
    out = to_proto(_ext(zlib.compress(text), L.FLAG_COMPRESSED))
    assert out.body == text
    assert out.system_properties.body_digest.checksum == hashlib.md5(text).hexdigest().upper()


def test_a_poison_record_is_delivered_as_stored_and_named(caplog):
    with caplog.at_level(logging.WARNING, logger="rmq_spark.broker"):
        out = to_proto(_ext(b"not zlib at all", L.FLAG_COMPRESSED))
    assert out.body == b"not zlib at all"
    assert "offset 42" in caplog.text


def test_gzip_bodies_are_decoded_within_the_limit_and_whole():
    assert _decoded_body(gzip.compress(b"abc"), 2, 100) == b"abc"
    with pytest.raises(RpcStatusError) as e:
        _decoded_body(gzip.compress(b"x" * 1000), 2, 100)
    assert e.value.code == Code.MESSAGE_BODY_TOO_LARGE
    with pytest.raises(RpcStatusError) as e:
        _decoded_body(
            gzip.compress(b"abcdef" * 50)[:-12], 2, 1000
        )  # truncated: not stored as its prefix
    assert e.value.code == Code.MESSAGE_CORRUPTED
