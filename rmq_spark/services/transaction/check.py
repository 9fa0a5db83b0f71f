"""The transaction check-back: one round over the half and op queues, as RocketMQ's
``TransactionalMessageServiceImpl.check`` does it, plus the op-queue bookkeeping it needs.

A round reads the consume offsets of ``RMQ_SYS_TRANS_HALF_TOPIC`` and ``RMQ_SYS_TRANS_OP_HALF_TOPIC``
(queue 0, group ``CID_RMQ_SYS_TRANS``), loads op messages into a *remove map* (half offset -> op
offsets), then walks the half queue from its consume offset:

- a half named by an op, or whose transaction is already resolved: done;
- ``TRANSACTION_CHECK_TIMES`` at the maximum, or born more than 72 h ago: copied to
  ``TRANS_CHECK_MAX_TIME_TOPIC`` and passed;
- stored after the round began: stop (fresh);
- younger than its immunity (the transaction timeout, or ``CHECK_IMMUNITY_TIME_IN_SECONDS``):
  stop, or with the property, re-append it (``TRAN_PREPARED_QUEUE_OFFSET``) and pass;
- otherwise: ask its producer group (a registered resolver decides at once; else the half is put
  back with the check count raised and the :class:`TransactionChecker` is asked).

Afterwards the half offset moves past the walked halves and the op offset moves over the op
messages that are done, contiguously from the old op offset (``calculate_op_offset``): an op whose
half has not been walked yet holds it.

Every copy the round writes (put-back, immunity renewal, discard) carries ``TRAN_CHECK_SOURCE``,
the half offset it came from; after a crash the first round moves the half offset past every
source already copied, so a half is not put back twice (docs/semantics.md 3).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq_spark.errors import RmqError
from rmq_spark.services.transaction.halves import Half, half_of
from rmq_spark.services.transaction.states import (
    EndTxStatus,
    GroupResult,
    TransactionAction,
    as_action,
)
from rmq_spark.store import layout as L
from rmq_spark.store.message import Message, MessageExt

if TYPE_CHECKING:
    from rmq_spark.store.clock import Clock
    from rmq_spark.store.consumequeue import ConsumeQueue
    from rmq_spark.store.store import MessageStore

log = logging.getLogger(__name__)

CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # MixAll.CID_SYS_RMQ_TRANS
REMOVE_TAG = "d"  # TransactionalMessageUtil.REMOVE_TAG
OFFSET_SEPARATOR = ","
OP_PULL_NUMS = 256  # op messages per pull (RocketMQ's OP_MSG_PULL_NUMS is 32)
MAX_PROCESS_TIME_S = 60.0  # per queue per round (MAX_PROCESS_TIME_LIMIT)
P_CHECK_SOURCE = L.P_TRAN_CHECK_SOURCE  # half queue offset a check copy came from
P_OP_ACTION = "TRAN_OP_ACTION"  # on op messages: COMMIT | ROLLBACK (see transaction.py)
P_OP_GROUP = "TRAN_OP_GROUP"  # on a commit's op message: the real messages after it
# on the op of a group its caller stored itself (a sink's): remembered by offset (runs.py)
P_OP_OWN = "TRAN_OP_OWN"


class TransactionService(Protocol):
    """What the check needs of the transaction service that runs it."""

    store: MessageStore
    clock: Clock
    checker: TransactionChecker | None
    check_max: int
    timeout_ms: int
    file_reserved_ms: int
    needs_source_scan: bool

    @property
    def stopping(self) -> bool: ...

    def is_resolved(self, half: MessageExt) -> bool: ...
    def resolver_waits(self, group: str) -> bool: ...
    def resolver_for(self, group: str) -> Any: ...
    def end_halves(self, halves: list[Half], action: TransactionAction) -> GroupResult: ...
    def real_message(self, half: Half) -> Message: ...


class TransactionChecker(Protocol):
    """Asks a producer group about a half (RocketMQ's CHECK_TRANSACTION_STATE): asynchronous; the
    answer comes back as ``end_transaction(..., from_check=True)``.  ``half`` is seen as the
    producer sees it: topic and queue are the real ones, ``commitlog_offset`` / ``queue_offset``
    name the half copy to end, ``properties['__transactionId__']`` is the transaction id."""

    def check(self, producer_group: str, half: MessageExt) -> None: ...


@dataclass
class CheckReport:
    half_offset_before: int = 0
    half_offset: int = 0
    op_offset_before: int = 0
    op_offset: int = 0
    done: int = 0  # halves already committed / rolled back
    checked: int = 0  # put back and asked
    resolved: int = 0  # decided by a resolver during the round
    renewed: int = 0  # immune halves re-appended
    discarded: int = 0  # moved to TRANS_CHECK_MAX_TIME_TOPIC
    stop_reason: str = ""


def calculate_op_offset(done_op_offsets: Iterable[int], old_offset: int) -> int:
    """``calculateOpOffset``: advance from ``old_offset`` while the sorted done op offsets are
    contiguous (a gap is an op whose half is still ahead of the walk)."""
    new = old_offset
    for off in sorted(set(done_op_offsets)):
        if off < new:
            continue
        if off != new:
            break
        new += 1
    return new


def immunity_time_ms(value: str | None, timeout_ms: int) -> int:
    """``getImmunityTime``: ``CHECK_IMMUNITY_TIME_IN_SECONDS`` in ms, never below the transaction
    timeout; an unparsable value counts as 0, so the timeout."""
    try:
        seconds = int(value) if value is not None else 0
    except ValueError:
        seconds = 0
    return max(seconds * 1000, timeout_ms)


def op_half_offsets(bodies: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Half offsets named by op bodies (``"12,13,14,"``; 4.x ``"12"`` too): (offsets, row of each).
    Tokens that are not integers are ignored, as RocketMQ's ``getLong`` -> -1 is."""
    try:
        parts = pc.split_pattern(bodies.cast(pa.string()), OFFSET_SEPARATOR)
    except pa.ArrowInvalid:  # not UTF-8 (as Java's new String: bad bytes become U+FFFD)
        text = [(b or b"").decode("utf-8", "replace") for b in bodies.to_pylist()]
        parts = pc.split_pattern(pa.array(text, pa.string()), OFFSET_SEPARATOR)
    flat = pc.list_flatten(parts)
    rows = pc.list_parent_indices(parts)
    ok = pc.match_substring_regex(flat, r"^[0-9]{1,18}$")
    offsets = pc.filter(flat, ok).cast(pa.int64()).to_numpy(zero_copy_only=False)
    return offsets, pc.filter(rows, ok).to_numpy(zero_copy_only=False).astype(np.int64)


class OpWindow:
    """The op messages from the op consume offset on, as RocketMQ's removeMap / opMsgMap /
    doneOpOffset: an op is done once every half offset it names is behind the walk.  Kept as
    arrays (the (half, op) pairs the ops name, sorted by half), so that a walk over a run of
    halves an op group names -- a sink batch commits hundreds of thousands at once -- takes
    them in one step (:meth:`take_run`) instead of one dictionary operation each."""

    def __init__(
        self, store: MessageStore, op_offset: int, half_offset: int, pull: int = OP_PULL_NUMS
    ) -> None:
        self.store = store
        self.op_offset = op_offset
        self.mini = half_offset  # halves below it are behind the walk
        self.pull = pull
        self.loaded_to = op_offset
        self.exhausted = False
        self._halves = np.empty(0, dtype=np.int64)  # half offsets named, ascending
        self._ops = np.empty(0, dtype=np.int64)  # the op naming each
        self._alive = np.empty(0, dtype=bool)  # not taken by the walk yet
        self._left: dict[int, int] = {}  # op offset -> its (half, op) pairs not taken yet
        self.done: set[int] = set()

    def fill(self) -> bool:
        """Pull the next op messages; False when the op queue has none."""
        hi = self.store.max_offset(L.TRANS_OP_HALF_TOPIC, 0)
        lo = max(self.loaded_to, self.store.min_offset(L.TRANS_OP_HALF_TOPIC, 0))
        if lo >= hi:
            self.exhausted = True
            return False
        end = min(hi, lo + self.pull)
        batch = self.store.read_arrow(
            L.TRANS_OP_HALF_TOPIC, 0, lo, end, columns=["queueOffset", "tags", "body"]
        )
        self.done.update(range(self.loaded_to, lo))  # expired op messages
        self.loaded_to = end
        self.exhausted = end >= hi
        op_offs = batch.column("queueOffset").to_numpy()
        is_op = np.asarray(pc.fill_null(pc.equal(batch.column("tags"), REMOVE_TAG), False))
        halves, rows = op_half_offsets(batch.column("body"))
        keep = is_op[rows] & (halves >= self.mini)
        halves, rows = halves[keep], rows[keep]
        named = np.zeros(len(op_offs), dtype=bool)
        named[rows] = True
        self.done.update(op_offs[~named].tolist())
        if len(halves):
            alive = self._alive
            h = np.concatenate([self._halves[alive], halves])
            o = np.concatenate([self._ops[alive], op_offs[rows]])
            order = np.argsort(h, kind="stable")
            self._halves, self._ops = h[order], o[order]
            self._alive = np.ones(len(h), dtype=bool)
            self._count(op_offs[rows], 1)
        return True

    def _count(self, ops: np.ndarray, sign: int) -> None:
        """Add (``sign`` 1) or take (-1) pairs of ``ops``; an op with none left is done."""
        left = self._left
        for op, n in zip(*(a.tolist() for a in np.unique(ops, return_counts=True)), strict=True):
            k = left.get(op, 0) + sign * n
            if k > 0:
                left[op] = k
            else:
                left.pop(op, None)
                self.done.add(op)

    def take(self, half_offset: int) -> bool:
        """The walk reached ``half_offset``: True when an op names it (it is done)."""
        lo, hi = np.searchsorted(self._halves, [half_offset, half_offset + 1]).tolist()
        if lo == hi or not self._alive[lo:hi].any():
            return False
        taken = self._alive[lo:hi]
        self._count(self._ops[lo:hi][taken], -1)
        self._alive[lo:hi] = False
        return True

    def take_run(self, half_offset: int, limit: int) -> int:
        """:meth:`take` of ``half_offset`` and of the halves after it, as long as each is named
        (at most ``limit``): how many were taken."""
        lo = int(np.searchsorted(self._halves, half_offset))
        upto = int(np.searchsorted(self._halves, half_offset + limit))
        if lo == upto:
            return 0
        alive = self._alive[lo:upto]
        distinct = np.unique(self._halves[lo:upto][alive])
        gaps = np.flatnonzero(distinct != half_offset + np.arange(len(distinct)))
        n = int(gaps[0]) if len(gaps) else len(distinct)
        if n == 0:
            return 0
        hi = int(np.searchsorted(self._halves, half_offset + n))
        taken = self._alive[lo:hi]
        self._count(self._ops[lo:hi][taken], -1)
        self._alive[lo:hi] = False
        return n

    def finish(self, new_half_offset: int, max_ops: int = 1 << 20) -> int:
        """The new op offset once the walk stopped at ``new_half_offset``; reads further op
        messages while the done ones stay contiguous."""
        self.mini = new_half_offset
        self._settle()
        new = calculate_op_offset(self.done, self.op_offset)
        while new >= self.loaded_to and not self.exhausted and new - self.op_offset < max_ops:
            if not self.fill():
                break
            self._settle()
            new = calculate_op_offset(self.done, new)
        return new

    def _settle(self) -> None:
        """Ops whose halves are all behind the walk (walked as resolved, or a late op) are done."""
        ahead = self._alive & (self._halves >= self.mini)
        waiting = set(np.unique(self._ops[ahead]).tolist())
        for op in [op for op in self._left if op not in waiting]:
            del self._left[op]
            self.done.add(op)


def consume_offset(store: MessageStore, topic: str) -> int:
    """The check's committed offset of ``topic`` queue 0; the queue's min offset when none."""
    off = store.offsets.query(CHECK_GROUP, topic, 0)
    return max(off, store.min_offset(topic, 0))


def need_discard(half: MessageExt, check_max: int) -> bool:
    """``needDiscard``: the check count reached the maximum; otherwise raise it (from 1)."""
    raw = half.properties.get(L.P_TRANSACTION_CHECK_TIMES)
    times = 1
    if raw is not None:
        try:
            times = int(raw)
        except ValueError:
            times = 0
        if times >= check_max:
            return True
        times += 1
    half.properties[L.P_TRANSACTION_CHECK_TIMES] = str(times)
    return False


def check_copy(
    half: MessageExt, topic: str, source: int, extra: dict[str, str] | None = None
) -> Message:
    """A copy of ``half`` for ``topic`` (put-back, renewal or discard), born when the half was."""
    props = dict(half.properties)
    props[P_CHECK_SOURCE] = str(source)
    if extra:
        props.update(extra)
    return Message(
        topic,
        half.body,
        props,
        queue_id=0,
        flag=half.flag,
        sys_flag=half.sys_flag & ~L.TRANSACTION_MASK,
        born_timestamp_ms=half.born_timestamp_ms,
        born_host=half.born_host,
        born_port=half.born_port,
        reconsume_times=half.reconsume_times,
    )


def skip_copied_sources(store: MessageStore, half_offset: int) -> int:
    """After a crash: the half offset past every half a previous round already copied."""
    best = half_offset - 1
    hi = store.max_offset(L.TRANS_HALF_TOPIC, 0)
    for lo in range(half_offset, hi, 8192):
        b = store.read_arrow(L.TRANS_HALF_TOPIC, 0, lo, min(hi, lo + 8192), columns=["properties"])
        best = max(best, _max_source(b))
    dq_hi = store.max_offset(L.TRANS_CHECK_MAX_TIME_TOPIC, 0)
    dq_lo = store.min_offset(L.TRANS_CHECK_MAX_TIME_TOPIC, 0)
    while dq_hi > dq_lo:  # discards are few: read back from the end while they are recent
        start = max(dq_lo, dq_hi - 256)
        b = store.read_arrow(L.TRANS_CHECK_MAX_TIME_TOPIC, 0, start, dq_hi, columns=["properties"])
        top = _max_source(b)
        best = max(best, top)
        if top < half_offset:
            break
        dq_hi = start
    return best + 1


def _max_source(batch: pa.RecordBatch) -> int:
    if batch.num_rows == 0:
        return -1
    src = pc.map_lookup(batch.column("properties"), pa.scalar(P_CHECK_SOURCE), "last")
    ok = pc.fill_null(pc.match_substring_regex(src, r"^[0-9]{1,18}$"), False)
    vals = pc.filter(src, ok).cast(pa.int64())
    return int(pc.max(vals).as_py()) if len(vals) else -1


def run_check(svc: TransactionService) -> CheckReport:
    """One check round over half queue 0 (the only one)."""
    store, clock = svc.store, svc.clock
    start_ms = clock.now_ms()
    began = time.monotonic()
    half_offset = consume_offset(store, L.TRANS_HALF_TOPIC)
    op_offset = consume_offset(store, L.TRANS_OP_HALF_TOPIC)
    rep = CheckReport(half_offset, half_offset, op_offset, op_offset)
    if svc.needs_source_scan:
        half_offset = skip_copied_sources(store, half_offset)
        svc.needs_source_scan = False
    ops = OpWindow(store, op_offset, half_offset)
    ops.fill()
    timeout_ms = svc.timeout_ms
    i = new_half = half_offset
    cq = store.consume_queue(L.TRANS_HALF_TOPIC, 0)
    while True:
        if svc.stopping or time.monotonic() - began > MAX_PROCESS_TIME_S:
            rep.stop_reason = "time"
            break
        if cq is None or i >= cq.max_offset:
            rep.stop_reason = "end"
            break
        if i < cq.min_offset:
            i = new_half = cq.min_offset
            continue
        taken = ops.take_run(i, cq.max_offset - i)
        if taken:
            rep.done += taken
            i = new_half = i + taken
            continue
        if not ops.exhausted:  # an op further on may name it
            ops.fill()
            continue
        half = half_at(store, cq, i)
        if half is None or svc.is_resolved(half):  # unreadable, or ended through another copy
            rep.done += 1 if half is not None else 0
            i = new_half = i + 1
            continue
        prepared = half.properties.get(L.P_TRAN_PREPARED_QUEUE_OFFSET)
        if prepared is not None and prepared.isdigit() and ops.take(int(prepared)):
            rep.done += 1
            i = new_half = i + 1
            continue
        times_before = half.properties.get(L.P_TRANSACTION_CHECK_TIMES)
        now = clock.now_ms()
        if (
            need_discard(half, svc.check_max)
            or now - half.born_timestamp_ms > svc.file_reserved_ms
            or not _has_destination(half)
        ):
            discard(svc, half, i)
            rep.discarded += 1
            i = new_half = i + 1
            continue
        if half.store_timestamp_ms >= start_ms:
            rep.stop_reason = "fresh"
            break
        age = now - half.born_timestamp_ms
        immunity_raw = half.properties.get(L.P_CHECK_IMMUNITY_TIME_IN_SECONDS)
        if immunity_raw is not None:
            if age < immunity_time_ms(immunity_raw, timeout_ms):
                _restore(half, times_before)  # a renewal is not a check
                renew(svc, half, i)
                rep.renewed += 1
                i = new_half = i + 1
                continue
        elif 0 <= age < timeout_ms:
            rep.stop_reason = "immune"
            break
        asked = ask(svc, half, i)
        if asked is None:  # its producer is still writing: asked again next round, nothing copied
            rep.stop_reason = "pending"
            break
        if asked:
            rep.resolved += 1
        else:
            rep.checked += 1
        i = new_half = i + 1
    new_op = ops.finish(new_half)
    rep.half_offset, rep.op_offset = new_half, new_op
    if (new_half, new_op) != (rep.half_offset_before, rep.op_offset_before):
        store.offsets.commit_many(
            CHECK_GROUP,
            {L.TRANS_HALF_TOPIC: {0: new_half}, L.TRANS_OP_HALF_TOPIC: {0: new_op}},
            persist=True,
        )
    return rep


def _has_destination(half: MessageExt) -> bool:
    p = half.properties
    return bool(p.get(L.P_REAL_TOPIC)) and p.get(L.P_REAL_QID, "").isdigit()


def _restore(half: MessageExt, times_before: str | None) -> None:
    if times_before is None:
        half.properties.pop(L.P_TRANSACTION_CHECK_TIMES, None)
    else:
        half.properties[L.P_TRANSACTION_CHECK_TIMES] = times_before


# --- what a round does to one half ---------------------------------------------------------------------
def half_at(store: MessageStore, cq: ConsumeQueue, queue_offset: int) -> MessageExt | None:
    units = cq.units(queue_offset, queue_offset + 1)
    if len(units) == 0:
        return None
    m = store.commitlog.read_record(int(units["offset"][0]), int(units["size"][0]))
    return m if m is not None and m.topic == L.TRANS_HALF_TOPIC else None


def ask(svc: TransactionService, half: MessageExt, queue_offset: int) -> bool | None:
    """Ask about ``half``: True when a resolver ended it now; None when a waiting resolver
    (``register_resolver(wait=True)``) answered UNKNOWN: nothing is written; otherwise it is put
    back (the copy carries the raised check count) and the checker is asked about the copy."""
    group = half.properties.get(L.P_PGROUP, "")
    fn = svc.resolver_for(group)
    if fn is not None:
        try:
            act = as_action(fn(half))
        except Exception:  # a resolver's fault must not stop the check
            log.exception("transaction resolver for %r failed", group)
            act = TransactionAction.UNKNOWN
        if act is TransactionAction.UNKNOWN and svc.resolver_waits(group):
            return None
        h = half_of(half) if act is not TransactionAction.UNKNOWN else None
        if h is not None:
            try:
                if svc.end_halves([h], act).status is not EndTxStatus.IN_PROGRESS:
                    return True
            except RmqError:  # e.g. its real topic cannot take it now: counted, asked again
                log.exception("transaction %s could not be ended as %s", h.txn_id, act.value)
    copy = check_copy(half, L.TRANS_HALF_TOPIC, queue_offset)
    a = svc.store.put_messages([copy], allow_system=True).append
    assert a is not None
    half.properties = copy.properties
    half.queue_offset, half.commitlog_offset = int(a.queue_offsets[0]), int(a.phys_offsets[0])
    half.store_timestamp_ms, half.msg_id = a.store_timestamp_ms, a.msg_ids[0]
    if fn is None and svc.checker is not None:
        view = dataclasses.replace(
            half,
            topic=half.properties[L.P_REAL_TOPIC],
            queue_id=int(half.properties[L.P_REAL_QID]),
            properties=dict(half.properties),
        )
        try:
            svc.checker.check(group, view)
        except Exception:
            log.exception("transaction checker failed for producer group %r", group)
    return False


def renew(svc: TransactionService, half: MessageExt, queue_offset: int) -> None:
    """An immune half goes to the end of the queue, remembering its first queue offset."""
    first = half.properties.get(L.P_TRAN_PREPARED_QUEUE_OFFSET, str(queue_offset))
    copy = check_copy(
        half, L.TRANS_HALF_TOPIC, queue_offset, {L.P_TRAN_PREPARED_QUEUE_OFFSET: first}
    )
    svc.store.put_messages([copy], allow_system=True)


def discard(svc: TransactionService, half: MessageExt, queue_offset: int) -> None:
    """Checked too often or too old: keep a copy in TRANS_CHECK_MAX_TIME_TOPIC, stop checking it."""
    log.warning(
        "transaction %s discarded after %s checks",
        half.properties.get(L.P_UNIQ_KEY),
        half.properties.get(L.P_TRANSACTION_CHECK_TIMES),
    )
    svc.store.put_messages(
        [check_copy(half, L.TRANS_CHECK_MAX_TIME_TOPIC, queue_offset)], allow_system=True
    )
