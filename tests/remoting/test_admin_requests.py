"""Admin requests over the remoting port (what mqadmin and rmq-admin send) that once destroyed data
or left the broker unable to start, each refused with a clear answer naming the problem, the store
left as it was, and the broker starting again on it with every message and offset:

- DELETE_TOPIC_IN_BROKER with a topic that is a path (``../commitlog``, a directory outside the
  store, ``""``): it removed ``consumequeue/<topic>``, so the CommitLog, any directory, or every
  ConsumeQueue;
- UPDATE_CONSUMER_OFFSET with ``queueId=-1`` or ``commitOffset=-5``, the connector's CommitOffsets
  with the same, UPDATE_AND_CREATE_TOPIC with ``perm=16`` or ``-1`` or absurd queue counts: written
  to the file, then refused by the loader at the next start;
- UPDATE_AND_CREATE_TOPIC of a system topic (``SCHEDULE_TOPIC_XXXX`` with one queue broke every
  delayed send of level 2 and up): RocketMQ's "conflict with system topic", as ``rmq-admin`` shows;
- INVOKE_BROKER_TO_RESET_OFFSET with ``offset=abc`` (once Python's "invalid literal"), a queue id
  out of range, or names that are not a group's or a topic's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rmq_spark.admin.__main__ import main as admin_main
from rmq_spark.broker.connector.client import InternalClient
from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.errors import RmqError
from rmq_spark.remoting.client import RemotingClient
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.remoting.headers import HeaderError
from rmq_spark.store import layout as L
from rmq_spark.store.config import TopicConfig
from rmq_spark.store.message import Message

TOPIC, GROUP = "Orders", "billing"
BODIES = [b"order-%d" % i for i in range(8)]


def _options() -> BrokerOptions:
    return BrokerOptions(listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen=None)


class World:
    """A broker on a store holding messages and a committed offset, and a directory outside it."""

    def __init__(self, tmp: Path) -> None:
        self.root = str(tmp / "store")
        self.victim = tmp / "outside" / "x"
        self.victim.mkdir(parents=True)
        (self.victim / "precious").write_bytes(b"keep me")
        self.broker = Broker(self.root, options=_options())
        store = self.broker.store
        store.topics.create(TopicConfig(TOPIC, 2, 2))
        assert store.put_messages(
            [Message(TOPIC, b, queue_id=i % 2) for i, b in enumerate(BODIES)]
        ).ok
        store.offsets.commit(GROUP, TOPIC, 0, 2, persist=True)
        store.flush_all()

    def ask(self, code: int, fields: dict[str, str]) -> RemotingCommand:
        assert self.broker.remoting_endpoint is not None
        with RemotingClient(self.broker.remoting_endpoint) as c:
            return c.request(RemotingCommand(code, fields, b"", version=409))

    def config_files(self) -> dict[str, bytes]:
        """The two files the requests here write (and the loader once refused), and their copies."""
        d = Path(self.root, L.CONFIG_DIR)
        names = [n + s for n in (L.TOPICS_FILE, L.CONSUMER_OFFSET_FILE) for s in ("", ".bak")]
        return {n: (d / n).read_bytes() for n in names if (d / n).exists()}

    def assert_intact(self) -> None:
        """Every message, the offset, the topic's queues, the directory outside."""
        store = self.broker.store
        got = [
            m.body for q in (0, 1) for m in store.get_messages(TOPIC, q, 0, max_msgs=100).messages
        ]
        assert sorted(got) == sorted(BODIES)
        assert store.offsets.query(GROUP, TOPIC, 0) == 2
        assert store.topics.get(TOPIC) == TopicConfig(TOPIC, 2, 2)
        assert os.listdir(os.path.join(self.root, L.COMMITLOG_DIR))
        assert (self.victim / "precious").read_bytes() == b"keep me"

    def restart(self) -> None:
        self.broker.stop()
        self.broker = Broker(self.root, options=_options())


@pytest.fixture
def world(tmp_path) -> Iterator[World]:
    w = World(tmp_path)
    try:
        yield w
    finally:
        w.broker.stop()


def _names(value: str, remark: str) -> bool:
    """The answer names the value (or says it is empty or missing)."""
    return repr(value[:20])[1:-1] in remark if value else ("empty" in remark or "missing" in remark)


# --- DELETE_TOPIC_IN_BROKER ---------------------------------------------------------------------------------
def test_a_delete_of_a_path_is_refused_and_the_data_stays(world):
    for topic in (
        "../commitlog",
        str(world.victim),
        "/tmp/x",
        "",
        "..",
        "/",
        f"{TOPIC}/../..",
        "a\n",
    ):
        before = world.config_files()
        r = world.ask(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})
        assert r.code == ResponseCode.SYSTEM_ERROR, (topic, r.remark)
        assert "topic" in r.remark and _names(topic, r.remark), r.remark
        assert world.config_files() == before, topic
        world.assert_intact()
    # sends are still stored, and everything is there after a restart
    assert world.broker.store.put_message(Message(TOPIC, b"after")).ok
    world.restart()
    got = [
        m.body
        for q in (0, 1)
        for m in world.broker.store.get_messages(TOPIC, q, 0, max_msgs=100).messages
    ]
    assert sorted(got) == sorted([*BODIES, b"after"])


def test_a_valid_delete_still_deletes(world):
    world.broker.store.topics.create(TopicConfig("Scratch", 1, 1))
    assert world.broker.store.put_message(Message("Scratch", b"s")).ok
    r = world.ask(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Scratch"})
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert world.broker.store.topics.get("Scratch") is None
    assert not os.path.exists(os.path.join(world.root, L.CONSUMEQUEUE_DIR, "Scratch"))
    world.assert_intact()


# --- requests whose values the loader refused: refused at the store's API, the broker starts again --------------
def _update_offset(queue_id: str, offset: str) -> Callable[[World], None]:
    def run(w: World) -> None:
        r = w.ask(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": queue_id,
                                                       "commitOffset": offset})  # fmt: skip
        assert r.code == ResponseCode.SYSTEM_ERROR, r.remark
        field, value = ("queueId", queue_id) if queue_id != "0" else ("commitOffset", offset)
        assert field in r.remark and value in r.remark and "Error" not in r.remark, r.remark

    return run


def _commit_offsets(queue_id: str, offset: int) -> Callable[[World], None]:
    def run(w: World) -> None:
        with InternalClient(w.broker.endpoints) as c, pytest.raises(RmqError) as refused:
            c.commit_offsets(GROUP, {TOPIC: {queue_id: offset}})
        field, value = ("queueId", queue_id) if queue_id != "0" else ("commitOffset", str(offset))
        assert field in str(refused.value) and value in str(refused.value), str(refused.value)

    return run


def _update_topic(name: str, **fields: str) -> Callable[[World], None]:
    def run(w: World) -> None:
        ext = {"topic": name, "readQueueNums": "4", "writeQueueNums": "4", "perm": "6", **fields}
        r = w.ask(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
        assert r.code == ResponseCode.SYSTEM_ERROR, r.remark
        key, value = next(iter(fields.items()))
        assert key in r.remark and value in r.remark and "Error" not in r.remark, r.remark
        assert w.broker.store.topics.get(name) in (None, TopicConfig(TOPIC, 2, 2))

    return run


BAD_WRITES = {
    "UPDATE_CONSUMER_OFFSET queueId=-1": _update_offset("-1", "5"),
    "UPDATE_CONSUMER_OFFSET commitOffset=-5": _update_offset("0", "-5"),
    "UPDATE_CONSUMER_OFFSET queueId=1024": _update_offset("1024", "0"),
    "CommitOffsets queueId=-1": _commit_offsets("-1", 5),
    "CommitOffsets commitOffset=-5": _commit_offsets("0", -5),
    "UPDATE_AND_CREATE_TOPIC perm=16": _update_topic("New", perm="16"),
    "UPDATE_AND_CREATE_TOPIC perm=-1": _update_topic("New", perm="-1"),
    "UPDATE_AND_CREATE_TOPIC existing perm=16": _update_topic(TOPIC, perm="16"),
    "UPDATE_AND_CREATE_TOPIC readQueueNums=0": _update_topic("New", readQueueNums="0"),
    "UPDATE_AND_CREATE_TOPIC writeQueueNums=2147483647": _update_topic(
        "New", writeQueueNums="2147483647"
    ),
    "UPDATE_AND_CREATE_TOPIC readQueueNums=100000": _update_topic("New", readQueueNums="100000"),
}


@pytest.mark.parametrize("case", list(BAD_WRITES))
def test_what_the_loader_refuses_is_refused_over_the_wire_and_the_broker_restarts(world, case):
    before = world.config_files()
    BAD_WRITES[case](world)
    assert world.config_files() == before
    world.restart()
    world.assert_intact()
    assert world.config_files() == before


# --- system topics ----------------------------------------------------------------------------------------------
SYSTEM = [L.SCHEDULE_TOPIC, L.TRANS_HALF_TOPIC, L.TRANS_OP_HALF_TOPIC, L.TRANS_CHECK_MAX_TIME_TOPIC, "SELF_TEST_TOPIC",
          "OFFSET_MOVED_EVENT", L.TIMER_TOPIC, "rmq_sys_anything", "TBW102", "BenchmarkTest", "RMQ_SYS_TRACE_TOPIC"]  # fmt: skip


@pytest.mark.parametrize("topic", SYSTEM)
def test_a_system_topic_is_neither_created_nor_reconfigured_nor_deleted(world, topic):
    store = world.broker.store
    before = store.topics.get(topic)
    for code in (RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.DELETE_TOPIC_IN_BROKER):
        r = world.ask(
            code, {"topic": topic, "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"}
        )
        assert (r.code, r.remark) == (
            ResponseCode.SYSTEM_ERROR,
            f"The topic[{topic}] is conflict with system topic.",
        )
    assert store.topics.get(topic) == before


def test_the_schedule_topic_keeps_its_queues(world):
    """The case of the issue: SCHEDULE_TOPIC_XXXX with one queue broke delays of level 2 and up."""
    store = world.broker.store
    cfg = store.topics.get_or_create(L.SCHEDULE_TOPIC)
    r = world.ask(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": L.SCHEDULE_TOPIC, "readQueueNums": "1",
                                                        "writeQueueNums": "1", "perm": "6"})  # fmt: skip
    assert r.code == ResponseCode.SYSTEM_ERROR
    world.restart()
    assert world.broker.store.topics.get(L.SCHEDULE_TOPIC) == cfg and cfg.write_queue_nums > 1


@pytest.mark.parametrize(
    "topic", [f"{L.RETRY_GROUP_TOPIC_PREFIX}{GROUP}", f"{L.DLQ_GROUP_TOPIC_PREFIX}{GROUP}"]
)
def test_retry_and_dead_letter_topics_stay_allowed(world, topic):
    r = world.ask(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": topic, "readQueueNums": "1", "writeQueueNums": "1",
                                                        "perm": "6"})  # fmt: skip
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert world.broker.store.topics.get(topic) == TopicConfig(topic, 1, 1)
    assert (
        world.ask(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic}).code == ResponseCode.SUCCESS
    )
    assert world.broker.store.topics.get(topic) is None


def test_rmq_admin_cannot_create_a_system_topic(world, capsys):
    code = admin_main(
        ["-b", world.broker.remoting_endpoint, "topics", "create", L.TRANS_HALF_TOPIC]
    )
    err = capsys.readouterr().err
    assert code == 1 and f"The topic[{L.TRANS_HALF_TOPIC}] is conflict with system topic." in err, (
        err
    )
    assert "Traceback" not in err
    assert world.broker.store.topics.get(L.TRANS_HALF_TOPIC) is None


# --- INVOKE_BROKER_TO_RESET_OFFSET -----------------------------------------------------------------------------
def _reset(**fields: str) -> dict[str, str]:
    return {"topic": TOPIC, "group": GROUP, "timestamp": "-1", "isForce": "true", **fields}


@pytest.mark.parametrize("fields, field, value", [
    (_reset(queueId="0", offset="abc"), "offset", "abc"),
    (_reset(queueId="0", offset="9" * 30), "offset", "9" * 30),
    (_reset(queueId="x"), "queueId", "x"),
    (_reset(queueId="2"), "queueId", "2"),
    (_reset(queueId="-2"), "queueId", "-2"),
    (_reset(queueId="65535"), "queueId", "65535"),
    (_reset(timestamp="soon"), "timestamp", "soon"),
    (_reset(group="../../x"), "group", "../../x"),
    (_reset(group=""), "group", ""),
    (_reset(group="g" * 121), "group", "g" * 20),
    (_reset(topic="../commitlog"), "topic", "../commitlog"),
    (_reset(topic="/tmp/x"), "topic", "/tmp/x"),
])  # fmt: skip
def test_a_reset_with_a_bad_field_names_it_and_changes_nothing(world, fields, field, value):
    before = world.config_files()
    r = world.ask(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields)
    assert r.code == ResponseCode.SYSTEM_ERROR and field in r.remark and _names(value, r.remark), (
        r.remark
    )
    assert "invalid literal" not in r.remark and "Error" not in r.remark
    assert world.config_files() == before
    world.assert_intact()


def _direct(world: World, handler: str, fields: dict[str, str]) -> RemotingCommand:
    """The admin handler's own answer, whatever the request table in front of it checks first
    (a HeaderError is answered SYSTEM_ERROR with its text, as the server answers it)."""
    req = RemotingCommand(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields, b"", version=409)
    try:
        return getattr(world.broker.remoting.admin, handler)(None, req)
    except HeaderError as e:
        return req.response(ResponseCode.SYSTEM_ERROR, str(e))


HANDLER_CASES = [
    ("reset_offset", _reset(queueId="0", offset="abc"), "offset", "abc"),
    ("reset_offset", _reset(queueId="0", offset="1e3"), "offset", "1e3"),
    ("reset_offset", _reset(queueId="x"), "queueId", "x"),
    ("reset_offset", _reset(queueId="2"), "queueId", "2"),
    ("reset_offset", _reset(queueId="-2"), "queueId", "-2"),
    ("reset_offset", _reset(group="../../x"), "group", "../../x"),
    ("reset_offset", _reset(group=""), "group", ""),
    ("reset_offset", _reset(group="g\x00"), "group", "g\x00"),
    ("reset_offset", _reset(topic="../commitlog"), "topic", "../commitlog"),
    ("reset_offset", _reset(topic=""), "topic", ""),
    ("delete_topic", {"topic": "../commitlog"}, "topic", "../commitlog"),
    ("delete_topic", {"topic": ""}, "topic", ""),
    ("update_topic", {"topic": "/tmp/x", "readQueueNums": "1", "writeQueueNums": "1"}, "topic", "/tmp/x"),
    ("update_topic", {"topic": "New", "readQueueNums": "1", "writeQueueNums": "1", "perm": "16"}, "perm", "16"),
    ("update_topic", {"topic": "New", "readQueueNums": "0", "writeQueueNums": "1"}, "readQueueNums", "0"),
    ("update_topic", {"topic": "New", "readQueueNums": "1", "writeQueueNums": "5000"}, "writeQueueNums", "5000"),
]  # fmt: skip


@pytest.mark.parametrize("handler, fields, field, value", HANDLER_CASES)
def test_the_admin_handlers_check_their_fields_themselves(world, handler, fields, field, value):
    before = world.config_files()
    r = _direct(world, handler, fields)
    assert r.code == ResponseCode.SYSTEM_ERROR and field in r.remark and _names(value, r.remark), (
        r.remark
    )
    assert "invalid literal" not in r.remark and "Error:" not in r.remark
    assert world.config_files() == before
    world.assert_intact()


def test_a_reset_of_one_queue_to_an_offset_still_works(world):
    r = world.ask(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, _reset(queueId="1", offset="3"))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert world.broker.store.offsets.query(GROUP, TOPIC, 1) == 3
    world.restart()
    assert world.broker.store.offsets.query(GROUP, TOPIC, 1) == 3
