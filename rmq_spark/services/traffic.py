"""Traffic: what the broker's metrics count as it happens (messages and bytes in and out, DLQ moves,
request latencies), in plain dicts, per batch.  :mod:`rmq_spark.broker.metrics` turns it into
Prometheus metrics with RocketMQ's names when scraped.

The send path pays one lock and a few dict updates per stored batch (never a Python step per
message but for the size histogram of a batch with messages over 1 KiB): ``BrokerCore.traffic`` is
None unless ``--metrics-listen`` is given, and then :meth:`Traffic.sent` runs once per
``BrokerCore.send``.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from typing import Any

from rmq_spark.store import layout as L

__all__ = ["RPC_BUCKETS_MS", "SIZE_BUCKETS", "Traffic", "message_type"]

# rocketmq_message_size: le_1_kb, le_4_kb, le_512_kb, le_1_mb, le_2_mb, le_4_mb, le_overflow
SIZE_BUCKETS = (1024.0, 4096.0, 512 * 1024.0, 1 << 20, 2 << 20, 4 << 20)
# rocketmq_rpc_latency (ms): le_1_ms, le_3_ms, le_5_ms, le_10_ms, le_100_ms, le_1_s, le_3_s, le_overflow
RPC_BUCKETS_MS = (1.0, 3.0, 5.0, 10.0, 100.0, 1000.0, 3000.0)
_DELAY_KEYS = (L.P_DELAY, L.P_TIMER_DELIVER_MS, L.P_TIMER_DELAY_SEC, L.P_TIMER_DELAY_MS)


_TYPED = frozenset((L.P_TRAN_MSG, L.P_SHARDING_KEY, *_DELAY_KEYS))


def message_type(props: dict[str, str]) -> str:
    """RocketMQ's message_type label: Transaction, Delay, FIFO or Normal."""
    if _TYPED.isdisjoint(props):
        return "Normal"
    if props.get(L.P_TRAN_MSG) == "true":
        return "Transaction"
    for k in _DELAY_KEYS:
        if k in props:
            return "Delay"
    if L.P_SHARDING_KEY in props:
        return "FIFO"
    return "Normal"


class _Histogram:
    __slots__ = ("buckets", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last: over every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += n
        self.sum += value * n


class Traffic:
    """Counters keyed by their labels; read with :meth:`snapshot` (copies).

    What producers send is counted in cells of the sending thread's own (no lock on the send
    path): a cell per (topic, message type) holds ``[messages, bytes, bucket counts...]`` of
    ``rocketmq_message_size`` (its sum is the bytes).  The rest, rarer, takes a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self._all_cells: list[dict[tuple[str, str], list[int]]] = []  # every thread's cells
        self.messages_out: dict[
            tuple[str, str], list[int]
        ] = {}  # (topic, group) -> [messages, bytes]
        self.dlq: dict[tuple[str, str], int] = {}  # (topic, group) -> messages
        self.rpc: dict[tuple[str, str, str], _Histogram] = {}  # (protocol, code, response) -> ms

    def _cells(self) -> dict[tuple[str, str], list[int]]:
        try:
            return self._local.cells
        except AttributeError:
            cells: dict[tuple[str, str], list[int]] = {}
            self._local.cells = cells
            with self._lock:
                self._all_cells.append(cells)
            return cells

    # --- the hooks ------------------------------------------------------------------------------
    def sent(self, messages: Sequence[Any]) -> None:
        """A stored batch of producer messages: rows ``(topic, qid, body, props, ...)`` or
        :class:`~rmq_spark.store.message.Message` objects (labelled by the first one's topic and
        type: a batch is one topic's)."""
        first = messages[0]
        if len(messages) == 1:  # the usual send: a few list operations, no lock
            if first.__class__ is tuple:
                topic, props, size = first[0], first[3], len(first[2])
            else:
                topic, props, size = first.topic, first.properties, len(first.body)
            if topic[:1] == "%":
                return  # a consumer's retry or DLQ copy, not a producer's message (RocketMQ counts none)
            try:
                cells = self._local.cells
            except AttributeError:
                cells = self._cells()
            key = (topic, "Normal" if _TYPED.isdisjoint(props) else message_type(props))
            c = cells.get(key)
            if c is None:
                c = cells[key] = [0] * (2 + len(SIZE_BUCKETS) + 1)
            c[0] += 1
            c[1] += size
            c[2 if size <= 1024 else 2 + bisect.bisect_left(SIZE_BUCKETS, size)] += 1
            return
        if first.__class__ is tuple:
            topic, props = first[0], first[3]
            bodies = [m[2] for m in messages]
        else:
            topic, props = first.topic, first.properties
            bodies = [m.body for m in messages]
        topics = {m[0] if m.__class__ is tuple else m.topic for m in messages}
        if len(topics) > 1:  # the sync-flush batcher joins the sends of several calls
            for t in topics:
                self.sent([m for m in messages if (m[0] if m.__class__ is tuple else m.topic) == t])
            return
        if topic[:1] == "%":
            return
        sizes = list(map(len, bodies))
        cells = self._cells()
        key = (topic, message_type(props))
        c = cells.get(key)
        if c is None:
            c = cells[key] = [0] * (2 + len(SIZE_BUCKETS) + 1)
        c[0] += len(sizes)
        c[1] += sum(sizes)
        if max(sizes) <= 1024:
            c[2] += len(sizes)
        else:
            for size in sizes:
                c[2 + bisect.bisect_left(SIZE_BUCKETS, size)] += 1

    def delivered(self, topic: str, group: str, n: int, nbytes: int) -> None:
        """``n`` messages (``nbytes`` bytes) handed to consumer group ``group``."""
        if n <= 0:
            return
        key = (topic, group)
        with self._lock:
            c = self.messages_out.get(key)
            if c is None:
                c = self.messages_out[key] = [0, 0]
            c[0] += n
            c[1] += nbytes

    def to_dlq(self, topic: str, group: str, n: int = 1) -> None:
        key = (topic, group)
        with self._lock:
            self.dlq[key] = self.dlq.get(key, 0) + n

    def request(self, protocol: str, code: int | str, response: int | str, ms: float) -> None:
        key = (protocol, str(code), str(response))
        with self._lock:
            h = self.rpc.get(key)
            if h is None:
                h = self.rpc[key] = _Histogram(RPC_BUCKETS_MS)
            h.observe(ms)

    # --- reading --------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        def hist(h: _Histogram) -> tuple[list[int], float]:
            return list(h.counts), h.sum

        merged: dict[tuple[str, str], list[int]] = {}
        with self._lock:
            for cells in self._all_cells:
                for key, cell in dict(cells).items():  # copied whole: its thread may add a key
                    cell = list(cell)
                    m = merged.get(key)
                    if m is None:
                        merged[key] = cell
                    else:
                        merged[key] = [a + b for a, b in zip(m, cell, strict=True)]
            return {
                "in": {k: (v[0], v[1]) for k, v in merged.items()},
                "sizes": {k: (v[2:], float(v[1])) for k, v in merged.items()},
                "out": {k: tuple(v) for k, v in self.messages_out.items()},
                "dlq": dict(self.dlq),
                "rpc": {k: hist(h) for k, h in self.rpc.items()},
            }
