"""ReceiveMessage and PullMessage, the calls that long-poll: served on the server's event loop.

Each one checks its request as every handler does, then looks for messages on a worker thread
(:meth:`rmq_spark.broker.service.MessagingService.run`: the store blocks) and, finding none, parks
on the loop (:mod:`rmq_spark.broker.wakeups`) under the topics whose writes could answer it (a
receive: its topic and its group's retry topic; a pull: its topic) until one is written, the
broker stops or its time is up, then looks again.  A parked poll holds no thread, so thousands
of them cost no worker.  The answers are built on the worker thread too (a message's digest).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from rocketmq.grpc_protocol import service_pb2 as S

from rmq_spark.broker import codes
from rmq_spark.broker.access import Use, group_name, topic_name
from rmq_spark.broker.codes import Code, RpcStatusError
from rmq_spark.broker.handler import now_response
from rmq_spark.broker.messages import to_proto
from rmq_spark.broker.pop import retry_topic
from rmq_spark.store.status import GetStatus

__all__ = ["PULL_MAX_BYTES", "pull", "receive"]

CLIENT_ID = "x-mq-client-id"
PULL_MAX_BYTES = 16 * 1024 * 1024


async def receive(
    service: Any, request: S.ReceiveMessageRequest, context: Any
) -> AsyncIterator[S.ReceiveMessageResponse]:
    """ReceiveMessage's answers (a fault escaping is answered by the service's wrapper)."""
    meta = service._meta(context)
    group = group_name(request.group.name)
    name = topic_name(request.message_queue.topic.name, Use.READ)
    cfg = service._topic(name)
    if not cfg.readable:
        raise RpcStatusError(Code.FORBIDDEN, f"topic {name!r} is not readable")
    flt = service._filter(request.filter_expression)
    if request.batch_size <= 0:
        raise RpcStatusError(
            Code.BAD_REQUEST, f"batch size must be positive, not {request.batch_size}"
        )
    batch = min(request.batch_size, service.options.max_receive_batch)
    if request.auto_renew:
        invisible_ms = service.options.auto_renew_invisible_ms
    elif not request.HasField("invisible_duration"):
        raise RpcStatusError(
            Code.ILLEGAL_INVISIBLE_TIME, "invisible_duration is required unless auto_renew is set"
        )
    else:
        invisible_ms = request.invisible_duration.ToMilliseconds()
        service._check_invisible(invisible_ms, service.options.min_invisible_ms)
    wait_ms = service._wait_ms(
        request.long_polling_timeout, request.HasField("long_polling_timeout"), context
    )
    cid = meta[CLIENT_ID]
    service.clients.touch(cid, group=group)
    ns = request.message_queue.topic.resource_namespace
    pop = service.pop

    def take() -> list[S.ReceiveMessageResponse]:
        got = pop.pop(
            group, name, flt, batch, invisible_ms, client_id=cid, auto_renew=request.auto_renew
        )
        if not got:
            return []
        out = [S.ReceiveMessageResponse(status=codes.ok())]
        for d in got:
            out.append(
                S.ReceiveMessageResponse(
                    message=to_proto(
                        d.message,
                        topic=d.topic,
                        namespace=ns,
                        receipt_handle=d.handle,
                        delivery_attempt=d.attempt,
                        invisible_ms=d.invisible_ms,
                    )
                )
            )
        return out

    # a long poll: the store work runs on the worker threads, the wait on the event loop
    give_up = time.monotonic() + wait_ms / 1000
    topics = (name, retry_topic(group))
    while True:
        version = pop.version
        answer = await service.run(take)
        if answer or pop.closing:
            break
        left = give_up - time.monotonic()
        if left <= 0:
            break
        await pop.wakeups.wait(topics, left, lambda v=version: pop.version == v and not pop.closing)
        if pop.closing:
            break
    if answer:
        for r in answer:
            yield r
    else:
        yield S.ReceiveMessageResponse(
            status=codes.status(Code.MESSAGE_NOT_FOUND, "no new message")
        )
    yield now_response(service)


async def pull(
    service: Any, request: S.PullMessageRequest, context: Any
) -> AsyncIterator[S.PullMessageResponse]:
    """PullMessage's answers: status, the messages from ``offset``, the next offset."""
    service._meta(context)
    if request.group.name:
        group_name(request.group.name)  # a malformed group name is refused, as everywhere
    cfg, qid = service._queue_of(request.message_queue)
    offset = request.offset
    if offset < 0:
        raise RpcStatusError(Code.ILLEGAL_OFFSET, f"offset {offset} is negative")
    if request.batch_size <= 0:
        raise RpcStatusError(
            Code.BAD_REQUEST, f"batch size must be positive, not {request.batch_size}"
        )
    batch = min(request.batch_size, service.options.max_pull_batch)
    flt = service._filter(request.filter_expression)
    wait_ms = service._wait_ms(
        request.long_polling_timeout, request.HasField("long_polling_timeout"), context
    )
    give_up = time.monotonic() + wait_ms / 1000
    topic = cfg.topic_name
    ns = request.message_queue.topic.resource_namespace
    pop = service.pop

    def read() -> Any:
        return service.store.get_messages(
            topic, qid, offset, max_msgs=batch, max_bytes=PULL_MAX_BYTES, message_filter=flt
        )

    while True:
        version = pop.version
        res = await service.run(read)
        at_end = (
            res.status
            in (
                GetStatus.OFFSET_OVERFLOW_ONE,
                GetStatus.NO_MESSAGE_IN_QUEUE,
                GetStatus.NO_MATCHED_LOGIC_QUEUE,
            )
            and offset == res.max_offset
        )
        left = give_up - time.monotonic()
        if not at_end or left <= 0 or pop.closing:
            break
        await pop.wakeups.wait(
            (topic,), left, lambda v=version: pop.version == v and not pop.closing
        )
    traffic = pop.traffic
    if traffic is not None and res.messages:
        traffic.delivered(
            topic, request.group.name, len(res.messages), sum(m.store_size for m in res.messages)
        )
    for r in await service.run(_pull_answer, res, offset, topic, qid, ns):
        yield r


def _pull_answer(
    res: Any, offset: int, topic: str, qid: int, ns: str
) -> list[S.PullMessageResponse]:
    """A pull's answer: its status, the messages, the next offset."""
    code = codes.get_code(res.status)
    if (
        res.status in (GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.NO_MATCHED_LOGIC_QUEUE)
        and offset > res.max_offset
    ):
        code = Code.ILLEGAL_OFFSET
    if code == Code.ILLEGAL_OFFSET:
        text = f"offset {offset} is outside [{res.min_offset}, {res.max_offset}] of {topic}/{qid}"
    elif code == Code.MESSAGE_NOT_FOUND:
        text = "no new message"
    else:
        text = "OK"
    out = [S.PullMessageResponse(status=codes.status(code, text))]
    out.extend(S.PullMessageResponse(message=to_proto(m, namespace=ns)) for m in res.messages)
    next_offset = (
        res.next_begin_offset if res.status is not GetStatus.NO_MATCHED_LOGIC_QUEUE else offset
    )
    if code == Code.ILLEGAL_OFFSET:
        next_offset = res.min_offset if offset < res.min_offset else res.max_offset
    out.append(S.PullMessageResponse(next_offset=next_offset))
    return out
