"""Reading a planned range through the broker's bulk read: the connector service's ``ReadArrow``
ships the store's Arrow record batches as an IPC stream (``readPath=arrow``, and ``auto`` where
the files are out of reach).

The broker sends the rows in messages of a few MB (grpc's Python stream is fastest there, see
``rmq_spark.broker.connector.readers``); each becomes one batch for Spark as it comes (joining
them into larger ones cost a copy of every row and read no faster).  ``readCompression`` says
how the broker compresses them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rmq_spark.datasource.read.partition import QueueRange, check_loss

__all__ = ["read_arrow"]

# readCompression: lz4 by default.  Measured (bench/arrow_stream_bench.py, 1M rows, 2 readers, one
# run each): on loopback lz4 reads at 0.95x none with random bodies and 1.86x with the Spark
# bench's bodies, zstd at 0.50x / 1.16x (it costs twice lz4's CPU); on the wire a row takes 156 B
# (random bodies) or 57 B (bench bodies) with lz4 against 284 B without, so a 1 Gbit/s link
# carries 1.8x-5x more rows a second.  lz4 never costs much and pays on any real link.


def read_arrow(p: QueueRange) -> Iterator[Any]:
    """The rows of ``p`` from the broker, as Arrow record batches."""
    from rmq_spark.broker.connector.client import InternalClient
    from rmq_spark.datasource.embedded import broker_endpoint

    endpoint = broker_endpoint(p.ctx)
    client = InternalClient(endpoint, **p.ctx.connection.credentials)
    try:
        _, mins = client.offsets([p.topic])
        first = int(mins.get(p.topic, {}).get(str(p.queue_id), 0))
        start = check_loss(p, first)
        chunks = client.read_arrow(
            p.topic, p.queue_id, start, p.end, p.ctx.tags, p.ctx.sql, p.ctx.read_compression
        )
        yield from chunks
    finally:
        client.close()
