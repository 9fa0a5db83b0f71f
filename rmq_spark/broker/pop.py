"""Pop consumption: what ReceiveMessage / AckMessage / ChangeInvisibleDuration /
ForwardMessageToDeadLetterQueue do to a consumer group (RocketMQ 5's pop, as the proxy offers it).

- A receive takes up to ``batch`` messages of a topic for a group, from the group's retry topic
  ``%RETRY%{group}`` first and then from every queue of the topic in turn (like the proxy, the
  queue id the client names is ignored).  Each delivered message is invisible to the group until
  its deadline and carries a receipt handle.
- Ack finishes the message; ChangeInvisibleDuration moves its deadline and issues a new handle
  (the old one becomes stale).  A stale or expired handle gets INVALID_RECEIPT_HANDLE.
- When a deadline passes, the message is moved: a copy with ``reconsumeTimes + 1`` goes to the
  retry topic, or, once it was delivered ``max_delivery_attempts`` times, to ``%DLQ%{group}``.
  ``delivery_attempt`` = reconsumeTimes + 1.
- FIFO: a message with a message group (``__SHARDINGKEY``) is not delivered while an earlier
  message of its group in the same queue is in flight; one that times out stays in its queue and
  is delivered again first (never via the retry topic), so each group is served in order.
- ``auto_renew`` (push consumers): the deadline is extended while the client is alive; a client
  that says goodbye gets its messages released.

A receive that finds nothing long-polls on the server's event loop (the service's
ReceiveMessage): it parks in :attr:`PopService.wakeups` under its topic and its group's retry
topic, and :meth:`PopService.notify` wakes it when a write, an ack or an expiry touches them.

Queue state and persistence: :mod:`rmq_spark.broker.popstate`.  Time comes from the injected
clock; :meth:`PopService.revive_once` does one round of expiry (a background thread calls it),
and the retry / DLQ copies are written by :mod:`rmq_spark.broker.revive`.

Why this module is long: its code is under 500 lines; the import block, one name a line as
ruff's import sorter wraps it, takes the rest.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rmq_spark.broker.codes import AckOutcome
from rmq_spark.broker.popstate import (
    MAIN,
    RETRY,
    GroupState,
    InFlight,
    OffsetSet,
    Pending,
    PopStateFile,
    QueueState,
)
from rmq_spark.broker.receipt import parse_receipt_handle, receipt_handle
from rmq_spark.broker.revive import Move, dlq_topic, move_expired, retry_topic
from rmq_spark.broker.wakeups import Wakeups
from rmq_spark.filter import SqlFilter, TagFilter
from rmq_spark.store import layout as L
from rmq_spark.store.clock import Clock
from rmq_spark.store.dispatch import DispatchBatch
from rmq_spark.store.message import MessageExt
from rmq_spark.store.status import GetStatus
from rmq_spark.store.store import MessageStore

__all__ = ["Delivery", "PopConfig", "PopService", "dlq_topic", "retry_topic"]

log = logging.getLogger("rmq_spark.broker.pop")

PENDING_CAP = 2048  # read-ahead held back per queue (FIFO groups blocked behind a message)


@dataclass
class PopConfig:
    max_delivery_attempts: int = 17  # retryMaxTimes + 1
    auto_renew_invisible_ms: int = (
        60_000  # proxy: auto-renewed messages are invisible 60 s at a time
    )
    persist_interval_ms: int = 1000
    revive_interval_ms: int = 100


@dataclass
class Delivery:
    message: MessageExt
    topic: str  # the topic the client sees (the original topic of a retry copy)
    handle: str
    attempt: int  # delivery_attempt
    invisible_ms: int


def _matches(flt: object, ext: MessageExt) -> bool:
    if isinstance(flt, TagFilter):
        return flt.matches(ext.tags)
    if isinstance(flt, SqlFilter):
        return flt.matches(ext.properties)
    return True


class PopService:
    def __init__(
        self,
        store: MessageStore,
        config: PopConfig,
        clock: Clock,
        is_client_alive: Callable[[str], bool] = lambda client_id: True,
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.is_client_alive = is_client_alive
        self._file = PopStateFile(store.root)
        self._groups: dict[str, GroupState] = {}
        self._groups_lock = threading.Lock()
        self._heap: list[tuple[int, int, str, tuple[int, str, int], int]] = []
        self._heap_lock = threading.Lock()
        self._seq = itertools.count(1)
        self._epoch = format(clock.now_ms(), "x")
        self._version = 0
        self._closing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_persist_ms = 0
        self.wakeups = Wakeups()  # long polls parked on the server's event loop, by topic
        self.traffic: Any = None  # rmq_spark.services.traffic.Traffic when metrics are on
        store.add_listener(self._on_dispatch)

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rmq-pop-revive", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving: waiting receives return at once."""
        self._closing = True
        self.notify()

    def shutdown(self) -> None:
        self.close()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.persist()

    def _on_dispatch(self, dispatch: DispatchBatch) -> None:
        self.notify(dispatch.topics)

    def notify(self, topics: Iterable[str] | None = None) -> None:
        """Something a receive or pull may be waiting for happened to ``topics`` (to anything
        when ``None``): wake the long polls that wait on them.  The version moves first, then
        the polls are woken (the order :mod:`rmq_spark.broker.wakeups` relies on)."""
        self._version += 1
        self.wakeups.wake(topics)

    @property
    def closing(self) -> bool:
        """The broker is stopping: long polls answer at once."""
        return self._closing

    @property
    def version(self) -> int:
        """Changes whenever messages are published, acked or revived (for long polling)."""
        return self._version

    def _run(self) -> None:
        interval_s = self.config.revive_interval_ms / 1000
        while not self._stop.wait(interval_s):
            try:
                self.revive_once()
                now = self.clock.now_ms()
                if now - self._last_persist_ms >= self.config.persist_interval_ms:
                    self.persist()
            except Exception:  # keep reviving: one bad round must not stop redelivery
                log.exception("pop revive round failed")

    def _unique(self) -> str:
        """What makes a receipt handle unique: this broker's epoch and a new sequence number."""
        return f"{self._epoch}.{next(self._seq)}"

    # --- state ----------------------------------------------------------------------------------
    def _group(self, name: str) -> GroupState:
        g = self._groups.get(name)
        if g is None:
            with self._groups_lock:
                g = self._groups.setdefault(name, GroupState(name))
        return g

    def _queue(self, g: GroupState, kind: int, topic: str, qid: int) -> QueueState:
        key = (kind, topic, qid)
        q = g.queues.get(key)
        if q is None:
            lo, hi = self.store.min_offset(topic, qid), self.store.max_offset(topic, qid)
            saved = self._file.take(g.name, topic, qid)
            committed = self.store.offsets.query(g.name, topic, qid)
            done = OffsetSet()
            if committed >= 0:
                base = committed
                if saved is not None and saved[0] == committed:
                    done = saved[1]
            else:
                # the proxy's rule for a new group: from the start while offset 0 is still there,
                # else from the last message
                base = 0 if lo == 0 else max(lo, hi - 1)
            q = QueueState(topic, qid, kind, max(base, lo), done)
            g.queues[key] = q
        return q

    def reset(self, group: str, topic: str, queue_id: int) -> None:
        """Forget a queue's state (its committed offset was changed from outside)."""
        g = self._group(group)
        with g.lock:
            g.queues.pop((MAIN, topic, queue_id), None)
            g.queues.pop((RETRY, topic, queue_id), None)

    def forget_topic(self, topic: str) -> None:
        """Forget every group's state of ``topic``'s queues (the topic was deleted)."""
        for g in list(self._groups.values()):
            with g.lock:
                for key in [k for k in g.queues if k[1] == topic]:
                    del g.queues[key]

    # --- receive --------------------------------------------------------------------------------
    def pop(
        self,
        group: str,
        topic: str,
        message_filter: object,
        batch: int,
        invisible_ms: int,
        *,
        client_id: str = "",
        auto_renew: bool = False,
    ) -> list[Delivery]:
        cfg = self.store.topics.get(topic)
        if cfg is None or batch <= 0:
            return []
        g = self._group(group)
        picked: list[tuple[QueueState, int, MessageExt, int, str, str | None]] = []
        rtopic = retry_topic(group)
        with g.lock:
            sources: list[QueueState] = []
            if self.store.consume_queue(rtopic, 0) is not None:
                sources.append(self._queue(g, RETRY, rtopic, 0))
            n = cfg.read_queue_nums
            start = g.rr % n if n else 0
            g.rr += 1
            sources.extend(self._queue(g, MAIN, topic, (start + i) % n) for i in range(n))
            for q in sources:
                need = batch - len(picked)
                if need <= 0:
                    break
                base = q.base
                self._pop_queue(q, topic, message_filter, need, picked)
                if q.base != base:
                    self._commit(g, q)
            now = self.clock.now_ms()
            deadline = now + invisible_ms
            out = []
            for q, off, ext, reconsume, origin, msg_group in picked:
                handle = receipt_handle(
                    off, now, invisible_ms, q.kind, q.queue_id, ext.commitlog_offset, self._unique()
                )
                q.track(
                    InFlight(
                        off,
                        ext.commitlog_offset,
                        ext.store_size,
                        reconsume,
                        msg_group,
                        origin,
                        deadline,
                        handle,
                        client_id,
                        auto_renew,
                    )
                )
                out.append(Delivery(ext, origin, handle, reconsume + 1, invisible_ms))
        if out:
            with self._heap_lock:
                for q, off, *_rest in picked:
                    heapq.heappush(
                        self._heap,
                        (deadline, next(self._seq), group, (q.kind, q.topic, q.queue_id), off),
                    )
            if self.traffic is not None:
                self.traffic.delivered(
                    topic, group, len(out), sum(d.message.store_size for d in out)
                )
        return out

    def _pop_queue(self, q: QueueState, topic: str, flt: object, need: int, picked: list) -> None:  # type: ignore[type-arg]
        store = self.store
        blocked = set(q.groups)
        taken = 0
        if q.pending:
            for off in sorted(q.pending):
                if taken >= need:
                    break
                p = q.pending[off]
                if p.origin != topic or (p.msg_group is not None and p.msg_group in blocked):
                    continue
                ext = store.look_message_by_offset(p.phys, p.size)
                del q.pending[off]
                if ext is None or (q.kind == RETRY and not _matches(flt, ext)):
                    q.finish(off)
                    continue
                picked.append((q, off, ext, p.reconsume, p.origin, p.msg_group))
                taken += 1
            blocked.update(
                p.msg_group
                for p in q.pending.values()
                if p.msg_group is not None and p.origin == topic
            )
        while taken < need and len(q.pending) < PENDING_CAP:
            start = q.frontier
            want = need - taken if q.kind == MAIN else max(need - taken, 32)
            res = store.get_messages(
                q.topic,
                q.queue_id,
                start,
                max_msgs=want,
                message_filter=flt if q.kind == MAIN else None,
            )
            if res.status is GetStatus.OFFSET_TOO_SMALL:
                q.skip_to(res.next_begin_offset)
                continue
            if res.status is GetStatus.OFFSET_OVERFLOW_BADLY:  # the queue is shorter than we knew
                q.frontier = q.base = res.max_offset
                q.dirty = True
                break
            if res.status not in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
                break
            end = res.next_begin_offset
            prev = start
            for ext in res.messages:
                off = ext.queue_offset
                if q.kind == MAIN and off > prev:
                    q.finish_range(prev, off)  # filtered out: the group does not want them
                prev = off + 1
                if off in q.done:
                    continue
                props = ext.properties
                msg_group = props.get(L.P_SHARDING_KEY)
                origin = topic if q.kind == MAIN else props.get(L.P_RETRY_TOPIC, "")
                if q.kind == RETRY and origin == topic and not _matches(flt, ext):
                    q.finish(off)
                    continue
                free = msg_group is None or msg_group not in blocked
                if origin == topic and free and taken < need:
                    picked.append((q, off, ext, ext.reconsume_times, origin, msg_group))
                    taken += 1
                else:
                    q.pending[off] = Pending(
                        ext.commitlog_offset, ext.store_size, msg_group, ext.reconsume_times, origin
                    )
                    if msg_group is not None and origin == topic:
                        blocked.add(msg_group)
            if q.kind == MAIN and end > prev:
                q.finish_range(prev, end)
            q.frontier = max(q.frontier, end)
            if end <= start:
                break

    # --- handles --------------------------------------------------------------------------------
    def _locate(
        self, group: str, topic: str, handle: str
    ) -> tuple[GroupState, QueueState, int] | None:
        parsed = parse_receipt_handle(handle)
        if parsed is None:
            return None
        kind, qid, off, _phys = parsed
        g = self._groups.get(group)
        if g is None:
            return None
        qtopic = retry_topic(group) if kind == RETRY else topic
        q = g.queues.get((kind, qtopic, qid))
        return (g, q, off) if q is not None else None

    def ack(self, group: str, topic: str, handle: str) -> AckOutcome:
        found = self._locate(group, topic, handle)
        if found is None:
            return AckOutcome.INVALID_HANDLE
        g, q, off = found
        with g.lock:
            e = q.inflight.get(off)
            if e is None or e.handle != handle or e.origin != topic:
                return AckOutcome.INVALID_HANDLE
            if self.clock.now_ms() > e.deadline_ms:
                return AckOutcome.EXPIRED
            del q.inflight[off]
            q.untrack(e)
            q.finish(off)
            self._commit(g, q)
        if e.msg_group is not None:
            self.notify((topic,))  # its group may go on
        return AckOutcome.OK

    def change_invisible(
        self, group: str, topic: str, handle: str, invisible_ms: int
    ) -> tuple[AckOutcome, str]:
        found = self._locate(group, topic, handle)
        if found is None:
            return AckOutcome.INVALID_HANDLE, ""
        g, q, off = found
        with g.lock:
            e = q.inflight.get(off)
            if e is None or e.handle != handle or e.origin != topic:
                return AckOutcome.INVALID_HANDLE, ""
            now = self.clock.now_ms()
            if now > e.deadline_ms:
                return AckOutcome.EXPIRED, ""
            e.deadline_ms = now + invisible_ms
            e.auto_renew = False
            e.handle = receipt_handle(
                off, now, invisible_ms, q.kind, q.queue_id, e.phys, self._unique()
            )
            new = e.handle
        with self._heap_lock:
            heapq.heappush(
                self._heap,
                (e.deadline_ms, next(self._seq), group, (q.kind, q.topic, q.queue_id), off),
            )
        return AckOutcome.OK, new

    def forward_to_dlq(self, group: str, topic: str, handle: str) -> AckOutcome:
        """Move the message to ``%DLQ%{group}`` now (what a FIFO push consumer asks for after its
        local retries).  Idempotent: a message already finished answers OK."""
        found = self._locate(group, topic, handle)
        if found is None:
            return AckOutcome.INVALID_HANDLE
        g, q, off = found
        with g.lock:
            e = q.inflight.get(off)
            p = q.pending.get(off)
            if e is not None and e.origin == topic:
                del q.inflight[off]
                q.untrack(e)
                phys, size, reconsume = e.phys, e.size, e.reconsume
            elif p is not None and p.origin == topic:
                del q.pending[off]
                phys, size, reconsume = p.phys, p.size, p.reconsume
            elif off < q.base or off in q.done:
                return AckOutcome.OK
            else:
                return AckOutcome.INVALID_HANDLE
        move_expired(
            self.store, [Move(g, q, off, phys, size, reconsume, topic, True)], self._commit
        )
        self._moved_to_dlq(group, topic, 1, "the client forwarded it")
        self.notify()
        return AckOutcome.OK

    def _moved_to_dlq(self, group: str, topic: str, n: int, why: str) -> None:
        log.info("DLQ: %d message(s) of topic %s moved to %s (%s)", n, topic, dlq_topic(group), why)
        if self.traffic is not None:
            self.traffic.to_dlq(topic, group, n)

    def release_client(self, client_id: str) -> int:
        """A client left: its auto-renewed messages become visible now (redelivered)."""
        now = self.clock.now_ms()
        released = []
        for g in list(self._groups.values()):
            with g.lock:
                for q in g.queues.values():
                    for e in q.inflight.values():
                        if e.client_id == client_id and e.auto_renew:
                            e.auto_renew = False
                            e.deadline_ms = now
                            released.append(
                                (
                                    now,
                                    next(self._seq),
                                    g.name,
                                    (q.kind, q.topic, q.queue_id),
                                    e.offset,
                                )
                            )
        if released:
            with self._heap_lock:
                for item in released:
                    heapq.heappush(self._heap, item)
        return len(released)

    # --- expiry ---------------------------------------------------------------------------------
    def revive_once(self) -> int:
        """Handle every in-flight message whose deadline has passed; returns how many."""
        now = self.clock.now_ms()
        due = []
        with self._heap_lock:
            while self._heap and self._heap[0][0] <= now:
                due.append(heapq.heappop(self._heap))
        moves: list[Move] = []
        renewed = []
        requeued = 0
        woken: set[str] = set()  # the topics whose receives may now find something
        at = 0  # the entry of ``due`` in hand: if anything raises, it and those after go back
        try:
            for at, (deadline, _seq, gname, key, off) in enumerate(due):  # noqa: B007 - `at` read by the handler below
                g = self._groups.get(gname)
                if g is None:
                    continue
                with g.lock:
                    q = g.queues.get(key)
                    e = q.inflight.get(off) if q is not None else None
                    if e is None or e.deadline_ms != deadline:
                        continue  # acked, or its deadline moved
                    assert q is not None  # e was found in it
                    if e.auto_renew and self.is_client_alive(e.client_id):
                        e.deadline_ms = now + self.config.auto_renew_invisible_ms
                        renewed.append((e.deadline_ms, next(self._seq), gname, key, off))
                        continue
                    last = e.reconsume + 1 >= self.config.max_delivery_attempts
                    if e.msg_group is not None and q.kind == MAIN and not last:
                        # FIFO: stays in its queue, delivered again before anything later of its group
                        q.pending[off] = Pending(
                            e.phys, e.size, e.msg_group, e.reconsume + 1, e.origin
                        )
                        requeued += 1
                    else:
                        moves.append(Move(g, q, off, e.phys, e.size, e.reconsume, e.origin, last))
                        woken.add(retry_topic(gname))
                    woken.add(e.origin)
                    # out of flight only once it is pending or to be moved
                    del q.inflight[off]
                    q.untrack(e)
            at = len(due)
        finally:
            if renewed or at < len(due):
                with self._heap_lock:
                    for item in renewed + due[at:]:
                        heapq.heappush(self._heap, item)
            if moves:
                move_expired(self.store, moves, self._commit)
                dead: dict[tuple[str, str], int] = {}
                for m in moves:
                    if m.to_dlq:
                        dead[(m.group.name, m.origin)] = dead.get((m.group.name, m.origin), 0) + 1
                for (gname, origin), n in dead.items():
                    self._moved_to_dlq(
                        gname, origin, n, f"delivered {self.config.max_delivery_attempts} times"
                    )
            if moves or requeued:
                self.notify(woken)
        return len(moves) + requeued

    # --- offsets --------------------------------------------------------------------------------
    def _commit(self, g: GroupState, q: QueueState) -> None:
        self.store.offsets.commit(g.name, q.topic, q.queue_id, q.base)

    def persist(self) -> None:
        """Write committed offsets and the acks above them (called about once a second)."""
        rows = []
        dirty = False
        for g in list(self._groups.values()):
            with g.lock:
                for q in g.queues.values():
                    if q.dirty:
                        dirty = True
                        q.dirty = False
                        self._commit(g, q)
                    rows.append((g.name, q.topic, q.queue_id, q.snapshot()))
        self._last_persist_ms = self.clock.now_ms()
        if not dirty:
            return
        self._file.write(rows)
        self.store.offsets.persist()

    def inflight_count(self, group: str) -> int:
        g = self._groups.get(group)
        if g is None:
            return 0
        with g.lock:
            return sum(len(q.inflight) for q in g.queues.values())

    def inflight_by_topic(self) -> dict[tuple[str, str], int]:
        """(group, topic the client sees) -> messages delivered and not yet acked (the metrics)."""
        out: dict[tuple[str, str], int] = {}
        for g in list(self._groups.values()):
            with g.lock:
                for q in g.queues.values():
                    for e in q.inflight.values():
                        key = (g.name, e.origin)
                        out[key] = out.get(key, 0) + 1
        return out
