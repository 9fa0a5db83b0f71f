"""Broker settings: the command line, the ``--config`` file, and what they become
(:class:`rmq_spark.services.core.BrokerConfig` with its :class:`StoreConfig`, plus :class:`BrokerOptions`
for the gRPC side).

=================================  =======================================  ====================
flag (config-file key)             meaning                                  default
=================================  =======================================  ====================
--store DIR                        the store directory (required)
--listen HOST:PORT                 where to serve; port 0 picks a free one  127.0.0.1:8081
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
=================================  =======================================  ====================
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import Any

from rmq_spark.services.config import BrokerConfig
from rmq_spark.errors import ConfigError
from rmq_spark.store.store import StoreConfig

__all__ = ["BrokerOptions", "ParsedArgs", "build_parser", "parse_args"]

DEFAULT_LISTEN = "127.0.0.1:8081"


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
    acl_window_ms: int = 15 * 60 * 1000  # rmq_spark.broker.auth.DATE_WINDOW_MS
    workers: int = 128  # threads for calls' store work (rmq_spark.broker.server)
    max_receive_batch: int = 1024
    max_pull_batch: int = 10_000

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
    ("listen", str, f"HOST:PORT to serve on; port 0 picks a free port (default {DEFAULT_LISTEN})"),
    ("flush", str, "CommitLog flush: sync or async (default async)"),
    ("delay-levels", str, 'delay levels, e.g. "1s 5s 10s" (default: RocketMQ\'s 18 levels, 1s ... 2h)'),
    ("transaction-timeout", float, "seconds before a half message is checked back (default 6)"),
    ("transaction-check-interval", float, "seconds between transaction check rounds (default 30)"),
    ("transaction-check-max", int, "check-backs before a half message is discarded (default 15)"),
    ("commitlog-segment-bytes", int, "CommitLog segment size in bytes (default 1 GiB)"),
    ("default-queue-nums", int, "queues of an auto-created topic (default 4)"),
    ("idle-exit-s", float, "exit after this many seconds with no RPC and no open stream (default 0: never)"),
    ("acl", str, "JSON file of access keys, secrets and permissions (default: no access control)"),
    ("acl-window-s", float, "seconds a signed request date may be away from the broker's clock (default 900)"),
    ("max-delivery-attempts", int, "deliveries of a message before it goes to the DLQ (default 17)"),
    ("min-invisible-s", float, "least invisible time a receive may ask for (default 10)"),
    ("long-polling-max-s", float, "longest long-polling time of a receive (default 20)"),
    ("auto-renew-invisible-s", float, "invisible time of push-consumer deliveries (default 60)"),
    ("timer-precision-ms", int, "precision of timer (delivery-time) messages (default 100)"),
    ("timer-max-delay-s", int, "furthest delivery time accepted, in seconds (default 259200: 3 days)"),
    ("broker-name", str, "broker name shown in routes (default rmq-spark-broker)"),
    ("workers", int, "threads for the store work of calls; open streams and long polls hold none (default 128)"),
)
_BOOL_FLAGS: tuple[tuple[str, str], ...] = (
    ("no-auto-create-topics", "answer TOPIC_NOT_FOUND for unknown topics instead of creating them"),
    ("truncate-corrupt", "on recovery, truncate a corrupt CommitLog tail instead of refusing to start"),
)
_BOOL_NAMES = tuple(name for name, _h in _BOOL_FLAGS)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"rmq-broker: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rmq-broker", description="A local RocketMQ 5 broker (gRPC) over an rmq_spark store.")
    p.add_argument("--store", help="store directory (required, here or in the config file)")
    p.add_argument("--config", help="JSON object or key=value lines; flags win")
    for name, typ, help_ in _FLAGS:
        p.add_argument(f"--{name}", type=typ, default=None, help=help_)
    for name, help_ in _BOOL_FLAGS:
        p.add_argument(f"--{name}", action="store_true", default=None, help=help_)
    return p


def _read_config(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror or e}") from None
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
    known = {name for name, _t, _h in _FLAGS} | set(_BOOL_NAMES) | {"store"}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).strip().replace("_", "-").lower()
        if name not in known:
            raise ConfigError(f"config file {path}: unknown key {key!r}")
        out[name] = value
    return out


def _coerce(name: str, value: Any) -> Any:
    if name in _BOOL_NAMES:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}: {value!r} is not a boolean")
    typ = next((t for n, t, _h in _FLAGS if n == name), str)
    try:
        return typ(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {value!r} is not a valid {typ.__name__}") from None


def parse_args(argv: list[str] | None = None) -> ParsedArgs:
    """Flags (and the config file) -> configs.  argparse exits 2 on unknown flags; invalid
    values raise ConfigError (the caller exits 2 with its message)."""
    ns = build_parser().parse_args(argv)
    values: dict[str, Any] = _read_config(ns.config) if ns.config else {}
    for name, _t, _h in _FLAGS:
        v = getattr(ns, name.replace("-", "_"))
        if v is not None:
            values[name] = v
    for name in _BOOL_NAMES:
        if getattr(ns, name.replace("-", "_")):
            values[name] = True
    v = {k: _coerce(k, x) for k, x in values.items() if k != "store"}

    def pos(name: str, x: float) -> float:
        if x <= 0:
            raise ConfigError(f"--{name} must be positive, not {x}")
        return x

    store_kw: dict[str, Any] = {"auto_create_topics": not v.get("no-auto-create-topics", False)}
    if "flush" in v:
        store_kw["flush"] = v["flush"]
    if "commitlog-segment-bytes" in v:
        store_kw["commitlog_segment_bytes"] = v["commitlog-segment-bytes"]
    if "default-queue-nums" in v:
        n = v["default-queue-nums"]
        if not 1 <= n <= 1024:
            raise ConfigError(f"--default-queue-nums must be between 1 and 1024, not {n}")
        store_kw["default_queue_nums"] = n
    if v.get("truncate-corrupt"):
        store_kw["truncate_corrupt"] = True
    cfg = BrokerConfig(store=StoreConfig(**store_kw))
    if "delay-levels" in v:
        cfg = BrokerConfig(store=cfg.store, delay_levels=v["delay-levels"])
    if "transaction-timeout" in v:
        cfg.transaction_timeout_s = pos("transaction-timeout", v["transaction-timeout"])
    if "transaction-check-interval" in v:
        cfg.transaction_check_interval_s = pos("transaction-check-interval", v["transaction-check-interval"])
    if "transaction-check-max" in v:
        cfg.transaction_check_max = int(pos("transaction-check-max", v["transaction-check-max"]))
    if "timer-precision-ms" in v:
        cfg.timer_precision_ms = int(pos("timer-precision-ms", v["timer-precision-ms"]))
    if "timer-max-delay-s" in v:
        cfg.timer_max_delay_s = int(pos("timer-max-delay-s", v["timer-max-delay-s"]))
    if "broker-name" in v:
        name = v["broker-name"].strip()
        if not name or " " in name:
            raise ConfigError("--broker-name must be a non-empty word")
        cfg.broker_name = name
    opt_kw: dict[str, Any] = {}
    if "listen" in v:
        opt_kw["listen"] = v["listen"]
    if "idle-exit-s" in v:
        opt_kw["idle_exit_s"] = max(0.0, v["idle-exit-s"])
    if "acl" in v:
        opt_kw["acl_path"] = v["acl"]
    if "acl-window-s" in v:
        opt_kw["acl_window_ms"] = int(pos("acl-window-s", v["acl-window-s"]) * 1000)
    if "max-delivery-attempts" in v:
        opt_kw["max_delivery_attempts"] = v["max-delivery-attempts"]
    if "min-invisible-s" in v:
        opt_kw["min_invisible_ms"] = int(v["min-invisible-s"] * 1000)
    if "long-polling-max-s" in v:
        opt_kw["long_polling_max_ms"] = int(v["long-polling-max-s"] * 1000)
    if "auto-renew-invisible-s" in v:
        opt_kw["auto_renew_invisible_ms"] = int(pos("auto-renew-invisible-s", v["auto-renew-invisible-s"]) * 1000)
    if "workers" in v:
        opt_kw["workers"] = v["workers"]
    options = BrokerOptions(**opt_kw)
    split_listen(options.listen)
    store = ns.store or values.get("store")
    if not store:
        raise ConfigError("--store DIR is required")
    return ParsedArgs(os.path.abspath(str(store)), cfg, options)


def split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--listen {listen!r} is not HOST:PORT")
    return host, int(port)
