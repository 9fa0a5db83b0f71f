"""Pop revive: expired messages of a consumer group moved to its retry topic or its DLQ.

When a popped message's invisible time passes without an ack (or a consumer forwards it to the
dead letter queue), :meth:`rmq_spark.broker.pop.PopService.revive_once` hands it here: a copy
with ``reconsumeTimes + 1`` is written to ``%RETRY%{group}``, or, once it was delivered
``max_delivery_attempts`` times, to ``%DLQ%{group}`` (RocketMQ's PopReviveService), all the
copies of a round in one write; then the originals are finished in their queues.  Whatever
fails, each message ends either finished or pending in its queue (delivered again from there),
never out of both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from rmq_spark.broker.popstate import GroupState, Pending, QueueState
from rmq_spark.errors import StoreError
from rmq_spark.store import layout as L
from rmq_spark.store.message import Message, MessageExt
from rmq_spark.store.store import MessageStore

__all__ = ["Move", "dlq_topic", "move_expired", "retry_copy", "retry_topic"]

log = logging.getLogger("rmq_spark.broker.pop")

# properties a retry / DLQ copy must not carry (they would send it through a put hook again)
_DROP_ON_COPY = (
    L.P_DELAY,
    L.P_TIMER_DELIVER_MS,
    L.P_TIMER_DELAY_MS,
    L.P_TIMER_DELAY_SEC,
    L.P_REAL_TOPIC,
    L.P_REAL_QID,
    L.P_TRAN_MSG,
)


def retry_topic(group: str) -> str:
    return L.RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return L.DLQ_GROUP_TOPIC_PREFIX + group


class Move(NamedTuple):
    """One message out of flight, to be copied to the retry topic (or the DLQ)."""

    group: GroupState
    queue: QueueState
    offset: int  # its queue offset in ``queue``
    phys: int  # its CommitLog offset
    size: int
    reconsume: int  # its reconsumeTimes so far (the copy carries one more)
    origin: str  # the topic the client popped it from
    to_dlq: bool


def retry_copy(ext: MessageExt, group: str, origin: str, reconsume: int, to_dlq: bool) -> Message:
    """The retry (or DLQ) copy of a message, with ``reconsume`` as its reconsumeTimes."""
    props = {k: v for k, v in ext.properties.items() if k not in _DROP_ON_COPY}
    props.setdefault(L.P_ORIGIN_MESSAGE_ID, ext.msg_id)
    props[L.P_RECONSUME_TIME] = str(reconsume)
    if to_dlq:
        props.pop(L.P_RETRY_TOPIC, None)
        props[L.P_DLQ_ORIGIN_TOPIC] = origin
        props[L.P_DLQ_ORIGIN_MESSAGE_ID] = ext.client_msg_id
        topic = dlq_topic(group)
    else:
        props[L.P_RETRY_TOPIC] = origin
        topic = retry_topic(group)
    return Message(
        topic=topic,
        body=ext.body,
        properties=props,
        queue_id=0,
        flag=ext.flag,
        sys_flag=ext.sys_flag & ~L.TRANSACTION_MASK,
        born_timestamp_ms=ext.born_timestamp_ms,
        born_host=ext.born_host,
        born_port=ext.born_port,
        reconsume_times=reconsume,
    )


def move_expired(
    store: MessageStore, moves: list[Move], commit: Callable[[GroupState, QueueState], None]
) -> None:
    """Copy the messages of ``moves`` in one write, then finish them in their queues (``commit``
    writes a queue's committed offset).  Whatever fails, each message ends either finished or
    pending in its queue (delivered again from there), never out of both."""
    settled: set[int] = set()  # indexes into ``moves`` finished or made pending
    try:
        _move_all(store, moves, settled, commit)
    except Exception:
        log.exception(
            "moving %d expired messages failed: they are delivered again from their queues",
            len(moves) - len(settled),
        )
        for i, m in enumerate(moves):
            if i not in settled:
                _redeliver_later(m)


def _redeliver_later(m: Move) -> None:
    with m.group.lock:
        if m.offset not in m.queue.pending:
            m.queue.pending[m.offset] = Pending(m.phys, m.size, None, m.reconsume, m.origin)


def _move_all(
    store: MessageStore,
    moves: list[Move],
    settled: set[int],
    commit: Callable[[GroupState, QueueState], None],
) -> None:
    msgs: list[Message] = []
    kept = []
    for i, m in enumerate(moves):
        try:
            ext = store.look_message_by_offset(m.phys, m.size)
            copy = (
                None
                if ext is None
                else retry_copy(ext, m.group.name, m.origin, m.reconsume + 1, m.to_dlq)
            )
        except Exception:  # unreadable (the error names file and position): it stays to redeliver
            log.exception(
                "reading message %s of %s (CommitLog offset %d) to move it failed",
                m.offset,
                m.queue.topic,
                m.phys,
            )
            _redeliver_later(m)
            settled.add(i)
            continue
        if copy is not None:  # None: gone from the store, nothing to redeliver
            msgs.append(copy)
        kept.append(i)
    if msgs and not store.put_messages(msgs, allow_system=True).ok:
        raise StoreError(f"the store refused the {len(msgs)} retry/DLQ copies")
    for i in kept:
        g, q = moves[i].group, moves[i].queue
        with g.lock:
            q.finish(moves[i].offset)
            commit(g, q)
        settled.add(i)
