"""What the driver asks the broker while planning: topics, snapshots, resolved start offsets.

Shared by the stream and batch readers.  Holds a lazily opened client (dropped when pickled)
and, in embedded mode, restarts the broker once if it went away (it exits when idle).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any, TypeVar

from rmq_spark.broker.connector.client import InternalClient
from rmq_spark.datasource import offsets as O
from rmq_spark.datasource.embedded import BrokerLink
from rmq_spark.datasource.options import SourceOptions, StartKind, StartSpec
from rmq_spark.datasource.read.partition import ReadContext

T = TypeVar("T")


class Planner:
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.link = BrokerLink(opts.connection)
        self._info: dict[str, Any] | None = None

    def call(self, fn: Callable[[InternalClient], T]) -> T:
        """``fn(client)``; in embedded mode a vanished broker is restarted once."""
        return self.link.call(fn)

    def close(self) -> None:
        self.link.close()

    # --- what to read ----------------------------------------------------------------------------------
    def topics(self) -> list[str]:
        sub = self.opts.subscription
        if sub.pattern is not None:
            rx = re.compile(sub.pattern)
            return [t for t in self.call(lambda c: c.topics()) if rx.fullmatch(t)]
        if sub.assign:
            return [t for t, _ in sub.assign]
        return list(sub.topics)

    def snapshot(self, topics: list[str] | None = None) -> tuple[O.Offsets, O.Offsets]:
        """(max offsets from ONE atomic snapshot, min offsets) of the subscribed queues."""
        topics = self.topics() if topics is None else topics
        if not topics:
            return {}, {}
        hi, lo = self.call(lambda c: c.offsets(topics))
        assign = dict(self.opts.subscription.assign)
        if assign:
            hi = {
                t: {q: o for q, o in qs.items() if int(q) in assign.get(t, ())}
                for t, qs in hi.items()
            }
            lo = {
                t: {q: o for q, o in qs.items() if int(q) in assign.get(t, ())}
                for t, qs in lo.items()
            }
            for t, qids in assign.items():  # assigned queues that hold nothing yet
                for q in qids:
                    hi.setdefault(t, {}).setdefault(str(q), 0)
                    lo.setdefault(t, {}).setdefault(str(q), 0)
        return O.canonical(hi), O.canonical(lo)

    def resolve_start(self, spec: StartSpec, hi: O.Offsets, lo: O.Offsets) -> O.Offsets:
        if spec.kind is StartKind.EARLIEST:
            return O.canonical(lo)
        if spec.kind is StartKind.LATEST:
            return O.canonical(hi)
        if spec.kind is StartKind.TIMESTAMP:
            return self.offsets_at(spec.timestamp_ms or 0, hi)
        if spec.kind is StartKind.GROUP:
            return self.group_start(spec, hi, lo)
        # JSON: the queues it names; others of the subscription start at the earliest
        out = dict(O.canonical(lo))
        for t, qs in O.resolve(spec.offsets, lo, hi).items():
            out.setdefault(t, {}).update(qs)
        return O.canonical(out)

    def group_start(self, spec: StartSpec, hi: O.Offsets, lo: O.Offsets) -> O.Offsets:
        """``startingOffsets=group``: each queue at ``consumerGroup``'s committed offset, a queue
        without one at ``startingOffsetsFallback``; one past a queue's end is lowered to it."""
        group = self.opts.consumer_group or "rmq-spark-reader"
        committed = self.call(lambda c: c.query_offsets(group, sorted(hi))) if hi else {}
        out = {
            t: dict(qs)
            for t, qs in O.canonical(hi if spec.fallback is StartKind.LATEST else lo).items()
        }
        for t, q, o in O.queue_list(committed):
            top = O.get(hi, t, q)
            if top is None or o < 0:
                continue  # a queue this read does not subscribe to (assign), or no offset
            out.setdefault(t, {})[str(q)] = min(o, top)
        return O.canonical(out)

    def offsets_at(self, timestamp_ms: int, hi: O.Offsets) -> O.Offsets:
        """Per queue, the first offset stored at or after ``timestamp_ms`` (max when none)."""
        queues = {t: [int(q) for q in qs] for t, qs in hi.items()}
        if not queues:
            return {}
        return O.canonical(self.call(lambda c: c.offsets_for_times(queues, timestamp_ms)))

    def read_context(self) -> ReadContext:
        o = self.opts
        if self._info is None:
            self._info = self.call(lambda c: c.info())
        info = self._info
        return ReadContext(
            connection=o.connection,
            # a broker with an ACL tells these to admin accounts only (empty otherwise)
            store_root=os.path.realpath(o.connection.path)
            if o.connection.path
            else (info.get("store_root") or None),
            store_host=info.get("host") or None,
            read_path=o.read_path,
            read_compression=o.read_compression,
            tags=o.tags,
            sql=o.sql,
            fail_on_data_loss=o.fail_on_data_loss,
            avro_schema=o.avro_schema,
            pull_group=o.consumer_group or "rmq-spark-reader",
        )
