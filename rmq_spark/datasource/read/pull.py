"""Reading a planned range over RocketMQ 5 ``PullMessage`` (for executors that cannot open the
store files): any broker serving ``apache.rocketmq.v2.MessagingService`` with the pull RPCs.

Messages become Arrow rows of the source schema.  The protocol does not carry everything the
store files do: ``commitLogOffset`` is null, ``properties`` holds the user properties plus
``TAGS``/``KEYS``/``UNIQ_KEY``, ``transactionId`` is the message id of a transactional message.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from typing import Any

from rmq_spark.datasource.read.partition import QueueRange, check_loss, filters_for
from rmq_spark.errors import StoreError

__all__ = ["read_pull"]

log = logging.getLogger("rmq_spark.datasource.read.pull")

PULL_BATCH = 1024
_CLIENT_ID = f"rmq-spark-pull-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _metadata(
    access_key: str | None = None, secret_key: str | None = None
) -> tuple[tuple[str, str], ...]:
    """The headers of one call, as the official Python client sends them (signed with a key)."""
    md = (
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
        ("x-mq-client-version", "5.1.2"),
        ("x-mq-client-id", _CLIENT_ID),
        ("x-mq-request-id", uuid.uuid4().hex),
    )
    if not access_key:
        return md
    from rmq_spark.access.auth import signed_headers

    return md + tuple(signed_headers(access_key, secret_key or ""))


def _ts_us(ts: Any) -> int:
    return int(ts.seconds) * 1_000_000 + int(ts.nanos) // 1000


def read_pull(p: QueueRange) -> Iterator[Any]:
    """The rows of ``p`` pulled from the broker, as Arrow record batches."""
    import grpc
    import pyarrow as pa
    from rocketmq.grpc_protocol import definition_pb2 as D
    from rocketmq.grpc_protocol import service_pb2 as S
    from rocketmq.grpc_protocol import service_pb2_grpc as G

    from rmq_spark.broker.connector.client import CHANNEL_OPTIONS
    from rmq_spark.datasource.embedded import broker_endpoint
    from rmq_spark.datasource.schema import SOURCE_ARROW_SCHEMA
    from rmq_spark.store import layout as L
    from rmq_spark.store.inflate import InflateError, inflate_gzip

    ctx = p.ctx
    endpoint = broker_endpoint(ctx)
    channel = grpc.insecure_channel(endpoint, options=CHANNEL_OPTIONS)
    stub = G.MessagingServiceStub(channel)
    mq = D.MessageQueue(topic=D.Resource(name=p.topic), id=p.queue_id, permission=D.Permission.READ)
    tag_filter, _ = filters_for(ctx.tags, None) if ctx.tags and ctx.sql else (None, None)
    if ctx.sql:
        fexpr = D.FilterExpression(type=D.FilterType.SQL, expression=ctx.sql)
    else:
        fexpr = D.FilterExpression(type=D.FilterType.TAG, expression=ctx.tags or "*")
    try:
        first = stub.QueryOffset(
            S.QueryOffsetRequest(
                message_queue=mq, query_offset_policy=D.QueryOffsetPolicy.BEGINNING
            ),
            metadata=_metadata(**ctx.connection.credentials),
            timeout=60,
        )
        if first.status.code != D.Code.OK:
            raise StoreError(
                f"QueryOffset {p.topic}/{p.queue_id} at {endpoint}: {first.status.message}"
            )
        offset = check_loss(p, int(first.offset))
        while offset < p.end:
            rows: dict[str, list[Any]] = {f.name: [] for f in SOURCE_ARROW_SCHEMA}
            next_offset = offset
            req = S.PullMessageRequest(
                group=D.Resource(name=ctx.pull_group),
                message_queue=mq,
                offset=offset,
                batch_size=min(PULL_BATCH, p.end - offset),
                filter_expression=fexpr,
            )
            req.long_polling_timeout.FromMilliseconds(0)
            for resp in stub.PullMessage(
                req, metadata=_metadata(**ctx.connection.credentials), timeout=120
            ):
                kind = resp.WhichOneof("content")
                if kind == "status" and resp.status.code not in (
                    D.Code.OK,
                    D.Code.MESSAGE_NOT_FOUND,
                ):
                    raise StoreError(
                        f"PullMessage {p.topic}/{p.queue_id}@{offset} at {endpoint}: {resp.status.message}"
                    )
                if kind == "next_offset":
                    next_offset = max(next_offset, int(resp.next_offset))
                if kind == "message":
                    m = resp.message
                    sp = m.system_properties
                    if sp.queue_offset >= p.end:
                        continue
                    next_offset = max(next_offset, sp.queue_offset + 1)
                    body = m.body
                    if (
                        sp.body_encoding == D.Encoding.GZIP
                    ):  # bounded by the body limit (a gzip bomb stops there)
                        try:
                            body = inflate_gzip(m.body, L.BODY_MAX_BYTES, "the GZIP body")
                        except (
                            InflateError
                        ) as e:  # a poison message: its body as sent (rmq_spark.store.inflate)
                            log.warning("%s/%d offset %d: %s; it is served as sent", p.topic, p.queue_id,
                                        sp.queue_offset, e)  # fmt: skip
                    props = dict(m.user_properties)
                    tag = sp.tag if sp.HasField("tag") else None
                    keys = " ".join(sp.keys) or None
                    if tag:
                        props[L.P_TAGS] = tag
                    if keys:
                        props[L.P_KEYS] = keys
                    props[L.P_UNIQ_KEY] = sp.message_id
                    rows["topic"].append(m.topic.name)
                    rows["queueId"].append(sp.queue_id)
                    rows["queueOffset"].append(sp.queue_offset)
                    rows["msgId"].append(sp.message_id)
                    rows["tags"].append(tag)
                    rows["keys"].append(keys)
                    rows["body"].append(body)
                    rows["properties"].append(list(props.items()))
                    rows["bornTimestamp"].append(_ts_us(sp.born_timestamp))
                    rows["storeTimestamp"].append(
                        _ts_us(sp.store_timestamp) if sp.HasField("store_timestamp") else None
                    )
                    rows["deliverTimestamp"].append(
                        _ts_us(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else None
                    )
                    rows["reconsumeTimes"].append(
                        max(0, sp.delivery_attempt - 1) if sp.HasField("delivery_attempt") else 0
                    )
                    rows["transactionId"].append(
                        sp.message_id if sp.message_type == D.MessageType.TRANSACTION else None
                    )
                    rows["commitLogOffset"].append(None)
            if next_offset <= offset:
                raise StoreError(
                    f"PullMessage {p.topic}/{p.queue_id} at {endpoint} made no progress at offset {offset}"
                )
            offset = next_offset
            batch = pa.RecordBatch.from_pydict(rows, schema=SOURCE_ARROW_SCHEMA)
            if tag_filter is not None:
                batch = batch.filter(tag_filter.mask(batch.column("tags")))
            yield batch
    except grpc.RpcError as e:
        raise StoreError(
            f"PullMessage {p.topic}/{p.queue_id} at {endpoint} failed: {e.code()}: {e.details()}"
        ) from None
    finally:
        channel.close()
