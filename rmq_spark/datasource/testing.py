"""Helpers for tests and examples of the data source: produce rows to a store's broker, read a
topic back, stop the embedded broker.  Not used by the data source itself."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from rmq_spark.broker.connector.client import InternalClient
from rmq_spark.datasource.embedded import ensure_broker, read_record, stop_broker


def client(
    path: str, idle_exit_s: float = 60.0, flags: tuple[tuple[str, str], ...] = ()
) -> InternalClient:
    """A client of the embedded broker of store ``path`` (started if needed)."""
    return InternalClient(ensure_broker(path, flags, idle_exit_s))


def produce(
    target: str | InternalClient,
    topic: str,
    bodies: Sequence[bytes | str],
    **columns: Sequence[Any],
) -> int:
    """Store ``bodies`` (plus optional sink columns: tags, keys, properties, delayLevel,
    deliverTimeMs, messageGroup, queueId) in ``topic``; returns the count."""
    c = client(target) if isinstance(target, str) else target
    data: dict[str, Any] = {
        "topic": pa.array([topic] * len(bodies), pa.string()),
        "body": pa.array([b.encode() if isinstance(b, str) else b for b in bodies], pa.binary()),
    }
    types = {
        "delayLevel": pa.int32(),
        "queueId": pa.int32(),
        "deliverTimeMs": pa.int64(),
        "properties": pa.map_(pa.string(), pa.string()),
    }
    for name, values in columns.items():
        data[name] = pa.array(list(values), types.get(name, pa.string()))
    try:
        return int(c.send(pa.table(data), {"mode": "normal"})["count"])
    finally:
        if isinstance(target, str):
            c.close()


def read_topic(target: str | InternalClient, topic: str) -> pa.Table:
    """Every visible message of ``topic`` (all queues), as the source's Arrow rows."""
    c = client(target) if isinstance(target, str) else target
    try:
        hi, _ = c.offsets([topic])
        batches = [
            b
            for q, end in sorted(hi.get(topic, {}).items())
            for b in c.read_arrow(topic, int(q), 0, end)
        ]
    finally:
        if isinstance(target, str):
            c.close()
    from rmq_spark.datasource.schema import SOURCE_ARROW_SCHEMA

    return pa.Table.from_batches(batches, schema=SOURCE_ARROW_SCHEMA)


def broker_pid(path: str) -> int | None:
    rec = read_record(path)
    return rec.pid if rec else None


@contextmanager
def embedded_store(path: str) -> Iterator[str]:
    """``path`` for the duration; its embedded broker (if one was started) is stopped after."""
    try:
        yield path
    finally:
        stop_broker(path)
