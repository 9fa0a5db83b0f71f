"""What rmq-admin needs of RocketMQ's remoting protocol: requests to a NameServer or a broker over
kept connections (:class:`rmq_spark.remoting.client.RemotingClient`), the cluster's brokers
(GET_BROKER_CLUSTER_INFO) and a topic's brokers (GET_ROUTEINFO_BY_TOPIC), as mqadmin finds them.

With ``broker`` (``-b``) and no NameServer, that one broker is the whole cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rmq_spark.admin import fastjson
from rmq_spark.remoting.client import RemotingClient
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import FrameError, RemotingCommand

__all__ = ["AdminError", "BrokerRef", "Remote", "REMOTING_VERSION"]

# MQVersion V4_9_8's ordinal: a NameServer answers standard JSON to versions from V4_9_4 on
REMOTING_VERSION = 415


class AdminError(Exception):
    """What went wrong, said plainly (rmq-admin prints it and exits 1)."""


@dataclass(frozen=True)
class BrokerRef:
    cluster: str
    name: str
    addr: str  # the master's (brokerId 0)


def _master(addrs: Any) -> str | None:
    if isinstance(addrs, dict):
        return addrs.get("0") or addrs.get(0)  # type: ignore[no-any-return]
    if isinstance(addrs, list):  # fastjson's unquoted numeric keys, read as pairs
        return next((a for k, a in addrs if str(k) == "0"), None)
    return None


class Remote:
    def __init__(self, namesrv: str | None = None, broker: str | None = None, timeout_s: float = 5.0) -> None:
        if not namesrv and not broker:
            raise AdminError("give a NameServer (-n HOST:PORT, or NAMESRV_ADDR) or a broker (-b HOST:PORT)")
        self.namesrv = namesrv.split(";")[0].strip() if namesrv else None
        self.broker = broker
        self.timeout_s = timeout_s
        self._clients: dict[str, RemotingClient] = {}

    # --- requests -------------------------------------------------------------------------------
    def call(self, addr: str, code: int, fields: dict[str, Any] | None = None, body: bytes = b"",
             ok: tuple[int, ...] | None = (ResponseCode.SUCCESS,)) -> RemotingCommand:  # fmt: skip
        """One request to ``addr``; AdminError when it cannot be reached or answers a code not in
        ``ok`` (the remark names the problem; ``ok=None`` takes any answer)."""
        ext = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in (fields or {}).items() if v is not None}
        cmd = RemotingCommand(int(code), ext, body, version=REMOTING_VERSION)
        try:
            client = self._clients.get(addr)
            if client is None:
                client = self._clients[addr] = RemotingClient(addr, self.timeout_s)
            answer = client.request(cmd)
        except (OSError, FrameError, ValueError) as e:
            dead = self._clients.pop(addr, None)
            if dead is not None:
                dead.close()
            raise AdminError(f"cannot reach {addr}: {e or type(e).__name__}") from None
        if ok is not None and answer.code not in ok:
            name = _code_name(answer.code)
            raise AdminError(f"{addr} answered {name}: {answer.remark or '(no remark)'}")
        return answer

    def json(self, addr: str, code: int, fields: dict[str, Any] | None = None, body: bytes = b"") -> Any:
        answer = self.call(addr, code, fields, body)
        if not answer.body:
            return {}
        try:
            return fastjson.loads(answer.body)
        except ValueError as e:
            raise AdminError(f"{addr} answered a body that does not parse: {e}") from None

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the cluster ----------------------------------------------------------------------------
    def brokers(self, cluster: str | None = None) -> list[BrokerRef]:
        """Every master broker (of ``cluster`` when given), by name."""
        if self.namesrv is None:
            assert self.broker is not None
            return [BrokerRef(cluster or "", self.broker_name(self.broker), self.broker)]
        info = self.json(self.namesrv, RequestCode.GET_BROKER_CLUSTER_INFO)
        table = info.get("brokerAddrTable") or {}
        out = []
        for name, data in sorted(table.items()):
            addr = _master(data.get("brokerAddrs"))
            if addr and (cluster is None or data.get("cluster") == cluster):
                out.append(BrokerRef(str(data.get("cluster") or ""), name, addr))
        if cluster is not None and not out:
            raise AdminError(f"the NameServer {self.namesrv} knows no cluster {cluster!r}")
        if not out:
            raise AdminError(f"the NameServer {self.namesrv} knows no broker")
        return out

    def broker_name(self, addr: str) -> str:
        table = self.json(addr, RequestCode.GET_BROKER_RUNTIME_INFO).get("table") or {}
        return str(table.get("brokerName") or addr)

    def topic_brokers(self, topic: str) -> list[BrokerRef]:
        """The master brokers holding ``topic`` (its route); AdminError when it has none."""
        if self.namesrv is None:
            return self.brokers()
        answer = self.call(self.namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic},
                           ok=(ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST))  # fmt: skip
        if answer.code != ResponseCode.SUCCESS or not answer.body:
            raise AdminError(f"topic {topic!r} does not exist (the NameServer {self.namesrv} has no route for it)")
        route = fastjson.loads(answer.body)
        out = []
        for b in route.get("brokerDatas") or []:
            addr = _master(b.get("brokerAddrs"))
            if addr:
                out.append(BrokerRef(str(b.get("cluster") or ""), str(b.get("brokerName")), addr))
        if not out:
            raise AdminError(f"topic {topic!r} has no master broker in its route")
        return sorted(out, key=lambda r: r.name)


def _code_name(code: int) -> str:
    try:
        return f"{ResponseCode(code).name} ({code})"
    except ValueError:
        return f"code {code}"
