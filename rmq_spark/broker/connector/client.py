"""Client of the private connector service (``rmq_spark.internal.Connector``).

Picklable: the gRPC channel is opened lazily and dropped when the client is pickled, so a client
can sit in a Spark reader, writer or InputPartition.  Given an access key and secret, every call is
signed as the RocketMQ clients sign theirs (a broker with ``--acl`` checks the connector's calls as
it checks RocketMQ's).  Faults come back as the RmqError classes
the server raised (named in the ``rmq-error`` trailer); an unreachable broker is
:class:`BrokerUnavailableError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import grpc
import pyarrow as pa

from rmq_spark import errors as E
from rmq_spark.access.auth import signed_headers
from rmq_spark.broker.connector import codec
from rmq_spark.broker.connector import protocol as P
from rmq_spark.broker.connector.codec import Frame
from rmq_spark.broker.connector.protocol import SERVICE

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "CHANNEL_OPTIONS",
    "SERVICE",
    "BrokerUnavailableError",
    "InternalClient",
    "ServiceMissingError",
]

MAX_MESSAGE_BYTES = 512 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


class BrokerUnavailableError(E.StoreError):
    """No broker answers at the endpoint (not started, exited, or unreachable)."""


class ServiceMissingError(E.StoreError):
    """The endpoint answers but does not serve the private connector service."""


def _raise_from(endpoint: str, method: str, err: grpc.RpcError) -> None:
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else str(err)
    cls_name = None
    # (key, value) pairs, as grpc gives them
    trailing: Any = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == P.ERROR_METADATA_KEY:
            cls_name = value
    if cls_name:
        cls: type[Exception] | None = getattr(E, cls_name, None)
        if cls is None:
            cls = {"BrokerUnavailableError": BrokerUnavailableError}.get(cls_name, E.RmqError)
        raise cls(details) from None
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        raise BrokerUnavailableError(
            f"broker at {endpoint} is not reachable ({method}): {details}"
        ) from None
    if code == grpc.StatusCode.UNIMPLEMENTED:
        raise ServiceMissingError(
            f"broker at {endpoint} does not serve {SERVICE}/{method}; is it an rmq_spark broker?"
        ) from None
    raise E.StoreError(f"{method} at {endpoint} failed: {code}: {details}") from None


class InternalClient:
    def __init__(
        self,
        endpoint: str,
        timeout_s: float = 120.0,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.access_key = access_key
        self._secret_key = secret_key
        self._channel: grpc.Channel | None = None
        self._stubs: dict[str, Any] = {}

    def _metadata(self) -> list[tuple[str, str]] | None:
        """The signature headers of one call (a fresh date each time), or none without a key."""
        if not self.access_key:
            return None
        return signed_headers(self.access_key, self._secret_key or "")

    # --- pickling and lifecycle ---------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "timeout_s": self.timeout_s,
            "access_key": self.access_key,
            "secret_key": self._secret_key,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        keys = state.get("access_key"), state.get("secret_key")
        self.__init__(state["endpoint"], state["timeout_s"], *keys)  # type: ignore[misc]

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stubs.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stub(self, method: P.Method) -> Any:
        stub = self._stubs.get(method.name)
        if stub is None:
            if self._channel is None:
                self._channel = grpc.insecure_channel(self.endpoint, options=CHANNEL_OPTIONS)
            make = (
                self._channel.unary_stream if method.response is None else self._channel.unary_unary
            )
            stub = make(
                method.path, request_serializer=codec.identity, response_deserializer=codec.identity
            )
            self._stubs[method.name] = stub
        return stub

    def _call(
        self, method: P.Method, request: bytes, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """One unary call; the answer as its JSON object (the documents' shape, for callers)."""
        assert method.response is not None
        try:
            data = self._stub(method)(
                request, timeout=timeout_s or self.timeout_s, metadata=self._metadata()
            )
        except grpc.RpcError as err:
            _raise_from(self.endpoint, method.name, err)
            raise  # unreachable
        return method.response.decode(data).to_json()

    # --- calls ---------------------------------------------------------------------------------------
    def ping(self, timeout_s: float = 5.0) -> dict[str, Any]:
        return self._call(P.PING, P.Empty().encode(), timeout_s)

    def info(self) -> dict[str, Any]:
        """:class:`~rmq_spark.broker.connector.protocol.InfoResponse`'s fields."""
        return self._call(P.INFO, P.Empty().encode())

    def topics(self) -> dict[str, int]:
        """Producer-visible topics and their read queue counts."""
        return P.TopicsResponse.from_json(self._call(P.TOPICS, P.Empty().encode())).topics

    def offsets(
        self, topics: list[str]
    ) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
        """(max offsets from one atomic snapshot, min offsets) of every queue of ``topics``."""
        r = P.OffsetsResponse.from_json(
            self._call(P.OFFSETS, P.OffsetsRequest(topics=topics).encode())
        )
        return r.max, r.min

    def offsets_for_times(
        self, queues: Mapping[str, list[int]], timestamp_ms: int
    ) -> dict[str, dict[str, int]]:
        req = P.OffsetsForTimesRequest(
            queues={t: list(q) for t, q in queues.items()}, timestamp_ms=timestamp_ms
        )
        return self._call(P.OFFSETS_FOR_TIMES, req.encode())

    def read_arrow(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        tags: str | None = None,
        sql: str | None = None,
        compression: str | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """The rows of ``[start, end)`` as record batches; ``compression`` (none, lz4, zstd): how
        the broker compresses the stream's buffers."""
        req = P.ReadArrowRequest(
            topic=topic,
            queue_id=queue_id,
            start=start,
            end=end,
            tags=tags,
            sql=sql,
            compression=compression,
        )
        try:
            for chunk in self._stub(P.READ_ARROW)(
                req.encode(), timeout=self.timeout_s, metadata=self._metadata()
            ):
                yield codec.load_batch(chunk)
        except grpc.RpcError as err:
            _raise_from(self.endpoint, P.READ_ARROW.name, err)

    def send(self, table: pa.Table, header: P.SendHeader | Mapping[str, Any]) -> dict[str, Any]:
        """Store rows (the sink's row columns); ``header``: a SendHeader or its JSON object."""
        head = header if isinstance(header, P.SendHeader) else P.SendHeader.from_json(header)
        return self._call(P.SEND, codec.dump_frame(Frame(head.to_json(), table)))

    def commit_batch(
        self, query_id: str, batch_id: int, attempt: str, offsets: list[str]
    ) -> dict[str, Any]:
        """Commit the halves of one sink attempt (``offsets``: the ``Send`` answers' encoded
        half offsets); ``{"outcome": COMMITTED | ALREADY_COMMITTED, "attempt"}``."""
        req = P.SinkBatchRequest(
            query_id=query_id, batch_id=batch_id, attempt=attempt, offsets=offsets
        )
        return self._call(P.COMMIT_BATCH, req.encode())

    def abort_batch(
        self, query_id: str, batch_id: int, attempt: str, offsets: list[str]
    ) -> dict[str, Any]:
        """Roll back the halves of one sink attempt; it can never commit afterwards."""
        req = P.SinkBatchRequest(
            query_id=query_id, batch_id=batch_id, attempt=attempt, offsets=offsets
        )
        return self._call(P.ABORT_BATCH, req.encode())

    def commit_offsets(self, group: str, offsets: Mapping[str, Mapping[str, int]]) -> None:
        self._call(P.COMMIT_OFFSETS, P.CommitOffsetsRequest(group=group, offsets=offsets).encode())

    def query_offsets(self, group: str, topics: list[str]) -> dict[str, dict[str, int]]:
        req = P.QueryOffsetsRequest(group=group, topics=topics)
        return P.QueryOffsetsResponse.from_json(self._call(P.QUERY_OFFSETS, req.encode())).offsets

    def sink_status(self, query_id: str) -> dict[str, Any]:
        """Committed batches of a sink query (tests and tools)."""
        return self._call(P.SINK_STATUS, P.SinkStatusRequest(query_id=query_id).encode())
