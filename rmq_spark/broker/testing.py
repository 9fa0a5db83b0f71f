"""Running ``rmq-broker`` processes, or its connector service in this process, from tests and
benchmarks.

    with BrokerProcess(store_dir, "--min-invisible-s", "1") as broker:
        config = client_configuration(broker.endpoints)

The process binds 127.0.0.1 with a free port (read from its ready line) and is stopped by pid:
SIGTERM, then SIGKILL after a timeout.  Its stderr goes to ``<store>/../broker-<pid>.log`` unless
``log_path`` says otherwise.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["READY", "BrokerProcess", "InternalServer", "client_configuration", "metadata"]

READY = re.compile(
    r"^rmq-broker listening on (\S+):(\d+) store=(.+?)(?: remoting=(\S+))?(?: namesrv=(\S+))?(?: metrics=(\S+))?$"
)


class BrokerProcess:
    def __init__(
        self,
        store: str,
        *flags: str,
        start_timeout_s: float = 30.0,
        log_path: str | None = None,
        listen: str = "127.0.0.1:0",
        program: list[str] | None = None,
    ) -> None:
        """``program`` replaces ``python -m rmq_spark.broker`` (a peer server printing the same
        ready line)."""
        self.store = store
        self.log_path = log_path or os.path.join(
            os.path.dirname(os.path.abspath(store)), "broker-stderr.log"
        )
        cmd = [
            *(program or [sys.executable, "-m", "rmq_spark.broker"]),
            "--store",
            store,
            "--listen",
            listen,
            *flags,
        ]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed by close()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL
        )
        self.pid = self.proc.pid
        self.host = ""
        self.port = 0
        try:
            self._await_ready(start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _await_ready(self, timeout_s: float) -> None:
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        buf = b""
        try:
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"broker did not start in {timeout_s}s: {self.log_tail()}")
                if not sel.select(left):
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    raise RuntimeError(f"broker exited with {self.proc.wait()}: {self.log_tail()}")
                buf += chunk
        finally:
            sel.close()
        self.ready_line = buf.split(b"\n", 1)[0].decode()
        m = READY.match(self.ready_line)
        if m is None:
            raise RuntimeError(f"unexpected ready line {self.ready_line!r}")
        self.host, self.port = m.group(1), int(m.group(2))
        self.remoting_endpoint: str | None = m.group(4)
        self.namesrv_endpoint: str | None = m.group(5)
        self.metrics_endpoint: str | None = m.group(6)

    @property
    def endpoints(self) -> str:
        return f"{self.host}:{self.port}"

    def log_tail(self, n: int = 2000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout_s: float = 15.0, sig: int = signal.SIGTERM) -> int:
        """Signal the process (by pid), wait, SIGKILL on timeout; returns its exit code."""
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
        return self.proc.returncode

    def kill(self) -> int:
        return self.stop(timeout_s=10, sig=signal.SIGKILL)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def client_configuration(
    endpoints: str, access_key: str = "", secret_key: str = "", request_timeout: int = 3
) -> Any:
    """The official Python client's configuration for ``endpoints``."""
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(
        endpoints, Credentials(access_key, secret_key), request_timeout=request_timeout
    )


def metadata(
    client_id: str = "rmq-test-client", access_key: str = "", secret_key: str = ""
) -> list[tuple[str, str]]:
    """Headers as the official clients send them (signed when a key is given), for raw stubs."""
    import datetime
    import hashlib
    import hmac
    import uuid

    date = datetime.datetime.now().strftime("%Y%m%dT%H%M%SZ")
    md = [
        ("x-mq-client-id", client_id),
        ("x-mq-request-id", str(uuid.uuid4())),
        ("x-mq-date-time", date),
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
    ]
    if access_key:
        sig = hmac.new(secret_key.encode(), date.encode(), hashlib.sha1).hexdigest()
        md.append(
            (
                "authorization",
                f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, Signature={sig}",
            )
        )
    return md


class InternalServer:
    """A :class:`~rmq_spark.services.core.BrokerCore` on ``root`` served in this process on the
    connector's internal gRPC service (127.0.0.1, a free port), with a client of it: ``core``,
    ``connector`` (the service: its sink, its read workers), ``client``.  ``close`` stops them as
    the broker's stop does (queued group commits first)."""

    def __init__(
        self, root: str, *, clock: Any = None, read_workers: int = 0, client_timeout_s: float = 30.0
    ) -> None:
        from concurrent import futures

        import grpc

        from rmq_spark.broker.connector.client import CHANNEL_OPTIONS, InternalClient
        from rmq_spark.broker.connector.server import make_internal_handler
        from rmq_spark.services.core import BrokerCore

        self.root = root
        self.core = BrokerCore(root, clock=clock) if clock is not None else BrokerCore(root)
        self.server = grpc.server(futures.ThreadPoolExecutor(8), options=CHANNEL_OPTIONS)
        self.handler = make_internal_handler(self.core, read_workers)
        self.server.add_generic_rpc_handlers((self.handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.client = InternalClient(f"127.0.0.1:{self.port}", timeout_s=client_timeout_s)

    @property
    def connector(self) -> Any:
        return self.handler.connector

    def close(self) -> None:
        self.client.close()
        self.server.stop(0).wait()
        self.handler.connector.close()
        self.core.shutdown()
