"""Client of the private connector service (``rmq_spark.internal.Connector``).

Picklable: the gRPC channel is opened lazily and dropped when the client is pickled, so a client
can sit in a Spark reader, writer or InputPartition.  Faults come back as the RmqError classes
the server raised (named in the ``rmq-error`` trailer); an unreachable broker is
:class:`BrokerUnavailableError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import grpc
import pyarrow as pa

from rmq_spark import errors as E
from rmq_spark.broker.connector import codec
from rmq_spark.broker.connector.codec import Frame

SERVICE = "rmq_spark.internal.Connector"
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
    for key, value in (err.trailing_metadata() or ()) if hasattr(err, "trailing_metadata") else ():
        if key == codec.ERROR_METADATA_KEY:
            cls_name = value
    if cls_name:
        cls = getattr(E, cls_name, None)
        if cls is None:
            cls = {"BrokerUnavailableError": BrokerUnavailableError}.get(cls_name, E.RmqError)
        raise cls(details) from None
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        raise BrokerUnavailableError(f"broker at {endpoint} is not reachable ({method}): {details}") from None
    if code == grpc.StatusCode.UNIMPLEMENTED:
        raise ServiceMissingError(
            f"broker at {endpoint} does not serve {SERVICE}/{method}; is it an rmq_spark broker?"
        ) from None
    raise E.StoreError(f"{method} at {endpoint} failed: {code}: {details}") from None


class InternalClient:
    def __init__(self, endpoint: str, timeout_s: float = 120.0) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._channel: grpc.Channel | None = None
        self._stubs: dict[str, Any] = {}

    # --- pickling and lifecycle ---------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "timeout_s": self.timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["endpoint"], state["timeout_s"])  # type: ignore[misc]

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stubs.clear()

    def __enter__(self) -> InternalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stub(self, method: str, stream: bool = False) -> Any:
        stub = self._stubs.get(method)
        if stub is None:
            if self._channel is None:
                self._channel = grpc.insecure_channel(self.endpoint, options=CHANNEL_OPTIONS)
            path = f"/{SERVICE}/{method}"
            make = self._channel.unary_stream if stream else self._channel.unary_unary
            stub = make(path, request_serializer=codec.identity, response_deserializer=codec.identity)
            self._stubs[method] = stub
        return stub

    def _call(self, method: str, request: bytes, timeout_s: float | None = None) -> bytes:
        try:
            return self._stub(method)(request, timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as err:
            _raise_from(self.endpoint, method, err)
            raise  # unreachable

    def _json(self, method: str, request: Mapping[str, Any] | None = None, timeout_s: float | None = None) -> Any:
        return codec.load_json(self._call(method, codec.dump_json(dict(request or {})), timeout_s))

    # --- calls ---------------------------------------------------------------------------------------
    def ping(self, timeout_s: float = 5.0) -> dict[str, Any]:
        return self._json("Ping", {}, timeout_s)

    def info(self) -> dict[str, Any]:
        return self._json("Info")

    def topics(self) -> dict[str, int]:
        """Producer-visible topics and their read queue counts."""
        return self._json("Topics")["topics"]

    def offsets(self, topics: list[str]) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
        """(max offsets from one atomic snapshot, min offsets) of every queue of ``topics``."""
        r = self._json("Offsets", {"topics": topics})
        return r["max"], r["min"]

    def offsets_for_times(self, queues: Mapping[str, list[int]], timestamp_ms: int) -> dict[str, dict[str, int]]:
        return self._json("OffsetsForTimes", {"queues": {t: list(q) for t, q in queues.items()}, "timestamp_ms": timestamp_ms})

    def read_arrow(
        self, topic: str, queue_id: int, start: int, end: int, tags: str | None = None, sql: str | None = None
    ) -> Iterator[pa.RecordBatch]:
        req = codec.dump_json({"topic": topic, "queue_id": queue_id, "start": start, "end": end, "tags": tags, "sql": sql})
        try:
            for chunk in self._stub("ReadArrow", stream=True)(req, timeout=self.timeout_s):
                yield codec.load_batch(chunk)
        except grpc.RpcError as err:
            _raise_from(self.endpoint, "ReadArrow", err)

    def send(self, table: pa.Table, header: Mapping[str, Any]) -> dict[str, Any]:
        data = codec.dump_frame(Frame(dict(header), table))
        return codec.load_json(self._call("Send", data))

    def commit_batch(self, query_id: str, batch_id: int, attempt: str, offsets: list[str]) -> dict[str, Any]:
        """Commit the halves of one sink attempt (``offsets``: the ``Send`` answers' encoded
        half offsets); ``{"outcome": COMMITTED | ALREADY_COMMITTED, "attempt"}``."""
        return self._json(
            "CommitBatch", {"query_id": query_id, "batch_id": batch_id, "attempt": attempt, "offsets": offsets}
        )

    def abort_batch(self, query_id: str, batch_id: int, attempt: str, offsets: list[str]) -> dict[str, Any]:
        """Roll back the halves of one sink attempt; it can never commit afterwards."""
        return self._json(
            "AbortBatch", {"query_id": query_id, "batch_id": batch_id, "attempt": attempt, "offsets": offsets}
        )

    def commit_offsets(self, group: str, offsets: Mapping[str, Mapping[str, int]]) -> None:
        self._json("CommitOffsets", {"group": group, "offsets": offsets})

    def query_offsets(self, group: str, topics: list[str]) -> dict[str, dict[str, int]]:
        return self._json("QueryOffsets", {"group": group, "topics": topics})["offsets"]

    def sink_status(self, query_id: str) -> dict[str, Any]:
        """Committed batches of a sink query (tests and tools)."""
        return self._json("SinkStatus", {"query_id": query_id})
