"""The NameServer's route tables: the local broker's live topics, registered brokers and their
expiry, and the JSON documents clients parse (TopicRouteData, ClusterInfo)."""

from __future__ import annotations

from rmq_spark.namesrv.limits import RegistrationError
from rmq_spark.namesrv.registration import compressed_topic_table
from rmq_spark.namesrv.routes import BrokerEntry, LocalBroker, QueueData, RouteInfoManager


def _manager(
    now: list[int], local_topics: dict[str, QueueData], auto_create: bool = True
) -> RouteInfoManager:
    local = LocalBroker("DefaultCluster", "local", "127.0.0.1:10911", lambda: dict(local_topics),
                        lambda t: QueueData(4, 4, 6) if auto_create else None)  # fmt: skip
    return RouteInfoManager(local, now_ms=lambda: now[0])


def test_route_of_a_local_topic_and_of_a_new_one():
    now = [1_000]
    m = _manager(now, {"Orders": QueueData(2, 2, 6)})
    route = m.topic_route("Orders")
    assert route == {
        "brokerDatas": [{"cluster": "DefaultCluster", "brokerName": "local", "brokerAddrs": {"0": "127.0.0.1:10911"},
                         "enableActingMaster": False}],
        "filterServerTable": {},
        "queueDatas": [{"brokerName": "local", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6, "topicSysFlag": 0}],
    }  # fmt: skip
    assert (
        m.topic_route("Brand_New")["queueDatas"][0]["writeQueueNums"] == 4
    )  # auto-creation's route
    assert _manager(now, {}, auto_create=False).topic_route("Brand_New") is None


def test_registered_brokers_expire_and_leave_with_their_connection():
    now = [1_000]
    m = _manager(now, {})
    m.register(BrokerEntry("C2", "b", "10.0.0.2:10911", 0, {"OnB": QueueData(8, 8, 6)}, timeout_ms=10_000,
                           connection_id=7))  # fmt: skip
    m.register(BrokerEntry("C2", "b", "10.0.0.3:10911", 1, {}, connection_id=8))  # its slave
    assert m.cluster_info()["clusterAddrTable"] == {"C2": ["b"], "DefaultCluster": ["local"]}
    assert m.cluster_info()["brokerAddrTable"]["b"]["brokerAddrs"] == {
        "0": "10.0.0.2:10911",
        "1": "10.0.0.3:10911",
    }
    assert [q["brokerName"] for q in m.topic_route("OnB")["queueDatas"]] == [
        "b"
    ]  # the local one lacks it
    assert m.topic_list() == ["OnB"]
    m.connection_closed(8)
    assert m.cluster_info()["brokerAddrTable"]["b"]["brokerAddrs"] == {"0": "10.0.0.2:10911"}
    now[0] += 10_001  # no heartbeat within heartbeatTimeoutMillis
    assert "C2" not in m.cluster_info()["clusterAddrTable"]
    assert (
        m.topic_route("OnB")["queueDatas"][0]["brokerName"] == "local"
    )  # back to auto-creation's route


def test_compressed_registration_body():
    """RegisterBrokerBody.encode(true): deflated DataVersion, topic configs as ``name read write
    perm filterType`` strings, filter servers (what a real 5.5.0 broker sends: tests/interop)."""
    import struct
    import zlib

    import pytest

    def chunk(b: bytes) -> bytes:
        return struct.pack(">i", len(b)) + b

    topics = [b"Orders 8 4 6 SINGLE_TAG", b"%RETRY%g 1 1 6 SINGLE_TAG {}"]
    raw = (
        chunk(b'{"counter":3}')
        + struct.pack(">i", 2)
        + b"".join(map(chunk, topics))
        + chunk(b"[]")
        + struct.pack(">i", 0)
    )
    table = compressed_topic_table(zlib.compress(raw, 9))
    assert table == {"Orders": QueueData(8, 4, 6), "%RETRY%g": QueueData(1, 1, 6)}
    with pytest.raises(RegistrationError, match=r"truncated|runs past"):
        compressed_topic_table(zlib.compress(raw[:30]))
    with pytest.raises(RegistrationError, match="is not valid zlib data"):
        compressed_topic_table(b"not deflated")
