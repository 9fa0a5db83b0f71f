"""The properties rmq-broker stores for each operation against what Apache RocketMQ 5.5.0 stores
for the same workload (issue 29 item 3), property by property.

One Java program (``stored-properties``) runs the same workload on both servers: a plain send, a
delay-level message, a timer message, a committed transactional message, a message sent back
once (to ``%RETRY%group``, delivered there through delay level 1) and one sent back to the DLQ;
then it pulls every stored record back and prints its properties as the broker returned them.
The two sides are compared by key set, and by value wherever the value is not inherently the
server's own (ids, times, queues, hosts): those are checked against what they must be instead.
"""

from __future__ import annotations

WHERE = [
    "topic/plain", "topic/delay", "topic/timer", "topic/txn", "topic/retry", "topic/dlq",
    "retry-topic/retry", "dlq-topic/dlq",
]  # fmt: skip
# values that differ between two servers by nature: ids, times, queue numbers and offsets
VARYING = {
    "UNIQ_KEY", "__transactionId__", "MIN_OFFSET", "MAX_OFFSET", "REAL_QID", "CLUSTER",
    "TIMER_OUT_MS", "TIMER_DELIVER_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "ORIGIN_MESSAGE_ID",
}  # fmt: skip
# the record checksum property: a setting of the store, not an operation's (Apache writes it with
# enabledAppendPropCRC=true, off by default; rmq-broker's StoreConfig.append_prop_crc is on)
STORE_CHECKSUM = "__CRC32#"


def offset_msg_id(store_host: str, commitlog_offset: int) -> str:
    """The offsetMsgId of a record (MessageDecoder.createMessageId): store IPv4, port, offset."""
    host, port = store_host.lstrip("/").rsplit(":", 1)
    ip = "".join(f"{int(part):02X}" for part in host.split("."))
    return f"{ip}{int(port):08X}{commitlog_offset:016X}"


def stored(java, names: str) -> dict[str, dict]:
    topic, group = f"{names}_T", f"{names}_G"
    java.create_topic(topic, queues=2)
    result = java.run("stored-properties", group=group, topic=topic, timeout_s=150)
    sent = {e["kind"]: e for e in result.events("sent")}
    assert {k: e["status"] for k, e in sent.items()} == dict.fromkeys(
        ("plain", "delay", "timer", "retry", "dlq", "txn"), "SEND_OK"
    )
    assert sent["txn"]["localState"] == "COMMIT_MESSAGE"
    got = {e["where"]: e for e in result.events("stored")}
    assert sorted(got) == sorted(WHERE), got.keys()
    return got


def compare(where: str, a: dict, r: dict) -> list[str]:
    """What rmq-broker's record ``r`` stores differently from Apache's ``a``."""
    ap, rp = dict(a["properties"]), dict(r["properties"])
    ap.pop(STORE_CHECKSUM, None)
    rp.pop(STORE_CHECKSUM, None)
    problems = []
    if sorted(rp) != sorted(ap):
        problems.append(
            f"{where}: keys only on rmq-broker {sorted(set(rp) - set(ap))}, "
            f"only on apache {sorted(set(ap) - set(rp))}"
        )
    for key in sorted(set(ap) & set(rp) - VARYING):
        if rp[key] != ap[key]:
            problems.append(f"{where}: {key} is {rp[key]!r} on rmq-broker, {ap[key]!r} on apache")
    for field in ("body", "tags", "keys", "reconsumeTimes"):
        if r[field] != a[field]:
            problems.append(f"{where}: {field} {r[field]!r} on rmq-broker, {a[field]!r} on apache")
    if r["sysFlag"] & 0xC != a["sysFlag"] & 0xC:  # the transaction type
        problems.append(f"{where}: sysFlag {r['sysFlag']} on rmq-broker, {a['sysFlag']} on apache")
    return problems


def check_own_values(where: str, side: dict, records: dict[str, dict], cluster: str) -> None:
    """The values that differ between servers, each against what it must be on its own."""
    p = side["properties"]
    assert (
        p["CLUSTER"] == cluster and p["MSG_REGION"] == "DefaultRegion" and p["TRACE_ON"] == "true"
    )
    if "REAL_QID" in p and p["REAL_TOPIC"] == side["topic"]:
        assert int(p["REAL_QID"]) == side["queueId"], (where, p)
    if "TIMER_OUT_MS" in p:  # Apache floors the time to its precision (1 s)
        assert 0 <= int(p["TIMER_DELIVER_MS"]) - int(p["TIMER_OUT_MS"]) < 1000, (where, p)
        assert int(p["TIMER_ENQUEUE_MS"]) <= int(p["TIMER_DEQUEUE_MS"]) <= side["storeTimestamp"], (
            where,
            p,
            side,
        )
        assert int(p["TIMER_DEQUEUE_MS"]) >= int(p["TIMER_OUT_MS"]), (where, p)  # never early
    if where.startswith(("retry-topic", "dlq-topic")):
        original = records["topic/" + p["kind"]]
        assert p["ORIGIN_MESSAGE_ID"] == offset_msg_id(
            original["storeHost"], original["commitLogOffset"]
        ), (where, p)
        assert p["UNIQ_KEY"] == original["properties"]["UNIQ_KEY"]
    if where == "topic/txn":
        assert p["__transactionId__"] == p["UNIQ_KEY"]


def test_stored_properties_match_apache(apache_java, rmq_java, names):
    apache, rmq = stored(apache_java, names), stored(rmq_java, names)
    problems = [problem for where in WHERE for problem in compare(where, apache[where], rmq[where])]
    assert not problems, "\n".join(problems)
    for records, target in ((apache, apache_java.target), (rmq, rmq_java.target)):
        for where in WHERE:
            check_own_values(where, records[where], records, target.cluster)
    # what the issue names, on both
    for records in (apache, rmq):
        delay, timer, txn = (
            records["topic/delay"]["properties"],
            records["topic/timer"]["properties"],
            records["topic/txn"]["properties"],
        )
        assert delay["DELAY"] == "1" and "TIMER_OUT_MS" not in delay
        assert {"REAL_TOPIC", "REAL_QID", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS"} <= set(timer)
        assert txn["TRAN_MSG"] == "true" and "REAL_TOPIC" not in txn
        assert records["retry-topic/retry"]["properties"]["WAIT"] == "false"
        assert records["dlq-topic/dlq"]["properties"]["DELAY"] == "0"
        assert not any(k.endswith("_SOURCE") for e in records.values() for k in e["properties"])
