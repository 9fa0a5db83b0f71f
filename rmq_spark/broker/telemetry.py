"""Clients and their Telemetry streams: the settings handshake, liveness, and commands the broker
sends to a client (orphaned-transaction recovery).

Each client (keyed by its ``x-mq-client-id`` header) opens one bidirectional ``Telemetry`` stream
per broker and writes its ``Settings`` on it.  A stream is served on the server's event loop
(:func:`serve_telemetry`) and holds no thread while it is open.  For every settings command the broker answers with
``TelemetryCommand{status OK, settings=<merged>}`` — the client's settings plus what the broker
decides (retry policy, body size limit, FIFO, batch size, long-polling time), the fields the
official clients need (reference ``grpc_protocol.md`` section 3).  The stream stays open; the
broker can write a ``RecoverOrphanedTransactionCommand`` on the latest stream of a producer at
any time, and the producer answers with an ``EndTransaction`` RPC.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as D
from rocketmq.grpc_protocol import service_pb2 as S

from rmq_spark.broker import codes
from rmq_spark.broker.codes import Code
from rmq_spark.broker.messages import MessageType, to_proto
from rmq_spark.store import layout as L
from rmq_spark.store.message import MessageExt

__all__ = [
    "ClientRegistry",
    "ClientSession",
    "SettingsPolicy",
    "StreamTransactionChecker",
    "TelemetryStream",
]

log = logging.getLogger("rmq_spark.broker.telemetry")

HEARTBEAT_TTL_S = 30.0  # a client not heard of for this long (and without a stream) is gone
FORGET_AFTER_S = 600.0  # ... and its session is dropped after this long
PRUNE_AT = 1024  # sessions held before gone ones are looked for
PRODUCER = int(D.ClientType.PRODUCER)


@dataclass
class SettingsPolicy:
    """What the broker adds to a client's settings."""

    max_body_size: int = L.BODY_MAX_BYTES
    producer_max_attempts: int = 3
    max_delivery_attempts: int = 17
    retry_backoff_ms: list[int] = field(default_factory=lambda: [1000, 5000, 10000, 30000])
    receive_batch_size: int = 32
    long_polling_timeout_ms: int = 20_000

    def merge(self, client: D.Settings, fifo: bool) -> D.Settings:
        out = D.Settings()
        out.CopyFrom(client)
        bp = out.backoff_policy
        if client.HasField("publishing") or client.client_type == D.ClientType.PRODUCER:
            bp.max_attempts = self.producer_max_attempts
            bp.exponential_backoff.initial.FromMilliseconds(10)
            bp.exponential_backoff.max.FromMilliseconds(1000)
            bp.exponential_backoff.multiplier = 2.0
            out.publishing.max_body_size = self.max_body_size
            out.publishing.validate_message_type = True
        else:
            bp.max_attempts = self.max_delivery_attempts
            bp.customized_backoff.ClearField("next")
            for ms in self.retry_backoff_ms:
                bp.customized_backoff.next.add().FromMilliseconds(ms)
            sub = out.subscription
            sub.fifo = fifo
            sub.receive_batch_size = self.receive_batch_size
            if sub.long_polling_timeout.ToMilliseconds() <= 0:
                sub.long_polling_timeout.FromMilliseconds(self.long_polling_timeout_ms)
        out.metric.on = False
        return out


class TelemetryStream:
    """The broker's side of one open Telemetry stream: a queue of commands to write, drained by
    the stream's coroutine on the server's event loop.  :meth:`send` and :meth:`close` may be
    called from any thread (the transaction check-back writes from its own)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._outbox: asyncio.Queue[S.TelemetryCommand | None] = asyncio.Queue()
        self.closed = False

    def send(self, cmd: S.TelemetryCommand) -> bool:
        if self.closed:
            return False
        self._put(cmd)
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._put(None)

    def _put(self, item: S.TelemetryCommand | None) -> None:
        if threading.get_ident() == self._loop_thread:
            self._outbox.put_nowait(item)
            return
        try:
            self._loop.call_soon_threadsafe(self._outbox.put_nowait, item)
        except RuntimeError:  # the loop is closed: the stream is over
            self.closed = True

    async def __aiter__(self) -> AsyncIterator[S.TelemetryCommand]:
        while True:
            cmd = await self._outbox.get()
            if cmd is None:
                return
            yield cmd


@dataclass
class ClientSession:
    client_id: str
    client_type: int = 0
    group: str | None = None
    topics: set[str] = field(default_factory=set)  # published to (settings, or seen sending)
    subscriptions: dict[str, D.FilterExpression] = field(default_factory=dict)
    settings: D.Settings | None = None
    stream: TelemetryStream | None = None
    last_seen_s: float = field(default_factory=time.monotonic)

    @property
    def connected(self) -> bool:
        return self.stream is not None and not self.stream.closed


class ClientRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, ClientSession] = {}
        self._prune_at = PRUNE_AT

    def touch(
        self, client_id: str, client_type: int | None = None, group: str | None = None
    ) -> ClientSession:
        with self._lock:
            s = self._sessions.get(client_id)
            if s is None:
                if len(self._sessions) >= self._prune_at:
                    self._prune()
                s = self._sessions[client_id] = ClientSession(client_id)
            s.last_seen_s = time.monotonic()
            if client_type:
                s.client_type = client_type
            if group and s.group != group:
                joined(s, group)
            return s

    def _prune(self) -> None:
        """Forget clients gone without a goodbye (called with the lock held)."""
        now = time.monotonic()
        for cid in [
            c
            for c, s in self._sessions.items()
            if not s.connected and now - s.last_seen_s > FORGET_AFTER_S
        ]:
            del self._sessions[cid]
        self._prune_at = max(PRUNE_AT, 2 * len(self._sessions))

    def get(self, client_id: str) -> ClientSession | None:
        return self._sessions.get(client_id)

    def remove(self, client_id: str) -> ClientSession | None:
        with self._lock:
            s = self._sessions.pop(client_id, None)
        if s is not None and s.group:
            log.info("%s group %s: client %s left", "producer" if s.client_type == PRODUCER else "consumer",
                     s.group, client_id)  # fmt: skip
        return s

    def alive(self, client_id: str) -> bool:
        s = self._sessions.get(client_id)
        return s is not None and (s.connected or time.monotonic() - s.last_seen_s < HEARTBEAT_TTL_S)

    def note_sent(self, client_id: str, topic: str) -> None:
        s = self._sessions.get(client_id)
        if s is None:
            s = self.touch(client_id, PRODUCER)
        if topic not in s.topics:
            with self._lock:
                s.topics.add(topic)

    def producers_for(self, topic: str) -> list[ClientSession]:
        """Connected producers, those that publish ``topic`` first, most recently seen first."""
        with self._lock:
            live = [s for s in self._sessions.values() if s.connected and s.client_type == PRODUCER]
        live.sort(key=lambda s: (topic not in s.topics, -s.last_seen_s))
        return live

    def streams(self) -> list[TelemetryStream]:
        with self._lock:
            return [s.stream for s in self._sessions.values() if s.stream is not None]

    def open_streams(self) -> int:
        with self._lock:
            return sum(1 for s in self._sessions.values() if s.connected)

    def close_all(self) -> None:
        for st in self.streams():
            st.close()


def joined(session: ClientSession, group: str) -> None:
    """``session``'s client is (now) of ``group``: logged once per change."""
    kind = "producer" if session.client_type == PRODUCER else "consumer"
    log.info("%s group %s: client %s joined", kind, group, session.client_id)
    session.group = group


async def serve_telemetry(
    request_iterator: AsyncIterator[S.TelemetryCommand],
    context: Any,
    session: ClientSession,
    policy: SettingsPolicy,
    is_fifo: Callable[[str | None, list[str]], bool],
) -> AsyncIterator[S.TelemetryCommand]:
    """The response side of a Telemetry call, on the server's event loop: the client's commands
    are read by a second task; an open stream holds no thread."""
    stream = TelemetryStream()
    old, session.stream = session.stream, stream
    if old is not None:
        old.close()  # the latest stream of a client wins

    async def read() -> None:
        try:
            async for cmd in request_iterator:
                session.last_seen_s = time.monotonic()
                reply = _answer(cmd, session, policy, is_fifo)
                if reply is not None:
                    stream.send(reply)
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            if not _ended(exc):
                log.exception("telemetry stream of %s failed", session.client_id)
        finally:
            stream.close()

    reader = asyncio.get_running_loop().create_task(read())
    try:
        async for cmd in stream:
            yield cmd
    finally:
        stream.close()
        reader.cancel()
        if session.stream is stream:
            session.last_seen_s = time.monotonic()


def _ended(exc: BaseException) -> bool:
    """An error of gRPC's own: the call ended under the reader (the client went away, the
    server stopped)."""
    return isinstance(exc, grpc.RpcError) or type(exc).__module__.startswith("grpc")


def _answer(
    cmd: S.TelemetryCommand,
    session: ClientSession,
    policy: SettingsPolicy,
    is_fifo: Callable[[str | None, list[str]], bool],
) -> S.TelemetryCommand | None:
    kind = cmd.WhichOneof("command")
    if kind != "settings":
        return None  # thread stack traces, verify results: nothing to do
    st = cmd.settings
    if st.WhichOneof("pub_sub") is None:
        return S.TelemetryCommand(
            status=codes.status(Code.BAD_REQUEST, "settings need publishing or subscription")
        )
    session.settings = st
    if st.HasField("client_type"):
        session.client_type = st.client_type
    if st.HasField("publishing"):
        session.topics.update(r.name for r in st.publishing.topics)
        fifo = False
    else:
        sub = st.subscription
        if sub.HasField("group"):
            if sub.group.name and session.group != sub.group.name:
                joined(session, sub.group.name)
        session.subscriptions = {e.topic.name: e.expression for e in sub.subscriptions}
        fifo = is_fifo(session.group, list(session.subscriptions))
    return S.TelemetryCommand(status=codes.ok(), settings=policy.merge(st, fifo))


class StreamTransactionChecker:
    """Asks a live producer of a half message's topic what became of its transaction, over the
    producer's Telemetry stream (``RecoverOrphanedTransactionCommand``).  ``on_check(transaction_id,
    half)`` lets the broker remember the half so the producer's EndTransaction finds it."""

    def __init__(
        self, registry: ClientRegistry, on_check: Callable[[str, MessageExt], None]
    ) -> None:
        self.registry = registry
        self.on_check = on_check

    def check(self, producer_group: str, half_msg: MessageExt) -> bool:
        topic = half_msg.topic
        if topic == L.TRANS_HALF_TOPIC:
            topic = half_msg.properties.get(L.P_REAL_TOPIC) or producer_group
        producers = self.registry.producers_for(topic)
        if not producers:
            return False
        tid = half_msg.properties.get(L.P_TRANSACTION_ID) or half_msg.client_msg_id
        self.on_check(tid, half_msg)
        msg = to_proto(half_msg, topic=topic)
        msg.system_properties.message_type = MessageType.TRANSACTION
        cmd = S.TelemetryCommand(
            recover_orphaned_transaction_command=S.RecoverOrphanedTransactionCommand(
                message=msg, transaction_id=tid
            )
        )
        for session in producers:
            stream = session.stream
            if stream is not None and stream.send(cmd):
                return True
        return False
