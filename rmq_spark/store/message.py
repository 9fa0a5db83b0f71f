"""Messages, their properties string, message ids and the Java string hash used for tags.

A :class:`Message` is what a producer hands to the store; a :class:`MessageExt` is a message read
back from the CommitLog with everything the store assigned (offsets, store time, ids).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from rmq_spark.store import layout as L
from rmq_spark.store.hashing import java_string_hash

__all__ = [
    "Message",
    "MessageExt",
    "UniqIdGenerator",
    "decode_offset_msg_id",
    "host_bytes",
    "java_string_hash",
    "new_uniq_id",
    "offset_msg_id",
    "tags_code",
]

_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)


_TAGS_CODE_CACHE: dict[str, int] = {}


def tags_code(tags: str | None) -> int:
    """The ConsumeQueue tagsCode of a TAGS property: its Java hash, 0 when absent or empty."""
    if not tags:
        return 0
    code = _TAGS_CODE_CACHE.get(tags)
    if code is None:
        code = java_string_hash(tags)
        if len(_TAGS_CODE_CACHE) < 65536:
            _TAGS_CODE_CACHE[tags] = code
    return code


@functools.lru_cache(maxsize=256)
def host_bytes(host: str) -> bytes:
    """Raw 4- or 16-byte address of an IP literal (names resolve to 127.0.0.1 when unknown);
    cached, as every put of a host asks for the same few addresses."""
    try:
        return ipaddress.ip_address(host).packed
    except ValueError:
        try:
            return socket.inet_aton(socket.gethostbyname(host))
        except OSError:
            return b"\x7f\x00\x00\x01"


def offset_msg_id(store_host: bytes, store_port: int, commitlog_offset: int) -> str:
    """``MessageDecoder.createMessageId``: store IP + port + CommitLog offset, upper-case hex
    (32 characters for IPv4, 56 for IPv6)."""
    return (store_host + struct.pack(">iq", store_port, commitlog_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[bytes, int, int]:
    """Inverse of :func:`offset_msg_id`: (ip bytes, port, CommitLog offset)."""
    if len(msg_id) not in (32, 56):
        raise ValueError(f"offsetMsgId must be 32 or 56 hex characters, got {len(msg_id)}")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as e:
        raise ValueError(f"offsetMsgId {msg_id!r} is not hexadecimal") from e
    ip_len = 4 if len(raw) == 16 else 16
    port, offset = struct.unpack(">iq", raw[ip_len:])
    return raw[:ip_len], port, offset


def offset_msg_ids(store_host: bytes, store_port: int, offsets: np.ndarray) -> np.ndarray:
    """Vectorized :func:`offset_msg_id` for many CommitLog offsets: a fixed-width ``S32|S56`` array."""
    n = len(offsets)
    prefix = np.frombuffer(store_host + struct.pack(">i", store_port), dtype=np.uint8)
    raw = np.empty((n, len(prefix) + 8), dtype=np.uint8)
    raw[:, : len(prefix)] = prefix
    raw[:, len(prefix) :] = np.asarray(offsets, dtype=">i8").view(np.uint8).reshape(n, 8)
    return hex_rows(raw)


# byte -> its two upper-case hex digits as a little-endian uint16 (high nibble first in memory)
_HEX_PAIRS = (
    _HEX[np.arange(256) >> 4].astype("<u2") | (_HEX[np.arange(256) & 0x0F].astype("<u2") << 8)
).astype("<u2")


def hex_rows(raw: np.ndarray) -> np.ndarray:
    """Upper-case hex of each row of a 2-D uint8 array, as a fixed-width bytes array (one
    lookup per byte)."""
    n, w = raw.shape
    return np.ascontiguousarray(_HEX_PAIRS[raw]).view(f"S{w * 2}").reshape(n)


_ID32 = re.compile(".{32}", re.S)


def split_ids(ids: np.ndarray) -> list[str]:
    """An (n, 32) array of ASCII hex digits as ``n`` strings."""
    return _ID32.findall(ids.tobytes().decode("ascii"))


class IdColumn(Sequence[str]):
    """The unique ids of a batch's records, kept as their (n, 32) array of ASCII hex digits and
    read as a sequence of str (made on the first read).  The index hashes the digits themselves
    (:func:`~rmq_spark.store.hashing.java_string_hashes_of_rows`): a bulk put makes no string.
    ``present``: which records have an id (None: all); the others read as None (a commit's op
    message before its real messages)."""

    __slots__ = ("_strs", "digits", "present")

    def __init__(self, digits: np.ndarray, present: np.ndarray | None = None) -> None:
        self.digits = digits
        self.present = present
        self._strs: list[str] | None = None

    def __len__(self) -> int:
        return len(self.digits)

    def _list(self) -> list[str]:
        if self._strs is None:
            strs = split_ids(self.digits)
            if self.present is not None:
                for i in np.flatnonzero(~self.present).tolist():
                    strs[i] = None  # type: ignore[call-overload]
            self._strs = strs
        return self._strs

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        if isinstance(i, slice):
            return IdColumn(self.digits[i], None if self.present is None else self.present[i])
        if self._strs is None:  # one id: its digits alone (the whole list is made by a walk)
            if self.present is not None and not self.present[i]:
                return None
            return self.digits[i].tobytes().decode("ascii")
        return self._strs[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._list())

    def take(self, idx: np.ndarray) -> IdColumn:
        return IdColumn(self.digits[idx], None if self.present is None else self.present[idx])

    @staticmethod
    def joined(parts: Sequence[Sequence[str | None]]) -> IdColumn | None:
        """``parts`` as one column when each is an IdColumn or holds no id at all (None if not)."""
        digits, present, holes = [], [], False
        for p in parts:
            if isinstance(p, IdColumn):
                digits.append(p.digits)
                present.append(np.ones(len(p), dtype=bool) if p.present is None else p.present)
                holes |= p.present is not None
            elif not any(p):
                digits.append(np.zeros((len(p), 32), dtype=np.uint8))
                present.append(np.zeros(len(p), dtype=bool))
                holes = True
            else:
                return None
        return IdColumn(np.concatenate(digits), np.concatenate(present) if holes else None)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Sequence) and not isinstance(other, str) and list(self) == list(other)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"IdColumn({self._list()!r})"


class UniqIdGenerator:
    """Client-style unique message ids (``MessageClientIDSetter``): IP(4) + pid(2) + a per-process
    int(4), then ms since the start of the month(4) and a wrapping counter(2), in hex."""

    def __init__(self, ip: bytes = b"\x7f\x00\x00\x01") -> None:
        self._prefix = ip + struct.pack(">hi", os.getpid() & 0x7FFF, id(self) & 0x7FFFFFFF)
        self._prefix_hex = self._prefix.hex().upper()
        self._lock = threading.Lock()
        self._counter = 0
        self._month_start_ms = 0
        self._month_end_ms = 0

    def _month_base(self, now_ms: int) -> int:
        if not (self._month_start_ms <= now_ms < self._month_end_ms):
            t = time.localtime(now_ms / 1000)
            start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
            y, m = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
            end = time.mktime((y, m, 1, 0, 0, 0, 0, 0, -1))
            self._month_start_ms, self._month_end_ms = int(start * 1000), int(end * 1000)
        return self._month_start_ms

    def next_ids(self, n: int, now_ms: int | None = None) -> list[str]:
        """``n`` new ids (vectorized: one numpy pass for a large batch)."""
        if n <= 8:
            if now_ms is None:
                now_ms = time.time_ns() // 1_000_000
            with self._lock:
                base = self._month_start_ms
                if not base <= now_ms < self._month_end_ms:
                    base = self._month_base(now_ms)
                first = self._counter
                self._counter = (first + n) & 0xFFFF
            head = f"{self._prefix_hex}{(now_ms - base) & 0x7FFFFFFF:08X}"
            if n == 1:
                return [f"{head}{first:04X}"]
            return [f"{head}{(first + k) & 0xFFFF:04X}" for k in range(n)]
        return split_ids(self.next_ids_array(n, now_ms))

    def next_ids_array(self, n: int, now_ms: int | None = None) -> np.ndarray:
        """``n`` new ids as an (n, 32) array of ASCII hex digits."""
        if now_ms is None:
            now_ms = time.time_ns() // 1_000_000
        with self._lock:
            elapsed = (now_ms - self._month_base(now_ms)) & 0x7FFFFFFF
            first = self._counter
            self._counter = (first + n) & 0xFFFF
        raw = np.empty((n, 16), dtype=np.uint8)
        raw[:, :10] = np.frombuffer(self._prefix, dtype=np.uint8)
        raw[:, 10:14] = np.frombuffer(struct.pack(">i", elapsed), dtype=np.uint8)
        counters = ((np.arange(n, dtype=np.int64) + first) & 0xFFFF).astype(">u2")
        raw[:, 14:16] = counters.view(np.uint8).reshape(n, 2)
        return hex_rows(raw).view(np.uint8).reshape(n, 32)

    def next_id(self) -> str:
        return self.next_ids(1)[0]


_DEFAULT_UNIQ = UniqIdGenerator()


def new_uniq_id() -> str:
    return _DEFAULT_UNIQ.next_id()


def new_uniq_ids(n: int) -> list[str]:
    return _DEFAULT_UNIQ.next_ids(n)


def new_uniq_ids_array(n: int) -> np.ndarray:
    return _DEFAULT_UNIQ.next_ids_array(n)


@dataclass
class Message:
    """A message as a producer sends it. ``queue_id`` -1 lets the store choose (queue 0)."""

    topic: str
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int = 0
    flag: int = 0
    sys_flag: int = 0
    born_timestamp_ms: int = 0
    born_host: str = "127.0.0.1"
    born_port: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(L.P_TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(L.P_KEYS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(L.P_UNIQ_KEY)


@dataclass
class MessageExt(Message):
    """A message read back from the CommitLog."""

    queue_offset: int = 0
    commitlog_offset: int = 0
    store_size: int = 0
    store_timestamp_ms: int = 0
    store_host: str = "127.0.0.1"
    store_port: int = 0
    body_crc: int = 0
    msg_id: str = ""  # offsetMsgId

    @property
    def transaction_type(self) -> int:
        return self.sys_flag & L.TRANSACTION_MASK

    @property
    def client_msg_id(self) -> str:
        """The client's unique id (UNIQ_KEY) when present, else the offsetMsgId."""
        return self.properties.get(L.P_UNIQ_KEY) or self.msg_id
