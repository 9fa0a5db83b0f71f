"""Broker settings: the command line, the ``--config`` file, and what they become
(:class:`rmq_spark.services.core.BrokerConfig` with its :class:`StoreConfig`, plus :class:`BrokerOptions`
for what it serves: gRPC, remoting, the NameServer).

=================================  =======================================  ====================
flag (config-file key)             meaning                                  default
=================================  =======================================  ====================
--store DIR                        the store directory (required)
--listen HOST:PORT                 the gRPC port; 0 picks a free one        127.0.0.1:8081
--config FILE                      JSON object or ``key=value`` lines with
                                   the keys below; flags win
--flush sync|async                 CommitLog flush mode                     async
--delay-levels "1s 5s ..."         delay levels (also the consumer retry    RocketMQ's 18 levels
                                   backoff the broker tells push consumers)
--transaction-timeout S            a half message is checked after S        6
--transaction-check-interval S     how often the check runs                 30
--transaction-check-max N          checks before a half is discarded        15
--commitlog-segment-bytes N        CommitLog segment size                   1 GiB
--no-auto-create-topics            unknown topics get TOPIC_NOT_FOUND       (auto-create on)
--default-queue-nums N             queues of an auto-created topic          4
--truncate-corrupt                 recovery truncates a corrupt CommitLog   off
                                   tail instead of refusing to start
--idle-exit-s S                    exit after S s with no RPC and no open   0 (never)
                                   stream
--acl FILE                         access keys, secrets and permissions     (no access control)
                                   (gRPC and remoting: AclClientRPCHook)
--acl-window-s S                   how far a signed x-mq-date-time may be   900
                                   from the broker's clock
--max-delivery-attempts N          deliveries before the DLQ                17
--min-invisible-s S                least invisible time a receive may ask   10
--long-polling-max-s S             longest long poll of a receive           20
--auto-renew-invisible-s S         invisible time of push deliveries,      60
                                   renewed while the client is alive
--timer-precision-ms N             timer message precision                  100
--timer-max-delay-s S              furthest delivery time accepted          259200 (3 days)
--broker-name NAME                 broker name in routes                    rmq-spark-broker
--workers N                        threads for the store work of calls      128
                                   (streams and long polls wait on the
                                   event loop and hold none)
--read-workers N                   processes decoding Spark's bulk reads    one per CPU (>= 2)
                                   (ReadArrow) beside the broker; 0: in
                                   the broker's process
--remoting-listen HOST:PORT        RocketMQ remoting protocol (Java and     127.0.0.1:10911 [*]
                                   other remoting clients, mqadmin)
--namesrv-listen HOST:PORT         the NameServer of this broker            127.0.0.1:9876 [*]
--no-namesrv                       run no NameServer                        (one runs)
--no-namesrv-registrations         the NameServer refuses REGISTER_BROKER   (accepted; with
                                   from other brokers (serves this          --acl: admin only)
                                   broker's routes only)
--no-remoting                      serve gRPC only (and no NameServer)      (remoting on)
--namesrv "ADDR;ADDR"              also register (REGISTER_BROKER every     (none)
                                   30 s) with these NameServers
--namesrv-access-key KEY           sign what this broker sends to those     (unsigned)
--namesrv-secret-key SECRET        NameServers (AclClientRPCHook): a
                                   NameServer with --acl needs an admin
                                   account's; or RMQ_NAMESRV_ACCESS_KEY /
                                   RMQ_NAMESRV_SECRET_KEY, or the config
                                   key innerClientAuthenticationCredentials
                                   (Apache RocketMQ 5.3+'s broker.conf:
                                   {"accessKey":"..","secretKey":".."})
--cluster-name NAME                cluster name in routes                   DefaultCluster
--tls-cert FILE                    PEM certificate (chain) the ports show:  (no TLS)
--tls-key FILE                     and its PEM private key; with both, the
                                   gRPC, remoting and NameServer ports
                                   serve TLS
--tls-mode MODE                    disabled, permissive (remoting and       enforcing
                                   NameServer: TLS and plain on one port)
                                   or enforcing (Apache's tls.server.mode)
--tls-ca FILE                      PEM CAs client certificates must chain   (none)
                                   to
--tls-client-auth none|optional|   ask clients for a certificate (Apache's  require with
  require                          tls.server.need.client.auth)             --tls-ca, else none
--metrics-listen HOST:PORT         Prometheus metrics at /metrics, under    (none)
                                   RocketMQ's names (broker.metrics)
--log-level LEVEL                  DEBUG, INFO, WARNING or ERROR            INFO
=================================  =======================================  ====================

The NameServer credentials: flags win, then the environment, then the config file (the
environment keeps the secret out of the process list).  The secret is never printed.

[*] When ``--listen``'s port is 0 (a test's free port), the remoting and NameServer ports not
given default to 0 too, so brokers started side by side never fight over 10911 and 9876.
The Python API (:class:`BrokerOptions`) serves remoting only when ``remoting_listen`` is set.

Why this module is long: it is the broker's one table of flags and config-file keys (the table
above is its --help) with their one validation; Apache's broker.conf keys it accepts are read here
too.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rmq_spark.cluster.acl import Credentials
from rmq_spark.errors import ConfigError
from rmq_spark.remoting.tls import ClientAuth, ServerTls, TlsMode
from rmq_spark.services.config import BrokerConfig
from rmq_spark.store.store import StoreConfig

__all__ = ["BrokerOptions", "ParsedArgs", "build_parser", "parse_args"]

DEFAULT_LISTEN = "127.0.0.1:8081"
DEFAULT_REMOTING_LISTEN = "127.0.0.1:10911"
DEFAULT_NAMESRV_LISTEN = "127.0.0.1:9876"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# what this broker signs its requests to NameServers with (rmq-admin reads RMQ_ACCESS_KEY likewise)
ACCESS_KEY_ENV, SECRET_KEY_ENV = "RMQ_NAMESRV_ACCESS_KEY", "RMQ_NAMESRV_SECRET_KEY"
# Apache RocketMQ 5.3+'s broker.conf key for the same: {"accessKey": "..", "secretKey": ".."}
INNER_CREDENTIALS_KEY = "innerClientAuthenticationCredentials"
_INNER_CREDENTIALS = "inner-client-authentication-credentials"
_SECRETS = ("namesrv-secret-key", _INNER_CREDENTIALS)  # never echoed in an error


@dataclass
class BrokerOptions:
    """The gRPC service's own settings (the store's and services' are in BrokerConfig)."""

    listen: str = DEFAULT_LISTEN
    min_invisible_ms: int = 10_000
    max_invisible_ms: int = 12 * 3600 * 1000
    max_delivery_attempts: int = 17
    long_polling_max_ms: int = 20_000
    auto_renew_invisible_ms: int = 60_000
    idle_exit_s: float = 0.0
    acl_path: str | None = None
    acl_window_ms: int = 15 * 60 * 1000  # rmq_spark.access.auth.DATE_WINDOW_MS
    workers: int = 128  # threads for calls' store work (rmq_spark.broker.server)
    read_workers: int = (
        -1
    )  # processes decoding ReadArrow (rmq_spark.broker.connector.readers); -1: one per CPU
    max_receive_batch: int = 1024
    max_pull_batch: int = 10_000
    # remoting protocol and NameServer (rmq_spark.remoting): off unless an address is given
    remoting_listen: str | None = None
    namesrv_listen: str | None = None
    namesrv_addrs: tuple[str, ...] = ()
    namesrv_accept_brokers: bool = True  # REGISTER_BROKER from other brokers (rmq_spark.namesrv)
    namesrv_credentials: Credentials | None = None  # signs REGISTER_BROKER / UNREGISTER_BROKER
    cluster_name: str = "DefaultCluster"
    metrics_listen: str | None = None  # Prometheus /metrics (rmq_spark.broker.metrics)
    tls: ServerTls | None = None  # TLS on the gRPC, remoting and NameServer ports
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if self.min_invisible_ms < 0 or self.max_invisible_ms < self.min_invisible_ms:
            raise ConfigError("invisible time bounds must satisfy 0 <= min <= max")
        if self.max_delivery_attempts < 1:
            raise ConfigError("max delivery attempts must be at least 1")
        if self.long_polling_max_ms < 0 or self.auto_renew_invisible_ms <= 0:
            raise ConfigError("long polling and auto-renew times must be positive")
        if self.workers < 4:
            raise ConfigError("the broker needs at least 4 worker threads")


@dataclass
class ParsedArgs:
    store: str
    config: BrokerConfig
    options: BrokerOptions


# (flag = config key, type, help with the default); bool flags take no value
_FLAGS: tuple[tuple[str, type, str], ...] = (
    (
        "listen",
        str,
        f"HOST:PORT of the gRPC service (RocketMQ 5 clients, the Spark data source); port 0 "
        f"picks a free port (default {DEFAULT_LISTEN})",
    ),
    ("flush", str, "CommitLog flush: sync or async (default async)"),
    (
        "delay-levels",
        str,
        'delay levels, e.g. "1s 5s 10s" (default: RocketMQ\'s 18 levels, 1s ... 2h)',
    ),
    ("transaction-timeout", float, "seconds before a half message is checked back (default 6)"),
    ("transaction-check-interval", float, "seconds between transaction check rounds (default 30)"),
    ("transaction-check-max", int, "check-backs before a half message is discarded (default 15)"),
    ("commitlog-segment-bytes", int, "CommitLog segment size in bytes (default 1 GiB)"),
    ("default-queue-nums", int, "queues of an auto-created topic (default 4)"),
    (
        "idle-exit-s",
        float,
        "exit after this many seconds with no RPC and no open stream (default 0: never)",
    ),
    ("acl", str, "JSON file of access keys, secrets and permissions (default: no access control)"),
    (
        "acl-window-s",
        float,
        "seconds a signed request date may be away from the broker's clock (default 900)",
    ),
    (
        "max-delivery-attempts",
        int,
        "deliveries of a message before it goes to the DLQ (default 17)",
    ),
    ("min-invisible-s", float, "least invisible time a receive may ask for (default 10)"),
    ("long-polling-max-s", float, "longest long-polling time of a receive (default 20)"),
    ("auto-renew-invisible-s", float, "invisible time of push-consumer deliveries (default 60)"),
    ("timer-precision-ms", int, "precision of timer (delivery-time) messages (default 100)"),
    (
        "timer-max-delay-s",
        int,
        "furthest delivery time accepted, in seconds (default 259200: 3 days)",
    ),
    ("broker-name", str, "broker name shown in routes (default rmq-spark-broker)"),
    (
        "workers",
        int,
        "threads for the store work of calls; open streams and long polls hold none (default 128)",
    ),
    (
        "read-workers",
        int,
        "processes decoding Spark's bulk reads (ReadArrow), one per CPU (at least 2) unless "
        "given; 0: in the broker's process",
    ),
    (
        "remoting-listen",
        str,
        f"HOST:PORT of the remoting protocol (default {DEFAULT_REMOTING_LISTEN}; port 0 when "
        "--listen's port is 0)",
    ),
    (
        "namesrv-listen",
        str,
        f"HOST:PORT of this broker's NameServer (default {DEFAULT_NAMESRV_LISTEN}; port 0 when "
        "--listen's port is 0)",
    ),
    (
        "namesrv",
        str,
        'also register with these NameServers, "ADDR;ADDR" (REGISTER_BROKER every 30 s)',
    ),
    (
        "namesrv-access-key",
        str,
        "access key this broker signs its requests to --namesrv NameServers with, as "
        "AclClientRPCHook signs (a NameServer with --acl needs an admin account's; default "
        f"${ACCESS_KEY_ENV}, or the config key {INNER_CREDENTIALS_KEY}, Apache RocketMQ 5.3+'s)",
    ),
    (
        "namesrv-secret-key",
        str,
        f"its secret key (default ${SECRET_KEY_ENV}, which keeps it out of the process list; "
        "never printed)",
    ),
    ("cluster-name", str, "cluster name in routes (default DefaultCluster)"),
    ("tls-cert", str, "PEM certificate (chain) of the ports; with --tls-key they serve TLS"),
    ("tls-key", str, "PEM private key of --tls-cert"),
    (
        "tls-mode",
        str,
        "disabled, permissive (remoting and NameServer serve TLS and plain on one port; gRPC "
        "TLS) or enforcing (default), as Apache's tls.server.mode",
    ),
    ("tls-ca", str, "PEM CA certificates client certificates are checked against"),
    (
        "tls-client-auth",
        str,
        "none, optional or require a client certificate (require when --tls-ca is given, else "
        "none), as Apache's tls.server.need.client.auth",
    ),
    (
        "metrics-listen",
        str,
        "HOST:PORT to serve Prometheus metrics on, at /metrics (none unless given)",
    ),
    ("log-level", str, "DEBUG, INFO, WARNING or ERROR (default INFO)"),
)
_BOOL_FLAGS: tuple[tuple[str, str], ...] = (
    ("no-auto-create-topics", "answer TOPIC_NOT_FOUND for unknown topics instead of creating them"),
    (
        "truncate-corrupt",
        "on recovery, truncate a corrupt CommitLog tail instead of refusing to start",
    ),
    ("no-namesrv", "run no NameServer in this process"),
    (
        "no-namesrv-registrations",
        "the NameServer refuses other brokers' REGISTER_BROKER and serves this broker's "
        "routes only",
    ),
    ("no-remoting", "serve no remoting protocol (and no NameServer): gRPC only"),
)
_BOOL_NAMES = tuple(name for name, _h in _BOOL_FLAGS)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"rmq-broker: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="rmq-broker",
        description="A RocketMQ-compatible broker over an rmq_spark store: gRPC (RocketMQ 5 clients), remoting (Java, Go, C++ clients, mqadmin) and a NameServer.",
    )
    p.add_argument("--store", help="store directory (required, here or in the config file)")
    p.add_argument("--config", help="JSON object or key=value lines; flags win")
    for name, typ, help_ in _FLAGS:
        p.add_argument(f"--{name}", type=typ, default=None, help=help_)
    for name, help_ in _BOOL_FLAGS:
        p.add_argument(f"--{name}", action="store_true", default=None, help=help_)
    return p


def _read_config(path: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The file's settings by flag name, and where each was given (file and key, for errors)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line_no = raw[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"config file {path} is not UTF-8 text: byte {e.start} (line {line_no}) is {raw[e.start : e.start + 1]!r}"
        ) from None
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"config file {path} is not valid JSON: {e}") from None
    else:
        data = {}
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise ConfigError(f"config file {path} line {n}: expected key=value")
            data[key.strip()] = value.strip()
    known = {name for name, _t, _h in _FLAGS} | set(_BOOL_NAMES) | {"store", _INNER_CREDENTIALS}
    out: dict[str, Any] = {}
    where: dict[str, str] = {}
    for key, value in data.items():
        name = str(key).strip().replace("_", "-").lower()
        if name == INNER_CREDENTIALS_KEY.lower():
            name = _INNER_CREDENTIALS
        if name not in known:
            raise ConfigError(f"config file {path}: unknown key {key!r}")
        if name == _INNER_CREDENTIALS and isinstance(value, dict):
            value = json.dumps(value)  # a JSON config file may give the object itself
        if isinstance(value, (dict, list)) or value is None:
            kind = (
                "an object"
                if isinstance(value, dict)
                else "an array"
                if isinstance(value, list)
                else "null"
            )
            raise ConfigError(
                f"config file {path}: key {key!r}: {kind} is not a setting; give a string or a number"
            )
        out[name] = value
        where[name] = f"config file {path}: key {key!r}"
    return out, where


def _coerce(name: str, value: Any, where: str) -> Any:
    if name in _BOOL_NAMES:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{where}: {value!r} is not a boolean")
    typ = next((t for n, t, _h in _FLAGS if n == name), str)
    if name in _SECRETS and not isinstance(value, str):
        raise ConfigError(f"{where}: not a string")  # the value is a secret: not echoed
    if (typ is str and not isinstance(value, str)) or (typ is not str and isinstance(value, bool)):
        raise ConfigError(f"{where}: {value!r} is not a valid {typ.__name__}")
    if typ is int and isinstance(value, float) and not value.is_integer():
        raise ConfigError(f"{where}: {value!r} is not a whole number")
    try:
        return typ(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {value!r} is not a valid {typ.__name__}") from None


def parse_args(argv: list[str] | None = None) -> ParsedArgs:
    """Flags (and the config file) -> configs.  argparse exits 2 on unknown flags; invalid
    values raise ConfigError naming the flag, or the config file and its key (the caller exits 2
    with its message)."""
    ns = build_parser().parse_args(argv)
    values, where = _read_config(ns.config) if ns.config else ({}, {})
    for name, _t, _h in _FLAGS:
        v = getattr(ns, name.replace("-", "_"))
        if v is not None:
            values[name] = v
            where[name] = f"--{name}"
    for name in _BOOL_NAMES:
        if getattr(ns, name.replace("-", "_")):
            values[name] = True
            where[name] = f"--{name}"

    def at(name: str) -> str:
        return where.get(name, f"--{name}")

    v = {k: _coerce(k, x, at(k)) for k, x in values.items() if k != "store"}

    def pos(name: str, x: float) -> float:
        if x <= 0:
            raise ConfigError(f"{at(name)} must be positive, not {x}")
        return x

    def at_least(name: str, x: int, lo: int, hi: int | None = None) -> int:
        if x < lo or (hi is not None and x > hi):
            bounds = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
            raise ConfigError(f"{at(name)} must be {bounds}, not {x}")
        return x

    store_kw: dict[str, Any] = {"auto_create_topics": not v.get("no-auto-create-topics", False)}
    if "flush" in v:
        if v["flush"] not in ("sync", "async"):
            raise ConfigError(f"{at('flush')} must be 'sync' or 'async', not {v['flush']!r}")
        store_kw["flush"] = v["flush"]
    if "commitlog-segment-bytes" in v:
        store_kw["commitlog_segment_bytes"] = at_least(
            "commitlog-segment-bytes", v["commitlog-segment-bytes"], 4096
        )
    if "default-queue-nums" in v:
        store_kw["default_queue_nums"] = at_least(
            "default-queue-nums", v["default-queue-nums"], 1, 1024
        )
    if v.get("truncate-corrupt"):
        store_kw["truncate_corrupt"] = True
    cfg = BrokerConfig(store=StoreConfig(**store_kw))
    if "delay-levels" in v:
        try:
            cfg = BrokerConfig(store=cfg.store, delay_levels=v["delay-levels"])
        except ConfigError as e:
            raise ConfigError(f"{at('delay-levels')}: {e}") from None
    if "transaction-timeout" in v:
        cfg.transaction_timeout_s = pos("transaction-timeout", v["transaction-timeout"])
    if "transaction-check-interval" in v:
        cfg.transaction_check_interval_s = pos(
            "transaction-check-interval", v["transaction-check-interval"]
        )
    if "transaction-check-max" in v:
        cfg.transaction_check_max = int(pos("transaction-check-max", v["transaction-check-max"]))
    if "timer-precision-ms" in v:
        cfg.timer_precision_ms = int(pos("timer-precision-ms", v["timer-precision-ms"]))
    if "timer-max-delay-s" in v:
        cfg.timer_max_delay_s = int(pos("timer-max-delay-s", v["timer-max-delay-s"]))
    if "broker-name" in v:
        name = v["broker-name"].strip()
        if not name or " " in name:
            raise ConfigError(f"{at('broker-name')} must be a non-empty word")
        cfg.broker_name = name
    opt_kw: dict[str, Any] = {}
    if "listen" in v:
        try:
            split_listen(v["listen"])
        except ConfigError:
            raise ConfigError(f"{at('listen')}: {v['listen']!r} is not HOST:PORT") from None
        opt_kw["listen"] = v["listen"]
    if "idle-exit-s" in v:
        opt_kw["idle_exit_s"] = max(0.0, v["idle-exit-s"])
    if "acl" in v:
        opt_kw["acl_path"] = v["acl"]
    if "acl-window-s" in v:
        opt_kw["acl_window_ms"] = int(pos("acl-window-s", v["acl-window-s"]) * 1000)
    if "max-delivery-attempts" in v:
        opt_kw["max_delivery_attempts"] = at_least(
            "max-delivery-attempts", v["max-delivery-attempts"], 1
        )
    if "min-invisible-s" in v:
        opt_kw["min_invisible_ms"] = int(
            at_least("min-invisible-s", v["min-invisible-s"], 0) * 1000
        )
    if "long-polling-max-s" in v:
        opt_kw["long_polling_max_ms"] = int(
            at_least("long-polling-max-s", v["long-polling-max-s"], 0) * 1000
        )
    if "auto-renew-invisible-s" in v:
        opt_kw["auto_renew_invisible_ms"] = int(
            pos("auto-renew-invisible-s", v["auto-renew-invisible-s"]) * 1000
        )
    if "workers" in v:
        opt_kw["workers"] = at_least("workers", v["workers"], 4)
    if "read-workers" in v:
        opt_kw["read_workers"] = at_least("read-workers", v["read-workers"], 0)
    if "metrics-listen" in v:
        split_listen(v["metrics-listen"], "metrics-listen")
        opt_kw["metrics_listen"] = v["metrics-listen"]
    if "log-level" in v:
        level = str(v["log-level"]).strip().upper()
        if level not in LOG_LEVELS:
            raise ConfigError(
                f"{at('log-level')} must be one of {', '.join(LOG_LEVELS)}, not {v['log-level']!r}"
            )
        opt_kw["log_level"] = level
    _remoting_options(v, opt_kw)
    opt_kw["tls"] = server_tls(v, at)
    options = BrokerOptions(**opt_kw)
    split_listen(options.listen)
    for flag, addr in (
        ("remoting-listen", options.remoting_listen),
        ("namesrv-listen", options.namesrv_listen),
    ):
        if addr is not None:
            split_listen(addr, flag)
    store = ns.store or values.get("store")
    if store is not None and not isinstance(store, str):
        raise ConfigError(f"{where.get('store', '--store')}: {store!r} is not a directory name")
    if not store:
        raise ConfigError("--store DIR is required")
    here = os.path.abspath(store)
    while not os.path.exists(here) and os.path.dirname(here) != here:
        here = os.path.dirname(here)
    if os.path.exists(here) and not os.path.isdir(here):
        what = (
            "is a file" if here == os.path.abspath(store) else f"lies under {here}, which is a file"
        )
        raise ConfigError(f"{where.get('store', '--store')} {store} {what}, not a store directory")
    return ParsedArgs(os.path.abspath(str(store)), cfg, options)


def _remoting_options(v: dict[str, Any], opt_kw: dict[str, Any]) -> None:
    """The remoting flags: defaults 10911 / 9876, or free ports when --listen's port is 0."""
    if v.get("no-remoting"):
        return
    free = str(v.get("listen", DEFAULT_LISTEN)).endswith(":0")
    host = str(v.get("listen", DEFAULT_LISTEN)).rpartition(":")[0] or "127.0.0.1"
    opt_kw["remoting_listen"] = v.get("remoting-listen") or (
        f"{host}:0" if free else DEFAULT_REMOTING_LISTEN
    )
    if not v.get("no-namesrv"):
        opt_kw["namesrv_listen"] = v.get("namesrv-listen") or (
            f"{host}:0" if free else DEFAULT_NAMESRV_LISTEN
        )
    if v.get("no-namesrv-registrations"):
        opt_kw["namesrv_accept_brokers"] = False
    if v.get("namesrv"):
        addrs = tuple(
            a.strip() for a in str(v["namesrv"]).replace(",", ";").split(";") if a.strip()
        )
        for a in addrs:
            split_listen(a, "namesrv")
        opt_kw["namesrv_addrs"] = addrs
    opt_kw["namesrv_credentials"] = namesrv_credentials(v, os.environ)
    if v.get("cluster-name"):
        name = str(v["cluster-name"]).strip()
        if not name or " " in name:
            raise ConfigError("--cluster-name must be a non-empty word")
        opt_kw["cluster_name"] = name


def namesrv_credentials(v: dict[str, Any], env: Any) -> Credentials | None:
    """What this broker signs its requests to NameServers with: ``--namesrv-access-key`` /
    ``--namesrv-secret-key``, else the environment, else the config file's
    ``innerClientAuthenticationCredentials``; None when none is given.  Errors never hold the
    secret."""
    ak = v.get("namesrv-access-key") or env.get(ACCESS_KEY_ENV)
    sk = v.get("namesrv-secret-key") or env.get(SECRET_KEY_ENV)
    if not ak and not sk and v.get(_INNER_CREDENTIALS):
        where = f"the config key {INNER_CREDENTIALS_KEY}"
        try:
            doc = json.loads(v[_INNER_CREDENTIALS])
        except ValueError:
            doc = None
        keys = ("accessKey", "secretKey")
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str) for k in keys):
            shape = '{"accessKey": "...", "secretKey": "..."}'
            raise ConfigError(f"{where} must be a JSON object {shape}")
        ak, sk = doc["accessKey"], doc["secretKey"]
    if not ak and not sk:
        return None
    if not ak or not sk:
        raise ConfigError("an access key and its secret key go together: give both "
                          "--namesrv-access-key and --namesrv-secret-key (or "
                          f"{ACCESS_KEY_ENV} and {SECRET_KEY_ENV})")  # fmt: skip
    return Credentials(str(ak), str(sk))


def server_tls(v: dict[str, Any], at: Callable[[str], str]) -> ServerTls | None:
    """The TLS flags: a certificate and its key, the mode, the clients' CA and whether a client
    must show a certificate; None when no TLS is asked (or ``--tls-mode disabled``)."""
    names = ("tls-cert", "tls-key", "tls-mode", "tls-ca", "tls-client-auth")
    given = {n: str(v[n]).strip() for n in names if v.get(n) is not None}
    try:
        mode = TlsMode(given.get("tls-mode", "enforcing").lower())
    except ValueError:
        raise ConfigError(f"{at('tls-mode')} must be disabled, permissive or enforcing, not {given['tls-mode']!r}") from None  # fmt: skip
    if mode is TlsMode.DISABLED:
        return None
    if not given:
        return None
    for n in ("tls-cert", "tls-key"):
        if not given.get(n):
            other = [f"{at(k)}" for k in given if k != n]
            raise ConfigError(
                f"{', '.join(other)} needs --{n} (TLS needs a certificate and its key)"
            )
    for n in ("tls-cert", "tls-key", "tls-ca"):
        if n in given and not os.path.isfile(given[n]):
            raise ConfigError(f"{at(n)} {given[n]!r} is not a file")
    default_auth = "require" if "tls-ca" in given else "none"
    try:
        auth = ClientAuth(given.get("tls-client-auth", default_auth).lower())
    except ValueError:
        raise ConfigError(f"{at('tls-client-auth')} must be none, optional or require, not {given['tls-client-auth']!r}") from None  # fmt: skip
    tls = ServerTls(given["tls-cert"], given["tls-key"], given.get("tls-ca"), mode, auth)
    tls.context  # noqa: B018 -- loads the files now: a bad one fails the start with its flag
    return tls


def split_listen(listen: str, flag: str = "listen") -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--{flag} {listen!r} is not HOST:PORT")
    return host, int(port)
