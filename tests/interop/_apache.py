"""A real Apache RocketMQ, started from Maven Central's jars: a NameServer and N brokers of one
cluster, as separate JVM processes on 127.0.0.1, for the interop tests and the benchmarks.

    with ApacheRocketMQ(workdir, brokers=("broker-a", "broker-b")) as cluster:
        cluster.namesrv_addr                 # "127.0.0.1:PORT"
        cluster.stop_broker("broker-b")      # mid-test: SIGTERM, wait for exit
        cluster.start_broker("broker-b")     # same ports, same store; waits until registered

The classpath comes from ``java/server/pom.xml`` (``rocketmq-namesrv`` + ``rocketmq-broker``,
default version 5.5.0, the newest 5.x client's) by ``mvn dependency:build-classpath`` into a
cached file, ``java/server/target/classpath-<version>.txt``.  Every process gets a small heap, a
temporary store and ``-Duser.home`` (RocketMQ writes its logs to ``~/logs/rocketmqlogs`` and the
NameServer its kv config to ``~/namesrv``) under ``workdir``, and is stopped by pid: SIGTERM, then
SIGKILL after ``STOP_TIMEOUT_S``.

What running it on Java 17 needs (measured with 5.5.0): no ``--add-opens`` for the NameServer
and brokers; ``bindAddress=127.0.0.1`` keeps their remoting ports on loopback, but the HA port
(listenPort + 1) binds every interface whatever the config says.  A broker also listens on
listenPort - 2 (its "VIP" channel), so three ports are reserved per broker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import time
from pathlib import Path
from typing import IO

from _java import JAVA_DIR, maven, sources_digest

__all__ = [
    "SERVER_VERSION_DEFAULT",
    "ApacheProxy",
    "ApacheRocketMQ",
    "free_port",
    "remoting_request",
    "server_classpath",
    "tls_properties",
]

SERVER_VERSION_DEFAULT = "5.5.0"
SERVER_POM_DIR = JAVA_DIR / "server"
PROXY_POM_DIR = JAVA_DIR / "proxy"
PROXY_READY = "rocketmq-proxy startup successfully"
STOP_TIMEOUT_S = 20.0
# a loaded machine (other test runs sharing its cores) may need longer: RMQ_APACHE_START_TIMEOUT_S
START_TIMEOUT_S = float(os.environ.get("RMQ_APACHE_START_TIMEOUT_S", "120"))
NAMESRV_READY = "The Name Server boot success"
BROKER_READY = "boot success"
# Remoting request codes (remoting/.../protocol/RequestCode.java) the harness itself sends.
GET_ROUTEINFO_BY_TOPIC = 105
GET_BROKER_CLUSTER_INFO = 106
# version >= V4_9_4 (401) asks the NameServer for standard JSON (quoted numeric map keys).
REMOTING_VERSION = 401


def server_classpath(version: str = SERVER_VERSION_DEFAULT, pom_dir: Path = SERVER_POM_DIR) -> str:
    """The NameServer + broker classpath of ``version`` (``pom_dir``: another pom's, the
    proxy's), resolved once and cached in a file."""
    out = pom_dir / "target" / f"classpath-{version}.txt"
    stamp = out.with_suffix(".sha256")
    digest = sources_digest(pom_dir, ("pom.xml",)) + " " + version
    if not (out.is_file() and stamp.is_file() and stamp.read_text() == digest):
        out.parent.mkdir(parents=True, exist_ok=True)
        maven(
            [
                f"-Drocketmq.server.version={version}",
                "dependency:build-classpath",
                f"-Dmdep.outputFile={out}",
            ],
            cwd=pom_dir,
        )
        stamp.write_text(digest)
    return out.read_text().strip()


def tls_properties(
    cert: str | os.PathLike[str], key: str | os.PathLike[str], *, mode: str = "enforcing"
) -> dict[str, str]:
    """The system properties (``TlsSystemConfig``) of processes serving TLS with ``cert`` and its
    PKCS#8 PEM ``key``, and dialling each other with TLS (a broker registering with the
    NameServer: ``tls.enable``; its client trusts any server, ``tls.client.authServer`` being
    false).  ``tls.test.mode.enable`` (on by default) would serve a self-signed certificate
    instead; ``tls.config.file`` points at no file, so /etc/rocketmq/tls.properties is not read."""
    return {
        "tls.server.mode": mode,
        "tls.test.mode.enable": "false",
        "tls.server.certPath": str(cert),
        "tls.server.keyPath": str(key),
        "tls.server.need.client.auth": "none",
        "tls.server.authClient": "false",
        "tls.enable": "true",
        "tls.client.authServer": "false",
        "tls.config.file": os.devnull + ".absent",
    }


def free_port(*, neighbours: tuple[int, ...] = ()) -> int:
    """A free loopback port p such that p + d is free too for every d in ``neighbours``."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if all(_port_free(port + d) for d in neighbours):
            return port
    raise RuntimeError("no free port with free neighbours")


def _port_free(port: int) -> bool:
    if not 1024 < port < 65536:
        return False
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def remoting_request(
    addr: str,
    code: int,
    ext_fields: dict[str, str] | None = None,
    timeout_s: float = 3.0,
    body: bytes = b"",
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[dict, bytes]:
    """One remoting RPC with a JSON header: returns the response header and body.  Frame: int32
    length | int32 (serialize type << 24 | header length) | header | body.  ``ssl_context``:
    over TLS (a server with ``tls.server.mode=enforcing``)."""
    header = json.dumps(
        {
            "code": code,
            "language": "PYTHON",
            "version": REMOTING_VERSION,
            "opaque": 1,
            "flag": 0,
            "extFields": ext_fields or {},
        }
    ).encode()
    host, port = addr.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=timeout_s)
    s = raw
    try:
        if ssl_context is not None:
            s = ssl_context.wrap_socket(raw, server_hostname=host)  # closes raw with itself
        s.sendall(struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body)
        length = struct.unpack(">i", _recv_exact(s, 4))[0]
        frame = _recv_exact(s, length)
    finally:
        s.close()
        raw.close()
    header_len = struct.unpack(">i", frame[:4])[0] & 0xFFFFFF
    return json.loads(frame[4 : 4 + header_len]), frame[4 + header_len :]


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed mid-frame")
        buf += chunk
    return buf


# what 4.x's NameServer and broker log, and where (5.x carries its own configuration)
_LOGBACK_4X = """<?xml version="1.0" encoding="UTF-8"?>
<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>${{user.home}}/logs/rocketmqlogs/{name}.log</file>
    <encoder><pattern>%d{{yyy-MM-dd HH:mm:ss,GMT+8}} %p %t - %m%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
"""


class _JavaProcess:
    """One server JVM, its output in a log file, ready when the log shows ``ready_text``."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, ready_text: str) -> None:
        self.name = name
        self.log_path = log_path
        self.ready_text = ready_text
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 -- open for the process's life
        self._log_start = log_path.stat().st_size
        try:
            self.proc = subprocess.Popen(
                cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        except BaseException:
            self._log.close()
            raise
        self.pid = self.proc.pid
        self.started_at = time.monotonic()

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Seconds from start until the ready line; raises if the process exits or times out."""
        timeout_s = START_TIMEOUT_S if timeout_s is None else timeout_s
        deadline = self.started_at + timeout_s
        while time.monotonic() < deadline:
            if self.ready_text in self.log_text():
                return time.monotonic() - self.started_at
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready in {timeout_s}s:\n{self.log_tail()}")

    def log_text(self) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    def log_tail(self, n: int = 3000) -> str:
        return self.log_text()[-n:]

    def terminate(self) -> None:
        """SIGTERM: RocketMQ's shutdown hooks flush the store and unregister from the NameServer."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if the process is still up after ``STOP_TIMEOUT_S``."""
        try:
            self.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait()
        finally:
            self._log.close()


class ApacheRocketMQ:
    """A NameServer and ``brokers`` (one broker name each, master only) of cluster ``cluster``.

    ``broker_config`` adds or overrides broker.conf keys for every broker; ``jvm_properties``
    are ``-Dkey=value`` system properties of every process, the NameServer's too (the TLS
    settings: :func:`tls_properties`), with ``tls_context`` the harness's own queries of the
    NameServer go over TLS.  The defaults make the
    transaction check-back quick (first check after 1 s, then every second) and turn on SQL92
    filtering (``enablePropertyFilter``); CommitLog segments are 64 MiB instead of 1 GiB.
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        brokers: tuple[str, ...] = ("broker-a", "broker-b"),
        cluster: str = "InteropCluster",
        version: str = SERVER_VERSION_DEFAULT,
        heap: str = "256m",
        namesrv_heap: str = "128m",
        jvm_flags: tuple[str, ...] = ("-XX:+UseSerialGC",),
        broker_config: dict[str, str] | None = None,
        namesrv_addr: str | None = None,
        slaves: tuple[str, ...] = (),
        jvm_properties: dict[str, str] | None = None,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        """``namesrv_addr``: run no NameServer; the brokers register with that one (another
        NameServer, e.g. rmq-broker's).  ``slaves``: brokers of ``brokers`` that also get a
        slave (``brokerRole=SLAVE``, brokerId 1, a store of its own), a process named
        ``NAME-slave`` here (``stop_broker("broker-a")`` stops the master only)."""
        self.workdir = Path(workdir)
        self.cluster = cluster
        self.version = version
        self.heap = heap
        self.namesrv_heap = namesrv_heap
        self.jvm_flags = jvm_flags + tuple(f"-D{k}={v}" for k, v in (jvm_properties or {}).items())
        self.tls_context = tls_context
        self.slave_of = {f"{name}-slave": name for name in slaves}
        unknown = set(slaves) - set(brokers)
        if unknown:
            raise ValueError(f"slaves of brokers not in {brokers}: {sorted(unknown)}")
        self.broker_names = (*brokers, *self.slave_of)
        self.broker_config = broker_config or {}
        self.classpath = server_classpath(version)
        self.home = self.workdir / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        if version.startswith("4."):  # 4.x's NameServer and broker read logback files of home
            conf = self.home / "conf"
            conf.mkdir(exist_ok=True)
            for name in ("namesrv", "broker"):
                (conf / f"logback_{name}.xml").write_text(_LOGBACK_4X.format(name=name))
        self.own_namesrv = namesrv_addr is None
        self.namesrv_port = (
            free_port() if namesrv_addr is None else int(namesrv_addr.rpartition(":")[2])
        )
        self.namesrv_addr = namesrv_addr or f"127.0.0.1:{self.namesrv_port}"
        self.broker_ports: dict[str, int] = {}
        self.namesrv: _JavaProcess | None = None
        self.brokers: dict[str, _JavaProcess] = {}
        self.startup_s: dict[str, float] = {}

    # -- processes ------------------------------------------------------------------------------

    def _java(self, heap: str, main: str, conf: Path) -> list[str]:
        return [
            "java",
            f"-Xms{heap}",
            f"-Xmx{heap}",
            *self.jvm_flags,
            f"-Duser.home={self.home}",
            f"-Drocketmq.home.dir={self.home}",
            "-cp",
            self.classpath,
            main,
            "-c",
            str(conf),
        ]

    def start(self) -> ApacheRocketMQ:
        """Starts the NameServer, then every broker in parallel; returns once all registered."""
        try:
            if self.own_namesrv:
                conf = self.workdir / "namesrv.conf"
                conf.write_text(f"listenPort={self.namesrv_port}\nbindAddress=127.0.0.1\n")
                self.namesrv = _JavaProcess("namesrv", self._java(self.namesrv_heap,
                                                                  "org.apache.rocketmq.namesrv.NamesrvStartup", conf),
                                            self.workdir / "namesrv.log", NAMESRV_READY)  # fmt: skip
                self.startup_s["namesrv"] = self.namesrv.wait_ready()
            # A broker registers once at start and then every 30 s, so it must find the NameServer up.
            for name in self.broker_names:
                self._spawn_broker(name)
            for name in self.broker_names:
                self._await_broker(name)
        except BaseException:
            self.close()
            raise
        return self

    def _spawn_broker(self, name: str) -> None:
        if name not in self.broker_ports:
            self.broker_ports[name] = free_port(neighbours=(-2, 1))
        port = self.broker_ports[name]
        store = self.workdir / name / "store"
        slave_of = self.slave_of.get(name)
        settings = {
            "brokerClusterName": self.cluster,
            "brokerName": slave_of or name,
            "brokerId": "1" if slave_of else "0",
            "brokerRole": "SLAVE" if slave_of else "ASYNC_MASTER",
            "flushDiskType": "ASYNC_FLUSH",
            "listenPort": str(port),
            "bindAddress": "127.0.0.1",
            "brokerIP1": "127.0.0.1",
            "namesrvAddr": self.namesrv_addr,
            "storePathRootDir": str(store),
            "storePathCommitLog": str(store / "commitlog"),
            "mappedFileSizeCommitLog": str(64 * 1024 * 1024),
            "enablePropertyFilter": "true",
            "transactionCheckInterval": "1000",
            "transactionTimeOut": "1000",
            # 5.x batches the op messages of ended halves (TransactionalOpBatchService).  Once a
            # queue's batch has been idle longer than transactionOpBatchInterval, its
            # batchSendOpMessage returns 0 and the service wakes itself again at once: a thread
            # at a full core for the rest of the broker's life (measured: 14 CPU minutes in
            # 20 minutes of the suite).  An op written as soon as a half ends (max size 1) and a
            # long interval keep it asleep between ends.
            "transactionOpMsgMaxSize": "1",
            "transactionOpBatchInterval": "86400000",
            **self.broker_config,
        }
        conf = self.workdir / f"{name}.conf"
        conf.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        self.brokers[name] = _JavaProcess(
            name,
            self._java(self.heap, "org.apache.rocketmq.broker.BrokerStartup", conf),
            self.workdir / f"{name}.log",
            BROKER_READY,
        )

    def _await_broker(self, name: str) -> None:
        proc = self.brokers[name]
        proc.wait_ready()
        self.wait_registered(name, registered=True)
        self.startup_s[name] = time.monotonic() - proc.started_at

    def stop_broker(self, name: str, *, kill: bool = False) -> None:
        """Stops one broker and waits until the NameServer no longer lists it: SIGTERM (its
        shutdown hook takes about 11 s with 5.5.0), or with ``kill`` SIGKILL, a crash (the
        NameServer notices the closed connection at once; the store recovers on restart)."""
        proc = self.brokers.pop(name)
        if kill and proc.proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.stop()
        self.wait_registered(name, registered=False)

    def start_broker(self, name: str) -> None:
        """Starts a stopped broker again on its ports and store; waits until it is registered."""
        if name in self.brokers:
            raise RuntimeError(f"{name} is running")
        self._spawn_broker(name)
        self._await_broker(name)

    def close(self) -> None:
        """Stops every broker, then the NameServer; every process by its pid."""
        errors: list[BaseException] = []
        brokers = [self.brokers.pop(name) for name in list(self.brokers)]
        for proc in brokers:  # all at once: a broker's shutdown takes seconds
            try:
                proc.terminate()
            except OSError as e:
                errors.append(e)
        for proc in brokers:
            try:
                proc.stop()
            except (OSError, subprocess.SubprocessError) as e:  # keep stopping the others
                errors.append(e)
        if self.namesrv is not None:
            self.namesrv.stop()
            self.namesrv = None
        if errors:
            raise errors[0]

    def __enter__(self) -> ApacheRocketMQ:  # noqa: PYI034 -- typing.Self needs 3.11
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        procs = [*self.brokers.values(), *([self.namesrv] if self.namesrv else [])]
        return [p.pid for p in procs]

    # -- NameServer queries ---------------------------------------------------------------------

    def broker_addr(self, name: str) -> str:
        return f"127.0.0.1:{self.broker_ports[name]}"

    def wait_registered(self, name: str, *, registered: bool, timeout_s: float = 30.0) -> None:
        """Waits until the NameServer's cluster info does (or no longer does) list ``name``."""
        addr = self.broker_addr(name)
        deadline = time.monotonic() + timeout_s
        while True:
            header, body = remoting_request(
                self.namesrv_addr, GET_BROKER_CLUSTER_INFO, ssl_context=self.tls_context
            )
            listed = header.get("code") == 0 and addr.encode() in body
            if listed == registered:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{name} ({addr}) {'not' if registered else 'still'} registered after {timeout_s}s"
                )
            time.sleep(0.2)

    def wait_route(
        self, topic: str, brokers: tuple[str, ...] | None = None, timeout_s: float = 30.0
    ) -> None:
        """Waits until the NameServer's route of ``topic`` names every broker of ``brokers``."""
        wanted = (
            brokers
            if brokers is not None
            else tuple(dict.fromkeys(self.slave_of.get(n, n) for n in self.brokers))
        )
        deadline = time.monotonic() + timeout_s
        while True:
            header, body = remoting_request(
                self.namesrv_addr,
                GET_ROUTEINFO_BY_TOPIC,
                {"topic": topic, "acceptStandardJsonOnly": "true"},
                ssl_context=self.tls_context,
            )
            if header.get("code") == 0:
                route = json.loads(body)
                names = {q["brokerName"] for q in route.get("queueDatas", [])}
                if set(wanted) <= names:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"route of {topic} does not name {wanted} after {timeout_s}s: {header} {body[:500]!r}"
                )
            time.sleep(0.2)


class ApacheProxy:
    """A RocketMQ 5 proxy (``ProxyStartup -pm cluster``) in front of ``cluster``'s brokers: its
    remoting port (``remoting_addr``, what a remoting client takes as its ``namesrvAddr``) and
    its gRPC port, on 127.0.0.1, with a small heap; stopped by pid."""

    def __init__(
        self, workdir: str | os.PathLike[str], cluster: ApacheRocketMQ, *, heap: str = "256m"
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.remoting_port = free_port()
        self.grpc_port = free_port()
        self.remoting_addr = f"127.0.0.1:{self.remoting_port}"
        conf = self.workdir / "rmq-proxy.json"
        conf.write_text(
            json.dumps(
                {
                    "rocketMQClusterName": cluster.cluster,
                    "namesrvAddr": cluster.namesrv_addr,
                    "remotingListenPort": self.remoting_port,
                    "grpcServerPort": self.grpc_port,
                    "proxyMode": "cluster",
                }
            )
        )
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        cmd = [
            "java",
            f"-Xms{heap}",
            f"-Xmx{heap}",
            *cluster.jvm_flags,
            f"-Duser.home={home}",
            f"-Drocketmq.home.dir={home}",
            f"-Dcom.rocketmq.proxy.configPath={conf}",
            "-cp",
            server_classpath(cluster.version, PROXY_POM_DIR),
            "org.apache.rocketmq.proxy.ProxyStartup",
            "-pm",
            "cluster",
        ]
        self.proc = _JavaProcess("proxy", cmd, self.workdir / "proxy.log", PROXY_READY)
        try:
            self.startup_s = self.proc.wait_ready()
        except BaseException:
            self.proc.stop()
            raise

    def close(self) -> None:
        self.proc.stop()

    def __enter__(self) -> ApacheProxy:  # noqa: PYI034 -- typing.Self needs 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
