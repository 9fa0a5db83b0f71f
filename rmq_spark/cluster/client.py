"""A blocking client of a RocketMQ cluster over the remoting protocol: NameServers, routes, brokers.

    with ClusterClient("127.0.0.1:9876;127.0.0.2:9876") as c:
        route = c.route("Orders")                       # brokers by name, queues, perms
        hi = c.get_max_offset("broker-a", "Orders", 0)
        r = c.pull("broker-a", "Orders", 0, offset=0, max_nums=1024, group="g")
        r.body                                          # CommitLog records, concatenated
        c.send_message("broker-a", "pg", "Orders", 0, b"hi", {"TAGS": "a"})

* NameServers: the ``;``-separated list is tried in turn from the last one that answered
  (Java's ``NettyRemotingClient`` failover); routes are cached until :meth:`route` is asked to
  refresh or a broker of the route is unreachable.
* Brokers: a :class:`~rmq_spark.cluster.connection.ConnectionPool` per client (multiplexed
  connections per address); every call names its broker, whose master address comes from the
  routes (or is given as ``"host:port"`` for a broker no route names).
* Headers are the Java client's, field for field (``PullMessageRequestHeader``,
  ``SendMessageRequestHeaderV2`` with its one-letter names, ...).
* Errors: :class:`ClusterError` names the broker, its address, the request and the response's
  code and remark; :class:`BrokerUnreachableError` (a subclass) when no answer came at all.
* ``credentials``: every request is signed as the Java client's ``AclClientRPCHook`` signs it
  (:mod:`rmq_spark.cluster.acl`); the secret never appears in an error.
* ``tls``: every connection, to NameServers and brokers, speaks TLS (:mod:`rmq_spark.cluster.tls`,
  Java's ``setUseTLS(true)``).
* ``on_request``: the hook for requests a broker sends over our connections
  (``CHECK_TRANSACTION_STATE``); it returns the response to write back, or ``None``.

Why this module is long: one method per request the connector sends, as Java's MQClientAPIImpl has
one each; the encodings, results and errors are in :mod:`rmq_spark.cluster.wire`.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

from rmq_spark.cluster.acl import Credentials
from rmq_spark.cluster.connection import ConnectionPool, ServerRequestHook
from rmq_spark.cluster.routes import TopicRoute, parse_route
from rmq_spark.cluster.tls import TlsConfig
from rmq_spark.cluster.wire import (
    PULL_CODES,
    SEND_STATUS,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    BrokerUnreachableError,
    ClusterError,
    PullResult,
    SendResult,
    code_name,
    encode_batch,
    encode_properties,
    parse_namesrv_addr,
)
from rmq_spark.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from rmq_spark.remoting.command import RemotingCommand

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "BrokerUnreachableError",
    "ClusterClient",
    "ClusterError",
    "PullResult",
    "SendResult",
    "encode_batch",
    "encode_properties",
    "parse_namesrv_addr",
]


# how Apache's ACLs name a refusal in a remark: plain ACL 1.0 answers SYSTEM_ERROR with its
# AclException, 5.x's ACL 2.0 NO_PERMISSION with AuthenticationException / AuthorizationException
_ACL_REFUSAL = re.compile(r"\b(AclException|AuthenticationException|AuthorizationException)\b")


class ClusterClient:
    def __init__(
        self,
        namesrv_addr: str | Sequence[str],
        *,
        timeout_s: float = 10.0,
        pool_size: int = 1,
        on_request: ServerRequestHook | None = None,
        client_id: str | None = None,
        credentials: Credentials | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.namesrv_addrs = (
            parse_namesrv_addr(namesrv_addr)
            if isinstance(namesrv_addr, str)
            else list(namesrv_addr)
        )
        self.timeout_s = timeout_s
        self.client_id = client_id or f"{socket.gethostname()}@{os.getpid()}#{uuid.uuid4().hex[:8]}"
        self.credentials = credentials  # every request signed (AclClientRPCHook) when given
        self.pool = ConnectionPool(
            pool_size,
            min(timeout_s, 3.0),
            on_request,
            credentials.sign if credentials is not None else None,
            tls,
        )
        self.tls = tls  # NameServers and brokers alike (Java's setUseTLS): rmq_spark.cluster.tls
        self._ns_index = 0
        self._routes: dict[str, TopicRoute] = {}
        self._addrs: dict[str, str] = {}  # broker name -> master address, from every route seen
        # broker name -> where reads go: the master, else a slave (the newest route's)
        self._read_addrs: dict[str, str] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------------

    def _call(
        self, addr: str, cmd: RemotingCommand, who: str, timeout_s: float | None = None
    ) -> RemotingCommand:
        code = cmd.code
        try:
            return self.pool.get(addr).request(cmd, timeout_s or self.timeout_s)
        except (OSError, TimeoutError) as e:  # ConnectionError is an OSError
            self.pool.drop_dead(addr)
            raise BrokerUnreachableError(
                f"{code_name(code, RequestCode)} to {who} at {addr} got no answer: {e}",
                broker=who,
                addr=addr,
                request=code,
            ) from None

    @staticmethod
    def _fail(
        answer: RemotingCommand, request: int, who: str, addr: str, what: str = ""
    ) -> ClusterError:
        remark = answer.remark or ""
        hint = (
            " (refused by the broker's access control: check accessKey / secretKey and the "
            "account's permissions)"
            if answer.code == ResponseCode.NO_PERMISSION or _ACL_REFUSAL.search(remark)
            else ""
        )
        return ClusterError(
            f"{code_name(request, RequestCode)}{what} to {who} at {addr} answered "
            f"{code_name(answer.code, ResponseCode)}: {remark or '(no remark)'}{hint}",
            broker=who,
            addr=addr,
            request=request,
            code=answer.code,
            remark=answer.remark,
        )

    def namesrv_request(
        self, code: int, ext: dict[str, str] | None = None, body: bytes = b""
    ) -> RemotingCommand:
        """One request to the NameServers: each in turn from the last that answered."""
        errors = []
        n = len(self.namesrv_addrs)
        for i in range(n):
            idx = (self._ns_index + i) % n
            addr = self.namesrv_addrs[idx]
            try:
                answer = self._call(
                    addr, RemotingCommand(code, dict(ext or {}), body), "NameServer"
                )
            except BrokerUnreachableError as e:
                errors.append(str(e))
                continue
            self._ns_index = idx
            return answer
        raise BrokerUnreachableError(
            f"no NameServer of {';'.join(self.namesrv_addrs)} answered "
            f"{code_name(code, RequestCode)}: {'; '.join(errors)}",
            request=code,
        )

    # -- routes ---------------------------------------------------------------------------------

    def route(self, topic: str, refresh: bool = False) -> TopicRoute:
        """The topic's route (GET_ROUTEINFO_BY_TOPIC), cached unless ``refresh``."""
        if not refresh:
            r = self._routes.get(topic)
            if r is not None:
                return r
        req = RequestCode.GET_ROUTEINFO_BY_TOPIC
        answer = self.namesrv_request(req, {"topic": topic, "acceptStandardJsonOnly": "true"})
        if answer.code != ResponseCode.SUCCESS:
            raise ClusterError(
                f"the NameServers ({';'.join(self.namesrv_addrs)}) know no route of topic {topic!r}: "
                f"{code_name(answer.code, ResponseCode)}: {answer.remark or ''}",
                request=req,
                code=answer.code,
                remark=answer.remark,
            )
        route = parse_route(topic, answer.body)
        with self._lock:
            self._routes[topic] = route
            for b in route.brokers.values():
                if b.master:
                    self._addrs[b.name] = b.master
                else:  # a broker group whose master is down: writes wait, reads go to a slave
                    self._addrs.pop(b.name, None)
                if b.read_addr:
                    self._read_addrs[b.name] = b.read_addr
        return route

    def routes(self, topics: Iterable[str], refresh: bool = False) -> dict[str, TopicRoute]:
        return {t: self.route(t, refresh) for t in topics}

    def topics(self) -> list[str]:
        """Every topic the NameServers know (GET_ALL_TOPIC_LIST_FROM_NAMESERVER)."""
        answer = self.namesrv_request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        if answer.code != ResponseCode.SUCCESS:
            raise ClusterError(
                f"GET_ALL_TOPIC_LIST_FROM_NAMESERVER answered {answer.code}: {answer.remark}",
                request=RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
                code=answer.code,
            )
        return sorted(json.loads(answer.body or b"{}").get("topicList") or [])

    def broker_addr(self, broker: str, topic: str | None = None) -> str:
        """The master address of ``broker`` (a name from the routes, or ``host:port`` itself)."""
        addr = self._addrs.get(broker)
        if addr is None and topic is not None:
            known = self.route(topic, refresh=True).brokers.get(broker, None) is not None
            addr = self._addrs.get(broker) if known else None
        if addr is None:
            if ":" in broker:
                return broker
            raise BrokerUnreachableError(
                f"broker {broker!r} has no master in the routes the NameServers "
                f"({';'.join(self.namesrv_addrs)}) gave"
                + (f" for topic {topic!r}" if topic else ""),
                broker=broker,
            )
        return addr

    def read_addr(self, broker: str, topic: str | None = None) -> str:
        """Where reads of ``broker`` go: its master, or while the broker group has none (its
        master down) one of its slaves, which hold what the master replicated to them."""
        addr = self._read_addrs.get(broker)
        if addr is None and topic is not None:
            self.route(topic, refresh=True)
            addr = self._read_addrs.get(broker)
        if addr is None:
            if ":" in broker:
                return broker
            raise BrokerUnreachableError(
                f"broker {broker!r} has neither master nor slave in the routes the NameServers "
                f"({';'.join(self.namesrv_addrs)}) gave"
                + (f" for topic {topic!r}" if topic else ""),
                broker=broker,
            )
        return addr

    def reads_from_slave(self, broker: str) -> bool:
        """Whether reads of ``broker`` go to a slave now (its master is not in the routes)."""
        addr = self._read_addrs.get(broker)
        return addr is not None and addr != self._addrs.get(broker)

    def broker_addr_or_none(self, broker: str) -> str | None:
        """The master address known for ``broker`` (no NameServer asked)."""
        return self._addrs.get(broker)

    def forget_broker(self, broker: str) -> None:
        """Drop what is known of ``broker`` (after it failed): its addresses are asked again."""
        with self._lock:
            addrs = {self._addrs.pop(broker, None), self._read_addrs.pop(broker, None)}
            self._routes = {t: r for t, r in self._routes.items() if broker not in r.brokers}
        for addr in addrs - {None}:
            self.pool.drop_dead(addr)  # type: ignore[arg-type]

    def invoke(
        self,
        broker: str,
        code: int,
        ext: dict[str, str],
        body: bytes = b"",
        *,
        topic: str | None = None,
        ok: Iterable[int] = (ResponseCode.SUCCESS,),
        timeout_s: float | None = None,
        what: str = "",
        read: bool = False,
    ) -> RemotingCommand:
        """One request to ``broker``'s master (``read``: its master or, while it has none, a
        slave); its answer, or :class:`ClusterError`."""
        addr = self.read_addr(broker, topic) if read else self.broker_addr(broker, topic)
        try:
            answer = self._call(addr, RemotingCommand(code, ext, body), broker, timeout_s)
        except BrokerUnreachableError:
            self.forget_broker(broker)
            raise
        if answer.code not in set(ok):
            raise self._fail(answer, code, broker, addr, what)
        return answer

    # -- reads ----------------------------------------------------------------------------------

    def _pull_command(
        self,
        broker: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        group: str,
        expression: str,
        expression_type: str,
        sys_flag: int,
        suspend_ms: int,
        max_bytes: int | None,
    ) -> RemotingCommand:
        ext = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": str(queue_id),
            "queueOffset": str(offset),
            "maxMsgNums": str(max_nums),
            "sysFlag": str(int(sys_flag)),
            "commitOffset": "0",
            "suspendTimeoutMillis": str(suspend_ms),
            "subscription": expression,
            "subVersion": "0",
            "expressionType": expression_type,
            "bname": broker,
        }
        if max_bytes is not None:
            ext["maxMsgBytes"] = str(max_bytes)
        return RemotingCommand(RequestCode.PULL_MESSAGE, ext)

    def _pull_result(
        self,
        answer: RemotingCommand,
        broker: str,
        addr: str,
        topic: str,
        queue_id: int,
        offset: int,
    ) -> PullResult:
        if answer.code not in PULL_CODES:
            raise self._fail(
                answer, RequestCode.PULL_MESSAGE, broker, addr, f" of {topic}/{queue_id}@{offset}"
            )
        f = answer.ext_fields
        return PullResult(
            answer.code,
            answer.body if answer.code == ResponseCode.SUCCESS else b"",
            int(f.get("nextBeginOffset", offset)),
            int(f.get("minOffset", 0)),
            int(f.get("maxOffset", 0)),
            int(f.get("suggestWhichBrokerId", 0)),
        )

    def pull(
        self,
        broker: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        group: str,
        *,
        expression: str = "*",
        expression_type: str = "TAG",
        sys_flag: int = PullSysFlag.SUBSCRIPTION,
        suspend_ms: int = 0,
        max_bytes: int | None = None,
        timeout_s: float | None = None,
    ) -> PullResult:
        """PULL_MESSAGE: up to ``max_nums`` messages of one queue from ``offset``, filtered by the
        broker with the subscription expression (``sys_flag`` has SUBSCRIPTION by default)."""
        cmd = self._pull_command(
            broker,
            topic,
            queue_id,
            offset,
            max_nums,
            group,
            expression,
            expression_type,
            sys_flag,
            suspend_ms,
            max_bytes,
        )
        addr = self.read_addr(broker, topic)
        t = timeout_s or max(self.timeout_s, suspend_ms / 1000 + 5)
        try:
            answer = self._call(addr, cmd, broker, t)
        except BrokerUnreachableError:
            self.forget_broker(broker)
            raise
        return self._pull_result(answer, broker, addr, topic, queue_id, offset)

    def pull_async(
        self,
        broker: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        group: str,
        *,
        expression: str = "*",
        expression_type: str = "TAG",
        sys_flag: int = PullSysFlag.SUBSCRIPTION,
    ) -> Callable[[float | None], PullResult]:
        """PULL_MESSAGE sent now; returns ``wait(timeout_s)`` giving its :class:`PullResult` (or
        raising as :meth:`pull`), so that many pulls can be in flight on one connection."""
        cmd = self._pull_command(
            broker,
            topic,
            queue_id,
            offset,
            max_nums,
            group,
            expression,
            expression_type,
            sys_flag,
            0,
            None,
        )
        addr = self.read_addr(broker, topic)
        code = RequestCode.PULL_MESSAGE
        try:
            fut = self.pool.get(addr).submit(cmd)
        except OSError as e:
            self.pool.drop_dead(addr)
            self.forget_broker(broker)
            raise BrokerUnreachableError(
                f"PULL_MESSAGE (11) to {broker} at {addr} got no answer: {e}",
                broker=broker,
                addr=addr,
                request=code,
            ) from None

        def wait(timeout_s: float | None = None) -> PullResult:
            try:
                answer = fut.result(timeout_s or self.timeout_s)
            except (OSError, FutureTimeout) as e:
                fut.cancel()
                self.pool.drop_dead(addr)
                self.forget_broker(broker)
                raise BrokerUnreachableError(
                    f"PULL_MESSAGE (11) to {broker} at {addr} got no answer: {e or 'timeout'}",
                    broker=broker,
                    addr=addr,
                    request=code,
                ) from None
            return self._pull_result(answer, broker, addr, topic, queue_id, offset)

        return wait

    def _offset_call(
        self, code: int, broker: str, topic: str, queue_id: int, extra: dict[str, str] | None = None
    ) -> int:
        ext = {"topic": topic, "queueId": str(queue_id), "bname": broker, **(extra or {})}
        answer = self.invoke(
            broker, code, ext, topic=topic, what=f" of {topic}/{queue_id}", read=True
        )
        return int(answer.ext_fields.get("offset", 0))

    def get_max_offset(self, broker: str, topic: str, queue_id: int) -> int:
        """The queue's next offset to be written (GET_MAX_OFFSET)."""
        return self._offset_call(RequestCode.GET_MAX_OFFSET, broker, topic, queue_id)

    def get_min_offset(self, broker: str, topic: str, queue_id: int) -> int:
        """The queue's first offset still stored (GET_MIN_OFFSET)."""
        return self._offset_call(RequestCode.GET_MIN_OFFSET, broker, topic, queue_id)

    def search_offset(
        self, broker: str, topic: str, queue_id: int, timestamp_ms: int, boundary: str = "lower"
    ) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP: the first offset stored at or after ``timestamp_ms``
        (``boundary="lower"``; RocketMQ 5's ``BoundaryType``, ignored by 4.x)."""
        return self._offset_call(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            broker,
            topic,
            queue_id,
            {"timestamp": str(int(timestamp_ms)), "boundaryType": boundary.upper()},
        )

    def query_consumer_offset(
        self, broker: str, group: str, topic: str, queue_id: int
    ) -> int | None:
        """The group's committed offset of a queue, or None when it has none (QUERY_NOT_FOUND, or
        SUBSCRIPTION_GROUP_NOT_EXIST: a group the broker does not know has committed nothing)."""
        ext = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": str(queue_id),
            "setZeroIfNotFound": "false",
            "bname": broker,
        }
        none = (ResponseCode.QUERY_NOT_FOUND, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST)
        answer = self.invoke(
            broker,
            RequestCode.QUERY_CONSUMER_OFFSET,
            ext,
            topic=topic,
            ok=(ResponseCode.SUCCESS, *none),
            what=f" of {group} on {topic}/{queue_id}",
            read=True,  # a slave holds the offsets its master synchronised to it
        )
        if answer.code in none:
            return None
        return int(answer.ext_fields.get("offset", 0))

    def update_consumer_offset(
        self, broker: str, group: str, topic: str, queue_id: int, offset: int
    ) -> None:
        """UPDATE_CONSUMER_OFFSET (what ``mqadmin consumerProgress`` reports the lag from)."""
        ext = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": str(queue_id),
            "commitOffset": str(int(offset)),
            "bname": broker,
        }
        self.invoke(
            broker,
            RequestCode.UPDATE_CONSUMER_OFFSET,
            ext,
            topic=topic,
            what=f" of {group} on {topic}/{queue_id}",
        )

    # -- writes ---------------------------------------------------------------------------------

    def _send_header(
        self,
        broker: str,
        group: str,
        topic: str,
        queue_id: int,
        props: Mapping[str, str],
        sys_flag: int,
        flag: int,
        reconsume_times: int,
        batch: bool,
        queue_nums: int,
    ) -> dict[str, str]:
        # SendMessageRequestHeaderV2: a producerGroup, b topic, c defaultTopic, d defaultTopicQueueNums,
        # e queueId, f sysFlag, g bornTimestamp, h flag, i properties, j reconsumeTimes, k unitMode,
        # l maxReconsumeTimes, m batch, n brokerName
        return {
            "a": group,
            "b": topic,
            "c": "TBW102",
            "d": str(queue_nums),
            "e": str(queue_id),
            "f": str(sys_flag),
            "g": str(int(time.time() * 1000)),
            "h": str(flag),
            "i": encode_properties(props),
            "j": str(reconsume_times),
            "k": "false",
            "m": str(batch).lower(),
            "n": broker,
        }

    def _send_result(
        self, answer: RemotingCommand, broker: str, props: Mapping[str, str]
    ) -> SendResult:
        f = answer.ext_fields
        offset_id = f.get("msgId", "")
        return SendResult(
            SEND_STATUS[ResponseCode(answer.code)],
            props.get("UNIQ_KEY") or offset_id,
            offset_id,
            broker,
            int(f.get("queueId", -1)),
            int(f.get("queueOffset", -1)),
            f.get("transactionId"),
        )

    def send_message(
        self,
        broker: str,
        group: str,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: Mapping[str, str] | None = None,
        *,
        sys_flag: int = 0,
        flag: int = 0,
        reconsume_times: int = 0,
        queue_nums: int = 4,
        timeout_s: float | None = None,
    ) -> SendResult:
        """SEND_MESSAGE_V2 of one message to ``broker``'s queue ``queue_id``."""
        props = dict(properties or {})
        ext = self._send_header(
            broker,
            group,
            topic,
            queue_id,
            props,
            sys_flag,
            flag,
            reconsume_times,
            False,
            queue_nums,
        )
        answer = self.invoke(
            broker,
            RequestCode.SEND_MESSAGE_V2,
            ext,
            body,
            topic=topic,
            ok=SEND_STATUS,
            timeout_s=timeout_s,
            what=f" to {topic}/{queue_id}",
        )
        return self._send_result(answer, broker, props)

    def send_batch(
        self,
        broker: str,
        group: str,
        topic: str,
        queue_id: int,
        messages: Sequence[tuple[bytes, Mapping[str, str], int]],
        *,
        queue_nums: int = 4,
        timeout_s: float | None = None,
    ) -> SendResult:
        """SEND_BATCH_MESSAGE: ``messages`` as (body, properties, flag), stored in order in one
        queue.  ``msg_id``/``offset_msg_id`` are comma lists; ``queue_offset`` is the first's."""
        ext = self._send_header(broker, group, topic, queue_id, {}, 0, 0, 0, True, queue_nums)
        answer = self.invoke(
            broker,
            RequestCode.SEND_BATCH_MESSAGE,
            ext,
            encode_batch(messages),
            topic=topic,
            ok=SEND_STATUS,
            timeout_s=timeout_s,
            what=f" of {len(messages)} to {topic}/{queue_id}",
        )
        uniq = ",".join(p.get("UNIQ_KEY", "") for _, p, _ in messages)
        return self._send_result(answer, broker, {"UNIQ_KEY": uniq} if uniq.strip(",") else {})

    def end_transaction(
        self,
        broker: str,
        group: str,
        *,
        tran_state_table_offset: int,
        commit_log_offset: int,
        commit: bool | None,
        msg_id: str,
        transaction_id: str | None,
        from_check: bool = False,
    ) -> None:
        """END_TRANSACTION (oneway, as the Java producer sends it): commit (True), roll back
        (False) or leave unknown (None) the half message at ``commit_log_offset``."""
        kind = (
            TRANSACTION_NOT_TYPE
            if commit is None
            else TRANSACTION_COMMIT_TYPE
            if commit
            else TRANSACTION_ROLLBACK_TYPE
        )
        ext = {
            "producerGroup": group,
            "tranStateTableOffset": str(tran_state_table_offset),
            "commitLogOffset": str(commit_log_offset),
            "commitOrRollback": str(kind),
            "fromTransactionCheck": str(from_check).lower(),
            "msgId": msg_id,
            "bname": broker,
        }
        if transaction_id:
            ext["transactionId"] = transaction_id
        addr = self.broker_addr(broker)
        try:
            self.pool.get(addr).oneway(RemotingCommand(RequestCode.END_TRANSACTION, ext))
        except OSError as e:
            raise BrokerUnreachableError(
                f"END_TRANSACTION to {broker} at {addr} failed: {e}",
                broker=broker,
                addr=addr,
                request=RequestCode.END_TRANSACTION,
            ) from None

    def create_topic(
        self, broker: str, topic: str, queues: int = 4, *, perm: int = 6, order: bool = False
    ) -> None:
        """UPDATE_AND_CREATE_TOPIC on one broker (``broker`` a name from the routes or ``host:port``):
        what ``mqadmin updateTopic -b`` sends."""
        ext = {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": str(queues),
            "writeQueueNums": str(queues),
            "perm": str(perm),
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0",
            "order": str(order).lower(),
        }
        if broker not in self._addrs and ":" not in broker:
            self.cluster_brokers()  # a broker no route names yet: the cluster's list knows it
        self.invoke(broker, RequestCode.UPDATE_AND_CREATE_TOPIC, ext, what=f" of {topic}")

    def cluster_brokers(self) -> dict[str, str]:
        """Broker name -> master address of every broker the NameServers list
        (GET_BROKER_CLUSTER_INFO)."""
        answer = self.namesrv_request(RequestCode.GET_BROKER_CLUSTER_INFO)
        if answer.code != ResponseCode.SUCCESS:
            raise ClusterError(
                f"GET_BROKER_CLUSTER_INFO answered {answer.code}: {answer.remark}",
                request=RequestCode.GET_BROKER_CLUSTER_INFO,
                code=answer.code,
            )
        text = re.sub(r"([{,])\s*(-?\d+)\s*:", r'\1"\2":', answer.body.decode())
        table = json.loads(text).get("brokerAddrTable") or {}
        out = {name: (b.get("brokerAddrs") or {}).get("0") for name, b in table.items()}
        with self._lock:
            self._addrs.update({n: a for n, a in out.items() if a})
        return {n: a for n, a in out.items() if a}

    def heartbeat(
        self,
        broker: str,
        *,
        producer_groups: Iterable[str] = (),
        consumers: Iterable[Mapping[str, object]] = (),
    ) -> None:
        """HEART_BEAT to ``broker``: registers this client's producer groups (so the broker sends
        CHECK_TRANSACTION_STATE over our connection) and consumer data."""
        body = json.dumps(
            {
                "clientID": self.client_id,
                "producerDataSet": [{"groupName": g} for g in producer_groups],
                "consumerDataSet": list(consumers),
            }
        ).encode()
        self.invoke(broker, RequestCode.HEART_BEAT, {}, body)
