"""The ``rmq`` data source class: the user's manual is its docstring."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from rmq_spark.datasource.options import check_read_names, parse_source_options, reads_cluster
from rmq_spark.datasource.releases import ADMISSION_CONTROL, FILTER_PUSHDOWN
from rmq_spark.datasource.schema import source_schema
from rmq_spark.errors import ConfigError


def _check_schema(given: StructType, expected: StructType) -> None:
    if [(f.name, f.dataType) for f in given.fields] != [
        (f.name, f.dataType) for f in expected.fields
    ]:
        raise ConfigError(
            "format rmq has a fixed schema and does not take a user schema: expected "
            f"{expected.simpleString()}, got {given.simpleString()}"
        )


class RmqDataSource(DataSource):
    """RocketMQ topics as a Spark source and sink: ``format("rmq")``.

    Name: ``rmq``

    Reads (``spark.readStream`` / ``spark.read``) give one row per message:
    ``topic string, queueId int, queueOffset bigint, msgId string, tags string, keys string,
    body binary, properties map<string,string>, bornTimestamp timestamp, storeTimestamp
    timestamp, deliverTimestamp timestamp, reconsumeTimes int, transactionId string,
    commitLogOffset bigint`` (and ``value`` struct with ``avroSchema``).

    Options (names are case-insensitive)
    ------------------------------------
    ===========================  ===========  ===========================================================
    option                       queries      meaning
    ===========================  ===========  ===========================================================
    ``endpoints``                all          ``host:port`` of a running broker
    ``path``                     all          store directory; alone, an embedded broker is started on
                                              demand and exits when idle (a batch read never creates one)
    ``namesrvAddr``              all          ``host:port[;host:port]`` of a RocketMQ cluster's NameServers
                                              (Apache RocketMQ, or rmq-broker's): reads pull from every
                                              broker; offsets ``{"topic": {"brokerName": {"0": 42}}}``;
                                              rows get a ``brokerName`` column
    ``pullBatchSize``            reads        with namesrvAddr: messages asked per PULL_MESSAGE (1024)
    ``brokerUnavailableTimeout`` reads        with namesrvAddr: how long a broker may not answer (5m)
    ``embeddedIdleExitS``        all          idle seconds before the embedded broker exits (30)
    ``broker.<flag>``            all          a flag of the embedded broker, e.g. ``broker.delay-levels``
    ``accessKey``/``secretKey``  all          credentials of a broker with ``--acl``: every call to it
                                              is signed with them (both or neither)
    ``topics``                   reads        comma list of topics  (exactly one of these three)
    ``topicPattern``             reads        regular expression matched against whole topic names
    ``assign``                   reads        JSON ``{"topic": [0, 1]}``
    ``startingOffsets``          reads        ``earliest`` (batch default), ``latest`` (stream default),
                                              JSON ``{"topic": {"0": 42}}``, -2 earliest, -1 latest
    ``startingTimestamp``        reads        epoch ms: each queue from its first message stored then
    ``endingOffsets``            batch read   ``latest`` (default) or JSON (-1 latest); offsets given
                                              in a batch read name subscribed queues, within their end
    ``endingTimestamp``          batch read   epoch ms: each queue up to (excluding) that time
    ``maxOffsetsPerTrigger``     stream read  at most about N messages per micro-batch
    ``minOffsetsPerTrigger``     stream read  wait for N messages, or ``maxTriggerDelay``
    ``maxTriggerDelay``          stream read  longest wait with ``minOffsetsPerTrigger`` (15m)
    ``consumerGroup``            stream read  commit processed offsets to this group (one batch late)
    ``failOnDataLoss``           reads        fail when planned offsets left the store (true)
    ``tags``                     reads        RocketMQ tag expression, e.g. ``TagA || TagB``
    ``sql``                      reads        RocketMQ SQL92 property filter, e.g. ``a > 5``
    ``avroSchema``               all          Avro schema: ``value`` struct <-> ``body``
    ``readPath``                 reads        ``auto`` (files if local, else arrow), ``files``,
                                              ``pull``, ``arrow`` (broker bulk read over gRPC)
    ``maxRecordsPerPartition``   reads        split a queue's range into Spark partitions (2000000)
    ``readCompression``          reads        the bulk read's stream: ``lz4`` (default), ``zstd``, ``none``
    ``topic``                    writes       target topic (wins over the ``topic`` column)
    ``transactional``            writes       true: exactly-once, batch-atomic; false: at-least-once
    ===========================  ===========  ===========================================================

    Sink columns: ``body`` (required; binary or string), ``topic``, ``tags``, ``keys``,
    ``properties``, ``delayLevel``, ``deliverTimestamp``, ``messageGroup``, ``queueId``; with
    ``avroSchema`` a struct ``value`` instead of ``body``.  Each write task checks every row of
    its partition against SendMessage's rules (``rmq_spark.access.rules``: reserved property
    keys, empty bodies, a ``deliverTimestamp`` beyond the timer's limit, ...) before it sends any;
    a bad row is named by code, column and row.

    Writes from another Python thread need ``rmq_spark.register(spark)`` first (Spark finds a
    write's format through the JVM thread's active session).

    Examples
    --------
    >>> q = (spark.readStream.format("rmq").option("path", "/tmp/store").option("topics", "Orders")
    ...      .load().writeStream.format("console").start())
    >>> df.write.format("rmq").option("path", "/tmp/store").option("topic", "Out").save()
    """

    @classmethod
    def name(cls) -> str:
        return "rmq"

    def schema(self) -> StructType:
        # stream or batch is not known yet: names are checked now, values when reading
        return source_schema(check_read_names(self.options), reads_cluster(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        from rmq_spark.datasource.batch_reader import (
            RmqBatchReader,
            RmqPushdownBatchReader,
            pushdown_enabled,
        )

        opts = parse_source_options(self.options, streaming=False)
        cluster = opts.connection.namesrv_addr is not None
        _check_schema(schema, source_schema(opts.avro_schema, cluster))
        if cluster:
            from rmq_spark.datasource.cluster.batch import ClusterBatchReader

            return ClusterBatchReader(opts, schema)
        cls = RmqPushdownBatchReader if FILTER_PUSHDOWN and pushdown_enabled() else RmqBatchReader
        return cls(opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from rmq_spark.datasource.stream_reader import RmqStreamReader, SourceAdmittedStreamReader

        opts = parse_source_options(self.options, streaming=True)
        cluster = opts.connection.namesrv_addr is not None
        _check_schema(schema, source_schema(opts.avro_schema, cluster))
        if cluster:
            from rmq_spark.datasource.cluster.stream import (
                ClusterStreamReader,
                SourceAdmittedClusterStreamReader,
            )

            if ADMISSION_CONTROL:
                return ClusterStreamReader(opts, schema)
            return SourceAdmittedClusterStreamReader(opts, schema)
        if ADMISSION_CONTROL:
            return RmqStreamReader(opts, schema)
        return SourceAdmittedStreamReader(opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from rmq_spark.datasource.writer import RmqBatchWriter

        if overwrite:
            raise ConfigError("format rmq appends messages; save mode 'overwrite' is not supported")
        from rmq_spark.datasource.cluster_options import sink_options

        opts = sink_options(self.options, streaming=False)
        if opts.namesrv_addr is not None:
            from rmq_spark.datasource.cluster_writer import ClusterBatchWriter

            return ClusterBatchWriter(opts, schema)
        return RmqBatchWriter(opts, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from rmq_spark.datasource.cluster_options import sink_options
        from rmq_spark.datasource.writer import RmqStreamWriter

        opts = sink_options(self.options, streaming=True)
        if opts.namesrv_addr is not None:
            from rmq_spark.datasource.cluster_writer import ClusterStreamWriter

            return ClusterStreamWriter(opts, schema)
        return RmqStreamWriter(opts, schema)
