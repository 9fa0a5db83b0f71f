"""Reads by position, time and key (``QueryMessageProcessor``, ``AdminBrokerProcessor``):
GET_MAX_OFFSET, GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP, GET_EARLIEST_MSG_STORETIME,
VIEW_MESSAGE_BY_ID (the record at a CommitLog offset) and QUERY_MESSAGE (records by key, or by
unique id with ``_UNIQUE_KEY_QUERY``).  Records go out as stored, like a pull's."""

from __future__ import annotations

import struct
from typing import Any

from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.headers import fields_of
from rmq_spark.remoting.requests import may_read
from rmq_spark.remoting.server import Connection
from rmq_spark.store.query import Boundary, MessageQuery

__all__ = ["LookupProcessor", "raw_record"]

_INT = struct.Struct(">i")
MAX_QUERY_MESSAGES = 64  # defaultQueryMaxNum


def raw_record(store: Any, commitlog_offset: int) -> bytes | None:
    """The stored bytes of the valid record starting at ``commitlog_offset``, or None."""
    found = record_at(store, commitlog_offset)
    return found[1] if found is not None else None


def record_at(store: Any, commitlog_offset: int) -> tuple[Any, bytes] | None:
    """The valid record starting at ``commitlog_offset``, read and as stored; None if none starts there."""
    m = MessageQuery(store).read_at(commitlog_offset)
    if m is None:
        return None
    mf = store.commitlog.mfq.find(commitlog_offset)
    pos = commitlog_offset - mf.from_offset
    (size,) = _INT.unpack_from(mf.mm, pos)
    return m, bytes(mf.mm[pos : pos + size])


class LookupProcessor:
    def __init__(self, store: Any) -> None:
        self.store = store
        self.query = MessageQuery(store)

    def max_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        f = fields_of(req.ext_fields)
        offset = self.store.max_offset(f.str("topic"), f.int("queueId"))
        return req.response(ResponseCode.SUCCESS, None, {"offset": str(offset)})

    def min_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        f = fields_of(req.ext_fields)
        offset = self.store.min_offset(f.str("topic"), f.int("queueId"))
        return req.response(ResponseCode.SUCCESS, None, {"offset": str(offset)})

    def search_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        f = fields_of(req.ext_fields)
        boundary = (
            Boundary.UPPER if (f.opt("boundaryType") or "").upper() == "UPPER" else Boundary.LOWER
        )
        offset = self.query.offset_by_time(
            f.str("topic"), f.int("queueId"), f.long("timestamp"), boundary
        )
        return req.response(ResponseCode.SUCCESS, None, {"offset": str(offset)})

    def earliest_store_time(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        f = fields_of(req.ext_fields)
        cq = self.store.consume_queue(f.str("topic"), f.int("queueId"))
        ts = -1
        if cq is not None and cq.max_offset > cq.min_offset:
            unit = cq.unit(cq.min_offset)
            if unit is not None:
                ts = self.store.commitlog.store_timestamp(unit[0])
        return req.response(ResponseCode.SUCCESS, None, {"timestamp": str(ts)})

    def view_by_id(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        offset = fields_of(req.ext_fields).long("offset")
        found = record_at(self.store, offset)
        if found is None:
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}"
            )
        m, data = found
        if not may_read(req.account, m.topic):
            # the record's own topic decides (a half, a DLQ, another tenant's topic): an offset
            # walk must not read what a pull of the topic could not
            return req.response(ResponseCode.NO_PERMISSION, f"No SUB permission for the topic of the message at "
                                                            f"offset {offset} (accessKey {req.account.access_key})")  # fmt: skip
        return req.response(ResponseCode.SUCCESS, body=data)

    def query_message(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        f = fields_of(req.ext_fields)
        topic, key = f.str("topic"), f.str("key")
        limit = max(1, min(f.int("maxNum", MAX_QUERY_MESSAGES), MAX_QUERY_MESSAGES))
        begin, end = f.long("beginTimestamp", 0), f.long("endTimestamp", (1 << 63) - 1)
        if f.bool("_UNIQUE_KEY_QUERY"):
            m = self.query.by_unique_id(key, topic)
            found = [m] if m is not None else []
        else:
            found = self.query.by_key(topic, key, begin, end, limit)
        parts = [raw_record(self.store, m.commitlog_offset) for m in found]
        body = b"".join(p for p in parts if p is not None)
        header = {"indexLastUpdateTimestamp": str(self.store.commitlog.last_store_timestamp_ms),
                  "indexLastUpdatePhyoffset": str(self.store.commitlog.max_offset)}  # fmt: skip
        if not body:
            return req.response(ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct",
                                header)  # fmt: skip
        return req.response(ResponseCode.SUCCESS, None, header, body)
