"""Options of the sink writing to a RocketMQ cluster (``namesrvAddr``): parsed here, used by
:mod:`rmq_spark.datasource.cluster_writer`."""

from __future__ import annotations

import re
from collections.abc import Mapping

from rmq_spark.datasource.option_values import parse_bool, parse_keys, parse_namespace, parse_tls
from rmq_spark.datasource.options import (
    BROKER_FLAG_PREFIX,
    Connection,
    Mode,
    SinkOptions,
    _normalize,
    _parse_topic,
    parse_sink_options,
)
from rmq_spark.errors import ConfigError

__all__ = ["parse_cluster_sink", "sink_options"]


def sink_options(options: Mapping[str, str], streaming: bool) -> SinkOptions:
    """The sink's options: a cluster's with ``namesrvAddr``, else rmq-broker's."""
    o, flags = _normalize(options, Mode.STREAM_WRITE if streaming else Mode.BATCH_WRITE)
    if o.get("namesrvAddr"):
        return parse_cluster_sink(o, flags)
    return parse_sink_options(options, streaming)


def parse_cluster_sink(o: dict[str, str], flags: tuple[tuple[str, str], ...]) -> SinkOptions:
    """A sink writing through ``namesrvAddr`` (at-least-once, keyed rows: cluster_writer)."""
    from rmq_spark.cluster import parse_namesrv_addr

    clash = [k for k in ("endpoints", "path") if o.get(k)] + [
        f"{BROKER_FLAG_PREFIX}{k}" for k, _ in flags
    ]
    if clash:
        raise ConfigError(
            f"option 'namesrvAddr' writes to a RocketMQ cluster; drop {', '.join(map(repr, clash))}"
        )
    addr = ";".join(parse_namesrv_addr(o["namesrvAddr"]))
    if parse_bool("transactional", o.get("transactional", "false")):
        raise ConfigError(
            "option 'transactional=true' is not available with 'namesrvAddr': the sink writes to a RocketMQ "
            "cluster at-least-once, each row with a deterministic message id to drop duplicates by (README: "
            '"Reading and writing an Apache RocketMQ cluster")'
        )
    topic = o.get("topic") or None
    if topic is not None:
        _parse_topic("topic", topic)
    avro = o.get("avroSchema") or None
    if avro is not None:
        from rmq_spark.datasource.avro import parse_avro_schema

        parse_avro_schema(avro)
    group = o.get("producerGroup", "rmq-spark-sink").strip()
    if not re.fullmatch(r"[%|a-zA-Z0-9_-]{1,120}", group):
        raise ConfigError(
            f"option 'producerGroup': {group!r} is not a RocketMQ group name ([%|a-zA-Z0-9_-], 1-120)"
        )
    retries = o.get("sendRetries", "2")
    timeout = o.get("sendTimeoutMs", "10000")
    if not retries.strip().isdigit() or int(retries) > 16:
        raise ConfigError(f"option 'sendRetries' must be an integer from 0 to 16, not {retries!r}")
    if not timeout.strip().isdigit() or int(timeout) <= 0:
        raise ConfigError(f"option 'sendTimeoutMs' must be a positive integer, not {timeout!r}")
    access_key, secret_key = parse_keys(o)
    conn = Connection(
        access_key=access_key,
        secret_key=secret_key,
        security_token=o.get("securityToken") or None,
        namespace=parse_namespace(o.get("namespace")),
        tls=parse_tls(o),
        create_store=False,
    )
    return SinkOptions(
        connection=conn,
        topic=topic,
        transactional=False,
        avro_schema=avro,
        namesrv_addr=addr,
        producer_group=group,
        send_retries=int(retries),
        send_timeout_s=int(timeout) / 1000,
    )
