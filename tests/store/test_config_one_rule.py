"""What a request can write is what the loader accepts: topic configs and consumer offsets each
have one rule (``topic_config_problem``, ``check_offset``) that every write and the loader at
start both apply.  Before, ``perm=16``, a queue id of -1 or an offset of -5 were written to the
file and its copy, and the broker no longer started until both were edited by hand.

Held as properties: any config or offset the store's API accepts is loaded back equal by a fresh
loader; any it refuses, written into the file by hand, the loader refuses too (naming the file and
the key), and the refusal changed no file.  And topic-config writes are batched: creating 1,000
retry topics (a heartbeat naming 1,000 new groups) writes topics.json once, not 1,000 times."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_spark.errors import ConfigError, DiskFullError, MessageIllegalError
from rmq_spark.store import config as config_module
from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.config import TopicConfig, TopicConfigManager
from rmq_spark.store.jsonfile import read_json
from rmq_spark.store.message import Message
from rmq_spark.store.offsets import ConsumerOffsetManager
from rmq_spark.store.store import MessageStore, StoreConfig

_HUNT = int(os.environ.get("RMQ_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_HUNT or 150, derandomize=not _HUNT, database=None, deadline=None, print_blob=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
SMALL = {"commitlog_segment_bytes": 64 * 1024, "cq_segment_units": 64}

INTS = st.one_of(st.integers(-3, 20), st.integers(1000, 1030), st.sampled_from([-(2**31), 2**31 - 1, 2**63, 10**9]),
                 st.booleans())  # fmt: skip


def files(root: str) -> dict[str, bytes]:
    d = os.path.join(root, L.CONFIG_DIR)
    return {n: Path(d, n).read_bytes() for n in sorted(os.listdir(d))} if os.path.isdir(d) else {}


def write_by_hand(root: str, name: str, doc: dict[str, Any]) -> str:
    """``doc`` as both copies of a config file, without a checksum (as an operator would write it)."""
    path = os.path.join(root, L.CONFIG_DIR, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for p in (path, path + ".bak"):
        with open(p, "w", encoding="utf-8") as f:
            json.dump(doc, f)
    return path


# --- topics.json ----------------------------------------------------------------------------------------
@FUZZ
@given(read=INTS, write=INTS, perm=INTS, mtype=st.sampled_from(["MIXED", "NORMAL", "FIFO", "LOUD", ""]),
       order=st.sampled_from([False, True, 1, None]))  # fmt: skip
def test_a_topic_config_the_api_accepts_loads_and_one_it_refuses_the_loader_refuses(tmp_path_factory, read, write,
                                                                                    perm, mtype, order):  # fmt: skip
    root = str(tmp_path_factory.mktemp("t"))
    topics = TopicConfigManager(root)
    topics.create(TopicConfig("Before", 2, 2))
    before = files(root)
    cfg = TopicConfig("T", read, write, perm, mtype, order)
    try:
        topics.create(cfg)
    except (ConfigError, MessageIllegalError) as e:
        assert files(root) == before, "a refused config changed topics.json"
        assert topics.get("T") is None
        # the same entry written by hand: the loader refuses it too, naming the file and the key
        entry = {**cfg.to_json(), "attributes": {"+message.type": mtype}}
        path = write_by_hand(root, L.TOPICS_FILE, {"topicConfigTable": {"T": entry}})
        with pytest.raises(ConfigError, match=f"config file {path}: key 'topicConfigTable.T"):
            TopicConfigManager(root)
        assert "T" in str(e)
    else:
        assert TopicConfigManager(root).get("T") == cfg


@pytest.mark.parametrize("field, value", [("perm", 16), ("perm", -1), ("read_queue_nums", 0),
                                          ("write_queue_nums", 1025), ("read_queue_nums", 2**31 - 1),
                                          ("perm", True), ("write_queue_nums", "4")])  # fmt: skip
def test_the_values_of_the_issue_are_refused_and_the_store_starts_again(store_dir, field, value):
    with MessageStore(store_dir, StoreConfig(**SMALL), clock=FakeClock()) as s:
        assert s.put_message(Message("T", b"kept")).ok
        before = files(store_dir)
        cfg = TopicConfig("T", 4, 4)
        setattr(cfg, field, value)
        key = {
            "perm": "perm",
            "read_queue_nums": "readQueueNums",
            "write_queue_nums": "writeQueueNums",
        }[field]
        with pytest.raises(ConfigError, match=f"topic 'T': {key} "):
            s.topics.create(cfg)
        assert files(store_dir) == before
    with MessageStore(store_dir, StoreConfig(**SMALL), clock=FakeClock()) as s:
        assert s.topics.get("T") == TopicConfig("T", 4, 4)
        assert [m.body for m in s.get_messages("T", 0, 0).messages] == [b"kept"]


# --- consumerOffset.json ----------------------------------------------------------------------------------
@FUZZ
@given(queue_id=st.one_of(INTS, st.just(1023), st.just(1024)),
       offset=st.one_of(INTS, st.integers(-(2**63), 2**64), st.just(2**63 - 1)))  # fmt: skip
def test_an_offset_the_api_accepts_loads_and_one_it_refuses_the_loader_refuses(
    tmp_path_factory, queue_id, offset
):
    root = str(tmp_path_factory.mktemp("o"))
    offsets = ConsumerOffsetManager(root)
    offsets.commit("G", "T", 0, 7, persist=True)
    before = files(root)
    try:
        offsets.commit("G", "T", queue_id, offset, persist=True)
    except MessageIllegalError as e:
        assert files(root) == before, "a refused offset changed consumerOffset.json"
        assert offsets.query_topic("G", "T") == {0: 7}
        assert ("queueId" in str(e)) != ("commitOffset" in str(e)), str(
            e
        )  # names the one field wrong
        path = write_by_hand(
            root, L.CONSUMER_OFFSET_FILE, {"offsetTable": {"T@G": {str(queue_id): offset}}}
        )
        with pytest.raises(ConfigError, match=f"config file {path}: key 'offsetTable.T@G"):
            ConsumerOffsetManager(root)
    else:
        assert ConsumerOffsetManager(root).query_topic("G", "T") == {
            0: 7,
            int(queue_id): int(offset),
        }


@pytest.mark.parametrize("queue_id, offset, named", [(-1, 5, "queueId -1"), (0, -5, "commitOffset -5"),
                                                     (1024, 0, "queueId 1024"), (0, 2**63, "commitOffset")])  # fmt: skip
def test_the_offsets_of_the_issue_are_refused_and_the_store_starts_again(
    store_dir, queue_id, offset, named
):
    with MessageStore(store_dir, StoreConfig(**SMALL), clock=FakeClock()) as s:
        s.offsets.commit("G", "T", 0, 3, persist=True)
        before = files(store_dir)
        with pytest.raises(MessageIllegalError, match=named):
            s.offsets.commit("G", "T", queue_id, offset, persist=True)
        with pytest.raises(
            MessageIllegalError, match=named
        ):  # the connector's CommitOffsets: all or nothing
            s.offsets.commit_many("G", {"U": {0: 1}, "T": {queue_id: offset}})
        assert s.offsets.query_topic("G", "U") == {}
        assert files(store_dir) == before
    with MessageStore(store_dir, StoreConfig(**SMALL), clock=FakeClock()) as s:
        assert s.offsets.query_topic("G", "T") == {0: 3}


# --- one write for many topics ----------------------------------------------------------------------------
@pytest.fixture
def writes(monkeypatch):
    """The writes of topics.json, counted."""
    seen: list[int] = []
    real = config_module.write_json_atomic

    def counted(path: str, data: dict[str, Any]) -> None:
        seen.append(len(data["topicConfigTable"]))
        real(path, data)

    monkeypatch.setattr(config_module, "write_json_atomic", counted)
    return seen


def test_a_thousand_retry_topics_are_one_write(tmp_path, writes):
    root = str(tmp_path)
    topics = TopicConfigManager(root)
    names = [f"%RETRY%group-{i}" for i in range(1000)]
    got = topics.get_or_create_many(names)
    assert writes == [1000]
    assert list(got) == names and all(
        c.read_queue_nums == 1 and c.write_queue_nums == 1 for c in got.values()
    )
    # durable on return: a fresh loader sees every one
    assert sorted(TopicConfigManager(root).topics) == sorted(names)
    # asked again (the next heartbeats), nothing is written
    assert topics.get_or_create_many(names) == got and writes == [1000]
    # half new: one more write
    topics.get_or_create_many(names[:500] + [f"%RETRY%late-{i}" for i in range(500)])
    assert writes == [1000, 1500]


def test_create_many_is_one_write_and_all_or_nothing(tmp_path, writes):
    topics = TopicConfigManager(str(tmp_path))
    cfgs = [TopicConfig(f"T{i}", 2, 2) for i in range(300)]
    assert topics.create_many(cfgs) == cfgs and writes == [300]
    with pytest.raises(ConfigError, match="topic 'Bad': perm 16 is not between 0 and 15"):
        topics.create_many([TopicConfig("New", 1, 1), TopicConfig("Bad", 1, 1, perm=16)])
    with pytest.raises(MessageIllegalError, match=r"topic '../x' contains characters"):
        topics.get_or_create_many(["%RETRY%fine", "../x"])
    assert writes == [300] and topics.get("New") is None and topics.get("%RETRY%fine") is None
    # an update and a create in one call: one write; an unchanged config is no write
    changed = [TopicConfig("T0", 4, 4), TopicConfig("T1", 2, 2), TopicConfig("Fresh", 1, 1)]
    assert topics.create_many(changed) == changed and writes == [300, 301]
    loaded = TopicConfigManager(str(tmp_path))
    assert loaded.get("T0") == TopicConfig("T0", 4, 4) and loaded.get("Fresh") == TopicConfig(
        "Fresh", 1, 1
    )


def test_topics_not_written_are_not_in_force(tmp_path, monkeypatch):
    """A write that fails (a full disk) leaves the table as the file holds it."""
    topics = TopicConfigManager(str(tmp_path))
    topics.create(TopicConfig("Old", 2, 2))

    def full(path: str, data: dict[str, Any]) -> None:
        raise DiskFullError(f"{path}: no space left on the device", path)

    monkeypatch.setattr(config_module, "write_json_atomic", full)
    with pytest.raises(DiskFullError):
        topics.create_many([TopicConfig("Old", 8, 8), TopicConfig("New", 1, 1)])
    assert topics.get("Old") == TopicConfig("Old", 2, 2) and topics.get("New") is None
    data = read_json(topics.path)
    assert sorted(data["topicConfigTable"]) == ["Old"]


def test_auto_creation_off_refuses_the_whole_batch(tmp_path, writes):
    topics = TopicConfigManager(str(tmp_path), auto_create=False)
    with pytest.raises(ConfigError, match="topic 'Plain' does not exist and auto-creation is off"):
        topics.get_or_create_many(["%RETRY%g", "Plain"])
    assert writes == [] and topics.get("%RETRY%g") is None
    assert list(topics.get_or_create_many(["%RETRY%g", "%DLQ%g"])) == [
        "%RETRY%g",
        "%DLQ%g",
    ] and writes == [2]


def test_a_heartbeat_s_names_that_are_not_topics_are_left_out_with_skip_invalid(tmp_path, writes):
    topics = TopicConfigManager(str(tmp_path))
    names = ["%RETRY%a", "%RETRY%../x", "%RETRY%b", "%RETRY%" + "g" * 300, "%RETRY%a"]
    got = topics.get_or_create_many(names, skip_invalid=True)
    assert list(got) == ["%RETRY%a", "%RETRY%b"] and writes == [2]
    assert sorted(TopicConfigManager(str(tmp_path)).topics) == ["%RETRY%a", "%RETRY%b"]
