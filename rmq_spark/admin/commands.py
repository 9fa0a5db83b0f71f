"""rmq-admin's commands: each takes a :class:`~rmq_spark.admin.remote.Remote` and its arguments
and returns what it found as plain data (lists and dicts, what ``--json`` prints); the text
rendering is :mod:`rmq_spark.admin.__main__`'s.  Every one speaks RocketMQ's remoting protocol
only, so it works against rmq-broker and an Apache RocketMQ cluster alike."""

from __future__ import annotations

import time
from typing import Any

from rmq_spark.admin.remote import AdminError, BrokerRef, Remote
from rmq_spark.remoting.codes import RequestCode as R
from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.store import layout as L
from rmq_spark.store.message import MessageExt
from rmq_spark.store.properties import encode_properties
from rmq_spark.store.record import decode_record

__all__ = [
    "SYSTEM_TOPICS",
    "broker_status",
    "cluster",
    "create_topic",
    "delete_topic",
    "group_lag",
    "groups",
    "message_by_id",
    "messages_by_key",
    "resend_dlq",
    "reset_offsets",
    "topic_queues",
    "topics",
]  # fmt: skip

# topics RocketMQ makes for itself (TopicValidator.SYSTEM_TOPIC_SET and friends): hidden unless --all
SYSTEM_TOPICS = frozenset({
    "TBW102", "SELF_TEST_TOPIC", "BenchmarkTest", "OFFSET_MOVED_EVENT", "TRANS_CHECK_MAX_TIME_TOPIC",
    "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
    "rmq_sys_wheel_timer", "rmq_sys_REVIVE_LOG", "rmq_sys_SYNC_BROKER_MEMBER", "DefaultHeartBeatSyncerTopic",
})  # fmt: skip
SYSTEM_GROUP_PREFIXES = ("CID_RMQ_SYS_", "CID_ONSAPI_", "CID_ONS-HTTP-PROXY", "CID_SYS_RMQ_TRANS")
SYSTEM_GROUPS = frozenset({"TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONSAPI_OWNER",
                           "CID_ONSAPI_PERMISSION", "CID_ONSAPI_PULL", "CID_RMQ_SYS_TRANS"})  # fmt: skip
PERMS = {"r": 4, "w": 2, "rw": 6, "wr": 6, "-": 0, "none": 0}


def _system_topic(name: str, brokers: list[BrokerRef]) -> bool:
    if (
        name in SYSTEM_TOPICS
        or L.is_system_topic(name)
        or name.startswith(("rmq_sys_", "%RETRY%", "%DLQ%", "%LMQ%"))
    ):
        return True
    # a broker's and a cluster's own topics
    return any(name in (b.name, b.cluster) for b in brokers)


def iso(ms: int) -> str:
    if ms <= 0:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


# --- the cluster ---------------------------------------------------------------------------------
def cluster(remote: Remote) -> list[dict[str, Any]]:
    return [{"cluster": b.cluster, "broker": b.name, "addr": b.addr} for b in remote.brokers()]


def broker_status(remote: Remote, only: str | None = None) -> list[dict[str, Any]]:
    """GET_BROKER_RUNTIME_INFO of every master (or of the broker named / addressed ``only``)."""
    out = []
    for b in remote.brokers():
        if only and only not in (b.name, b.addr):
            continue
        table = remote.json(b.addr, R.GET_BROKER_RUNTIME_INFO).get("table") or {}
        out.append({"broker": b.name, "addr": b.addr, "status": dict(sorted(table.items()))})
    if only and not out:
        raise AdminError(f"no master broker is named or addressed {only!r}")
    return out


# --- topics --------------------------------------------------------------------------------------
def topics(
    remote: Remote, include_system: bool = False, cluster_name: str | None = None
) -> list[dict[str, Any]]:
    """Every topic of the masters' GET_ALL_TOPIC_CONFIG: queue counts, permission, brokers."""
    brokers = remote.brokers(cluster_name)
    merged: dict[str, dict[str, Any]] = {}
    for b in brokers:
        table = remote.json(b.addr, R.GET_ALL_TOPIC_CONFIG).get("topicConfigTable") or {}
        for name, cfg in table.items():
            if not include_system and _system_topic(name, brokers):
                continue
            t = merged.setdefault(name, {"topic": name, "read_queues": 0, "write_queues": 0,
                                         "perm": int(cfg.get("perm", 6)), "brokers": []})  # fmt: skip
            t["read_queues"] += int(cfg.get("readQueueNums", 0))
            t["write_queues"] += int(cfg.get("writeQueueNums", 0))
            t["brokers"].append(b.name)
    return [merged[k] for k in sorted(merged)]


def create_topic(remote: Remote, topic: str, read_queues: int, write_queues: int, perm: int, order: bool = False,
                 cluster_name: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """UPDATE_AND_CREATE_TOPIC on every master (of ``cluster_name``): creates or updates."""
    if not topic or len(topic) > 127 or any(not (c.isalnum() or c in "%|-_") for c in topic):
        raise AdminError(
            f"topic name {topic!r} is not valid: letters, digits, '%', '|', '-' and '_', at most 127"
        )
    for n, what in ((read_queues, "read"), (write_queues, "write")):
        if not 1 <= n <= 1024:
            raise AdminError(f"{what} queue count must be between 1 and 1024, not {n}")
    out = []
    for b in remote.brokers(cluster_name):
        remote.call(b.addr, R.UPDATE_AND_CREATE_TOPIC, {
            "topic": topic, "defaultTopic": "TBW102", "readQueueNums": read_queues, "writeQueueNums": write_queues,
            "perm": perm, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": order,
        })  # fmt: skip
        out.append({"broker": b.name, "addr": b.addr, "topic": topic, "read_queues": read_queues,
                    "write_queues": write_queues, "perm": perm})  # fmt: skip
    return out


def delete_topic(
    remote: Remote, topic: str, cluster_name: str | None = None
) -> list[dict[str, Any]]:
    """DELETE_TOPIC_IN_BROKER on the masters holding it, then DELETE_TOPIC_IN_NAMESRV."""
    holders = remote.topic_brokers(topic)
    if cluster_name is not None:
        holders = [b for b in holders if b.cluster == cluster_name]
    out = []
    for b in holders:
        remote.call(b.addr, R.DELETE_TOPIC_IN_BROKER, {"topic": topic})
        out.append({"broker": b.name, "addr": b.addr, "topic": topic, "deleted": True})
    if remote.namesrv is not None:
        remote.call(
            remote.namesrv, R.DELETE_TOPIC_IN_NAMESRV, {"topic": topic, "clusterName": cluster_name}
        )
    return out


def _offset_rows(pairs: Any) -> list[tuple[dict[str, Any], Any]]:
    """A fastjson map keyed by MessageQueue objects, as (queue, value) pairs."""
    if isinstance(pairs, dict):
        return []  # {}: nothing
    return [(k, v) for k, v in pairs or [] if isinstance(k, dict)]


def topic_queues(remote: Remote, topic: str) -> list[dict[str, Any]]:
    """GET_TOPIC_STATS_INFO of every broker of the topic: each queue's offsets and last store time."""
    rows = []
    for b in remote.topic_brokers(topic):
        stats = remote.json(b.addr, R.GET_TOPIC_STATS_INFO, {"topic": topic})
        for mq, off in _offset_rows(stats.get("offsetTable")):
            last = int(off.get("lastUpdateTimestamp", 0))
            rows.append({"broker": mq.get("brokerName", b.name), "queue": int(mq["queueId"]),
                         "min_offset": int(off.get("minOffset", 0)), "max_offset": int(off.get("maxOffset", 0)),
                         "last_store_time": last, "last_store_time_iso": iso(last)})  # fmt: skip
    return sorted(rows, key=lambda r: (r["broker"], r["queue"]))


# --- consumer groups -----------------------------------------------------------------------------
def groups(remote: Remote, include_system: bool = False) -> list[dict[str, Any]]:
    """The subscription groups of every master (GET_ALL_SUBSCRIPTIONGROUP_CONFIG)."""
    found: dict[str, list[str]] = {}
    for b in remote.brokers():
        table = (
            remote.json(b.addr, R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG).get("subscriptionGroupTable")
            or {}
        )
        for name in table:
            if include_system or not (
                name in SYSTEM_GROUPS or name.startswith(SYSTEM_GROUP_PREFIXES)
            ):
                found.setdefault(name, []).append(b.name)
    return [{"group": g, "brokers": found[g]} for g in sorted(found)]


def group_lag(remote: Remote, group: str, topic: str | None = None) -> dict[str, Any]:
    """GET_CONSUME_STATS of every master: per queue, the broker's and the group's offsets."""
    rows = []
    brokers = remote.topic_brokers(topic) if topic else remote.brokers()
    for b in brokers:
        answer = remote.call(b.addr, R.GET_CONSUME_STATS, {"consumerGroup": group, "topic": topic},
                             ok=(ResponseCode.SUCCESS, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                 ResponseCode.CONSUMER_NOT_ONLINE, ResponseCode.TOPIC_NOT_EXIST))  # fmt: skip
        if answer.code != ResponseCode.SUCCESS or not answer.body:
            continue
        stats = remote.parse(b.addr, answer)
        for mq, off in _offset_rows(stats.get("offsetTable")):
            if str(mq.get("topic", "")).startswith("%RETRY%") and not topic:
                continue
            broker_offset, consumer_offset = (
                int(off.get("brokerOffset", 0)),
                int(off.get("consumerOffset", 0)),
            )
            last = int(off.get("lastTimestamp", 0))
            rows.append({"topic": mq.get("topic"), "broker": mq.get("brokerName", b.name), "queue": int(mq["queueId"]),
                         "broker_offset": broker_offset, "consumer_offset": consumer_offset,
                         "lag": max(0, broker_offset - consumer_offset), "last_consumed_store_time": last,
                         "last_consumed_store_time_iso": iso(last)})  # fmt: skip
    if not rows:
        raise AdminError(
            f"consumer group {group!r} has no consume progress"
            + (f" on topic {topic!r}" if topic else "")
        )
    rows.sort(key=lambda r: (r["topic"], r["broker"], r["queue"]))
    return {"group": group, "total_lag": sum(r["lag"] for r in rows), "queues": rows}


def parse_when(text: str) -> int:
    """``earliest`` -> 0, ``latest`` -> -1, milliseconds since the epoch, or an ISO-8601 time
    (UTC unless it names its offset) -> milliseconds."""
    t = text.strip().lower()
    if t == "earliest":
        return 0
    if t == "latest":
        return -1
    if t.isdigit():
        return int(t)
    from datetime import datetime, timezone

    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise AdminError(f"--to {text!r} is not earliest, latest, milliseconds since the epoch or an ISO-8601 "
                         "time such as 2024-05-01T12:00:00Z") from None  # fmt: skip
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def _queue_target(remote: Remote, addr: str, topic: str, qid: int, when: int) -> int:
    if when == -1:
        code, fields = R.GET_MAX_OFFSET, {"topic": topic, "queueId": qid}
    elif when == 0:
        code, fields = R.GET_MIN_OFFSET, {"topic": topic, "queueId": qid}
    else:
        code, fields = (
            R.SEARCH_OFFSET_BY_TIMESTAMP,
            {"topic": topic, "queueId": qid, "timestamp": when},
        )
    return int(remote.call(addr, code, fields).ext_fields.get("offset", "0"))


def reset_offsets(remote: Remote, group: str, topic: str, when: int) -> list[dict[str, Any]]:
    """Move ``group``'s offsets on ``topic`` to ``when`` (see :func:`parse_when`) on every broker
    of the topic: INVOKE_BROKER_TO_RESET_OFFSET (the broker resets and tells its consumers); where a
    broker refuses it (an Apache broker whose group has no consumer online), the offsets it should
    have are found (GET_MIN/MAX_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP) and written with
    UPDATE_CONSUMER_OFFSET, what mqadmin's resetOffsetByTime falls back to."""
    rows = []
    for b in remote.topic_brokers(topic):
        answer = remote.call(b.addr, R.INVOKE_BROKER_TO_RESET_OFFSET,
                             {"topic": topic, "group": group, "timestamp": when, "isForce": True, "queueId": -1},
                             ok=None)  # any answer: a refusal falls back  # fmt: skip
        if answer.code == ResponseCode.SUCCESS and answer.body:
            body = remote.parse(b.addr, answer)
            for mq, offset in _offset_rows(body.get("offsetTable")):
                rows.append({"broker": mq.get("brokerName", b.name), "queue": int(mq["queueId"]), "offset": int(offset),
                             "how": "INVOKE_BROKER_TO_RESET_OFFSET"})  # fmt: skip
            continue
        stats = remote.json(b.addr, R.GET_TOPIC_STATS_INFO, {"topic": topic})
        for mq, _off in _offset_rows(stats.get("offsetTable")):
            qid = int(mq["queueId"])
            target = _queue_target(remote, b.addr, topic, qid, when)
            remote.call(b.addr, R.UPDATE_CONSUMER_OFFSET,
                        {"consumerGroup": group, "topic": topic, "queueId": qid, "commitOffset": target})  # fmt: skip
            rows.append(
                {"broker": b.name, "queue": qid, "offset": target, "how": "UPDATE_CONSUMER_OFFSET"}
            )
    return sorted(rows, key=lambda r: (r["broker"], r["queue"]))


# --- messages ------------------------------------------------------------------------------------
def _records(body: bytes) -> list[MessageExt]:
    out, pos = [], 0
    while pos + 8 <= len(body):
        size = int.from_bytes(body[pos : pos + 4], "big")
        if size <= 0 or pos + size > len(body):
            break
        out.append(decode_record(body, pos))
        pos += size
    return out


def describe(m: MessageExt, broker: str = "") -> dict[str, Any]:
    props = dict(m.properties.items())
    return {
        "msg_id": props.get(L.P_UNIQ_KEY) or m.msg_id, "offset_msg_id": m.msg_id, "topic": m.topic,
        "broker": broker, "queue": m.queue_id, "queue_offset": m.queue_offset, "commitlog_offset": m.commitlog_offset,
        "tags": props.get(L.P_TAGS), "keys": props.get(L.P_KEYS), "born_time": m.born_timestamp_ms,
        "store_time": m.store_timestamp_ms, "store_time_iso": iso(m.store_timestamp_ms),
        "reconsume_times": m.reconsume_times, "body_size": len(m.body), "properties": props,
        "body": m.body.decode("utf-8", errors="replace"),
    }  # fmt: skip


def _decode_offset_id(msg_id: str) -> tuple[str, int] | None:
    """An offsetMsgId (store host IPv4, port, CommitLog offset in 32 hex digits) -> (addr, offset)."""
    if len(msg_id) != 32:
        return None
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        return None
    return f"{'.'.join(str(b) for b in raw[:4])}:{int.from_bytes(raw[4:8], 'big')}", int.from_bytes(
        raw[8:], "big"
    )


def _find_by_id(remote: Remote, msg_id: str, topic: str | None) -> tuple[MessageExt, BrokerRef]:
    if topic:  # a unique (client) id: QUERY_MESSAGE with _UNIQUE_KEY_QUERY on the topic's brokers
        for b in remote.topic_brokers(topic):
            answer = remote.call(b.addr, R.QUERY_MESSAGE, {
                "topic": topic, "key": msg_id, "maxNum": 32, "beginTimestamp": 0, "endTimestamp": (1 << 63) - 1,
                "_UNIQUE_KEY_QUERY": True}, ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))  # fmt: skip
            found = [m for m in _records(answer.body) if m.properties.get(L.P_UNIQ_KEY) == msg_id]
            if found:
                return found[0], b
    decoded = _decode_offset_id(msg_id)
    if decoded is not None:
        addr, offset = decoded
        brokers = remote.brokers()
        ref = next((b for b in brokers if b.addr == addr), None)
        if ref is None:
            port = addr.rpartition(":")[2]
            ref = next(
                (b for b in brokers if b.addr.rpartition(":")[2] == port), BrokerRef("", addr, addr)
            )
        answer = remote.call(ref.addr, R.VIEW_MESSAGE_BY_ID, {"offset": offset},
                             ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR))  # fmt: skip
        found = _records(answer.body) if answer.code == ResponseCode.SUCCESS else []
        if found:
            return found[0], ref
    where = f" in topic {topic!r}" if topic else " (give -t TOPIC to look a unique message id up)"
    raise AdminError(f"no message has id {msg_id!r}{where}")


def message_by_id(remote: Remote, msg_id: str, topic: str | None = None) -> dict[str, Any]:
    m, b = _find_by_id(remote, msg_id, topic)
    return describe(m, b.name)


def messages_by_key(remote: Remote, topic: str, key: str, limit: int = 64) -> list[dict[str, Any]]:
    out = []
    for b in remote.topic_brokers(topic):
        answer = remote.call(b.addr, R.QUERY_MESSAGE, {"topic": topic, "key": key, "maxNum": limit, "beginTimestamp": 0,
                                                        "endTimestamp": (1 << 63) - 1},
                             ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))  # fmt: skip
        for m in _records(answer.body):
            if key in (m.properties.get(L.P_KEYS) or "").split(" "):
                out.append(describe(m, b.name))
    if not out:
        raise AdminError(f"no message of topic {topic!r} has key {key!r}")
    return sorted(out, key=lambda d: (d["store_time"], d["broker"], d["queue"], d["queue_offset"]))


def resend_dlq(remote: Remote, group: str, msg_id: str, to_topic: bool = False) -> dict[str, Any]:
    """Send a message of ``%DLQ%{group}`` again: to ``%RETRY%{group}`` (only that group gets it,
    as a retry) or, with ``to_topic``, to its original topic (every group subscribed gets it)."""
    dlq = L.DLQ_GROUP_TOPIC_PREFIX + group
    m, b = _find_by_id(remote, msg_id, dlq)
    if m.topic != dlq:
        raise AdminError(
            f"message {msg_id} is in topic {m.topic!r}, not in the DLQ {dlq!r} of group {group!r}"
        )
    props = dict(m.properties)
    origin = props.get(L.P_RETRY_TOPIC) or props.get(L.P_DLQ_ORIGIN_TOPIC)
    if not origin:
        raise AdminError(
            f"message {msg_id} does not say which topic it came from (no RETRY_TOPIC property)"
        )
    for k in (L.P_DLQ_ORIGIN_TOPIC, L.P_DLQ_ORIGIN_MESSAGE_ID, L.P_REAL_TOPIC, L.P_REAL_QID, L.P_DELAY, "MAX_OFFSET",
              "MIN_OFFSET", "CONSUME_START_TIME", "PROP_CRC"):  # fmt: skip
        props.pop(k, None)
    target = origin if to_topic else L.RETRY_GROUP_TOPIC_PREFIX + group
    if not to_topic:
        props[L.P_RETRY_TOPIC] = origin  # the consumer sees the original topic's name
    else:
        props.pop(L.P_RETRY_TOPIC, None)
    holders = remote.topic_brokers(target) if to_topic else [b]
    dest = next((h for h in holders if h.name == b.name), holders[0])
    answer = remote.call(dest.addr, R.SEND_MESSAGE, {
        "producerGroup": "rmq-admin", "topic": target, "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
        "queueId": 0, "sysFlag": 0, "bornTimestamp": int(time.time() * 1000), "flag": m.flag,
        "properties": encode_properties(props).decode("utf-8"), "reconsumeTimes": 0 if to_topic else m.reconsume_times,
        "unitMode": False, "batch": False,
    }, m.body)  # fmt: skip
    return {"group": group, "msg_id": msg_id, "from": dlq, "to": target, "broker": dest.name,
            "new_offset_msg_id": answer.ext_fields.get("msgId"), "queue": int(answer.ext_fields.get("queueId", 0)),
            "queue_offset": int(answer.ext_fields.get("queueOffset", 0))}  # fmt: skip
