"""Access control (off unless ``--acl FILE`` is given): who may publish to or subscribe from what.

Authentication: every request carries ``authorization: MQv2-HMAC-SHA1 Credential=<ak>,
SignedHeaders=x-mq-date-time, Signature=<hex>`` where the signature is HMAC-SHA1 of the
``x-mq-date-time`` header under the account's secret (the official clients compute it in
``util/signature.py`` / ``Signature.ts``; hex case does not matter).  A missing, malformed or wrong
signature, or an unknown access key, gets UNAUTHORIZED (40100).  So does a signed date
(``yyyyMMddTHHmmssZ``) more than :data:`DATE_WINDOW_MS` (15 minutes) away from the broker's clock,
so that a captured header cannot be replayed for ever.  The official Python client formats its
*local* time with a ``Z`` suffix, so the date is accepted when it is within the window of the
broker's clock read either as UTC or as the broker's local time.  (Apache RocketMQ's proxy checks
no window at all; 15 minutes is the usual allowance of signed-date schemes such as AWS SigV4.)

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

import base64
import calendar
import enum
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rmq_spark.errors import AuthenticationError, ConfigError, PermissionDeniedError
from rmq_spark.store import layout as L
from rmq_spark.store.clock import SYSTEM_CLOCK, Clock

__all__ = [
    "ACCESS_KEY",
    "AUTHORIZATION",
    "DATE_TIME",
    "DATE_WINDOW_MS",
    "SIGNATURE",
    "AccessControl",
    "Account",
    "Perm",
    "remoting_signature",
    "signed_headers",
]

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_WINDOW_MS = 15 * 60 * 1000
# the remoting protocol's signature (RocketMQ 4.x's plain ACL, the Java clients' AclClientRPCHook)
ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"


def remoting_signature(ext_fields: Mapping[str, str], body: bytes, secret_key: str) -> str:
    """``Base64(HmacSHA1(secretKey, content))``, content being the values of every ext field but
    ``Signature``, in the order of their sorted names, as UTF-8, then the body
    (``AclUtils.combineRequestContent``)."""
    content = "".join(v for k, v in sorted(ext_fields.items()) if k != SIGNATURE and v is not None)
    digest = hmac.new(
        secret_key.encode(), content.encode("utf-8", "surrogatepass") + (body or b""), hashlib.sha1
    )
    return base64.b64encode(digest.digest()).decode()


def signed_headers(
    access_key: str, secret_key: str, now_s: float | None = None
) -> list[tuple[str, str]]:
    """``x-mq-date-time`` and ``authorization`` as the official Python client signs them (its
    local time with a ``Z``), for rmq_spark's own clients (the data source, tests)."""
    date = time.strftime(DATE_FORMAT, time.localtime(time.time() if now_s is None else now_s))
    sig = hmac.new(secret_key.encode(), date.encode(), hashlib.sha1).hexdigest()
    return [
        (DATE_TIME, date),
        (
            AUTHORIZATION,
            f"{ALGORITHM} Credential={access_key}, SignedHeaders={DATE_TIME}, Signature={sig}",
        ),
    ]


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
    """The accounts of an ACL file; ``clock`` is the broker's (injectable) clock that signed dates
    are held to, within ``window_ms``."""

    def __init__(
        self, accounts: list[Account], clock: Clock = SYSTEM_CLOCK, window_ms: int = DATE_WINDOW_MS
    ) -> None:
        self.accounts = {a.access_key: a for a in accounts}
        self.clock = clock
        self.window_ms = window_ms

    @classmethod
    def load(
        cls, path: str, clock: Clock = SYSTEM_CLOCK, window_ms: int = DATE_WINDOW_MS
    ) -> AccessControl:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as e:
            raise ConfigError(f"ACL file {path}: {e.strerror or e}") from None
        except ValueError as e:
            raise ConfigError(f"ACL file {path} is not valid JSON: {e}") from None
        return cls.from_dict(data, path, clock, window_ms)

    @classmethod
    def from_dict(
        cls,
        data: Any,
        source: str = "ACL",
        clock: Clock = SYSTEM_CLOCK,
        window_ms: int = DATE_WINDOW_MS,
    ) -> AccessControl:
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
                    topic_perms=_perm_table(
                        a.get("topicPerms"), f"{source}: account {i} topicPerms"
                    ),
                    group_perms=_perm_table(
                        a.get("groupPerms"), f"{source}: account {i} groupPerms"
                    ),
                )
            )
        if len({a.access_key for a in accounts}) != len(accounts):
            raise ConfigError(f"{source}: access keys must be unique")
        return cls(accounts, clock, window_ms)

    def authenticate(self, metadata: Mapping[str, str]) -> Account:
        """The account that signed the request, or AuthenticationError (UNAUTHORIZED)."""
        header = metadata.get(AUTHORIZATION, "")
        date = metadata.get(DATE_TIME, "")
        algo, _, rest = header.partition(" ")
        if algo != ALGORITHM or not date:
            raise AuthenticationError("request is not signed (authorization header missing)")
        fields: dict[str, str] = {}
        for part in rest.split(","):
            k, sep, v = part.strip().partition("=")
            if sep:
                fields[k] = v
        ak = fields.get("Credential", "").split("/")[0]
        account = self.accounts.get(ak)
        if account is None:
            raise AuthenticationError(f"unknown access key {ak[:64]!r}")
        expected = hmac.new(account.secret_key.encode(), date.encode(), hashlib.sha1).hexdigest()
        if not hmac.compare_digest(expected, fields.get("Signature", "").lower()):
            raise AuthenticationError(f"signature of access key {ak!r} does not match")
        self._check_date(date, ak)
        return account

    def authenticate_remoting(self, ext_fields: Mapping[str, str], body: bytes) -> Account:
        """The account that signed a remoting request (ext fields ``AccessKey`` and ``Signature``),
        or AuthenticationError."""
        ak, signature = ext_fields.get(ACCESS_KEY), ext_fields.get(SIGNATURE)
        if not ak or not signature or not isinstance(ak, str) or not isinstance(signature, str):
            raise AuthenticationError("the request is not signed (AccessKey and Signature are missing): "
                                      "access control is on")  # fmt: skip
        account = self.accounts.get(ak)
        if account is None:
            raise AuthenticationError(f"No acl config for {ak[:64]}")
        if not hmac.compare_digest(remoting_signature(ext_fields, body, account.secret_key).encode(),
                                   signature.encode("utf-8", "surrogatepass")):  # fmt: skip
            raise AuthenticationError(f"Check signature failed for accessKey={ak}")
        return account

    def _check_date(self, date: str, ak: str) -> None:
        try:
            signed_ms = calendar.timegm(time.strptime(date, DATE_FORMAT)) * 1000
        except ValueError:
            raise AuthenticationError(
                f"x-mq-date-time {date[:32]!r} of access key {ak!r} is not yyyyMMddTHHmmssZ"
            ) from None
        now_ms = self.clock.now_ms()
        local_ms = (
            now_ms + time.localtime(now_ms // 1000).tm_gmtoff * 1000
        )  # the clients sign local time
        if min(abs(signed_ms - now_ms), abs(signed_ms - local_ms)) > self.window_ms:
            raise AuthenticationError(
                f"x-mq-date-time {date!r} of access key {ak!r} is more than {self.window_ms // 60000} minutes "
                "away from the broker's clock (a stale or replayed signature, or a client clock that is off)"
            )

    def authorize(
        self,
        account: Account,
        *,
        topic: str | None = None,
        need: Perm = Perm.DENY,
        group: str | None = None,
    ) -> None:
        """Raise PermissionDeniedError (FORBIDDEN) unless ``account`` has ``need`` on ``topic``
        (DENY = any permission) and SUB on ``group``.  System topics are for admin accounts only,
        whatever the account's topic permissions say."""
        if account.admin:
            return
        if topic is not None:
            if L.is_system_topic(topic):
                raise PermissionDeniedError(
                    f"access key {account.access_key!r} may not use system topic {topic!r}"
                )
            if not self.topic_allows(account, topic, need):
                raise PermissionDeniedError(
                    f"access key {account.access_key!r} may not {_verb(need)} topic {topic!r}"
                )
        if group is not None and not account.group_perm(group) & Perm.SUB:
            raise PermissionDeniedError(
                f"access key {account.access_key!r} may not use group {group!r}"
            )

    @staticmethod
    def topic_allows(account: Account, topic: str, need: Perm = Perm.DENY) -> bool:
        """Has ``account`` ``need`` on ``topic`` (DENY: any permission)?"""
        if account.admin:
            return True
        if L.is_system_topic(topic):
            return False
        have = account.topic_perm(topic)
        if (
            topic.startswith((L.RETRY_GROUP_TOPIC_PREFIX, L.DLQ_GROUP_TOPIC_PREFIX))
            and topic not in account.topic_perms
        ):
            # a group's own retry / DLQ topic follows the group's permission
            have = account.group_perm(topic.split("%", 2)[2])
        return bool((have & need) == need if need else have)


def _verb(need: Perm) -> str:
    return {Perm.PUB: "publish to", Perm.SUB: "subscribe to"}.get(need, "use")
