"""Topics of a RocketMQ cluster (Apache RocketMQ or rmq-broker's remoting port), created on every
broker and read back whole over PULL_MESSAGE, for the sink's tests.

:func:`read_topic` pulls every queue of every broker of the topic's route from its min to its max
offset (parsed with :func:`rmq_spark.store.pulled.records_arrow`) and adds ``brokerName``.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import pyarrow as pa  # noqa: E402

from rmq_spark.cluster import ClusterClient  # noqa: E402
from rmq_spark.remoting.codes import RequestCode  # noqa: E402
from rmq_spark.store.pulled import records_arrow  # noqa: E402

UPDATE_AND_CREATE_TOPIC = 17
PULL_GROUP = "interop-sink-readback"


def broker_addrs(namesrv_addr: str) -> dict[str, str]:
    """Broker name -> master address, from the NameServer's cluster info."""
    with ClusterClient(namesrv_addr) as c:
        answer = c.namesrv_request(RequestCode.GET_BROKER_CLUSTER_INFO)
    text = re.sub(r"([{,])(-?\d+):", r'\1"\2":', answer.body.decode())
    table = json.loads(text)["brokerAddrTable"]
    return {name: b["brokerAddrs"]["0"] for name, b in table.items() if "0" in b["brokerAddrs"]}


def create_topic(namesrv_addr: str, topic: str, queues: int = 4) -> list[str]:
    """The topic with ``queues`` queues on every broker; waits until the route names them all."""
    from rmq_spark.remoting.client import RemotingClient
    from rmq_spark.remoting.command import RemotingCommand

    addrs = broker_addrs(namesrv_addr)
    for addr in addrs.values():
        ext = {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": str(queues),
            "writeQueueNums": str(queues),
            "perm": "6",
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0",
            "order": "false",
        }
        with RemotingClient(addr, 10.0) as rc:
            r = rc.request(RemotingCommand(UPDATE_AND_CREATE_TOPIC, ext))
        if r.code != 0:
            raise RuntimeError(f"UPDATE_AND_CREATE_TOPIC {topic} at {addr}: {r.code} {r.remark}")
    deadline = time.monotonic() + 60
    with ClusterClient(namesrv_addr) as c:
        while True:
            try:
                route = c.route(topic, refresh=True)
                if set(addrs) <= {q.broker_name for q in route.queues}:
                    return sorted(addrs)
            except Exception:  # noqa: BLE001 -- no route yet
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the route of {topic} does not name every broker of {sorted(addrs)}"
                )
            time.sleep(0.3)


def read_topic(namesrv_addr: str, topic: str) -> pa.Table:
    """Every message of ``topic`` on every broker of its route, with a ``brokerName`` column."""
    tables = []
    with ClusterClient(namesrv_addr) as c:
        route = c.route(topic, refresh=True)
        for broker, qid in route.read_queues():
            lo = c.get_min_offset(broker, topic, qid)
            hi = c.get_max_offset(broker, topic, qid)
            offset = lo
            while offset < hi:
                r = c.pull(broker, topic, qid, offset, 1024, PULL_GROUP)
                if not r.found:
                    raise RuntimeError(
                        f"pull of {broker} {topic}/{qid}@{offset} (max {hi}) answered {r.code}"
                    )
                batch = records_arrow(r.body)
                t = pa.Table.from_batches([batch])
                tables.append(
                    t.append_column("brokerName", pa.array([broker] * t.num_rows, pa.string()))
                )
                offset = r.next_begin_offset
    if not tables:
        return pa.table({"msgId": pa.array([], pa.string())})
    return pa.concat_tables(tables)


def wait_count(namesrv_addr: str, topic: str, n: int, timeout_s: float = 60.0) -> pa.Table:
    """:func:`read_topic` once it holds at least ``n`` messages (delayed ones arrive later)."""
    deadline = time.monotonic() + timeout_s
    while True:
        t = read_topic(namesrv_addr, topic)
        if t.num_rows >= n or time.monotonic() > deadline:
            return t
        time.sleep(0.5)
