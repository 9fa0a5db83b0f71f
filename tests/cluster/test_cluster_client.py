"""The cluster client against rmq-broker's remoting port and NameServer (a real peer, in-process):
routes, offsets, pulls parsed into Arrow, consumer offsets, sends and batches, and the errors."""

from __future__ import annotations

import socket

import pytest

from rmq_spark.broker.options import BrokerOptions
from rmq_spark.broker.server import Broker
from rmq_spark.cluster import BrokerUnreachableError, ClusterClient, ClusterError
from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.store.message import Message
from rmq_spark.store.pulled import records_arrow

TOPIC = "ClusterT"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    opts = BrokerOptions(
        listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen="127.0.0.1:0"
    )
    with Broker(str(tmp_path_factory.mktemp("store")), options=opts) as b:
        b.store.put_messages(
            [
                Message(
                    TOPIC,
                    b"m%d" % i,
                    {"TAGS": "even" if i % 2 == 0 else "odd", "n": str(i), "KEYS": f"k{i}"},
                )
                for i in range(10)
            ]
        )
        yield b


def _dead_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_route_fails_over_to_the_second_namesrv_and_names_the_broker(broker):
    with ClusterClient(f"{_dead_addr()};{broker.namesrv_endpoint}") as c:
        route = c.route(TOPIC)
        (name,) = route.brokers
        assert route.brokers[name].master == broker.remoting_endpoint
        assert [q for b, q in route.read_queues()] == list(range(len(route.read_queues())))
        assert (name, 0) in route.write_queues()


def test_offsets_pull_and_arrow(broker):
    with ClusterClient(broker.namesrv_endpoint) as c:
        (name,) = c.route(TOPIC).brokers
        assert c.get_min_offset(name, TOPIC, 0) == 0
        assert c.get_max_offset(name, TOPIC, 0) == 10
        r = c.pull(name, TOPIC, 0, 2, 5, "g")
        assert r.found and (r.next_begin_offset, r.min_offset, r.max_offset) == (7, 0, 10)
        batch = records_arrow(r.body)
        assert batch.column("queueOffset").to_pylist() == [2, 3, 4, 5, 6]
        assert batch.column("body").to_pylist() == [b"m2", b"m3", b"m4", b"m5", b"m6"]
        assert batch.column("tags").to_pylist() == ["even", "odd", "even", "odd", "even"]
        assert batch.column("keys").to_pylist() == ["k2", "k3", "k4", "k5", "k6"]
        assert set(batch.column("topic").to_pylist()) == {TOPIC}
        assert batch.column("msgId").null_count == 0
        odd = c.pull(name, TOPIC, 0, 0, 32, "g", expression="odd")
        assert records_arrow(odd.body).column("queueOffset").to_pylist() == [1, 3, 5, 7, 9]
        sql = c.pull(name, TOPIC, 0, 0, 32, "g", expression="n >= 8", expression_type="SQL92")
        assert records_arrow(sql.body).column("body").to_pylist() == [b"m8", b"m9"]
        assert c.pull(name, TOPIC, 0, 10, 32, "g").code == ResponseCode.PULL_NOT_FOUND
        moved = c.pull(name, TOPIC, 0, 99, 32, "g")
        assert moved.code == ResponseCode.PULL_OFFSET_MOVED
        assert c.search_offset(name, TOPIC, 0, 0) == 0


def test_consumer_offsets(broker):
    with ClusterClient(broker.namesrv_endpoint) as c:
        (name,) = c.route(TOPIC).brokers
        assert c.query_consumer_offset(name, "cg1", TOPIC, 0) is None
        c.update_consumer_offset(name, "cg1", TOPIC, 0, 7)
        assert c.query_consumer_offset(name, "cg1", TOPIC, 0) == 7


def test_send_and_batch(broker):
    with ClusterClient(broker.namesrv_endpoint) as c:
        (name,) = c.route(TOPIC).brokers
        one = c.send_message(
            name, "pg", "ClusterSend", 1, b"hello", {"TAGS": "t", "UNIQ_KEY": "ABC123"}
        )
        assert (
            one.status == "SEND_OK"
            and one.queue_id == 1
            and one.queue_offset == 0
            and one.msg_id == "ABC123"
        )
        many = c.send_batch(
            name, "pg", "ClusterSend", 1, [(b"a", {"TAGS": "x"}, 0), (b"b", {"TAGS": "y"}, 0)]
        )
        assert many.queue_offset == 1
        r = c.pull(name, "ClusterSend", 1, 0, 32, "g")
        batch = records_arrow(r.body)
        assert batch.column("body").to_pylist() == [b"hello", b"a", b"b"]
        assert batch.column("tags").to_pylist() == ["t", "x", "y"]
        assert batch.column("msgId").to_pylist()[0] == "ABC123"


def test_errors_name_broker_address_request_and_code(broker):
    with ClusterClient(broker.namesrv_endpoint) as c:
        (name,) = c.route(TOPIC).brokers
        with pytest.raises(ClusterError) as e:
            c.pull(name, TOPIC, 99, 0, 32, "g")
        msg = str(e.value)
        assert (
            name in msg
            and broker.remoting_endpoint in msg
            and "PULL_MESSAGE" in msg
            and "SYSTEM_ERROR" in msg
        )
        assert e.value.code == ResponseCode.SYSTEM_ERROR
        with pytest.raises(ClusterError, match="neither master nor slave"):
            c.get_max_offset("no-such-broker", TOPIC, 0)
    dead = _dead_addr()
    with ClusterClient(dead) as c, pytest.raises(BrokerUnreachableError, match=dead):
        c.route(TOPIC)


def test_a_range_of_a_broker_that_never_answers_fails_naming_it_after_the_timeout():
    from rmq_spark.datasource.cluster.read import (
        ClusterRange,
        ClusterReadContext,
        read_cluster_range,
    )

    dead = _dead_addr()
    ctx = ClusterReadContext(dead, "g", unavailable_timeout_ms=1000)
    with pytest.raises(ClusterError) as e:
        list(read_cluster_range(ClusterRange("T", "broker-x", 0, 0, 10, ctx)))
    msg = str(e.value)
    assert (
        "broker-x did not answer" in msg
        and "brokerUnavailableTimeout" in msg
        and "T/broker-x/0" in msg
    )
    assert dead in msg


def test_check_transaction_state_reaches_the_hook_which_commits(tmp_path):
    import threading

    from rmq_spark.cluster.wire import TRANSACTION_PREPARED_TYPE
    from rmq_spark.remoting.codes import RequestCode
    from rmq_spark.services.config import BrokerConfig

    cfg = BrokerConfig()
    cfg.transaction_timeout_s = 0.5
    cfg.transaction_check_interval_s = 0.5
    opts = BrokerOptions(
        listen="127.0.0.1:0", remoting_listen="127.0.0.1:0", namesrv_listen="127.0.0.1:0"
    )
    checked = threading.Event()
    seen: list[dict[str, str]] = []
    with Broker(str(tmp_path / "store"), config=cfg, options=opts) as b:

        def hook(conn, cmd):
            if cmd.code != RequestCode.CHECK_TRANSACTION_STATE:
                return None
            f = cmd.ext_fields
            seen.append(dict(f))
            client.end_transaction(
                name,
                "txg",
                tran_state_table_offset=int(f["tranStateTableOffset"]),
                commit_log_offset=int(f["commitLogOffset"]),
                commit=True,
                msg_id=f["msgId"],
                transaction_id=f.get("transactionId"),
                from_check=True,
            )
            checked.set()
            return None

        with ClusterClient(b.namesrv_endpoint, on_request=hook) as client:
            (name,) = client.route("TxT").brokers
            client.heartbeat(name, producer_groups=["txg"])
            half = client.send_message(
                name,
                "txg",
                "TxT",
                0,
                b"half",
                {"TRAN_MSG": "true", "PGROUP": "txg", "UNIQ_KEY": "TX1"},
                sys_flag=TRANSACTION_PREPARED_TYPE,
            )
            assert half.status == "SEND_OK"
            assert (
                client.pull(name, "TxT", 0, 0, 32, "g").code != ResponseCode.SUCCESS
            )  # a half is not readable
            assert checked.wait(60), "no CHECK_TRANSACTION_STATE reached the hook"
            assert seen[0]["msgId"] and "commitLogOffset" in seen[0]
            r = None
            for _ in range(100):
                r = client.pull(name, "TxT", 0, 0, 32, "g")
                if r.found:
                    break
                checked.wait(0.1)
            assert r is not None and r.found
            assert records_arrow(r.body).column("body").to_pylist() == [b"half"]
