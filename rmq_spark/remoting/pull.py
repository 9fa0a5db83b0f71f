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
========================================  =========================  =====================

Long polling: a request with the SUSPEND flag that found nothing new waits (a future on the event
loop, no thread) until a message is dispatched to its queue or ``suspendTimeoutMillis`` passes,
then is run again.  The filter is the request's own subscription (SUBSCRIPTION flag: pull and
lite pull consumers) or the one the group's heartbeat registered for the topic (push consumers).
A COMMIT_OFFSET flag stores ``commitOffset`` as the group's offset.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any

import numpy as np

from rmq_spark.errors import FilterExpressionError
from rmq_spark.filter import SqlFilter, TagFilter, make_filter
from rmq_spark.remoting.clients import ClientManager
from rmq_spark.remoting.codes import PullSysFlag, ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.headers import fields_of
from rmq_spark.remoting.server import Connection, EventLoopThread

__all__ = ["PullProcessor"]

log = logging.getLogger("rmq_spark.remoting.pull")

MAX_PULL_MESSAGES = 1024
MAX_PULL_BYTES = 4 << 20
# records scanned per request when a filter skips some (RocketMQ's maxFilterMessageCount is 16000
# bytes of units, 800 units)
FILTER_SCAN_UNITS = 800
MAX_SUSPEND_MS = 60_000
_FILTER_CACHE_SIZE = 256


class PullProcessor:
    def __init__(self, store: Any, clients: ClientManager, loop_thread: EventLoopThread) -> None:
        self.store = store
        self.clients = clients
        self.loop = loop_thread.loop
        self._filters: OrderedDict[tuple[str, str], TagFilter | SqlFilter] = OrderedDict()
        # (topic, queue id) -> (offset, future) of suspended pulls (touched on the event loop only)
        self._waiters: dict[tuple[str, int], list[tuple[int, asyncio.Future[None]]]] = {}
        self._check_scheduled = False
        self.traffic: Any = None  # rmq_spark.services.traffic.Traffic when metrics are on
        # a waker (no DispatchBatch made per put): it looks at the waiting queues' max offsets
        store.add_listener(self._on_dispatch, batch=False)

    def close(self) -> None:
        self.store.remove_listener(self._on_dispatch)

    # --- long polling ---------------------------------------------------------------------------
    def _on_dispatch(self) -> None:
        """Store listener (any thread, after every put): when pulls are suspended, check them on
        the loop, once however many puts come before the check runs."""
        if not self._waiters or self._check_scheduled:
            return
        self._check_scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._check_waiters)
        except RuntimeError:  # the loop is closed: the broker is stopping
            pass

    def _check_waiters(self) -> None:
        self._check_scheduled = False
        max_offset = self.store.max_offset
        for key in list(self._waiters):
            hi = max_offset(*key)
            waiting = self._waiters[key]
            ready = [fut for offset, fut in waiting if hi > offset]
            if ready:
                self._waiters[key] = [(o, f) for o, f in waiting if not f.done() and hi <= o]
                if not self._waiters[key]:
                    del self._waiters[key]
                for fut in ready:
                    if not fut.done():
                        fut.set_result(None)

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
            return req.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not cfg.readable:
            return req.response(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        if not 0 <= queue_id < max(cfg.read_queue_nums, 1):
            return req.response(ResponseCode.SYSTEM_ERROR,
                                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                                f"[{cfg.read_queue_nums}]")  # fmt: skip
        if sys_flag & PullSysFlag.SUBSCRIPTION:
            expression, expression_type = f.str("subscription", "*"), f.str("expressionType", "TAG")
        else:
            sub = self.clients.subscription(group, topic)
            if sub is None:
                return req.response(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                    f"the consumer's subscription not exist, group: {group}")  # fmt: skip
            expression, expression_type = sub.expression, sub.expression_type
        try:
            message_filter = self._filter(expression_type, expression)
        except FilterExpressionError as e:
            return req.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"parse the consumer's subscription failed: {e}")
        if sys_flag & PullSysFlag.COMMIT_OFFSET:
            commit = f.long("commitOffset", -1)
            if commit >= 0:
                self.store.offsets.commit(group, topic, queue_id, commit)
        answer = self._read(req, topic, queue_id, offset, max_msgs, max_bytes, message_filter)
        if answer.code != ResponseCode.PULL_NOT_FOUND or not sys_flag & PullSysFlag.SUSPEND or suspend_ms <= 0:
            return answer
        return self._suspend(req, topic, queue_id, offset, max_msgs, max_bytes, message_filter, suspend_ms)

    async def _suspend(self, req: RemotingCommand, topic: str, queue_id: int, offset: int, max_msgs: int,
                       max_bytes: int, message_filter: Any, suspend_ms: int) -> RemotingCommand:  # fmt: skip
        key = (topic, queue_id)
        fut: asyncio.Future[None] = self.loop.create_future()
        self._waiters.setdefault(key, []).append((offset, fut))
        # a message stored between the read and the registration woke nobody: look again
        if self.store.max_offset(topic, queue_id) > offset:
            fut.set_result(None)
        try:
            await asyncio.wait_for(fut, suspend_ms / 1000)
        except asyncio.TimeoutError:
            pass
        finally:
            waiting = self._waiters.get(key)
            if waiting is not None:
                waiting[:] = [(o, f) for o, f in waiting if f is not fut]
                if not waiting:
                    del self._waiters[key]
        return self._read(req, topic, queue_id, offset, max_msgs, max_bytes, message_filter)

    def _filter(self, expression_type: str, expression: str) -> TagFilter | SqlFilter:
        key = (expression_type.upper(), expression)
        flt = self._filters.get(key)
        if flt is None:
            flt = make_filter(expression_type, expression)
            self._filters[key] = flt
            if len(self._filters) > _FILTER_CACHE_SIZE:
                self._filters.popitem(last=False)
        return flt

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
        scan = max(max_msgs, FILTER_SCAN_UNITS) if (filtered_by_tag or filtered_by_sql) else max_msgs
        units = cq.units(offset, min(hi, offset + scan))
        if len(units) == 0:
            return self._answer(req, ResponseCode.PULL_NOT_FOUND, offset, lo, hi)
        phys = units["offset"].astype(np.int64)
        sizes = units["size"].astype(np.int64)
        keep = message_filter.mask_codes(units["tags_code"].astype(np.int64)) if filtered_by_tag else None
        commitlog = store.commitlog
        mfq = commitlog.mfq
        parts: list[bytes] = []
        nbytes = 0
        scanned = 0
        for i, (p, s) in enumerate(zip(phys.tolist(), sizes.tolist())):
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
            if filtered_by_sql:
                m = commitlog.read_record(p, s, read_body=False)
                if m is None or not message_filter.matches(m.properties):
                    continue
            elif filtered_by_tag:
                m = commitlog.read_record(p, s, read_body=False)  # tag codes collide: check the tag
                if m is None or not message_filter.matches(m.tags):
                    continue
            parts.append(mf.mm[pos : pos + s])
            nbytes += s
        next_offset = offset + scanned
        if not parts:
            return self._answer(req, ResponseCode.PULL_RETRY_IMMEDIATELY, next_offset, lo, hi)
        if self.traffic is not None:
            self.traffic.delivered(topic, req.ext_fields.get("consumerGroup", ""), len(parts), nbytes)
        return self._answer(req, ResponseCode.SUCCESS, next_offset, lo, hi, b"".join(parts))

    @staticmethod
    def _answer(req: RemotingCommand, code: ResponseCode, next_offset: int, lo: int, hi: int,
                body: bytes = b"") -> RemotingCommand:  # fmt: skip
        header = {"suggestWhichBrokerId": "0", "nextBeginOffset": str(next_offset), "minOffset": str(lo),
                  "maxOffset": str(hi)}  # fmt: skip
        remark = None if code == ResponseCode.SUCCESS else code.name
        return req.response(code, remark, header, body)
