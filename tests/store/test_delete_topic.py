"""Deleting a topic: its ConsumeQueues and offsets go, its records stay hidden in the CommitLog behind
a tombstone, so a topic created again under the name starts empty on every way back in (a clean
restart and its consistency check, a crash and recovery's re-dispatch, a rebuild of the queues, a
crash in the middle of the delete, key and id lookups) while other topics keep everything."""

from __future__ import annotations

import logging
import os

import pytest

from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.config import TopicConfig
from rmq_spark.store.index.service import IndexService
from rmq_spark.store.jsonfile import read_json
from rmq_spark.store.message import Message
from rmq_spark.store.query import MessageQuery
from rmq_spark.store.store import MessageStore, StoreConfig

SMALL = {"commitlog_segment_bytes": 32 * 1024, "cq_segment_units": 40}


def open_store(d, **kw):
    return MessageStore(
        d, StoreConfig(**{**SMALL, **kw}), clock=FakeClock(), dispatchers=[IndexService]
    )


def put(s, topic, n, tag, queues=2):
    for i in range(n):
        r = s.put_message(
            Message(
                topic, f"{tag}-{i}".encode(), {"KEYS": f"k{i}", "TAGS": tag}, queue_id=i % queues
            )
        )
        assert r.ok


def bodies(s, topic, queues=2):
    out = []
    for q in range(queues):
        got = s.get_messages(topic, q, 0, max_msgs=1000)
        assert got.min_offset == 0 and got.max_offset == len(got.messages)
        out += [m.body.decode() for m in got.messages]
    return sorted(out)


def names(n, tag):
    return sorted(f"{tag}-{i}" for i in range(n))


@pytest.fixture
def deleted_and_recreated(store_dir):
    """Orders: 60 old messages, deleted, created again, 10 new; Other: 50 messages around it; a
    group's offsets on both topics."""
    s = open_store(store_dir)
    s.topics.create(TopicConfig("Orders", 2, 2))
    put(s, "Orders", 60, "old")
    put(s, "Other", 30, "other")
    s.offsets.commit("G", "Orders", 0, 30)
    s.offsets.commit("G", "Other", 0, 15, persist=True)
    s.delete_topic("Orders")
    assert s.topics.get("Orders") is None
    assert s.offsets.query_topic("G", "Orders") == {} and s.offsets.query("G", "Other", 0) == 15
    assert not os.path.exists(os.path.join(store_dir, L.CONSUMEQUEUE_DIR, "Orders"))
    assert s.max_offset("Orders", 0) == 0
    s.topics.create(TopicConfig("Orders", 2, 2))
    put(s, "Orders", 10, "new")
    put(s, "Other", 20, "other2")
    return s


def check(s):
    assert bodies(s, "Orders") == names(10, "new")
    assert bodies(s, "Other") == sorted(names(30, "other") + names(20, "other2"))
    q = MessageQuery(s)
    assert [m.body for m in q.by_key("Orders", "k3")] == [b"new-3"]
    assert q.by_key("Orders", "k42") == []  # only an old message had it
    assert [m.body for m in q.by_key("Other", "k3")] == [b"other2-3", b"other-3"]


def test_a_topic_created_again_starts_empty(deleted_and_recreated):
    s = deleted_and_recreated
    check(s)
    r = s.put_message(Message("Orders", b"one more", queue_id=0))
    assert r.append.queue_offsets[0] == 5  # queue offsets start again at 0: 5 new ones before it
    s.shutdown()


def test_a_clean_restart_keeps_the_old_messages_hidden_without_a_rebuild(
    deleted_and_recreated, store_dir, caplog
):
    deleted_and_recreated.shutdown()
    with caplog.at_level(logging.ERROR, logger="rmq_spark.store"), open_store(store_dir) as s:
        check(s)
        assert s.offsets.query_topic("G", "Orders") == {}
    assert not [r for r in caplog.records if "rebuilt" in r.getMessage()], caplog.text


def test_a_crash_re_dispatches_only_the_new_messages(deleted_and_recreated, store_dir):
    s = deleted_and_recreated
    s.checkpoint.dispatched_offset = s.checkpoint.confirm_phy_offset = (
        0  # recovery scans the whole log
    )
    s.checkpoint.flush()
    s.crash()
    with open_store(store_dir) as s:
        assert s.last_exit_abnormal
        check(s)


def test_lost_consume_queues_are_rebuilt_without_the_deleted_topic(
    deleted_and_recreated, store_dir
):
    s = deleted_and_recreated
    s.rebuild_consume_queues()
    check(s)
    s.shutdown()
    for d in ("Orders", "Other"):  # both topics' queues gone: the start rebuilds them from the log
        for name in os.listdir(os.path.join(store_dir, L.CONSUMEQUEUE_DIR, d)):
            for f in os.listdir(os.path.join(store_dir, L.CONSUMEQUEUE_DIR, d, name)):
                os.unlink(os.path.join(store_dir, L.CONSUMEQUEUE_DIR, d, name, f))
    with open_store(store_dir) as s:
        check(s)


def test_a_stop_between_the_tombstone_and_the_files_loses_the_old_queues(store_dir):
    """The broker dies after the tombstone is durable and before the topic's files go."""
    with open_store(store_dir) as s:
        put(s, "Orders", 40, "old")
        put(s, "Other", 10, "other")
        s.deleted.add("Orders", s.commitlog.max_offset)  # the first step of delete_topic alone
        s.crash()
    with open_store(store_dir) as s:
        assert bodies(s, "Orders") == []
        assert bodies(s, "Other") == names(10, "other")
        put(s, "Orders", 4, "new")
        assert bodies(s, "Orders") == names(4, "new")


def test_tombstones_go_with_the_last_segment_holding_the_topic(store_dir):
    with open_store(store_dir) as s:
        put(s, "Orders", 20, "old")
        s.delete_topic("Orders")
        below = s.deleted.below["Orders"]
        path = os.path.join(store_dir, L.CONFIG_DIR, L.DELETED_TOPICS_FILE)
        assert read_json(path)["deletedTopics"] == {"Orders": below}
        s.deleted.prune(below - 1)  # a segment before the tombstone still holds the topic
        assert s.deleted.below == {"Orders": below}
        s.deleted.prune(below)
        assert s.deleted.below == {}
        assert read_json(path)["deletedTopics"] == {}


def test_deleting_twice_hides_both_lives_of_the_topic(store_dir):
    with open_store(store_dir) as s:
        put(s, "Orders", 20, "first")
        s.delete_topic("Orders")
        put(s, "Orders", 20, "second")
        s.delete_topic("Orders")
        put(s, "Orders", 6, "third")
    with open_store(store_dir) as s:
        assert bodies(s, "Orders") == names(6, "third")


def test_a_sync_flush_store_dispatches_what_waits_before_the_delete(store_dir):
    with open_store(store_dir, flush="sync") as s:
        put(s, "Orders", 30, "old")
        s.delete_topic("Orders")
        put(s, "Orders", 3, "new")
        assert bodies(s, "Orders") == names(3, "new")
