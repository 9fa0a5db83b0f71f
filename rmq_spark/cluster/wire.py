"""What the cluster client's calls take and give: RocketMQ's wire encodings of properties and
batches, the results of sends and pulls, and the errors that name broker, address, request and
answer (:mod:`rmq_spark.cluster.client` makes the calls)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rmq_spark.errors import ConfigError, RmqError
from rmq_spark.remoting.codes import ResponseCode

__all__ = [
    "PULL_CODES",
    "SEND_STATUS",
    "TRANSACTION_COMMIT_TYPE",
    "TRANSACTION_NOT_TYPE",
    "TRANSACTION_PREPARED_TYPE",
    "TRANSACTION_ROLLBACK_TYPE",
    "BrokerUnreachableError",
    "ClusterError",
    "PullResult",
    "SendResult",
    "code_name",
    "encode_batch",
    "encode_properties",
    "parse_namesrv_addr",
]

NAME_VALUE_SEP = "\x01"
PROPERTY_SEP = "\x02"
# MessageSysFlag / TransactionType values of END_TRANSACTION's commitOrRollback
TRANSACTION_NOT_TYPE = 0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
SEND_STATUS = {
    ResponseCode.SUCCESS: "SEND_OK",
    ResponseCode.FLUSH_DISK_TIMEOUT: "FLUSH_DISK_TIMEOUT",
    ResponseCode.FLUSH_SLAVE_TIMEOUT: "FLUSH_SLAVE_TIMEOUT",
    ResponseCode.SLAVE_NOT_AVAILABLE: "SLAVE_NOT_AVAILABLE",
}
PULL_CODES = (
    ResponseCode.SUCCESS,
    ResponseCode.PULL_NOT_FOUND,
    ResponseCode.PULL_RETRY_IMMEDIATELY,
    ResponseCode.PULL_OFFSET_MOVED,
)


def code_name(code: int, enum: type) -> str:
    try:
        return f"{enum(code).name} ({code})"
    except ValueError:
        return str(code)


class ClusterError(RmqError):
    """A request to a broker or NameServer failed: names who, where, what and the answer."""

    def __init__(
        self,
        message: str,
        *,
        broker: str | None = None,
        addr: str | None = None,
        request: int | None = None,
        code: int | None = None,
        remark: str | None = None,
    ) -> None:
        super().__init__(message)
        self.broker, self.addr, self.request, self.code, self.remark = (
            broker,
            addr,
            request,
            code,
            remark,
        )


class BrokerUnreachableError(ClusterError):
    """No answer at all: the connection failed, broke or timed out (the broker may be down)."""


def parse_namesrv_addr(value: str) -> list[str]:
    """``"h1:9876;h2:9876"`` (``,`` accepted too) as a list, each checked to be host:port."""
    addrs = [a.strip() for a in value.replace(",", ";").split(";") if a.strip()]
    if not addrs:
        raise ConfigError("namesrvAddr lists no NameServer: give host:port[;host:port...]")
    for a in addrs:
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"namesrvAddr: {a!r} is not host:port")
    return addrs


def encode_properties(props: Mapping[str, str]) -> str:
    """``MessageDecoder.messageProperties2String``: ``k\\x01v\\x02`` per property."""
    return "".join(f"{k}{NAME_VALUE_SEP}{v}{PROPERTY_SEP}" for k, v in props.items())


def encode_batch(messages: Iterable[tuple[bytes, Mapping[str, str], int]]) -> bytes:
    """The body of SEND_BATCH_MESSAGE (``MessageDecoder.encodeMessages``): per message TOTALSIZE,
    MAGICCODE 0, BODYCRC 0, FLAG, BODYLEN + BODY, PROPERTIESLEN (short) + PROPERTIES."""
    parts = []
    for body, props, flag in messages:
        p = encode_properties(props).encode("utf-8")
        if len(p) > 32767:
            raise ConfigError(f"a message's properties take {len(p)} bytes, over RocketMQ's 32767")
        total = 4 + 4 + 4 + 4 + 4 + len(body) + 2 + len(p)
        parts += [
            total.to_bytes(4, "big"),
            b"\0\0\0\0\0\0\0\0",
            (flag & 0xFFFFFFFF).to_bytes(4, "big"),
            len(body).to_bytes(4, "big"),
            body,
            len(p).to_bytes(2, "big"),
            p,
        ]
    return b"".join(parts)


@dataclass(frozen=True)
class PullResult:
    code: int  # SUCCESS, PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY or PULL_OFFSET_MOVED
    body: bytes  # CommitLog records, concatenated (SUCCESS only)
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_broker_id: int = 0

    @property
    def found(self) -> bool:
        return self.code == ResponseCode.SUCCESS


@dataclass(frozen=True)
class SendResult:
    status: str  # SEND_OK, FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE
    msg_id: str  # the client's id (UNIQ_KEY) when the message had one, else the offset msgId
    offset_msg_id: str
    broker: str
    queue_id: int
    queue_offset: int
    transaction_id: str | None = None
