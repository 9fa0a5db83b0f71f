"""Topic configuration, persisted as RocketMQ's ``config/topics.json``."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

from rmq_spark.errors import ConfigError, MessageIllegalError
from rmq_spark.store import layout as L
from rmq_spark.store.jsonfile import JsonObject, write_json_atomic
from rmq_spark.store.validation import check_topic

log = logging.getLogger("rmq_spark.store")

MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
MAX_QUEUE_NUMS = 1024
MESSAGE_TYPE_ATTR = "+message.type"


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
        """A topic's entry of ``topics.json`` (each value checked: ConfigError names the key)."""
        o = d if isinstance(d, JsonObject) else JsonObject("topics.json", d)
        attrs = o.str_map("attributes")
        mtype = attrs.pop(MESSAGE_TYPE_ATTR, attrs.pop("message.type", "MIXED")).upper()
        if mtype not in MESSAGE_TYPES:
            raise o.obj("attributes").error(MESSAGE_TYPE_ATTR, f"{mtype!r} is not one of {', '.join(MESSAGE_TYPES)}")
        if "topicName" not in o:
            raise o.error("topicName", "is missing")
        return cls(
            topic_name=o.str("topicName", ""),
            read_queue_nums=o.int("readQueueNums", 4, 1, MAX_QUEUE_NUMS),
            write_queue_nums=o.int("writeQueueNums", 4, 1, MAX_QUEUE_NUMS),
            perm=o.int("perm", 6, 0, 15),
            message_type=mtype,
            order=o.bool("order", False),
            attributes=attrs,
        )




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
            for name, _d in table.items():
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
        if L.is_system_topic(topic) or topic.startswith((L.RETRY_GROUP_TOPIC_PREFIX, L.DLQ_GROUP_TOPIC_PREFIX)):
            n = self.system_queue_nums.get(topic, 1)
            return self.create(TopicConfig(topic, n, n), system=True)
        if not self.auto_create:
            raise ConfigError(f"topic {topic!r} does not exist and auto-creation is off")
        n = self.default_queue_nums
        return self.create(TopicConfig(topic, n, n))

    def create(self, cfg: TopicConfig, system: bool = False) -> TopicConfig:
        check_topic(cfg.topic_name, allow_system=system or L.is_system_topic(cfg.topic_name))
        if cfg.message_type not in MESSAGE_TYPES:
            raise ConfigError(f"message type {cfg.message_type!r} is not one of {MESSAGE_TYPES}")
        if not (1 <= cfg.write_queue_nums <= MAX_QUEUE_NUMS and 1 <= cfg.read_queue_nums <= MAX_QUEUE_NUMS):
            raise ConfigError(f"queue counts must be between 1 and {MAX_QUEUE_NUMS}")
        with self._lock:
            existing = self.topics.get(cfg.topic_name)
            if existing is not None and existing == cfg:
                return existing
            self.topics[cfg.topic_name] = cfg
            self._persist()
        log.info("topic %s %s: %d read / %d write queues, perm %d", cfg.topic_name,
                 "created" if existing is None else "updated", cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm)
        return cfg

    def delete(self, topic: str) -> None:
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
