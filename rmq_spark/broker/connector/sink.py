"""The broker side of the Spark sink: rows in, messages stored; exactly-once commits.

``send`` stores one Arrow table of rows with ONE put (``core.send``), as plain messages
(at-least-once) or as transactional half messages tagged with the sink key
``<queryId>|<batchId>|<attempt>`` (exactly-once); it returns the halves' CommitLog offsets.

``commit_batch`` follows ``docs/semantics.md`` section 1, under one lock (an abort of an attempt
whose commit record is written finishes its commit instead: a batch is never left in part):

1. a commit record for (query, batch) exists -> this is a replay: roll back this attempt's
   halves (``ALREADY_COMMITTED``);
2. this attempt was given up (an abort record exists: rolled back by an abort or by the
   check-back) -> fail, so Spark replays the batch with a fresh attempt;
3. otherwise write the commit record durably and answer ``COMMITTED``: the batch is committed
   from that moment (the commit point, as Kafka's transaction coordinator answers EndTxn once
   PREPARE_COMMIT is in its log).  The group commit that makes every half of the attempt visible
   at once runs next on the sink's committer thread, one batch after another in the order of
   their commit records, while Spark goes on with the next micro-batch; a crash before it ends
   leaves the halves to the check-back, which commits them from the record.  The connector's
   offsets (what a Spark read plans from) wait for the group commits of the batches committed
   before it asked, so a read after a write sees the write.

Only this service ends the sink's halves, and it writes an abort record before it rolls any
half of an attempt back, so an attempt without one has all its halves pending: step 3 needs no
per-half check.  Halves whose producer died are decided by the resolver registered with the
transaction service: commit iff a commit record of the *same attempt* exists; otherwise roll
back (abort record first) when another attempt committed the batch or the attempt has sent
nothing for ``ATTEMPT_IDLE_MS``; a live attempt still writing a long batch, or one whose group
commit is queued or running, gets UNKNOWN, so the check-back asks again later.

Why this module is long: the exactly-once commit protocol (commit record, abort record, the check-
back's resolver, the committer's order) runs under one lock over one set of records; split, its
invariants would be spread over files.
"""

from __future__ import annotations

import base64
import itertools
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq_spark.access.rules import P_SINK_KEY, SendLimits, check_rows
from rmq_spark.broker.access import Use, topic_name
from rmq_spark.broker.connector import protocol as P
from rmq_spark.broker.connector.committer import VISIBLE_WAIT_S, GroupCommit, GroupCommitter
from rmq_spark.broker.connector.ledger import HalfLedger, Outcome
from rmq_spark.broker.connector.sinklog import SinkCommitLog
from rmq_spark.errors import MessageIllegalError, PermissionDeniedError, StoreError
from rmq_spark.services.transaction.states import TransactionAction
from rmq_spark.store import layout as L
from rmq_spark.store.dispatch import group_by_queue
from rmq_spark.store.encoded import EncodedBatch
from rmq_spark.store.hashing import java_string_hash
from rmq_spark.store.message import Message
from rmq_spark.store.rowprops import RowProperties, row_properties

SINK_PRODUCER_GROUP = "rmq-spark-sink"
ATTEMPT_IDLE_MS = 300_000  # an attempt silent this long, and not committed, is given up
REALS_MAX_BYTES = (
    512 << 20
)  # real messages kept for commits in flight (beyond: parsed at the commit)
ROW_COLUMNS = (
    "topic",
    "body",
    "tags",
    "keys",
    "properties",
    "delayLevel",
    "deliverTimeMs",
    "messageGroup",
    "queueId",
)


def _binary_bodies(table: pa.Table) -> pa.Table:
    """The rows with their bodies as binary (a string column is cast: its UTF-8 bytes); a body
    column of another type is refused, naming it."""
    body = table.column("body")
    if pa.types.is_binary(body.type) or pa.types.is_large_binary(body.type):
        return table
    if pa.types.is_string(body.type) or pa.types.is_large_string(body.type):
        return table.set_column(
            table.schema.get_field_index("body"), "body", body.cast(pa.binary())
        )
    raise MessageIllegalError(f"row column 'body' must be binary or string, not {body.type}")


def _one_topic(distinct: pa.Array) -> str | None:
    """The topic of all the rows when they have one (else None), from the column's distinct
    values (``pc.unique``, found once per Send), without a string per row."""
    return distinct[0].as_py() if len(distinct) == 1 and distinct.null_count == 0 else None


def sink_key(query_id: str, batch_id: int, attempt: str) -> str:
    return f"{query_id}|{batch_id}|{attempt}"


def parse_sink_key(key: str) -> tuple[str, int, str] | None:
    parts = key.split("|")
    if len(parts) != 3 or not parts[1].lstrip("-").isdigit():
        return None
    return parts[0], int(parts[1]), parts[2]


def encode_offsets(offsets: np.ndarray) -> str:
    return base64.b64encode(np.asarray(offsets, dtype="<i8").tobytes()).decode("ascii")


def decode_offsets(parts: list[str]) -> list[int]:
    arrays = [np.frombuffer(base64.b64decode(p), dtype="<i8") for p in parts if p]
    return np.concatenate(arrays).tolist() if arrays else []


class SinkService:
    def __init__(self, core) -> None:  # type: ignore[no-untyped-def]
        self.core = core
        self.store = core.store
        self.commits = SinkCommitLog(core.store)
        self.ledger = HalfLedger(core) if getattr(core, "transactions", None) is not None else None
        self._lock = threading.RLock()
        self._last_send_ms: dict[str, int] = {}  # attempt -> (broker clock) time of its last send
        # attempt -> CommitLog offsets of the halves this process stored for it (see _own_sent)
        self._sent: dict[str, list[np.ndarray]] = {}
        # attempt -> the real messages of its halves, encoded when they were stored (offsets,
        # queue offsets, ids, records); an attempt with a half stored otherwise is in _unencoded
        self._reals: dict[str, list[tuple[np.ndarray, list[int], Sequence[str], EncodedBatch]]] = {}
        self._unencoded: set[str] = set()
        self._reals_bytes = 0
        self._rr = itertools.count()
        # the group commits of committed batches, in commit order (see the module docstring)
        self.committer = GroupCommitter(self._group_commit)
        if self.ledger is not None:
            self.ledger.register_resolver(SINK_PRODUCER_GROUP, self.resolve)

    @property
    def transactions_available(self) -> bool:
        return self.ledger is not None

    def _halves(self) -> HalfLedger:
        if self.ledger is None:
            raise StoreError(
                "this broker has no transaction service: write with transactional=false"
            )
        return self.ledger

    # --- send ----------------------------------------------------------------------------------------------
    def limits(self) -> SendLimits:
        """The rules rows are checked against here, with this broker's clock."""
        timer = getattr(self.core, "timer", None)
        return SendLimits(
            body_max_bytes=self.store.config.body_max_bytes,
            max_delay_ms=int(timer.max_delay_ms) if timer is not None else None,
            now_ms=self.core.clock.now_ms(),
        )

    def send(self, header: P.SendHeader, table: pa.Table | None) -> P.SendResponse:
        """Store the rows of one Send -- every row checked first (``check_rows``: the rules of
        SendMessage), so a bad row stores none of them."""
        limits = self.limits()
        if table is None or table.num_rows == 0:
            return P.SendResponse(count=0, offsets="", limits=limits.to_json())
        mode = header.mode
        if mode not in ("normal", "half"):
            raise MessageIllegalError(f"send mode must be 'normal' or 'half', not {mode!r}")
        unknown = set(table.column_names) - set(ROW_COLUMNS)
        if unknown:
            raise MessageIllegalError(f"unknown row columns {sorted(unknown)}")
        if "topic" not in table.column_names or "body" not in table.column_names:
            raise MessageIllegalError("a Send needs the row columns 'topic' and 'body'")
        table = _binary_bodies(table.combine_chunks())
        n = table.num_rows
        distinct = pc.unique(table.column("topic"))
        check_rows(table, limits, where=" of this send", distinct_topics=distinct)
        for t in distinct.to_pylist():
            topic_name(t, Use.WRITE)  # no retry, DLQ or system topic, as for any producer
        topic = _one_topic(distinct)
        qids = self._queues(table, topic)
        plain = self._plain(table)
        if mode == "normal" and plain:
            return self._send_plain(table, qids, topic)
        if mode == "normal" and self._columnar(table):
            return self._send_rows(table, qids, topic)
        key = None
        if mode == "half":
            query_id, batch_id, attempt = header.sink_attempt()
            key = sink_key(query_id, batch_id, attempt)
            with self._lock:
                if self.commits.aborted(attempt):
                    raise StoreError(
                        f"sink attempt {attempt} was rolled back; the batch will be replayed"
                    )
                self._last_send_ms[attempt] = self.core.clock.now_ms()
            if plain or self._columnar(table):
                props = None if plain else self._row_properties(table, key)
                return self._send_plain_halves(table, qids, topic, key, props)
        msgs = self._messages(table, qids, key)
        if mode == "half":
            result = self._halves().put_halves(msgs, SINK_PRODUCER_GROUP)
        else:
            result = self.core.send(msgs)
        if not result.ok or result.append is None:
            raise StoreError(f"storing {n} rows failed: {result.status.value}")
        if mode != "half":
            return P.SendResponse(count=n, offsets="")
        phys = np.asarray(result.append.phys_offsets, dtype=np.int64)
        self._remember(header.sink_attempt()[2], phys)
        return P.SendResponse(count=n, offsets=encode_offsets(phys))

    def _remember(self, attempt: str, phys: np.ndarray) -> None:
        with self._lock:
            self._sent.setdefault(attempt, []).append(phys)

    def _keep_reals(self, attempt: str, result: Any, reals: EncodedBatch | None) -> None:
        """Keep the real messages of halves just stored for the commit (up to REALS_MAX_BYTES in
        all: beyond, and for halves stored without them, the commit parses the halves)."""
        with self._lock:
            if (
                reals is None
                or attempt in self._unencoded
                or self._reals_bytes + len(reals.buf) > REALS_MAX_BYTES
            ):
                self._unencoded.add(attempt)
                self._reals_bytes -= sum(len(r[3].buf) for r in self._reals.pop(attempt, ()))
                return
            a = result.append
            phys = np.asarray(a.phys_offsets, dtype=np.int64)
            ids = cast(
                Sequence[str], reals.uniq_keys
            )  # halves made for the commit: each has its id
            self._reals.setdefault(attempt, []).append((phys, a.queue_list(), ids, reals))
            self._reals_bytes += len(reals.buf)

    def _encoded_commit(
        self, attempt: str, halves: list[int]
    ) -> tuple[list[int], list[str], list[EncodedBatch]] | None:
        """The kept real messages of exactly the halves ``halves`` (queue offsets, ids, records in
        parts: the commit joins them to its op message in one copy), or None."""
        kept = self._reals.get(attempt)
        if not kept or attempt in self._unencoded:
            return None
        phys = np.concatenate([k[0] for k in kept])
        if len(phys) != len(halves) or not np.array_equal(
            np.sort(phys), np.sort(np.asarray(halves, dtype=np.int64))
        ):
            return None
        qoffs = list(itertools.chain.from_iterable(k[1] for k in kept))
        ids = list(itertools.chain.from_iterable(k[2] for k in kept))
        return qoffs, ids, [k[3] for k in kept]

    @staticmethod
    def _plain(table: pa.Table) -> bool:
        """Only bodies for topics/queues: the columnar put path applies."""
        for name in table.column_names:
            if name in ("topic", "body", "queueId"):
                continue
            if table.column(name).null_count != table.num_rows:
                return False
        return True

    @staticmethod
    def _columnar(table: pa.Table) -> bool:
        """No delayed or timed row (those go through the schedule and timer services one by
        one): every property is encoded column-wise (:mod:`rmq_spark.store.rowprops`)."""
        for name in ("delayLevel", "deliverTimeMs"):
            if name in table.column_names:
                col = table.column(name)
                if name == "delayLevel":
                    if col.null_count < len(col) and pc.any(pc.greater(col, 0)).as_py():
                        return False
                elif col.null_count < len(col):
                    return False
        return True

    @staticmethod
    def _row_properties(table: pa.Table, key: str | None) -> RowProperties:
        """Each row's properties, column-wise: its user properties, TAGS, KEYS, its message group
        (SHARDING_KEY), then the sink key of a half."""
        names = set(table.column_names)

        def col(name: str) -> pa.Array | None:
            return table.column(name).combine_chunks() if name in names else None

        named = {
            L.P_TAGS: col("tags"),
            L.P_KEYS: col("keys"),
            L.P_SHARDING_KEY: col("messageGroup"),
        }
        return row_properties(table.num_rows, properties=col("properties"), named=named,
                              shared={P_SINK_KEY: key} if key is not None else None)  # fmt: skip

    def _send_rows(self, table: pa.Table, qids: np.ndarray, topic: str | None) -> P.SendResponse:
        """Rows with their own properties, a column-wise write per queue."""
        props = self._row_properties(table, None)
        n = 0
        for t, q, part, idx in self._by_queue(table, qids, topic):
            result = self.store.put_bodies(
                t, q, part, props.take(idx) if len(idx) != len(props) else props
            )
            if not result.ok:
                raise StoreError(
                    f"storing {len(part)} rows into {t}/{q} failed: {result.status.value}"
                )
            n += len(part)
        return P.SendResponse(count=n, offsets="")

    @staticmethod
    def _by_queue(
        table: pa.Table, qids: np.ndarray, topic: str | None
    ) -> Iterator[tuple[str, int, pa.Array, np.ndarray]]:
        """The bodies of the rows per (topic, queue) as Arrow columns, and the rows' indexes
        (``topic``: the rows' one topic, None when they have several)."""
        bodies = table.column("body").combine_chunks()
        groups: Iterable[tuple[tuple[str, int], np.ndarray]]
        if topic is None:
            groups = group_by_queue(table.column("topic").to_pylist(), qids).items()
        else:
            groups = (((topic, q), np.flatnonzero(qids == q)) for q in np.unique(qids).tolist())
        for (t, q), idx in groups:
            yield t, q, bodies if len(idx) == len(bodies) else bodies.take(idx), idx

    def _send_plain(self, table: pa.Table, qids: np.ndarray, topic: str | None) -> P.SendResponse:
        n = 0
        for t, q, part, _idx in self._by_queue(table, qids, topic):
            result = self.store.put_bodies(t, q, part)
            if not result.ok:
                raise StoreError(
                    f"storing {len(part)} rows into {t}/{q} failed: {result.status.value}"
                )
            n += len(part)
        return P.SendResponse(count=n, offsets="")

    def _send_plain_halves(
        self,
        table: pa.Table,
        qids: np.ndarray,
        topic: str | None,
        key: str,
        props: RowProperties | None = None,
    ) -> P.SendResponse:
        """Rows as halves, a column-wise write per queue: bodies only (``props`` None), or each row
        with its own properties (``props``, the sink key among them)."""
        n, offsets = 0, []
        attempt = key.rsplit("|", 1)[1]
        for t, q, part, idx in self._by_queue(table, qids, topic):
            shared: dict[str, str] | RowProperties = {P_SINK_KEY: key}
            if props is not None:
                shared = props.take(idx) if len(idx) != len(props) else props
            result, reals = self._halves().put_half_bodies_for_commit(
                t, q, part, shared, SINK_PRODUCER_GROUP
            )
            if not result.ok or result.append is None:
                raise StoreError(
                    f"storing {len(part)} rows into {t}/{q} failed: {result.status.value}"
                )
            offsets.append(result.append.phys_offsets)
            n += len(part)
            self._keep_reals(attempt, result, reals)
        phys = np.concatenate(offsets).astype(np.int64)
        self._remember(attempt, phys)
        return P.SendResponse(count=n, offsets=encode_offsets(phys))

    def _queues(self, table: pa.Table, topic: str | None) -> np.ndarray:
        """Queue of every row: ``queueId`` if set, else a hash of ``messageGroup`` (same group ->
        same queue, in order), else round robin (``topic``: the rows' one topic, or None)."""
        n = table.num_rows
        topics = [topic] * n if topic is not None else table.column("topic").to_pylist()
        distinct = [topic] if topic is not None else list(dict.fromkeys(topics))
        nq = {t: max(1, self.store.topics.get_or_create(t).write_queue_nums) for t in distinct}
        if len(distinct) == 1:
            nqs = np.full(n, nq[distinct[0]], dtype=np.int64)
        else:
            nqs = np.array([nq[t] for t in topics], dtype=np.int64)
        base = next(self._rr) * 7919  # round robin, a new starting queue per call
        out = (base + np.arange(n, dtype=np.int64)) % nqs
        if "messageGroup" in table.column_names:
            groups = table.column("messageGroup").to_pylist()
            for i, g in enumerate(groups):
                if g is not None:
                    out[i] = abs(java_string_hash(g)) % nqs[i]
        if "queueId" in table.column_names:
            col = table.column("queueId")
            if col.null_count < n:
                given = col.to_numpy(zero_copy_only=False)
                mask = ~pc.is_null(col).to_numpy(zero_copy_only=False)
                vals = np.where(mask, np.nan_to_num(given.astype(float), nan=0).astype(np.int64), 0)
                bad = mask & ((vals < 0) | (vals >= nqs))
                if bad.any():
                    i = int(np.flatnonzero(bad)[0])
                    raise MessageIllegalError(
                        f"queueId {int(vals[i])} is out of range for topic {topics[i]!r} ({int(nqs[i])} queues)"
                    )
                out = np.where(mask, vals, out)
        return out

    def _messages(self, table: pa.Table, qids: np.ndarray, key: str | None) -> list[Message]:
        n = table.num_rows
        names = set(table.column_names)

        def col(name: str) -> list[Any]:
            return table.column(name).to_pylist() if name in names else [None] * n

        topics, bodies = col("topic"), col("body")
        tags, keys, props = col("tags"), col("keys"), col("properties")
        delays, deliver, groups = col("delayLevel"), col("deliverTimeMs"), col("messageGroup")
        qlist = qids.tolist()
        out = []
        for i in range(n):
            p: dict[str, str] = {}
            if props[i]:  # keys checked (check_rows): none reserved
                p.update((k, v) for k, v in props[i] if v is not None)
            if tags[i]:
                p[L.P_TAGS] = tags[i]
            if keys[i]:
                p[L.P_KEYS] = keys[i]
            if delays[i] is not None and delays[i] > 0:
                p[L.P_DELAY] = str(delays[i])
            if deliver[i] is not None:
                p[L.P_TIMER_DELIVER_MS] = str(deliver[i])
            if groups[i] is not None:
                p[L.P_SHARDING_KEY] = groups[i]
            if key is not None:
                p[P_SINK_KEY] = key
            out.append(Message(topics[i], bodies[i], p, queue_id=qlist[i]))
        return out

    # --- commit / abort --------------------------------------------------------------------------------------
    @staticmethod
    def _own(query_id: str, batch_id: int, attempt: str) -> dict[str, str]:
        """What every half of one attempt carries: a request names its halves by offset, so only
        halves with these are ended (never another attempt's, or a transaction of a client)."""
        return {L.P_PGROUP: SINK_PRODUCER_GROUP, P_SINK_KEY: sink_key(query_id, batch_id, attempt)}

    def _own_sent(self, attempt: str, halves: list[int]) -> tuple[bool, list[int]]:
        """Did this process store every half of ``halves`` for ``attempt`` (then they are the
        attempt's own, by construction: nothing needs reading back to check it)?  And the halves
        it stored for the attempt that ``halves`` leaves out: those of a task attempt that failed
        after sending (Spark ran the task again), to be rolled back before the batch commits."""
        sent = self._sent.get(attempt)
        if not sent:
            return False, []
        mine = np.concatenate(sent)
        if len(mine) > 1 and not (mine[1:] > mine[:-1]).all():  # one task's appends ascend
            mine = np.sort(mine)  # (offsets of records: no two alike)
        asked = np.asarray(halves, dtype=np.int64)
        at = np.searchsorted(mine, asked)
        if len(asked) and (at.max() >= len(mine) or (mine[at] != asked).any()):
            return False, []
        stray = np.ones(len(mine), dtype=bool)
        stray[at] = False
        return True, mine[stray].tolist()

    def commit_batch(
        self, query_id: str, batch_id: int, attempt: str, offsets: list[str]
    ) -> P.CommitBatchResponse:
        halves = decode_offsets(offsets)
        own = self._own(query_id, batch_id, attempt)
        with self._lock:
            committed = self.commits.lookup(query_id, batch_id)
            if committed is not None:
                if halves and committed != attempt:
                    self._halves().rollback(halves, own)
                self._forget(attempt)
                return P.CommitBatchResponse(
                    outcome=Outcome.ALREADY_COMMITTED.value, attempt=committed
                )
            if self.commits.aborted(attempt):
                raise StoreError(
                    f"sink attempt {attempt} of batch {batch_id} was rolled back before its commit; "
                    "restart the query to replay the batch"
                )
            known, stray = self._own_sent(attempt, halves)
            if halves and not known:
                self._halves().check_own(
                    halves, own
                )  # before the commit record: a refusal changes nothing
            if (
                stray
            ):  # before the commit record, or the check-back would commit them with the batch
                self._halves().rollback(stray, own)
            encoded = self._encoded_commit(attempt, halves) if known and not stray else None
            if halves and self.committer.closed:
                raise StoreError("the broker is stopping: the batch will be replayed")
            self.commits.record(query_id, batch_id, attempt, self.core.clock.now_ms())
            if halves:
                phys = (
                    np.concatenate([k[0] for k in self._reals[attempt]])
                    if encoded is not None
                    else None
                )
                self.committer.enqueue(
                    GroupCommit(attempt, batch_id, halves, None if known else own, phys, encoded)
                )
            self._forget(attempt)
        return P.CommitBatchResponse(outcome=Outcome.COMMITTED.value, attempt=attempt)

    def _group_commit(self, job: GroupCommit) -> None:
        ledger = self._halves()
        if job.encoded is not None:
            ledger.commit_encoded(job.phys.tolist(), *job.encoded)  # type: ignore[union-attr]
        else:
            ledger.commit_group(job.halves, job.expect)

    def wait_visible(self, timeout_s: float = VISIBLE_WAIT_S) -> None:
        """Wait until the group commits of every batch committed so far are done."""
        self.committer.wait_visible(timeout_s)

    def close(self) -> None:
        """Finish the group commits queued so far (a clean stop) and take no more."""
        self.committer.close()

    def _forget(self, attempt: str) -> None:
        self._last_send_ms.pop(attempt, None)
        self._sent.pop(attempt, None)
        self._unencoded.discard(attempt)
        self._reals_bytes -= sum(len(r[3].buf) for r in self._reals.pop(attempt, ()))

    def abort_batch(
        self, query_id: str, batch_id: int, attempt: str, offsets: list[str]
    ) -> P.AbortBatchResponse:
        halves = decode_offsets(offsets)
        own = self._own(query_id, batch_id, attempt)
        with self._lock:
            if self.commits.lookup(query_id, batch_id) == attempt:
                # the commit record is written, so the batch IS committed: a commit that failed
                # after it (Spark aborts then) is finished here, never left in part
                job = self.committer.wait_committed(attempt)
                if job is not None and job.error is None:
                    return P.AbortBatchResponse(rolled_back=0)
                try:
                    if halves:
                        self._halves().commit_group(halves, own)
                except PermissionDeniedError:
                    raise  # halves of another attempt: nothing was ended
                except Exception as e:
                    raise StoreError(
                        f"batch {batch_id} of query {query_id} is recorded as committed (attempt {attempt}) but "
                        f"its messages could not be committed yet: {e}; the broker's check-back commits them"
                    ) from e
                self._forget(attempt)
                return P.AbortBatchResponse(rolled_back=0)
            if halves:
                self._halves().check_own(halves, own)
            self.commits.record_abort(query_id, batch_id, attempt, self.core.clock.now_ms())
            self._forget(attempt)
            if halves:
                self._halves().rollback(halves, own)
        return P.AbortBatchResponse(rolled_back=len(halves))

    def resolve(self, properties: dict[str, str]) -> TransactionAction:
        """The check-back's answer for an orphaned half of the sink."""
        parsed = parse_sink_key(properties.get(P_SINK_KEY, ""))
        if parsed is None:
            return TransactionAction.ROLLBACK
        query_id, batch_id, attempt = parsed
        with self._lock:
            committed = self.commits.lookup(query_id, batch_id)
            if committed == attempt:
                # its group commit is queued or running: ending the half here would race it
                return (
                    TransactionAction.UNKNOWN
                    if self.committer.committing(attempt)
                    else TransactionAction.COMMIT
                )
            last = self._last_send_ms.get(attempt)
            if (
                committed is None
                and last is not None
                and self.core.clock.now_ms() - last < ATTEMPT_IDLE_MS
            ):
                return TransactionAction.UNKNOWN
            self.commits.record_abort(query_id, batch_id, attempt, self.core.clock.now_ms())
            self._forget(attempt)
            return TransactionAction.ROLLBACK
