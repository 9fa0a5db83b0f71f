"""Values of format ``rmq``'s options: booleans, numbers, durations, timestamps, credentials and
namespaces, each parsed with an error that names the option (and never holds a secret)."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from rmq_spark.errors import ConfigError

if TYPE_CHECKING:
    from rmq_spark.cluster.tls import TlsConfig

__all__ = [
    "parse_bool",
    "parse_duration_ms",
    "parse_keys",
    "parse_namespace",
    "parse_positive_int",
    "parse_timestamp_ms",
    "parse_tls",
]

TLS_FILE_OPTIONS = ("tlsCaFile", "tlsCertFile", "tlsKeyFile")
TLS_OPTIONS = ("tls", *TLS_FILE_OPTIONS, "tlsHostnameCheck")

_DURATION = re.compile(
    r"^\s*(\d+)\s*(ms|milliseconds?|s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?|d|days?)?\s*$",
    re.IGNORECASE,
)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {name!r} must be true or false, not {value!r}")


def parse_positive_int(name: str, value: str) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise ConfigError(f"option {name!r} must be a positive integer, not {value!r}") from None
    if n <= 0:
        raise ConfigError(f"option {name!r} must be a positive integer, not {value!r}")
    return n


def parse_timestamp_ms(name: str, value: str) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise ConfigError(f"option {name!r} must be epoch milliseconds, not {value!r}") from None
    if n < 0:
        raise ConfigError(f"option {name!r} must be epoch milliseconds (>= 0), not {value!r}")
    return n


def parse_duration_ms(name: str, value: str) -> int:
    """``"15m"``, ``"30 seconds"``, ``"500ms"``; a bare number is milliseconds (as Spark's)."""
    m = _DURATION.match(value)
    if not m:
        raise ConfigError(
            f"option {name!r} must be a duration such as 30s, 15m or 500ms, not {value!r}"
        )
    unit = (m.group(2) or "ms").lower()
    key = "ms" if unit.startswith(("ms", "milli")) else unit[0]
    return int(m.group(1)) * _UNIT_MS[key]


def parse_keys(o: dict[str, str]) -> tuple[str | None, str | None]:
    """``accessKey`` and ``secretKey``, both or neither (``securityToken`` only with them).  The
    secret is never part of an error."""
    access_key = o.get("accessKey") or None
    secret_key = o.get("secretKey") or None
    if (access_key is None) != (secret_key is None):
        given, missing = (
            ("accessKey", "secretKey") if access_key is not None else ("secretKey", "accessKey")
        )
        raise ConfigError(f"option {given!r} needs option {missing!r}: the broker checks both")
    if o.get("securityToken") and access_key is None:
        raise ConfigError("option 'securityToken' needs options 'accessKey' and 'secretKey'")
    return access_key, secret_key


def parse_namespace(value: str | None) -> str | None:
    """``namespace``: RocketMQ's rule for a namespace (``NamespaceUtil``: letters, digits, ``-``
    and ``_``, at most 64 characters), or None."""
    if value is None or not value.strip():
        return None
    ns = value.strip()
    if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", ns):
        raise ConfigError(
            f"option 'namespace': {ns!r} is not a RocketMQ namespace ([a-zA-Z0-9_-], 1-64 characters)"
        )
    return ns


def parse_tls(o: dict[str, str]) -> TlsConfig | None:
    """``tls`` and its files (with ``namesrvAddr``): None without ``tls=true``.  The files are
    loaded here, once, so a bad one fails the query up front with the option's name (every
    executor must see them at the same paths)."""
    from rmq_spark.cluster.tls import TlsConfig, TlsError

    if not parse_bool("tls", o.get("tls", "false")):
        given = [n for n in TLS_OPTIONS[1:] if n in o]
        if given:
            raise ConfigError(f"option {given[0]!r} needs option 'tls=true'")
        return None
    files: dict[str, str | None] = {}
    for name in TLS_FILE_OPTIONS:
        path = o.get(name, "").strip() or None
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"option {name!r}: {path!r} is not a file")
        files[name] = path
    if files["tlsKeyFile"] is not None and files["tlsCertFile"] is None:
        raise ConfigError("option 'tlsKeyFile' needs option 'tlsCertFile' (the client certificate)")
    tls = TlsConfig(
        ca_file=files["tlsCaFile"],
        cert_file=files["tlsCertFile"],
        key_file=files["tlsKeyFile"],
        hostname_check=parse_bool("tlsHostnameCheck", o.get("tlsHostnameCheck", "false")),
    )
    try:
        tls.context()
    except TlsError as e:
        raise ConfigError(str(e)) from None
    return tls
