"""The names and needs both protocol fronts share (the gRPC port and the remoting port).

- :func:`topic_name` / :func:`group_name`: the one place a topic or consumer group name that
  comes from a client is validated (characters, length, system topics, retry and dead-letter
  topics), so a malformed name never reaches the services or the store.
- :class:`Need`: what a request touches -- topics with the permission each needs, consumer
  groups, or admin -- read from the request as it will be executed, and checked by
  :meth:`rmq_spark.access.auth.AccessControl.authorize`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from rmq_spark.access.auth import Perm
from rmq_spark.errors import IllegalGroupError, IllegalTopicError, MessageIllegalError
from rmq_spark.store import layout as L
from rmq_spark.store.validation import check_group, check_topic_cached

__all__ = ["AUTHENTICATED", "Need", "Use", "group_name", "topic_name"]


class Use(enum.Enum):
    """What a request does with a topic (what :func:`topic_name` allows)."""

    ROUTE = "query the route of"  # any permission
    READ = "read"  # SUB
    WRITE = "send to"  # PUB; never a system, retry or dead-letter topic


@dataclass(frozen=True)
class Need:
    """What a request touches: topics with the permission each needs (``Perm.DENY``: any),
    consumer groups (SUB), or ``admin``."""

    topics: tuple[tuple[str, Perm], ...] = ()
    groups: tuple[str, ...] = ()
    admin: bool = False


AUTHENTICATED = Need()  # any signed account


_RETRY_DLQ = (L.RETRY_GROUP_TOPIC_PREFIX, L.DLQ_GROUP_TOPIC_PREFIX)


def topic_name(name: Any, use: Use, *, system_reads: bool = False) -> str:
    """``name`` if a client may ``use`` it, else IllegalTopicError: a legal name (characters,
    length); never a system topic, except to read when ``system_reads`` (authorization then
    keeps it for admin accounts); never a retry or dead-letter topic to send to (the broker
    writes those; consumers read them with their group's permission)."""
    if not isinstance(name, str):
        raise IllegalTopicError(f"topic must be a string, not {type(name).__name__}")
    try:
        check_topic_cached(name, allow_system=True)
    except MessageIllegalError as e:
        raise IllegalTopicError(str(e)) from None
    if L.is_system_topic(name) and (use is Use.WRITE or not system_reads):
        raise IllegalTopicError(f"topic {name!r} is a system topic; clients cannot {use.value} it")
    if use is Use.WRITE and name.startswith(_RETRY_DLQ):
        kind = "retry" if name.startswith(L.RETRY_GROUP_TOPIC_PREFIX) else "dead-letter"
        raise IllegalTopicError(
            f"topic {name!r} is a {kind} topic: only the broker writes it, producers cannot send to it"
        )
    return name


def group_name(name: Any) -> str:
    """``name`` if it is a legal consumer group name, else IllegalGroupError."""
    if not isinstance(name, str):
        raise IllegalGroupError(f"group must be a string, not {type(name).__name__}")
    try:
        check_group(name)
    except MessageIllegalError as e:
        raise IllegalGroupError(str(e)) from None
    return name
