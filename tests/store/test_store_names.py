"""The store's boundary for names: every store method that builds a path or a config file entry
from a topic or group name refuses a name that is not a valid RocketMQ name (MessageIllegalError
naming it) and touches nothing, inside the store root or outside it; a valid name is served and
touches nothing outside the root.  Held as a property over every such method (hypothesis: any
text, and the names that hurt: ``..``, ``/``, ``""``, NUL, a final newline, long, unicode), with
an oracle written apart from the store's own check.  A topic delete once removed
``consumequeue/<topic>`` for any topic: ``../commitlog`` took the running store's CommitLog."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rmq_spark.errors import MessageIllegalError
from rmq_spark.store import layout as L
from rmq_spark.store.clock import FakeClock
from rmq_spark.store.config import TopicConfig
from rmq_spark.store.message import Message, tags_code
from rmq_spark.store.properties import encode_properties
from rmq_spark.store.store import MessageStore, StoreConfig

# CI: 40 examples a method, a fixed seed (a few seconds for all).  A longer hunt with fresh seeds:
# RMQ_FUZZ_EXAMPLES=2000 pytest tests/store/test_store_names.py
_HUNT = int(os.environ.get("RMQ_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_HUNT or 40, derandomize=not _HUNT, database=None, deadline=None, print_blob=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.filter_too_much])  # fmt: skip

KEEP = "Keep"  # a topic with messages and offsets every example must leave alone
SMALL = {"commitlog_segment_bytes": 64 * 1024, "cq_segment_units": 64}

# --- the oracle, written from RocketMQ's rules and not from the store's code -----------------------
_LEGAL = re.compile(r"[%|a-zA-Z0-9_-]+")


def valid_topic(name: Any) -> bool:
    if not isinstance(name, str) or _LEGAL.fullmatch(name) is None:
        return False
    return len(name) <= (255 if name.startswith(("%RETRY%", "%DLQ%")) else 127)


def valid_group(name: Any) -> bool:
    return isinstance(name, str) and _LEGAL.fullmatch(name) is not None and len(name) <= 120


HOSTILE = [
    "", ".", "..", "../commitlog", "../../outside", "..%", "%RETRY%..", "/", "/tmp/x", "a/b", "a\\b", "\x00",
    "a\x00b", "a\n", "\n", " a", "T ", "é", "Ω", "\ud800", "commitlog", "consumequeue", "config", "index",
    "lock", "abort", "-", "|", "%", "x" * 127, "x" * 128, "g" * 120, "g" * 121, "%RETRY%" + "r" * 248,
    "%RETRY%" + "r" * 249, "%DLQ%" + "d" * 250, "SCHEDULE_TOPIC_XXXX", "rmq_sys_x", "x" * 100_000, 7, None,
]  # fmt: skip
NAMES = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(max_size=40),
    st.text(alphabet="%|_-./\\\x00\nab", max_size=12),
    st.from_regex(r"[%|a-zA-Z0-9_-]{1,130}", fullmatch=True),
    st.text(min_size=100, max_size=300),
)


# --- the store and what it must leave as it was -----------------------------------------------------
def snapshot(top: str) -> dict[str, tuple[int, int]]:
    """Every directory and file below ``top``: (size, mtime in ns); a directory's size is 0."""
    out = {}
    for d, dirs, files in os.walk(top):
        for n in dirs + files:
            p = os.path.join(d, n)
            st_ = os.lstat(p)
            out[os.path.relpath(p, top)] = (0 if n in dirs else st_.st_size, st_.st_mtime_ns)
    return out


@pytest.fixture
def world(tmp_path):
    """A store (no background flush: nothing writes but the call) beside a directory outside it."""
    outside = tmp_path / "outside"
    (outside / "x").mkdir(parents=True)
    (outside / "x" / "precious").write_bytes(b"keep me")
    root = str(tmp_path / "store")
    s = MessageStore(root, StoreConfig(**SMALL), clock=FakeClock(), start_services=False)
    s.topics.create(TopicConfig(KEEP, 2, 2))
    for i in range(6):
        assert s.put_message(Message(KEEP, b"keep-%d" % i, {"TAGS": "t"}, queue_id=i % 2)).ok
    s.offsets.commit("G", KEEP, 0, 2, persist=True)
    s.flush_all()
    yield s, str(tmp_path), root
    if not s.closed:
        s.shutdown()


def _row(topic: Any) -> tuple:
    props = {"TAGS": "t", L.P_UNIQ_KEY: "7F0000010000000000000000000000AA"}
    return (
        topic,
        0,
        b"row",
        props,
        encode_properties(props),
        tags_code("t"),
        0,
        0,
        1000,
        "10.0.0.1",
        5,
        0,
        0,
    )


# each path-building method, with the kind of name it takes (the other names of a call are valid)
METHODS: dict[str, tuple[str, Callable[[MessageStore, Any], object]]] = {
    "delete_topic": ("topic", lambda s, n: s.delete_topic(n)),
    "consume_queue(create)": ("topic", lambda s, n: s.consume_queue(n, 0, create=True)),
    "put_message": ("topic", lambda s, n: s.put_message(Message(n, b"x"))),
    "put_bodies": ("topic", lambda s, n: s.put_bodies(n, 0, [b"x", b"y"])),
    "put_rows": ("topic", lambda s, n: s.put_rows([_row(n)])),
    "topics.create": ("topic", lambda s, n: s.topics.create(TopicConfig(n, 1, 1))),
    "topics.create_many": ("topic", lambda s, n: s.topics.create_many([TopicConfig("Also", 1, 1), TopicConfig(n, 1, 1)])),
    "topics.get_or_create": ("topic", lambda s, n: s.topics.get_or_create(n)),
    "topics.get_or_create_many": ("topic", lambda s, n: s.topics.get_or_create_many(["%RETRY%also", n])),
    "topics.delete": ("topic", lambda s, n: s.topics.delete(n)),
    "offsets.commit(topic)": ("topic", lambda s, n: s.offsets.commit("G", n, 0, 1, persist=True)),
    "offsets.commit(group)": ("group", lambda s, n: s.offsets.commit(n, KEEP, 0, 1, persist=True)),
    "offsets.commit_many(topic)": ("topic", lambda s, n: s.offsets.commit_many("G", {"Also": {0: 1}, n: {0: 1}})),
    "offsets.commit_many(group)": ("group", lambda s, n: s.offsets.commit_many(n, {KEEP: {0: 1}})),
    "offsets.remove_topic": ("topic", lambda s, n: s.offsets.remove_topic(n)),
    "offsets.remove_group": ("group", lambda s, n: s.offsets.remove_group(n)),
    "deleted.add": ("topic", lambda s, n: s.deleted.add(n, 0)),
}  # fmt: skip


def _state(s: MessageStore) -> tuple:
    return (dict(s.topics.topics), {g: {t: s.offsets.query_topic(g, t) for t in s.topics.topics} for g in s.offsets.groups()},
            dict(s.deleted.below), sorted(s.queue_keys()))  # fmt: skip


def _names(name: Any, text: str) -> bool:
    """The refusal names the name (a long one by its start), or says what it is instead."""
    if not isinstance(name, str):
        return "must be a string" in text
    if not name:
        return "is empty" in text
    # repr quotes the prefix as it quotes the whole name: with both quote characters in it, in
    # single quotes with "'" escaped
    natural = repr(name[:15])[1:-1]
    both = repr(name[:15] + "'\"")[1:-4]
    return natural in text or both in text


@pytest.mark.parametrize("method", list(METHODS))
@FUZZ
@given(name=NAMES)
def test_a_name_reaches_the_file_system_only_if_it_is_valid(world, method, name):
    s, top, _root = world
    kind, call = METHODS[method]
    assume(name != KEEP and name != "G")
    valid = valid_topic(name) if kind == "topic" else valid_group(name)
    outside_before = {k: v for k, v in snapshot(top).items() if not k.startswith("store")}
    before, state = snapshot(top), _state(s)
    if valid:
        call(s, name)
    else:
        with pytest.raises(MessageIllegalError) as refused:
            call(s, name)
        assert _names(name, str(refused.value)), str(refused.value)
        assert snapshot(top) == before, "a refused name changed files"
        assert _state(s) == state, "a refused name changed the store's tables"
    assert {k: v for k, v in snapshot(top).items() if not k.startswith("store")} == outside_before
    got = [m.body for q in (0, 1) for m in s.get_messages(KEEP, q, 0).messages]
    assert sorted(got) == [b"keep-%d" % i for i in range(6)]


def test_the_store_starts_again_after_every_refusal_and_keeps_everything(world):
    s, _top, root = world
    for name in HOSTILE:
        if valid_topic(name):
            continue
        for kind, call in METHODS.values():
            if kind == "topic":
                with pytest.raises(MessageIllegalError):
                    call(s, name)
    s.shutdown()
    with MessageStore(root, StoreConfig(**SMALL), clock=FakeClock(), start_services=False) as again:
        got = [m.body for q in (0, 1) for m in again.get_messages(KEEP, q, 0).messages]
        assert sorted(got) == [b"keep-%d" % i for i in range(6)]
        assert again.offsets.query("G", KEEP, 0) == 2
        assert sorted(again.topics.topics) == [KEEP]


def test_a_delete_of_a_path_is_refused_before_anything_goes(world):
    """The cases of the issue, by name: the CommitLog, a directory outside, every ConsumeQueue."""
    s, top, root = world
    victim = os.path.join(top, "outside", "x")
    for name in ("../commitlog", "..", victim, "", "/", "consumequeue/..", "Keep/../.."):
        with pytest.raises(MessageIllegalError, match="topic"):
            s.delete_topic(name)
    assert os.path.isdir(os.path.join(root, L.COMMITLOG_DIR)) and os.listdir(
        os.path.join(root, L.COMMITLOG_DIR)
    )
    assert os.path.isdir(os.path.join(root, L.CONSUMEQUEUE_DIR, KEEP, "0"))
    assert os.path.exists(os.path.join(victim, "precious"))
    assert s.deleted.below == {}  # no tombstone for a name either


def test_old_files_holding_names_no_request_can_give_still_load(tmp_path):
    """An older version wrote tombstones for ``""`` and ``../commitlog`` and offsets for groups
    like ``../../x``: the store starts, drops those entries (each logged) and keeps the rest."""
    root = str(tmp_path / "store")
    with MessageStore(root, StoreConfig(**SMALL), clock=FakeClock(), start_services=False) as s:
        assert s.put_message(Message(KEEP, b"k")).ok
        s.offsets.commit("G", KEEP, 0, 1, persist=True)
    cfg = os.path.join(root, L.CONFIG_DIR)
    for name, doc in (
        (L.DELETED_TOPICS_FILE, {"deletedTopics": {"": 10, "../commitlog": 10, "Gone": 3}}),
        (L.CONSUMER_OFFSET_FILE, {"offsetTable": {f"{KEEP}@G": {"0": 1}, f"{KEEP}@../../x": {"0": 4},
                                                  f"{KEEP}@g\x00": {"0": 4}, f"{KEEP}@" + "g" * 5000: {"0": 4}}}),
    ):  # fmt: skip
        for path in (os.path.join(cfg, name), os.path.join(cfg, name + ".bak")):
            with open(path, "w", encoding="utf-8") as f:
                json.dump(doc, f)
    with MessageStore(root, StoreConfig(**SMALL), clock=FakeClock(), start_services=False) as s:
        assert s.deleted.below == {"Gone": 3}
        assert s.offsets.groups() == ["G"] and s.offsets.query("G", KEEP, 0) == 1
        assert [m.body for m in s.get_messages(KEEP, 0, 0).messages] == [b"k"]


def test_stray_directories_in_the_consume_queue_directory_are_left_alone(tmp_path):
    root = str(tmp_path / "store")
    with MessageStore(root, StoreConfig(**SMALL), clock=FakeClock(), start_services=False) as s:
        assert s.put_message(Message(KEEP, b"k")).ok
    base = os.path.join(root, L.CONSUMEQUEUE_DIR)
    os.makedirs(os.path.join(base, "lost+found", "0"))
    with open(os.path.join(base, "notes.txt"), "w") as f:
        f.write("an operator's file")
    os.makedirs(os.path.join(base, KEEP, "\u0661"))  # a digit, but not an ASCII one
    with MessageStore(root, StoreConfig(**SMALL), clock=FakeClock(), start_services=False) as s:
        assert s.queue_keys() == [(KEEP, 0)]
        assert [m.body for m in s.get_messages(KEEP, 0, 0).messages] == [b"k"]
    assert os.path.isdir(os.path.join(base, "lost+found", "0")) and os.path.exists(
        os.path.join(base, "notes.txt")
    )
