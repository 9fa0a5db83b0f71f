"""MessageStore: the store directory as one object — CommitLog, ConsumeQueues, dispatch, flush,
recovery, checkpoint, topic config and consumer offsets.

One process writes a store directory at a time (an exclusive ``lock`` file); readers in other
processes use :class:`rmq_spark.store.reader.StoreReader`.

Why this module is long: :class:`MessageStore` owns the put lock, the publish order and the
durable offset, and its put, recovery and read paths all take or publish under them; what holds
no such state has its own module (commitlog, consumequeue, dispatch, flush, encode, reader, query).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from rmq_spark.errors import (
    ConfigError,
    CorruptStoreError,
    DiskFullError,
    MessageIllegalError,
    StoreError,
    StoreLockedError,
)
from rmq_spark.store import layout as L
from rmq_spark.store.apache import check_servable, is_apache_store, lock_like_apache, segment_sizes
from rmq_spark.store.checkpoint import StoreCheckpoint
from rmq_spark.store.clock import SYSTEM_CLOCK, Clock
from rmq_spark.store.commitlog import AppendResult, CommitLog
from rmq_spark.store.config import TopicConfigManager
from rmq_spark.store.consistency import check_consume_queues
from rmq_spark.store.consumequeue import ConsumeQueue
from rmq_spark.store.deleted import DeletedTopics
from rmq_spark.store.dispatch import (
    ConsumeQueueDispatcher,
    DispatchBatch,
    Dispatcher,
    as_list,
    group_by_queue,
)
from rmq_spark.store.encode import (
    V4_SYS_FLAG_MASK,
    Row,
    encode_columns,
    encode_lists,
    encode_messages,
    encode_v4_record,
)
from rmq_spark.store.encoded import SMALL_BATCH, EncodedBatch
from rmq_spark.store.flush import AsyncFlushService, GroupCommitService
from rmq_spark.store.mapped import is_no_space, make_dirs
from rmq_spark.store.message import (
    IdColumn,
    Message,
    MessageExt,
    host_bytes,
    new_uniq_ids,
    new_uniq_ids_array,
    tags_code,
)
from rmq_spark.store.offsets import ConsumerOffsetManager
from rmq_spark.store.properties import PROP_CRC_BYTES, PROP_CRC_PLACEHOLDER, encode_properties
from rmq_spark.store.rowprops import RowProperties, decoded, id_column
from rmq_spark.store.status import GetStatus, PutStatus
from rmq_spark.store.validation import (
    check_bodies,
    check_body,
    check_properties_size,
    check_topic,
    check_topic_cached,
)

if TYPE_CHECKING:
    from typing_extensions import Self

log = logging.getLogger("rmq_spark.store")


@dataclass
class StoreConfig:
    commitlog_segment_bytes: int = L.COMMITLOG_SEGMENT_BYTES
    cq_segment_units: int = L.CQ_SEGMENT_UNITS
    flush: str = "async"  # or "sync"
    flush_interval_ms: int = 500
    flush_least_pages: int = 4
    flush_thorough_interval_ms: int = 10_000
    sync_flush_timeout_ms: int = 5000
    body_max_bytes: int = L.BODY_MAX_BYTES
    auto_create_topics: bool = True
    default_queue_nums: int = 4
    store_host: str = "127.0.0.1"
    store_port: int = 10911
    truncate_corrupt: bool = False
    # a CRC of the whole record in the __CRC32# property (RocketMQ's enabledAppendPropCRC): lets
    # recovery detect a torn record anywhere, not only in its body
    append_prop_crc: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.flush not in ("async", "sync"):
            raise ConfigError(f"flush must be 'async' or 'sync', not {self.flush!r}")
        if self.commitlog_segment_bytes < 4096:
            raise ConfigError("commitlog_segment_bytes must be at least 4096")
        if self.cq_segment_units < 1:
            raise ConfigError("cq_segment_units must be positive")


@dataclass
class PutResult:
    status: PutStatus
    append: AppendResult | None = None
    uniq_keys: Sequence[str | None] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK


@dataclass
class GetResult:
    status: GetStatus
    messages: list[MessageExt]
    next_begin_offset: int
    min_offset: int
    max_offset: int


# A topic whose ConsumeQueue units carry, as tagsCode, a number computed from the record's
# properties and store time instead of the hash of its TAGS (RocketMQ's schedule topic stores the
# delivery time there): ``rule(properties, store_timestamp_ms) -> tagsCode or None``.  The services
# above the store give theirs to :class:`MessageStore`; recovery and re-dispatch apply them too.
TagsCodeRule = Callable[[dict[str, str], int], "int | None"]


_UNIQ_PREFIX = b"UNIQ_KEY\x01"


class MessageStore:
    """Open (recovering if needed) the store at ``root``; a context manager."""

    def __init__(
        self,
        root: str,
        config: StoreConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
        dispatchers: Iterable[Callable[[MessageStore], Dispatcher]] = (),
        start_services: bool = True,
        tags_code_rules: Mapping[str, TagsCodeRule] | None = None,
    ) -> None:
        self.root = os.path.abspath(root)
        self.config = config or StoreConfig()
        self.clock = clock
        self.tags_code_rules: dict[str, TagsCodeRule] = dict(tags_code_rules or {})
        check_servable(self.root)  # what it cannot serve is refused before anything is written
        # an Apache store's own segment sizes (its broker.conf's) win over the configured ones
        cl, cq = segment_sizes(self.root) if is_apache_store(self.root) else (None, None)
        cl, cq = cl or self.config.commitlog_segment_bytes, cq or self.config.cq_segment_units
        if (cl, cq) != (self.config.commitlog_segment_bytes, self.config.cq_segment_units):
            self.config = replace(self.config, commitlog_segment_bytes=cl, cq_segment_units=cq)
        make_dirs(self.root)
        self._lock_fd = _lock_directory(self.root)
        self._closed = False
        try:
            self._open(dispatchers, start_services)
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _open(self, dispatchers, start_services: bool) -> None:  # type: ignore[no-untyped-def]
        cfg = self.config
        abort_path = os.path.join(self.root, L.ABORT_FILE)
        self.last_exit_abnormal = os.path.exists(abort_path)
        self._store_host = host_bytes(cfg.store_host)
        self._crc_reserve = PROP_CRC_PLACEHOLDER if cfg.append_prop_crc else b""
        self.topics = TopicConfigManager(self.root, cfg.auto_create_topics, cfg.default_queue_nums)
        self.offsets = ConsumerOffsetManager(self.root)
        self.deleted = DeletedTopics(self.root)
        self.checkpoint = StoreCheckpoint(self.root)
        self.commitlog = CommitLog(
            os.path.join(self.root, L.COMMITLOG_DIR),
            cfg.commitlog_segment_bytes,
            store_host=self._store_host,
            store_port=cfg.store_port,
            now_ms=self.clock.now_ms,
            tags_code_for=self._special_tags_code,
            tags_code_topics=self.tags_code_rules.keys(),
            inflight_path=os.path.join(self.root, L.INFLIGHT_FILE),
        )
        self.publish_lock = threading.RLock()
        self._cqs: dict[tuple[str, int], ConsumeQueue] = {}
        self._pending: list[DispatchBatch] = []  # sync flush: appended, not yet durable
        self._pending_lock = threading.Lock()
        self.dispatched_offset = 0
        self.dispatchers: list[Dispatcher] = [ConsumeQueueDispatcher(self)]
        self.dispatchers.extend(factory(self) for factory in dispatchers)
        # one-record puts skip the batch objects when every dispatcher takes single records (and
        # the store host is IPv4); with sync flush a put waits for its fdatasync, the batch path's
        # group commit
        self._one_by_one = (
            cfg.flush == "async" and len(self._store_host) == 4
            and all(hasattr(d, "dispatch_one") for d in self.dispatchers)
        )  # fmt: skip
        # (listener, topic or None); replaced, never changed in place: publishers read it unlocked
        self._listeners: list[tuple[Callable[..., None], str | None, bool]] = []

        self.commitlog.mfq.load()
        self._load_consume_queues()
        self._recover()
        _write_marker(abort_path, str(os.getpid()))
        self._flush_service: AsyncFlushService | None = None
        self._group_commit: GroupCommitService | None = None
        if start_services:
            self.start_services()

    # --- lifecycle ----------------------------------------------------------------------------------
    def start_services(self) -> None:
        cfg = self.config
        if cfg.flush == "sync":
            self._group_commit = GroupCommitService(self._sync_flush, cfg.sync_flush_timeout_ms)
            self._group_commit.start()
        self._flush_service = AsyncFlushService(
            self.flush_all if cfg.flush == "async" else (lambda thorough: self._flush_logics()),
            self.commitlog.mfq.dirty_bytes if cfg.flush == "async" else (lambda: 1 << 30),
            cfg.flush_interval_ms,
            cfg.flush_least_pages,
            cfg.flush_thorough_interval_ms,
        )
        self._flush_service.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Clean stop: flush everything, write the checkpoint, remove the abort marker."""
        if self._closed:
            return
        self._stop_services()
        with self.commitlog.put_lock:
            self._dispatch_pending(self.commitlog.max_offset)
            self.flush_all(True)
            try:
                self.offsets.persist()
            except DiskFullError as e:  # the offsets on disk stay those of the last persist
                log.error("consumer offsets not saved on shutdown: %s", e)
            for d in self.dispatchers:  # a clean stop: what they keep can be checked on start
                seal = getattr(d, "seal", None)
                if seal is not None:
                    seal()
            self._close_files()
        os.unlink(os.path.join(self.root, L.ABORT_FILE))
        self._release_lock()

    def crash(self) -> None:
        """Tests: stop as kill -9 would (page cache kept, no checkpoint, abort marker left)."""
        if self._closed:
            return
        self._stop_services(flush=False)
        self._close_files()
        self._release_lock()

    def _stop_services(self, flush: bool = True) -> None:
        if self._group_commit is not None:
            self._group_commit.shutdown()
        if self._flush_service is not None:
            self._flush_service.shutdown()

    def _close_files(self) -> None:
        self.commitlog.close()
        for cq in self._cqs.values():
            cq.close()
        self.checkpoint.close()
        for d in self.dispatchers:
            close = getattr(d, "close", None)
            if close is not None:
                close()

    def _release_lock(self) -> None:
        self._closed = True
        os.close(self._lock_fd)

    @property
    def closed(self) -> bool:
        return self._closed

    # --- consume queues -------------------------------------------------------------------------------
    def consume_queue(self, topic: str, queue_id: int, create: bool = False) -> ConsumeQueue | None:
        key = (topic, queue_id)
        cq = self._cqs.get(key)
        if cq is None and create:
            cq = ConsumeQueue(self.root, topic, queue_id, self.config.cq_segment_units)
            self._cqs[key] = cq
        return cq

    def _load_consume_queues(self) -> None:
        base = os.path.join(self.root, L.CONSUMEQUEUE_DIR)
        if not os.path.isdir(base):
            return
        for topic in sorted(os.listdir(base)):
            tdir = os.path.join(base, topic)
            try:
                check_topic(topic, allow_system=True)
            except MessageIllegalError as e:
                log.warning("%s is not a ConsumeQueue directory (%s): left alone", tdir, e)
                continue
            if not os.path.isdir(tdir):
                log.warning("%s is not a directory: left alone", tdir)
                continue
            for q in sorted(os.listdir(tdir)):
                if q.isascii() and q.isdigit() and int(q) < L.QUEUE_NUMS_MAX:
                    cq = ConsumeQueue(self.root, topic, int(q), self.config.cq_segment_units)
                    cq.load()
                    self._cqs[(topic, int(q))] = cq

    def queue_keys(self) -> list[tuple[str, int]]:
        return sorted(self._cqs)

    # --- recovery -------------------------------------------------------------------------------------
    def _recover(self) -> None:
        cp = self.checkpoint
        cl = self.commitlog
        if not cl.mfq.files:
            for cq in self._cqs.values():
                cq.destroy()
            self._cqs.clear()
            self.deleted.prune(
                1 << 62
            )  # no record left: a tombstone would hide new ones at offset 0
            return
        self._drop_deleted_queues()
        has_cqs = any(cq.max_offset > 0 for cq in self._cqs.values())
        scan_from = min(cp.dispatched_offset, cp.confirm_phy_offset) if has_cqs else cl.min_offset
        try:
            end = cl.recover(
                scan_from,
                cp.confirm_phy_offset,
                self.config.truncate_corrupt,
                self._redispatch,
                force_prop_crc=self.config.append_prop_crc,
                consume_queues=list(self._cqs.values()),
                durable_store_ts=cp.physic_msg_timestamp if cp.written_by_apache else 0,
            )
        except ValueError:
            # a ConsumeQueue is missing units the checkpoint said were durable: rebuild them all
            for cq in self._cqs.values():
                cq.destroy()
            self._cqs.clear()
            end = cl.recover(
                cl.min_offset,
                cp.confirm_phy_offset,
                self.config.truncate_corrupt,
                self._redispatch,
                force_prop_crc=self.config.append_prop_crc,
            )
        for cq in self._cqs.values():
            if cq.max_phys_end > end:
                cq.truncate_dirty(end)
        problems = [cq.damage for cq in self._cqs.values() if cq.damage]
        problems += check_consume_queues(
            self._cqs, cl.mfq, end, cl.force_prop_crc, self.deleted.below
        )
        if problems:
            for problem in problems:
                log.error(
                    "%s; the ConsumeQueues are rebuilt from the CommitLog, checked again", problem
                )
            self._rebuild_consume_queues(end)
        cl.queue_table = {k: cq.max_offset for k, cq in self._cqs.items()}
        self.deleted.prune(cl.min_offset)
        self.dispatched_offset = end
        cp.confirm_phy_offset = end
        cp.dispatched_offset = end
        self.flush_all(True)

    def _rebuild_consume_queues(self, end: int) -> None:
        """Every ConsumeQueue dropped and rebuilt from the CommitLog, every record checked again
        with its CRCs: the log is durable up to ``end``, so damage in it stops the store."""
        for cq in self._cqs.values():
            cq.destroy()
        self._cqs.clear()
        cl = self.commitlog
        cl.recover(
            cl.min_offset,
            end,
            self.config.truncate_corrupt,
            self._redispatch,
            force_prop_crc=self.config.append_prop_crc,
        )

    def _drop_deleted_queues(self) -> None:
        """ConsumeQueues still holding units of a deleted topic (the broker stopped between the
        tombstone and the files' removal) go; the check then rebuilds what the topic holds anew."""
        for key, cq in list(self._cqs.items()):
            below = self.deleted.below.get(key[0])
            if below is None or cq.max_offset <= cq.min_offset:
                continue
            first = cq.unit(cq.min_offset)
            if first is not None and first[0] < below:
                log.warning("recovery: ConsumeQueue %s/%d of a deleted topic removed", *key)
                cq.destroy()
                del self._cqs[key]

    def _redispatch(self, batch: DispatchBatch) -> None:
        batch = self.deleted.live(batch)
        if len(batch) == 0:
            return
        batch.tags_codes = np.fromiter(
            (
                self._special_tags_code(t, p, int(ts)) or tags_code(p.get(L.P_TAGS))
                for t, p, ts in zip(
                    batch.topics, batch.properties, batch.store_timestamps, strict=True
                )
            ),
            dtype=np.int64,
            count=len(batch),
        )
        for d in self.dispatchers:
            d.dispatch(batch)

    def rebuild_consume_queues(self) -> None:
        """Drop every ConsumeQueue and rebuild them from the CommitLog."""
        with self.commitlog.put_lock, self.publish_lock:
            for cq in self._cqs.values():
                cq.destroy()
            self._cqs.clear()
            end = self.commitlog.max_offset
            self.commitlog.mfq.files[-1].wrote_position  # noqa: B018 - segments stay as they are
            saved = [(mf.wrote_position, mf.flushed_position) for mf in self.commitlog.mfq.files]
            self.commitlog.recover(self.commitlog.min_offset, 0, True, self._redispatch)
            for mf, (w, f) in zip(self.commitlog.mfq.files, saved, strict=True):
                mf.wrote_position, mf.flushed_position = w, f
            assert self.commitlog.max_offset == end

    # --- topics -------------------------------------------------------------------------------------
    def delete_topic(self, topic: str) -> None:
        """Delete ``topic`` as RocketMQ's ``deleteTopics`` does: its config, ConsumeQueues and
        consumer offsets go; its records stay in the CommitLog until their segments expire, behind
        a tombstone (:mod:`rmq_spark.store.deleted`) so that no check, recovery or lookup brings
        them back, and a topic created again under the name starts empty, at queue offset 0.  A name
        that is not a topic's is refused (MessageIllegalError), nothing touched."""
        check_topic(topic, allow_system=True)  # the name becomes a path below: never "..", "/x", ""
        base = os.path.join(self.root, L.CONSUMEQUEUE_DIR)
        tdir = os.path.join(base, topic)
        if (
            os.path.dirname(os.path.normpath(tdir)) != base
        ):  # pragma: no cover - a valid name stays inside
            raise MessageIllegalError(f"topic {topic!r} names no directory of {base}")
        cl = self.commitlog
        with cl.put_lock:
            if self._group_commit is not None:  # what waits for its fdatasync is dispatched first
                self._sync_flush()
            self.deleted.add(topic, cl.max_offset)
            with self.publish_lock:
                keys = [k for k in self._cqs if k[0] == topic]
                for key in keys:
                    self._cqs.pop(key).destroy()
                    cl.queue_table.pop(key, None)
            shutil.rmtree(tdir, ignore_errors=True)
        self.offsets.remove_topic(topic)
        self.topics.delete(topic)
        log.info("topic %s deleted: %d ConsumeQueue(s) removed, its records hidden below CommitLog offset %d",
                 topic, len(keys), self.deleted.below[topic])  # fmt: skip

    def _special_tags_code(self, topic: str, props: dict[str, str], store_ts: int) -> int | None:
        """The tagsCode a topic's rule gives a record (None: the hash of its TAGS)."""
        rule = self.tags_code_rules.get(topic)
        return None if rule is None else rule(props, store_ts)

    # --- put ------------------------------------------------------------------------------------------
    def put_message(self, msg: Message) -> PutResult:
        return self.put_messages([msg])

    def put_messages(self, msgs: Sequence[Message], allow_system: bool = True) -> PutResult:
        """Store ``msgs`` as one write (one batch: all visible together).  Messages may go to
        different topics and queues.  Invalid input raises MessageIllegalError."""
        if not msgs:
            raise StoreError("put_messages needs at least one message")
        self._check_messages(msgs, allow_system)
        missing = [m.properties for m in msgs if L.P_UNIQ_KEY not in m.properties]
        if missing:
            for props, uid in zip(missing, new_uniq_ids(len(missing)), strict=True):
                props[L.P_UNIQ_KEY] = uid
        props_enc = [encode_properties(m.properties) for m in msgs]
        limit = L.PROPERTY_MAX_BYTES - len(self._crc_reserve)
        for enc in props_enc:
            if len(enc) > limit:
                check_properties_size(enc + self._crc_reserve)
        now = self.clock.now_ms()
        cfg = self.config
        if len(msgs) <= SMALL_BATCH:
            batch = encode_messages(
                msgs, props_enc, now, self._store_host, cfg.store_port, cfg.append_prop_crc
            )
        else:
            topics = [m.topic for m in msgs]
            batch = encode_columns(
                topics[0] if topics.count(topics[0]) == len(topics) else topics,
                [m.queue_id for m in msgs],
                [m.body if m.body.__class__ is bytes else bytes(m.body) for m in msgs],
                [m.properties for m in msgs],
                props_enc,
                flags=[m.flag for m in msgs],
                sys_flags=[m.sys_flag for m in msgs],
                born_timestamps=[m.born_timestamp_ms or now for m in msgs],
                born_hosts=[host_bytes(m.born_host) for m in msgs],
                born_ports=[m.born_port for m in msgs],
                reconsume_times=[m.reconsume_times for m in msgs],
                prepared_offsets=[m.prepared_transaction_offset for m in msgs],
                store_host=self._store_host,
                store_port=cfg.store_port,
                prop_crc=cfg.append_prop_crc,
            )
        return self._put_encoded(batch, [m.properties[L.P_UNIQ_KEY] for m in msgs])

    def put_rows(self, rows: Sequence[Row]) -> PutResult:
        """Store a few records given as rows (:data:`~rmq_spark.store.record.Row`) as one write:
        for callers that checked their topics, bodies and queue ids as :meth:`put_messages` does
        and encoded each one's properties with its UNIQ_KEY (the broker's sends, transactions).
        The topic names are checked again here (a cached lookup): a name that is not a topic's
        is refused with MessageIllegalError, nothing written."""
        for row in rows:
            check_topic_cached(row[0], allow_system=True)
        if len(rows) == 1:
            row = rows[0]
            placed = self.try_put_row(row)
            if placed is not None:
                phys, size, qoff, now = placed
                cfg = self.config
                return PutResult(PutStatus.PUT_OK, AppendResult(phys, size, [phys], [qoff], now, self._store_host, cfg.store_port),
                                 [row[3].get(L.P_UNIQ_KEY)])  # fmt: skip
        batch = self.encode_rows(rows)
        return self._put_encoded(batch, batch.uniq_keys)

    def try_put_row(self, row: Row) -> tuple[int, int, int, int] | None:
        """:meth:`put_rows` of one record, with asynchronous flush, encoded, appended and handed to
        the dispatchers without batch objects: its (CommitLog offset, size, queue offset, store
        time).  None, nothing written, where :meth:`put_rows` must take it: sync flush, an IPv6
        host, a topic with a tagsCode rule, oversized properties, a segment to roll."""
        if not self._one_by_one:
            return None
        topic, qid, body, props, pb, tags, flag, sf, born_ms, born_host, born_port, rts, prep = row
        cfg = self.config
        prop_crc = cfg.append_prop_crc
        if topic in self.tags_code_rules or len(pb) + PROP_CRC_BYTES > L.PROPERTY_MAX_BYTES:
            return None
        sf &= V4_SYS_FLAG_MASK
        buf = encode_v4_record(topic, qid, body, pb, flag, sf, born_ms, host_bytes(born_host), born_port, rts, prep,
                         self._store_host, cfg.store_port, prop_crc)  # fmt: skip
        if buf is None:
            return None
        if self._closed:
            raise StoreError(f"store {self.root} is shut down")
        cl = self.commitlog
        size = len(buf)
        with cl.put_lock:
            cq = self._cqs.get((topic, qid))
            if cq is None or not cq.has_room(1):
                self._reserve_units([topic], [qid], [sf])
            placed = cl.append_one(buf, topic, qid, sf, prop_crc)
            if placed is None:
                return None
            phys, qoff, now = placed
            end = phys + size
            keys, uniq = props.get(L.P_KEYS), props.get(L.P_UNIQ_KEY)
            with self.publish_lock:
                for d in self.dispatchers:
                    d.dispatch_one(phys, size, topic, qid, qoff, tags, sf, now, keys, uniq, end)  # type: ignore[attr-defined]
                self.dispatched_offset = end
            batch = None
            for listener, wanted, with_batch in self._listeners:
                if wanted is None or wanted == topic:
                    if not with_batch:
                        listener()
                        continue
                    if batch is None:
                        batch = DispatchBatch([phys], [size], [topic], [qid], [qoff], [tags], [sf], [now], [keys],
                                              [uniq], [props], end)  # fmt: skip
                    listener(batch)
        return phys, size, qoff, now

    def encode_rows(self, rows: Sequence[Row]) -> EncodedBatch:
        """The records of :meth:`put_rows`, encoded one by one (at most ``SMALL_BATCH`` of them)."""
        if not rows:
            raise StoreError("put_rows needs at least one row")
        cfg = self.config
        cols = list(zip(*rows, strict=True))
        encs = cols[4]
        reserve = PROP_CRC_BYTES if cfg.append_prop_crc else 0
        if max(map(len, encs)) + reserve > L.PROPERTY_MAX_BYTES:
            for e in encs:
                check_properties_size(e + bytes(reserve))
        return encode_lists(*cols, self._store_host, cfg.store_port, cfg.append_prop_crc)  # type: ignore[arg-type, call-arg]  # the 13 columns of Row, as encode_lists takes them

    def _check_messages(self, msgs: Sequence[Message], allow_system: bool) -> None:
        """Topic names, bodies and queue ids (before anything is changed or written)."""
        configs = self.topics.topics
        body_max = self.config.body_max_bytes
        for m in msgs:
            topic = m.topic
            check_topic_cached(topic, allow_system)
            body = m.body
            if body.__class__ is not bytes or len(body) > body_max:
                check_body(body, body_max)
            cfg = configs.get(topic) or self.topics.get_or_create(topic)
            if not 0 <= m.queue_id < max(cfg.write_queue_nums, cfg.read_queue_nums):
                raise MessageIllegalError(
                    f"queueId {m.queue_id} is out of range for topic {topic!r} "
                    f"({cfg.write_queue_nums} queues)"
                )

    def put_bodies(
        self,
        topic: str,
        queue_id: int,
        bodies: Sequence[bytes],
        properties: dict[str, str] | RowProperties | None = None,
        *,
        born_timestamp_ms: int = 0,
    ) -> PutResult:
        """Fast path: many bodies for one queue sharing ``properties``, or each with its own
        (:class:`RowProperties`, built column-wise); each gets its own UNIQ_KEY.  ``bodies`` may
        be an Arrow binary column with no null (a sink's rows)."""
        if not len(bodies):
            raise StoreError("put_bodies needs at least one body")
        check_topic_cached(topic, allow_system=True)
        cfg = self.topics.get_or_create(topic)
        if not 0 <= queue_id < max(cfg.write_queue_nums, cfg.read_queue_nums):
            raise MessageIllegalError(f"queueId {queue_id} is out of range for topic {topic!r}")
        limit = self.config.body_max_bytes
        n = len(bodies)
        bodies = check_bodies(bodies, limit)
        if isinstance(properties, RowProperties):
            return self._put_row_properties(topic, queue_id, bodies, properties, born_timestamp_ms)
        base = dict(properties or {})
        base.pop(L.P_UNIQ_KEY, None)
        prefix = encode_properties(base) + b"UNIQ_KEY\x01"
        check_properties_size(prefix + bytes(33) + self._crc_reserve)
        if n <= SMALL_BATCH:  # record by record (numpy's per-call cost dominates at this size)
            uniq = new_uniq_ids(n)
            batch = encode_columns(
                topic,
                queue_id,
                bodies,
                [base] * n,
                [prefix + u.encode() + b"\x02" for u in uniq],
                born_timestamps=born_timestamp_ms or self.clock.now_ms(),
                store_host=self._store_host,
                store_port=self.config.store_port,
                prop_crc=self.config.append_prop_crc,
                tags_codes=[tags_code(base.get(L.P_TAGS))] * n,
            )
            batch.uniq_keys = uniq
            return self._put_encoded(batch, uniq)
        uniq2d = new_uniq_ids_array(n)
        props2d = np.empty((n, len(prefix) + 33), dtype=np.uint8)
        props2d[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
        props2d[:, len(prefix) : len(prefix) + 32] = uniq2d
        props2d[:, -1] = 2
        id_col = IdColumn(uniq2d)
        batch = encode_columns(
            topic,
            queue_id,
            bodies,
            [base] * n,  # one shared dict: tags and keys are the same for all
            props2d,
            born_timestamps=born_timestamp_ms or self.clock.now_ms(),
            store_host=self._store_host,
            store_port=self.config.store_port,
            prop_crc=self.config.append_prop_crc,
            tags_codes=np.full(n, tags_code(base.get(L.P_TAGS)), dtype=np.int64),
        )
        batch.uniq_keys = id_col
        return self._put_encoded(batch, id_col)

    def _put_row_properties(
        self,
        topic: str,
        queue_id: int,
        bodies: Sequence[bytes],
        props: RowProperties,
        born_timestamp_ms: int,
    ) -> PutResult:
        n = len(bodies)
        if len(props) != n:
            raise StoreError(f"{len(props)} rows of properties for {n} bodies")
        check_properties_size(bytes(props.max_bytes() + len(_UNIQ_PREFIX) + 33) + self._crc_reserve)
        ids = new_uniq_ids_array(n)
        full = props.joined(_UNIQ_PREFIX, id_column(ids), b"\x02")
        uniq = IdColumn(ids)
        batch = encode_columns(
            topic, queue_id, bodies, decoded(full), full,
            born_timestamps=born_timestamp_ms or self.clock.now_ms(), store_host=self._store_host,
            store_port=self.config.store_port, prop_crc=self.config.append_prop_crc,
            tags_codes=props.tags_codes, keys=props.keys, uniq_keys=uniq,
        )  # fmt: skip
        batch.uniq_keys = uniq
        return self._put_encoded(batch, uniq)

    def put_encoded(self, batch: EncodedBatch) -> PutResult:
        """Append an already encoded batch as one write (for services that re-write stored
        records). ``batch.uniq_keys`` are its messages' unique ids."""
        return self._put_encoded(batch, list(batch.uniq_keys))

    def _put_encoded(self, batch: EncodedBatch, uniq_keys: Sequence[str | None]) -> PutResult:
        if self._closed:
            raise StoreError(f"store {self.root} is shut down")
        cl = self.commitlog
        with cl.put_lock:
            self._reserve_units(batch.topics, batch._queue_ids, batch._sys_flags)  # noqa: SLF001
            result, dispatch = cl.append(batch)
            if self.config.flush == "async":
                self._publish(dispatch)
            else:
                with self._pending_lock:
                    self._pending.append(dispatch)
        if self._group_commit is not None:
            if not self._group_commit.wait_durable(result.end_offset):
                return PutResult(PutStatus.FLUSH_DISK_TIMEOUT, result, uniq_keys)
        return PutResult(PutStatus.PUT_OK, result, uniq_keys)

    def _reserve_units(self, topics: Sequence[str], queue_ids: Any, sys_flags: Any) -> None:
        """The ConsumeQueue segments the records about to be appended need, made before the
        append (caller holds the put lock): on a full disk the put fails here, nothing written,
        no queue offset taken."""
        counts: dict[tuple[str, int], int] = {}
        if len(topics) > SMALL_BATCH:
            flags = np.asarray(sys_flags) & L.TRANSACTION_MASK
            consumable = (flags == L.TRANSACTION_NOT_TYPE) | (flags == L.TRANSACTION_COMMIT_TYPE)
            for key, idx in group_by_queue(topics, np.asarray(queue_ids)).items():
                counts[key] = int(consumable[idx].sum())
        else:
            for t, q, f in zip(topics, as_list(queue_ids), as_list(sys_flags), strict=True):
                tran = f & L.TRANSACTION_MASK
                if tran == L.TRANSACTION_NOT_TYPE or tran == L.TRANSACTION_COMMIT_TYPE:
                    counts[(t, q)] = counts.get((t, q), 0) + 1
        table = self.commitlog.queue_table
        for key, n in counts.items():
            if n:
                cq = self._cqs.get(key)
                if cq is None:
                    with self.publish_lock:  # snapshots iterate the queues under it
                        cq = self.consume_queue(*key, create=True)
                assert cq is not None  # create=True makes it
                cq.reserve(table.get(key, 0), n)

    def _publish(self, dispatch: DispatchBatch) -> None:
        with self.publish_lock:
            for d in self.dispatchers:
                d.dispatch(dispatch)
            self.dispatched_offset = dispatch.end_offset
        topics = dispatch.topics
        for listener, wanted, with_batch in self._listeners:
            if wanted is None or wanted in topics:
                if with_batch:
                    listener(dispatch)
                else:
                    listener()

    def add_listener(
        self, listener: Callable[..., None], topic: str | None = None, *, batch: bool = True
    ) -> None:
        """Called after each dispatched batch (outside the publish lock) with the DispatchBatch:
        long polling, services; with ``topic``, only after batches holding a record of that topic;
        with ``batch=False`` called with no argument (a waker: a one-record put makes no batch)."""
        self._listeners = [*self._listeners, (listener, topic, batch)]

    def remove_listener(self, listener: Callable[[DispatchBatch], None]) -> None:
        """Stop calling ``listener`` (a service that shuts down before the store)."""
        self._listeners = [x for x in self._listeners if x[0] != listener]

    def _dispatch_pending(self, durable_offset: int) -> None:
        with self._pending_lock:
            ready = [b for b in self._pending if b.end_offset <= durable_offset]
            self._pending = [b for b in self._pending if b.end_offset > durable_offset]
        for b in ready:
            self._publish(b)

    # --- flush ------------------------------------------------------------------------------------------
    def group_commit_stats(self) -> tuple[int, int]:
        """Sync flush: (fdatasync rounds, puts they made durable) so far; (0, 0) with async flush."""
        gc = self._group_commit
        return (gc.flushes, gc.served) if gc is not None else (0, 0)

    def _sync_flush(self) -> int:
        flushed = self.commitlog.flush()
        self._dispatch_pending(flushed)
        self.checkpoint.physic_msg_timestamp = self.commitlog.last_store_timestamp_ms
        self.checkpoint.confirm_phy_offset = flushed
        return flushed

    def flush_all(self, thorough: bool = True) -> None:
        """Flush the CommitLog, then the ConsumeQueues, then the checkpoint."""
        flushed = self.commitlog.flush()
        self.checkpoint.physic_msg_timestamp = self.commitlog.last_store_timestamp_ms
        self.checkpoint.confirm_phy_offset = flushed
        self._flush_logics()

    def _flush_logics(self) -> None:
        with self.publish_lock:
            dispatched = self.dispatched_offset
            cqs = list(self._cqs.values())
        for cq in cqs:
            cq.flush()
        for d in self.dispatchers:
            flush = getattr(d, "flush", None)
            if flush is not None:
                flush()
        self.checkpoint.logics_msg_timestamp = self.commitlog.last_store_timestamp_ms
        self.checkpoint.dispatched_offset = min(
            dispatched, self.checkpoint.confirm_phy_offset or dispatched
        )
        self.checkpoint.flush()

    # --- reads --------------------------------------------------------------------------------------------
    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self._cqs.get((topic, queue_id))
        return cq.min_offset if cq else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self._cqs.get((topic, queue_id))
        return cq.max_offset if cq else 0

    def max_offsets_snapshot(
        self, topics: Iterable[str] | None = None
    ) -> dict[str, dict[int, int]]:
        """Max offsets of every queue of ``topics`` (all topics if None), taken under the publish
        lock: a batch put is in a snapshot entirely or not at all."""
        wanted = None if topics is None else set(topics)
        out: dict[str, dict[int, int]] = {}
        with self.publish_lock:
            for (t, q), cq in self._cqs.items():
                if wanted is None or t in wanted:
                    out.setdefault(t, {})[q] = cq.max_offset
        if wanted:
            for t in wanted:
                cfg = self.topics.get(t)
                n = cfg.read_queue_nums if cfg else 0
                qs = out.setdefault(t, {})
                for q in range(n):
                    qs.setdefault(q, 0)
        return out

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            return 0
        return cq.offset_by_time(timestamp_ms, self.commitlog.store_timestamp)

    def look_message_by_offset(
        self, commitlog_offset: int, size: int | None = None
    ) -> MessageExt | None:
        if not self.commitlog.min_offset <= commitlog_offset < self.commitlog.max_offset:
            return None
        return self.commitlog.read_record(commitlog_offset, size)

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int = 32,
        max_bytes: int = 4 * 1024 * 1024,
        message_filter: object | None = None,
    ) -> GetResult:
        """Messages of (topic, queue) from ``offset``: at most ``max_msgs`` messages or
        ``max_bytes`` bytes.  ``message_filter`` is any object with ``matches_code(tagsCode)``
        (checked on the ConsumeQueue unit first) and/or ``matches_message(MessageExt)`` (then on
        the record), and ``match_all`` when it lets everything through (the filters of
        :mod:`rmq_spark.filter` are such objects).  A damaged record ends the batch before it
        (``next_offset`` is its offset); a read that starts at it raises :class:`CorruptStoreError`
        naming its file and position, so a consumer stops exactly there (as Kafka's fetch does)."""
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, [], 0, 0, 0)
        lo, hi = cq.min_offset, cq.max_offset
        if hi == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, [], 0, lo, hi)
        if offset < lo:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, [], lo, lo, hi)
        if offset == hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, [], offset, lo, hi)
        if offset > hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, [], hi, lo, hi)
        out: list[MessageExt] = []
        nbytes = 0
        next_offset = offset
        match_code = getattr(message_filter, "matches_code", None)
        match_msg = getattr(message_filter, "matches_message", None)
        if getattr(message_filter, "match_all", False):
            match_code = match_msg = None
        while next_offset < hi and len(out) < max_msgs and nbytes < max_bytes:
            units = cq.units(next_offset, min(hi, next_offset + max(max_msgs * 4, 64)))
            if len(units) == 0:
                break
            for phys, size, tcode in zip(
                units["offset"].tolist(),
                units["size"].tolist(),
                units["tags_code"].tolist(),
                strict=True,
            ):
                if len(out) >= max_msgs or (out and nbytes + size > max_bytes):
                    break
                next_offset += 1
                if match_code is not None and not match_code(tcode):
                    continue
                try:  # a damaged record ends the batch before it; a read that starts at it raises
                    m = self.commitlog.read_record(phys, size)  # (file and position), as Kafka does
                    if m is not None and (
                        m.topic != topic
                        or m.queue_id != queue_id
                        or m.queue_offset != next_offset - 1
                    ):
                        raise self._wrong_unit(cq, next_offset - 1, m)
                except CorruptStoreError:
                    if next_offset - 1 == offset:
                        raise
                    next_offset -= 1
                    break
                if m is None:
                    self._unreadable_unit(cq, next_offset - 1, phys, size)
                    continue
                if match_msg is not None and not match_msg(m):
                    continue
                out.append(m)
                nbytes += size
            else:
                continue
            break
        status = GetStatus.FOUND if out else GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, out, next_offset, lo, hi)

    def _unreadable_unit(self, cq: ConsumeQueue, queue_offset: int, phys: int, size: int) -> None:
        """A unit whose record cannot be read is passed over; unless its CommitLog segment was
        deleted (expired messages, as RocketMQ passes them over), that is damage: logged with the
        files and positions."""
        mf = self.commitlog.mfq.find(phys)
        if mf is None:
            return
        log.error(
            "ConsumeQueue %s/%d unit %d (%s) points at %d bytes at position %d of %s, which hold no record: passed over",
            cq.topic, cq.queue_id, queue_offset, cq.mfq.directory, size,
            phys - mf.from_offset, mf.path,
        )  # fmt: skip

    def _wrong_unit(self, cq: ConsumeQueue, queue_offset: int, m: MessageExt) -> CorruptStoreError:
        """A ConsumeQueue unit that points at a valid record of another queue or offset."""
        path, pos = cq.unit_location(queue_offset)
        return CorruptStoreError(
            f"{path}: ConsumeQueue unit {queue_offset} of {cq.topic}/{cq.queue_id} at position {pos} "
            f"points at CommitLog offset {m.commitlog_offset}, the record of {m.topic}/{m.queue_id} "
            f"offset {m.queue_offset}; it is not served",
            path,
            pos,
        )

    def read_arrow(self, topic: str, queue_id: int, start: int, end: int, **kw: Any) -> Any:
        """Messages ``[start, end)`` of one queue as a ``pyarrow.RecordBatch`` (source schema)."""
        from rmq_spark.store.reader import read_queue_arrow

        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            from rmq_spark.store.reader import empty_batch

            return empty_batch(kw.get("columns"))
        kw.setdefault("force_prop_crc", self.commitlog.force_prop_crc)
        return read_queue_arrow(self.commitlog.mfq, cq, topic, queue_id, start, end, **kw)


def _lock_directory(root: str) -> int:
    path = os.path.join(root, L.LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)
        raise StoreLockedError(
            f"store directory {root} is in use by another process (pid {owner}); "
            "one broker owns a store at a time"
        ) from None
    holder = lock_like_apache(
        fd
    )  # Apache RocketMQ's lock: flock and fcntl locks do not exclude each other
    if holder is not None:
        os.close(fd)
        raise StoreLockedError(
            f"store directory {root} is in use by another process ({holder}), such as an Apache RocketMQ "
            f"broker, which holds the POSIX lock on {path}; one broker owns a store at a time"
        )
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    except OSError as e:  # the pid is for people; a full disk must not stop a start
        if not is_no_space(e):
            raise
    return fd


def _write_marker(path: str, text: str) -> None:
    """The abort marker: without it a crash would pass for a clean stop, so a store that cannot
    create it does not start.  The pid inside is for people: on a full disk the marker stays
    empty (a new file needs an inode, not a block)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as e:
        if is_no_space(e):
            raise DiskFullError(
                f"{path}: no space left on the device for the store's abort marker; free space and start "
                "again (the store does not start without it: a crash would pass for a clean stop)",
                path,
            ) from None
        raise
    try:
        os.write(fd, text.encode())
    except OSError as e:
        if not is_no_space(e):
            raise
    finally:
        os.close(fd)
