"""topics.json rewrites stay short as the table grows, and heartbeats' retry topics are bounded.

- A table kept encoded entry by entry (``EncodedTable``) is written byte for byte as the plain
  table is, with the same checksum, so RocketMQ's readers and our loader see no difference; the
  checksum's joined form is json.dumps' (sorted, compact) for any data.
- A rewrite after N topics encodes only the topics created or changed since, not the N.
- Writes asked for together share one (a group commit), and each is durable before its call
  returns; a write that fails leaves its own changes out of force.
- Heartbeats (``bounded``) create retry topics only up to ``retry_topics_auto_max``; the rest are
  left out, with one warning; an admin's explicit create is not bounded.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_spark.errors import DiskFullError
from rmq_spark.store import config as config_module
from rmq_spark.store import jsonfile
from rmq_spark.store.config import TopicConfig, TopicConfigManager
from rmq_spark.store.jsonfile import Encoded, EncodedTable, read_json, write_json_atomic

_HUNT = int(os.environ.get("RMQ_FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=_HUNT or 60,
    derandomize=not _HUNT,
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63), NAMES,
                    st.floats(allow_nan=False, allow_infinity=False))  # fmt: skip
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(NAMES, inner, max_size=3)),
                      max_leaves=8)  # fmt: skip
TABLES = st.dictionaries(NAMES, st.dictionaries(NAMES, VALUES, max_size=4), max_size=6)


@FUZZ
@given(data=st.dictionaries(NAMES, st.one_of(VALUES, TABLES), max_size=4))
def test_the_checksum_form_is_json_dumps_sorted_and_compact(data: dict[str, Any]) -> None:
    want = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert jsonfile._canonical(data) == want  # the checksum's own form


@FUZZ
@given(table=TABLES, version=st.integers(0, 2**40))
def test_an_encoded_table_is_written_as_the_plain_table_byte_for_byte(tmp_path, table, version):
    plain_path, encoded_path = str(tmp_path / "plain.json"), str(tmp_path / "encoded.json")
    encoded = EncodedTable()
    for name, value in table.items():
        encoded.put(Encoded(name, value))
    dv = {"counter": version}
    write_json_atomic(plain_path, {"dataVersion": dv, "topicConfigTable": table})
    write_json_atomic(encoded_path, {"dataVersion": dv, "topicConfigTable": encoded})
    for suffix in ("", ".bak"):
        with open(plain_path + suffix, "rb") as a, open(encoded_path + suffix, "rb") as b:
            assert a.read() == b.read()
    assert read_json(encoded_path) == {"dataVersion": dv, "topicConfigTable": table}


def test_an_encoded_table_is_refused_where_its_entries_would_not_be_one_line(tmp_path) -> None:
    table = EncodedTable()
    table.put(Encoded("T", {"perm": 6}))
    for data in (table, {"a": {"b": table}}, {"a": {"b": {"T": table["T"]}}}):
        with pytest.raises(ValueError, match="EncodedTable at level"):
            write_json_atomic(str(tmp_path / "x.json"), data)
    assert not os.path.exists(tmp_path / "x.json")


@pytest.fixture
def encodes(monkeypatch) -> list[str]:
    """The topic entries encoded (by name)."""
    seen: list[str] = []
    real = config_module.Encoded

    def counted(key: str, value: Any) -> Encoded:
        seen.append(key)
        return real(key, value)

    monkeypatch.setattr(config_module, "Encoded", counted)
    return seen


def test_a_rewrite_encodes_only_the_new_and_changed_topics(tmp_path, encodes) -> None:
    topics = TopicConfigManager(str(tmp_path))
    topics.get_or_create_many([f"%RETRY%g{i}" for i in range(3000)])
    assert len(encodes) == 3000
    encodes.clear()
    topics.get_or_create_many([f"%RETRY%g{i}" for i in range(2990, 3010)])  # 10 known, 10 new
    topics.create(TopicConfig("%RETRY%g5", 2, 2))  # one changed
    assert encodes == [f"%RETRY%g{i}" for i in range(3000, 3010)] + ["%RETRY%g5"]
    # the file holds all of them, as a fresh loader (and RocketMQ's reader) reads it
    data = read_json(topics.path)
    assert len(data["topicConfigTable"]) == 3010
    assert data["topicConfigTable"]["%RETRY%g5"] == TopicConfig("%RETRY%g5", 2, 2).to_json()
    assert TopicConfigManager(str(tmp_path)).topics == topics.topics


def test_the_file_is_what_the_plain_table_writes(tmp_path) -> None:
    """The cached entries change nothing in the file: the same bytes as the whole table encoded."""
    topics = TopicConfigManager(str(tmp_path / "cached"))
    cfgs = [TopicConfig(f"T{i}", 1 + i % 8, 1 + i % 8, attributes={"k": str(i)}) for i in range(50)]
    topics.create_many(cfgs)
    topics.delete("T7")
    data = read_json(topics.path)
    plain = str(tmp_path / "plain.json")
    table = {c.topic_name: c.to_json() for c in cfgs if c.topic_name != "T7"}
    write_json_atomic(plain, {"dataVersion": data["dataVersion"], "topicConfigTable": table})
    with open(topics.path, "rb") as a, open(plain, "rb") as b:
        assert a.read() == b.read()


def test_writes_asked_for_together_share_one_and_each_is_durable_on_return(tmp_path, monkeypatch):
    topics = TopicConfigManager(str(tmp_path))
    real = config_module.write_json_atomic
    entered, release = threading.Event(), threading.Event()
    writes: list[int] = []

    def slow(path: str, data: dict[str, Any]) -> None:
        writes.append(len(data["topicConfigTable"]))
        if len(writes) == 1:  # the first write waits while the others make their changes
            entered.set()
            assert release.wait(30)
        real(path, data)

    monkeypatch.setattr(config_module, "write_json_atomic", slow)
    first = threading.Thread(target=topics.create, args=(TopicConfig("First", 1, 1),))
    first.start()
    assert entered.wait(30)
    done: list[str] = []

    def create(name: str) -> None:
        topics.create(TopicConfig(name, 1, 1))
        done.append(name)

    others = [threading.Thread(target=create, args=(n,)) for n in "ABCD"]
    for t in others:
        t.start()
    # every change is made (in force) before its write; none has returned
    _until(lambda: all(topics.get(n) is not None for n in "ABCD"))
    assert done == []
    release.set()
    first.join(30)
    for t in others:
        t.join(30)
    assert sorted(done) == ["A", "B", "C", "D"]
    # the first write held First only; one more write held the four changes made meanwhile
    assert writes == [1, 5]
    assert sorted(read_json(topics.path)["topicConfigTable"]) == ["A", "B", "C", "D", "First"]


def test_a_failed_write_takes_only_its_own_changes_out_of_force(tmp_path, monkeypatch):
    topics = TopicConfigManager(str(tmp_path))
    topics.create(TopicConfig("Old", 2, 2))
    real = config_module.write_json_atomic

    def full(path: str, data: dict[str, Any]) -> None:
        raise DiskFullError(f"{path}: no space left on the device", path)

    monkeypatch.setattr(config_module, "write_json_atomic", full)
    with pytest.raises(DiskFullError):
        topics.delete("Old")
    assert topics.get("Old") == TopicConfig("Old", 2, 2)
    with pytest.raises(DiskFullError):
        topics.create_many([TopicConfig("Old", 4, 4), TopicConfig("%RETRY%g", 1, 1)])
    assert topics.get("Old") == TopicConfig("Old", 2, 2) and topics.get("%RETRY%g") is None
    monkeypatch.setattr(config_module, "write_json_atomic", real)
    topics.create(TopicConfig("New", 1, 1))  # the next write holds the table as it is in force
    assert sorted(read_json(topics.path)["topicConfigTable"]) == ["New", "Old"]
    assert read_json(topics.path)["topicConfigTable"]["Old"]["readQueueNums"] == 2


def test_heartbeats_create_retry_topics_up_to_the_bound(tmp_path, caplog):
    topics = TopicConfigManager(str(tmp_path), retry_topics_auto_max=25)
    topics.create(TopicConfig("Plain", 1, 1))  # other topics do not count
    got = topics.get_or_create_many([f"%RETRY%a{i}" for i in range(20)], bounded=True)
    assert len(got) == 20
    with caplog.at_level(logging.WARNING, logger="rmq_spark.store"):
        asked = ["%RETRY%a0"] + [f"%RETRY%b{i}" for i in range(10)]
        got = topics.get_or_create_many(asked, bounded=True)
        # the ones already there are answered; new ones only up to the bound
        assert list(got) == ["%RETRY%a0"] + [f"%RETRY%b{i}" for i in range(5)]
        assert topics.get_or_create_many(["%RETRY%c"], bounded=True) == {}
    refusals = [r for r in caplog.records if "retry topics are not created" in r.getMessage()]
    assert len(refusals) == 1 and "holds 25 retry topics" in refusals[0].getMessage()
    assert sum(n.startswith("%RETRY%") for n in TopicConfigManager(str(tmp_path)).topics) == 25
    # unbounded callers (a send-back's retry topic, an admin's create) are not refused
    assert list(topics.get_or_create_many(["%RETRY%d"])) == ["%RETRY%d"]
    topics.create(TopicConfig("%RETRY%e", 1, 1))
    # a deleted one makes room; the bound holds across a restart (counted from the file)
    again = TopicConfigManager(str(tmp_path), retry_topics_auto_max=26)
    again.delete("%RETRY%a1")
    again.delete("%RETRY%a2")
    assert list(again.get_or_create_many(["%RETRY%f", "%RETRY%g", "%RETRY%h"], bounded=True)) == [
        "%RETRY%f"
    ]


def _until(cond: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        threading.Event().wait(0.005)
