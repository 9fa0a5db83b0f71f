"""Options of format rmq: every option, its default and its errors; offset JSON helpers.  No Spark."""

from __future__ import annotations

import pytest

from rmq_spark.datasource import offsets as O
from rmq_spark.datasource.options import (
    DEFAULT_MAX_TRIGGER_DELAY_MS,
    ReadPath,
    StartKind,
    check_read_names,
    parse_duration_ms,
    parse_sink_options,
    parse_source_options,
)
from rmq_spark.errors import ConfigError

BASE = {"path": "/tmp/x", "topics": "T"}


def stream(**kw: str):
    return parse_source_options({**BASE, **kw}, streaming=True)


def batch(**kw: str):
    return parse_source_options({**BASE, **kw}, streaming=False)


def test_defaults():
    s = stream()
    assert s.starting.kind is StartKind.LATEST
    assert batch().starting.kind is StartKind.EARLIEST
    assert s.fail_on_data_loss is True and s.read_path is ReadPath.AUTO
    assert s.max_offsets_per_trigger is None and s.min_offsets_per_trigger is None
    assert s.max_trigger_delay_ms == DEFAULT_MAX_TRIGGER_DELAY_MS
    assert batch().ending.latest is True
    sink = parse_sink_options({"path": "/tmp/x", "topic": "Out"}, streaming=True)
    assert sink.transactional is True and sink.topic == "Out"


def test_names_are_case_insensitive():
    s = parse_source_options(
        {"PATH": "/p", "TOPICS": "A, B,A", "STARTINGOFFSETS": "earliest"}, streaming=True
    )
    assert s.subscription.topics == ("A", "B")
    assert s.starting.kind is StartKind.EARLIEST


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topics": "T"}, "'endpoints'"),
        ({"path": "/p"}, "exactly one of 'topics'"),
        ({"path": "/p", "topics": "T", "topicPattern": "T.*"}, "conflict"),
        ({"path": "/p", "topics": "T", "assign": '{"T":[0]}'}, "conflict"),
        ({**BASE, "bogus": "1"}, "unknown option 'bogus'"),
        ({**BASE, "endingOffsets": "latest"}, "does not apply to a streaming read"),
        ({**BASE, "topic": "X"}, "does not apply to a streaming read"),
        ({"path": "/p", "topics": "bad topic!"}, "characters outside"),
        ({"path": "/p", "topics": "x" * 128}, "limit is 127"),
        ({"path": "/p", "topicPattern": "("}, "not a valid regular expression"),
        ({"path": "/p", "assign": "[1]"}, "JSON object"),
        ({"path": "/p", "assign": '{"T": []}'}, "non-empty list"),
        ({"path": "/p", "assign": '{"T": [-1]}'}, "non-empty list"),
        ({"path": "/p", "assign": "{nope"}, "not valid JSON"),
        ({**BASE, "startingOffsets": "{bad"}, "not valid JSON"),
        ({**BASE, "startingOffsets": '{"T": {"x": 1}}'}, "is not a number"),
        ({**BASE, "startingOffsets": '{"T": {"0": -3}}'}, "invalid here"),
        ({**BASE, "startingOffsets": '{"T": {"0": "1"}}'}, "not an integer"),
        ({**BASE, "startingOffsets": "[]"}, "JSON object"),
        ({**BASE, "startingOffsets": "earliest", "startingTimestamp": "5"}, "conflict"),
        ({**BASE, "startingTimestamp": "yesterday"}, "epoch milliseconds"),
        ({**BASE, "startingTimestamp": "-5"}, "epoch milliseconds"),
        ({**BASE, "maxOffsetsPerTrigger": "0"}, "positive integer"),
        ({**BASE, "maxOffsetsPerTrigger": "ten"}, "positive integer"),
        ({**BASE, "minOffsetsPerTrigger": "-1"}, "positive integer"),
        ({**BASE, "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, "above"),
        ({**BASE, "maxTriggerDelay": "5s"}, "only applies with 'minOffsetsPerTrigger'"),
        ({**BASE, "minOffsetsPerTrigger": "5", "maxTriggerDelay": "soon"}, "duration"),
        ({**BASE, "failOnDataLoss": "maybe"}, "true or false"),
        ({**BASE, "consumerGroup": "bad group"}, "consumerGroup"),
        ({**BASE, "tags": "a || "}, None),  # valid: empty pieces are dropped
        ({**BASE, "sql": "a >"}, "option 'sql'"),
        ({**BASE, "avroSchema": "{"}, "not valid JSON"),
        ({**BASE, "avroSchema": '"string"'}, "must describe a record"),
        (
            {
                **BASE,
                "avroSchema": '{"type": "record", "name": "R", "fields": [{"name": "u", "type": ["int", "string"]}]}',
            },
            "union",
        ),
        ({**BASE, "readPath": "carrier-pigeon"}, "readPath"),
        ({**BASE, "maxRecordsPerPartition": "0"}, "positive integer"),
        ({**BASE, "embeddedIdleExitS": "0"}, "embeddedIdleExitS"),
        ({"endpoints": "nohost", "topics": "T"}, "host:port"),
        ({"endpoints": "h:1", "topics": "T", "broker.delay-levels": "1s"}, "need option 'path'"),
        ({**BASE, "broker.Bad_Flag": "1"}, "broker flags"),
    ],
)
def test_stream_option_errors(options, message):
    if message is None:
        parse_source_options(options, streaming=True)
        return
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_source_options(options, streaming=True)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({**BASE, "startingOffsets": "latest"}, "cannot be 'latest' for a batch"),
        ({**BASE, "startingOffsets": '{"T": {"0": -1}}'}, "invalid here"),
        ({**BASE, "endingOffsets": "earliest"}, "cannot be 'earliest'"),
        ({**BASE, "endingOffsets": '{"T": {"0": -2}}'}, "invalid here"),
        ({**BASE, "endingOffsets": "latest", "endingTimestamp": "5"}, "conflict"),
        ({**BASE, "maxOffsetsPerTrigger": "5"}, "does not apply to a batch read"),
        ({**BASE, "consumerGroup": "g"}, "does not apply to a batch read"),
    ],
)
def test_batch_option_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        parse_source_options(options, streaming=False)


def test_offsets_and_timestamps_parse():
    s = stream(startingOffsets='{"T": {"1": -2, "0": 7}}')
    assert s.starting.kind is StartKind.JSON and s.starting.offsets == {"T": {"1": -2, "0": 7}}
    assert stream(startingTimestamp="1700000000000").starting.timestamp_ms == 1_700_000_000_000
    b = batch(endingOffsets='{"T": {"0": -1, "1": 3}}')
    assert not b.ending.latest and b.ending.offsets == {"T": {"0": -1, "1": 3}}
    assert batch(endingTimestamp="99").ending.timestamp_ms == 99
    a = parse_source_options({"path": "/p", "assign": '{"B": [2, 0, 2], "A": [1]}'}, streaming=True)
    assert a.subscription.assign == (("A", (1,)), ("B", (0, 2)))


def test_admission_options():
    s = stream(maxOffsetsPerTrigger="100", minOffsetsPerTrigger="10", maxTriggerDelay="2s")
    assert (s.max_offsets_per_trigger, s.min_offsets_per_trigger, s.max_trigger_delay_ms) == (
        100,
        10,
        2000,
    )


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500", 500),
        ("500ms", 500),
        ("2s", 2000),
        ("3 seconds", 3000),
        ("15m", 900_000),
        ("1h", 3_600_000),
        ("1 day", 86_400_000),
    ],
)
def test_durations(text, ms):
    assert parse_duration_ms("maxTriggerDelay", text) == ms


def test_sink_options():
    base = {"path": "/p"}
    assert (
        parse_sink_options({**base, "transactional": "false"}, streaming=False).transactional
        is False
    )
    # Spark adds these to a writer's options
    parse_sink_options({**base, "checkpointLocation": "/c", "queryName": "q"}, streaming=True)
    with pytest.raises(ConfigError, match="true or false"):
        parse_sink_options({**base, "transactional": "sometimes"}, streaming=True)
    with pytest.raises(ConfigError, match="characters outside"):
        parse_sink_options({**base, "topic": "a/b"}, streaming=True)
    with pytest.raises(ConfigError, match="does not apply to a streaming write"):
        parse_sink_options({**base, "topics": "T"}, streaming=True)
    with pytest.raises(ConfigError, match="broker flags"):
        parse_sink_options({**base, "broker.": "x"}, streaming=True)


def test_read_names_checked_before_the_mode_is_known():
    assert (
        check_read_names({**BASE, "endingOffsets": "latest", "maxOffsetsPerTrigger": "3"}) is None
    )
    with pytest.raises(ConfigError, match="unknown option 'topci'"):
        check_read_names({"path": "/p", "topci": "T"})


def test_canonical_offsets_sort_topics_and_queues_numerically():
    c = O.canonical({"b": {"10": 1, "2": 5}, "a": {1: 3}})
    assert list(c) == ["a", "b"] and list(c["b"]) == ["2", "10"]
    assert O.to_json(c) == '{"a":{"1":3},"b":{"2":5,"10":1}}'
    assert O.same({"b": {"2": 5, "10": 1}, "a": {"1": 3}}, c)


def test_rate_limit_is_proportional_and_gives_each_queue_one():
    start = {"t": {"0": 0, "1": 0, "2": 10}}
    latest = {"t": {"0": 900, "1": 100, "2": 11}}
    end = O.rate_limit(start, latest, 100)
    # shares: 900/1001*100 = 89.9 -> 89, 100/1001*100 = 9.99 -> 9, 1/1001*100 < 1 -> 1
    assert end == {"t": {"0": 89, "1": 9, "2": 11}}
    assert O.rate_limit(start, start, 5) == O.canonical(start)


def test_resolve_cap_and_not_before():
    lo, hi = {"t": {"0": 2, "1": 0}}, {"t": {"0": 9, "1": 4}}
    assert O.resolve({"t": {"0": -2, "1": -1}}, lo, hi) == {"t": {"0": 2, "1": 4}}
    assert O.cap({"t": {"0": 9, "1": 4}}, {"t": {"0": 5}}) == {"t": {"0": 5, "1": 4}}
    assert O.not_before({"t": {"0": 3}}, {"t": {"0": 5, "1": 1}}) == {"t": {"0": 5, "1": 1}}
    assert O.total_rows({"t": {"0": 5}}, {"t": {"0": 9, "1": 4}}) == 8


def test_credentials_options():
    """accessKey / secretKey: every read and write signs its calls to the broker with them."""
    for opts in (
        stream(accessKey="app", SECRETKEY="s3cret"),
        batch(accesskey="app", secretKey="s3cret"),
        parse_sink_options(
            {"path": "/tmp/x", "topic": "Out", "accessKey": "app", "secretKey": "s3cret"}, True
        ),
        parse_sink_options(
            {"path": "/tmp/x", "topic": "Out", "accessKey": "app", "secretKey": "s3cret"}, False
        ),
    ):
        assert opts.connection.credentials == {"access_key": "app", "secret_key": "s3cret"}
        assert "s3cret" not in repr(opts)  # never in a plan, a log or an error
    assert stream().connection.credentials == {"access_key": None, "secret_key": None}
    with pytest.raises(ConfigError, match="option 'accessKey' needs option 'secretKey'"):
        stream(accessKey="app")
    with pytest.raises(ConfigError, match="option 'secretKey' needs option 'accessKey'"):
        parse_sink_options({"path": "/tmp/x", "topic": "Out", "secretKey": "s"}, streaming=False)
