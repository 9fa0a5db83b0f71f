"""The IndexService: the dispatcher that feeds the IndexFiles (:mod:`.indexfile`) and answers
queries by key.

Crash safety: ``flush`` syncs the files before the store writes its checkpoint, and puts the last
indexed store time there (``indexMsgTimestamp``).  After an abnormal exit, files that may hold
entries the checkpoint does not cover (end offset at or past ``dispatchedOffset``, or end time
past ``indexMsgTimestamp``) are deleted, and the service re-indexes the CommitLog itself from the
end of the last file it kept up to where the store's re-dispatch starts (from the start of the
CommitLog when the index directory is gone).  Re-dispatch is idempotent: records at or below the
last indexed CommitLog offset are skipped.

Small dispatches (a broker's single sends) are held in memory and indexed together once
``HOLD_RECORDS`` have gathered, or before anything reads the index (a query, ``files``,
``key_count``), a flush or a close: one pass over many records costs a fraction of as many passes
over one (measured: a put of one message spent a fifth of its time indexing itself).  Nothing
depends on held records being in the files: a crash loses them with the unflushed rest, and the
catch-up above indexes them again from the CommitLog.

Why this module is long: crash recovery, the held dispatches and the queries share the IndexFiles'
state under one lock.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rmq_spark.errors import ConfigError, CorruptStoreError, DiskFullError
from rmq_spark.store import layout as L
from rmq_spark.store.dispatch import DispatchBatch, as_list
from rmq_spark.store.index.indexfile import (
    _NAME,
    DEFAULT_INDEX_ENTRIES,
    DEFAULT_INDEX_SLOTS,
    INT_MAX,
    LONG_MAX,
    SMALL_KEYS,
    IndexFile,
    _index_fields,
    id_hashes,
    index_hash,
    index_hashes,
    key_word_hashes,
)
from rmq_spark.store.mapped import make_dirs
from rmq_spark.store.message import IdColumn
from rmq_spark.store.record import RecordCheck, check_record

__all__ = ["IndexService"]

log = logging.getLogger("rmq_spark.store")

_SCAN_BATCH_RECORDS = 4096
HOLD_BATCH_MAX = 32  # dispatches of fewer records than this are held back ...
HOLD_RECORDS = 256  # ... until this many have gathered (see the module docstring)


@dataclass
class _Scanned:
    """Columns of records read back from the CommitLog by the service's own catch-up scan."""

    phys: list[int] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    sys_flags: list[int] = field(default_factory=list)
    store_ts: list[int] = field(default_factory=list)
    keys: list[str | None] = field(default_factory=list)
    uniq_keys: list[str | None] = field(default_factory=list)

    def add(
        self,
        phys: int,
        topic: str,
        sys_flag: int,
        store_ts: int,
        keys: str | None,
        uniq: str | None,
    ) -> None:
        self.phys.append(phys)
        self.topics.append(topic)
        self.sys_flags.append(sys_flag)
        self.store_ts.append(store_ts)
        self.keys.append(keys)
        self.uniq_keys.append(uniq)


class IndexService:
    """The dispatcher that keeps the index files: ``MessageStore(...,
    dispatchers=[IndexService])``.  Sizes come from ``store.config.extra["index_slots"]`` and
    ``["index_entries"]`` unless given."""

    def __init__(  # type: ignore[no-untyped-def]
        self, store, slot_num: int | None = None, index_num: int | None = None
    ) -> None:
        self.store = store
        extra = getattr(store.config, "extra", None) or {}
        self.slot_num = int(slot_num or extra.get("index_slots", DEFAULT_INDEX_SLOTS))
        self.index_num = int(index_num or extra.get("index_entries", DEFAULT_INDEX_ENTRIES))
        if not 1 <= self.slot_num <= INT_MAX:
            raise ConfigError(f"index_slots must be in [1, {INT_MAX}], not {self.slot_num}")
        if not 2 <= self.index_num <= INT_MAX:
            raise ConfigError(f"index_entries must be in [2, {INT_MAX}], not {self.index_num}")
        self.directory = os.path.join(store.root, L.INDEX_DIR)
        self._lock = threading.RLock()  # the file list and contents (dispatch, queries)
        self._flush_lock = threading.Lock()  # one flush at a time; close waits for it
        self._files: list[IndexFile] = []
        self._held = _Scanned()  # columns of small dispatches not indexed yet, in CommitLog order
        self._held_records = 0
        self.rebuilt_records = 0  # records indexed from this service's own CommitLog scan
        self._closed = False
        self._lag_from: int | None = None  # a full disk stopped indexing here (see _lag)
        self._lag_logged = False
        self._load(getattr(store, "last_exit_abnormal", False), store.checkpoint)
        indexed = [f.end_phy for f in self._files if f.index_count > 1]
        self._last_phy = max(indexed, default=-1)  # the newest indexed CommitLog offset
        # the CommitLog offset up to which records have been handed to us (None: nothing yet)
        self._covered: int | None = self._last_phy if indexed else None

    def _load(self, abnormal: bool, checkpoint) -> None:  # type: ignore[no-untyped-def]
        if not os.path.isdir(self.directory):
            return
        names = sorted(n for n in os.listdir(self.directory) if _NAME.match(n))
        for i, name in enumerate(names):
            try:
                f = IndexFile(os.path.join(self.directory, name), self.slot_num, self.index_num)
                # a full file is sealed when the next one starts, every file on a clean stop: one
                # without its seal then lost it (or was written by a version without seals)
                if not f.sealed and (i < len(names) - 1 or not abnormal):
                    f.close()
                    raise CorruptStoreError(f"{f.path}: the index file has no seal", f.path, 0)
                self._files.append(f)
            except CorruptStoreError as e:
                # other sizes, a torn or damaged file: drop it and the files after it; they are
                # rebuilt from the CommitLog
                log.error(
                    "%s; it and the %d index files after it are rebuilt from the CommitLog",
                    e,
                    len(names) - i - 1,
                )
                for later in names[i:]:
                    os.unlink(os.path.join(self.directory, later))
                break
        if abnormal:
            cp_offset, cp_ts = checkpoint.dispatched_offset, checkpoint.index_msg_timestamp
            keep = next(
                (
                    i
                    for i, f in enumerate(self._files)
                    if f.index_count > 1 and (f.end_phy >= cp_offset or f.end_ts > cp_ts)
                ),
                len(self._files),
            )
            for f in self._files[keep:]:
                f.destroy()
            del self._files[keep:]

    # --- dispatch --------------------------------------------------------------------------
    @property
    def files(self) -> list[IndexFile]:
        """The index files, every record handed to the service indexed in them."""
        with self._lock:
            self._drain()
            return self._files

    def dispatch(self, batch: DispatchBatch) -> None:
        n = len(batch)
        if n == 0:
            return
        with self._lock:
            if self._closed:
                return
            self._behind()
            phys = batch._phys  # noqa: SLF001 - a list for a put of a few records
            first = phys[0] if phys.__class__ is list else int(phys[0])
            if self._covered is None or self._covered < first:
                self._catch_up(first)
            if n < HOLD_BATCH_MAX:
                self._hold(batch, n)
                if self._held_records >= HOLD_RECORDS:
                    self._drain()
            else:
                self._drain()
                self._index(
                    batch._phys, batch.topics, batch._sys_flags,  # noqa: SLF001 - lists or arrays, as built
                    batch._store_timestamps, batch.keys, batch.uniq_keys,  # noqa: SLF001
                )  # fmt: skip
            end = batch.end_offset
            if self._covered is None or end > self._covered:
                self._covered = end

    def dispatch_one(
        self,
        phys: int,
        size: int,
        topic: str,
        queue_id: int,
        queue_offset: int,
        tags_code: int,
        sys_flag: int,
        store_ts_ms: int,
        keys: str | None,
        uniq_key: str | None,
        end_offset: int,
    ) -> None:
        """:meth:`dispatch` of a batch of one record (held like the records of small batches)."""
        with self._lock:
            if self._closed:
                return
            self._behind()
            covered = self._covered
            if covered is None or covered < phys:
                self._catch_up(phys)
            self._held.add(phys, topic, sys_flag, store_ts_ms, keys, uniq_key)
            self._held_records += 1
            if self._held_records >= HOLD_RECORDS:
                self._drain()
            if self._covered is None or end_offset > self._covered:
                self._covered = end_offset

    def _complete(self) -> None:
        """Before a query: index what the store dispatched that is not in the files yet (a lag
        after a full disk, files dropped on a start with no dispatch since)."""
        upto = getattr(self.store, "dispatched_offset", None)
        if upto and (self._lag_from is not None or self._covered is None or self._covered < upto):
            self._behind()
            self._catch_up(upto)

    def _behind(self) -> None:
        """After a full disk stopped indexing: this dispatch catches up from there, reading the
        CommitLog (the records held meanwhile all lie past it: read again there)."""
        if self._lag_from is not None:
            self._held, self._held_records = _Scanned(), 0
            self._covered, self._lag_from = self._lag_from, None

    def _hold(self, b: DispatchBatch, n: int) -> None:
        """Add the columns :meth:`_index` reads of a small dispatch to the held ones."""
        h = self._held
        phys, flags, ts = b._phys, b._sys_flags, b._store_timestamps  # noqa: SLF001 - lists, or arrays
        h.phys += phys if phys.__class__ is list else as_list(phys)
        h.topics += b.topics
        h.sys_flags += flags if flags.__class__ is list else as_list(flags)
        h.store_ts += ts if ts.__class__ is list else as_list(ts)
        keys, uniq = b.keys, b.uniq_keys
        h.keys += keys if len(keys) == n else [*keys[:n], *[None] * (n - len(keys))]
        h.uniq_keys += uniq if len(uniq) == n else [*uniq[:n], *[None] * (n - len(uniq))]
        self._held_records += n

    def _drain(self) -> None:
        """Index the held records (under the lock), in one pass."""
        if not self._held_records or self._lag_from is not None:
            return
        s = self._held
        self._held, self._held_records = _Scanned(), 0
        self._index(s.phys, s.topics, s.sys_flags, s.store_ts, s.keys, s.uniq_keys)

    def _index(
        self,
        phys: np.ndarray | list[int],
        topics: Sequence[str],
        sys_flags: np.ndarray | list[int],
        store_ts: np.ndarray | list[int],
        keys: Sequence[str | None],
        uniq_keys: Sequence[str | None],
    ) -> int:
        """Index records (skipping ROLLBACK ones and those already indexed); returns how many
        records were new."""
        if self._lag_from is not None:
            return 0  # behind after a full disk: the catch-up reads these again from the CommitLog
        last = self._last_phy
        if len(phys) > SMALL_KEYS and len(uniq_keys) == len(phys) and len(keys) in (0, len(phys)):
            return self._index_uniq(np.asarray(phys, dtype=np.int64), topics, np.asarray(sys_flags, dtype=np.int32),
                                    store_ts, uniq_keys, last, keys if any(keys) else None)  # fmt: skip
        phys_list = phys.tolist() if isinstance(phys, np.ndarray) else list(phys)
        sflags = sys_flags.tolist() if isinstance(sys_flags, np.ndarray) else list(sys_flags)
        sel = [
            i for i, (p, f) in enumerate(zip(phys_list, sflags, strict=True))
            if p > last and (f & L.TRANSACTION_MASK) != L.TRANSACTION_ROLLBACK_TYPE
        ]  # fmt: skip
        if not sel:
            return 0
        one_topic = topics.count(topics[0]) == len(topics)
        prefix = topics[0] + "#"
        n_uniq, n_keys = len(uniq_keys), len(keys)
        # the UNIQ_KEY strings, then the KEYS words; a stable sort by record interleaves them
        strs: list[str] = []
        rec: list[int] = []
        for i in sel:
            u = uniq_keys[i] if i < n_uniq else None
            if u:
                strs.append(prefix + u if one_topic else f"{topics[i]}#{u}")
                rec.append(i)
        uniq_only = len(strs)
        words: dict[str, list[str]] = {}
        for i in sel:
            k = keys[i] if i < n_keys else None
            if not k:
                continue
            parts = words.get(k)
            if parts is None:
                parts = words[k] = [w for w in k.split(L.KEY_SEPARATOR) if w]
            t = prefix if one_topic else topics[i] + "#"
            strs.extend(t + w for w in parts)
            rec.extend([i] * len(parts))
        if not strs:
            return len(sel)
        if len(strs) <= SMALL_KEYS:
            order = sorted(range(len(rec)), key=rec.__getitem__)  # stable: by record
            ts_list = store_ts.tolist() if isinstance(store_ts, np.ndarray) else list(store_ts)
            hs = [index_hash(strs[j]) for j in order]
            kp = [phys_list[rec[j]] for j in order]
            kt = [ts_list[rec[j]] for j in order]
            done = 0
            try:
                while done < len(hs):
                    f, take = self._room_for(kp, done)
                    put_few = f._put_few  # noqa: SLF001 - the index's own files
                    done += put_few(
                        hs[done : done + take], kp[done : done + take], kt[done : done + take]
                    )
            except DiskFullError as e:
                self._lag(kp[done], e)
                return len(sel)
            self._last_phy = kp[-1]
            return len(sel)
        rec_arr = np.asarray(rec, dtype=np.int64)
        hashes = index_hashes(strs)
        if len(strs) > uniq_only:
            by_rec = np.argsort(rec_arr, kind="stable")
            rec_arr, hashes = rec_arr[by_rec], hashes[by_rec]
        key_phys = np.asarray(phys, dtype=np.int64)[rec_arr]
        key_ts = np.asarray(store_ts, dtype=np.int64)[rec_arr]
        self._put(hashes, key_phys, key_ts)
        return len(sel)

    def _index_uniq(
        self,
        phys: np.ndarray,
        topics: Sequence[str],
        sys_flags: np.ndarray,
        store_ts: np.ndarray | list[int],
        uniq_keys: Sequence[str | None],
        last: int,
        keys: Sequence[str | None] | None = None,
    ) -> int:
        """:meth:`_index` of a large batch (a bulk put, a sink's rows, a group commit with its op
        message, which has no id): the same entries, selected with numpy, in record order; the
        words of ``keys`` split, prefixed and hashed by Arrow."""
        phys = np.asarray(phys, dtype=np.int64)
        keep = (phys > last) & (
            (np.asarray(sys_flags) & L.TRANSACTION_MASK) != L.TRANSACTION_ROLLBACK_TYPE
        )
        ids = uniq_keys if isinstance(uniq_keys, IdColumn) else None
        if ids is not None and ids.present is not None:  # records without an id get no entry
            keep &= ids.present
        elif ids is None and not all(uniq_keys):
            keep &= np.fromiter(map(bool, uniq_keys), dtype=bool, count=len(uniq_keys))
        sel = np.flatnonzero(keep)
        if len(sel) == 0:
            return 0
        one_topic = topics.count(topics[0]) == len(topics)
        hashes = id_hashes(topics, uniq_keys, keep, sel, one_topic)
        if keys is not None:  # records with no id still have their key words indexed
            keep = (phys > last) & (
                (np.asarray(sys_flags) & L.TRANSACTION_MASK) != L.TRANSACTION_ROLLBACK_TYPE
            )
            chosen = np.flatnonzero(keep)
        else:
            chosen = sel
        rec = sel
        if keys is not None and len(chosen):
            words_rec, words_hash = key_word_hashes(chosen, topics, keys, one_topic)
            if len(words_rec):
                rec = np.concatenate([sel, words_rec])
                hashes = np.concatenate([hashes, words_hash])
                order = np.argsort(rec, kind="stable")  # by record: its id first, then its words
                rec, hashes = rec[order], hashes[order]
        if len(rec) == 0:
            return len(chosen)
        key_phys = phys[rec]
        key_ts = np.asarray(store_ts, dtype=np.int64)[rec]
        self._put(hashes, key_phys, key_ts)
        return len(chosen)

    def _put(self, hashes: np.ndarray, key_phys: np.ndarray, key_ts: np.ndarray) -> None:
        """Write the entries (in record order) to the index files; on a full disk what is left is
        indexed later (:meth:`_lag`)."""
        done = 0
        try:
            while done < len(hashes):
                f, take = self._room_for(key_phys, done)
                done += f.put_hashes(
                    hashes[done : done + take],
                    key_phys[done : done + take],
                    key_ts[done : done + take],
                )
        except DiskFullError as e:
            self._lag(int(key_phys[done]), e)
            return
        self._last_phy = int(key_phys[-1])
        self._lag_logged = False

    def _lag(self, phys: int, e: DiskFullError) -> None:
        """No new index file on a full disk: the records from ``phys`` on are indexed later, from
        the CommitLog, by the catch-up of the first dispatch after it (puts go on failing until
        there is space; the index is derived, so it never fails one that got into the log)."""
        if self._lag_from is None:
            self._last_phy = phys - 1  # every record before it is wholly indexed
            if not self._lag_logged:  # once, until indexing works again
                log.error("index not updated from CommitLog offset %d: %s", phys, e)
                self._lag_logged = True
            self._lag_from = phys

    def _room_for(self, key_phys, done: int) -> tuple[IndexFile, int]:  # type: ignore[no-untyped-def]
        """The file the keys from ``done`` on go to, and how many of them: never a record's keys
        split over two files (a full disk between the two would leave the record half indexed,
        and it is never indexed again), unless one record has more keys than a file holds."""
        f = self._writable_file()
        left = len(key_phys) - done
        take = min(f.index_num - f.index_count, left)
        if take < left:
            cut = take
            while cut > 0 and key_phys[done + cut - 1] == key_phys[done + cut]:
                cut -= 1
            if cut == 0 and f.index_count > 1:  # the record's keys go to a fresh file
                self._writable_file(fresh=True)
                return self._room_for(key_phys, done)
            take = cut or take  # (0: one record has more keys than a whole file: split)
        return f, take

    def _writable_file(self, fresh: bool = False) -> IndexFile:
        if self._files and not self._files[-1].is_full and not fresh:
            return self._files[-1]
        last = self._files[-1] if self._files else None
        if last is not None:
            last.seal()  # it no longer changes
        make_dirs(self.directory)
        f = IndexFile(
            os.path.join(self.directory, self._new_name()),
            self.slot_num,
            self.index_num,
            create=True,
            begin_phy=last.end_phy if last else 0,
            begin_ts=last.end_ts if last else 0,
        )
        self._files.append(f)
        return f

    def _new_name(self) -> str:
        """``yyyyMMddHHmmssSSS`` of now, a millisecond later until it sorts after the last file."""
        last = os.path.basename(self._files[-1].path) if self._files else ""
        ms = self.store.clock.now_ms()
        while True:
            name = time.strftime("%Y%m%d%H%M%S", time.localtime(ms // 1000)) + f"{ms % 1000:03d}"
            if name > last and not os.path.exists(os.path.join(self.directory, name)):
                return name
            ms += 1

    def _catch_up(self, upto: int) -> None:
        """Index the CommitLog records in ``[covered, upto)`` ourselves (files dropped after a
        crash, a deleted index directory): the store only re-dispatches from its checkpoint."""
        self._drain()  # they come first in the CommitLog
        cl = self.store.commitlog
        offset = max(self._covered or 0, cl.min_offset)
        scanned = _Scanned()
        while offset < upto:
            mf = cl.mfq.find(offset)
            if mf is None:
                break
            pos = offset - mf.from_offset
            kind, size, why = check_record(
                mf.mm, pos, max(pos, mf.data_bytes), True, cl.force_prop_crc, mf.size_bytes
            )
            if kind == RecordCheck.BLANK:
                offset = mf.end_offset
                continue
            if kind != RecordCheck.VALID:
                # below ``upto`` the log is durable: damage, never keys read from it
                raise cl.corrupt(offset, why or "zero bytes where a record should be")
            scanned.add(offset, *_index_fields(mf.mm, pos))
            offset += size
            if len(scanned.phys) >= _SCAN_BATCH_RECORDS:
                self._index_scanned(scanned)
                scanned = _Scanned()
        self._index_scanned(scanned)
        self._covered = max(self._covered or 0, upto)

    def _index_scanned(self, s: _Scanned) -> None:
        if s.phys:
            self.rebuilt_records += self._index(
                np.asarray(s.phys, dtype=np.int64), s.topics, np.asarray(s.sys_flags, np.int32),
                np.asarray(s.store_ts, dtype=np.int64), s.keys, s.uniq_keys,
            )  # fmt: skip

    # --- queries -------------------------------------------------------------------------------
    def query_offsets(
        self, topic: str, key: str, max_num: int = 64, begin_ms: int = 0, end_ms: int = LONG_MAX
    ) -> list[int]:
        """CommitLog offsets of records indexed under ``topic#key`` whose store time may lie in
        ``[begin_ms, end_ms]``, newest first, at most ``max_num``.  Hash collisions are NOT
        filtered here: callers compare the records' keys (:mod:`rmq_spark.store.query`)."""
        key_hash = int(index_hashes([f"{topic}#{key}"])[0])
        out: list[int] = []
        with self._lock:
            self._drain()
            self._complete()
            for f in reversed(self._files):
                if len(out) >= max_num:
                    break
                if f.time_matched(begin_ms, end_ms):
                    out.extend(f.select(key_hash, begin_ms, end_ms, max_num - len(out)))
                if f.index_count > 1 and f.begin_ts < begin_ms:
                    break  # older files end before this one begins
        return out

    @property
    def key_count(self) -> int:
        with self._lock:
            self._drain()
            return sum(f.key_count for f in self._files)

    # --- lifecycle -----------------------------------------------------------------------------
    def flush(self) -> None:
        """Catch up with the store (after recovery), sync the files, and put the last indexed
        store time in the checkpoint (the store writes it right after this).  The sync runs
        outside the dispatch lock: puts do not wait for it."""
        with self._flush_lock:
            with self._lock:
                if self._closed:
                    return
                done = self.store.dispatched_offset
                self._drain()
                if self._covered is None or self._covered < done:
                    self._catch_up(done)
                dirty = [f for f in self._files if f.dirty]
                for f in dirty:
                    f.dirty = False
                last = next((f for f in reversed(self._files) if f.index_count > 1), None)
                last_ts = last.end_ts if last is not None else None
            for f in dirty:
                f.sync()
            if last_ts is not None:
                self.store.checkpoint.index_msg_timestamp = last_ts

    def seal(self) -> None:
        """On a clean stop (after the last flush): seal every file so the next start checks it."""
        with self._flush_lock, self._lock:
            self._drain()
            for f in self._files:
                f.seal()

    def close(self) -> None:
        with self._flush_lock, self._lock:
            self._drain()
            self._closed = True
            for f in self._files:
                f.close()
            self._files = []
