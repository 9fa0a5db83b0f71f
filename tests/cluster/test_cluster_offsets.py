"""Offsets of cluster reads: the JSON Spark compares, and the arithmetic of admission control."""

from __future__ import annotations

import pytest

from rmq_spark.datasource.cluster import offsets as C
from rmq_spark.datasource.options import parse_source_options
from rmq_spark.errors import ConfigError


def test_json_is_canonical_and_names_the_broker():
    flat = {("T", "broker-b", 10): 5, ("T", "broker-a", 2): 7, ("A", "broker-a", 0): 1}
    assert C.to_json(flat) == '{"A":{"broker-a":{"0":1}},"T":{"broker-a":{"2":7},"broker-b":{"10":5}}}'
    assert C.flat(C.nested(flat)) == flat


def test_queues_of_a_missing_broker_keep_their_place_and_limits_split_by_backlog():
    start = {("T", "a", 0): 10, ("T", "b", 0): 20}
    assert C.not_before({("T", "a", 0): 30}, start) == {("T", "a", 0): 30, ("T", "b", 0): 20}
    end = C.rate_limit(start, {("T", "a", 0): 110, ("T", "b", 0): 320}, 40)
    assert end == {("T", "a", 0): 20, ("T", "b", 0): 50}
    assert C.total_rows(start, end) == 40
    assert C.cap({("T", "a", 0): 110, ("T", "c", 0): 9}, {("T", "a", 0): 50}, {}) == {("T", "a", 0): 50, ("T", "c", 0): 0}


def test_options_with_namesrv_addr():
    o = parse_source_options({"namesrvAddr": "h1:9876, h2:9876", "topics": "T", "pullBatchSize": "64",
                              "startingOffsets": '{"T": {"broker-a": {"0": 5, "1": -2}}}'}, streaming=True)
    assert o.connection.namesrv_addr == "h1:9876;h2:9876" and o.pull_batch_size == 64
    assert o.starting.offsets == {"T": {"broker-a": {"0": 5, "1": -2}}}
    with pytest.raises(ConfigError, match="not host:port"):
        parse_source_options({"namesrvAddr": "h1", "topics": "T"}, streaming=True)
    with pytest.raises(ConfigError, match="readPath=files"):
        parse_source_options({"namesrvAddr": "h:1", "topics": "T", "readPath": "files"}, streaming=False)
    with pytest.raises(ConfigError, match="accessKey"):
        parse_source_options({"namesrvAddr": "h:1", "topics": "T", "accessKey": "a", "secretKey": "b"}, streaming=False)
    with pytest.raises(ConfigError, match="brokerUnavailableTimeout.*namesrvAddr"):
        parse_source_options({"endpoints": "h:1", "topics": "T", "brokerUnavailableTimeout": "1m"}, streaming=False)
