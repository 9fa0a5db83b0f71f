"""The private connector service: what the Spark data source asks a broker for.

``make_internal_handler(core)`` returns a ``grpc.GenericRpcHandler`` for service
``rmq_spark.internal.Connector`` that the broker mounts on its gRPC server next to RocketMQ's
``MessagingService``.  The methods and their documents are defined in
:mod:`rmq_spark.broker.connector.protocol`; a fault becomes a gRPC status (and the ``rmq-error``
trailer) through the broker's one status table, :func:`rmq_spark.broker.codes.connector_fault`.

Access: every call passes the broker's access seam (:mod:`rmq_spark.broker.access`) with the rule
:data:`ACCESS_RULES` gives its method, as the RocketMQ service's calls do: reads need SUB on their
topics (system topics: admin accounts only), ``Send`` PUB on every row's topic (never a system,
retry or dead-letter topic), the consumer offset calls SUB on the group and its topics.  ``Info``
and ``Ping`` tell the store path, host and pid to admin accounts only; ``Topics`` lists the topics
the caller has a permission on.  ``CommitBatch`` / ``AbortBatch`` end only the sink's halves of
the attempt they name (sent by a ``Send`` that needed PUB on their topics).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from rmq_spark import errors as E
from rmq_spark.access.auth import Perm
from rmq_spark.broker import codes
from rmq_spark.broker.access import (
    AUTHENTICATED,
    Need,
    ServiceAccess,
    Use,
    caller,
    group_name,
    topic_name,
)
from rmq_spark.broker.connector import codec
from rmq_spark.broker.connector import protocol as P
from rmq_spark.broker.connector.readers import ReadWorkers, wire_chunks
from rmq_spark.broker.connector.sink import SinkService
from rmq_spark.store import layout as L


def _abort(context: grpc.ServicerContext, exc: BaseException) -> None:
    """End the call with the fault's status.  A threaded server's ``abort`` raises; the broker's
    ``grpc.aio`` server, running these handlers on its worker threads, has sent the status when
    it returns: the handler then returns, and the server ends the call as aborted."""
    code, error_name, detail = codes.connector_fault(exc)
    if error_name:
        context.set_trailing_metadata(((P.ERROR_METADATA_KEY, error_name),))
    context.abort(code, detail)


class ConnectorService:
    """The methods, on a :class:`rmq_spark.services.core.BrokerCore`."""

    def __init__(self, core, read_workers: int = 0) -> None:  # type: ignore[no-untyped-def]
        self.core = core
        self.store = core.store
        self.sink = SinkService(core)
        self.readers = ReadWorkers(self.store.root, read_workers) if read_workers > 0 else None

    # --- metadata -----------------------------------------------------------------------------------------
    def access(self) -> ServiceAccess:
        """This service's side of the access seam: a refusal aborts with the fault's gRPC status."""
        return ServiceAccess(P.SERVICE, ACCESS_RULES, _refuse, _decode)

    def ping(self, _req: P.Empty) -> P.PingResponse:
        return P.PingResponse(pid=os.getpid() if caller().admin else 0)

    def info(self, _req: P.Empty) -> P.InfoResponse:
        """The store path, host and pid are told to admin accounts only (empty / 0 otherwise)."""
        cfg = self.store.config
        admin = caller().admin
        return P.InfoResponse(
            version=1,
            store_root=self.store.root if admin else "",
            host=socket.gethostname() if admin else "",
            pid=os.getpid() if admin else 0,
            broker_name=getattr(self.core.config, "broker_name", ""),
            delay_levels_ms=list(self.core.config.delay_levels_ms),
            commitlog_segment_bytes=cfg.commitlog_segment_bytes,
            cq_segment_units=cfg.cq_segment_units,
            transactions=self.sink.transactions_available,
        )

    def topics(self, _req: P.Empty) -> P.TopicsResponse:
        """Producer-visible topics the caller has a permission on."""
        out: dict[str, int] = {}
        for name, cfg in list(self.store.topics.topics.items()):
            if not _user_topic(name):
                continue
            out[name] = max(cfg.read_queue_nums, cfg.write_queue_nums)
        for t, q in self.store.queue_keys():
            if _user_topic(t):
                out[t] = max(out.get(t, 0), q + 1)
        who = caller()
        return P.TopicsResponse(topics={t: n for t, n in sorted(out.items()) if who.may(t)})

    def offsets(self, req: P.OffsetsRequest) -> P.OffsetsResponse:
        topics = [str(t) for t in req.topics]
        self.sink.wait_visible()  # the batches the sink committed before this are in the snapshot
        snap = self.store.max_offsets_snapshot(topics)  # one atomic snapshot under publish_lock
        max_out: dict[str, dict[str, int]] = {}
        min_out: dict[str, dict[str, int]] = {}
        for t in topics:
            qs = snap.get(t, {})
            max_out[t] = {str(q): int(o) for q, o in sorted(qs.items())}
            min_out[t] = {str(q): int(self.store.min_offset(t, q)) for q in sorted(qs)}
        return P.OffsetsResponse(max=max_out, min=min_out)

    def offsets_for_times(self, req: P.OffsetsForTimesRequest) -> P.OffsetsForTimesResponse:
        ts = int(req.timestamp_ms)
        out: dict[str, dict[str, int]] = {}
        for t, qs in req.queues.items():
            out[t] = {str(q): int(self.store.offset_by_time(t, int(q), ts)) for q in qs}
        return P.OffsetsForTimesResponse(out)

    # --- reads -----------------------------------------------------------------------------------------------
    def read_arrow(self, req: P.ReadArrowRequest) -> Iterator[bytes]:
        """The rows of one queue range as Arrow IPC messages, decoded by a read worker process
        when one is free (:mod:`rmq_spark.broker.connector.readers`), else here."""
        from rmq_spark.filter.options import make_filters

        topic, qid = str(req.topic), int(req.queue_id)
        start, end = int(req.start), int(req.end)
        if req.compression not in (None, *codec.COMPRESSIONS):
            raise E.ConfigError(
                f"compression must be one of {', '.join(codec.COMPRESSIONS)}, not {req.compression!r}"
            )
        tag_filter, sql_filter = make_filters(req.tags, req.sql)
        hi = self.store.max_offset(topic, qid)
        if end > hi:
            raise E.StoreError(f"queue {topic}/{qid} holds offsets up to {hi}, asked for {end}")
        if start >= end:
            return
        job = {"topic": topic, "queue_id": qid, "start": start, "end": end, "tags": req.tags, "sql": req.sql,
               "compression": req.compression, "force_prop_crc": self.store.commitlog.force_prop_crc}  # fmt: skip

        def here() -> Iterator[bytes]:
            def read(a: int, b: int, **bounds: Any) -> Any:
                return self.store.read_arrow(
                    topic, qid, a, b, tag_filter=tag_filter, sql_filter=sql_filter, **bounds
                )

            return wire_chunks(read, start, end, req.compression)

        yield from (here() if self.readers is None else self.readers.chunks(job, here))

    # --- consumer offsets ------------------------------------------------------------------------------------
    def commit_offsets(self, req: P.CommitOffsetsRequest) -> P.Empty:
        group = group_name(req.group)
        offsets = {
            topic_name(t, Use.READ): {int(q): int(o) for q, o in qs.items()}
            for t, qs in req.offsets.items()
        }
        self.store.offsets.commit_many(group, offsets, persist=True)
        return P.Empty()

    def query_offsets(self, req: P.QueryOffsetsRequest) -> P.QueryOffsetsResponse:
        group = group_name(req.group)
        out = {}
        for t in req.topics:
            out[t] = {
                str(q): o for q, o in sorted(self.store.offsets.query_topic(group, t).items())
            }
        return P.QueryOffsetsResponse(offsets=out)

    # --- the sink -----------------------------------------------------------------------------------------------
    def send(self, header: P.SendHeader, table: Any) -> P.SendResponse:
        return self.sink.send(header, table)

    def commit_batch(self, req: P.SinkBatchRequest) -> P.CommitBatchResponse:
        return self.sink.commit_batch(
            str(req.query_id), int(req.batch_id), str(req.attempt), req.offsets
        )

    def abort_batch(self, req: P.SinkBatchRequest) -> P.AbortBatchResponse:
        return self.sink.abort_batch(
            str(req.query_id), int(req.batch_id), str(req.attempt), req.offsets
        )

    def close(self) -> None:
        """The broker stops: the sink's queued group commits are finished first; the read
        workers are stopped."""
        self.sink.close()
        if self.readers is not None:
            self.readers.close()

    def sink_status(self, req: P.SinkStatusRequest) -> P.SinkStatusResponse:
        batches = self.sink.commits.batches(str(req.query_id))
        return P.SinkStatusResponse(batches={str(b): a for b, a in sorted(batches.items())})


_SYSTEM_PREFIXES = (L.RETRY_GROUP_TOPIC_PREFIX, L.DLQ_GROUP_TOPIC_PREFIX)
_TOPIC_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")


def _user_topic(name: str) -> bool:
    return (
        not L.is_system_topic(name)
        and not name.startswith(_SYSTEM_PREFIXES)
        and bool(_TOPIC_NAME.match(name))
    )


def _unary(method: P.Method, fn: Callable[..., P.Document]) -> grpc.RpcMethodHandler[bytes, bytes]:
    if method.frame:

        def call(request: bytes) -> P.Document:
            frame = codec.load_frame(request)
            return fn(method.request.from_json(frame.header), frame.table)
    else:

        def call(request: bytes) -> P.Document:
            return fn(method.request.decode(request))

    def handler(request: bytes, context: grpc.ServicerContext) -> bytes | None:
        try:
            return call(request).encode()
        except Exception as exc:  # noqa: BLE001 - translated to a status code at this seam
            _abort(context, exc)
            return None  # the call is aborted (see _abort)

    return grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=codec.identity, response_serializer=codec.identity
    )


def _stream(
    method: P.Method, fn: Callable[[Any], Iterator[bytes]]
) -> grpc.RpcMethodHandler[bytes, bytes]:
    def handler(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        try:
            yield from fn(method.request.decode(request))
        except Exception as exc:  # noqa: BLE001 - translated to a status at this seam (_abort)
            _abort(context, exc)

    return grpc.unary_stream_rpc_method_handler(
        handler, request_deserializer=codec.identity, response_serializer=codec.identity
    )


# --- access: what each method needs (read by rmq_spark.broker.access before the handler runs) -------
_BY_NAME = {m.name: m for m in P.METHODS}


def _decode(method: str, request: bytes) -> Any:
    """What the rules read: the request document (a Send: its header and its rows)."""
    m = _BY_NAME[method]
    if m.frame:
        frame = codec.load_frame(request)
        return m.request.from_json(frame.header), frame.table
    return m.request.decode(request)


def _refuse(_method: str, exc: BaseException, context: grpc.ServicerContext) -> list[Any]:
    _abort(context, exc)
    return []  # the call is aborted: no answer (see _abort)


def _read(topics: Any) -> Need:
    """Reading ``topics`` (SUB); system topics pass the name check, authorization keeps them
    for admin accounts."""
    return Need(
        topics=tuple(
            (topic_name(t, Use.READ, system_reads=True), Perm.SUB) for t in dict.fromkeys(topics)
        )
    )


def _offsets_need(group: Any, topics: Any) -> Need:
    return Need(
        topics=tuple((topic_name(t, Use.READ), Perm.SUB) for t in dict.fromkeys(topics)),
        groups=(group_name(group),),
    )


def _send_need(request: tuple[P.SendHeader, Any]) -> Need:
    import pyarrow.compute as pc

    _header, table = request
    if table is None or table.num_rows == 0 or "topic" not in table.column_names:
        return AUTHENTICATED  # nothing to store (no topic: the handler names the fault)
    names = [t for t in pc.unique(table.column("topic")).to_pylist() if t is not None]
    return Need(topics=tuple((topic_name(t, Use.WRITE), Perm.PUB) for t in names))


ACCESS_RULES: dict[str, Any] = {
    P.PING.name: lambda r: AUTHENTICATED,  # the pid to admin accounts only
    P.INFO.name: lambda r: AUTHENTICATED,  # store path, host and pid to admin accounts only
    P.TOPICS.name: lambda r: AUTHENTICATED,  # the topics the caller may use
    P.OFFSETS.name: lambda r: _read(r.topics),
    P.OFFSETS_FOR_TIMES.name: lambda r: _read(r.queues),
    P.READ_ARROW.name: lambda r: _read([r.topic]),
    P.SEND.name: _send_need,
    P.COMMIT_BATCH.name: lambda r: AUTHENTICATED,  # the halves of the named attempt only
    P.ABORT_BATCH.name: lambda r: AUTHENTICATED,
    P.COMMIT_OFFSETS.name: lambda r: _offsets_need(r.group, r.offsets),
    P.QUERY_OFFSETS.name: lambda r: _offsets_need(r.group, r.topics),
    P.SINK_STATUS.name: lambda r: AUTHENTICATED,
}


def make_internal_handler(core: Any, read_workers: int = 0) -> Any:
    """The generic handler the broker adds with ``server.add_generic_rpc_handlers((h,))``;
    ``read_workers``: processes that decode ReadArrow (0: the broker's own).  A
    ``grpc.GenericRpcHandler`` that also carries ``.connector``, its :class:`ConnectorService`."""
    svc = ConnectorService(core, read_workers)
    served: dict[P.Method, Callable[..., Any]] = {
        P.PING: svc.ping,
        P.INFO: svc.info,
        P.TOPICS: svc.topics,
        P.OFFSETS: svc.offsets,
        P.OFFSETS_FOR_TIMES: svc.offsets_for_times,
        P.READ_ARROW: svc.read_arrow,
        P.SEND: svc.send,
        P.COMMIT_BATCH: svc.commit_batch,
        P.ABORT_BATCH: svc.abort_batch,
        P.COMMIT_OFFSETS: svc.commit_offsets,
        P.QUERY_OFFSETS: svc.query_offsets,
        P.SINK_STATUS: svc.sink_status,
    }
    assert set(served) == set(P.METHODS), "every method of the protocol is served"
    assert set(ACCESS_RULES) == {m.name for m in P.METHODS}, (
        "every method of the protocol has an access rule"
    )
    methods = {
        m.name: (_stream(m, fn) if m.response is None else _unary(m, fn))
        for m, fn in served.items()
    }
    handler = grpc.method_handlers_generic_handler(P.SERVICE, methods)
    handler.connector = svc  # type: ignore[attr-defined]  # tests reach the service through it
    return handler
