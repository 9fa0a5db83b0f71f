"""Topic configuration, persisted as RocketMQ's ``config/topics.json``.

:func:`topic_config_problem` is the one rule of a topic's entry: :meth:`TopicConfigManager.create`
(UPDATE_AND_CREATE_TOPIC, auto-creation, the services' topics) holds each config to it before
anything is changed, and the loader holds the file to it at start, so nothing a request can write
leaves the broker unable to start.  Creating many topics at once (a heartbeat naming many new
groups creates each one's retry topic) is one write of the file: :meth:`TopicConfigManager.create_many`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from rmq_spark.errors import ConfigError, MessageIllegalError
from rmq_spark.store import layout as L
from rmq_spark.store.jsonfile import JsonObject, write_json_atomic
from rmq_spark.store.validation import check_topic

__all__ = [
    "MAX_QUEUE_NUMS",
    "MESSAGE_TYPES",
    "PERM_MAX",
    "TopicConfig",
    "TopicConfigManager",
    "check_topic_config",
    "topic_config_problem",
]

log = logging.getLogger("rmq_spark.store")

MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
MAX_QUEUE_NUMS = L.QUEUE_NUMS_MAX
PERM_MAX = L.PERM_PRIORITY | L.PERM_READ | L.PERM_WRITE | L.PERM_INHERIT  # PermName's bits: 0 to 15
MESSAGE_TYPE_ATTR = "+message.type"
_MANY_LOGGED = 10  # create_many: a line per topic up to this many, then one line for all


@dataclass
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = L.PERM_READ | L.PERM_WRITE
    message_type: str = "MIXED"
    order: bool = False
    attributes: dict[str, str] = field(default_factory=dict)

    def accepts(self, message_type: str) -> bool:
        return self.message_type == "MIXED" or self.message_type == message_type

    @property
    def readable(self) -> bool:
        return bool(self.perm & L.PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & L.PERM_WRITE)

    def to_json(self) -> dict:
        attrs = dict(self.attributes)
        attrs[MESSAGE_TYPE_ATTR] = self.message_type
        return {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": self.order,
            "attributes": attrs,
        }

    @classmethod
    def from_json(cls, d: dict | JsonObject) -> TopicConfig:
        """A topic's entry of ``topics.json``: each value's type checked by the getters, then the
        whole entry held to :func:`topic_config_problem` (ConfigError naming the key)."""
        o = d if isinstance(d, JsonObject) else JsonObject("topics.json", d)
        attrs = o.str_map("attributes")
        mtype = attrs.pop(MESSAGE_TYPE_ATTR, attrs.pop("message.type", "MIXED")).upper()
        if "topicName" not in o:
            raise o.error("topicName", "is missing")
        cfg = cls(
            topic_name=o.str("topicName", ""),
            read_queue_nums=o.int("readQueueNums", 4),
            write_queue_nums=o.int("writeQueueNums", 4),
            perm=o.int("perm", 6),
            message_type=mtype,
            order=o.bool("order", False),
            attributes=attrs,
        )
        problem = topic_config_problem(cfg, check_name=False)  # the loader checks the entry's name
        if problem is not None:
            raise o.error(*problem)
        return cfg


def _int_problem(value: object, lo: int, hi: int) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{value!r} is not an integer"
    if not lo <= value <= hi:
        return f"{value} is not between {lo} and {hi}"
    return None


def topic_config_problem(cfg: TopicConfig, check_name: bool = True) -> tuple[str, str] | None:
    """What is wrong with ``cfg`` as (its key in topics.json, the problem), or None: the name
    (any valid one: system, retry and dead-letter topics too), 1 to MAX_QUEUE_NUMS read and
    write queues, a perm of PermName's bits (0 to 15), a known message type, a boolean order and
    string attributes.  The one rule of a topic's entry, for writes and for the loader alike."""
    if check_name:
        try:
            check_topic(cfg.topic_name, allow_system=True)
        except MessageIllegalError as e:
            return "topicName", str(e)
    for key, value, lo, hi in (
        ("readQueueNums", cfg.read_queue_nums, 1, MAX_QUEUE_NUMS),
        ("writeQueueNums", cfg.write_queue_nums, 1, MAX_QUEUE_NUMS),
        ("perm", cfg.perm, 0, PERM_MAX),
    ):
        problem = _int_problem(value, lo, hi)
        if problem is not None:
            return key, problem
    if cfg.message_type not in MESSAGE_TYPES:
        return f"attributes.{MESSAGE_TYPE_ATTR}", f"{cfg.message_type!r} is not one of {', '.join(MESSAGE_TYPES)}"
    if not isinstance(cfg.order, bool):
        return "order", f"{cfg.order!r} is not a boolean"
    if not isinstance(cfg.attributes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in cfg.attributes.items()
    ):
        return "attributes", "must map strings to strings"
    return None


def check_topic_config(cfg: TopicConfig) -> None:
    """:func:`topic_config_problem` as an exception: MessageIllegalError for the name (naming
    it), ConfigError naming the topic and the field for a value."""
    problem = topic_config_problem(cfg)
    if problem is None:
        return
    key, text = problem
    if key == "topicName":
        raise MessageIllegalError(text)
    raise ConfigError(f"topic {cfg.topic_name!r}: {key} {text}")


class TopicConfigManager:
    def __init__(self, root: str, auto_create: bool = True, default_queue_nums: int = 4) -> None:
        self.path = os.path.join(root, L.CONFIG_DIR, L.TOPICS_FILE)
        self.auto_create = auto_create
        self.default_queue_nums = default_queue_nums
        # queue counts of the system topics the services above the store write (one queue unless
        # a service registers more: the schedule topic has one per delay level)
        self.system_queue_nums: dict[str, int] = {}
        self._lock = threading.Lock()
        self.topics: dict[str, TopicConfig] = {}
        self._version = 0
        data = JsonObject.load(self.path)
        if data is not None:
            table = data.obj("topicConfigTable")
            for name in table.data:
                cfg = TopicConfig.from_json(table.obj(name))
                if cfg.topic_name != name:
                    raise table.obj(name).error("topicName", f"{cfg.topic_name!r} is not the entry's name {name!r}")
                try:
                    check_topic(name, allow_system=True)
                except MessageIllegalError as e:
                    raise table.error(name, str(e)) from None
                self.topics[name] = cfg
            self._version = data.obj("dataVersion").int("counter", 0, 0)

    def register_system_topic(self, topic: str, queue_nums: int) -> None:
        """A system topic a service writes, created with ``queue_nums`` queues when first used."""
        self.system_queue_nums[topic] = queue_nums

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def get_or_create(self, topic: str) -> TopicConfig:
        """The topic's config, auto-creating it when allowed; ConfigError when not."""
        cfg = self.topics.get(topic)
        if cfg is not None:
            return cfg
        return self.create(self._new_config(topic), system=True)

    def get_or_create_many(self, topics: Iterable[str], *, skip_invalid: bool = False) -> dict[str, TopicConfig]:
        """:meth:`get_or_create` of each of ``topics`` with one write of the file for all those
        created (a heartbeat naming many new groups: their retry topics), durable on return.
        Every name is checked first: one that is refused (MessageIllegalError naming it;
        ConfigError when auto-creation is off) creates none of them -- or, with
        ``skip_invalid``, a name that is not a topic's is left out of the answer and the others
        are created."""
        out: dict[str, TopicConfig] = {}
        new: list[TopicConfig] = []
        for topic in topics:
            if topic.__class__ is str and topic in out:
                continue
            cfg = self.topics.get(topic) if topic.__class__ is str else None
            if cfg is None:
                try:
                    cfg = self._new_config(topic)
                except MessageIllegalError:
                    if skip_invalid:
                        continue
                    raise
                new.append(cfg)
            out[topic] = cfg
        if new:
            for cfg in self.create_many(new):
                out[cfg.topic_name] = cfg
        return out

    def _new_config(self, topic: str) -> TopicConfig:
        """The config a topic is auto-created with (ConfigError when it may not be)."""
        check_topic(topic, allow_system=True)
        if L.is_system_topic(topic) or topic.startswith((L.RETRY_GROUP_TOPIC_PREFIX, L.DLQ_GROUP_TOPIC_PREFIX)):
            n = self.system_queue_nums.get(topic, 1)
            return TopicConfig(topic, n, n)
        if not self.auto_create:
            raise ConfigError(f"topic {topic!r} does not exist and auto-creation is off")
        n = self.default_queue_nums
        return TopicConfig(topic, n, n)

    def create(self, cfg: TopicConfig, system: bool = False) -> TopicConfig:
        """Create or update ``cfg``'s topic (durable on return), held to :func:`check_topic_config`
        first: MessageIllegalError naming a name that is not a topic's, ConfigError naming a value.
        Which topics a request may create (not the system ones) is the caller's rule."""
        return self.create_many([cfg])[0]

    def create_many(self, cfgs: Iterable[TopicConfig]) -> list[TopicConfig]:
        """Create or update each of ``cfgs`` (a later one of a name wins) with one write of the
        file for all of them, durable on return; each is held to :func:`check_topic_config`
        first, so one that is refused changes none.  Returns the configs now in force, in order."""
        cfgs = list(cfgs)
        for cfg in cfgs:
            check_topic_config(cfg)
        changed: list[tuple[TopicConfig, TopicConfig | None]] = []
        with self._lock:
            out = []
            for cfg in cfgs:
                existing = self.topics.get(cfg.topic_name)
                if existing is not None and existing == cfg:
                    out.append(existing)
                    continue
                self.topics[cfg.topic_name] = cfg
                changed.append((cfg, existing))
                out.append(cfg)
            if changed:
                try:
                    self._persist()
                except BaseException:
                    for cfg, existing in reversed(changed):  # not durable: not in force either
                        if existing is None:
                            self.topics.pop(cfg.topic_name, None)
                        else:
                            self.topics[cfg.topic_name] = existing
                    raise
        for cfg, existing in changed[:_MANY_LOGGED]:
            log.info("topic %s %s: %d read / %d write queues, perm %d", cfg.topic_name, "updated" if existing else "created",
                     cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm)  # fmt: skip
        if len(changed) > _MANY_LOGGED:
            log.info("%d more topics created or updated (%s ...)", len(changed) - _MANY_LOGGED,
                     ", ".join(c.topic_name for c, _ in changed[_MANY_LOGGED : _MANY_LOGGED + 5]))  # fmt: skip
        return out

    def delete(self, topic: str) -> None:
        check_topic(topic, allow_system=True)
        with self._lock:
            if self.topics.pop(topic, None) is not None:
                self._persist()
                log.info("topic %s deleted", topic)

    def _persist(self) -> None:
        self._version += 1
        write_json_atomic(
            self.path,
            {
                "dataVersion": {
                    "counter": self._version,
                    "stateVersion": 0,
                    "timestamp": int(time.time() * 1000),
                },
                "topicConfigTable": {k: v.to_json() for k, v in sorted(self.topics.items())},
            },
        )
