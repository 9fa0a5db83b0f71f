"""What rmq-admin needs of RocketMQ's remoting protocol: requests to a NameServer or a broker over
kept connections, each within a deadline (:class:`rmq_spark.admin.connection.Connection`), the
cluster's brokers (GET_BROKER_CLUSTER_INFO) and a topic's brokers (GET_ROUTEINFO_BY_TOPIC), as
mqadmin finds them.

With ``broker`` (``-b``) and no NameServer, that one broker is the whole cluster.

With an access key and its secret key, every request is signed as Java's ``AclClientRPCHook``
signs it (ext fields ``AccessKey`` and ``Signature``: :func:`rmq_spark.remoting.acl.sign`), as
mqadmin's ``-a``/``-s`` do, for a broker or NameServer with access control on (``--acl``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rmq_spark.admin import fastjson
from rmq_spark.admin.connection import BadAnswer, Closed, Connection, DeadlineExceeded, parse_addr
from rmq_spark.remoting.acl import ACCESS_KEY, SIGNATURE, sign
from rmq_spark.remoting.codes import RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["MAX_TIMEOUT_S", "REMOTING_VERSION", "AdminError", "BrokerRef", "Remote"]

# MQVersion V4_9_8's ordinal: a NameServer answers standard JSON to versions from V4_9_4 on
REMOTING_VERSION = 415
MAX_TIMEOUT_S = 3600.0  # an hour for one request: past it rmq-admin is stuck, not patient


class AdminError(Exception):
    """What went wrong, said plainly (rmq-admin prints it and exits 1)."""


@dataclass(frozen=True)
class BrokerRef:
    cluster: str
    name: str
    addr: str  # the master's (brokerId 0)


def _master(addrs: Any) -> str | None:
    """The master's address of a ``brokerAddrs`` map; None without one that is ``HOST:PORT``."""
    addr: Any = None
    if isinstance(addrs, dict):
        addr = addrs.get("0") or addrs.get(0)
    elif isinstance(addrs, list):  # fastjson's unquoted numeric keys, read as pairs
        addr = next((a for pair in addrs if isinstance(pair, (list, tuple)) and len(pair) == 2
                     for k, a in (pair,) if str(k) == "0"), None)  # fmt: skip
    try:
        parse_addr(addr)
    except (ValueError, AttributeError):
        return None
    return addr


class Remote:
    def __init__(self, namesrv: str | None = None, broker: str | None = None, timeout_s: float = 5.0, *,
                 access_key: str | None = None, secret_key: str | None = None) -> None:  # fmt: skip
        if not namesrv and not broker:
            raise AdminError(
                "give a NameServer (-n HOST:PORT, or NAMESRV_ADDR) or a broker (-b HOST:PORT)"
            )
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= MAX_TIMEOUT_S):
            raise AdminError(
                f"the timeout must be between 0 and {MAX_TIMEOUT_S:g} seconds, not {timeout_s!r}"
            )
        if bool(access_key) != bool(secret_key):
            raise AdminError(
                "an access key and its secret key go together (--access-key and --secret-key)"
            )
        self.namesrv = namesrv.split(";")[0].strip() if namesrv else None
        self.broker = broker
        for addr in (self.namesrv, broker):
            if addr is not None:
                try:
                    parse_addr(addr)
                except ValueError as e:
                    raise AdminError(str(e)) from None
        self.timeout_s = timeout_s
        self.access_key, self.secret_key = access_key or None, secret_key or None
        self.last = (
            ""  # who answered last, and what: names the culprit of an answer that does not read
        )
        self._clients: dict[str, Connection] = {}

    # --- requests -------------------------------------------------------------------------------
    def call(self, addr: str, code: int, fields: dict[str, Any] | None = None, body: bytes = b"",
             ok: tuple[int, ...] | None = (ResponseCode.SUCCESS,)) -> RemotingCommand:  # fmt: skip
        """One request to ``addr``, answered within the timeout; AdminError when it cannot be
        reached, does not answer in time, answers what is no remoting frame, or answers a code not
        in ``ok`` (the remark names the problem; ``ok=None`` takes any answer)."""
        ext = {
            k: str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in (fields or {}).items()
            if v is not None
        }
        if self.access_key is not None and self.secret_key is not None:
            ext[ACCESS_KEY] = self.access_key
            ext[SIGNATURE] = sign(ext, body, self.secret_key)
        cmd = RemotingCommand(int(code), ext, body, version=REMOTING_VERSION)
        self.last = f"{addr} (request {_request_name(code)})"
        try:
            client = self._clients.get(addr)
            if client is None:
                client = self._clients[addr] = Connection(addr, self.timeout_s)
            answer = client.request(cmd)
        except (DeadlineExceeded, BadAnswer, Closed) as e:
            self._clients.pop(addr, None)
            raise AdminError(str(e)) from None
        except (OSError, ValueError) as e:
            self._clients.pop(addr, None)
            raise AdminError(
                f"cannot reach {addr}: {e.strerror or e if isinstance(e, OSError) else e}"
            ) from None
        if ok is not None and answer.code not in ok:
            name = _code_name(answer.code)
            hint = ""
            if answer.code == ResponseCode.NO_PERMISSION and self.access_key is None:
                hint = " (access control is on: give --access-key and --secret-key, or RMQ_ACCESS_KEY and RMQ_SECRET_KEY)"
            raise AdminError(
                f"{addr} answered {name}: {_one_line(answer.remark) or '(no remark)'}{hint}"
            )
        return answer

    def json(
        self, addr: str, code: int, fields: dict[str, Any] | None = None, body: bytes = b""
    ) -> Any:
        answer = self.call(addr, code, fields, body)
        return self.parse(addr, answer) if answer.body else {}

    def parse(self, addr: str, answer: RemotingCommand) -> Any:
        """The answer's body as fastjson writes it; AdminError naming ``addr`` when it does not parse."""
        try:
            return fastjson.loads(answer.body)
        except ValueError as e:
            raise AdminError(
                f"{addr} answered a body that does not parse: {_one_line(str(e))}"
            ) from None

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()

    def __enter__(self) -> Self:
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
            raise AdminError(
                f"topic {topic!r} does not exist (the NameServer {self.namesrv} has no route for it)"
            )
        route = self.parse(self.namesrv, answer)
        out = []
        for b in route.get("brokerDatas") or []:
            addr = _master(b.get("brokerAddrs"))
            if addr:
                out.append(BrokerRef(str(b.get("cluster") or ""), str(b.get("brokerName")), addr))
        if not out:
            raise AdminError(f"topic {topic!r} has no master broker in its route")
        return sorted(out, key=lambda r: r.name)


def _one_line(text: str | None, limit: int = 500) -> str:
    """A server's text for one line of a terminal: no control characters, at most ``limit``."""
    if not text:
        return ""
    flat = "".join(c if c.isprintable() else " " for c in text)
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _request_name(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return str(code)


def _code_name(code: int) -> str:
    try:
        return f"{ResponseCode(code).name} ({code})"
    except ValueError:
        return f"code {code}"
