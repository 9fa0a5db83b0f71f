"""Access control (off unless ``--acl FILE`` is given): who may publish to or subscribe from what.

Authentication: every request carries ``authorization: MQv2-HMAC-SHA1 Credential=<ak>,
SignedHeaders=x-mq-date-time, Signature=<hex>`` where the signature is HMAC-SHA1 of the
``x-mq-date-time`` header under the account's secret (the official clients compute it in
``util/signature.py`` / ``Signature.ts``; hex case does not matter).  A missing, malformed or wrong
signature, or an unknown access key, gets UNAUTHORIZED (40100).  The date is not checked against
the broker's clock: the Python client sends its local time with a ``Z`` suffix.

Authorization (as RocketMQ 4.x's plain ACL): each account has permissions per topic and per
consumer group — ``DENY``, ``PUB``, ``SUB`` or ``PUB|SUB`` — and defaults for the rest; ``admin``
accounts may do everything.  A request without the permission gets FORBIDDEN (40300).

The ACL file is JSON::

    {"accounts": [
        {"accessKey": "ak", "secretKey": "sk", "admin": false,
         "defaultTopicPerm": "DENY", "defaultGroupPerm": "SUB",
         "topicPerms": ["orders=PUB|SUB", "audit=PUB"],     (or {"orders": "PUB|SUB"})
         "groupPerms": ["billing=SUB"]}
    ]}
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rmq_spark.broker.codes import Code, RpcStatusError
from rmq_spark.errors import ConfigError
from rmq_spark.store import layout as L

__all__ = ["Perm", "Account", "AccessControl", "AUTHORIZATION", "DATE_TIME"]

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"


class Perm(enum.Flag):
    DENY = 0
    PUB = 1
    SUB = 2

    @classmethod
    def parse(cls, text: str) -> Perm:
        perm = cls.DENY
        for part in str(text).upper().replace(" ", "").split("|"):
            if part not in ("DENY", "PUB", "SUB"):
                raise ConfigError(f"permission {text!r}: each part must be DENY, PUB or SUB")
            perm |= cls[part]
        return perm


@dataclass
class Account:
    access_key: str
    secret_key: str
    admin: bool = False
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.SUB
    topic_perms: dict[str, Perm] = field(default_factory=dict)
    group_perms: dict[str, Perm] = field(default_factory=dict)

    def topic_perm(self, topic: str) -> Perm:
        return self.topic_perms.get(topic, self.default_topic_perm)

    def group_perm(self, group: str) -> Perm:
        return self.group_perms.get(group, self.default_group_perm)


def _perm_table(value: Any, what: str) -> dict[str, Perm]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): Perm.parse(v) for k, v in value.items()}
    if isinstance(value, list):
        out = {}
        for item in value:
            name, sep, perm = str(item).partition("=")
            if not sep or not name.strip():
                raise ConfigError(f"{what} entry {item!r} is not NAME=PERM")
            out[name.strip()] = Perm.parse(perm)
        return out
    raise ConfigError(f"{what} must be a list of NAME=PERM or an object")


class AccessControl:
    def __init__(self, accounts: list[Account]) -> None:
        self.accounts = {a.access_key: a for a in accounts}

    @classmethod
    def load(cls, path: str) -> AccessControl:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as e:
            raise ConfigError(f"ACL file {path}: {e.strerror or e}") from None
        except ValueError as e:
            raise ConfigError(f"ACL file {path} is not valid JSON: {e}") from None
        return cls.from_dict(data, path)

    @classmethod
    def from_dict(cls, data: Any, source: str = "ACL") -> AccessControl:
        if not isinstance(data, Mapping) or not isinstance(data.get("accounts"), list):
            raise ConfigError(f"{source}: expected an object with a list 'accounts'")
        accounts = []
        for i, a in enumerate(data["accounts"]):
            if not isinstance(a, Mapping) or not a.get("accessKey") or not a.get("secretKey"):
                raise ConfigError(f"{source}: account {i} needs accessKey and secretKey")
            accounts.append(
                Account(
                    access_key=str(a["accessKey"]),
                    secret_key=str(a["secretKey"]),
                    admin=bool(a.get("admin", False)),
                    default_topic_perm=Perm.parse(a.get("defaultTopicPerm", "DENY")),
                    default_group_perm=Perm.parse(a.get("defaultGroupPerm", "SUB")),
                    topic_perms=_perm_table(a.get("topicPerms"), f"{source}: account {i} topicPerms"),
                    group_perms=_perm_table(a.get("groupPerms"), f"{source}: account {i} groupPerms"),
                )
            )
        if len({a.access_key for a in accounts}) != len(accounts):
            raise ConfigError(f"{source}: access keys must be unique")
        return cls(accounts)

    def authenticate(self, metadata: Mapping[str, str]) -> Account:
        header = metadata.get(AUTHORIZATION, "")
        date = metadata.get(DATE_TIME, "")
        algo, _, rest = header.partition(" ")
        if algo != ALGORITHM or not date:
            raise RpcStatusError(Code.UNAUTHORIZED, "request is not signed (authorization header missing)")
        fields: dict[str, str] = {}
        for part in rest.split(","):
            k, sep, v = part.strip().partition("=")
            if sep:
                fields[k] = v
        ak = fields.get("Credential", "").split("/")[0]
        account = self.accounts.get(ak)
        if account is None:
            raise RpcStatusError(Code.UNAUTHORIZED, f"unknown access key {ak[:64]!r}")
        expected = hmac.new(account.secret_key.encode(), date.encode(), hashlib.sha1).hexdigest()
        if not hmac.compare_digest(expected, fields.get("Signature", "").lower()):
            raise RpcStatusError(Code.UNAUTHORIZED, f"signature of access key {ak!r} does not match")
        return account

    def authorize(
        self, account: Account, *, topic: str | None = None, need: Perm = Perm.DENY, group: str | None = None
    ) -> None:
        """Raise FORBIDDEN unless ``account`` has ``need`` on ``topic`` (DENY = any permission)
        and SUB on ``group``."""
        if account.admin:
            return
        if topic is not None:
            have = account.topic_perm(topic)
            if topic.startswith((L.RETRY_GROUP_TOPIC_PREFIX, L.DLQ_GROUP_TOPIC_PREFIX)) and topic not in account.topic_perms:
                # a group's own retry / DLQ topic follows the group's permission
                have = account.group_perm(topic.split("%", 2)[2])
            if (need and (have & need) != need) or (not need and not have):
                raise RpcStatusError(Code.FORBIDDEN, f"access key {account.access_key!r} may not {_verb(need)} topic {topic!r}")
        if group is not None and not account.group_perm(group) & Perm.SUB:
            raise RpcStatusError(Code.FORBIDDEN, f"access key {account.access_key!r} may not use group {group!r}")


def _verb(need: Perm) -> str:
    return {Perm.PUB: "publish to", Perm.SUB: "subscribe to"}.get(need, "use")
