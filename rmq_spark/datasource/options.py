"""Options of format ``rmq``: parsed once, validated up front, with errors that name the option.

Spark hands options over as a case-insensitive map of strings; every name below is matched
without regard to case.  Each kind of query accepts its own set (a streaming-only option on a
batch read is an error, as is any name not listed), so a typo never passes silently.

Why this module is long: every option of format ``rmq`` is named, matched and validated here, for
every kind of query, so that the set each query accepts is one table (value parsers:
:mod:`.option_values`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any, TypedDict

from rmq_spark.datasource.option_values import (  # the values' parsers, also imported from here
    TLS_OPTIONS,
    parse_bool,
    parse_duration_ms,
    parse_keys,
    parse_namespace,
    parse_positive_int,
    parse_timestamp_ms,
    parse_tls,
)
from rmq_spark.errors import ConfigError, MessageIllegalError
from rmq_spark.store.validation import check_group, check_topic

if TYPE_CHECKING:
    from rmq_spark.cluster.tls import TlsConfig


class Mode(Enum):
    STREAM_READ = "streaming read"
    BATCH_READ = "batch read"
    STREAM_WRITE = "streaming write"
    BATCH_WRITE = "batch write"
    ANY_READ = "read"  # before Spark says whether it is a stream or a batch


class StartKind(Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    JSON = "json"
    TIMESTAMP = "timestamp"
    GROUP = "group"  # the consumer group's committed offsets (QUERY_CONSUMER_OFFSET)


class ReadPath(Enum):
    AUTO = "auto"  # the store files when this machine can open them, else the broker's bulk read (arrow)
    FILES = "files"  # the store files, or fail
    PULL = "pull"  # RocketMQ 5 PullMessage over gRPC (any compatible broker)
    ARROW = "arrow"  # the broker's bulk read, shipped as Arrow IPC over the private service


READ_COMPRESSIONS = ("none", "lz4", "zstd")
CONNECTION = (
    "endpoints",
    "path",
    "namesrvAddr",
    "embeddedIdleExitS",
    "accessKey",
    "secretKey",
    "securityToken",
    "namespace",
    *TLS_OPTIONS,
)
SOURCE_COMMON = (
    "topics",
    "topicPattern",
    "assign",
    "startingOffsets",
    "startingTimestamp",
    "failOnDataLoss",
    "tags",
    "sql",
    "avroSchema",
    "readPath",
    "maxRecordsPerPartition",
    "readCompression",
    "pullBatchSize",
    "brokerUnavailableTimeout",
    "startingOffsetsFallback",
    "consumerGroup",
)
CLUSTER_ONLY = ("pullBatchSize", "brokerUnavailableTimeout")  # reads with namesrvAddr
STREAM_ONLY = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
BATCH_ONLY = ("endingOffsets", "endingTimestamp")
SINK = (
    "topic",
    "transactional",
    "avroSchema",
    "namesrvAddr",
    "producerGroup",
    "sendRetries",
    "sendTimeoutMs",
)
# names Spark itself adds to a writer's options
SPARK_WRITER = ("checkpointLocation", "queryName")

ALLOWED: dict[Mode, tuple[str, ...]] = {
    Mode.STREAM_READ: CONNECTION + SOURCE_COMMON + STREAM_ONLY,
    Mode.BATCH_READ: CONNECTION + SOURCE_COMMON + BATCH_ONLY,
    Mode.STREAM_WRITE: CONNECTION + SINK + SPARK_WRITER,
    Mode.BATCH_WRITE: CONNECTION + SINK + SPARK_WRITER,
    Mode.ANY_READ: CONNECTION + SOURCE_COMMON + STREAM_ONLY + BATCH_ONLY,
}
BROKER_FLAG_PREFIX = "broker."  # broker.<flag>=value: flags of an embedded broker started here
DEFAULT_IDLE_EXIT_S = 30.0
DEFAULT_MAX_RECORDS_PER_PARTITION = 2_000_000
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
DEFAULT_PULL_BATCH_SIZE = 1024  # messages asked per PULL_MESSAGE (a broker may answer fewer)
DEFAULT_BROKER_UNAVAILABLE_TIMEOUT_MS = 5 * 60 * 1000
_CANONICAL = {name.lower(): name for names in ALLOWED.values() for name in names}


class ClientCredentials(TypedDict):
    """The ``access_key`` / ``secret_key`` keyword arguments of the broker clients."""

    access_key: str | None
    secret_key: str | None


@dataclass(frozen=True)
class Connection:
    """Where the broker is: ``endpoints`` of a running one, and/or the store ``path`` (with only
    ``path``, an embedded broker is started on demand)."""

    endpoints: str | None = None
    path: str | None = None
    broker_flags: tuple[tuple[str, str], ...] = ()
    idle_exit_s: float = DEFAULT_IDLE_EXIT_S
    access_key: str | None = None  # with secret_key: every call to the broker is signed (its --acl)
    secret_key: str | None = field(default=None, repr=False)
    create_store: bool = (
        True  # a sink or a stream may start a store at ``path``; a batch read never does
    )
    namesrv_addr: str | None = (
        None  # "host:9876;host2:9876": a RocketMQ cluster over the remoting protocol
    )
    # namesrvAddr: AclClientRPCHook's token; topics and groups as ``namespace%name`` (Java's)
    security_token: str | None = field(default=None, repr=False)
    namespace: str | None = None
    # namesrvAddr with tls=true: every NameServer and broker connection speaks TLS
    tls: TlsConfig | None = None

    @property
    def credentials(self) -> ClientCredentials:
        """``access_key`` / ``secret_key`` keyword arguments of the broker clients."""
        return {"access_key": self.access_key, "secret_key": self.secret_key}

    def cluster_credentials(self) -> Any:
        """The :class:`rmq_spark.cluster.Credentials` a cluster's requests are signed with."""
        if self.access_key is None or self.secret_key is None:
            return None
        from rmq_spark.cluster.acl import Credentials

        return Credentials(self.access_key, self.secret_key, self.security_token)


@dataclass(frozen=True)
class Subscription:
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def describe(self) -> str:
        if self.pattern is not None:
            return f"topicPattern={self.pattern}"
        if self.assign:
            return f"assign={dict(self.assign)}"
        return f"topics={','.join(self.topics)}"


@dataclass(frozen=True)
class StartSpec:
    kind: StartKind
    offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    timestamp_ms: int | None = None
    # GROUP: where a queue without a committed offset starts (EARLIEST or LATEST)
    fallback: StartKind = StartKind.EARLIEST


@dataclass(frozen=True)
class EndSpec:
    latest: bool = True
    offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class SourceOptions:
    connection: Connection
    subscription: Subscription
    starting: StartSpec
    ending: EndSpec = field(default_factory=EndSpec)
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    fail_on_data_loss: bool = True
    tags: str | None = None
    sql: str | None = None
    consumer_group: str | None = None
    avro_schema: str | None = None
    read_path: ReadPath = ReadPath.AUTO
    max_records_per_partition: int = DEFAULT_MAX_RECORDS_PER_PARTITION
    read_compression: str = (
        "lz4"  # the bulk read's stream: lz4, zstd or none (bench/arrow_stream_bench.py)
    )
    pull_batch_size: int = DEFAULT_PULL_BATCH_SIZE
    broker_unavailable_timeout_ms: int = DEFAULT_BROKER_UNAVAILABLE_TIMEOUT_MS


@dataclass(frozen=True)
class SinkOptions:
    connection: Connection
    topic: str | None = None
    transactional: bool = True
    avro_schema: str | None = None
    # writing to a RocketMQ cluster (rmq_spark.datasource.cluster_writer) instead of a connection
    namesrv_addr: str | None = None
    producer_group: str = "rmq-spark-sink"
    send_retries: int = 2  # DefaultMQProducer.retryTimesWhenSendFailed
    send_timeout_s: float = 10.0


def _normalize(
    options: Mapping[str, str], mode: Mode
) -> tuple[dict[str, str], tuple[tuple[str, str], ...]]:
    """Canonical names -> values; unknown names raise; ``broker.*`` flags split off."""
    allowed = set(ALLOWED[mode])
    out: dict[str, str] = {}
    flags: list[tuple[str, str]] = []
    for raw_key, value in options.items():
        key = str(raw_key)
        if key.lower().startswith(BROKER_FLAG_PREFIX):
            flag = key[len(BROKER_FLAG_PREFIX) :].lower()
            if not re.fullmatch(r"[a-z][a-z0-9-]*", flag):
                raise ConfigError(
                    f"option {key!r}: broker flags are written like broker.delay-levels"
                )
            flags.append((flag, str(value)))
            continue
        name = _CANONICAL.get(key.lower())
        if name is None or name not in allowed:
            if name is not None:
                raise ConfigError(f"option {name!r} does not apply to a {mode.value} of format rmq")
            raise ConfigError(
                f"unknown option {key!r} for a {mode.value} of format rmq; "
                f"known options: {', '.join(sorted(allowed))}"
            )
        if name in out:
            raise ConfigError(f"option {name!r} is given twice")
        out[name] = "" if value is None else str(value)
    return out, tuple(sorted(flags))


def check_read_names(options: Mapping[str, str]) -> str | None:
    """Unknown option names fail now; returns ``avroSchema`` (the schema depends on it)."""
    o, _ = _normalize(options, Mode.ANY_READ)
    return o.get("avroSchema") or None


def reads_cluster(options: Mapping[str, str]) -> bool:
    """Does this read name a RocketMQ cluster (``namesrvAddr``)?  Its rows then carry ``brokerName``."""
    o, _ = _normalize(options, Mode.ANY_READ)
    return bool(o.get("namesrvAddr"))


def _parse_topic(name: str, topic: str) -> str:
    try:
        check_topic(topic)
    except MessageIllegalError as e:
        raise ConfigError(f"option {name!r}: {e}") from None
    return topic


def parse_offsets_json(name: str, value: str, allow: tuple[int, ...]) -> dict[str, dict[str, int]]:
    """``{"topic": {"queueId": offset}}``; negative offsets only among ``allow`` (-2 earliest,
    -1 latest)."""
    try:
        data = json.loads(value)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"option {name!r} is not valid JSON: {e.msg} at character {e.pos}"
        ) from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f'option {name!r} must be a JSON object like {{"topic": {{"0": 42}}}}')
    out: dict[str, dict[str, int]] = {}
    for topic, queues in data.items():
        _parse_topic(name, topic)
        if not isinstance(queues, dict):
            raise ConfigError(f"option {name!r}: topic {topic!r} must map queue ids to offsets")
        qs: dict[str, int] = {}
        for q, off in queues.items():
            if not (isinstance(q, str) and q.isdigit()):
                raise ConfigError(
                    f"option {name!r}: queue id {q!r} of topic {topic!r} is not a number"
                )
            if isinstance(off, bool) or not isinstance(off, int):
                raise ConfigError(
                    f"option {name!r}: offset {off!r} of {topic}/{q} is not an integer"
                )
            if off < 0 and off not in allow:
                what = " or ".join(str(a) for a in allow) or "no negative value"
                raise ConfigError(
                    f"option {name!r}: offset {off} of {topic}/{q} is invalid here (allowed: {what})"
                )
            qs[str(int(q))] = off
        out[topic] = qs
    return out


def parse_cluster_offsets_json(
    name: str, value: str, allow: tuple[int, ...]
) -> dict[str, dict[str, dict[str, int]]]:
    """``{"topic": {"brokerName": {"queueId": offset}}}`` (reads with ``namesrvAddr``)."""
    try:
        data = json.loads(value)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"option {name!r} is not valid JSON: {e.msg} at character {e.pos}"
        ) from None
    example = '{"topic": {"broker-a": {"0": 42}}}'
    if not isinstance(data, dict) or not data:
        raise ConfigError(
            f"option {name!r} must be a JSON object like {example} (with namesrvAddr)"
        )
    out: dict[str, dict[str, dict[str, int]]] = {}
    for topic, brokers in data.items():
        _parse_topic(name, topic)
        if not isinstance(brokers, dict) or not all(isinstance(v, dict) for v in brokers.values()):
            raise ConfigError(
                f"option {name!r}: topic {topic!r} must map broker names to {{queueId: offset}} "
                f"objects, like {example} (with namesrvAddr offsets name the broker)"
            )
        for broker, queues in brokers.items():
            qs = (
                parse_offsets_json(name, json.dumps({topic: queues}), allow)[topic]
                if queues
                else {}
            )
            out.setdefault(topic, {})[str(broker)] = qs
    return out


def _parse_connection(o: dict[str, str], flags: tuple[tuple[str, str], ...]) -> Connection:
    endpoints = o.get("endpoints") or None
    path = o.get("path") or None
    namesrv = o.get("namesrvAddr") or None
    if namesrv is not None:
        from rmq_spark.cluster.client import parse_namesrv_addr

        if endpoints is not None or path is not None:
            other = "endpoints" if endpoints is not None else "path"
            raise ConfigError(
                f"options 'namesrvAddr' and {other!r} conflict: give a cluster's NameServers or "
                "an rmq-broker, not both"
            )
        if flags:
            raise ConfigError(
                "broker.* options configure an embedded broker and do not apply with 'namesrvAddr'"
            )
        access_key, secret_key = parse_keys(o)
        return Connection(
            namesrv_addr=";".join(parse_namesrv_addr(namesrv)),
            create_store=False,
            access_key=access_key,
            secret_key=secret_key,
            security_token=o.get("securityToken") or None,
            namespace=parse_namespace(o.get("namespace")),
            tls=parse_tls(o),
        )
    if endpoints is None and path is None:
        raise ConfigError(
            "format rmq needs option 'endpoints' (a running broker), 'path' (a store directory) "
            "or 'namesrvAddr' (a RocketMQ cluster's NameServers)"
        )
    if endpoints is not None:
        for ep in endpoints.split(","):
            host, _, port = ep.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(f"option 'endpoints': {ep!r} is not host:port")
    if flags and path is None:
        raise ConfigError("broker.* options configure an embedded broker and need option 'path'")
    idle = DEFAULT_IDLE_EXIT_S
    if "embeddedIdleExitS" in o:
        try:
            idle = float(o["embeddedIdleExitS"])
        except ValueError:
            idle = -1.0
        if idle <= 0:
            raise ConfigError(
                f"option 'embeddedIdleExitS' must be a positive number, not {o['embeddedIdleExitS']!r}"
            )
    if o.get("tls") and parse_bool("tls", o["tls"]) is False:
        o = {k: v for k, v in o.items() if k != "tls"}  # tls=false: nothing asked
    for name in ("securityToken", "namespace", *TLS_OPTIONS):
        if o.get(name):
            raise ConfigError(
                f"option {name!r} applies to a RocketMQ cluster (option 'namesrvAddr')"
            )
    access_key, secret_key = parse_keys(o)
    return Connection(endpoints, path, flags, idle, access_key, secret_key)


def _parse_subscription(o: dict[str, str]) -> Subscription:
    given = [k for k in ("topics", "topicPattern", "assign") if o.get(k)]
    if len(given) != 1:
        if not given:
            raise ConfigError(
                "format rmq needs exactly one of 'topics', 'topicPattern' or 'assign'"
            )
        raise ConfigError(f"options {', '.join(repr(g) for g in given)} conflict: give exactly one")
    if "topics" in given:
        topics = tuple(t.strip() for t in o["topics"].split(",") if t.strip())
        if not topics:
            raise ConfigError("option 'topics' lists no topic")
        for t in topics:
            _parse_topic("topics", t)
        return Subscription(topics=tuple(dict.fromkeys(topics)))
    if "topicPattern" in given:
        try:
            re.compile(o["topicPattern"])
        except re.error as e:
            raise ConfigError(
                f"option 'topicPattern' is not a valid regular expression: {e}"
            ) from None
        return Subscription(pattern=o["topicPattern"])
    try:
        data = json.loads(o["assign"])
    except json.JSONDecodeError as e:
        raise ConfigError(f"option 'assign' is not valid JSON: {e.msg}") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError("option 'assign' must be a JSON object like {\"topic\": [0, 1]}")
    pairs = []
    for topic, qids in sorted(data.items()):
        _parse_topic("assign", topic)
        if (
            not isinstance(qids, list)
            or not qids
            or not all(isinstance(q, int) and not isinstance(q, bool) and q >= 0 for q in qids)
        ):
            raise ConfigError(
                f"option 'assign': topic {topic!r} needs a non-empty list of queue ids"
            )
        pairs.append((topic, tuple(sorted(set(qids)))))
    return Subscription(assign=tuple(pairs))


def parse_source_options(options: Mapping[str, str], streaming: bool) -> SourceOptions:
    mode = Mode.STREAM_READ if streaming else Mode.BATCH_READ
    o, flags = _normalize(options, mode)
    # a batch read never creates a store; a stream may watch a store its writer has yet to start
    conn = _parse_connection(o, flags)
    cluster = conn.namesrv_addr is not None
    if not cluster:
        conn = replace(conn, create_store=streaming)
        for name in CLUSTER_ONLY:
            if name in o:
                raise ConfigError(
                    f"option {name!r} applies to reads of a RocketMQ cluster (option 'namesrvAddr')"
                )
    parse_json = parse_cluster_offsets_json if cluster else parse_offsets_json
    sub = _parse_subscription(o)
    if "startingOffsetsFallback" in o and o.get("startingOffsets", "").strip().lower() != "group":
        raise ConfigError(
            "option 'startingOffsetsFallback' only applies with 'startingOffsets=group'"
        )
    if "startingOffsets" in o and "startingTimestamp" in o:
        raise ConfigError("options 'startingOffsets' and 'startingTimestamp' conflict: give one")
    if "startingTimestamp" in o:
        starting = StartSpec(
            StartKind.TIMESTAMP,
            timestamp_ms=parse_timestamp_ms("startingTimestamp", o["startingTimestamp"]),
        )
    else:
        raw = o.get("startingOffsets", "latest" if streaming else "earliest").strip()
        if raw.lower() == "group":
            if not o.get("consumerGroup"):
                raise ConfigError(
                    "option 'startingOffsets=group' starts from a consumer group's committed offsets: "
                    "give option 'consumerGroup'"
                )
            fallback = (
                o.get("startingOffsetsFallback", "latest" if streaming else "earliest")
                .strip()
                .lower()
            )
            if fallback not in ("earliest", "latest"):
                raise ConfigError(
                    f"option 'startingOffsetsFallback' must be earliest or latest, not "
                    f"{o['startingOffsetsFallback']!r}"
                )
            starting = StartSpec(StartKind.GROUP, fallback=StartKind(fallback))
        elif raw.lower() == "earliest":
            starting = StartSpec(StartKind.EARLIEST)
        elif raw.lower() == "latest":
            if not streaming:
                raise ConfigError("option 'startingOffsets' cannot be 'latest' for a batch read")
            starting = StartSpec(StartKind.LATEST)
        else:
            allow = (-2, -1) if streaming else (-2,)
            starting = StartSpec(StartKind.JSON, parse_json("startingOffsets", raw, allow))  # type: ignore[arg-type]
    ending = EndSpec()
    if "endingOffsets" in o and "endingTimestamp" in o:
        raise ConfigError("options 'endingOffsets' and 'endingTimestamp' conflict: give one")
    if "endingTimestamp" in o:
        ending = EndSpec(
            False, timestamp_ms=parse_timestamp_ms("endingTimestamp", o["endingTimestamp"])
        )
        if starting.timestamp_ms is not None and starting.timestamp_ms > ending.timestamp_ms:  # type: ignore[operator]
            raise ConfigError(
                f"option 'startingTimestamp' ({starting.timestamp_ms}) is after 'endingTimestamp' ({ending.timestamp_ms})"
            )
    elif "endingOffsets" in o:
        raw = o["endingOffsets"].strip()
        if raw.lower() == "earliest":
            raise ConfigError("option 'endingOffsets' cannot be 'earliest'")
        if raw.lower() != "latest":
            ending = EndSpec(False, parse_json("endingOffsets", raw, (-1,)))  # type: ignore[arg-type]
    max_rows = (
        parse_positive_int("maxOffsetsPerTrigger", o["maxOffsetsPerTrigger"])
        if "maxOffsetsPerTrigger" in o
        else None
    )
    min_rows = (
        parse_positive_int("minOffsetsPerTrigger", o["minOffsetsPerTrigger"])
        if "minOffsetsPerTrigger" in o
        else None
    )
    if max_rows is not None and min_rows is not None and min_rows > max_rows:
        raise ConfigError(
            f"option 'minOffsetsPerTrigger' ({min_rows}) is above 'maxOffsetsPerTrigger' ({max_rows})"
        )
    if "maxTriggerDelay" in o and min_rows is None:
        raise ConfigError("option 'maxTriggerDelay' only applies with 'minOffsetsPerTrigger'")
    delay = (
        parse_duration_ms("maxTriggerDelay", o["maxTriggerDelay"])
        if "maxTriggerDelay" in o
        else DEFAULT_MAX_TRIGGER_DELAY_MS
    )
    group = o.get("consumerGroup") or None
    if group is not None and not streaming and starting.kind is not StartKind.GROUP:
        raise ConfigError(
            "option 'consumerGroup' does not apply to a batch read unless startingOffsets=group "
            "(a batch read commits no offsets)"
        )
    if group is not None:
        try:
            check_group(group)
        except MessageIllegalError as e:
            raise ConfigError(f"option 'consumerGroup': {e}") from None
    tags = o.get("tags") or None
    sql = o.get("sql") or None
    _check_filters(tags, sql)
    avro = o.get("avroSchema") or None
    if avro is not None:
        from rmq_spark.datasource.avro import parse_avro_schema

        parse_avro_schema(avro)
    try:
        read_path = ReadPath(o.get("readPath", "auto").strip().lower())
    except ValueError:
        raise ConfigError(
            f"option 'readPath' must be one of {', '.join(p.value for p in ReadPath)}, not {o['readPath']!r}"
        ) from None
    if cluster and read_path not in (ReadPath.AUTO, ReadPath.PULL):
        raise ConfigError(
            f"option 'readPath={read_path.value}' does not apply with 'namesrvAddr': a cluster is "
            "read with PULL_MESSAGE (readPath auto or pull)"
        )
    if read_path is ReadPath.FILES and conn.path is None and conn.endpoints is None:
        raise ConfigError(
            "option readPath=files needs 'path' or a broker whose store this machine can open"
        )
    read_compression = o.get("readCompression", "lz4").strip().lower()
    if read_compression not in READ_COMPRESSIONS:
        raise ConfigError(
            f"option 'readCompression' must be one of {', '.join(READ_COMPRESSIONS)}, not {o['readCompression']!r}"
        )
    mrpp = (
        parse_positive_int("maxRecordsPerPartition", o["maxRecordsPerPartition"])
        if "maxRecordsPerPartition" in o
        else DEFAULT_MAX_RECORDS_PER_PARTITION
    )
    pull_batch = (
        parse_positive_int("pullBatchSize", o["pullBatchSize"])
        if "pullBatchSize" in o
        else DEFAULT_PULL_BATCH_SIZE
    )
    unavailable = (
        parse_duration_ms("brokerUnavailableTimeout", o["brokerUnavailableTimeout"])
        if "brokerUnavailableTimeout" in o
        else DEFAULT_BROKER_UNAVAILABLE_TIMEOUT_MS
    )
    return SourceOptions(
        connection=conn,
        subscription=sub,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=max_rows,
        min_offsets_per_trigger=min_rows,
        max_trigger_delay_ms=delay,
        fail_on_data_loss=parse_bool("failOnDataLoss", o.get("failOnDataLoss", "true")),
        tags=tags,
        sql=sql,
        consumer_group=group,
        avro_schema=avro,
        read_path=read_path,
        max_records_per_partition=mrpp,
        read_compression=read_compression,
        pull_batch_size=pull_batch,
        broker_unavailable_timeout_ms=unavailable,
    )


def _check_filters(tags: str | None, sql: str | None) -> None:
    """Parse the filter expressions now, so a bad one fails the query before it starts."""
    if tags is None and sql is None:
        return
    from rmq_spark.filter.options import make_filters

    make_filters(tags, sql)


def parse_sink_options(options: Mapping[str, str], streaming: bool) -> SinkOptions:
    mode = Mode.STREAM_WRITE if streaming else Mode.BATCH_WRITE
    o, flags = _normalize(options, mode)
    namesrv = o.get("namesrvAddr") or None
    if namesrv is not None:
        raise ConfigError(
            "option 'namesrvAddr' on a write: parse with rmq_spark.datasource.cluster_options.sink_options"
        )
    for name in ("producerGroup", "sendRetries", "sendTimeoutMs"):
        if name in o:
            raise ConfigError(
                f"option {name!r} is for writes to a RocketMQ cluster and needs option 'namesrvAddr'"
            )
    conn = _parse_connection(o, flags)
    topic = o.get("topic") or None
    if topic is not None:
        _parse_topic("topic", topic)
    avro = o.get("avroSchema") or None
    if avro is not None:
        from rmq_spark.datasource.avro import parse_avro_schema

        parse_avro_schema(avro)
    return SinkOptions(
        connection=conn,
        topic=topic,
        transactional=parse_bool("transactional", o.get("transactional", "true")),
        avro_schema=avro,
    )
