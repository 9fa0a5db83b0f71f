"""``/metrics`` over HTTP, bounded: every connection has a deadline (``timeout_s`` from accept to
close, whatever the client sends or does not send), and at most ``max_connections`` are served at
once; a connection past that is answered ``503`` and closed at once, in the accepting thread.

prometheus_client's own ``start_http_server`` gives each connection a thread with no timeout: 300
idle connections held 300 threads, for ever (issue 28, item 18).  Here one reaper thread shuts a
connection down when its deadline passes (a blocked read or write then returns), so neither an
idle client nor one trickling a byte a second holds a thread longer than ``timeout_s``.
"""

from __future__ import annotations

import logging
import math
import socket
import sys
import threading
import time
from http.server import HTTPServer
from socketserver import TCPServer, ThreadingMixIn
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler

__all__ = ["MAX_SCRAPE_CONNECTIONS", "SCRAPE_TIMEOUT_S", "MetricsHttpServer"]

log = logging.getLogger("rmq_spark.broker.metrics")

# Prometheus' default scrape_timeout: a scrape still running after it is abandoned by the scraper
SCRAPE_TIMEOUT_S = 10.0
# two Prometheus servers of an HA pair, a few people with curl, and room for their retries
MAX_SCRAPE_CONNECTIONS = 16
_BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _Server(ThreadingMixIn, HTTPServer):
    daemon_threads = True
    block_on_close = False  # no list of every thread ever started
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], handler: type, family: int, timeout_s: float,
                 max_connections: int) -> None:  # fmt: skip
        self.address_family = family
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.deadlines: dict[socket.socket, float] = {}  # each served connection -> its deadline
        self.cond = threading.Condition()
        self.closing = False
        self.refused = 0  # connections answered 503 (over max_connections)
        self.expired = 0  # connections shut at their deadline
        super().__init__(addr, handler)

    def server_bind(self) -> None:
        TCPServer.server_bind(self)  # not HTTPServer's: no reverse DNS lookup of the address
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.cond:
            busy = self.closing or len(self.deadlines) >= self.max_connections
            if busy:
                self.refused += 1
            else:
                self.deadlines[request] = time.monotonic() + self.timeout_s
                self.cond.notify()
        if busy:
            try:
                request.setblocking(False)
                request.send(_BUSY)
            except OSError:
                pass
            TCPServer.shutdown_request(self, request)
            return
        super().process_request(request, client_address)  # a thread of its own

    def shutdown_request(self, request: Any) -> None:
        with self.cond:
            self.deadlines.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client gone, or shut at its deadline, while it was answered: nothing for the log's ERROR
        log.debug("metrics connection from %s ended: %r", client_address, sys.exc_info()[1])

    def active(self) -> int:
        with self.cond:
            return len(self.deadlines)

    def reap(self) -> None:
        """Shut each connection down when its deadline passes (its thread's read or write then
        returns, the handler ends and the connection is closed)."""
        with self.cond:
            while not self.closing:
                now = time.monotonic()
                for conn, deadline in list(self.deadlines.items()):
                    if deadline <= now:
                        _shut(conn)
                        self.deadlines[conn] = math.inf  # shut once; its thread's end removes it
                        self.expired += 1
                pending = [d for d in self.deadlines.values() if d != math.inf]
                self.cond.wait(max(0.0, min(pending) - now) if pending else None)

    def close_all(self) -> None:
        with self.cond:
            self.closing = True
            for conn in self.deadlines:
                _shut(conn)
            self.cond.notify_all()


def _shut(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already gone


class MetricsHttpServer:
    """``registry`` at any path of ``host:port`` (port 0: a free one), in threads of its own."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, *, timeout_s: float = SCRAPE_TIMEOUT_S,
                 max_connections: int = MAX_SCRAPE_CONNECTIONS) -> None:  # fmt: skip
        if not (timeout_s > 0 and math.isfinite(timeout_s)) or max_connections < 1:
            raise ValueError(
                f"timeout_s {timeout_s} and max_connections {max_connections} must be positive"
            )
        bind = host.strip("[]") or "0.0.0.0"
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        handler = type(
            "ScrapeHandler", (MetricsHandler,), {"registry": registry, "timeout": timeout_s}
        )
        self._server = _Server((bind, port), handler, family, timeout_s, max_connections)
        self.port = int(self._server.server_address[1])
        self._reaper = threading.Thread(
            target=self._server.reap, name="metrics-deadlines", daemon=True
        )
        self._reaper.start()
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-http", daemon=True
        )
        self._thread.start()

    @property
    def active_connections(self) -> int:
        return self._server.active()

    @property
    def refused_connections(self) -> int:
        return self._server.refused

    @property
    def expired_connections(self) -> int:
        return self._server.expired

    def stop(self) -> None:
        self._server.shutdown()  # serve_forever returns
        self._server.server_close()
        self._server.close_all()
        self._thread.join(5)
        self._reaper.join(5)
