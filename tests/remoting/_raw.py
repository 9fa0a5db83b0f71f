"""A raw codec of RocketMQ's remoting protocol for the hostile tests, written from the protocol
(apache/rocketmq ``RemotingCommand``, ``RocketMQSerializable``, ``MessageDecoder``) and not from
:mod:`rmq_spark.remoting`, so a fault shared by the broker's codec and a test's cannot hide.

It writes what a well-behaved client never would: ext-field values of any JSON type (the JSON
header is built by hand, nesting included), text that is not UTF-8 in a binary header, batch
items whose lengths lie.  :class:`RawConnection` is a blocking socket that sends frames and reads
answers with a deadline, telling "no answer yet" from "the server closed the connection".
"""

from __future__ import annotations

import json
import socket
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

JSON, ROCKETMQ = 0, 1
FLAG_RESPONSE, FLAG_ONEWAY = 0x1, 0x2
LANGUAGES = (
    "JAVA",
    "CPP",
    "DOTNET",
    "PYTHON",
    "DELPHI",
    "ERLANG",
    "RUBY",
    "OTHER",
    "HTTP",
    "GO",
    "PHP",
    "OMS",
    "RUST",
    "NODE_JS",
)
MAGIC_V1, MAGIC_V2 = -626843481, -626843477  # MessageDecoder.MESSAGE_MAGIC_CODE(_V2)
SYSFLAG_COMPRESSED, SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6 = 0x1, 0x10, 0x20
NAME_VALUE_SEP, PROPERTY_SEP = "\x01", "\x02"

_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")


class Closed(ConnectionError):
    """The server closed the connection before answering."""


class NoAnswer(TimeoutError):
    """No answer within the deadline."""


@dataclass
class Frame:
    """One decoded frame (request or answer)."""

    code: int
    ext: dict[str, Any] = field(default_factory=dict)
    body: bytes = b""
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    version: int = 0
    language: Any = "JAVA"
    serialize: int = JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)


# --- encoding ---------------------------------------------------------------------------------------
def _json_value(v: Any) -> str:
    """``v`` as JSON text; nesting of any depth is written iteratively (json.dumps recurses)."""
    if isinstance(v, Nested):
        return v.text
    return json.dumps(v, ensure_ascii=True)


@dataclass(frozen=True)
class Nested:
    """A JSON value nested ``depth`` levels deep (arrays or objects), written without recursion."""

    depth: int
    kind: str = "array"

    @property
    def text(self) -> str:
        if self.kind == "array":
            return "[" * self.depth + "]" * self.depth
        return '{"a":' * self.depth + "1" + "}" * self.depth


def json_header(
    code: Any,
    ext: dict[str, Any] | None,
    *,
    opaque: int = 1,
    flag: int = 0,
    version: int = 0,
    language: Any = "JAVA",
    remark: Any = None,
    extra: dict[str, Any] | None = None,
) -> bytes:
    """The header as fastjson writes ``RemotingCommand`` (field names sorted), with values of any
    JSON type: ``ext`` values that are not strings are written as they are."""
    parts = [f'"code":{_json_value(code)}']
    if ext is not None:
        items = ",".join(f"{json.dumps(str(k))}:{_json_value(v)}" for k, v in ext.items())
        parts.append(f'"extFields":{{{items}}}')
    parts += [
        f'"flag":{_json_value(flag)}',
        f'"language":{_json_value(language)}',
        f'"opaque":{_json_value(opaque)}',
    ]
    if remark is not None:
        parts.append(f'"remark":{_json_value(remark)}')
    parts += ['"serializeTypeCurrentRPC":"JSON"', f'"version":{_json_value(version)}']
    for k, v in (extra or {}).items():
        parts.append(f"{json.dumps(k)}:{_json_value(v)}")
    return ("{" + ",".join(parts) + "}").encode("utf-8", "surrogatepass")


def _text(s: Any) -> bytes:
    """UTF-8 of ``s``; a lone surrogate is written as its (invalid) three bytes, as a buggy client
    would."""
    if isinstance(s, bytes):
        return s
    return str(s).encode("utf-8", "surrogatepass")


def rocketmq_header(
    code: int,
    ext: dict[str, Any] | None,
    *,
    opaque: int = 1,
    flag: int = 0,
    version: int = 0,
    language: int = 0,
    remark: Any = None,
) -> bytes:
    """``RocketMQSerializable.rocketMQProtocolEncode``: int16 code, int8 language, int16 version,
    int32 opaque, int32 flag, int32-prefixed remark, int32-prefixed ext fields of (int16 key
    length, key, int32 value length, value).  Numbers wrap as Java's casts do."""
    out = bytearray(
        struct.pack(
            ">hbhii",
            _wrap(code, 16),
            _wrap(language, 8),
            _wrap(version, 16),
            _wrap(opaque, 32),
            _wrap(flag, 32),
        )
    )
    r = _text(remark) if remark is not None else b""
    out += _I32.pack(len(r)) + r
    ext_bytes = bytearray()
    for k, v in (ext or {}).items():
        kb = _text(k)
        vb = _text(v if isinstance(v, (str, bytes)) else _json_value(v))
        ext_bytes += _I16.pack(_wrap(len(kb), 16)) + kb + _I32.pack(len(vb)) + vb
    out += _I32.pack(len(ext_bytes)) + ext_bytes
    return bytes(out)


def _wrap(n: int, bits: int) -> int:
    half = 1 << (bits - 1)
    return ((int(n) + half) % (1 << bits)) - half


def frame(serialize: int, header: bytes, body: bytes = b"") -> bytes:
    """length (int32, counting what follows it) | serialize type << 24 | header length | header | body."""
    return (
        _I32.pack(4 + len(header) + len(body))
        + _U32.pack(((serialize & 0xFF) << 24) | len(header))
        + header
        + body
    )


def request(
    code: int,
    ext: dict[str, Any] | None = None,
    body: bytes = b"",
    *,
    serialize: int = JSON,
    opaque: int = 1,
    flag: int = 0,
    version: int = 409,
    language: str = "JAVA",
    remark: Any = None,
) -> bytes:
    """A whole request frame."""
    if serialize == JSON:
        header = json_header(
            code,
            ext or {},
            opaque=opaque,
            flag=flag,
            version=version,
            language=language,
            remark=remark,
        )
    else:
        lang = LANGUAGES.index(language) if language in LANGUAGES else 7
        header = rocketmq_header(
            code, ext or {}, opaque=opaque, flag=flag, version=version, language=lang, remark=remark
        )
    return frame(serialize, header, body)


# --- decoding ---------------------------------------------------------------------------------------
def decode(payload: bytes) -> Frame:
    """A frame without its length field.  ValueError for bytes that are not a frame."""
    if len(payload) < 4:
        raise ValueError("frame shorter than its header-length field")
    (word,) = _U32.unpack_from(payload, 0)
    stype, hlen = word >> 24, word & 0xFFFFFF
    if hlen > len(payload) - 4:
        raise ValueError(f"header length {hlen} past the frame")
    header, body = payload[4 : 4 + hlen], payload[4 + hlen :]
    if stype == JSON:
        doc = json.loads(header)
        if not isinstance(doc, dict):
            raise ValueError("JSON header is not an object")
        return Frame(
            int(doc["code"]),
            dict(doc.get("extFields") or {}),
            body,
            int(doc.get("opaque", 0)),
            int(doc.get("flag", 0)),
            doc.get("remark"),
            int(doc.get("version", 0)),
            doc.get("language"),
            JSON,
        )
    if stype == ROCKETMQ:
        code, lang, version, opaque, flag = struct.unpack_from(">hbhii", header, 0)
        pos = 13
        (rlen,) = _I32.unpack_from(header, pos)
        pos += 4
        remark = header[pos : pos + rlen].decode() if rlen > 0 else None
        pos += max(rlen, 0)
        (elen,) = _I32.unpack_from(header, pos)
        pos += 4
        end = pos + elen
        ext: dict[str, Any] = {}
        while pos < end:
            (klen,) = _I16.unpack_from(header, pos)
            key = header[pos + 2 : pos + 2 + klen].decode()
            pos += 2 + klen
            (vlen,) = _I32.unpack_from(header, pos)
            ext[key] = header[pos + 4 : pos + 4 + vlen].decode()
            pos += 4 + vlen
        return Frame(
            code & 0xFFFF if code < 0 else code,
            ext,
            body,
            opaque,
            flag,
            remark,
            version,
            lang,
            ROCKETMQ,
        )
    raise ValueError(f"unknown serialize type {stype}")


class RawConnection:
    """A blocking TCP connection speaking raw frames."""

    def __init__(self, addr: str, timeout_s: float = 10.0) -> None:
        host, _, port = addr.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        self._opaque = 0

    def next_opaque(self) -> int:
        self._opaque += 1
        return self._opaque

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self, timeout_s: float) -> Frame:
        """The next frame from the server (answers and server-initiated requests alike)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if len(self._buf) >= 4:
                (n,) = _I32.unpack_from(self._buf, 0)
                if n < 4:
                    raise ValueError(f"the server sent a frame length of {n}")
                if len(self._buf) >= 4 + n:
                    payload = bytes(self._buf[4 : 4 + n])
                    del self._buf[: 4 + n]
                    return decode(payload)
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoAnswer(f"no answer in {timeout_s:.1f}s")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                raise NoAnswer(f"no answer in {timeout_s:.1f}s") from None
            except ConnectionResetError:
                raise Closed("connection reset by the server") from None
            if not chunk:
                raise Closed("the server closed the connection")
            self._buf += chunk

    def answer(self, opaque: int, timeout_s: float) -> Frame:
        """The answer to the request ``opaque`` (server requests in between are skipped)."""
        deadline = time.monotonic() + timeout_s
        while True:
            f = self.read_frame(max(0.0, deadline - time.monotonic()))
            if f.is_response and f.opaque == opaque:
                return f

    def call(
        self,
        code: int,
        ext: dict[str, Any] | None = None,
        body: bytes = b"",
        *,
        timeout_s: float = 10.0,
        **kw: Any,
    ) -> Frame:
        opaque = self.next_opaque()
        self.send(request(code, ext, body, opaque=opaque, **kw))
        return self.answer(opaque, timeout_s)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawConnection:  # noqa: PYI034 - a final class
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def call(
    addr: str,
    code: int,
    ext: dict[str, Any] | None = None,
    body: bytes = b"",
    *,
    timeout_s: float = 10.0,
    **kw: Any,
) -> Frame:
    """One request on a fresh connection."""
    with RawConnection(addr, timeout_s) as c:
        return c.call(code, ext, body, timeout_s=timeout_s, **kw)


# --- messages ---------------------------------------------------------------------------------------
def properties(props: dict[str, str]) -> str:
    """``MessageDecoder.messageProperties2String``: key \\x01 value \\x02 ..."""
    return "".join(f"{k}{NAME_VALUE_SEP}{v}{PROPERTY_SEP}" for k, v in props.items())


def parse_properties(text: str) -> dict[str, str]:
    out = {}
    for item in text.split(PROPERTY_SEP):
        if NAME_VALUE_SEP in item:
            k, v = item.split(NAME_VALUE_SEP, 1)
            out[k] = v
    return out


def batch_item(
    body: bytes,
    props: bytes | str = b"",
    *,
    flag: int = 0,
    props_len: int | None = None,
    total: int | None = None,
    body_len: int | None = None,
    magic: int = 0,
    crc: int = 0,
) -> bytes:
    """One message of a SEND_BATCH_MESSAGE body (``MessageDecoder.encodeMessage``): totalSize,
    magic, bodyCRC, flag, bodyLen, body, int16 propsLen, properties.  Any length may lie."""
    p = props.encode("utf-8", "surrogatepass") if isinstance(props, str) else props
    size = 20 + len(body) + 2 + len(p)
    return (
        struct.pack(
            ">iiiii",
            _wrap(size if total is None else total, 32),
            magic,
            crc,
            _wrap(flag, 32),
            _wrap(len(body) if body_len is None else body_len, 32),
        )
        + body
        + _I16.pack(_wrap(len(p) if props_len is None else props_len, 16))
        + p
    )


@dataclass
class Record:
    """A CommitLog record as a pull answers it (``MessageDecoder.decode``)."""

    queue_id: int
    flag: int
    queue_offset: int
    commitlog_offset: int
    sys_flag: int
    born_ms: int
    store_ms: int
    reconsume_times: int
    body: bytes
    topic: str
    properties: dict[str, str]
    body_crc: int


def decode_records(data: bytes) -> list[Record]:
    """Every record of a pull answer's body, each checked (magic, sizes, body CRC)."""
    out = []
    pos = 0
    while pos < len(data):
        total, magic, crc, queue_id, flag = struct.unpack_from(">iiiii", data, pos)
        if magic not in (MAGIC_V1, MAGIC_V2) or total < 0 or pos + total > len(data):
            raise ValueError(f"bad record at byte {pos}: size {total}, magic {magic}")
        p = pos + 20
        queue_offset, phys, sys_flag, born_ms = struct.unpack_from(">qqiq", data, p)
        p += 28
        p += (16 if sys_flag & SYSFLAG_BORNHOST_V6 else 4) + 4
        (store_ms,) = struct.unpack_from(">q", data, p)
        p += 8
        p += (16 if sys_flag & SYSFLAG_STOREHOST_V6 else 4) + 4
        reconsume, _prepared, blen = struct.unpack_from(">iqi", data, p)
        p += 16
        body = data[p : p + blen]
        p += blen
        if magic == MAGIC_V1:
            tlen = data[p]
            p += 1
        else:
            (tlen,) = struct.unpack_from(">h", data, p)
            p += 2
        topic = data[p : p + tlen].decode()
        p += tlen
        (plen,) = struct.unpack_from(">h", data, p)
        p += 2
        props = parse_properties(data[p : p + plen].decode()) if plen > 0 else {}
        p += max(plen, 0)
        if p != pos + total:
            raise ValueError(f"record at byte {pos} ends at {p}, its size says {pos + total}")
        if zlib.crc32(body) & 0x7FFFFFFF != crc & 0x7FFFFFFF and crc != 0:
            raise ValueError(f"record at byte {pos}: body CRC {crc} does not match")
        out.append(
            Record(
                queue_id,
                flag,
                queue_offset,
                phys,
                sys_flag,
                born_ms,
                store_ms,
                reconsume,
                body,
                topic,
                props,
                crc,
            )
        )
        pos += total
    return out


# --- the usual requests -------------------------------------------------------------------------------
def send_v2_header(
    topic: str,
    queue_id: int,
    props: dict[str, str] | None = None,
    *,
    group: str = "raw-producer",
    sys_flag: int = 0,
    batch: bool = False,
) -> dict[str, str]:
    """SendMessageRequestHeaderV2 as the Java client fills it."""
    h = {
        "a": group,
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": str(queue_id),
        "f": str(sys_flag),
        "g": str(int(time.time() * 1000)),
        "h": "0",
        "i": properties(props or {}),
        "j": "0",
        "k": "false",
    }
    if batch:
        h["m"] = "true"
    return h


def pull_header(
    topic: str,
    queue_id: int,
    offset: int,
    *,
    group: str = "raw-consumer",
    max_msgs: int = 32,
    suspend_ms: int = 0,
    expression: str = "*",
    expression_type: str = "TAG",
) -> dict[str, str]:
    """PullMessageRequestHeader of a pull consumer with its subscription in the request."""
    sys_flag = 0x4 | (0x2 if suspend_ms else 0)
    return {
        "consumerGroup": group,
        "topic": topic,
        "queueId": str(queue_id),
        "queueOffset": str(offset),
        "maxMsgNums": str(max_msgs),
        "sysFlag": str(sys_flag),
        "commitOffset": "0",
        "suspendTimeoutMillis": str(suspend_ms),
        "subscription": expression,
        "subVersion": "0",
        "expressionType": expression_type,
    }


def sign(ext: dict[str, Any], body: bytes, access_key: str, secret_key: str) -> dict[str, Any]:
    """``ext`` with ``AccessKey`` and ``Signature`` as RocketMQ's ``AclClientRPCHook`` adds them:
    ``Base64(HmacSHA1(secretKey, content))``, content being every other ext field's value in the
    order of the sorted names, then the body (``AclUtils.combineRequestContent``).  A value that
    is not text is signed as a Java server reads it from JSON; a null is left out."""
    import base64
    import hashlib
    import hmac

    out = dict(ext)
    out["AccessKey"] = access_key
    out.pop("Signature", None)
    content = "".join(_as_text(v) for k, v in sorted(out.items()) if v is not None)
    digest = hmac.new(
        secret_key.encode(), content.encode("utf-8", "surrogatepass") + body, hashlib.sha1
    )
    out["Signature"] = base64.b64encode(digest.digest()).decode()
    return out


def _as_text(v: Any) -> str:
    """An ext value as a Java server reads it from a JSON header (numbers and booleans as text)."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    return v.text if isinstance(v, Nested) else json.dumps(v)
