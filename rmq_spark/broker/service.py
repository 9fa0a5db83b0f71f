"""``apache.rocketmq.v2.MessagingService`` over a :class:`rmq_spark.services.core.BrokerCore`.

Every call first passes the broker's access seam (:mod:`rmq_spark.broker.access`): it is
authenticated when an ACL is loaded, the topics and groups it names are validated and authorized
by the method's rule in :data:`ACCESS_RULES`.  Then the handler validates the rest of its request,
does its work and answers with a RocketMQ status; nothing escapes as a gRPC error (:mod:`rmq_spark.broker.handler`
wraps each one: a fault becomes a status through :mod:`rmq_spark.broker.codes`).  Sending and
transactions: :mod:`rmq_spark.broker.producer`; receive/ack: :mod:`rmq_spark.broker.pop`; clients
and Telemetry: :mod:`rmq_spark.broker.telemetry`.

Telemetry, ReceiveMessage and PullMessage are served on the server's event loop (their waiting
holds no thread; their store work runs on the worker threads through :meth:`MessagingService.run`),
the other methods on the worker threads (:mod:`rmq_spark.broker.server`).

The offset RPCs (PullMessage, GetOffset, QueryOffset, UpdateOffset), which Apache's proxy does not
implement, follow the proto: a pull streams ``status``, the messages from ``offset`` and
``next_offset``; GetOffset/UpdateOffset read and write the group's committed offset
(``consumerOffset.json``), shared with pop consumption as in RocketMQ.

Why this module is long: one method per MessagingService RPC of the proto, each thin (the work is
in producer, pop and telemetry), read together as the gRPC front.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

import grpc
from rocketmq.grpc_protocol import definition_pb2 as D
from rocketmq.grpc_protocol import service_pb2 as S
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceServicer

from rmq_spark.access.auth import Perm
from rmq_spark.broker import codes, polling
from rmq_spark.broker.access import AUTHENTICATED, Need, ServiceAccess, Use, group_name, topic_name
from rmq_spark.broker.codes import Code, RpcStatusError
from rmq_spark.broker.handler import Activity, astreaming, now_response, unary
from rmq_spark.broker.messages import timestamp_ms
from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.pop import PopConfig, PopService
from rmq_spark.broker.producer import ProducerPath
from rmq_spark.broker.telemetry import ClientRegistry, SettingsPolicy, serve_telemetry
from rmq_spark.errors import ConfigError
from rmq_spark.filter import make_filter
from rmq_spark.store.config import TopicConfig

__all__ = ["ACCESS_RULES", "SERVICE", "MessagingService"]

SERVICE = "apache.rocketmq.v2.MessagingService"

CLIENT_ID = "x-mq-client-id"
ALL_TYPES = (
    D.MessageType.NORMAL,
    D.MessageType.FIFO,
    D.MessageType.DELAY,
    D.MessageType.TRANSACTION,
)
_TYPE_OF = {
    "NORMAL": D.MessageType.NORMAL,
    "FIFO": D.MessageType.FIFO,
    "DELAY": D.MessageType.DELAY,
    "TRANSACTION": D.MessageType.TRANSACTION,
}
_BROKER_MANAGED = ("%RETRY%", "%DLQ%")  # retry and dead-letter topics: never created by a client
_DEADLINE_MARGIN_S = 0.3  # answer a long poll this long before the client's deadline
T = TypeVar("T")


def _peer_host(context: grpc.ServicerContext) -> str:
    peer = context.peer() or ""
    _kind, _, rest = peer.partition(":")
    host = rest.rpartition(":")[0].strip("[]")
    return host or "127.0.0.1"


class MessagingService(MessagingServiceServicer):
    def __init__(self, core: Any, options: BrokerOptions, endpoint: tuple[str, int]) -> None:
        self.core = core
        self.store = core.store
        self.clock = core.clock
        self.options = options
        self.broker_name = core.config.broker_name
        self.activity = Activity()
        self.set_endpoint(*endpoint)
        self.clients = ClientRegistry()
        self.pop = PopService(
            self.store,
            PopConfig(
                max_delivery_attempts=options.max_delivery_attempts,
                auto_renew_invisible_ms=options.auto_renew_invisible_ms,
            ),
            self.clock,
            is_client_alive=self.clients.alive,
        )
        self.policy = SettingsPolicy(
            max_body_size=self.store.config.body_max_bytes,
            max_delivery_attempts=options.max_delivery_attempts,
            retry_backoff_ms=list(core.config.delay_levels_ms),
            long_polling_timeout_ms=options.long_polling_max_ms,
        )
        self.producer = ProducerPath(core, self.clients, cluster=options.cluster_name)
        self.executor: Executor | None = (
            None  # the server's worker threads (None: a thread per call)
        )

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a worker thread: what a handler served on the event loop does with the
        store, which blocks."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def set_endpoint(self, host: str, port: int) -> None:
        """Where clients reach this broker (used when a request does not say)."""
        ep = D.Endpoints()
        h = host.strip("[]")
        if h in ("", "0.0.0.0", "::"):
            h = "127.0.0.1"
        ep.scheme = (
            D.AddressScheme.IPv6
            if ":" in h
            else (
                D.AddressScheme.IPv4
                if h.replace(".", "").isdigit()
                else D.AddressScheme.DOMAIN_NAME
            )
        )
        ep.addresses.add(host=h, port=port)
        self.endpoints = ep

    def start(self) -> None:
        self.pop.start()
        self.producer.start()

    def close(self) -> None:
        """Stop serving streams: long polls return, Telemetry streams end."""
        self.pop.close()
        self.clients.close_all()

    def shutdown(self) -> None:
        self.close()
        self.producer.shutdown()
        self.pop.shutdown()

    # --- common checks ----------------------------------------------------------------------------
    def _meta(self, context: grpc.ServicerContext) -> dict[str, str]:
        """The request's client id header (searched from the end, where the official clients put
        it: the headers are the gRPC threads' fresh objects, each one costly to touch).  Access was
        checked before the handler ran (:mod:`rmq_spark.broker.access`)."""
        for key, value in reversed(
            context.invocation_metadata() or ()
        ):  # the last one wins, as in a dict
            if key == CLIENT_ID:
                if value:  # text: a header not ending in -bin
                    return {CLIENT_ID: value if isinstance(value, str) else value.decode()}
                break
        raise RpcStatusError(Code.CLIENT_ID_REQUIRED, "the x-mq-client-id header is required")

    def access(self) -> ServiceAccess:
        """This service's side of the access seam: its rules, and a refusal answered as a status."""
        return ServiceAccess(SERVICE, ACCESS_RULES, self._refusal)

    def _refusal(
        self, method: str, exc: BaseException, _context: grpc.ServicerContext
    ) -> list[Any]:
        out = [_RESPONSES[method](status=codes.status_of(exc))]
        if method == "ReceiveMessage":  # a receive always ends with the broker's clock
            out.append(now_response(self))
        return out

    def _topic(self, name: str, create: bool = False) -> TopicConfig:
        cfg = self.store.topics.get(name)
        if (
            cfg is None and create and not name.startswith(_BROKER_MANAGED)
        ):  # the broker creates those
            try:
                cfg = self.store.topics.get_or_create(name)
            except ConfigError:
                cfg = None
        if cfg is None:
            raise RpcStatusError(
                Code.TOPIC_NOT_FOUND,
                f"CODE: 17  DESC: No topic route info in name server for the topic: {name}",
            )
        return cfg

    def _queue_of(self, mq: D.MessageQueue) -> tuple[TopicConfig, int]:
        cfg = self._topic(topic_name(mq.topic.name, Use.READ))
        if not 0 <= mq.id < max(cfg.read_queue_nums, cfg.write_queue_nums):
            raise RpcStatusError(
                Code.BAD_REQUEST, f"queue {mq.id} does not exist in topic {cfg.topic_name!r}"
            )
        return cfg, mq.id

    def _endpoints(self, requested: D.Endpoints) -> D.Endpoints:
        if requested.addresses and requested.scheme != D.AddressScheme.ADDRESS_SCHEME_UNSPECIFIED:
            return requested
        return self.endpoints

    def _message_queue(
        self, cfg: TopicConfig, qid: int, endpoints: D.Endpoints, namespace: str
    ) -> D.MessageQueue:
        readable = cfg.readable and (qid < cfg.read_queue_nums or qid < 0)
        writable = cfg.writable and (qid < cfg.write_queue_nums or qid < 0)
        perm = (
            D.Permission.READ_WRITE
            if readable and writable
            else D.Permission.READ
            if readable
            else D.Permission.WRITE
            if writable
            else D.Permission.NONE
        )
        mq = D.MessageQueue(id=qid, permission=perm)
        mq.topic.name = cfg.topic_name
        mq.topic.resource_namespace = namespace
        mq.broker.name = self.broker_name
        mq.broker.id = 0
        mq.broker.endpoints.CopyFrom(endpoints)
        mq.accept_message_types.extend(
            ALL_TYPES if cfg.message_type == "MIXED" else (_TYPE_OF[cfg.message_type],)
        )
        return mq

    def _filter(self, fe: D.FilterExpression) -> object:
        # an unknown type (a number the enum does not define) is refused, not served as TAG
        kinds = {
            D.FilterType.SQL: "SQL92",
            D.FilterType.TAG: "TAG",
            D.FilterType.FILTER_TYPE_UNSPECIFIED: "TAG",
        }
        return make_filter(kinds.get(fe.type, f"FilterType {fe.type}"), fe.expression)

    def _wait_ms(self, requested: Any, has: bool, context: grpc.ServicerContext) -> int:
        wait = requested.ToMilliseconds() if has else self.options.long_polling_max_ms
        wait = max(0, min(wait, self.options.long_polling_max_ms))
        remaining = context.time_remaining()
        if remaining is not None:
            wait = max(0, min(wait, int((remaining - _DEADLINE_MARGIN_S) * 1000)))
        return wait

    def is_fifo_group(self, group: str | None, topics: list[str]) -> bool:
        for t in topics:
            cfg = self.store.topics.get(t)
            if cfg is not None and (cfg.message_type == "FIFO" or cfg.order):
                return True
        return False

    # --- route and clients ----------------------------------------------------------------------------
    @unary(S.QueryRouteResponse)
    def QueryRoute(
        self, request: S.QueryRouteRequest, context: grpc.ServicerContext
    ) -> S.QueryRouteResponse:
        self._meta(context)
        name = topic_name(request.topic.name, Use.ROUTE)
        cfg = self._topic(name, create=True)
        eps = self._endpoints(request.endpoints)
        n = max(cfg.read_queue_nums, cfg.write_queue_nums)
        queues = [
            self._message_queue(cfg, q, eps, request.topic.resource_namespace) for q in range(n)
        ]
        return S.QueryRouteResponse(status=codes.ok(), message_queues=queues)

    @unary(S.HeartbeatResponse)
    def Heartbeat(
        self, request: S.HeartbeatRequest, context: grpc.ServicerContext
    ) -> S.HeartbeatResponse:
        meta = self._meta(context)
        group = (
            group_name(request.group.name)
            if request.HasField("group") and request.group.name
            else None
        )
        self.clients.touch(meta[CLIENT_ID], request.client_type, group)
        return S.HeartbeatResponse(status=codes.ok())

    async def Telemetry(
        self, request_iterator: AsyncIterator[S.TelemetryCommand], context: Any
    ) -> AsyncIterator[S.TelemetryCommand]:
        self.activity.begin()
        try:
            try:
                meta = self._meta(context)
            except Exception as exc:  # noqa: BLE001 - answered with the fault's status
                yield S.TelemetryCommand(status=codes.status_of(exc))
                return
            session = self.clients.touch(meta[CLIENT_ID])
            async for cmd in serve_telemetry(
                request_iterator, context, session, self.policy, self.is_fifo_group
            ):
                yield cmd
        finally:
            self.activity.end()

    @unary(S.NotifyClientTerminationResponse)
    def NotifyClientTermination(
        self, request: S.NotifyClientTerminationRequest, context: grpc.ServicerContext
    ) -> S.NotifyClientTerminationResponse:
        cid = self._meta(context)[CLIENT_ID]
        self.pop.release_client(cid)
        self.clients.remove(cid)  # its Telemetry stream ends when the client closes its channel
        return S.NotifyClientTerminationResponse(status=codes.ok())

    # --- producing ------------------------------------------------------------------------------------
    @unary(S.SendMessageResponse)
    def SendMessage(
        self, request: S.SendMessageRequest, context: grpc.ServicerContext
    ) -> S.SendMessageResponse:
        meta = self._meta(context)
        messages: Sequence[Any] = request.messages
        if len(messages) == 1:  # the usual request
            pm = messages[0]
            cfg = self._send_topic(pm.topic.name)
            return self.producer.send_one(pm, cfg, meta[CLIENT_ID], lambda: _peer_host(context))
        messages = list(messages)  # the messages' wrappers made once
        if not messages:
            raise RpcStatusError(
                Code.BAD_REQUEST, "a SendMessage request needs at least one message"
            )
        topics = []
        name: str | None = None
        for pm in messages:
            given = pm.topic.name
            if given != name:  # the messages of a request usually share a topic: check it once
                name = given
                cfg = self._send_topic(given)
            topics.append(cfg)
        return self.producer.send(messages, topics, meta[CLIENT_ID], lambda: _peer_host(context))

    def _send_topic(self, given: str) -> TopicConfig:
        """The config of a topic a client sends to: a legal name it may publish to, created on
        first use (when allowed), with a writable queue."""
        name = topic_name(given, Use.WRITE)
        cfg = self._topic(name, create=True)
        if not cfg.writable:
            raise RpcStatusError(Code.FORBIDDEN, f"topic {name!r} has no writable queue")
        return cfg

    @unary(S.EndTransactionResponse)
    def EndTransaction(
        self, request: S.EndTransactionRequest, context: grpc.ServicerContext
    ) -> S.EndTransactionResponse:
        self._meta(context)
        topic_name(request.topic.name, Use.WRITE)
        return S.EndTransactionResponse(status=self.producer.end_transaction(request))

    @unary(S.RecallMessageResponse)
    def RecallMessage(
        self, request: S.RecallMessageRequest, context: grpc.ServicerContext
    ) -> S.RecallMessageResponse:
        self._meta(context)
        name = topic_name(request.topic.name, Use.WRITE)
        return self.producer.recall(self._topic(name), request.recall_handle)

    # --- pop consumption ---------------------------------------------------------------------------------
    @unary(S.QueryAssignmentResponse)
    def QueryAssignment(
        self, request: S.QueryAssignmentRequest, context: grpc.ServicerContext
    ) -> S.QueryAssignmentResponse:
        meta = self._meta(context)
        group = group_name(request.group.name)
        name = topic_name(request.topic.name, Use.READ)
        cfg = self._topic(name)
        if not cfg.readable or cfg.read_queue_nums <= 0:
            raise RpcStatusError(Code.FORBIDDEN, f"topic {name!r} has no readable queue")
        self.clients.touch(meta[CLIENT_ID], D.ClientType.PUSH_CONSUMER, group)
        mq = self._message_queue(
            cfg, -1, self._endpoints(request.endpoints), request.topic.resource_namespace
        )
        return S.QueryAssignmentResponse(
            status=codes.ok(), assignments=[D.Assignment(message_queue=mq)]
        )

    @astreaming(S.ReceiveMessageResponse, with_timestamp=True)
    async def ReceiveMessage(
        self, request: S.ReceiveMessageRequest, context: Any
    ) -> AsyncIterator[S.ReceiveMessageResponse]:
        async for response in polling.receive(self, request, context):
            yield response

    def _check_invisible(self, ms: int, least_ms: int) -> None:
        if not least_ms <= ms <= self.options.max_invisible_ms:
            raise RpcStatusError(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"invisible time {ms} ms is outside [{least_ms}, {self.options.max_invisible_ms}] ms",
            )

    @unary(S.AckMessageResponse)
    def AckMessage(
        self, request: S.AckMessageRequest, context: grpc.ServicerContext
    ) -> S.AckMessageResponse:
        self._meta(context)
        group = group_name(request.group.name)
        name = topic_name(request.topic.name, Use.READ)
        if not request.entries:
            raise RpcStatusError(Code.BAD_REQUEST, "an AckMessage request needs at least one entry")
        results = []
        for e in request.entries:
            code, text = codes.ack_code(self.pop.ack(group, name, e.receipt_handle))
            results.append(
                S.AckMessageResultEntry(
                    message_id=e.message_id,
                    receipt_handle=e.receipt_handle,
                    status=codes.status(code, text),
                )
            )
        top = codes.combined_code([r.status.code for r in results])
        text = (
            "OK"
            if top == Code.OK
            else next(r.status.message for r in results if r.status.code != Code.OK)
        )
        return S.AckMessageResponse(status=codes.status(top, text), entries=results)

    @unary(S.ChangeInvisibleDurationResponse)
    def ChangeInvisibleDuration(
        self, request: S.ChangeInvisibleDurationRequest, context: grpc.ServicerContext
    ) -> S.ChangeInvisibleDurationResponse:
        self._meta(context)
        group = group_name(request.group.name)
        name = topic_name(request.topic.name, Use.READ)
        ms = request.invisible_duration.ToMilliseconds()
        self._check_invisible(ms, 0)
        outcome, handle = self.pop.change_invisible(group, name, request.receipt_handle, ms)
        code, text = codes.ack_code(outcome)
        return S.ChangeInvisibleDurationResponse(
            status=codes.status(code, text), receipt_handle=handle or request.receipt_handle
        )

    @unary(S.ForwardMessageToDeadLetterQueueResponse)
    def ForwardMessageToDeadLetterQueue(
        self, request: S.ForwardMessageToDeadLetterQueueRequest, context: grpc.ServicerContext
    ) -> S.ForwardMessageToDeadLetterQueueResponse:
        self._meta(context)
        group = group_name(request.group.name)
        name = topic_name(request.topic.name, Use.READ)
        code, text = codes.ack_code(self.pop.forward_to_dlq(group, name, request.receipt_handle))
        return S.ForwardMessageToDeadLetterQueueResponse(status=codes.status(code, text))

    # --- offset-based consumption ----------------------------------------------------------------------
    @astreaming(S.PullMessageResponse, with_timestamp=False)
    async def PullMessage(
        self, request: S.PullMessageRequest, context: Any
    ) -> AsyncIterator[S.PullMessageResponse]:
        async for response in polling.pull(self, request, context):
            yield response

    @unary(S.UpdateOffsetResponse)
    def UpdateOffset(
        self, request: S.UpdateOffsetRequest, context: grpc.ServicerContext
    ) -> S.UpdateOffsetResponse:
        self._meta(context)
        group = group_name(request.group.name)
        cfg, qid = self._queue_of(request.message_queue)
        lo, hi = (
            self.store.min_offset(cfg.topic_name, qid),
            self.store.max_offset(cfg.topic_name, qid),
        )
        if not lo <= request.offset <= hi:
            raise RpcStatusError(
                Code.ILLEGAL_OFFSET,
                f"offset {request.offset} is outside [{lo}, {hi}] of {cfg.topic_name}/{qid}",
            )
        self.store.offsets.commit(group, cfg.topic_name, qid, request.offset, persist=True)
        self.pop.reset(group, cfg.topic_name, qid)
        return S.UpdateOffsetResponse(status=codes.ok())

    @unary(S.GetOffsetResponse)
    def GetOffset(
        self, request: S.GetOffsetRequest, context: grpc.ServicerContext
    ) -> S.GetOffsetResponse:
        self._meta(context)
        group = group_name(request.group.name)
        cfg, qid = self._queue_of(request.message_queue)
        offset = self.store.offsets.query(group, cfg.topic_name, qid)
        if offset < 0:
            raise RpcStatusError(
                Code.OFFSET_NOT_FOUND, f"group {group!r} has no offset for {cfg.topic_name}/{qid}"
            )
        return S.GetOffsetResponse(status=codes.ok(), offset=offset)

    @unary(S.QueryOffsetResponse)
    def QueryOffset(
        self, request: S.QueryOffsetRequest, context: grpc.ServicerContext
    ) -> S.QueryOffsetResponse:
        self._meta(context)
        cfg, qid = self._queue_of(request.message_queue)
        policy = request.query_offset_policy
        topic = cfg.topic_name
        if policy == D.QueryOffsetPolicy.BEGINNING:
            offset = self.store.min_offset(topic, qid)
        elif policy == D.QueryOffsetPolicy.END:
            offset = self.store.max_offset(topic, qid)
        elif policy == D.QueryOffsetPolicy.TIMESTAMP:
            if not request.HasField("timestamp"):
                raise RpcStatusError(
                    Code.BAD_REQUEST, "query_offset_policy TIMESTAMP needs a timestamp"
                )
            offset = self.store.offset_by_time(topic, qid, timestamp_ms(request.timestamp))
        else:
            raise RpcStatusError(Code.BAD_REQUEST, f"unknown query_offset_policy {policy}")
        return S.QueryOffsetResponse(status=codes.ok(), offset=offset)

    @unary(S.SyncLiteSubscriptionResponse)
    def SyncLiteSubscription(
        self, request: Any, context: grpc.ServicerContext
    ) -> S.SyncLiteSubscriptionResponse:
        self._meta(context)
        raise RpcStatusError(Code.NOT_IMPLEMENTED, "lite topics are not supported by this broker")


# --- access: what each method needs (read by rmq_spark.broker.access before the handler runs) ------
_DESCRIPTOR = S.DESCRIPTOR.services_by_name["MessagingService"]
_RESPONSES = {m.name: getattr(S, m.output_type.name) for m in _DESCRIPTOR.methods}


def _sub(topic: str, group: str | None) -> Need:
    """Consuming ``topic`` (SUB), in ``group`` (SUB) when one is named."""
    groups = (group_name(group),) if group is not None else ()
    return Need(topics=((topic_name(topic, Use.READ), Perm.SUB),), groups=groups)


def _pub(topic: str) -> Need:
    return Need(topics=((topic_name(topic, Use.WRITE), Perm.PUB),))


def _group_if_named(request: Any) -> Need:
    named = request.HasField("group") and request.group.name
    return Need(groups=(group_name(request.group.name),)) if named else AUTHENTICATED


def _send_need(request: S.SendMessageRequest) -> Need:
    names = dict.fromkeys(m.topic.name for m in request.messages)  # a request usually has one topic
    return Need(topics=tuple((topic_name(n, Use.WRITE), Perm.PUB) for n in names))


ACCESS_RULES: dict[str, Any] = {
    "QueryRoute": lambda r: Need(topics=((topic_name(r.topic.name, Use.ROUTE), Perm.DENY),)),
    "Heartbeat": _group_if_named,
    "SendMessage": _send_need,
    "QueryAssignment": lambda r: _sub(r.topic.name, r.group.name),
    "ReceiveMessage": lambda r: _sub(r.message_queue.topic.name, r.group.name),
    "AckMessage": lambda r: _sub(r.topic.name, r.group.name),
    "ForwardMessageToDeadLetterQueue": lambda r: _sub(r.topic.name, r.group.name),
    "PullMessage": lambda r: _sub(r.message_queue.topic.name, r.group.name or None),
    "UpdateOffset": lambda r: _sub(r.message_queue.topic.name, r.group.name),
    "GetOffset": lambda r: _sub(r.message_queue.topic.name, r.group.name),
    "QueryOffset": lambda r: _sub(r.message_queue.topic.name, None),
    "EndTransaction": lambda r: _pub(r.topic.name),
    "Telemetry": None,  # a request stream: any signed account (the settings name no resource)
    "NotifyClientTermination": _group_if_named,
    "ChangeInvisibleDuration": lambda r: _sub(r.topic.name, r.group.name),
    "RecallMessage": lambda r: _pub(r.topic.name),
    "SyncLiteSubscription": lambda r: AUTHENTICATED,  # not implemented: answers NOT_IMPLEMENTED
}
