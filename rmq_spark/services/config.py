"""The configuration of a broker's services (the store's part is :class:`StoreConfig`), and the
delay levels of the schedule service."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rmq_spark.errors import ConfigError
from rmq_spark.store.store import StoreConfig

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> list[int]:
    """``"1s 5s 1m"`` -> delays in ms, level 1 first (RocketMQ's ``messageDelayLevel``)."""
    out = []
    for tok in text.split():
        for unit in ("ms", "s", "m", "h", "d"):
            if tok.endswith(unit) and tok[: -len(unit)].isdigit():
                out.append(int(tok[: -len(unit)]) * _UNITS_MS[unit])
                break
        else:
            raise ConfigError(f"delay level {tok!r} is not a number followed by ms, s, m, h or d")
    if not out:
        raise ConfigError("delay levels are empty")
    return out


@dataclass
class BrokerConfig:
    """Everything a broker needs; the store's part is ``store``."""

    store: StoreConfig = field(default_factory=StoreConfig)
    delay_levels: str = DEFAULT_DELAY_LEVELS
    transaction_timeout_s: float = 6.0
    transaction_check_interval_s: float = 30.0
    transaction_check_max: int = 15
    timer_max_delay_s: int = 3 * 24 * 3600
    timer_precision_ms: int = 100
    broker_name: str = "rmq-spark-broker"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.delay_levels_ms = parse_delay_levels(self.delay_levels)
