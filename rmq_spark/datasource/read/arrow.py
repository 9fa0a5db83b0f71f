"""Reading a planned range through the broker's bulk read: the connector service's ``ReadArrow``
ships the store's Arrow record batches as an IPC stream (``readPath=arrow``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rmq_spark.datasource.read.partition import QueueRange, broker_endpoint, check_loss

__all__ = ["read_arrow"]


def read_arrow(p: QueueRange) -> Iterator[Any]:
    """The rows of ``p`` from the broker, as Arrow record batches."""
    from rmq_spark.broker.connector.client import InternalClient

    client = InternalClient(broker_endpoint(p.ctx), **p.ctx.connection.credentials)
    try:
        _, mins = client.offsets([p.topic])
        first = int(mins.get(p.topic, {}).get(str(p.queue_id), 0))
        start = check_loss(p, first)
        yield from client.read_arrow(p.topic, p.queue_id, start, p.end, p.ctx.tags, p.ctx.sql)
    finally:
        client.close()
