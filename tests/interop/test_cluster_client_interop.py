"""The cluster client (``rmq_spark.cluster``) against every target: a real Apache RocketMQ
(NameServer + two brokers) and rmq-broker — routes, sends and batches, pulls parsed into Arrow,
offsets by time, consumer offsets, and a transaction committed from the CHECK_TRANSACTION_STATE
hook."""

from __future__ import annotations

import threading
import time

from test_cluster_read import make_topic

from rmq_spark.cluster import ClusterClient
from rmq_spark.cluster.wire import TRANSACTION_PREPARED_TYPE
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.store.pulled import records_arrow


def test_client_calls_on_every_broker(target, names):
    topic, group = f"{names}_T"[-60:], f"{names}_G"[-60:]
    brokers = make_topic(target, topic, queues=2)
    before = int(time.time() * 1000) - 1
    with ClusterClient(f"127.0.0.1:1;{target.namesrv_addr}") as c:  # the first NameServer is down
        route = c.route(topic)
        assert sorted(route.brokers) == brokers and len(route.read_queues()) == 2 * len(brokers)
        for b in brokers:
            one = c.send_message(
                b, "cp", topic, 1, b"one", {"TAGS": "x", "KEYS": "k1", "UNIQ_KEY": f"U-{b}"}
            )
            assert (one.status, one.queue_id, one.queue_offset, one.msg_id) == (
                "SEND_OK",
                1,
                0,
                f"U-{b}",
            )
            many = c.send_batch(
                b, "cp", topic, 1, [(b"m%d" % i, {"TAGS": "y", "n": str(i)}, 0) for i in range(50)]
            )
            assert many.queue_offset == 1
            # Apache builds ConsumeQueues after it acknowledges (its ReputMessageService): on a busy
            # machine the max offset reaches 51 a little after the send's answer
            deadline = time.monotonic() + 30
            while c.get_max_offset(b, topic, 1) < 51 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert (c.get_min_offset(b, topic, 1), c.get_max_offset(b, topic, 1)) == (0, 51)
            assert c.search_offset(b, topic, 1, before) == 0
            body = b""
            offset = 0
            while offset < 51:  # a broker answers at most its own cap per pull
                r = c.pull(b, topic, 1, offset, 64, group)
                assert r.code == ResponseCode.SUCCESS and r.next_begin_offset > offset
                body += r.body
                offset = r.next_begin_offset
            rows = records_arrow(body)
            assert rows.column("queueOffset").to_pylist() == list(range(51))
            assert rows.column("body").to_pylist() == [b"one"] + [b"m%d" % i for i in range(50)]
            assert (
                rows.column("keys").to_pylist()[0] == "k1"
                and rows.column("msgId").to_pylist()[0] == f"U-{b}"
            )
            sql = c.pull(b, topic, 1, 0, 64, group, expression="n >= 48", expression_type="SQL92")
            assert records_arrow(sql.body).column("body").to_pylist() == [b"m48", b"m49"]
            assert c.pull(b, topic, 1, 51, 64, group).code == ResponseCode.PULL_NOT_FOUND
            assert c.query_consumer_offset(b, group, topic, 1) is None
            c.update_consumer_offset(b, group, topic, 1, 17)
            assert c.query_consumer_offset(b, group, topic, 1) == 17


def test_check_transaction_state_hook_commits_a_half_message(target, names):
    topic, group = f"{names}_T"[-60:], f"{names}_P"[-60:]
    brokers = make_topic(target, topic, queues=1)
    b = brokers[0]
    checked = threading.Event()

    def hook(conn, cmd):
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            f = cmd.ext_fields
            client.end_transaction(
                b,
                group,
                tran_state_table_offset=int(f["tranStateTableOffset"]),
                commit_log_offset=int(f["commitLogOffset"]),
                commit=True,
                msg_id=f["msgId"],
                transaction_id=f.get("transactionId"),
                from_check=True,
            )
            checked.set()
        return None

    with ClusterClient(target.namesrv_addr, on_request=hook) as client:
        client.route(topic)
        client.heartbeat(b, producer_groups=[group])
        half = client.send_message(
            b,
            group,
            topic,
            0,
            b"half",
            {"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": f"{names}-tx"[-40:]},
            sys_flag=TRANSACTION_PREPARED_TYPE,
        )
        assert half.status == "SEND_OK"
        assert client.get_max_offset(b, topic, 0) == 0  # not in the topic before it is committed
        assert checked.wait(120), "the broker never asked CHECK_TRANSACTION_STATE"
        deadline = time.monotonic() + 60
        while client.get_max_offset(b, topic, 0) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        r = client.pull(b, topic, 0, 0, 32, "reader")
        assert r.found and records_arrow(r.body).column("body").to_pylist() == [b"half"]
