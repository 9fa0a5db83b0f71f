"""Namespaces as the Java client maps them (``NamespaceUtil``): a topic or group ``name`` of
namespace ``ns`` is ``ns%name`` on the brokers; retry and DLQ topics keep their prefix in front
(``%RETRY%ns%group``, ``%DLQ%ns%group``); system topics and groups, and names that already carry
the namespace, are left as they are.

    wrap("prod", "Orders")            -> "prod%Orders"
    wrap("prod", "%RETRY%billing")    -> "%RETRY%prod%billing"
    unwrap("prod", "prod%Orders")     -> "Orders"
"""

from __future__ import annotations

from rmq_spark.store import layout as L

__all__ = ["SEPARATOR", "in_namespace", "unwrap", "wrap"]

SEPARATOR = "%"
_SYS_GROUP_PREFIX = "CID_RMQ_SYS_"  # MixAll.CID_RMQ_SYS_PREFIX
_AUTO_CREATE_TOPIC = "TBW102"


def _system(name: str) -> bool:
    sys_group = name.startswith(_SYS_GROUP_PREFIX)
    return L.is_system_topic(name) or sys_group or name == _AUTO_CREATE_TOPIC


def _split_prefix(name: str) -> tuple[str, str]:
    for prefix in (L.RETRY_GROUP_TOPIC_PREFIX, L.DLQ_GROUP_TOPIC_PREFIX):
        if name.startswith(prefix):
            return prefix, name[len(prefix) :]
    return "", name


def in_namespace(namespace: str | None, name: str) -> bool:
    """Does ``name`` (as the brokers know it) carry ``namespace`` (``isAlreadyWithNamespace``)?"""
    if not namespace or not name or _system(name):
        return False
    return _split_prefix(name)[1].startswith(namespace + SEPARATOR)


def wrap(namespace: str | None, name: str) -> str:
    """``NamespaceUtil.wrapNamespace``: the name the brokers know ``name`` of ``namespace`` by."""
    if not namespace or not name or _system(name) or in_namespace(namespace, name):
        return name
    prefix, rest = _split_prefix(name)
    return f"{prefix}{namespace}{SEPARATOR}{rest}"


def unwrap(namespace: str | None, name: str) -> str:
    """``NamespaceUtil.withoutNamespace(name, namespace)``: ``name`` as the application sees it
    (names of other namespaces are left as they are)."""
    if not in_namespace(namespace, name):
        return name
    prefix, rest = _split_prefix(name)
    return prefix + rest[len(namespace or "") + 1 :]
