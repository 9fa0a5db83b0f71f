"""Avro bodies (option ``avroSchema``): decoded into a struct column ``value`` on read, encoded
from a struct column ``value`` into ``body`` on write, with fastavro.

A body holds the Avro binary encoding of one datum of the schema (no container-file header, no
schema-registry prefix).  The schema's top level must be a record; its fields become the
``value`` struct's fields:

==========================================  =====================================
Avro                                        Spark
==========================================  =====================================
boolean, int, long, float, double           boolean, int, bigint, float, double
string, enum, ``uuid``                      string
bytes, fixed                                binary
``decimal`` (bytes or fixed)                decimal(precision, scale)
``date``                                    date
``timestamp-millis`` / ``-micros``          timestamp
``local-timestamp-millis`` / ``-micros``    timestamp_ntz
record / array / map                        struct / array / map<string, _>
``["null", T]``                             T, nullable
==========================================  =====================================

Unions of two or more non-null types and recursive records are rejected up front.
"""

from __future__ import annotations

import io
import json
from typing import Any

from rmq_spark.errors import ConfigError, MessageIllegalError

_PRIMITIVE = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")


def parse_avro_schema(text: str) -> Any:
    """The fastavro-parsed schema; ConfigError names the problem."""
    import fastavro

    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"option 'avroSchema' is not valid JSON: {e.msg} at character {e.pos}"
        ) from None
    try:
        parsed = fastavro.parse_schema(raw)
    except Exception as e:  # noqa: BLE001 - fastavro raises SchemaParseException, ValueError, KeyError ...
        raise ConfigError(f"option 'avroSchema' is not a valid Avro schema: {e}") from None
    if not (isinstance(parsed, dict) and parsed.get("type") == "record"):
        raise ConfigError(
            "option 'avroSchema' must describe a record (its fields become the 'value' struct)"
        )
    spark_type(parsed)  # rejects what cannot be mapped
    return parsed


def spark_type(schema: Any):  # type: ignore[no-untyped-def]
    """The Spark type of a parsed Avro schema (a record gives a StructType)."""
    dtype, _nullable = _to_spark(schema, {}, ())
    return dtype


def _to_spark(s: Any, names: dict[str, Any], stack: tuple[str, ...]):  # type: ignore[no-untyped-def]
    from pyspark.sql import types as T

    if isinstance(s, str):
        simple = {
            "null": T.NullType(),
            "boolean": T.BooleanType(),
            "int": T.IntegerType(),
            "long": T.LongType(),
            "float": T.FloatType(),
            "double": T.DoubleType(),
            "bytes": T.BinaryType(),
            "string": T.StringType(),
        }
        if s in simple:
            return simple[s], s == "null"
        if s in stack:
            raise ConfigError(
                f"option 'avroSchema': recursive type {s!r} cannot become a Spark column"
            )
        if s not in names:
            raise ConfigError(f"option 'avroSchema': unknown type {s!r}")
        return _to_spark(names[s], names, stack)
    if isinstance(s, list):
        branches = [b for b in s if b != "null"]
        if len(branches) != 1:
            raise ConfigError(
                f"option 'avroSchema': a union of {len(branches)} non-null types cannot become a Spark column"
            )
        dtype, _ = _to_spark(branches[0], names, stack)
        return dtype, len(branches) < len(s)
    if not isinstance(s, dict):
        raise ConfigError(f"option 'avroSchema': cannot read type {s!r}")
    t = s.get("type")
    logical = s.get("logicalType")
    if logical == "decimal" and t in ("bytes", "fixed"):
        return T.DecimalType(int(s.get("precision", 10)), int(s.get("scale", 0))), False
    if logical == "date" and t == "int":
        return T.DateType(), False
    if logical in ("timestamp-millis", "timestamp-micros") and t == "long":
        return T.TimestampType(), False
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and t == "long":
        return T.TimestampNTZType(), False
    if logical == "uuid":
        return T.StringType(), False
    if t == "record":
        name = s.get("name", "")
        names[name] = s
        fields = []
        for f in s.get("fields", []):
            ftype, nullable = _to_spark(f["type"], names, (*stack, name))
            fields.append(T.StructField(f["name"], ftype, nullable))
        return T.StructType(fields), False
    if t == "enum":
        names[s.get("name", "")] = s
        return T.StringType(), False
    if t == "fixed":
        names[s.get("name", "")] = s
        return T.BinaryType(), False
    if t == "array":
        elem, nullable = _to_spark(s["items"], names, stack)
        return T.ArrayType(elem, nullable), False
    if t == "map":
        val, nullable = _to_spark(s["values"], names, stack)
        return T.MapType(T.StringType(), val, nullable), False
    if isinstance(t, (str, list, dict)):
        return _to_spark(t, names, stack)
    raise ConfigError(f"option 'avroSchema': cannot read type {s!r}")


def decode_bodies(bodies: Any, parsed: Any, arrow_type: Any, where: str) -> Any:
    """Arrow binary column of Avro bodies -> Arrow struct column of ``arrow_type``."""
    import fastavro
    import pyarrow as pa

    records: list[Any] = []
    for i, body in enumerate(bodies.to_pylist()):
        if body is None:
            records.append(None)
            continue
        try:
            records.append(fastavro.schemaless_reader(io.BytesIO(body), parsed, None))
        except Exception as e:  # noqa: BLE001 - fastavro raises many types; re-raised as ours
            raise MessageIllegalError(
                f"body of row {i} of {where} is not Avro of the given schema: {e}"
            ) from None
    if _has_uuid(parsed):
        records = [_stringify_uuids(r) for r in records]
    return pa.array(records, type=arrow_type)


def encode_values(values: Any, parsed: Any) -> list[bytes | None]:
    """Arrow struct column -> Avro bodies (null stays null)."""
    import fastavro

    out: list[bytes | None] = []
    for i, v in enumerate(values.to_pylist()):
        if v is None:
            out.append(None)
            continue
        buf = io.BytesIO()
        try:
            fastavro.schemaless_writer(buf, parsed, v)
        except Exception as e:  # noqa: BLE001 - fastavro raises many types; re-raised as ours
            raise MessageIllegalError(
                f"row {i}: column 'value' does not fit the Avro schema: {e}"
            ) from None
        out.append(buf.getvalue())
    return out


def _has_uuid(s: Any) -> bool:
    return '"uuid"' in json.dumps(s, default=str)


def _stringify_uuids(v: Any) -> Any:
    import uuid

    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, dict):
        return {k: _stringify_uuids(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_stringify_uuids(x) for x in v]
    return v
