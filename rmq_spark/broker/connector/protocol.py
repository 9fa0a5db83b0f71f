"""The connector service's protocol: every document its server and client exchange, defined once.

Each request and response is a :class:`Document` (a dataclass): its fields, in order, are the
keys of the JSON object on the wire (:mod:`rmq_spark.broker.connector.codec` turns the objects
into bytes), so a field is named here and nowhere else.  Each RPC is a :class:`Method`: its
name under service :data:`SERVICE`, its request and its response (``None``: a stream of Arrow
IPC chunks).  ``Send`` takes a frame (:class:`~rmq_spark.broker.connector.codec.Frame`) whose
header is a :class:`SendHeader` and whose Arrow rows are the sink's row columns.

=================  ==========================  =====================================================
method             request                     response
=================  ==========================  =====================================================
Ping               Empty                       PingResponse
Info               Empty                       InfoResponse (store root, host, pid ...)
Topics             Empty                       TopicsResponse
Offsets            OffsetsRequest              OffsetsResponse (one atomic max snapshot, min)
OffsetsForTimes    OffsetsForTimesRequest      OffsetsForTimesResponse (the bare topic map)
ReadArrow          ReadArrowRequest            stream of Arrow IPC record batches
Send               frame: SendHeader + rows    SendResponse (and the broker's send limits)
CommitBatch        SinkBatchRequest            CommitBatchResponse
AbortBatch         SinkBatchRequest            AbortBatchResponse
CommitOffsets      CommitOffsetsRequest        Empty
QueryOffsets       QueryOffsetsRequest         QueryOffsetsResponse
SinkStatus         SinkStatusRequest           SinkStatusResponse
=================  ==========================  =====================================================

A request missing a required field fails to decode (``TypeError``); unknown keys are ignored.
Faults travel as gRPC status codes with the RmqError class name in the trailing metadata key
:data:`ERROR_METADATA_KEY` (:func:`rmq_spark.broker.codes.connector_fault`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from typing_extensions import Self

from rmq_spark.broker.connector.codec import dump_json, load_json

__all__ = [
    "ABORT_BATCH",
    "COMMIT_BATCH",
    "COMMIT_OFFSETS",
    "ERROR_METADATA_KEY",
    "INFO",
    "METHODS",
    "OFFSETS",
    "OFFSETS_FOR_TIMES",
    "PING",
    "QUERY_OFFSETS",
    "READ_ARROW",
    "SEND",
    "SERVICE",
    "SINK_STATUS",
    "TOPICS",
    "AbortBatchResponse",
    "CommitBatchResponse",
    "CommitOffsetsRequest",
    "Document",
    "Empty",
    "InfoResponse",
    "Method",
    "OffsetsForTimesRequest",
    "OffsetsForTimesResponse",
    "OffsetsRequest",
    "OffsetsResponse",
    "PingResponse",
    "QueryOffsetsRequest",
    "QueryOffsetsResponse",
    "ReadArrowRequest",
    "SendHeader",
    "SendResponse",
    "SinkBatchRequest",
    "SinkStatusRequest",
    "SinkStatusResponse",
    "TopicsResponse",
]

SERVICE = "rmq_spark.internal.Connector"
ERROR_METADATA_KEY = "rmq-error"

D = TypeVar("D", bound="Document")
Offsets = dict[str, dict[str, int]]  # {topic: {queueId as text: offset}}


class Document:
    """A JSON object of the protocol: the dataclass's fields, in their order.  A class whose
    ``OMIT_NONE`` is true leaves unset (``None``) fields out of the object."""

    OMIT_NONE: ClassVar[bool] = False

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]
        if self.OMIT_NONE:
            out = {k: v for k, v in out.items() if v is not None}
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        return cls(**{f.name: doc[f.name] for f in fields(cls) if f.name in doc})  # type: ignore[arg-type]

    def encode(self) -> bytes:
        return dump_json(self.to_json())

    @classmethod
    def decode(cls, data: bytes) -> Self:
        return cls.from_json(load_json(data))


@dataclass
class Empty(Document):
    """``{}``: the request of the metadata calls, the answer of CommitOffsets."""


@dataclass
class PingResponse(Document):
    pid: int


@dataclass
class InfoResponse(Document):
    version: int
    store_root: str
    host: str
    pid: int
    broker_name: str
    delay_levels_ms: list[int]
    commitlog_segment_bytes: int
    cq_segment_units: int
    transactions: bool  # the broker runs the transaction service: transactional sinks work


@dataclass
class TopicsResponse(Document):
    topics: dict[str, int]  # producer-visible topics and their read queue counts


@dataclass
class OffsetsRequest(Document):
    topics: list[str] = field(default_factory=list)


@dataclass
class OffsetsResponse(Document):
    max: Offsets
    min: Offsets


@dataclass
class OffsetsForTimesRequest(Document):
    queues: dict[str, list[int]] = field(default_factory=dict)
    timestamp_ms: int = field(kw_only=True)


@dataclass
class OffsetsForTimesResponse(Document):
    """The answer is the topic map itself: ``{topic: {queueId: offset}}``."""

    offsets: Offsets

    def to_json(self) -> dict[str, Any]:
        return self.offsets

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> OffsetsForTimesResponse:
        return cls(dict(doc))


@dataclass
class ReadArrowRequest(Document):
    topic: str
    queue_id: int
    start: int
    end: int
    tags: str | None = None
    sql: str | None = None
    compression: str | None = (
        None  # none | lz4 | zstd (codec.COMPRESSIONS); a broker without it sends none
    )


@dataclass
class SendHeader(Document):
    """The header of a Send frame: ``mode`` ``normal`` (plain messages) or ``half`` (the halves of
    one sink attempt, named by query, batch and attempt)."""

    OMIT_NONE: ClassVar[bool] = True
    mode: str = "normal"
    query_id: str | None = None
    batch_id: int | None = None
    attempt: str | None = None

    def sink_attempt(self) -> tuple[str, int, str]:
        """(query id, batch id, attempt) of a half-mode send; ``KeyError`` names a missing one."""
        for name in ("query_id", "batch_id", "attempt"):
            if getattr(self, name) is None:
                raise KeyError(name)
        return str(self.query_id), int(self.batch_id), str(self.attempt)  # type: ignore[arg-type]


@dataclass
class SendResponse(Document):
    """``limits``: the broker's rules for rows and its clock (``store.validation.SendLimits``'s
    JSON), so that a writer can check a whole partition before it sends any of it; a Send of no
    rows asks for them alone."""

    OMIT_NONE: ClassVar[bool] = True
    count: int
    offsets: str  # half mode: the halves' CommitLog offsets, encoded (sink.encode_offsets)
    limits: dict[str, Any] | None = None


@dataclass
class SinkBatchRequest(Document):
    """CommitBatch / AbortBatch: one sink attempt and the offsets its Send answers gave."""

    query_id: str
    batch_id: int
    attempt: str
    offsets: list[str] = field(default_factory=list)


@dataclass
class CommitBatchResponse(Document):
    outcome: str  # COMMITTED | ALREADY_COMMITTED
    attempt: str  # the attempt whose halves are the batch


@dataclass
class AbortBatchResponse(Document):
    rolled_back: int


@dataclass
class CommitOffsetsRequest(Document):
    group: str
    offsets: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


@dataclass
class QueryOffsetsRequest(Document):
    group: str
    topics: list[str] = field(default_factory=list)


@dataclass
class QueryOffsetsResponse(Document):
    offsets: Offsets


@dataclass
class SinkStatusRequest(Document):
    query_id: str


@dataclass
class SinkStatusResponse(Document):
    batches: dict[str, str]  # committed batch id -> its attempt


@dataclass(frozen=True)
class Method:
    """One RPC of the service.  ``frame``: the request is a frame with ``request`` as its header;
    ``response`` ``None``: the answer is a stream of Arrow IPC chunks."""

    name: str
    request: type[Document]
    response: type[Document] | None
    frame: bool = False

    @property
    def path(self) -> str:
        return f"/{SERVICE}/{self.name}"


PING = Method("Ping", Empty, PingResponse)
INFO = Method("Info", Empty, InfoResponse)
TOPICS = Method("Topics", Empty, TopicsResponse)
OFFSETS = Method("Offsets", OffsetsRequest, OffsetsResponse)
OFFSETS_FOR_TIMES = Method("OffsetsForTimes", OffsetsForTimesRequest, OffsetsForTimesResponse)
READ_ARROW = Method("ReadArrow", ReadArrowRequest, None)
SEND = Method("Send", SendHeader, SendResponse, frame=True)
COMMIT_BATCH = Method("CommitBatch", SinkBatchRequest, CommitBatchResponse)
ABORT_BATCH = Method("AbortBatch", SinkBatchRequest, AbortBatchResponse)
COMMIT_OFFSETS = Method("CommitOffsets", CommitOffsetsRequest, Empty)
QUERY_OFFSETS = Method("QueryOffsets", QueryOffsetsRequest, QueryOffsetsResponse)
SINK_STATUS = Method("SinkStatus", SinkStatusRequest, SinkStatusResponse)

METHODS: tuple[Method, ...] = (
    PING, INFO, TOPICS, OFFSETS, OFFSETS_FOR_TIMES, READ_ARROW, SEND,
    COMMIT_BATCH, ABORT_BATCH, COMMIT_OFFSETS, QUERY_OFFSETS, SINK_STATUS,
)  # fmt: skip
