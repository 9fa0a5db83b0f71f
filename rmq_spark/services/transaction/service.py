"""Transactional messages: half messages, end transaction, atomic group commit.

A message with ``TRAN_MSG=true`` is stored as a *half* in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0
(``REAL_TOPIC`` / ``REAL_QID`` keep its destination, ``__transactionId__`` = its ``UNIQ_KEY``),
never in its real topic.  Ending it writes ONE CommitLog append: the op message first, then (on
commit) the real message(s); the op is the durable record of the decision.

Op message (a normal CommitLog record; RocketMQ 5's layout plus two properties of ours)::

    ┌─────────────────────────────────────────────────────────────────────────────────────────┐
    │ topic RMQ_SYS_TRANS_OP_HALF_TOPIC, queue 0 (= the half queue), sys flag NOT_TYPE          │
    ├─────────────────────────────────────────────────────────────────────────────────────────┤
    │ body  "12,13,14,"  half queue offsets, ASCII decimal, each followed by ','               │
    ├─────────────────────┬──────────────────────────────────┬────────────────────────────────┤
    │ TAGS = d            │ TRAN_OP_ACTION = COMMIT|ROLLBACK │ TRAN_OP_GROUP = n real messages │
    │ (REMOVE_TAG)        │ (which end it was)               │ right after it, same append     │
    └─────────────────────┴──────────────────────────────────┴────────────────────────────────┘

Real message: the half's body and properties minus ``REAL_TOPIC`` / ``REAL_QID`` (``TRAN_MSG=true``
kept, as Apache RocketMQ 5.5.0 stores it), sys flag COMMIT, ``prepared_transaction_offset`` = the half's CommitLog offset, the half's born
time; its store time is the commit time (RocketMQ 5 overwrites it too; store times stay monotonic).

A transaction is known by its id, so the put-back copies the check writes are one transaction with
their original: a second commit, or a commit after a rollback, of any copy is rejected.  The
resolved set is rebuilt from the op queue on start, and an append torn by a crash after its op is
completed then (``transaction_check.load_resolved``).  The check-back is in ``transaction_check``.

Bulk path: ``prepare`` encodes each message's properties once — the real message's, to which the
half adds its three — and keeps them with the half in memory; a commit reuses them (unless the
delivery hook replaced the message) and both write through ``store.put_encoded``, with the checks
of ``store.put_messages`` done here per batch.  Up to ``record.SMALL_BATCH`` records are encoded
straight from their rows, record by record, as ``put_messages`` encodes as many: no columns built.

Why this module is long: prepare, end, group commit and the check's resolutions all read and
change one state under one lock (the transactions being ended, the resolved set, the op-queue
writes); what needs none of it is in :mod:`.states`, :mod:`.halves`, :mod:`.commit`,
:mod:`.check` and :mod:`.recovery`.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from itertools import islice
from typing import Any

import numpy as np

from rmq_spark.errors import MessageIllegalError, RmqError, StoreError
from rmq_spark.services.config import BrokerConfig
from rmq_spark.services.transaction import check as C
from rmq_spark.services.transaction.commit import commit_keys, encode_commits
from rmq_spark.services.transaction.halves import (
    Half,
    Real,
    Row,
    body_halves,
    encode_rows,
    half_of,
    half_rows,
    message_of,
    parse_halves,
    read_halves,
    txn_id_of,
)
from rmq_spark.services.transaction.recovery import load_resolved
from rmq_spark.services.transaction.runs import EndedRuns
from rmq_spark.services.transaction.states import (
    EndTxStatus,
    GroupResult,
    HalfRef,
    TransactionAction,
    TxnState,
    as_action,
)
from rmq_spark.store import layout as L
from rmq_spark.store.clock import SYSTEM_CLOCK, Clock
from rmq_spark.store.dispatch import DispatchBatch
from rmq_spark.store.encoded import SMALL_BATCH, EncodedBatch
from rmq_spark.store.message import (
    Message,
    MessageExt,
    new_uniq_ids,
    new_uniq_ids_array,
    tags_code,
)
from rmq_spark.store.properties import encode_properties
from rmq_spark.store.rowprops import RowProperties, decoded
from rmq_spark.store.store import MessageStore, PutResult
from rmq_spark.store.validation import check_body, check_topic

__all__ = [
    "P_OP_ACTION",
    "P_OP_GROUP",
    "CheckReport",
    "EndTxStatus",
    "GroupResult",
    "HalfRef",
    "TransactionAction",
    "TransactionChecker",
    "TransactionService",
    "TxnState",
    "as_action",
]
TransactionChecker = C.TransactionChecker
CheckReport = C.CheckReport
log = logging.getLogger(__name__)

P_OP_ACTION = C.P_OP_ACTION
P_OP_GROUP = C.P_OP_GROUP
# an op message lists its group's half queue offsets; it is the broker's own record, so it may
# exceed the producers' body limit: a group of up to about 3 million halves ends in one append
OP_BODY_MAX_BYTES = 64 << 20
BULK_LOOKUP_MIN = 64  # halves not in memory are read in one vectorized pass from this many on
_PARSED = threading.local()  # the halves the last bulk lookup of this thread parsed
PATCH_COMMIT_MIN = 128  # commits of at least this many halves patch the halves' bytes
HALF_CACHE_ENTRIES = 65536  # stored halves kept in memory, so that ending them reads nothing
_REMOVE_CODE = tags_code(C.REMOVE_TAG)
_HOST = "127.0.0.1"  # born host of op messages (the Message default)
# up to this many records are encoded straight from their rows (record.encode_lists), as
# store.put_messages encodes a batch of up to that size, rather than through the columns
# encode_rows builds (measured at 32 records: prepare + commit 13.4 us/msg against 18.6)
FEW_RECORDS = SMALL_BATCH
# an op message's properties (and those encoded) by action and group size; like RocketMQ's, it has
# no UNIQ_KEY (its message id is its offset id)
_OP_PROPS: dict[tuple[TransactionAction, int, bool], tuple[dict[str, str], bytes]] = {}


_ALREADY = {
    TxnState.COMMITTED: EndTxStatus.ALREADY_COMMITTED,
    TxnState.ROLLED_BACK: EndTxStatus.ALREADY_ROLLED_BACK,
    TxnState.RESOLVED: EndTxStatus.ALREADY_RESOLVED,
}


class TransactionService:
    """Half / op topics, end transaction, group commit and the periodic check-back."""

    def __init__(
        self,
        store: MessageStore,
        config: BrokerConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
        checker: TransactionChecker | None = None,
    ) -> None:
        config = config or BrokerConfig()
        self.store, self.config, self.clock, self.checker = store, config, clock, checker
        extra = getattr(config, "extra", None) or {}
        self.timeout_ms = int(config.transaction_timeout_s * 1000)
        self.interval_s = float(config.transaction_check_interval_s)
        self.check_max = int(config.transaction_check_max)
        self.file_reserved_ms = int(float(extra.get("file_reserved_time_h", 72)) * 3_600_000)
        # e.g. delay / timer; like every put hook it returns the message it was given when it
        # does not change it, and never modifies the given one (its properties included)
        self.real_message_hook: Callable[[Message], Message] | None = None
        # the properties without which the hook returns its message unchanged (None: unknown);
        # a large commit of halves without them patches the halves' bytes (encode_commits)
        self.hook_only_on: tuple[str, ...] | None = None
        self.resolvers: dict[str, Callable[[MessageExt], Any]] = {}
        self.waiting_resolvers: set[str] = (
            set()
        )  # their UNKNOWN ends a check round (register_resolver)
        self._lock = threading.Lock()  # guards _state and _inflight
        self._state: dict[str, TxnState] = {}  # transaction id -> how it ended
        self._inflight: set[str] = set()
        self._runs = EndedRuns()  # groups of halves their caller stored itself, by CommitLog offset
        # _state is in the order transactions ended; each check round marks (now, how many ended
        # so far), and the ends older than the file reserved time are forgotten (_forget_old_ends)
        self._ended_marks: deque[tuple[int, int]] = deque()
        self._forgotten = 0
        self._cache_lock = threading.Lock()
        self._cache: OrderedDict[int, Half] = OrderedDict()  # half CommitLog offset -> half
        # transformed, not yet dispatched: UNIQ_KEY -> (half, what its commit stores)
        self._fresh: OrderedDict[str, tuple[Message, Real]] = OrderedDict()
        self._check_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.needs_source_scan = store.last_exit_abnormal
        state, runs = load_resolved(self)
        self._state.update(state)
        for run in runs:
            self._runs.add(*run)
        store.add_listener(self._on_dispatch, L.TRANS_HALF_TOPIC)

    # --- put hook and prepare ------------------------------------------------------------------------
    def transform(self, msg: Message) -> Message:
        """A message with ``TRAN_MSG=true`` becomes its half; any other passes unchanged, and so
        does a consumed message stored again on its way to a retry (``reconsume_times > 0`` and
        a delay level: Apache's SendMessageProcessor rule) or to the DLQ: a committed message
        keeps ``TRAN_MSG=true`` (as Apache stores it), and a send-back never makes a half of it."""
        if (
            msg.topic == L.TRANS_HALF_TOPIC
            or str(msg.properties.get(L.P_TRAN_MSG, "")).lower() != "true"
            or (
                msg.reconsume_times > 0
                and (_delayed(msg) or msg.topic.startswith(L.DLQ_GROUP_TOPIC_PREFIX))
            )
        ):
            return msg
        (row,), (real,) = self._halves([msg])
        half = Half(0, 0, "", real=real, row=row).msg
        with self._cache_lock:
            self._fresh[half.properties[L.P_UNIQ_KEY]] = (half, real)
            while len(self._fresh) > HALF_CACHE_ENTRIES:
                self._fresh.popitem(last=False)
        return half

    def prepare(self, msgs: Sequence[Message], producer_group: str | None = None) -> PutResult:
        """Store ``msgs`` as halves of ``producer_group`` in one write; the result's offsets and
        ``uniq_keys`` are the halves' CommitLog / queue offsets and transaction ids."""
        if not msgs:
            raise StoreError("prepare needs at least one message")
        limit = self.store.config.body_max_bytes
        for m in msgs:
            if m.body.__class__ is not bytes or len(m.body) > limit:
                for m in msgs:
                    check_body(m.body, limit)
                msgs = [replace(m, body=bytes(m.body)) for m in msgs]
                break
        rows, reals = half_rows(self.store, self.clock.now_ms(), msgs, producer_group, True)
        r = self._put(rows)
        a = r.append
        assert a is not None  # the store sets it on every put it makes
        phys, qoffs = a.phys_list(), a.queue_list()
        cache, stored = self._cache, a.store_timestamp_ms
        if len(rows) == 1:
            (p,), (row,) = phys, rows
            half = Half(p, qoffs[0], row[3][L.P_UNIQ_KEY], None, reals[0], row, None, stored)
            with self._cache_lock:
                cache[p] = half
                if len(cache) > HALF_CACHE_ENTRIES:
                    cache.popitem(last=False)
            return r
        entries = [
            (p, Half(p, q, row[3][L.P_UNIQ_KEY], None, real, row, None, stored))
            for p, q, row, real in zip(phys, qoffs, rows, reals, strict=True)
        ]
        with self._cache_lock:
            cache.update(entries)
            while len(cache) > HALF_CACHE_ENTRIES:
                cache.popitem(last=False)
        return r

    def prepare_bodies(
        self,
        topic: str,
        queue_id: int,
        bodies: Sequence[bytes],
        properties: dict[str, str] | RowProperties,
        producer_group: str,
    ) -> PutResult:
        """:meth:`prepare` of messages of one topic and queue (shared ``properties``, or each its
        own as :class:`RowProperties`), built column-wise (:func:`~rmq_spark.services.transaction.halves.body_halves`)."""
        if len(bodies) < PATCH_COMMIT_MIN:  # a few: the general path keeps them for the commit
            each = (
                decoded(properties.blobs)
                if isinstance(properties, RowProperties)
                else [properties] * len(bodies)
            )
            # or an Arrow column
            listed = bodies if isinstance(bodies, (list, tuple)) else bodies.to_pylist()  # type: ignore[attr-defined]
            msgs = [
                Message(topic, b, dict(p), queue_id=queue_id)
                for b, p in zip(listed, each, strict=True)
            ]
            return self.prepare(msgs, producer_group)
        now = self.clock.now_ms()
        return self.store.put_encoded(
            body_halves(self.store, now, topic, queue_id, bodies, properties, producer_group)
        )

    def prepare_bodies_for_commit(
        self,
        topic: str,
        queue_id: int,
        bodies: Sequence[bytes],
        properties: dict[str, str] | RowProperties,
        producer_group: str,
    ) -> tuple[PutResult, EncodedBatch | None]:
        """:meth:`prepare_bodies`, and the real messages a commit of these halves writes, encoded
        now from the same bodies and ids (None for a few bodies: the general path): handed back
        to :meth:`commit_encoded`, they spare the commit reading and patching the halves."""
        if len(bodies) < PATCH_COMMIT_MIN or self._hooked() is None:
            return self.prepare_bodies(topic, queue_id, bodies, properties, producer_group), None
        now = self.clock.now_ms()
        ids = new_uniq_ids_array(len(bodies))
        halves = body_halves(
            self.store, now, topic, queue_id, bodies, properties, producer_group, ids
        )
        r = self.store.put_encoded(halves)
        if not r.ok or r.append is None:
            return r, None
        phys = np.asarray(r.append.phys_offsets, dtype=np.int64)
        reals = body_halves(self.store, now, topic, queue_id, bodies, properties, producer_group, ids, phys,
                            halves.body_crcs())  # fmt: skip
        return r, reals

    def commit_encoded(
        self,
        offsets: Sequence[int],
        queue_offsets: Sequence[int],
        ids: Sequence[str],
        reals: Sequence[EncodedBatch],
    ) -> GroupResult:
        """Commit the halves at ``offsets`` (their half queue offsets and ids given) by writing the
        op message and ``reals``, their real messages made by :meth:`prepare_bodies_for_commit`,
        as one append; the halves must be pending (else the general :meth:`commit_group` says
        why)."""
        with self._lock:
            busy = not self._state.keys().isdisjoint(ids) or not self._inflight.isdisjoint(ids)
            if not busy:
                self._inflight.update(ids)
        if busy:
            return self.commit_group(list(offsets))
        return self._commit_written(offsets, list(queue_offsets), ids, reals)

    def _commit_written(
        self,
        offsets: Sequence[int],
        queue_offsets: list[int],
        ids: Sequence[str],
        reals: EncodedBatch | Sequence[EncodedBatch],
    ) -> GroupResult:
        """The op message and ``reals`` as one append, for halves marked in flight (halves their
        caller stored itself: how they ended is remembered by offset, :mod:`.runs`)."""
        put: PutResult | None = None
        try:
            op = self._op_row(queue_offsets, TransactionAction.COMMIT, len(ids), own=True)
            put = self._put([op], reals)
        finally:
            with self._lock:
                self._inflight.difference_update(ids)
                if put is not None and put.append is not None:
                    self._runs.add(
                        self.clock.now_ms(),
                        max(queue_offsets),
                        np.asarray(offsets),
                        TxnState.COMMITTED,
                    )
        if self._cache:
            with self._cache_lock:
                for p in offsets:
                    self._cache.pop(p, None)
        return GroupResult(
            EndTxStatus.SUCCESS if put.ok else EndTxStatus.FLUSH_DISK_TIMEOUT, put, ids
        )

    def _halves(
        self, msgs: Sequence[Message], group: str | None = None, force: bool = False
    ) -> tuple[list[Row], list[Real]]:
        return half_rows(self.store, self.clock.now_ms(), msgs, group, force)

    def _put(
        self, rows: list[Row], tail: EncodedBatch | Sequence[EncodedBatch] | None = None
    ) -> PutResult:
        """Write ``rows``, then the records of ``tail``, as one append."""
        if tail is None and len(rows) <= FEW_RECORDS:
            return self.store.put_rows(rows)
        return self.store.put_encoded(encode_rows(self.store, rows, tail))

    def _on_dispatch(self, batch: DispatchBatch) -> None:
        """Remember halves stored through ``transform`` by CommitLog offset."""
        if not self._fresh:  # (the store calls this only for batches holding a half)
            return
        with self._cache_lock:
            for i, topic in enumerate(batch.topics):
                fresh = (
                    self._fresh.pop(batch.uniq_keys[i] or "", None)
                    if topic == L.TRANS_HALF_TOPIC
                    else None
                )
                if fresh is not None:
                    phys = int(batch.phys[i])
                    msg, real = fresh
                    self._cache[phys] = Half(
                        phys,
                        int(batch.queue_offsets[i]),
                        msg.properties[L.P_UNIQ_KEY],
                        msg,
                        real,
                        stored_ms=int(batch.store_timestamps[i]),
                    )
            while len(self._cache) > HALF_CACHE_ENTRIES:
                self._cache.popitem(last=False)

    # --- looking halves up ---------------------------------------------------------------------------
    def foreign_halves(self, offsets: Sequence[int], expect: Mapping[str, str]) -> list[int]:
        """The offsets among ``offsets`` whose half does not carry the ``expect`` properties (a
        missing half is not listed: ending it reports NOT_FOUND)."""
        wanted = tuple(expect.items())
        found = self._lookup(list(offsets), tuple(expect))
        return [
            off
            for off, h in zip(offsets, found, strict=True)
            if h is not None and any(h.prop(k) != v for k, v in wanted)
        ]

    def _lookup(self, offsets: list[int], also: tuple[str, ...] = ()) -> list[Half | None]:
        """The halves at ``offsets`` (None: no half there); ``also``: properties the caller will
        look at (:meth:`Half.prop`), located by the vectorized read of many."""
        with self._cache_lock:
            found = list(map(self._cache.get, offsets))
        if None not in found:
            return found
        misses = [i for i, h in enumerate(found) if h is None]
        if len(misses) >= BULK_LOOKUP_MIN:
            for i, h in zip(
                misses, self._read_many([offsets[i] for i in misses], also), strict=True
            ):
                found[i] = h
            misses = [i for i in misses if found[i] is not None]
        else:
            for i in misses:
                found[i] = self._read(offsets[i])
        if misses:
            with self._cache_lock:
                self._cache.update((offsets[i], h) for i in misses if (h := found[i]) is not None)
                while len(self._cache) > HALF_CACHE_ENTRIES:
                    self._cache.popitem(last=False)
        return found

    def _read_many(self, offsets: list[int], also: tuple[str, ...] = ()) -> list[Half | None]:
        """Halves at ``offsets`` in one vectorized pass; their parse is kept for the commit that
        usually follows (:meth:`_patched_reals`)."""
        found, _PARSED.last = read_halves(
            self.store, offsets, commit_keys(self._hooked() or ()), self._read, also
        )
        return found

    def _hooked(self) -> tuple[str, ...] | None:
        """The properties that send a real message through the hook (None: any may)."""
        return () if self.real_message_hook is None else self.hook_only_on

    def _read(self, phys: int) -> Half | None:
        try:
            m = self.store.look_message_by_offset(int(phys))
        except (ValueError, IndexError, struct.error, UnicodeDecodeError, RmqError):
            return None  # not the start of a record
        if m is None or m.topic != L.TRANS_HALF_TOPIC or m.commitlog_offset != phys:
            return None
        return half_of(m)

    def state(self, commitlog_offset: int) -> TxnState:
        """What became of the half at ``commitlog_offset`` (of any copy of its transaction)."""
        (h,) = self._lookup([commitlog_offset])
        if h is None:
            return TxnState.NOT_FOUND
        return self._runs.state_of(h.phys) or self.transaction_state(h.txn_id)

    def transaction_state(self, transaction_id: str) -> TxnState:
        return self._state.get(transaction_id, TxnState.PENDING)

    def is_pending(self, commitlog_offset: int) -> bool:
        return self.state(commitlog_offset) is TxnState.PENDING

    def is_resolved(self, half: MessageExt) -> bool:
        return (
            txn_id_of(half) in self._state or self._runs.state_of(half.commitlog_offset) is not None
        )

    # --- ending transactions -------------------------------------------------------------------------
    def end_transaction(
        self,
        commitlog_offset: int,
        tran_state_table_offset: int | None,
        producer_group: str,
        transaction_id: str | None = None,
        action: TransactionAction | str = TransactionAction.COMMIT,
        from_check: bool = False,
    ) -> EndTxStatus:
        """EndTransactionProcessor: find the half by CommitLog offset, validate it, then commit
        (op + real message in one append) or roll back (op only).  ``transaction_id`` (the
        client's message id) is checked when given; ``tran_state_table_offset`` when not None."""
        act = action if action.__class__ is TransactionAction else as_action(action)
        if act is TransactionAction.UNKNOWN:
            return EndTxStatus.NOT_HANDLED
        h = self._cache.get(commitlog_offset)  # one call on the C OrderedDict: no lock needed
        if h is None:
            (h,) = self._lookup([commitlog_offset])
            if h is None:
                return EndTxStatus.NOT_FOUND
        props = h.properties
        now, stored = self.clock.now_ms(), h.store_timestamp_ms
        if stored is not None and now - stored > self.file_reserved_ms:
            return EndTxStatus.EXPIRED  # how it ended may be forgotten by now (_forget_old_ends)
        if not from_check and L.P_CHECK_IMMUNITY_TIME_IN_SECONDS in props:
            limit = C.immunity_time_ms(props[L.P_CHECK_IMMUNITY_TIME_IN_SECONDS], self.timeout_ms)
            if now - h.born_timestamp_ms > limit:
                return EndTxStatus.ILLEGAL_OPERATION
        bad = _mismatch(h, tran_state_table_offset, producer_group, transaction_id)
        return bad if bad is not None else self._end_one(h, act)[0]

    def commit_group(
        self,
        halves: Iterable[int | tuple[Any, ...] | HalfRef],
        expect: Mapping[str, str] | None = None,
    ) -> GroupResult:
        """Commit every half in ONE append (op message first, then all real messages), so that a
        reader sees all of them or none.  All must be pending, else nothing is written: the status
        is ALREADY_COMMITTED when every one was committed before (a retried group), else CONFLICT
        (or IN_PROGRESS); ``rejected`` names them.  Items: CommitLog offsets, HalfRef or tuples.
        ``expect``: properties every half must carry (else PRODUCER_GROUP_MISMATCH, nothing ends):
        a caller that names halves by offset ends only its own."""
        return self._end_group(halves, TransactionAction.COMMIT, expect)

    def commit_own(self, offsets: Sequence[int]) -> GroupResult:
        """:meth:`commit_group` of many halves the caller stored itself and knows to be its own
        (so no property of theirs is checked), in one vectorized pass over their bytes that makes
        no object per half: the same op message and real messages, written as one append.  Halves
        this pass cannot take (few, unusual bytes, a hooked property, copies of one transaction,
        old ones, one ended already) go through :meth:`commit_group`, whose checks apply."""
        hooked = self._hooked()
        parsed = None
        if len(offsets) >= PATCH_COMMIT_MIN and hooked is not None:
            parsed = parse_halves(self.store, offsets, commit_keys(hooked))
        if parsed is None:
            return self.commit_group(list(offsets))
        rec, ids = parsed
        assert hooked is not None  # parsed only then
        oldest = self.clock.now_ms() - self.file_reserved_ms
        patched = None
        if len(set(ids)) == len(ids) and not (rec.head["store_timestamp"] < oldest).any():
            patched = encode_commits(
                self.store, np.asarray(offsets, dtype=np.int64), None, hooked, parsed=rec
            )
        if patched is None:
            return self.commit_group(list(offsets))
        with self._lock:
            if not self._state.keys().isdisjoint(ids) or not self._inflight.isdisjoint(ids):
                patched = None
            else:
                self._inflight.update(ids)
        if patched is None:  # ended already or being ended: the general path says how
            return self.commit_group(list(offsets))
        return self._commit_written(offsets, rec.head["queue_offset"].tolist(), ids, patched)

    def rollback_group(
        self,
        halves: Iterable[int | tuple[Any, ...] | HalfRef],
        expect: Mapping[str, str] | None = None,
    ) -> GroupResult:
        """Roll back the pending halves in one op message; the ended ones are in ``rejected``."""
        return self._end_group(halves, TransactionAction.ROLLBACK, expect)

    def _end_group(
        self,
        items: Iterable[int | tuple[Any, ...] | HalfRef],
        act: TransactionAction,
        expect: Mapping[str, str] | None = None,
    ) -> GroupResult:
        refs = items if isinstance(items, list) else list(items)
        if all(x.__class__ is int for x in refs):  # CommitLog offsets: found or not, no more
            found = self._lookup(refs, tuple(expect or ()))  # type: ignore[arg-type]
            rejected = (
                {} if None not in found
                else {off: EndTxStatus.NOT_FOUND for off, h in zip(refs, found, strict=True) if h is None}
            )  # fmt: skip
        else:
            refs = [
                x if isinstance(x, HalfRef) else HalfRef(*x) if isinstance(x, tuple) else int(x)
                for x in refs
            ]
            offs = [r if isinstance(r, int) else r.commitlog_offset for r in refs]  # type: ignore[union-attr]
            found = self._lookup(offs, tuple(expect or ()))
            rejected = {}
            for ref, h in zip(refs, found, strict=True):
                off = ref if isinstance(ref, int) else ref.commitlog_offset
                bad = EndTxStatus.NOT_FOUND if h is None else None
                if h is not None and not isinstance(ref, int):
                    bad = _mismatch(h, ref.queue_offset, ref.producer_group, ref.transaction_id)
                if bad is not None:
                    rejected[off] = bad
        if expect:
            wanted = tuple(expect.items())
            for h in found:
                if h is not None and any(h.prop(k) != v for k, v in wanted):
                    rejected[h.phys] = EndTxStatus.PRODUCER_GROUP_MISMATCH
        # as end_transaction: how a half this old ended may be forgotten by now, so a commit of it
        # is refused (the whole group: it is atomic); a rollback ends the others
        oldest = self.clock.now_ms() - self.file_reserved_ms
        expired = {}
        for h in found:
            stored = None if h is None else h.store_timestamp_ms
            if stored is not None and stored < oldest:
                expired[h.phys] = EndTxStatus.EXPIRED  # type: ignore[union-attr]
        if expired and (rejected or act is TransactionAction.COMMIT):
            rejected = {**expired, **rejected}
        if rejected:
            return GroupResult(next(iter(rejected.values())), rejected=rejected)
        if expired:
            found = [h for h in found if h.phys not in expired]  # type: ignore[union-attr]
            if not found:
                return GroupResult(EndTxStatus.EXPIRED, rejected=expired)
            r = self.end_halves(found, act)  # type: ignore[arg-type]
            r.rejected = {**expired, **r.rejected}
            return r
        if not found:
            return GroupResult(EndTxStatus.SUCCESS)
        return self.end_halves(found, act)  # type: ignore[arg-type]

    def end_halves(self, halves: list[Half], act: TransactionAction) -> GroupResult:
        """Write the end of ``halves`` (validated) as one append; a rollback skips ended ones."""
        return GroupResult(*self._end(halves, act))

    def _end(
        self, halves: list[Half], act: TransactionAction
    ) -> tuple[EndTxStatus, PutResult | None, list[str], dict[int, EndTxStatus]]:
        """:meth:`end_halves` as (status, put, transaction ids ended, rejected)."""
        if len(halves) == 1:
            return self._end_one(halves[0], act)
        rejected: dict[int, EndTxStatus] = {}
        commit = act is TransactionAction.COMMIT
        with self._lock:
            state, inflight = self._state, self._inflight
            ran = self._runs.states_of(
                np.fromiter((h.phys for h in halves), dtype=np.int64, count=len(halves))
            )
            by_txn: dict[str, Half] = {}  # the first half of each transaction (copies alike)
            for k, h in enumerate(halves):
                if h.txn_id not in by_txn:
                    by_txn[h.txn_id] = h
                    if h.txn_id in inflight:
                        rejected[h.phys] = EndTxStatus.IN_PROGRESS
                    elif h.txn_id in state:
                        rejected[h.phys] = _ALREADY[state[h.txn_id]]
                    elif ran is not None and (st := ran[k]) is not None:
                        rejected[h.phys] = _ALREADY[st]
            if rejected:
                todo = [h for h in by_txn.values() if h.phys not in rejected]
                ids = [h.txn_id for h in todo]
            else:
                todo, ids = list(by_txn.values()), list(by_txn)
            if rejected and (commit or not todo):
                return _summary(rejected.values(), bool(todo)), None, [], rejected
            inflight.update(ids)
        put: PutResult | None = None
        try:
            rows = [self._op_row([h.queue_offset for h in todo], act, len(todo) if commit else 0)]
            patched = self._patched_reals(todo) if commit else None
            if commit and patched is None:
                self._add_reals(todo, rows)
            put = self._put(rows, patched)
        finally:
            with self._lock:
                inflight.difference_update(ids)
                if put is not None and put.append is not None:
                    ended = TxnState.COMMITTED if commit else TxnState.ROLLED_BACK
                    self._state.update(dict.fromkeys(ids, ended))  # (a new dict if trimmed)
        with self._cache_lock:
            pop = self._cache.pop
            for h in todo:
                pop(h.phys, None)
        status = EndTxStatus.SUCCESS if put.ok else EndTxStatus.FLUSH_DISK_TIMEOUT
        return status, put, ids, rejected

    def _end_one(
        self, h: Half, act: TransactionAction
    ) -> tuple[EndTxStatus, PutResult | None, list[str], dict[int, EndTxStatus]]:
        """:meth:`_end` of one half (what EndTransaction asks): no grouping to do."""
        tid = h.txn_id
        commit = act is TransactionAction.COMMIT
        with self._lock:
            done = self._state.get(tid) or self._runs.state_of(h.phys)
            if done is not None or tid in self._inflight:
                why = EndTxStatus.IN_PROGRESS if done is None else _ALREADY[done]
                return why, None, [], {h.phys: why}
            self._inflight.add(tid)
        put: PutResult | None = None
        try:
            rows = [self._op_row([h.queue_offset], act, 1 if commit else 0)]
            if commit:
                self._add_reals([h], rows)
            put = self._put(rows)
        finally:
            with self._lock:
                self._inflight.discard(tid)
                if put is not None and put.append is not None:
                    self._state[tid] = TxnState.COMMITTED if commit else TxnState.ROLLED_BACK
        self._cache.pop(h.phys, None)  # one call on the C OrderedDict: no lock needed
        return (EndTxStatus.SUCCESS if put.ok else EndTxStatus.FLUSH_DISK_TIMEOUT), put, [tid], {}

    def _op_row(
        self, half_offsets: list[int], act: TransactionAction, reals: int, own: bool = False
    ) -> Row:
        """The op message of ``half_offsets`` (``reals``: the real messages written after it;
        ``own``: halves their caller stored itself, which a restart remembers by offset)."""
        if len(half_offsets) == 1:  # a few bytes: no limit to check
            body = f"{half_offsets[0]}{C.OFFSET_SEPARATOR}".encode()
            limit = OP_BODY_MAX_BYTES
        else:
            body = (C.OFFSET_SEPARATOR.join(map(str, half_offsets)) + C.OFFSET_SEPARATOR).encode()
            limit = max(OP_BODY_MAX_BYTES, self.store.config.body_max_bytes)
        if len(body) > limit:
            raise MessageIllegalError(
                f"a group of {len(half_offsets)} halves needs a {len(body)}-byte op message; "
                f"the limit is {limit} bytes: commit smaller groups"
            )
        known = _OP_PROPS.get((act, reals, own))
        if known is None:
            props = {L.P_TAGS: C.REMOVE_TAG, P_OP_ACTION: act.value}
            if reals:
                props[P_OP_GROUP] = str(reals)
            if own:
                props[C.P_OP_OWN] = "true"
            known = (props, encode_properties(props))
            if len(_OP_PROPS) < 1024:
                _OP_PROPS[(act, reals, own)] = known
        props, enc = known
        now = self.clock.now_ms()
        return (
            L.TRANS_OP_HALF_TOPIC,
            0,
            body,
            dict(props),
            enc,
            _REMOVE_CODE,
            0,
            0,
            now,
            _HOST,
            0,
            0,
            0,
        )

    def _patched_reals(self, todo: list[Half]) -> EncodedBatch | None:
        """The real messages of a large group of halves no longer in memory, made from their
        bytes (one vectorized pass: :func:`~rmq_spark.services.redelivery.rewrite.encode_commits`), or None
        for the general path (halves prepared moments ago: their records are at hand)."""
        hooked = self._hooked()
        last, _PARSED.last = getattr(_PARSED, "last", None), None
        if len(todo) < PATCH_COMMIT_MIN or hooked is None or all(h.row is not None for h in todo):
            return None
        cq = self.store.consume_queue(L.TRANS_HALF_TOPIC, 0)
        if cq is None:
            return None
        qoffs = np.fromiter((h.queue_offset for h in todo), dtype=np.int64, count=len(todo))
        phys = np.fromiter((h.phys for h in todo), dtype=np.int64, count=len(todo))
        if last is not None and np.array_equal(last[0], phys):  # parsed by the lookup just now
            return encode_commits(self.store, phys, None, hooked, parsed=last[1])
        lo = int(qoffs.min())
        units = cq.units(lo, int(qoffs.max()) + 1)
        if len(units) != int(qoffs.max()) + 1 - lo or (units["offset"][qoffs - lo] != phys).any():
            return None  # a half not where its queue says: the general path reads it
        return encode_commits(self.store, phys, units["size"][qoffs - lo], hooked)

    def _add_reals(self, todo: list[Half], rows: list[Row]) -> None:
        """Append the records of the real messages of ``todo``, after the delivery hook: those
        built at prepare as they are, a message the hook replaced checked and encoded as
        ``store.put_messages`` would."""
        hook = self.real_message_hook
        only_on = self.hook_only_on
        queues: dict[str, int] = {}
        for h in todo:
            row = h.real_row()
            if hook is not None and (only_on is None or not row[3].keys().isdisjoint(only_on)):
                m = message_of(row)
                out = hook(m)
                if out is not m:
                    row = self._row_of(out, h.txn_id)
            topic, qid = row[0], row[1]
            n = queues.get(topic)
            if n is None:
                cfg = self.store.topics.topics.get(topic) or self.store.topics.get_or_create(topic)
                n = queues[topic] = max(cfg.write_queue_nums, cfg.read_queue_nums)
            if not 0 <= qid < n:
                raise MessageIllegalError(
                    f"queueId {qid} is out of range for topic {topic!r} ({n} queues)"
                )
            rows.append(row)

    def _row_of(self, m: Message, uniq: str) -> Row:
        """The record of a message a delivery hook made (checked as ``store.put_messages``)."""
        check_topic(m.topic, allow_system=True)
        check_body(m.body, self.store.config.body_max_bytes)
        if not m.properties.get(L.P_UNIQ_KEY):
            m.properties[L.P_UNIQ_KEY] = uniq or new_uniq_ids(1)[0]
        p = m.properties
        return (
            m.topic,
            m.queue_id,
            bytes(m.body),
            p,
            encode_properties(p),
            tags_code(p.get(L.P_TAGS)),
            m.flag,
            m.sys_flag,
            m.born_timestamp_ms or self.clock.now_ms(),
            m.born_host,
            m.born_port,
            m.reconsume_times,
            m.prepared_transaction_offset,
        )

    def real_message(self, h: Half) -> Message:
        """The message a commit of ``h`` stores in its real topic."""
        real = message_of(h.real_row())
        real.properties = dict(real.properties)
        return self.real_message_hook(real) if self.real_message_hook is not None else real

    # --- check-back ----------------------------------------------------------------------------------
    def set_checker(self, checker: TransactionChecker | None) -> None:
        self.checker = checker

    def register_resolver(
        self, producer_group_or_prefix: str, fn: Callable[[MessageExt], Any], wait: bool = False
    ) -> None:
        """``fn(half) -> COMMIT | ROLLBACK | UNKNOWN`` (a TransactionAction, an enum with those
        names, or a string) decides the halves of matching producer groups during the check,
        synchronously, instead of the checker: exact name first, then the longest prefix.
        ``wait``: an UNKNOWN ends the round at that half (asked again next round) instead of
        putting a copy of it back, for a resolver whose UNKNOWN means "its producer is still
        writing": a large batch in flight is then not copied half by half."""
        self.resolvers[producer_group_or_prefix] = fn
        if wait:
            self.waiting_resolvers.add(producer_group_or_prefix)
        else:
            self.waiting_resolvers.discard(producer_group_or_prefix)

    def unregister_resolver(self, producer_group_or_prefix: str) -> None:
        self.resolvers.pop(producer_group_or_prefix, None)
        self.waiting_resolvers.discard(producer_group_or_prefix)

    def resolver_for(self, group: str) -> Callable[[MessageExt], Any] | None:
        return self._resolver(group)[1]

    def _resolver(self, group: str) -> tuple[str | None, Callable[[MessageExt], Any] | None]:
        if group in self.resolvers:
            return group, self.resolvers[group]
        keys = [k for k in list(self.resolvers) if group.startswith(k)]
        key = max(keys, key=len) if keys else None
        return key, (self.resolvers[key] if key is not None else None)

    def resolver_waits(self, group: str) -> bool:
        """Does the resolver of ``group`` end a check round with its UNKNOWN?"""
        return self._resolver(group)[0] in self.waiting_resolvers

    def check_once(self) -> CheckReport:
        """One check round (what the thread does every interval); tests drive it directly."""
        with self._check_lock:
            self._forget_old_ends(self.clock.now_ms())
            return C.run_check(self)

    def _forget_old_ends(self, now_ms: int) -> None:
        """Drop how transactions ended from before the file reserved time (as RocketMQ, whose
        check discards such halves): the state stays as large as the ends of that time.  A half
        stored longer ago than that is refused (EXPIRED) rather than found pending."""
        checked = self.store.offsets.query(C.CHECK_GROUP, L.TRANS_HALF_TOPIC, 0)
        self._runs.forget(checked, now_ms - self.file_reserved_ms)
        with self._lock:
            self._ended_marks.append((now_ms, len(self._state) + self._forgotten))
            upto = self._forgotten
            while self._ended_marks and self._ended_marks[0][0] < now_ms - self.file_reserved_ms:
                upto = self._ended_marks.popleft()[1]
            if upto > self._forgotten:
                self._state = dict(islice(self._state.items(), upto - self._forgotten, None))
                self._forgotten = upto

    tick = check_once

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # --- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="TransactionCheck", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check_once()
            except Exception:  # keep checking: the next round starts from the committed offsets
                log.exception("transaction check round failed")

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    crash = shutdown  # nothing to flush: the op queue and the check offsets are the state


def _delayed(msg: Message) -> bool:
    raw = msg.properties.get(L.P_DELAY, "")
    return raw.isdigit() and int(raw) > 0


def _mismatch(
    h: Half, queue_offset: int | None, producer_group: str | None, transaction_id: str | None
) -> EndTxStatus | None:
    """checkPrepareMessage: producer group, tranStateTableOffset, (transaction id); None when
    not given."""
    if producer_group is not None and h.properties.get(L.P_PGROUP, "") != producer_group:
        return EndTxStatus.PRODUCER_GROUP_MISMATCH
    if queue_offset is not None and int(queue_offset) != h.queue_offset:
        return EndTxStatus.QUEUE_OFFSET_MISMATCH
    if transaction_id and transaction_id != h.txn_id:
        return EndTxStatus.TRANSACTION_ID_MISMATCH
    return None


def _summary(statuses: Iterable[EndTxStatus], some_pending: bool) -> EndTxStatus:
    """One status for a rejected group: IN_PROGRESS if another end is being written, the common
    status when none is pending (ALREADY_COMMITTED: a retried group), else CONFLICT."""
    seen = set(statuses)
    if EndTxStatus.IN_PROGRESS in seen:
        return EndTxStatus.IN_PROGRESS
    if len(seen) == 1 and not some_pending:
        return seen.pop()
    return EndTxStatus.CONFLICT
