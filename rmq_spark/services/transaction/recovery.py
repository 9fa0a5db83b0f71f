"""How transactions ended, rebuilt from the op queue when the transaction service starts
(:func:`load_resolved`), and a commit that a crash cut short completed from its op."""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq_spark.services.transaction.check import (
    CHECK_GROUP,
    P_OP_ACTION,
    P_OP_GROUP,
    P_OP_OWN,
    REMOVE_TAG,
    TransactionService,
    half_at,
    op_half_offsets,
)
from rmq_spark.services.transaction.halves import half_of
from rmq_spark.services.transaction.states import TxnState
from rmq_spark.store import layout as L
from rmq_spark.store import record as R
from rmq_spark.store.views import _at

if TYPE_CHECKING:
    from rmq_spark.store.store import MessageStore

log = logging.getLogger(__name__)
_SIZE_MAGIC = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE


# --- the resolved set, on start ----------------------------------------------------------------------------
Run = tuple[
    int, int, np.ndarray, TxnState
]  # as EndedRuns.add takes it: when, highest queue offset, offsets, state


def load_resolved(svc: TransactionService) -> tuple[dict[str, TxnState], list[Run]]:
    """How transactions ended, from the whole op queue (an op names half queue offsets): by
    transaction id (the half names it), and for the groups their caller stored itself (ops marked
    ``TRAN_OP_OWN``, a sink's batches) by the halves' CommitLog offsets, as the running service
    remembers them (:mod:`.runs`: 8 bytes a half, no string), those the check-back has walked
    past left out.  If the last op opened a commit append that a crash cut short, the missing
    real messages are written now: the op holds the decision."""

    store = svc.store
    lo, hi = store.min_offset(L.TRANS_OP_HALF_TOPIC, 0), store.max_offset(L.TRANS_OP_HALF_TOPIC, 0)
    kinds = (TxnState.COMMITTED, TxnState.ROLLED_BACK, TxnState.RESOLVED)
    checked = store.offsets.query(CHECK_GROUP, L.TRANS_HALF_TOPIC, 0)
    halves, codes, runs, last = [], [], [], None
    for start in range(lo, hi, 8192):
        b = store.read_arrow(
            L.TRANS_OP_HALF_TOPIC,
            0,
            start,
            min(hi, start + 8192),
            columns=["tags", "body", "properties", "commitLogOffset", "storeTimestamp"],
        )
        if b.num_rows == 0:
            continue
        props = b.column("properties")
        acts = pc.map_lookup(props, pa.scalar(P_OP_ACTION), "last")
        code = np.full(b.num_rows, 2, dtype=np.int8)
        code[np.asarray(pc.fill_null(pc.equal(acts, "COMMIT"), False))] = 0
        code[np.asarray(pc.fill_null(pc.equal(acts, "ROLLBACK"), False))] = 1
        is_op = np.asarray(pc.fill_null(pc.equal(b.column("tags"), REMOVE_TAG), False))
        own = np.asarray(
            pc.fill_null(pc.equal(pc.map_lookup(props, pa.scalar(P_OP_OWN), "last"), "true"), False)
        )
        offs, rows = op_half_offsets(b.column("body"))
        keep = is_op[rows] & ~own[rows]
        halves.append(offs[keep])
        codes.append(code[rows[keep]])
        if (own & is_op).any():
            stored = b.column("storeTimestamp").cast(pa.int64()).to_numpy() // 1000  # us -> ms
            runs += _own_runs(
                store, offs, rows, np.flatnonzero(own & is_op), stored, code, kinds, checked
            )
        n = b.num_rows - 1
        group = pc.map_lookup(props.slice(n, 1), pa.scalar(P_OP_GROUP), "last")[0].as_py()
        reals = int(group) if code[n] == 0 and group and group.isdigit() else 0
        last = (int(b.column("commitLogOffset")[n].as_py()), reals, offs[rows == n])
    out: dict[str, TxnState] = {}
    if halves:
        for txn, code in zip(
            _txn_ids(store, np.concatenate(halves)), np.concatenate(codes).tolist(), strict=True
        ):
            if txn is not None and txn not in out:
                out[txn] = kinds[code]
    if last is not None and last[1] > 0:
        _complete_torn_commit(svc, *last)
    return out, runs


def _own_runs(
    store: MessageStore,
    offs: np.ndarray,
    rows: np.ndarray,
    ops: np.ndarray,
    stored: np.ndarray,
    code: np.ndarray,
    kinds: tuple[TxnState, ...],
    checked: int,
) -> list[Run]:
    """The groups the ops at rows ``ops`` ended, their half queue offsets turned into CommitLog
    offsets by the half queue's units (no record read); a group wholly below the check-back's
    offset ``checked`` is forgotten, as the running service forgets it."""
    cq = store.consume_queue(L.TRANS_HALF_TOPIC, 0)
    if cq is None:
        return []
    out: list[Run] = []
    order = np.argsort(rows, kind="stable")
    bounds = np.searchsorted(rows[order], [ops, ops + 1])
    for op, a, z in zip(ops.tolist(), bounds[0].tolist(), bounds[1].tolist(), strict=True):
        q = offs[order[a:z]]
        q = q[q >= cq.min_offset]
        if len(q) == 0 or int(q.max()) < checked:
            continue
        lo = int(q.min())
        units = cq.units(lo, int(q.max()) + 1)
        at = q - lo
        q, at = q[at < len(units)], at[at < len(units)]
        out.append(
            (int(stored[op]), int(q.max()), units["offset"][at].astype(np.int64), kinds[code[op]])
        )
    return out


def _txn_ids(store: MessageStore, half_offsets: np.ndarray) -> list[str | None]:
    """Transaction ids of the halves at ``half_offsets`` (None where gone)."""
    uniq = np.unique(half_offsets)
    found: dict[int, str] = {}
    lo = max(int(uniq[0]), store.min_offset(L.TRANS_HALF_TOPIC, 0)) if len(uniq) else 0
    hi = min(int(uniq[-1]) + 1, store.max_offset(L.TRANS_HALF_TOPIC, 0)) if len(uniq) else 0
    for start in range(lo, hi, 65536):
        want = uniq[(uniq >= start) & (uniq < start + 65536)]
        if len(want) == 0:
            continue
        b = store.read_arrow(
            L.TRANS_HALF_TOPIC, 0, int(want[0]), int(want[-1]) + 1, columns=["queueOffset", "msgId"]
        )
        q = b.column("queueOffset").to_numpy()
        sel = np.flatnonzero(np.isin(q, want))
        found.update(
            zip(q[sel].tolist(), b.column("msgId").take(pa.array(sel)).to_pylist(), strict=True)
        )
    return [found.get(q) for q in half_offsets.tolist()]


def _complete_torn_commit(
    svc: TransactionService, op_phys: int, reals: int, half_offsets: np.ndarray
) -> None:
    """The ``reals`` records after the op at ``op_phys`` belong to its append: write the real
    messages that are not among them."""

    store = svc.store
    op = store.look_message_by_offset(op_phys)
    cq = store.consume_queue(L.TRANS_HALF_TOPIC, 0)
    if op is None or cq is None:
        return
    present = _commits_after(store, op_phys + op.store_size, reals)
    if len(present) == reals:
        return
    halves = [half_at(store, cq, int(q)) for q in half_offsets.tolist()]
    missing = [half_of(h) for h in halves if h is not None and h.commitlog_offset not in present]
    msgs = [svc.real_message(h) for h in missing if h is not None]
    if msgs:
        log.warning(
            "completing a commit cut by a crash: %d of %d real messages were missing",
            len(msgs),
            reals,
        )
        store.put_messages(msgs, allow_system=True)


def _commits_after(store: MessageStore, start: int, reals: int) -> set[int]:
    """The halves' CommitLog offsets (PREPAREDTRANSACTIONOFFSET) of the commit records among the
    ``reals`` records from ``start`` on, up to the first that is not one: the records are walked
    by their sizes and read in one numpy pass per segment (:func:`check_records`, no record
    decoded; a sink's commit is hundreds of thousands of records, read on every start)."""
    cl = store.commitlog
    found: list[np.ndarray] = []
    offset, left = start, reals
    while left > 0:
        mf = cl.mfq.find(offset)
        if mf is None:
            break
        buf, limit, pos = mf.mm, mf.wrote_position, offset - mf.from_offset
        starts, sizes, blank = [], [], False
        while left > 0 and pos + 8 <= limit:
            total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
            if magic == L.BLANK_MAGIC:
                blank = True
                break
            if total < 8 or pos + total > limit:
                break
            starts.append(pos)
            sizes.append(total)
            pos += total
            left -= 1
        if not starts:
            break
        at, size = np.asarray(starts, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
        arr = np.frombuffer(buf, dtype=np.uint8)
        bad = R.check_records(arr, limit, at, size, at + mf.from_offset, check_crc=False)
        sys_flag = _at(arr, ">i4")[np.where(bad, 0, at) + R.POS_SYS_FLAG]
        stop = bad | ((sys_flag & L.TRANSACTION_MASK) != L.TRANSACTION_COMMIT_TYPE)
        cut = int(np.argmax(stop)) if stop.any() else len(at)
        at, sys_flag = at[:cut], sys_flag[:cut]
        prepared = at + R.POS_PREPARED_OFFSET_V4
        prepared += np.where(sys_flag & L.FLAG_BORNHOST_V6, R.HOST_V6_EXTRA, 0)
        prepared += np.where(sys_flag & L.FLAG_STOREHOST_V6, R.HOST_V6_EXTRA, 0)
        found.append(_at(arr, ">i8")[prepared].astype(np.int64))
        if cut < len(stop) or not blank:
            break
        offset = mf.end_offset
    return set(np.concatenate(found).tolist()) if found else set()
