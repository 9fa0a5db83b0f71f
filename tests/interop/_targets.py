"""The servers the interop tests run the Java programs against ("targets").

- ``apache``: a real Apache RocketMQ from Maven Central's jars (``_apache.ApacheRocketMQ``), a
  NameServer and two brokers of one cluster.
- ``rmq-broker``: this project's broker with its remoting server and NameServer
  (``python -m rmq_spark.broker ... --remoting-listen 127.0.0.1:0 --namesrv-listen 127.0.0.1:0``).

``RMQ_INTEROP_TARGETS`` (comma-separated) picks them; the default is both.  Every target answers the same questions: its NameServer
address, its cluster and broker names; topics are created with the real mqadmin on every
broker of the cluster.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from _apache import GET_BROKER_CLUSTER_INFO, ApacheRocketMQ, remoting_request
from _java import JavaPrograms

__all__ = ["ApacheTarget", "RmqBrokerTarget", "Target", "cluster_info", "enabled_targets"]

TARGETS_ENV = "RMQ_INTEROP_TARGETS"
ALL_TARGETS = ("apache", "rmq-broker")
DEFAULT_TARGETS = ("apache", "rmq-broker")


def enabled_targets() -> list[str]:
    raw = os.environ.get(TARGETS_ENV, "")
    names = [n.strip() for n in raw.split(",") if n.strip()] or list(DEFAULT_TARGETS)
    unknown = [n for n in names if n not in ALL_TARGETS]
    if unknown:
        raise ValueError(f"{TARGETS_ENV}: unknown target(s) {unknown}; known: {list(ALL_TARGETS)}")
    return names


def cluster_info(namesrv_addr: str) -> dict[str, list[str]]:
    """Cluster name -> broker names, from the NameServer (GET_BROKER_CLUSTER_INFO)."""
    header, body = remoting_request(namesrv_addr, GET_BROKER_CLUSTER_INFO)
    if header.get("code") != 0:
        raise RuntimeError(f"GET_BROKER_CLUSTER_INFO failed: {header}")
    # fastjson writes brokerAddrs' Long keys unquoted ({0:"host:port"}); quote them for json
    text = re.sub(r"([{,])(-?\d+):", r'\1"\2":', body.decode())
    return {
        cluster: sorted(names) for cluster, names in json.loads(text)["clusterAddrTable"].items()
    }


class Target:
    """What a test needs of a server; subclasses start and stop it."""

    name: str
    namesrv_addr: str
    cluster: str
    broker_names: list[str]

    def create_topic(
        self, programs: JavaPrograms, home: Path, topic: str, queues: int = 4, order: bool = False
    ) -> None:
        """mqadmin updateTopic on every broker of the cluster, then waits for the route.  Tried up
        to three times (it is idempotent): mqadmin's requests time out after 3 s, which a loaded
        machine can exceed, and it then prints its exception on stderr and exits 0."""
        for _attempt in range(3):
            out = programs.mqadmin(
                "updateTopic",
                "-n",
                self.namesrv_addr,
                "-c",
                self.cluster,
                "-t",
                topic,
                "-r",
                str(queues),
                "-w",
                str(queues),
                "-o",
                str(order).lower(),
                home=home,
            )
            if out.count("success") >= len(self.broker_names):
                break
            time.sleep(1.0)
        else:
            raise AssertionError(f"updateTopic {topic}: {out}\n{programs.last_stderr}")
        self.wait_route(topic)

    def wait_route(self, topic: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class ApacheTarget(Target):
    name = "apache"

    def __init__(self, workdir: Path) -> None:
        self.cluster_process = ApacheRocketMQ(workdir).start()
        self.namesrv_addr = self.cluster_process.namesrv_addr
        self.cluster = self.cluster_process.cluster
        self.broker_names = list(self.cluster_process.broker_names)

    def wait_route(self, topic: str) -> None:
        self.cluster_process.wait_route(topic)

    def close(self) -> None:
        self.cluster_process.close()


class RmqBrokerTarget(Target):
    """``python -m rmq_spark.broker`` with its remoting server and NameServer on free ports.

    The ready line must name the NameServer endpoint as ``namesrv=HOST:PORT`` (issue 19: "the
    ready line names every endpoint"); it is the one thing read from it.
    """

    name = "rmq-broker"
    NAMESRV = re.compile(r"namesrv[=\s]+(\S+:\d+)")
    START_TIMEOUT_S = 60.0

    def __init__(self, workdir: Path) -> None:
        store = workdir / "store"
        store.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "rmq-broker.log"
        self._log: IO[bytes] = open(self.log_path, "ab")  # noqa: SIM115 -- closed in close()
        cmd = [
            sys.executable,
            "-m",
            "rmq_spark.broker",
            "--store",
            str(store),
            "--listen",
            "127.0.0.1:0",
            "--remoting-listen",
            "127.0.0.1:0",
            "--namesrv-listen",
            "127.0.0.1:0",
            # check-backs within seconds, as the Apache target's transactionCheckInterval=1000
            "--transaction-check-interval",
            "1",
            "--transaction-timeout",
            "1",
        ]
        try:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL
            )
        except BaseException:
            self._log.close()
            raise
        try:
            self.ready_line = self._await_ready()
            m = self.NAMESRV.search(self.ready_line)
            if m is None:
                raise RuntimeError(
                    f"rmq-broker's ready line names no namesrv=HOST:PORT: {self.ready_line!r}"
                )
            self.namesrv_addr = m.group(1)
            grpc = re.search(r"listening on (\S+:\d+)", self.ready_line)
            self.grpc_endpoint = grpc.group(1) if grpc else ""
            clusters = cluster_info(self.namesrv_addr)
            self.cluster, self.broker_names = next(iter(clusters.items()))
        except BaseException:
            self.close()
            raise

    def _await_ready(self) -> str:
        assert self.proc.stdout is not None
        buf = b""
        deadline = time.monotonic() + self.START_TIMEOUT_S
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buf:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rmq-broker not ready in {self.START_TIMEOUT_S}s")
                if not sel.select(0.5):
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    raise RuntimeError(
                        f"rmq-broker exited with {self.proc.wait()}: {self.log_tail()}"
                    )
                buf += chunk
        return buf.split(b"\n", 1)[0].decode()

    def log_tail(self, n: int = 2000) -> str:
        return self.log_path.read_bytes()[-n:].decode(errors="replace")

    def wait_route(self, topic: str) -> None:
        from _apache import GET_ROUTEINFO_BY_TOPIC

        deadline = time.monotonic() + 30.0
        while True:
            header, _ = remoting_request(
                self.namesrv_addr,
                GET_ROUTEINFO_BY_TOPIC,
                {"topic": topic, "acceptStandardJsonOnly": "true"},
            )
            if header.get("code") == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no route for {topic}: {header}")
            time.sleep(0.2)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.kill(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._log.close()
