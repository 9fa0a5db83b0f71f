"""The sink: ``df.writeStream.format("rmq")`` and ``df.write.format("rmq")``.

Columns (others are ignored): ``body`` (binary or string; with ``avroSchema`` a struct ``value``
encoded into the body instead), ``topic`` (the ``topic`` option wins), ``tags``, ``keys``
(string, or array of strings joined by spaces), ``properties`` map<string,string>,
``delayLevel`` int, ``deliverTimestamp`` timestamp, ``messageGroup`` string (same group -> same
queue, in order), ``queueId`` int.

Exactly-once (the default, ``transactional=true``), see ``docs/semantics.md``:

1. the writer is created on the driver per micro-batch with a fresh ``attempt`` id;
2. ``write()`` (executors) sends the rows as half messages tagged (queryId, batchId, attempt),
   one put per Arrow chunk, and returns the halves' offsets in its commit message;
3. ``commit()`` (a fresh driver worker) asks the broker to record the batch as committed and
   commit all halves at once (or, for a replay of a committed batch, to roll this attempt back);
4. ``abort()`` rolls the halves back; halves of an attempt that died are decided by the broker's
   check-back from the commit record of the same attempt.

``transactional=false`` stores the rows at once (at-least-once: a replayed batch is written
again).  A batch write is transactional the same way, so it is all-or-nothing.

Before a task sends anything it checks every row of its partition (``check_rows``, the rules of
SendMessage, against the limits and clock the broker answers a Send of no rows with), so a bad
row fails the task with nothing of it stored or prepared; the broker checks each Send again.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark.sql import types as T
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    WriterCommitMessage,
)

from rmq_spark.access.rules import SendLimits, check_rows
from rmq_spark.broker.connector.protocol import SendHeader
from rmq_spark.datasource.embedded import BrokerLink
from rmq_spark.datasource.options import SinkOptions
from rmq_spark.datasource.releases import StreamArrowWriterBase
from rmq_spark.datasource.tasks import task_started
from rmq_spark.errors import ConfigError, StoreError

SEND_ROWS = 131_072
SEND_BYTES = 32 * 1024 * 1024
SPILL_BYTES = 256 * 1024 * 1024  # a partition's checked rows beyond this wait on local disk

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one write task sent: never None, so commit() sees every task."""

    query_id: str
    batch_id: int
    attempt: str
    partition_id: int
    rows: int
    transactional: bool
    offsets: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SinkLayout:
    """Which sink columns the input has, checked against their expected types up front."""

    columns: tuple[str, ...]
    keys_is_array: bool = False

    @property
    def user_names(self) -> dict[str, str]:
        """The input's name of each row column that has another (errors name the user's)."""
        names = {"deliverTimeMs": "deliverTimestamp"}
        if "value" in self.columns:
            names["body"] = "value"
        return names

    @classmethod
    def of(cls, schema: T.StructType, opts: SinkOptions) -> SinkLayout:
        fields = {f.name: f.dataType for f in schema.fields}
        problems = []
        present = []

        def expect(name: str, ok: bool, what: str) -> None:
            if name in fields:
                if ok:
                    present.append(name)
                else:
                    problems.append(
                        f"column {name!r} must be {what}, not {fields[name].simpleString()}"
                    )

        t = fields.get
        if opts.avro_schema is not None:
            if "value" not in fields:
                problems.append("option 'avroSchema' needs a struct column 'value' to encode")
            elif not isinstance(fields["value"], T.StructType):
                problems.append(
                    f"column 'value' must be a struct, not {fields['value'].simpleString()}"
                )
            else:
                present.append("value")
            if "body" in fields:
                problems.append(
                    "give either column 'body' or, with 'avroSchema', column 'value'; not both"
                )
        else:
            if "body" not in fields:
                problems.append("the sink needs a column 'body' (binary or string)")
            expect("body", isinstance(t("body"), (T.BinaryType, T.StringType)), "binary or string")
        expect("topic", isinstance(t("topic"), T.StringType), "string")
        if opts.topic is None and "topic" not in fields:
            problems.append("set option 'topic' or give a column 'topic'")
        expect("tags", isinstance(t("tags"), T.StringType), "string")
        keys_t, props_t = t("keys"), t("properties")
        keys_array = isinstance(keys_t, T.ArrayType) and isinstance(
            keys_t.elementType, T.StringType
        )
        expect("keys", isinstance(t("keys"), T.StringType) or keys_array, "string or array<string>")
        expect(
            "properties",
            isinstance(props_t, T.MapType)
            and isinstance(props_t.keyType, T.StringType)
            and isinstance(props_t.valueType, T.StringType),
            "map<string,string>",
        )
        expect("delayLevel", isinstance(t("delayLevel"), _INTEGRAL), "an integer")
        expect(
            "deliverTimestamp",
            isinstance(t("deliverTimestamp"), (T.TimestampType, T.TimestampNTZType)),
            "a timestamp",
        )
        expect("messageGroup", isinstance(t("messageGroup"), T.StringType), "string")
        expect("queueId", isinstance(t("queueId"), _INTEGRAL), "an integer")
        if problems:
            raise ConfigError("format rmq cannot write this DataFrame: " + "; ".join(problems))
        return cls(tuple(present), keys_array)


def to_rows(batch: Any, layout: SinkLayout, opts: SinkOptions, avro: Any) -> Any:
    """An input Arrow batch as the broker's row table (``rmq_spark.broker.connector.sink``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    cols: dict[str, Any] = {}
    if opts.topic is not None:
        cols["topic"] = pa.array([opts.topic] * n, pa.string()) if n else pa.array([], pa.string())
    else:
        cols["topic"] = batch.column("topic")
    if avro is not None:
        from rmq_spark.datasource.avro import encode_values

        cols["body"] = pa.array(encode_values(batch.column("value"), avro), pa.binary())
    else:
        body = batch.column("body")
        cols["body"] = body.cast(pa.binary()) if body.type != pa.binary() else body
    for name in ("tags", "messageGroup", "properties"):
        if name in layout.columns:
            cols[name] = batch.column(name)
    if "keys" in layout.columns:
        keys = batch.column("keys")
        if layout.keys_is_array:  # binary_join wants list<string>, not list<string not null>
            keys = pc.binary_join(keys.cast(pa.list_(pa.string())), " ")
        cols["keys"] = keys
    if "delayLevel" in layout.columns:
        cols["delayLevel"] = batch.column("delayLevel").cast(pa.int32())
    if "queueId" in layout.columns:
        cols["queueId"] = batch.column("queueId").cast(pa.int32())
    if "deliverTimestamp" in layout.columns:
        us = batch.column("deliverTimestamp").cast(pa.int64())  # Spark hands timestamps in us
        cols["deliverTimeMs"] = pc.divide(us, 1000)
    return pa.table(cols)


class PartitionRows:
    """The rows of one write task, each input batch checked as it comes; held until the whole
    partition is checked (in memory up to ``SPILL_BYTES``, then in an Arrow file on local disk)."""

    def __init__(
        self, limits: Callable[[], SendLimits], partition_id: int, names: dict[str, str]
    ) -> None:
        self._limits = limits
        self._where = f" of partition {partition_id}"
        self._names = names
        self.rows = 0
        self._tables: list[Any] = []
        self._bytes = 0
        self._spill: Any = None  # (directory, path, writer) once spilled

    def add(self, table: Any) -> None:
        check_rows(table, self._limits(), first_row=self.rows, where=self._where, names=self._names)
        self.rows += table.num_rows
        if self._spill is not None:
            self._spill[2].write_table(table.cast(self._spill[3]))
            return
        self._tables.append(table)
        self._bytes += table.nbytes
        if self._bytes > SPILL_BYTES:
            self._spill_to_disk()

    def _spill_to_disk(self) -> None:
        import tempfile

        import pyarrow as pa

        local = (os.environ.get("SPARK_LOCAL_DIRS") or "").split(",")[0] or None
        directory = tempfile.TemporaryDirectory(
            prefix="rmq-sink-", dir=local if local and os.path.isdir(local) else None
        )
        path = os.path.join(directory.name, "rows.arrow")
        schema = self._tables[0].schema
        writer = pa.ipc.new_file(path, schema)
        for t in self._tables:
            writer.write_table(t.cast(schema))
        self._spill = (directory, path, writer, schema)
        self._tables, self._bytes = [], 0

    def chunks(self) -> Iterator[Any]:
        import pyarrow as pa

        if self._spill is not None:
            self._spill[2].close()
            table = pa.ipc.open_file(pa.memory_map(self._spill[1])).read_all()
        elif self._tables:
            schema = self._tables[0].schema
            table = pa.concat_tables([t.cast(schema) for t in self._tables])
        else:
            return
        yield from chunks(table)

    def close(self) -> None:
        self._tables = []
        if self._spill is not None:
            self._spill[0].cleanup()
            self._spill = None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def chunks(table: Any) -> Iterator[Any]:
    """Row slices of at most SEND_ROWS rows and about SEND_BYTES body bytes (one put each)."""
    n = table.num_rows
    if n == 0:
        return
    avg = max(1, table.column("body").nbytes // n)
    step = max(1, min(SEND_ROWS, SEND_BYTES // avg))
    for i in range(0, n, step):
        yield table.slice(i, step)


class _SinkWriter:
    """What the streaming and the batch writer share."""

    def __init__(self, opts: SinkOptions, schema: T.StructType) -> None:
        self.opts = opts
        self.layout = SinkLayout.of(schema, opts)
        self.attempt = uuid.uuid4().hex  # per micro-batch: streamWriter() runs for each
        self.link = BrokerLink(opts.connection)

    def _send_all(
        self, iterator: Iterator[Any], query_id: str, batch_id: int, partition_id: int
    ) -> SinkCommit:
        """Check every row of the partition (the broker's rules, :func:`check_rows`), then send
        them: a bad row fails the task before anything of it is stored or prepared."""
        avro = None
        if self.opts.avro_schema is not None:
            from rmq_spark.datasource.avro import parse_avro_schema

            avro = parse_avro_schema(self.opts.avro_schema)
        tx = self.opts.transactional
        header = SendHeader(
            mode="half" if tx else "normal",
            query_id=query_id,
            batch_id=batch_id,
            attempt=self.attempt,
        )
        done = SinkCommit(query_id, batch_id, self.attempt, partition_id, 0, tx)
        rows = None
        try:
            rows = PartitionRows(self._limits(), partition_id, self.layout.user_names)
            for batch in iterator:
                rows.add(to_rows(batch, self.layout, self.opts, avro))
            for chunk in rows.chunks():

                def send(c: Any, chunk: Any = chunk) -> Any:
                    return c.send(chunk, header)

                r = self.link.call(send)
                done.rows += int(r["count"])
                if r.get("offsets"):
                    done.offsets.append(r["offsets"])
        finally:
            if rows is not None:
                rows.close()
            self.link.close()
        return done

    def _limits(self) -> Callable[[], SendLimits]:
        """The broker's send limits, and its clock as seen from here (a Send of no rows)."""
        import pyarrow as pa

        empty = pa.table({"topic": pa.array([], pa.string()), "body": pa.array([], pa.binary())})
        asked_ms = _now_ms()
        r = self.link.call(lambda c: c.send(empty, SendHeader(mode="normal")))
        if not r.get("limits"):
            raise StoreError(
                "the broker does not answer its send limits: upgrade it to this version of rmq_spark"
            )
        limits = SendLimits.from_json(r["limits"])
        skew_ms = limits.now_ms - (asked_ms + _now_ms()) // 2
        return lambda: replace(limits, now_ms=_now_ms() + skew_ms)

    def _commit(self, messages: list[SinkCommit | None], batch_id: int) -> None:
        sent = [m for m in messages if m is not None]
        if not sent or not sent[0].transactional:
            return
        attempts = {(m.query_id, m.attempt) for m in sent}
        if len(attempts) != 1:
            raise StoreError(
                f"commit messages of batch {batch_id} come from {len(attempts)} writer attempts"
            )
        query_id, attempt = attempts.pop()
        offsets = [o for m in sent for o in m.offsets]
        try:
            self.link.call(lambda c: c.commit_batch(query_id, batch_id, attempt, offsets))
        finally:
            self.link.close()

    def _abort(self, messages: list[SinkCommit | None], batch_id: int) -> None:
        sent = [m for m in messages if m is not None and m.transactional]
        if not sent:
            return
        try:
            for query_id, attempt in {(m.query_id, m.attempt) for m in sent}:
                offsets = [o for m in sent if m.attempt == attempt for o in m.offsets]

                def abort(c: Any, q: str = query_id, a: str = attempt, o: Any = offsets) -> Any:
                    return c.abort_batch(q, batch_id, a, o)

                self.link.call(abort)
        finally:
            self.link.close()


class RmqStreamWriter(_SinkWriter, StreamArrowWriterBase):
    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        task_started()
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query_id = (
            ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
        ) or "unknown-query"
        batch_id = int((ctx.getLocalProperty("streaming.sql.batchId") if ctx else None) or -1)
        return self._send_all(iterator, query_id, batch_id, ctx.partitionId() if ctx else 0)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._commit(messages, batchId)  # type: ignore[arg-type]

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._abort(messages, batchId)  # type: ignore[arg-type]


class RmqBatchWriter(_SinkWriter, DataSourceArrowWriter):
    """``df.write``: one attempt, committed all at once (query id ``batch-<attempt>``)."""

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        task_started()
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return self._send_all(iterator, f"batch-{self.attempt}", 0, ctx.partitionId() if ctx else 0)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._commit(messages, 0)  # type: ignore[arg-type]

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._abort(messages, 0)  # type: ignore[arg-type]
