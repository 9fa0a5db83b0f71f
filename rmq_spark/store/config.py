"""Topic configuration, persisted as RocketMQ's ``config/topics.json``.

:func:`topic_config_problem` is the one rule of a topic's entry: :meth:`TopicConfigManager.create`
(UPDATE_AND_CREATE_TOPIC, auto-creation, the services' topics) holds each config to it before
anything is changed, and the loader holds the file to it at start, so nothing a request can write
leaves the broker unable to start.  Creating many topics at once (a heartbeat naming many new
groups creates each one's retry topic) is one write of the file: :meth:`TopicConfigManager.create_many`.

Writes stay short as the table grows: each entry is kept encoded
(:class:`~rmq_spark.store.jsonfile.Encoded`), so a rewrite encodes only the new and changed entries
and joins the rest; and writes asked for close together share one (a group commit: whoever writes
takes every change made so far, and a caller whose change a finished write holds returns without
writing).  Every change is still durable before its call returns.  How many retry topics
heartbeats may create is bounded (:data:`RETRY_TOPICS_AUTO_MAX`, Apache's auto-created
subscription groups): see :meth:`TopicConfigManager.get_or_create_many`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rmq_spark.errors import ConfigError, MessageIllegalError
from rmq_spark.store import layout as L
from rmq_spark.store.jsonfile import Encoded, EncodedTable, JsonObject, write_json_atomic
from rmq_spark.store.validation import check_topic

__all__ = [
    "MAX_QUEUE_NUMS",
    "MESSAGE_TYPES",
    "PERM_MAX",
    "RETRY_TOPICS_AUTO_MAX",
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
# retry topics (one per consumer group: Apache's auto-created subscription groups) that consumers'
# heartbeats may create, broker-wide; past it a new group's is not created (an admin still can)
RETRY_TOPICS_AUTO_MAX = 10_000


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

    def to_json(self) -> dict[str, Any]:
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
    def from_json(cls, d: dict[str, Any] | JsonObject) -> TopicConfig:
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
        return (
            f"attributes.{MESSAGE_TYPE_ATTR}",
            f"{cfg.message_type!r} is not one of {', '.join(MESSAGE_TYPES)}",
        )
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
    def __init__(self, root: str, auto_create: bool = True, default_queue_nums: int = 4,
                 retry_topics_auto_max: int = RETRY_TOPICS_AUTO_MAX) -> None:  # fmt: skip
        self.path = os.path.join(root, L.CONFIG_DIR, L.TOPICS_FILE)
        self.auto_create = auto_create
        self.default_queue_nums = default_queue_nums
        self.retry_topics_auto_max = retry_topics_auto_max
        # queue counts of the system topics the services above the store write (one queue unless
        # a service registers more: the schedule topic has one per delay level)
        self.system_queue_nums: dict[str, int] = {}
        self._lock = threading.Lock()  # the table, its encoded entries and the change count
        self.topics: dict[str, TopicConfig] = {}
        self._encoded = EncodedTable()  # each topic's entry as the file holds it
        self._retry_topics = 0  # of self.topics
        self._retry_limit_logged = False
        self._version = 0
        # the group commit: changes made (under _lock), changes a finished write holds (under
        # _write_lock, which one writer holds at a time)
        self._write_lock = threading.Lock()
        self._changes = 0
        self._written = 0
        data = JsonObject.load(self.path)
        if data is not None:
            table = data.obj("topicConfigTable")
            for name in table.data:
                cfg = TopicConfig.from_json(table.obj(name))
                if cfg.topic_name != name:
                    raise table.obj(name).error(
                        "topicName", f"{cfg.topic_name!r} is not the entry's name {name!r}"
                    )
                try:
                    check_topic(name, allow_system=True)
                except MessageIllegalError as e:
                    raise table.error(name, str(e)) from None
                self._put(cfg)
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

    def get_or_create_many(self, topics: Iterable[str], *, skip_invalid: bool = False,
                           bounded: bool = False) -> dict[str, TopicConfig]:  # fmt: skip
        """:meth:`get_or_create` of each of ``topics`` with one write of the file for all those
        created (a heartbeat naming many new groups: their retry topics), durable on return.
        Every name is checked first: one that is refused (MessageIllegalError naming it;
        ConfigError when auto-creation is off) creates none of them -- or, with
        ``skip_invalid``, a name that is not a topic's is left out of the answer and the others
        are created.  With ``bounded`` (a heartbeat's), new retry topics are created only while
        the table holds fewer than ``retry_topics_auto_max``: those past it are left out of the
        answer (the first time, a warning is logged)."""
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
            limit = self.retry_topics_auto_max if bounded else None
            made = {c.topic_name: c for c in self.create_many(new, retry_max=limit)}
            for cfg in new:
                if cfg.topic_name in made:
                    out[cfg.topic_name] = made[cfg.topic_name]
                else:
                    del out[cfg.topic_name]
        return out

    def _new_config(self, topic: str) -> TopicConfig:
        """The config a topic is auto-created with (ConfigError when it may not be)."""
        check_topic(topic, allow_system=True)
        if L.is_system_topic(topic) or topic.startswith(
            (L.RETRY_GROUP_TOPIC_PREFIX, L.DLQ_GROUP_TOPIC_PREFIX)
        ):
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

    def create_many(
        self, cfgs: Iterable[TopicConfig], *, retry_max: int | None = None
    ) -> list[TopicConfig]:
        """Create or update each of ``cfgs`` (a later one of a name wins) with one write of the
        file for all of them, durable on return; each is held to :func:`check_topic_config`
        first, so one that is refused changes none.  Returns the configs now in force, in order.
        With ``retry_max``, a new retry topic that would make the table hold more is not created
        (nor returned)."""
        cfgs = list(cfgs)
        for cfg in cfgs:
            check_topic_config(cfg)
        encoded = [Encoded(cfg.topic_name, cfg.to_json()) for cfg in cfgs]  # outside the lock
        changed: list[tuple[TopicConfig, TopicConfig | None, Encoded | None]] = []
        refused = 0
        with self._lock:
            out = []
            for cfg, enc in zip(cfgs, encoded, strict=True):
                existing = self.topics.get(cfg.topic_name)
                if existing is not None and existing == cfg:
                    out.append(existing)
                    continue
                if (
                    existing is None
                    and retry_max is not None
                    and self._retry_topics >= retry_max
                    and cfg.topic_name.startswith(L.RETRY_GROUP_TOPIC_PREFIX)
                ):
                    refused += 1
                    continue
                changed.append((cfg, existing, self._encoded.get(cfg.topic_name)))
                self._put(cfg, enc)
                out.append(cfg)
            change = self._changes = self._changes + 1 if changed else self._changes
            first_refusal = refused and not self._retry_limit_logged
            self._retry_limit_logged = self._retry_limit_logged or bool(refused)
        if first_refusal:
            log.warning(
                "the topic table holds %d retry topics, the most consumers' heartbeats may create: "
                "new consumer groups' retry topics are not created (%d refused; logged once)",
                retry_max,
                refused,
            )
        if changed:
            self._commit(change, lambda: self._undo(changed))
        for cfg, existing, _ in changed[:_MANY_LOGGED]:
            log.info("topic %s %s: %d read / %d write queues, perm %d", cfg.topic_name, "updated" if existing else "created",
                     cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm)  # fmt: skip
        if len(changed) > _MANY_LOGGED:
            shown = ", ".join(c.topic_name for c, _, _ in changed[_MANY_LOGGED : _MANY_LOGGED + 5])
            more = len(changed) - _MANY_LOGGED
            log.info("%d more topics created or updated (%s ...)", more, shown)
        return out

    def delete(self, topic: str) -> None:
        check_topic(topic, allow_system=True)
        with self._lock:
            existing = self.topics.get(topic)
            if existing is None:
                return
            encoded = self._encoded[topic]
            self._drop(topic)
            self._changes += 1
            change = self._changes

        def undo() -> None:
            if topic not in self.topics:
                self._put(existing, encoded)

        self._commit(change, undo)
        log.info("topic %s deleted", topic)

    # --- the table and its file -----------------------------------------------------------------
    def _put(self, cfg: TopicConfig, encoded: Encoded | None = None) -> None:
        """(under _lock, or while loading) ``cfg`` in force, with its encoded entry."""
        name = cfg.topic_name
        if name not in self.topics and name.startswith(L.RETRY_GROUP_TOPIC_PREFIX):
            self._retry_topics += 1
        self.topics[name] = cfg
        self._encoded.put(encoded if encoded is not None else Encoded(name, cfg.to_json()))

    def _drop(self, name: str) -> None:
        if self.topics.pop(name, None) is not None and name.startswith(L.RETRY_GROUP_TOPIC_PREFIX):
            self._retry_topics -= 1
        self._encoded.pop(name, None)

    def _undo(self, changed: list[tuple[TopicConfig, TopicConfig | None, Encoded | None]]) -> None:
        """(under _lock) changes whose write failed: out of force, unless changed again since."""
        for cfg, existing, encoded in reversed(changed):
            if self.topics.get(cfg.topic_name) is not cfg:
                continue
            if existing is None:
                self._drop(cfg.topic_name)
            else:
                self._put(existing, encoded)

    def _commit(self, change: int, undo: Callable[[], None]) -> None:
        """Return once a write holding change number ``change`` is durable.  Writes are one at a
        time; a writer takes every change made so far, so callers that waited behind it find
        their change written and return at once.  A write that fails raises to its writer, after
        ``undo()`` (under both locks: no other write can take the change in between); changes of
        others it held are written by their own callers, which try again."""
        with self._write_lock:
            if self._written >= change:
                return
            with self._lock:
                upto = self._changes
                self._version += 1
                version = self._version
                table = EncodedTable(self._encoded)  # a snapshot: write_json_atomic sorts it
            try:
                write_json_atomic(
                    self.path,
                    {
                        "dataVersion": {
                            "counter": version,
                            "stateVersion": 0,
                            "timestamp": int(time.time() * 1000),
                        },
                        "topicConfigTable": table,
                    },
                )
            except BaseException:
                with self._lock:
                    undo()
                raise
            self._written = upto
