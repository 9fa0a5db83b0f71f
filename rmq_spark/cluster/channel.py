"""A pull channel: one connection owned by one reader of one queue, PULL_MESSAGE requests written
back to back and their answers read on the caller's own thread (no reader thread, no futures:
what a pipelined read of one queue needs, with the least work per pull).

    with PullChannel(addr, "broker-a", "Orders", 3, "group") as ch:
        a = ch.send(offset=0, max_nums=32)
        b = ch.send(offset=32, max_nums=32)
        ch.result(a)       # PullResult; answers may come in any order, each is kept until asked

The request header is JSON written from a template (topic, group and broker names are RocketMQ
names: no character needs escaping), exactly the fields of :meth:`ClusterClient.pull`; with
``credentials`` each request is signed (:mod:`rmq_spark.cluster.acl`); with ``tls`` the channel
speaks TLS (:mod:`rmq_spark.cluster.tls`).
"""

from __future__ import annotations

import itertools
import json
import socket
from typing import TYPE_CHECKING

from rmq_spark.cluster.acl import Credentials
from rmq_spark.cluster.tls import TlsConfig, open_socket
from rmq_spark.cluster.wire import (
    PULL_CODES,
    BrokerUnreachableError,
    ClusterError,
    PullResult,
    code_name,
)
from rmq_spark.remoting.codes import PullSysFlag, RequestCode, ResponseCode
from rmq_spark.remoting.command import FLAG_RESPONSE, FrameError, decode_frame

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["PullChannel"]

_opaques = itertools.count(1 << 20)
_HEAD = 8  # frame length + serialize type / header length


class PullChannel:
    def __init__(
        self,
        addr: str,
        broker: str,
        topic: str,
        queue_id: int,
        group: str,
        *,
        expression: str = "*",
        expression_type: str = "TAG",
        timeout_s: float = 10.0,
        credentials: Credentials | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.addr, self.broker, self.topic, self.queue_id = addr, broker, topic, queue_id
        self.credentials = credentials
        try:
            self._sock = open_socket(addr, min(timeout_s, 3.0), tls)
        except OSError as e:
            raise BrokerUnreachableError(
                f"PULL_MESSAGE (11) to {broker} at {addr}: cannot connect: {e}",
                broker=broker,
                addr=addr,
                request=RequestCode.PULL_MESSAGE,
            ) from None
        self._sock.settimeout(timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        fixed = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id)}
        tail = {
            "sysFlag": str(int(PullSysFlag.SUBSCRIPTION)),
            "commitOffset": "0",
            "suspendTimeoutMillis": "0",
            "subscription": expression,
            "subVersion": "0",
            "expressionType": expression_type,
            "bname": broker,
        }
        self._fields = {**fixed, **tail}  # signed requests: the whole header, signed per request
        lead = json.dumps(fixed, separators=(",", ":"))[:-1]
        rest = json.dumps(tail, separators=(",", ":"))[1:]
        # {"code":11,"extFields":{...,"queueOffset":"<o>","maxMsgNums":"<n>",...},"flag":0,...,"opaque":<id>,...}
        self._parts = (
            '{"code":11,"extFields":' + lead + ',"queueOffset":"',
            '","maxMsgNums":"',
            '",' + rest + ',"flag":0,"language":"PYTHON","opaque":',
            ',"serializeTypeCurrentRPC":"JSON","version":401}',
        )
        self._sent: dict[int, int] = {}  # opaque -> offset asked
        self._answers: dict[int, PullResult] = {}

    def _fail(self, what: str) -> BrokerUnreachableError:
        self.close()
        return BrokerUnreachableError(
            f"PULL_MESSAGE (11) of {self.topic}/{self.queue_id} to {self.broker} at "
            f"{self.addr}: {what}",
            broker=self.broker,
            addr=self.addr,
            request=RequestCode.PULL_MESSAGE,
        )

    def send(self, offset: int, max_nums: int) -> int:
        """Writes one PULL_MESSAGE; returns its ticket for :meth:`result`."""
        opaque = next(_opaques) & 0x7FFFFFFF
        if self.credentials is not None:
            ext = self.credentials.sign_fields(
                {**self._fields, "queueOffset": str(offset), "maxMsgNums": str(max_nums)}
            )
            header = json.dumps(
                {
                    "code": int(RequestCode.PULL_MESSAGE),
                    "extFields": ext,
                    "flag": 0,
                    "language": "PYTHON",
                    "opaque": opaque,
                    "serializeTypeCurrentRPC": "JSON",
                    "version": 401,
                }
            ).encode()
        else:
            p = self._parts
            header = f"{p[0]}{offset}{p[1]}{max_nums}{p[2]}{opaque}{p[3]}".encode()
        try:
            self._sock.sendall(
                (4 + len(header)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header
            )
        except OSError as e:
            raise self._fail(f"writing failed: {e}") from None
        self._sent[opaque] = offset
        return opaque

    def result(self, ticket: int) -> PullResult:
        """The answer to ``ticket``, reading (and keeping) the answers that come before it."""
        while ticket not in self._answers:
            self._read_one()
        return self._answers.pop(ticket)

    def _read_one(self) -> None:
        try:
            length = int.from_bytes(self._exact(4), "big", signed=True)
            if length < 4:
                raise FrameError(f"frame length {length}")
            cmd = decode_frame(self._exact(length))
        except (OSError, FrameError, ValueError) as e:
            raise self._fail(str(e) or type(e).__name__) from None
        if not cmd.flag & FLAG_RESPONSE or cmd.opaque not in self._sent:
            return  # a request of the broker's, or an answer nobody waits for
        offset = self._sent.pop(cmd.opaque)
        if cmd.code not in PULL_CODES:
            raise ClusterError(
                f"PULL_MESSAGE (11) of {self.topic}/{self.queue_id}@{offset} to {self.broker} at {self.addr} answered "
                f"{code_name(cmd.code, ResponseCode)}: {cmd.remark or '(no remark)'}",
                broker=self.broker,
                addr=self.addr,
                request=RequestCode.PULL_MESSAGE,
                code=cmd.code,
                remark=cmd.remark,
            )
        f = cmd.ext_fields
        self._answers[cmd.opaque] = PullResult(
            cmd.code,
            cmd.body if cmd.code == ResponseCode.SUCCESS else b"",
            int(f.get("nextBeginOffset", offset)),
            int(f.get("minOffset", 0)),
            int(f.get("maxOffset", 0)),
            int(f.get("suggestWhichBrokerId", 0)),
        )

    def _exact(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self._sock.recv_into(view[got:])
            if not k:
                raise ConnectionError("the broker closed the connection")
            got += k
        return buf

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
