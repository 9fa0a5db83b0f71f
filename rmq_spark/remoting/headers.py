"""Reading a request's custom header (its ext fields) with the checks RocketMQ's
``decodeCommandCustomHeader`` makes: a required field that is missing, or a number that is not
one, is a :class:`HeaderError` (answered ``SYSTEM_ERROR`` naming the field), never a crash."""

from __future__ import annotations

import builtins
from collections.abc import Mapping

from rmq_spark.errors import RmqError

__all__ = ["Fields", "HeaderError", "fields_of"]

_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)


class HeaderError(RmqError, ValueError):
    """A request's ext fields lack a required field or hold a value of the wrong kind."""


class Fields:
    """Typed access to ext fields: ``f.int("queueId")`` (required), ``f.int("sysFlag", 0)``."""

    __slots__ = ("raw",)

    def __init__(self, raw: Mapping[str, str]) -> None:
        self.raw = raw

    def str(self, name: str, default: str | None = None, *, required: bool | None = None) -> str:
        value = self.raw.get(name)
        if value is None:
            if default is None and required is not False:
                raise HeaderError(f"the custom header's field {name!r} is missing")
            return default if default is not None else ""
        return value

    def opt(self, name: builtins.str) -> builtins.str | None:
        return self.raw.get(name)

    def int(self, name: builtins.str, default: builtins.int | None = None) -> builtins.int:
        return self._number(name, default, _INT32)

    def long(self, name: builtins.str, default: builtins.int | None = None) -> builtins.int:
        return self._number(name, default, _INT64)

    def _number(
        self,
        name: builtins.str,
        default: builtins.int | None,
        bounds: tuple[builtins.int, builtins.int],
    ) -> builtins.int:
        value = self.raw.get(name)
        if value is None or value == "":
            if default is None:
                raise HeaderError(f"the custom header's field {name!r} is missing")
            return default
        try:
            n = int(value.strip())
        except (ValueError, AttributeError):
            raise HeaderError(
                f"the custom header's field {name!r} is not a number: {value!r}"
            ) from None
        if not bounds[0] <= n <= bounds[1]:
            raise HeaderError(f"the custom header's field {name!r} is out of range: {value!r}")
        return n

    def bool(self, name: builtins.str, default: bool = False) -> bool:
        value = self.raw.get(name)
        if value is None or value == "":
            return default
        return value.strip().lower() == "true"


def fields_of(raw: Mapping[str, str], aliases: Mapping[str, str] | None = None) -> Fields:
    """``raw`` with short names renamed (SEND_MESSAGE_V2's ``a``..``n``) when ``aliases`` is given."""
    if aliases is None:
        return Fields(raw)
    return Fields({aliases.get(k, k): v for k, v in raw.items()})
