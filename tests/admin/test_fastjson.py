"""Reading fastjson's bodies: maps keyed by objects and unquoted numeric keys, as a RocketMQ broker
writes TopicStatsTable / ConsumeStats / cluster info; anything else that is not JSON is refused
with the position."""

from __future__ import annotations

import json

import pytest

from rmq_spark.admin import fastjson
from rmq_spark.remoting import jsonbody


def test_object_keys_become_pairs_and_string_keys_a_dict():
    items = [
        ({"brokerName": "b", "queueId": q, "topic": "T"}, {"maxOffset": q * 10, "minOffset": 0})
        for q in range(3)
    ]
    body = '{"offsetTable":' + jsonbody.object_key_map(items) + ',"consumeTps":1.5}'
    doc = fastjson.loads(body.encode())
    assert doc["consumeTps"] == 1.5
    assert doc["offsetTable"] == [(k, v) for k, v in items]


def test_unquoted_numeric_keys_and_plain_json():
    doc = fastjson.loads(
        b'{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10912"},"x":[true,false,null,-2e3]}'
    )
    assert doc["brokerAddrs"] == [(0, "127.0.0.1:10911"), (1, "127.0.0.1:10912")]
    assert doc["x"] == [True, False, None, -2000.0]
    plain = {"a": [1, {"b": "c\u00e9\n"}], "d": {}}
    assert fastjson.loads(json.dumps(plain)) == plain


@pytest.mark.parametrize("text", ['{"a":1', '{"a" 1}', "[1,2", '{"a":1} x', '{"a":nope}'])
def test_not_json_is_refused_with_its_position(text):
    with pytest.raises(ValueError, match=r"position|end of the document"):
        fastjson.loads(text)
