"""Access control over remoting (``--acl``): RocketMQ 4.x's plain ACL, as the Java clients'
``AclClientRPCHook`` signs requests.

Authentication: a request carries ext fields ``AccessKey`` and ``Signature`` (and optionally
``SecurityToken``).  The signature is ``Base64(HmacSHA1(secretKey, content))`` where content is
the values of every other ext field, in the order of their sorted names, concatenated as UTF-8,
then the body (``AclUtils.combineRequestContent``, ``PlainAccessValidator.parse``).

Authorization uses the gRPC side's accounts (``broker/auth.py``): per request code, the topic and
consumer group it touches (``PlainAccessResource.parse``): sends need PUB on the topic (a retry
topic: the group's permission), pulls, offsets and queries SUB on the topic and the group,
heartbeats SUB on each group and subscribed topic; topic creation needs an admin account; other
requests only a valid signature.  A refusal is answered ``NO_PERMISSION`` naming the reason.

The account table is duck-typed (this layer sits below the broker): ``accounts`` maps an access
key to an object with ``secret_key``, ``admin``, ``topic_perm(topic)`` and ``group_perm(group)``,
the permissions being flags whose value has bit 0 for PUB and bit 1 for SUB.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable
from typing import Any

from rmq_spark.remoting.codes import RequestCode as R
from rmq_spark.remoting.codes import ResponseCode
from rmq_spark.remoting.command import RemotingCommand
from rmq_spark.store import layout as L

__all__ = ["ACCESS_KEY", "SIGNATURE", "RemotingAcl", "sign"]

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
PUB, SUB = 1, 2
_ADMIN_CODES = frozenset((R.UPDATE_AND_CREATE_TOPIC,))


def sign(ext_fields: dict[str, str], body: bytes, secret_key: str) -> str:
    """The signature of a request with these ext fields (``Signature`` itself left out)."""
    content = "".join(v for k, v in sorted(ext_fields.items()) if k != SIGNATURE and v is not None).encode()
    digest = hmac.new(secret_key.encode(), content + (body or b""), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


class _Denied(Exception):
    pass


class RemotingAcl:
    def __init__(self, access_control: Any) -> None:
        self.access_control = access_control

    def __call__(self, conn: Any, req: RemotingCommand) -> RemotingCommand | None:
        """None when ``req`` may go on, else the NO_PERMISSION answer."""
        try:
            account = self._authenticate(req)
            if not account.admin:
                self._authorize(account, req)
        except _Denied as e:
            return req.response(ResponseCode.NO_PERMISSION, str(e))
        return None

    def _authenticate(self, req: RemotingCommand) -> Any:
        ext = req.ext_fields
        ak, signature = ext.get(ACCESS_KEY), ext.get(SIGNATURE)
        if not ak or not signature:
            raise _Denied("the request is not signed (AccessKey and Signature are missing): access control is on")
        account = self.access_control.accounts.get(ak)
        if account is None:
            raise _Denied(f"No acl config for {ak[:64]}")
        if not hmac.compare_digest(sign(ext, req.body, account.secret_key), signature):
            raise _Denied(f"Check signature failed for accessKey={ak}")
        return account

    def _authorize(self, account: Any, req: RemotingCommand) -> None:
        ext, code = req.ext_fields, req.code
        topic_need: list[tuple[str, int]] = []
        groups: list[str] = []
        if code in (R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE):
            topic = ext.get("topic" if code == R.SEND_MESSAGE else "b", "")
            if topic.startswith(L.RETRY_GROUP_TOPIC_PREFIX):  # a consumer's send-back by its producer
                groups.append(topic[len(L.RETRY_GROUP_TOPIC_PREFIX) :])
            else:
                topic_need.append((topic, PUB))
        elif code == R.CONSUMER_SEND_MSG_BACK:
            groups.append(ext.get("group", ""))
            if ext.get("originTopic"):
                topic_need.append((ext["originTopic"], SUB))
        elif code in (R.PULL_MESSAGE, R.LITE_PULL_MESSAGE, R.QUERY_CONSUMER_OFFSET, R.UPDATE_CONSUMER_OFFSET):
            groups.append(ext.get("consumerGroup", ""))
            topic_need.append((ext.get("topic", ""), SUB))
        elif code == R.QUERY_MESSAGE:
            topic_need.append((ext.get("topic", ""), SUB))
        elif code in (R.GET_CONSUMER_LIST_BY_GROUP, R.UNREGISTER_CLIENT):
            if ext.get("consumerGroup"):
                groups.append(ext["consumerGroup"])
        elif code == R.HEART_BEAT:
            for c in _heartbeat_consumers(req.body):
                groups.append(str(c.get("groupName") or ""))
                for s in c.get("subscriptionDataSet") or []:
                    topic = str((s or {}).get("topic") or "")
                    if topic and not topic.startswith(L.RETRY_GROUP_TOPIC_PREFIX):
                        topic_need.append((topic, SUB))
        elif code in _ADMIN_CODES:
            raise _Denied(f"accessKey {account.access_key} is not an admin: request {code} needs one")
        for topic, need in topic_need:
            if topic.startswith((L.RETRY_GROUP_TOPIC_PREFIX, L.DLQ_GROUP_TOPIC_PREFIX)):
                continue
            _require(account.topic_perm(topic), need, lambda: f"No {_verb(need)} permission for topic {topic} "
                                                              f"(accessKey {account.access_key})")  # fmt: skip
        for group in groups:
            _require(account.group_perm(group), SUB, lambda: f"No permission for group {group} "
                                                            f"(accessKey {account.access_key})")  # fmt: skip


def _require(have: Any, need: int, why: Callable[[], str]) -> None:
    value = int(getattr(have, "value", have))
    if value & need != need:
        raise _Denied(why())


def _verb(need: int) -> str:
    return "PUB" if need == PUB else "SUB"


def _heartbeat_consumers(body: bytes) -> list[dict[str, Any]]:
    try:
        doc = json.loads(body)
    except ValueError:
        return []
    consumers = doc.get("consumerDataSet") if isinstance(doc, dict) else None
    return [c for c in consumers or [] if isinstance(c, dict)]
