"""The remoting server's limits: how many connections it admits, how much queued work one
connection and all of them may hold, and a log that no client can flood.

Connections
    A server admits at most ``max_connections`` (default :data:`MAX_CONNECTIONS`), and every
    remoting server of the process together at most the descriptor limit (``RLIMIT_NOFILE``,
    read at each accept) minus a reserve (:func:`fd_reserve`) kept for the store's segment files,
    so that a crowd of connections can never make a send fail for want of a descriptor.  A
    connection past a limit is closed as it is accepted.

Queued work
    A blocking request (a send waiting for its fdatasync with ``--flush sync``) waits for the
    thread pool holding its frame (in its connection's turn: :mod:`rmq_spark.remoting.work`).
    One connection may hold :data:`CONN_INFLIGHT_MAX` such requests (or
    :data:`CONN_INFLIGHT_MAX_BYTES` of frames): past that the server stops reading it until they
    are done, as it does when the client stops reading its answers.  All connections together may
    hold :data:`TOTAL_INFLIGHT_MAX` (or :data:`TOTAL_INFLIGHT_MAX_BYTES`); a blocking request past
    that is answered ``SYSTEM_BUSY`` at once, as RocketMQ answers past its send queue.

Logs
    :class:`RateLimitedLog` writes a line for a key at most once per interval and counts the ones
    it held back (unknown request codes, bad frames, refused connections, handler faults).
"""

from __future__ import annotations

import logging
import resource
import threading
import time
from collections import OrderedDict
from typing import Any

__all__ = [
    "CONN_INFLIGHT_MAX",
    "CONN_INFLIGHT_MAX_BYTES",
    "MAX_CONNECTIONS",
    "PROCESS_CONNECTIONS",
    "TOTAL_INFLIGHT_MAX",
    "TOTAL_INFLIGHT_MAX_BYTES",
    "ConnectionBudget",
    "RateLimitedLog",
    "fd_reserve",
    "fd_soft_limit",
]

MAX_CONNECTIONS = 10_000
# descriptors kept for the store (two per mapped segment: the file and mmap's duplicate) and the
# gRPC port: a quarter of the limit, at least this many
FD_RESERVE_MIN = 256
CONN_INFLIGHT_MAX = 64
CONN_INFLIGHT_MAX_BYTES = 32 << 20
# RocketMQ's sendThreadPoolQueueCapacity is 10,000; frames here are held in memory whole
TOTAL_INFLIGHT_MAX = 4096
TOTAL_INFLIGHT_MAX_BYTES = 256 << 20
LOG_INTERVAL_S = 10.0
SYSTEM_BUSY_REMARK = "[OVERLOAD]system busy, start flow control for a while"


def fd_soft_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else int(soft)


def fd_reserve(soft: int) -> int:
    return max(FD_RESERVE_MIN, soft // 4)


class ConnectionBudget:
    """Remoting connections open in this process (every server shares its descriptors)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.open = 0

    def admit(self, server_open: int, max_connections: int, fileno: int) -> str | None:
        """None when a new connection (on descriptor ``fileno``) may stay, else why not."""
        soft = fd_soft_limit()
        reserve = fd_reserve(soft)
        with self._lock:
            if server_open >= max_connections:
                return f"the server's limit of {max_connections} connections is reached"
            if self.open >= soft - reserve:
                return (f"{self.open} connections hold the descriptors this process may give them "
                        f"(limit {soft}, {reserve} kept for the store)")  # fmt: skip
            if fileno >= soft - reserve // 2:
                return (
                    f"descriptor {fileno} is within the {reserve} kept for the store (limit {soft})"
                )
            self.open += 1
        return None

    def release(self) -> None:
        with self._lock:
            self.open -= 1


PROCESS_CONNECTIONS = ConnectionBudget()


class RateLimitedLog:
    """Log a line per key at most once per ``interval_s``; the next line says how many were held
    back.  Thread-safe; remembers at most ``max_keys`` keys."""

    def __init__(
        self, logger: logging.Logger, interval_s: float = LOG_INTERVAL_S, max_keys: int = 1024
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._seen: OrderedDict[Any, list[float]] = OrderedDict()  # key -> [last logged, held back]

    def log(self, key: Any, level: int, msg: str, *args: Any, exc_info: Any = None) -> bool:
        now = time.monotonic()
        with self._lock:
            entry = self._seen.get(key)
            if entry is not None and now - entry[0] < self.interval_s:
                entry[1] += 1
                return False
            held = int(entry[1]) if entry is not None else 0
            self._seen[key] = [now, 0]
            self._seen.move_to_end(key)
            while len(self._seen) > self.max_keys:
                self._seen.popitem(last=False)
        if held:
            msg += f" ({held} more like it in the last {self.interval_s:.0f}s not logged)"
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True
