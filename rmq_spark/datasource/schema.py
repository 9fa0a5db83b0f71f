"""The schema of the ``rmq`` source: one row per message, the store's message read back.

The store reads messages as Arrow rows of :data:`rmq_spark.store.reader.MESSAGE_SCHEMA`
(MessageExt's fields); the source's rows are those columns, in that order, as Spark sees them
(``docs/design.md`` section 3.2), plus a struct ``value`` when ``avroSchema`` is set.  Every read
path (store files, the broker's Arrow stream, PullMessage) yields :data:`SOURCE_ARROW_SCHEMA`.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType

from rmq_spark.store.reader import MESSAGE_SCHEMA

__all__ = ["SOURCE_ARROW_SCHEMA", "SOURCE_FIELDS", "source_schema"]

SOURCE_ARROW_SCHEMA: pa.Schema = MESSAGE_SCHEMA
SOURCE_FIELDS: StructType = from_arrow_schema(SOURCE_ARROW_SCHEMA)


BROKER_NAME = StructField("brokerName", StringType(), nullable=True)


def source_schema(avro_schema: str | None, cluster: bool = False) -> StructType:
    """The fixed source schema, plus ``brokerName`` for reads of a RocketMQ cluster
    (``namesrvAddr``: queue ids repeat across brokers), plus a struct ``value`` when
    ``avroSchema`` is set."""
    fields = [*SOURCE_FIELDS.fields, *([BROKER_NAME] if cluster else [])]
    if avro_schema is None:
        return StructType(fields) if cluster else SOURCE_FIELDS
    from rmq_spark.datasource.avro import parse_avro_schema, spark_type

    value = spark_type(parse_avro_schema(avro_schema))
    return StructType([*fields, StructField("value", value)])
