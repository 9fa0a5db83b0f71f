"""The exactly-once sink's records: which attempt of each (query, batch) was committed, and
which attempts were given up.

One message per decision in the system topic ``rmq_sys_spark_sink_commit`` (queue 0).  A
*commit* record is written before the batch's halves are committed, so a CommitLog that holds the
group commit also holds its record (recovery only ever cuts a tail).  An *abort* record is
written before an attempt's halves are rolled back (by an abort or by the check-back), so the
attempt can never commit afterwards, even across a broker restart.  Body, UTF-8 JSON::

    ┌────┬──────────┬──────────────┬──────────────┬──────────────────┬────────────────────────┐
    │ v  │ kind     │ query        │ batch        │ attempt          │ ts                     │
    │ 1  │ "commit" │ Spark query  │ micro-batch  │ uuid of the      │ epoch ms of the record │
    │    │ "abort"  │ id (string)  │ id (int)     │ writer attempt   │                        │
    └────┴──────────┴──────────────┴──────────────┴──────────────────┴────────────────────────┘

``KEYS`` is ``<query>:<batch>`` so the index finds a record by key.  In memory the records are
compacted into ``{(query, batch): attempt}`` and a set of given-up attempts, rebuilt from the
topic when the broker starts.
"""

from __future__ import annotations

import json
import threading

from rmq_spark.errors import CorruptStoreError, StoreError
from rmq_spark.store import layout as L
from rmq_spark.store.message import Message

COMMIT_TOPIC = "rmq_sys_spark_sink_commit"
RECORD_VERSION = 1
_LOAD_CHUNK = 65_536


class SinkCommitLog:
    def __init__(self, store) -> None:  # type: ignore[no-untyped-def]
        self._store = store
        self._lock = threading.Lock()
        self._committed: dict[tuple[str, int], str] = {}
        self._aborted: set[str] = set()
        self._load()

    def _load(self) -> None:
        end = self._store.max_offset(COMMIT_TOPIC, 0)
        start = self._store.min_offset(COMMIT_TOPIC, 0)
        while start < end:
            stop = min(end, start + _LOAD_CHUNK)
            batch = self._store.read_arrow(COMMIT_TOPIC, 0, start, stop)
            for body, off in zip(
                batch.column("body").to_pylist(),
                batch.column("queueOffset").to_pylist(),
                strict=True,
            ):
                try:
                    rec = json.loads(body)
                    key = (str(rec["query"]), int(rec["batch"]))
                    attempt = str(rec["attempt"])
                    kind = str(rec.get("kind", "commit"))
                    if kind not in ("commit", "abort"):
                        raise ValueError(f"kind {kind!r}")
                except (ValueError, KeyError, TypeError) as e:
                    raise CorruptStoreError(
                        f"sink commit record {COMMIT_TOPIC}/0 offset {off} is not valid: {e}",
                        path=self._store.root,
                        position=int(off),
                    ) from None
                if kind == "abort":
                    self._aborted.add(attempt)
                else:  # the first commit of a batch decides; a later one cannot exist (see record())
                    self._committed.setdefault(key, attempt)
            start = stop

    def lookup(self, query_id: str, batch_id: int) -> str | None:
        """The committed attempt of (query, batch), or None."""
        with self._lock:
            return self._committed.get((query_id, int(batch_id)))

    def aborted(self, attempt: str) -> bool:
        with self._lock:
            return attempt in self._aborted

    def record(self, query_id: str, batch_id: int, attempt: str, now_ms: int) -> None:
        """Append a commit record durably (flushed before returning) and remember it.  The caller
        holds the service's commit lock, so two attempts never both record one batch."""
        self._append("commit", query_id, batch_id, attempt, now_ms)
        with self._lock:
            self._committed[(query_id, int(batch_id))] = attempt

    def record_abort(self, query_id: str, batch_id: int, attempt: str, now_ms: int) -> None:
        """Append an abort record durably (once per attempt) and remember it."""
        if self.aborted(attempt):
            return
        self._append("abort", query_id, batch_id, attempt, now_ms)
        with self._lock:
            self._aborted.add(attempt)

    def _append(self, kind: str, query_id: str, batch_id: int, attempt: str, now_ms: int) -> None:
        body = json.dumps(
            {
                "v": RECORD_VERSION,
                "kind": kind,
                "query": query_id,
                "batch": int(batch_id),
                "attempt": attempt,
                "ts": now_ms,
            },
            separators=(",", ":"),
        ).encode("utf-8")
        msg = Message(COMMIT_TOPIC, body, {L.P_KEYS: f"{query_id}:{batch_id}"}, queue_id=0)
        result = self._store.put_messages([msg], allow_system=True)
        if not result.ok:
            raise StoreError(
                f"writing the sink {kind} record of {query_id}:{batch_id} failed: {result.status.value}"
            )
        self._store.commitlog.flush()

    def batches(self, query_id: str) -> dict[int, str]:
        with self._lock:
            return {b: a for (q, b), a in self._committed.items() if q == query_id}
