"""RemotingCommand: one frame of RocketMQ's remoting protocol, and its two header serializations.

A frame on the wire (``RemotingCommand.encode`` / ``decode`` in apache/rocketmq)::

    +-----------+-----------------------+------------------+------------+
    | length    | serialize type | hlen | header           | body       |
    | int32 BE  | int8           | int24| hlen bytes       | the rest   |
    +-----------+-----------------------+------------------+------------+
      length = 4 + hlen + len(body): everything after the length field itself

The header is JSON (``SerializeType.JSON`` = 0, fastjson of the command's getters) or RocketMQ's
binary layout (``SerializeType.ROCKETMQ`` = 1, ``RocketMQSerializable``)::

    +-------+----------+---------+--------+-------+-----------------+---------------------------+
    | code  | language | version | opaque | flag  | remark          | ext fields                |
    | int16 | int8     | int16   | int32  | int32 | int32 len + UTF8| int32 len + repeated      |
    |       |          |         |        |       |                 | (int16 klen, key,         |
    |       |          |         |        |       |                 |  int32 vlen, value)       |
    +-------+----------+---------+--------+-------+-----------------+---------------------------+

``flag`` bit 0 marks a response, bit 1 a oneway request; ``opaque`` pairs a response with its
request.  Ext fields are strings (numbers in decimal, booleans ``true``/``false``).  A response is
written in the serialization of the request it answers.
"""

from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FRAME_MAX_BYTES",
    "FrameError",
    "LanguageCode",
    "RemotingCommand",
    "SerializeType",
    "decode_frame",
    "split_frame",
]

# NettyDecoder's FRAME_MAX_LENGTH default (com.rocketmq.remoting.frameMaxLength): 16 MiB
FRAME_MAX_BYTES = 16 * 1024 * 1024
FLAG_RESPONSE = 0x1  # RemotingCommand.RPC_TYPE
FLAG_ONEWAY = 0x2  # RemotingCommand.RPC_ONEWAY

_LENGTH = struct.Struct(">i")
_TYPE_AND_HEADER_LENGTH = struct.Struct(">I")
# ROCKETMQ header: code, language, version, opaque, flag (then remark and ext fields)
_BINARY_FIXED = struct.Struct(">hbhii")
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")


class FrameError(ValueError):
    """Bytes that are not a valid remoting frame (too long, unknown serialize type, a header that
    does not parse).  The server answers what it can and closes the connection."""


class SerializeType(enum.IntEnum):
    JSON = 0
    ROCKETMQ = 1


class LanguageCode(enum.IntEnum):
    """``LanguageCode`` of apache/rocketmq: the byte in the binary header, the name in JSON."""

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12
    NODE_JS = 13

    @classmethod
    def of(cls, value: object) -> LanguageCode:
        if isinstance(value, str):
            return cls.__members__.get(value, cls.OTHER)
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                return cls.OTHER
        return cls.OTHER


@dataclass
class RemotingCommand:
    code: int
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    version: int = 0
    language: LanguageCode = LanguageCode.JAVA
    serialize_type: SerializeType = SerializeType.JSON
    # set by the request table's gate (rmq_spark.remoting.requests) before a handler runs: the
    # decoded header and the signed account (None: no ACL)
    header: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    account: Any = field(default=None, compare=False, repr=False)
    # the body as the request table's row parsed it (a heartbeat's or a lock's JSON), or None
    decoded_body: Any = field(default=None, compare=False, repr=False)

    # --- kinds ----------------------------------------------------------------------------------
    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def response(
        self,
        code: int,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """The answer to this request: same opaque and serialization, the response flag set."""
        return RemotingCommand(code, ext_fields or {}, body, self.opaque, FLAG_RESPONSE, remark, self.version,
                               LanguageCode.JAVA, self.serialize_type)  # fmt: skip

    # --- encode ---------------------------------------------------------------------------------
    def encode(self) -> bytes:
        header = (
            self._json_header()
            if self.serialize_type is SerializeType.JSON
            else self._binary_header()
        )
        if len(header) > 0xFFFFFF:
            raise FrameError(f"header of {len(header)} bytes does not fit the 24-bit header length")
        head = _LENGTH.pack(4 + len(header) + len(self.body)) + _TYPE_AND_HEADER_LENGTH.pack(
            (int(self.serialize_type) << 24) | len(header)
        )
        return head + header + self.body if self.body else head + header

    def _json_header(self) -> bytes:
        doc = {
            "code": self.code,
            "extFields": self.ext_fields,
            "flag": self.flag,
            "language": self.language.name,
            "opaque": self.opaque,
            "serializeTypeCurrentRPC": self.serialize_type.name,
            "version": self.version,
        }
        if self.remark is not None:
            doc["remark"] = self.remark
        try:
            return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
        except UnicodeEncodeError:  # a lone surrogate (echoed from a request): JSON escapes it
            return json.dumps(doc, separators=(",", ":")).encode()

    def _binary_header(self) -> bytes:
        parts = [_BINARY_FIXED.pack(_short_code(self.code), int(self.language), _short(self.version), self.opaque,
                                    self.flag)]  # fmt: skip
        # a lone surrogate (echoed from a request) is written as "?", as Java's getBytes(UTF_8) does
        remark = (self.remark or "").encode("utf-8", "replace")
        parts += [_INT.pack(len(remark)), remark]
        ext = bytearray()
        for k, v in self.ext_fields.items():
            kb, vb = k.encode("utf-8", "replace"), str(v).encode("utf-8", "replace")
            ext += _SHORT.pack(len(kb)) + kb + _INT.pack(len(vb)) + vb
        parts += [_INT.pack(len(ext)), bytes(ext)]
        return b"".join(parts)


def _short(value: int) -> int:
    return ((value + 0x8000) & 0xFFFF) - 0x8000


def _short_code(code: int) -> int:
    """The binary header's code is an int16 (RocketMQSerializable writes ``(short) code``)."""
    return _short(code)


# --- decode -----------------------------------------------------------------------------------------
def split_frame(buf: bytes | bytearray | memoryview, max_bytes: int = FRAME_MAX_BYTES) -> int:
    """The length of the first whole frame in ``buf`` including its length field, or 0 when more
    bytes are needed.  Raises FrameError for a length that no valid frame has."""
    if len(buf) < 4:
        return 0
    (length,) = _LENGTH.unpack_from(buf, 0)
    if length < 4 or length > max_bytes:
        raise FrameError(f"frame length {length} outside [4, {max_bytes}]")
    return 4 + length if len(buf) >= 4 + length else 0


def decode_frame(frame: bytes | bytearray | memoryview) -> RemotingCommand:
    """One frame *without* its leading length field: type-and-header-length, header, body."""
    if len(frame) < 4:
        raise FrameError("frame shorter than its header length field")
    (word,) = _TYPE_AND_HEADER_LENGTH.unpack_from(frame, 0)
    stype, header_len = word >> 24, word & 0xFFFFFF
    if header_len > len(frame) - 4:
        raise FrameError(
            f"header length {header_len} exceeds the frame ({len(frame) - 4} bytes after it)"
        )
    header = bytes(frame[4 : 4 + header_len])
    body = bytes(frame[4 + header_len :])
    if stype == SerializeType.JSON:
        cmd = _decode_json(header)
    elif stype == SerializeType.ROCKETMQ:
        cmd = _decode_binary(header)
    else:
        raise FrameError(f"unknown serialize type {stype}")
    cmd.body = body
    return cmd


# ext field values are strings (numbers and booleans are taken as text); an object or array is
# taken as its JSON text, nested at most this deep (a client never sends one)
JSON_EXT_VALUE_MAX_DEPTH = 8


def _decode_json(header: bytes) -> RemotingCommand:
    try:
        doc = json.loads(header)
    except (UnicodeDecodeError, ValueError) as e:
        raise FrameError(f"JSON header does not parse: {str(e)[:200]}") from None
    except RecursionError:
        raise FrameError("JSON header nests too deeply") from None
    if not isinstance(doc, dict):
        raise FrameError("JSON header is not an object")
    try:
        code, opaque = _int32(doc.get("code")), _int32(doc.get("opaque", 0))
        flag, version = _int32(doc.get("flag", 0)), _int32(doc.get("version", 0))
    except (TypeError, ValueError) as e:
        raise FrameError(f"JSON header field: {e}") from None
    ext = doc.get("extFields") or {}
    if not isinstance(ext, dict):
        raise FrameError("JSON header's extFields is not an object")
    for k, v in ext.items():
        if isinstance(v, (dict, list)) and _depth(v) > JSON_EXT_VALUE_MAX_DEPTH:
            raise FrameError(
                f"JSON header's extFields value {k[:64]!r} nests deeper than {JSON_EXT_VALUE_MAX_DEPTH} levels"
            )
    remark = doc.get("remark")
    return RemotingCommand(
        # a null value is a field not sent (fastjson leaves it out; the signature skips it)
        code, {str(k): v if v.__class__ is str else _ext_value(v) for k, v in ext.items() if v is not None}, b"",
        opaque, flag,
        remark if isinstance(remark, str) else None, version, LanguageCode.of(doc.get("language")),
        SerializeType.JSON,
    )  # fmt: skip


def _depth(value: object) -> int:
    """How deep a parsed JSON value nests (iterative: no recursion however deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest


def _int32(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{value!r} is not an integer")
    n = int(value)
    if not -(1 << 31) <= n < (1 << 31):
        raise ValueError(f"{n} does not fit an int32")
    return n


def _ext_value(v: object) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v) if isinstance(v, (dict, list)) else str(v)


def _decode_binary(header: bytes) -> RemotingCommand:
    try:
        code, lang, version, opaque, flag = _BINARY_FIXED.unpack_from(header, 0)
        pos = _BINARY_FIXED.size
        (remark_len,) = _INT.unpack_from(header, pos)
        pos += 4
        if remark_len < 0 or pos + remark_len > len(header):
            raise FrameError(f"remark length {remark_len} runs past the header")
        remark = header[pos : pos + remark_len].decode() if remark_len else None
        pos += remark_len
        (ext_len,) = _INT.unpack_from(header, pos)
        pos += 4
        if ext_len < 0 or pos + ext_len > len(header):
            raise FrameError(f"ext fields length {ext_len} runs past the header")
        end = pos + ext_len
        ext: dict[str, str] = {}
        while pos < end:
            (klen,) = _SHORT.unpack_from(header, pos)
            pos += 2
            if klen < 0 or pos + klen > end:
                raise FrameError("ext field key runs past the ext fields")
            key = header[pos : pos + klen].decode()
            pos += klen
            (vlen,) = _INT.unpack_from(header, pos)
            pos += 4
            if vlen < 0 or pos + vlen > end:
                raise FrameError("ext field value runs past the ext fields")
            ext[key] = header[pos : pos + vlen].decode()
            pos += vlen
    except struct.error as e:
        raise FrameError(f"binary header truncated: {e}") from None
    except UnicodeDecodeError as e:
        raise FrameError(f"binary header text is not UTF-8: {e}") from None
    return RemotingCommand(code, ext, b"", opaque, flag, remark, version, LanguageCode.of(lang),
                           SerializeType.ROCKETMQ)  # fmt: skip
