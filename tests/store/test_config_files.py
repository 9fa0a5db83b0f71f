"""The store's JSON config files are checked as they are loaded: valid JSON of the wrong shape
(a string where a number belongs, a negative queue count, an array for the table) is a
ConfigError naming the file and the key, never a traceback from deep inside a loader, and the
broker process says so and exits 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rmq_spark.errors import ConfigError
from rmq_spark.services.core import BrokerCore
from rmq_spark.store import layout as L
from rmq_spark.store.config import TopicConfigManager
from rmq_spark.store.offsets import ConsumerOffsetManager


def topic(name: str = "T", **fields) -> dict:  # type: ignore[no-untyped-def]
    return {"topicName": name, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6, **fields}


def write_config(root: str, name: str, data: object) -> str:
    path = os.path.join(root, L.CONFIG_DIR, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    return path


BAD_TOPICS = [
    ({"topicConfigTable": {"T": topic(readQueueNums=-5)}}, "topicConfigTable.T.readQueueNums", "-5 is not between 1 and 1024"),
    ({"topicConfigTable": {"T": topic(writeQueueNums="four")}}, "topicConfigTable.T.writeQueueNums", "'four' is not an integer"),
    ({"topicConfigTable": {"T": topic(perm=None)}}, "topicConfigTable.T.perm", "None is not an integer"),
    ({"topicConfigTable": {"T": topic(order="sometimes")}}, "topicConfigTable.T.order", "is not a boolean"),
    ({"topicConfigTable": {"T": topic(attributes=["a"])}}, "topicConfigTable.T.attributes", "must be a JSON object, not an array"),
    ({"topicConfigTable": {"T": topic(attributes={"+message.type": "LOUD"})}}, "topicConfigTable.T.attributes.+message.type", "'LOUD' is not one of"),
    ({"topicConfigTable": {"T": topic(name="U")}}, "topicConfigTable.T.topicName", "'U' is not the entry's name 'T'"),
    ({"topicConfigTable": {"T": {"readQueueNums": 4}}}, "topicConfigTable.T.topicName", "is missing"),
    ({"topicConfigTable": {"a b": topic(name="a b")}}, "topicConfigTable.a b", "characters outside"),
    ({"topicConfigTable": {"T": 5}}, "topicConfigTable.T", "must be a JSON object, not a number"),
    ({"topicConfigTable": [1, 2]}, "topicConfigTable", "must be a JSON object, not an array"),
    ({"topicConfigTable": {}, "dataVersion": {"counter": "x"}}, "dataVersion.counter", "'x' is not an integer"),
]  # fmt: skip


@pytest.mark.parametrize("data, key, problem", BAD_TOPICS, ids=[k for _d, k, _p in BAD_TOPICS])
def test_topics_json_of_the_wrong_shape_names_file_and_key(tmp_path, data, key, problem):
    path = write_config(str(tmp_path), L.TOPICS_FILE, data)
    with pytest.raises(ConfigError) as e:
        TopicConfigManager(str(tmp_path))
    assert str(e.value).startswith(f"config file {path}: key {key!r}: "), str(e.value)
    assert problem in str(e.value)


def test_a_top_level_that_is_not_an_object_is_named(tmp_path):
    path = write_config(str(tmp_path), L.TOPICS_FILE, [1, 2, 3])
    with pytest.raises(
        ConfigError, match=f"config file {path}: must be a JSON object, not an array"
    ):
        TopicConfigManager(str(tmp_path))


BAD_OFFSETS = [
    ({"offsetTable": {"T@g": {"0": "ten"}}}, "offsetTable.T@g.0", "'ten' is not an integer"),
    ({"offsetTable": {"T@g": {"0": -7}}}, "offsetTable.T@g.0", "-7 is not at least -1"),
    ({"offsetTable": {"T@g": {"zero": 1}}}, "offsetTable.T@g.zero", "is not a queue id"),
    ({"offsetTable": {"T@g": [1]}}, "offsetTable.T@g", "must be a JSON object, not an array"),
    ({"offsetTable": {"Tg": {"0": 1}}}, "offsetTable.Tg", "is not 'topic@group'"),
    ({"offsetTable": "none"}, "offsetTable", "must be a JSON object, not a string"),
]  # fmt: skip


@pytest.mark.parametrize("data, key, problem", BAD_OFFSETS, ids=[k for _d, k, _p in BAD_OFFSETS])
def test_consumer_offset_json_of_the_wrong_shape_names_file_and_key(tmp_path, data, key, problem):
    path = write_config(str(tmp_path), L.CONSUMER_OFFSET_FILE, data)
    with pytest.raises(ConfigError) as e:
        ConsumerOffsetManager(str(tmp_path))
    assert str(e.value).startswith(f"config file {path}: key {key!r}: "), str(e.value)
    assert problem in str(e.value)


def test_delay_and_timer_progress_files_are_checked_too(tmp_path):
    root = str(tmp_path / "a")
    path = write_config(root, L.DELAY_OFFSET_FILE, {"offsetTable": {"1": "soon"}})
    with pytest.raises(
        ConfigError, match=f"config file {path}: key 'offsetTable.1': 'soon' is not an integer"
    ):
        BrokerCore(root, start_services=False)
    root = str(tmp_path / "b")
    path = write_config(root, "timercheck.json", {"queueOffset": [0]})
    with pytest.raises(
        ConfigError, match=f"config file {path}: key 'queueOffset': \\[0\\] is not an integer"
    ):
        BrokerCore(root, start_services=False)


def test_valid_files_still_load(tmp_path):
    write_config(
        str(tmp_path),
        L.TOPICS_FILE,
        {"topicConfigTable": {"T": topic(readQueueNums="2", order=False)}},
    )
    write_config(str(tmp_path), L.CONSUMER_OFFSET_FILE, {"offsetTable": {"T@g": {"0": 5, "1": -1}}})
    assert TopicConfigManager(str(tmp_path)).get("T").read_queue_nums == 2  # type: ignore[union-attr]
    assert ConsumerOffsetManager(str(tmp_path)).query_topic("g", "T") == {0: 5, 1: -1}


def test_the_broker_process_names_the_file_and_exits_2(tmp_path):
    store = str(tmp_path / "store")
    path = write_config(store, L.TOPICS_FILE, {"topicConfigTable": {"T": topic(readQueueNums=-5)}})
    r = subprocess.run(
        [sys.executable, "-m", "rmq_spark.broker", "--store", store, "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert (
        f"config file {path}: key 'topicConfigTable.T.readQueueNums': -5 is not between 1 and 1024"
        in r.stderr
    )
    assert "Traceback" not in r.stderr
