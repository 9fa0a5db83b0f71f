"""PULL_MESSAGE / LITE_PULL_MESSAGE (``PullMessageProcessor``): a queue read from an offset.

The answer's body is the CommitLog records themselves, concatenated, as RocketMQ sends them (the
client decodes them with ``MessageDecoder.decodesBatch``).  Outcomes and their response codes:

========================================  =========================  =====================
the queue at the requested offset         code                       nextBeginOffset
========================================  =========================  =====================
messages found                            SUCCESS                    after the last one read
messages, none matching the filter        PULL_RETRY_IMMEDIATELY     after those scanned
offset == max (nothing new)               PULL_NOT_FOUND             offset (long polled)
empty queue, offset 0                     PULL_NOT_FOUND             0 (long polled)
offset < min, offset > max, or offset     PULL_OFFSET_MOVED          min (max when over it
>0 on an empty queue                                                 and min > 0)
a damaged record (CRC, layout) at offset  SYSTEM_ERROR, naming its   --
                                          CommitLog file, position
========================================  =========================  =====================

Every record served is first held to its ConsumeQueue unit (layout, queue, offset, CRCs): a batch
ends before a damaged record (nextBeginOffset is its offset), and only the pull that starts at it
is refused, so a consumer stops exactly there, as Kafka's fetch does.

Long polling: a request with the SUSPEND flag that found nothing new is parked (no thread, no task:
:mod:`rmq_spark.remoting.longpoll`) until a message is dispatched to its queue or
``suspendTimeoutMillis`` passes, then is run again; past the bounds on parked pulls (per
connection and in all) it is answered at once, SYSTEM_BUSY (the clients then wait a while).  The filter is the request's own
subscription (SUBSCRIPTION flag: pull and lite pull consumers) or the one the group's heartbeat
registered for the topic (push consumers).
A COMMIT_OFFSET flag stores ``commitOffset`` as the group's offset.  An SQL92 expression the
processor has not seen is parsed on the server's thread pool, not on the event loop; the outcome
(a filter, or why it does not parse) is cached.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import numpy as np

from rmq_spark.errors import CorruptStoreError, FilterExpressionError
from rmq_spark.filter import MAX_EXPRESSION_CHARS, SqlFilter, TagFilter, make_filter
from rmq_spark.remoting.clients import ClientManager
from rmq_spark.remoting.codes import PullSysFlag, ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.headers import fields_of
from rmq_spark.remoting.longpoll import LongPollHold
from rmq_spark.remoting.server import Connection, EventLoopThread
from rmq_spark.store.consistency import bad_units, why_bad

__all__ = ["PullProcessor"]

log = logging.getLogger("rmq_spark.remoting.pull")

MAX_PULL_MESSAGES = 1024
MAX_PULL_BYTES = 4 << 20
# records scanned per request when a filter skips some (RocketMQ's maxFilterMessageCount is 16000
# bytes of units, 800 units)
FILTER_SCAN_UNITS = 800
MAX_SUSPEND_MS = 60_000
_FILTER_CACHE_SIZE = 256
# the flags as plain ints (an IntFlag operation builds an enum member: slow per request)
_SUBSCRIPTION, _COMMIT_OFFSET, _SUSPEND = (int(PullSysFlag.SUBSCRIPTION), int(PullSysFlag.COMMIT_OFFSET),
                                           int(PullSysFlag.SUSPEND))  # fmt: skip


class PullProcessor:
    def __init__(self, store: Any, clients: ClientManager, loop_thread: EventLoopThread) -> None:
        self.store = store
        self.clients = clients
        self.loop = loop_thread.loop
        # (expression type, expression) -> its filter, or the error it raised
        self._filters: OrderedDict[
            tuple[str, str], TagFilter | SqlFilter | FilterExpressionError
        ] = OrderedDict()
        self._loop_thread = loop_thread
        self.hold = LongPollHold(self.loop, store.max_offset)
        self.traffic: Any = None  # rmq_spark.services.traffic.Traffic when metrics are on
        store.add_listener(self._on_dispatch)

    def close(self) -> None:
        """Stop waking; answer every parked pull (on the loop, waiting for it), so none is left."""
        import concurrent.futures
        import threading

        self.store.remove_listener(self._on_dispatch)
        loop = self.loop
        if loop.is_closed() or not loop.is_running():
            return
        done: concurrent.futures.Future[int] = concurrent.futures.Future()

        def release() -> None:
            try:
                done.set_result(self.hold.release_all())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                done.set_exception(e)

        if threading.get_ident() == self._loop_thread.thread_id:
            release()
            return
        try:
            loop.call_soon_threadsafe(release)
            done.result(timeout=10)
        except (RuntimeError, concurrent.futures.TimeoutError):  # the loop stopped first
            pass

    # --- long polling ---------------------------------------------------------------------------
    def _on_dispatch(self, batch: Any) -> None:
        """Store listener (any thread, after every put): wake the pulls parked on the queues it
        wrote (nothing to do, and no work, when none is parked)."""
        if self.hold.parked:
            self.hold.notify(batch.topics, batch.column_list("queue_ids"))

    # --- the request ----------------------------------------------------------------------------
    def pull(self, conn: Connection, req: RemotingCommand) -> Any:
        f = fields_of(req.ext_fields)
        group, topic = f.str("consumerGroup"), f.str("topic")
        queue_id, offset = f.int("queueId"), f.long("queueOffset")
        max_msgs = max(1, min(f.int("maxMsgNums"), MAX_PULL_MESSAGES))
        sys_flag = f.int("sysFlag")
        suspend_ms = min(max(f.long("suspendTimeoutMillis", 0), 0), MAX_SUSPEND_MS)
        max_bytes = max(1, min(f.int("maxMsgBytes", MAX_PULL_BYTES), MAX_PULL_BYTES))
        cfg = self.store.topics.get(topic)
        if cfg is None:
            return req.response(
                ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
            )
        if not cfg.readable:
            return req.response(
                ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden"
            )
        if not 0 <= queue_id < max(cfg.read_queue_nums, 1):
            return req.response(ResponseCode.SYSTEM_ERROR,
                                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                                f"[{cfg.read_queue_nums}]")  # fmt: skip
        if sys_flag & _SUBSCRIPTION:
            expression, expression_type = f.str("subscription", "*"), f.str("expressionType", "TAG")
        else:
            sub = self.clients.subscription(group, topic)
            if sub is None:
                return req.response(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                    f"the consumer's subscription not exist, group: {group}")  # fmt: skip
            expression, expression_type = sub.expression, sub.expression_type

        def serve(flt: TagFilter | SqlFilter | FilterExpressionError) -> Any:
            if isinstance(flt, FilterExpressionError):
                return req.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                                    f"parse the consumer's subscription failed: {flt}")  # fmt: skip
            return self._serve(conn, req, f, group, topic, queue_id, offset, max_msgs, max_bytes, sys_flag,
                               suspend_ms, flt)  # fmt: skip

        if len(expression) > MAX_EXPRESSION_CHARS:  # refused at once: not parsed, not cached
            try:
                make_filter(expression_type, expression)
            except FilterExpressionError as e:
                return serve(e)
        key = (expression_type.upper(), expression)
        flt = self._filters.get(key)
        if flt is None and key[0] == "SQL92":  # a parse that may take long: off the event loop

            async def parse_then_serve() -> Any:
                try:
                    parsed = await conn.run_blocking(make_filter, expression_type, expression)
                except FilterExpressionError as e:
                    parsed = e
                self._remember(key, parsed)
                return serve(parsed)

            return parse_then_serve()
        if flt is None:
            try:
                flt = make_filter(expression_type, expression)
            except FilterExpressionError as e:
                flt = e
            self._remember(key, flt)

        return serve(flt)

    def _serve(self, conn: Connection, req: RemotingCommand, f: Any, group: str, topic: str, queue_id: int,
               offset: int, max_msgs: int, max_bytes: int, sys_flag: int, suspend_ms: int,
               message_filter: TagFilter | SqlFilter) -> RemotingCommand | None:  # fmt: skip
        if sys_flag & _COMMIT_OFFSET:
            commit = f.long("commitOffset", -1)
            if commit >= 0:
                self.store.offsets.commit(group, topic, queue_id, commit)
        answer = self._read(req, topic, queue_id, offset, max_msgs, max_bytes, message_filter)
        if answer.code != ResponseCode.PULL_NOT_FOUND or not sys_flag & _SUSPEND or suspend_ms <= 0:
            return answer

        def again() -> RemotingCommand:
            return self._read(req, topic, queue_id, offset, max_msgs, max_bytes, message_filter)

        if self.hold.park(conn, req, (topic, queue_id), offset, suspend_ms / 1000, again):
            return None  # answered when woken, expired or released
        # past the bounds on parked pulls: SYSTEM_BUSY, on which the clients wait before pulling
        # again (an answer of "nothing new" would have them pull again at once, and spin)
        return req.response(ResponseCode.SYSTEM_BUSY, f"[PULL_HOLD]system busy: {self.hold.parked} pulls are "
                                                      "parked, the most this broker holds; try again later")  # fmt: skip

    def _remember(
        self, key: tuple[str, str], flt: TagFilter | SqlFilter | FilterExpressionError
    ) -> None:
        self._filters[key] = flt
        self._filters.move_to_end(key)
        if len(self._filters) > _FILTER_CACHE_SIZE:
            self._filters.popitem(last=False)

    # --- reading --------------------------------------------------------------------------------
    def _read(self, req: RemotingCommand, topic: str, queue_id: int, offset: int, max_msgs: int, max_bytes: int,
              message_filter: TagFilter | SqlFilter) -> RemotingCommand:  # fmt: skip
        store = self.store
        cq = store.consume_queue(topic, queue_id)
        lo, hi = (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)
        if hi == 0 or offset == hi:
            if offset == hi:
                return self._answer(req, ResponseCode.PULL_NOT_FOUND, offset, lo, hi)
            return self._answer(req, ResponseCode.PULL_OFFSET_MOVED, 0, lo, hi)
        if offset < lo:
            return self._answer(req, ResponseCode.PULL_OFFSET_MOVED, lo, lo, hi)
        if offset > hi:
            return self._answer(req, ResponseCode.PULL_OFFSET_MOVED, hi if lo > 0 else lo, lo, hi)
        filtered_by_tag = isinstance(message_filter, TagFilter) and not message_filter.match_all
        filtered_by_sql = isinstance(message_filter, SqlFilter)
        scan = (
            max(max_msgs, FILTER_SCAN_UNITS) if (filtered_by_tag or filtered_by_sql) else max_msgs
        )
        units = cq.units(offset, min(hi, offset + scan))
        if len(units) == 0:
            return self._answer(req, ResponseCode.PULL_NOT_FOUND, offset, lo, hi)
        phys = units["offset"].astype(np.int64)
        sizes = units["size"].astype(np.int64)
        keep: np.ndarray | None = None
        if filtered_by_tag:  # a TagFilter
            keep = message_filter.mask_codes(units["tags_code"].astype(np.int64))  # type: ignore[union-attr]
        commitlog = store.commitlog
        mfq = commitlog.mfq
        parts: list[bytes] = []
        served: list[int] = []  # unit index of each part
        nbytes = 0
        scanned = 0
        corrupt: int | None = None  # unit index of a damaged record
        for i, (p, s) in enumerate(zip(phys.tolist(), sizes.tolist(), strict=True)):
            if len(parts) >= max_msgs or (parts and nbytes + s > max_bytes):
                break
            scanned = i + 1
            if keep is not None and not keep[i]:
                continue
            mf = mfq.find(p)
            if mf is None:
                continue  # a deleted segment: passed over, as RocketMQ does
            pos = p - mf.from_offset
            if pos + s > mf.wrote_position:
                continue
            try:
                if filtered_by_sql:
                    m = commitlog.read_record(p, s, read_body=False)
                    if m is None or not message_filter.matches(m.properties):
                        continue
                elif filtered_by_tag:
                    m = commitlog.read_record(
                        p, s, read_body=False
                    )  # tag codes collide: check the tag
                    if m is None or not message_filter.matches(m.tags):
                        continue
            except CorruptStoreError:
                corrupt = scanned = i
                break
            parts.append(mf.mm[pos : pos + s])
            served.append(i)
            nbytes += s
        # every record served is held to its unit (layout, queue, offset, CRCs) first: the batch
        # ends before a damaged one, and a pull that starts at it is answered with its file and
        # position (as Kafka's fetch does), so a consumer stops exactly at it
        rows = np.array(served, dtype=np.int64)
        bad = bad_units(
            mfq, phys[rows], sizes[rows], topic, queue_id, offset + rows, commitlog.force_prop_crc
        )
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            del parts[k:]
            nbytes = sum(len(x) for x in parts)
            corrupt = scanned = int(rows[k])
        if corrupt == 0:
            path, pos, why = why_bad(mfq, int(phys[0]), int(sizes[0]), commitlog.force_prop_crc)
            return req.response(ResponseCode.SYSTEM_ERROR, f"{path}: corrupt CommitLog record at position {pos} "
                                f"(offset {int(phys[0])}), unit {offset} of {topic}/{queue_id}: {why}; it is not "
                                "served")  # fmt: skip
        next_offset = offset + scanned
        if not parts:
            return self._answer(req, ResponseCode.PULL_RETRY_IMMEDIATELY, next_offset, lo, hi)
        if self.traffic is not None:
            self.traffic.delivered(
                topic, req.ext_fields.get("consumerGroup", ""), len(parts), nbytes
            )
        return self._answer(req, ResponseCode.SUCCESS, next_offset, lo, hi, b"".join(parts))

    @staticmethod
    def _answer(req: RemotingCommand, code: ResponseCode, next_offset: int, lo: int, hi: int,
                body: bytes = b"") -> RemotingCommand:  # fmt: skip
        header = {"suggestWhichBrokerId": "0", "nextBeginOffset": str(next_offset), "minOffset": str(lo),
                  "maxOffset": str(hi)}  # fmt: skip
        remark = None if code == ResponseCode.SUCCESS else code.name
        return req.response(code, remark, header, body)
