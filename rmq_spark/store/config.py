"""Topic configuration, persisted as RocketMQ's ``config/topics.json``."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from rmq_spark.errors import ConfigError
from rmq_spark.store import layout as L
from rmq_spark.store.jsonfile import read_json, write_json_atomic
from rmq_spark.store.validation import check_topic

MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
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
    def from_json(cls, d: dict) -> TopicConfig:
        attrs = dict(d.get("attributes") or {})
        mtype = attrs.pop(MESSAGE_TYPE_ATTR, attrs.pop("message.type", "MIXED"))
        return cls(
            topic_name=d["topicName"],
            read_queue_nums=int(d.get("readQueueNums", 4)),
            write_queue_nums=int(d.get("writeQueueNums", 4)),
            perm=int(d.get("perm", 6)),
            message_type=str(mtype).upper(),
            order=bool(d.get("order", False)),
            attributes=attrs,
        )


# system topics and their queue counts (created on demand, never offered to producers)
SYSTEM_TOPIC_QUEUES = {
    L.SCHEDULE_TOPIC: 18,
    L.TRANS_HALF_TOPIC: 1,
    L.TRANS_OP_HALF_TOPIC: 1,
    L.TRANS_CHECK_MAX_TIME_TOPIC: 1,
    L.TIMER_TOPIC: 1,
}


class TopicConfigManager:
    def __init__(self, root: str, auto_create: bool = True, default_queue_nums: int = 4) -> None:
        self.path = os.path.join(root, L.CONFIG_DIR, L.TOPICS_FILE)
        self.auto_create = auto_create
        self.default_queue_nums = default_queue_nums
        self._lock = threading.Lock()
        self.topics: dict[str, TopicConfig] = {}
        self._version = 0
        data = read_json(self.path)
        if data:
            for name, d in (data.get("topicConfigTable") or {}).items():
                self.topics[name] = TopicConfig.from_json(d)
            self._version = int((data.get("dataVersion") or {}).get("counter", 0))

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def get_or_create(self, topic: str) -> TopicConfig:
        """The topic's config, auto-creating it when allowed; ConfigError when not."""
        cfg = self.topics.get(topic)
        if cfg is not None:
            return cfg
        if topic in SYSTEM_TOPIC_QUEUES or topic.startswith(
            (L.RETRY_GROUP_TOPIC_PREFIX, L.DLQ_GROUP_TOPIC_PREFIX)
        ):
            n = SYSTEM_TOPIC_QUEUES.get(topic, 1)
            return self.create(TopicConfig(topic, n, n), system=True)
        if not self.auto_create:
            raise ConfigError(f"topic {topic!r} does not exist and auto-creation is off")
        n = self.default_queue_nums
        return self.create(TopicConfig(topic, n, n))

    def create(self, cfg: TopicConfig, system: bool = False) -> TopicConfig:
        check_topic(cfg.topic_name, allow_system=system or L.is_system_topic(cfg.topic_name))
        if cfg.message_type not in MESSAGE_TYPES:
            raise ConfigError(f"message type {cfg.message_type!r} is not one of {MESSAGE_TYPES}")
        if not (1 <= cfg.write_queue_nums <= 1024 and 1 <= cfg.read_queue_nums <= 1024):
            raise ConfigError("queue counts must be between 1 and 1024")
        with self._lock:
            existing = self.topics.get(cfg.topic_name)
            if existing is not None and existing == cfg:
                return existing
            self.topics[cfg.topic_name] = cfg
            self._persist()
        return cfg

    def delete(self, topic: str) -> None:
        with self._lock:
            if self.topics.pop(topic, None) is not None:
                self._persist()

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
