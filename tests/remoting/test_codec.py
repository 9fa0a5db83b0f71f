"""The remoting frame codec against frames captured from the real Java clients (rocketmq-client
4.9.8 and 5.5.0, the producer's first GET_ROUTEINFO_BY_TOPIC, once with the default JSON header
and once with ``-Drocketmq.serialize.type=ROCKETMQ``), and round trips of both serializations."""

from __future__ import annotations

import struct

import pytest

from rmq_spark.remoting.codes import RequestCode
from rmq_spark.remoting.command import (
    FRAME_MAX_BYTES,
    FrameError,
    LanguageCode,
    RemotingCommand,
    SerializeType,
    decode_frame,
    split_frame,
)
from rmq_spark.remoting.headers import HeaderError, fields_of

# bytes exactly as the Java producers sent them to a NameServer
JAVA_498_JSON = (
    b'\x00\x00\x00\x84\x00\x00\x00\x80{"code":105,"extFields":{"topic":"TBW102"},"flag":0,'
    b'"language":"JAVA","opaque":0,"serializeTypeCurrentRPC":"JSON","version":409}'
)
JAVA_498_ROCKETMQ = (
    b"\x00\x00\x00*\x01\x00\x00&\x00i\x00\x01\x99\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    b"\x00\x00\x00\x00\x11\x00\x05topic\x00\x00\x00\x06TBW102"
)
JAVA_550_JSON = (
    b'\x00\x00\x00\x86\x00\x00\x00\x82{"code":105,"extFields":{"topic":"CapTopic"},"flag":0,'
    b'"language":"JAVA","opaque":0,"serializeTypeCurrentRPC":"JSON","version":513}'
)
JAVA_550_ROCKETMQ = (
    b"\x00\x00\x00,\x01\x00\x00(\x00i\x00\x02\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    b"\x00\x00\x00\x00\x13\x00\x05topic\x00\x00\x00\x08CapTopic"
)


@pytest.mark.parametrize(("frame", "stype", "version", "topic"), [
    (JAVA_498_JSON, SerializeType.JSON, 409, "TBW102"),
    (JAVA_498_ROCKETMQ, SerializeType.ROCKETMQ, 409, "TBW102"),
    (JAVA_550_JSON, SerializeType.JSON, 513, "CapTopic"),
    (JAVA_550_ROCKETMQ, SerializeType.ROCKETMQ, 513, "CapTopic"),
])  # fmt: skip
def test_decodes_frames_of_the_java_clients_and_encodes_them_back(frame, stype, version, topic):
    assert split_frame(frame) == len(frame)
    assert split_frame(frame[:-1]) == 0
    cmd = decode_frame(frame[4:])
    assert cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC
    assert cmd.serialize_type is stype and cmd.version == version
    assert cmd.language is LanguageCode.JAVA and cmd.opaque == 0 and cmd.flag == 0
    assert cmd.ext_fields == {"topic": topic} and cmd.body == b"" and not cmd.is_response
    # what the client sent is what we write for the same command, byte for byte
    assert cmd.encode() == frame


@pytest.mark.parametrize("stype", list(SerializeType))
def test_round_trip_with_remark_body_and_unicode_fields(stype):
    cmd = RemotingCommand(310, {"b": "Tópic", "i": "TAGS\x01a\x02KEYS\x01k 1\x02"}, b"\x00body\xff", opaque=77,
                          flag=0x1, remark="réponse", version=415, language=LanguageCode.GO,
                          serialize_type=stype)  # fmt: skip
    data = cmd.encode()
    assert split_frame(data) == len(data)
    back = decode_frame(data[4:])
    assert back == cmd
    assert back.is_response and not back.is_oneway


def test_a_response_keeps_the_requests_opaque_and_serialization():
    req = RemotingCommand(
        11, {"topic": "T"}, opaque=9, version=409, serialize_type=SerializeType.ROCKETMQ
    )
    resp = req.response(19, "PULL_NOT_FOUND", {"nextBeginOffset": "3"})
    assert (resp.opaque, resp.serialize_type, resp.flag, resp.code) == (
        9,
        SerializeType.ROCKETMQ,
        1,
        19,
    )
    assert decode_frame(resp.encode()[4:]).ext_fields == {"nextBeginOffset": "3"}


def test_binary_header_writes_the_code_as_a_short():
    # RocketMQSerializable writes (short) code: POP_MESSAGE (200050) does not fit and wraps
    data = RemotingCommand(200050, serialize_type=SerializeType.ROCKETMQ).encode()
    assert (
        struct.unpack_from(">h", data, 8)[0]
        == struct.unpack(">h", struct.pack(">H", 200050 & 0xFFFF))[0]
    )


@pytest.mark.parametrize(("frame", "why"), [
    (struct.pack(">i", FRAME_MAX_BYTES + 1), "over 16 MiB"),
    (struct.pack(">i", 2) + b"\x00\x00", "shorter than its header length"),
    (struct.pack(">i", -5), "negative"),
])  # fmt: skip
def test_split_frame_rejects_lengths_no_frame_has(frame, why):
    with pytest.raises(FrameError):
        split_frame(frame)


@pytest.mark.parametrize(("payload", "why"), [
    (b"\x02\x00\x00\x02{}", "unknown serialize type 2"),
    (b"\x00\x00\x00\x10{}", "header length past the frame"),
    (b"\x00\x00\x00\x05{not", "JSON that does not parse"),
    (b"\x00\x00\x00\x02[]", "JSON that is not an object"),
    (b'\x00\x00\x00\x0e{"code":"abc"}', "a code that is not a number"),
    (b'\x00\x00\x00\x17{"code":1,"extFields":3}', "extFields not an object"),
    (b"\x01\x00\x00\x03\x00\x0a\x00", "binary header truncated"),
    (b"\x01\x00\x00\x11\x00\x0a\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x50", "remark runs past"),
    (b"\x01\x00\x00\x15\x00\x0a\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x40",
     "ext fields run past"),
])  # fmt: skip
def test_malformed_headers_raise_frame_error(payload, why):
    with pytest.raises(FrameError):
        decode_frame(payload)


def test_header_fields_missing_or_not_numbers_are_header_errors():
    f = fields_of(
        {"a": "x", "e": "12", "g": "99999999999"},
        {"a": "producerGroup", "e": "queueId", "g": "born"},
    )
    assert (
        f.str("producerGroup") == "x" and f.int("queueId") == 12 and f.long("born") == 99999999999
    )
    with pytest.raises(HeaderError, match="topic"):
        f.str("topic")
    with pytest.raises(HeaderError, match="not a number"):
        fields_of({"queueId": "one"}).int("queueId")
    with pytest.raises(HeaderError, match="out of range"):
        f.int("born")
    assert f.int("sysFlag", 0) == 0
