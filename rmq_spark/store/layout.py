"""Every on-disk name, magic number, flag bit and reserved property of the store, in one place.

Values follow Apache RocketMQ (``MessageSysFlag``, ``MessageConst``, ``TopicValidator``,
``MessageStoreConfig``) so that files and records are byte-compatible.
"""

from __future__ import annotations

# --- directory and file names under the store root -------------------------------------------
COMMITLOG_DIR = "commitlog"
CONSUMEQUEUE_DIR = "consumequeue"
INDEX_DIR = "index"
CONFIG_DIR = "config"
CHECKPOINT_FILE = "checkpoint"
ABORT_FILE = "abort"
INFLIGHT_FILE = "inflight"  # the CommitLog write under way (store.inflight)
LOCK_FILE = "lock"
TOPICS_FILE = "topics.json"
CONSUMER_OFFSET_FILE = "consumerOffset.json"
DELETED_TOPICS_FILE = "deletedTopics.json"  # store.deleted: tombstones of deleted topics
DELAY_OFFSET_FILE = "delayOffset.json"

# --- default sizes ------------------------------------------------------------------------------
COMMITLOG_SEGMENT_BYTES = 1024 * 1024 * 1024  # mappedFileSizeCommitLog
CQ_UNIT_BYTES = 20  # CQ_STORE_UNIT_SIZE
CQ_SEGMENT_UNITS = 300_000  # mappedFileSizeConsumeQueue / 20
OS_PAGE_BYTES = 4096
FILE_NAME_DIGITS = 20  # UtilAll.offset2FileName

# --- CommitLog record magics ---------------------------------------------------------------------
MAGIC_V1 = 0xDAA320A7  # MESSAGE_MAGIC_CODE (-626843481)
MAGIC_V2 = 0xDAA320AB  # MESSAGE_MAGIC_CODE_V2 (-626843477): 2-byte topic length
BLANK_MAGIC = 0xCBD43194  # BLANK_MAGIC_CODE (-875286124): end-of-file filler
END_FILE_MIN_BLANK_BYTES = 8

# --- SYSFLAG bits (MessageSysFlag) ------------------------------------------------------------------
FLAG_COMPRESSED = 0x1
FLAG_MULTI_TAGS = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
TRANSACTION_MASK = 0xC
FLAG_BORNHOST_V6 = 0x10
FLAG_STOREHOST_V6 = 0x20
FLAG_NEED_UNWRAP = 0x40
FLAG_INNER_BATCH = 0x80

# --- property separators and keys (MessageConst) --------------------------------------------------
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "
PROPERTY_MAX_BYTES = 32767  # Short.MAX_VALUE

P_TAGS = "TAGS"
P_KEYS = "KEYS"
P_WAIT = "WAIT"
P_DELAY = "DELAY"
P_RETRY_TOPIC = "RETRY_TOPIC"
P_REAL_TOPIC = "REAL_TOPIC"
P_REAL_QID = "REAL_QID"
P_TRAN_MSG = "TRAN_MSG"
P_PGROUP = "PGROUP"
P_UNIQ_KEY = "UNIQ_KEY"
P_RECONSUME_TIME = "RECONSUME_TIME"
P_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
P_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
P_TRANSACTION_ID = "__transactionId__"
P_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
P_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
P_TRAN_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
P_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
P_TIMER_DELAY_MS = "TIMER_DELAY_MS"
P_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
P_TIMER_OUT_MS = "TIMER_OUT_MS"
P_TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
P_TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
P_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
P_SHARDING_KEY = "__SHARDINGKEY"
P_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
P_DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
TRANSIENT_PREFIX = "__RMQ.TRANSIENT."
P_TRAN_CHECK_SOURCE = "TRAN_CHECK_SOURCE"  # half queue offset a check copy came from

# --- system topics (TopicValidator) --------------------------------------------------------------
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
TIMER_TOPIC = "rmq_sys_wheel_timer"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
SYSTEM_TOPICS = frozenset(
    {
        SCHEDULE_TOPIC,
        TRANS_HALF_TOPIC,
        TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
    }
)
# TopicValidator.SYSTEM_TOPIC_SET: the topics an admin request may not create, reconfigure or
# delete ("conflict with system topic"); producers may still send to these three, which
# SYSTEM_TOPICS (RocketMQ's NOT_ALLOWED_SEND_TOPIC_SET) leaves out
AUTO_CREATE_TOPIC = "TBW102"  # AUTO_CREATE_TOPIC_KEY_TOPIC
BENCHMARK_TOPIC = "BenchmarkTest"
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
ADMIN_RESERVED_TOPICS = SYSTEM_TOPICS | {AUTO_CREATE_TOPIC, BENCHMARK_TOPIC, TRACE_TOPIC}
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"

# --- limits (validation) -----------------------------------------------------------------------------
TOPIC_MAX_CHARS = 127
RETRY_TOPIC_MAX_CHARS = 255
GROUP_MAX_CHARS = 120
QUEUE_NUMS_MAX = 1024  # queues of a topic; queue ids are below it
OFFSET_MIN = -1  # a consumer offset: -1, none yet (RocketMQ's answer for a queue without one)
OFFSET_MAX = (1 << 63) - 1  # a Java long
BODY_MAX_BYTES = 4 * 1024 * 1024  # maxMessageSize (5.x: a limit on the body)

# --- topic permissions (PermName) ------------------------------------------------------------------------
PERM_INHERIT = 1
PERM_WRITE = 2
PERM_READ = 4
PERM_PRIORITY = 8


def offset_to_file_name(offset: int) -> str:
    """``UtilAll.offset2FileName``: the start offset, zero-padded to 20 digits."""
    return f"{offset:0{FILE_NAME_DIGITS}d}"


def is_system_topic(topic: str) -> bool:
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)


def conflicts_with_system_topic(topic: str) -> bool:
    """``TopicValidator.isSystemTopic``: a topic an admin request may not create, update or delete."""
    return topic in ADMIN_RESERVED_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)
