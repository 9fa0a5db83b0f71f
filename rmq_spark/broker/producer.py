"""The producer side of the service: SendMessage (normal, FIFO, delay, transactional),
EndTransaction, the transaction check-back over Telemetry, and RecallMessage.

- Queue choice, as the proxy's: a FIFO message goes to ``|javaHash(messageGroup)| % queues``;
  others round robin per topic.  (The queue the client names is ignored.)
- The ids: ``message_id`` is the client's id (stored as ``UNIQ_KEY``); ``transaction_id`` equals it
  for every message (the proxy does the same), and a transactional message carries it as
  ``__transactionId__``.
- A delayed message (``delivery_timestamp``) is stored through the timer service
  (``TIMER_DELIVER_MS``), and its send result carries a recall handle.
- A transactional message becomes a half message (``TRAN_MSG``, producer group = topic, as the
  proxy registers gRPC producers); EndTransaction finds it by transaction id.  The check-back asks
  a live producer of the topic (:class:`StreamTransactionChecker`).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow.compute as pc
from rocketmq.grpc_protocol import definition_pb2 as D
from rocketmq.grpc_protocol import service_pb2 as S

from rmq_spark.broker import codes
from rmq_spark.broker.batcher import SendBatcher, Written
from rmq_spark.broker.codes import Code, RpcStatusError
from rmq_spark.broker.messages import MessageType, Outgoing, parse_send
from rmq_spark.broker.telemetry import ClientRegistry, StreamTransactionChecker
from rmq_spark.errors import MessageIllegalError
from rmq_spark.services.core import DEFAULT_CLUSTER, HOOK_KEYS
from rmq_spark.services.timer.recall import RecallError
from rmq_spark.services.transaction.check import CHECK_GROUP
from rmq_spark.services.transaction.states import HalfRef, TransactionAction
from rmq_spark.store import layout as L
from rmq_spark.store.config import TopicConfig
from rmq_spark.store.encode import Row
from rmq_spark.store.hashing import java_string_hash
from rmq_spark.store.message import Message, MessageExt
from rmq_spark.store.status import PutStatus

__all__ = ["HalfRef", "ProducerPath"]

log = logging.getLogger("rmq_spark.broker.producer")

MAX_REMEMBERED_HALVES = 1 << 20
SCAN_CHUNK = 65536
# the answer to a one-message send, copied and filled in (a copy costs half of building it)
_ONE_SENT = S.SendMessageResponse(status=codes.ok(), entries=[S.SendResultEntry(status=codes.ok())])


def _put_failed(status: PutStatus) -> S.SendMessageResponse:
    """The answer to a send whose write the store refused (or did not make durable in time)."""
    return S.SendMessageResponse(
        status=codes.status(codes.put_code(status), f"put failed: {status.value}")
    )


class ProducerPath:
    def __init__(self, core: Any, clients: ClientRegistry, cluster: str = DEFAULT_CLUSTER) -> None:
        self.core = core
        self.cluster = cluster  # stored on every message sent (CLUSTER), as Apache's broker does
        self.store = core.store
        self.clock = core.clock
        self.clients = clients
        self._rr: dict[str, itertools.count[int]] = {}
        self._halves: OrderedDict[str, HalfRef] = OrderedDict()
        self._lock = threading.Lock()
        self.checker = StreamTransactionChecker(clients, self._remember_checked)
        # group commit pays where a write waits for its fdatasync; with asynchronous flush a write
        # never lets the GIL go, so no call could join another's and each goes to the store at once
        self._batcher = SendBatcher(core.send) if self.store.config.flush == "sync" else None
        self._body_max_bytes = self.store.config.body_max_bytes
        self._max_delay_ms = int(core.config.timer_max_delay_s) * 1000
        if core.transactions is not None:
            core.transactions.set_checker(self.checker)

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    # --- send -----------------------------------------------------------------------------------
    def _queue_for(self, out: Outgoing) -> int:
        n = max(1, out.topic.write_queue_nums)
        group = out.properties.get(L.P_SHARDING_KEY)
        if group is not None:
            return abs(java_string_hash(group)) % n
        return next(self._round_robin(out.topic.topic_name)) % n

    def _round_robin(self, topic: str) -> itertools.count[int]:
        rr = self._rr.get(topic)
        if rr is None:
            rr = self._rr.setdefault(topic, itertools.count())
        return rr

    def send(
        self,
        messages: Sequence[D.Message],
        topics: Sequence[TopicConfig],
        client_id: str,
        peer_host: Callable[[], str],
    ) -> S.SendMessageResponse:
        """The messages of one SendMessage request (``topics``: each one's checked topic)."""
        now = self.clock.now_ms()
        parsed = [
            parse_send(pm, cfg, now_ms=now, body_max_bytes=self._body_max_bytes, max_delay_ms=self._max_delay_ms,
                       peer_host=peer_host, cluster=self.cluster)
            for pm, cfg in zip(messages, topics, strict=True)
        ]  # fmt: skip
        return self._send_parsed(parsed, topics, client_id)

    def send_one(
        self, pm: D.Message, cfg: TopicConfig, client_id: str, peer_host: Callable[[], str]
    ) -> S.SendMessageResponse:
        """:meth:`send` of a request of one message (the usual request)."""
        out = parse_send(pm, cfg, now_ms=self.clock.now_ms(), body_max_bytes=self._body_max_bytes,
                         max_delay_ms=self._max_delay_ms, peer_host=peer_host, cluster=self.cluster)  # fmt: skip
        props = out.properties
        if (
            out.type == MessageType.NORMAL
            and self._batcher is None
            and L.P_SHARDING_KEY not in props
            and HOOK_KEYS.isdisjoint(props)
        ):
            return self._send_plain(out, client_id)
        return self._send_parsed([out], (cfg,), client_id)

    def _send_parsed(
        self, parsed: list[Outgoing], topics: Sequence[TopicConfig], client_id: str
    ) -> S.SendMessageResponse:
        core = self.core
        outs = []
        items: list[Message | Row] = []  # a row for a message no put hook acts on
        plain = True  # every message NORMAL: the answer needs no per-type handling
        for out, cfg in zip(parsed, topics, strict=True):
            if out.type != MessageType.NORMAL:
                plain = False
                if out.deliver_ms and core.timer is None:
                    raise RpcStatusError(
                        Code.UNSUPPORTED,
                        "delayed delivery needs the timer service, which is not installed",
                    )
                if out.type == MessageType.TRANSACTION and core.transactions is None:
                    raise RpcStatusError(
                        Code.UNSUPPORTED,
                        "transactions need the transaction service, which is not installed",
                    )
                out.queue_id = self._queue_for(out)
            elif L.P_SHARDING_KEY in out.properties:
                out.queue_id = self._queue_for(out)
            else:
                out.queue_id = next(self._round_robin(cfg.topic_name)) % max(
                    1, cfg.write_queue_nums
                )
            outs.append(out)
            items.append(out.row() if HOOK_KEYS.isdisjoint(out.properties) else out.message)
        try:
            if self._batcher is None:
                put = core.send(items)
                written = Written(put.status, put.append, 0, len(items))
            else:
                written = self._batcher.send(items)
        except MessageIllegalError as e:
            raise RpcStatusError(Code.BAD_REQUEST, str(e)) from None
        if not written.ok:
            return _put_failed(written.status)
        ok = codes.ok()
        response = S.SendMessageResponse(status=ok)
        entries = response.entries
        if plain:
            for o, qoff in zip(outs, written.queue_offsets(), strict=True):
                entries.add(
                    status=ok, message_id=o.message_id, transaction_id=o.message_id, offset=qoff
                )
        else:
            self._typed_entries(entries, outs, written)
        noted = None
        for cfg in topics:
            if cfg is not noted:
                self.clients.note_sent(client_id, cfg.topic_name)
                noted = cfg
        return response

    def _send_plain(self, out: Outgoing, client_id: str) -> S.SendMessageResponse:
        """:meth:`send` of a request of one message no put hook acts on, without a group (the
        usual send: a queue by round robin, no batcher, no per-type answer), written at once
        when the store can (:meth:`~rmq_spark.store.store.MessageStore.try_put_row`)."""
        cfg = out.topic
        topic = cfg.topic_name
        out.queue_id = next(self._round_robin(topic)) % max(1, cfg.write_queue_nums)
        row = out.row()
        placed = self.store.try_put_row(row)
        if placed is not None:
            qoff = placed[2]
            traffic = self.core.traffic
            if traffic is not None:
                traffic.sent((row,))
        else:
            try:
                put = self.core.send([row])
            except MessageIllegalError as e:
                raise RpcStatusError(Code.BAD_REQUEST, str(e)) from None
            if not put.ok:
                return _put_failed(put.status)
            qoff = put.append.queue_list()[0]
        response = S.SendMessageResponse()
        response.CopyFrom(_ONE_SENT)
        entry = response.entries[0]
        entry.message_id = entry.transaction_id = out.message_id
        entry.offset = qoff
        self.clients.note_sent(client_id, topic)
        return response

    def _typed_entries(self, entries: Any, outs: list[Outgoing], written: Written) -> None:
        """The answer's entries for a request holding delayed or transactional messages."""
        ok = codes.ok()
        phys: list[int] | None = None
        for i, (o, qoff) in enumerate(zip(outs, written.queue_offsets(), strict=True)):
            if o.deliver_ms:
                entries.add(
                    status=ok,
                    message_id=o.message_id,
                    transaction_id=o.message_id,
                    offset=qoff,
                    recall_handle=self._recall_handle(o) or "",
                )
                continue
            if o.type == MessageType.TRANSACTION:
                if phys is None:
                    phys = written.phys_offsets()
                self._remember(
                    o.message_id,
                    HalfRef(
                        phys[i], qoff, producer_group=o.topic.topic_name, topic=o.topic.topic_name
                    ),
                )
            entries.add(
                status=ok, message_id=o.message_id, transaction_id=o.message_id, offset=qoff
            )

    # --- transactions -----------------------------------------------------------------------------
    def _remember(self, transaction_id: str, ref: HalfRef) -> None:
        with self._lock:
            self._halves[transaction_id] = ref
            self._halves.move_to_end(transaction_id)
            while len(self._halves) > MAX_REMEMBERED_HALVES:
                self._halves.popitem(last=False)

    def _remember_checked(self, transaction_id: str, half: MessageExt) -> None:
        topic = (
            half.topic
            if half.topic != L.TRANS_HALF_TOPIC
            else half.properties.get(L.P_REAL_TOPIC, "")
        )
        group = half.properties.get(L.P_PGROUP, topic)
        self._remember(
            transaction_id,
            HalfRef(half.commitlog_offset, half.queue_offset, producer_group=group, topic=topic),
        )

    def _find_half(self, transaction_id: str, message_id: str) -> HalfRef | None:
        with self._lock:
            ref = self._halves.get(transaction_id) or self._halves.get(message_id)
        if ref is not None:
            return ref
        return self._scan_halves(transaction_id)

    def _scan_halves(self, transaction_id: str) -> HalfRef | None:
        """A half sent before a restart: the latest copy of it in the half queue, searched from
        the check-back's position (vectorized)."""
        store = self.store
        cq = store.consume_queue(L.TRANS_HALF_TOPIC, 0)
        if cq is None:
            return None
        lo = max(
            store.min_offset(L.TRANS_HALF_TOPIC, 0),
            store.offsets.query(CHECK_GROUP, L.TRANS_HALF_TOPIC, 0),
        )
        hi = cq.max_offset
        found = None
        for start in range(lo, hi, SCAN_CHUNK):
            b = store.read_arrow(
                L.TRANS_HALF_TOPIC,
                0,
                start,
                min(hi, start + SCAN_CHUNK),
                columns=["queueOffset", "msgId", "commitLogOffset", "properties"],
            )
            hits = pc.indices_nonzero(pc.equal(b.column("msgId"), transaction_id)).to_pylist()
            if hits:
                i = hits[-1]
                props = dict(b.column("properties")[i].as_py() or [])
                found = HalfRef(
                    b.column("commitLogOffset")[i].as_py(),
                    b.column("queueOffset")[i].as_py(),
                    producer_group=props.get(L.P_PGROUP, ""),
                    topic=props.get(L.P_REAL_TOPIC, ""),
                )
        return found

    def end_transaction(self, request: S.EndTransactionRequest) -> D.Status:
        svc = self.core.transactions
        if svc is None:
            raise RpcStatusError(
                Code.UNSUPPORTED,
                "transactions need the transaction service, which is not installed",
            )
        tid = request.transaction_id
        if not tid or len(tid) > 256:
            raise RpcStatusError(Code.INVALID_TRANSACTION_ID, "transaction id is empty or too long")
        if request.resolution not in (
            D.TransactionResolution.COMMIT,
            D.TransactionResolution.ROLLBACK,
        ):
            raise RpcStatusError(
                Code.BAD_REQUEST, f"resolution must be COMMIT or ROLLBACK, not {request.resolution}"
            )
        ref = self._find_half(tid, request.message_id)
        if ref is None:
            raise RpcStatusError(Code.INVALID_TRANSACTION_ID, f"no pending transaction {tid!r}")
        if ref.topic and ref.topic != request.topic.name:
            raise RpcStatusError(
                Code.INVALID_TRANSACTION_ID, f"transaction {tid!r} belongs to topic {ref.topic!r}"
            )
        commit = request.resolution == D.TransactionResolution.COMMIT
        from_check = request.source == D.TransactionSource.SOURCE_SERVER_CHECK
        outcome = svc.end_transaction(
            ref.commitlog_offset,
            ref.queue_offset,
            ref.producer_group or None,
            tid,
            TransactionAction.COMMIT if commit else TransactionAction.ROLLBACK,
            from_check,
        )
        code, text = codes.transaction_code(outcome, commit)
        if code == Code.OK:
            with self._lock:
                self._halves.pop(tid, None)
        return codes.status(code, text)

    # --- recall -----------------------------------------------------------------------------------
    def _recall_handle(self, out: Outgoing) -> str | None:
        timer = self.core.timer
        # the timer hook is deterministic for a message with TIMER_DELIVER_MS and UNIQ_KEY set:
        # this is the record core.send stored
        return timer.recall_handle(timer.transform(out.message))

    def recall(self, topic: TopicConfig, handle: str) -> S.RecallMessageResponse:
        timer = self.core.timer
        if timer is None:
            raise RpcStatusError(
                Code.UNSUPPORTED, "recall needs the timer service, which is not installed"
            )
        if not topic.accepts("DELAY"):
            raise RpcStatusError(
                Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                f"topic {topic.topic_name!r} holds {topic.message_type} messages, not DELAY",
            )
        if len(handle) > 4096:
            raise RpcStatusError(Code.BAD_REQUEST, "recall handle is too long")
        try:
            message_id = timer.recall(topic.topic_name, handle)
        except RecallError as e:
            raise RpcStatusError(codes.recall_code(e.reason), f"recall failed: {e}") from None
        return S.RecallMessageResponse(status=codes.ok(), message_id=message_id)
