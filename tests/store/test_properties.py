"""Message properties: the one encoder / parser of a record's properties and its fast paths."""

from __future__ import annotations

import pyarrow as pa

from rmq_spark.store import layout as L
from rmq_spark.store.properties import (
    PROP_CRC_PLACEHOLDER,
    ParsedProperties,
    decode_properties,
    encode_properties,
    find_properties,
)

T = L.TRANSIENT_PREFIX


def test_encode_properties_fast_and_general_paths():
    cases = [
        ({}, b""),
        (
            {"a": "1", "KEYS": "k1 k2", "u": "\u00e9\u4e2d"},
            "a\x011\x02KEYS\x01k1 k2\x02u\x01\u00e9\u4e2d\x02".encode(),
        ),
        ({"a": None, "b": "2"}, b"b\x012\x02"),  # None is dropped
        ({"n": 5, "b": "x"}, b"n\x015\x02b\x01x\x02"),  # a non-string value is str()-ed
        ({T + "x": "1", "b": "2"}, b"b\x012\x02"),  # a transient key is not stored
        (
            {"b": "v" + T},
            ("b\x01v" + T + "\x02").encode(),
        ),  # ... but a value may contain the prefix
    ]
    for props, want in cases:
        assert encode_properties(props) == want, props  # type: ignore[arg-type]


def test_decode_properties_rule_and_crc():
    raw = b"a\x011\x02\x01x\x02k\x01\x02noval\x02TAGS\x01t\x01u\x02" + PROP_CRC_PLACEHOLDER
    # empty keys, empty values and segments without \x01 are dropped; the value keeps later \x01;
    # the record CRC is no property
    assert decode_properties(raw) == {"a": "1", "TAGS": "t\x01u"}
    assert decode_properties(raw.decode()) == decode_properties(raw)


def test_find_properties_agrees_with_decode():
    raw = (
        encode_properties({"KEYS": "k1", "UNIQ_KEY": "u", "x": "y"}) + b"KEYS\x01k2\x02KEYS\x01\x02"
    )
    full = decode_properties(raw)
    assert find_properties(raw, "KEYS", "UNIQ_KEY", "missing") == [
        full["KEYS"],
        full["UNIQ_KEY"],
        None,
    ]
    assert full["KEYS"] == "k2"  # the last non-empty value wins


def test_column_parser_agrees_with_decode():
    rows = [
        encode_properties({"a": "1", "TAGS": "t"}),
        b"",
        b"\x01x\x02k\x01\x02b\x012",  # no trailing separator
        encode_properties({"KEYS": "k"}) + PROP_CRC_PLACEHOLDER,
    ]
    parsed = ParsedProperties(pa.array(rows, pa.binary())).map_array().to_pylist()
    assert [dict(m) for m in parsed] == [decode_properties(r) for r in rows]
