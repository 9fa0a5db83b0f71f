"""A single-node Kafka broker (KRaft, broker and controller in one JVM) for the benchmarks.

    with KafkaBroker.start(work_dir) as kafka:
        kafka.create_topic("Bench", partitions=4)
        ... kafka.bootstrap ...          # "127.0.0.1:<port>"

Nothing is installed: the broker's classpath (``org.apache.kafka:kafka_2.13`` and its runtime
dependencies, plus ``slf4j-simple`` because the core artifact ships no logging backend) is resolved
once with ``mvn dependency:build-classpath`` on a generated pom.  Everything is kept under
``$RMQ_SPARK_CACHE`` (default ``~/.cache/rmq_spark/``): Maven's local repository for these jars
(``m2/``), the resolved classpath (``kafka_2.13-<v>/classpath.txt``, so later runs start without
Maven) and Spark's Ivy cache for the connector (``ivy/``, :func:`ivy_dir`).

Start-up is the quickstart's, done by hand: a generated ``server.properties``
(``process.roles=broker,controller``, ``node.id=1``, a static voter on a free port, log dirs in the
work directory, replication factors 1), ``kafka.tools.StorageTool format``, then ``kafka.Kafka``.
The broker serves once a topic can be created: topics are created by a small Java program run with
the same classpath (the Admin client is in ``kafka-clients``), which retries until the broker
answers.  The broker is stopped by its pid when the ``with`` block ends, also on error.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Self

# The newest kafka_2.13 on Maven Central; its classes are Java 17 bytecode (class version 61), and
# Kafka 4.x brokers need Java 17 or later.
KAFKA_VERSION = "4.4.0"
# kafka-clients 4.4.0 depends on slf4j-api 1.7.36: the matching 1.7 binding.
SLF4J_VERSION = "1.7.36"
BROKER_HEAP = "-Xmx1g"
START_TIMEOUT_S = 120.0

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>rmq_spark.bench</groupId>
  <artifactId>kafka-broker-classpath</artifactId>
  <version>1</version>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>{slf4j}</version>
    </dependency>
  </dependencies>
</project>
"""

SERVER_PROPERTIES = """process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{broker_port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{broker_port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={log_dir}
num.partitions=4
offsets.topic.replication.factor=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
message.max.bytes=16777216
"""

# Run with ``java <file> ...`` (the JDK's source launcher): no build step, and the Admin client is
# already on the broker's classpath.
CREATE_TOPIC_JAVA = """
import java.util.*;
import org.apache.kafka.clients.admin.*;

public class CreateTopic {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, args[3]);
        try (Admin admin = Admin.create(p)) {
            NewTopic t = new NewTopic(args[1], Integer.parseInt(args[2]), (short) 1);
            admin.createTopics(List.of(t)).all().get();
        }
    }
}
"""


class KafkaError(RuntimeError):
    """The broker could not be resolved, formatted, started or reached; the message names the log."""


def cache_dir() -> str:
    return os.environ.get("RMQ_SPARK_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "rmq_spark"
    )


def maven_repo() -> str:
    """Where Maven keeps the broker's jars: the project's cache, not ``~/.m2``."""
    return os.path.join(cache_dir(), "m2")


def ivy_dir() -> str:
    """Spark's Ivy directory for ``spark.jars.packages`` (``spark.jars.ivy``): the project's cache."""
    return os.path.join(cache_dir(), "ivy")


def broker_classpath(version: str = KAFKA_VERSION) -> tuple[str, bool]:
    """The broker's classpath and whether it came from the cache (False: Maven resolved it now)."""
    cache = os.path.join(cache_dir(), f"kafka_2.13-{version}")
    cp_file = os.path.join(cache, "classpath.txt")
    if os.path.exists(cp_file):
        with open(cp_file) as f:
            classpath = f.read().strip()
        jars = classpath.split(os.pathsep)
        if classpath and all(os.path.exists(j) and j.startswith(maven_repo()) for j in jars):
            return classpath, True
    os.makedirs(cache, exist_ok=True)
    with open(os.path.join(cache, "pom.xml"), "w") as f:
        f.write(POM.format(kafka=version, slf4j=SLF4J_VERSION))
    log = os.path.join(cache, "mvn.log")
    with open(log, "w") as out:
        rc = subprocess.call(
            [
                "mvn",
                "-B",
                "-q",
                f"-Dmaven.repo.local={maven_repo()}",
                "dependency:build-classpath",
                f"-Dmdep.outputFile={cp_file}",
            ],
            cwd=cache,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if rc != 0 or not os.path.exists(cp_file):
        raise KafkaError(f"mvn could not resolve kafka_2.13:{version} (exit {rc}); see {log}")
    with open(cp_file) as f:
        return f.read().strip(), False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cluster_id() -> str:
    """A Kafka Uuid string: 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@dataclass
class KafkaBroker:
    bootstrap: str
    classpath: str
    work_dir: str
    process: subprocess.Popen  # type: ignore[type-arg]
    startup_s: float
    from_cache: bool

    @classmethod
    def start(cls, work_dir: str, version: str = KAFKA_VERSION) -> KafkaBroker:
        t0 = time.perf_counter()
        classpath, from_cache = broker_classpath(version)
        os.makedirs(work_dir, exist_ok=True)
        broker_port, controller_port = free_port(), free_port()
        props = os.path.join(work_dir, "server.properties")
        with open(props, "w") as f:
            f.write(
                SERVER_PROPERTIES.format(
                    broker_port=broker_port,
                    controller_port=controller_port,
                    log_dir=os.path.join(work_dir, "logs"),
                )
            )
        java = shutil.which("java") or "java"
        jvm = [java, BROKER_HEAP, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", classpath]
        fmt_log = os.path.join(work_dir, "format.log")
        with open(fmt_log, "w") as out:
            rc = subprocess.call(
                [*jvm, "kafka.tools.StorageTool", "format", "-t", cluster_id(), "-c", props],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        if rc != 0:
            raise KafkaError(f"kafka.tools.StorageTool format failed (exit {rc}); see {fmt_log}")
        log = os.path.join(work_dir, "server.log")
        with open(log, "w") as out:
            process = subprocess.Popen(
                [*jvm, "kafka.Kafka", props],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        broker = cls(f"127.0.0.1:{broker_port}", classpath, work_dir, process, 0.0, from_cache)
        try:
            broker.wait_listening(log)
            broker.create_topic("rmq-bench-ready", 1)
        except BaseException:
            broker.stop()
            raise
        broker.startup_s = time.perf_counter() - t0
        return broker

    def wait_listening(self, log: str) -> None:
        host, port = self.bootstrap.split(":")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise KafkaError(f"kafka.Kafka exited with {self.process.returncode}; see {log}")
            try:
                with socket.create_connection((host, int(port)), timeout=1.0):
                    return
            except OSError:
                time.sleep(0.2)
        raise KafkaError(
            f"kafka.Kafka not listening on {self.bootstrap} after {START_TIMEOUT_S:.0f}s; see {log}"
        )

    def create_topic(self, name: str, partitions: int) -> None:
        source = os.path.join(self.work_dir, "CreateTopic.java")
        if not os.path.exists(source):
            with open(source, "w") as f:
                f.write(CREATE_TOPIC_JAVA)
        java = shutil.which("java") or "java"
        done = subprocess.run(
            [
                java,
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=error",
                "-cp",
                self.classpath,
                source,
                self.bootstrap,
                name,
                str(partitions),
                str(int(START_TIMEOUT_S * 1000)),
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise KafkaError(
                f"creating topic {name} ({partitions} partitions) failed: {done.stderr.strip()[-2000:]}"
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2"
SPARK_KAFKA_ARTIFACT = "org/apache/spark/spark-sql-kafka-0-10_2.13"


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def spark_kafka_package(spark_version: str) -> tuple[str, str]:
    """Spark's Kafka connector for ``spark.jars.packages``, and a note when it is not at Spark's version.

    The connector at pyspark's own version is wanted; when Maven Central does not serve it (a
    pyspark release ahead of the Maven artifacts), the newest release of the same major version
    not newer than pyspark is taken instead, and the note says so.
    """
    import re
    import urllib.error
    import urllib.request

    def package(v: str) -> str:
        return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{v}"

    pom = f"{MAVEN_CENTRAL}/{SPARK_KAFKA_ARTIFACT}/{spark_version}/spark-sql-kafka-0-10_2.13-{spark_version}.pom"
    try:
        urllib.request.urlopen(urllib.request.Request(pom, method="HEAD"), timeout=20).close()
        return package(spark_version), ""
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise KafkaError(f"Maven Central answered {e.code} for {pom}") from e
    except urllib.error.URLError:  # offline: Ivy may still have it cached
        return package(spark_version), ""
    with urllib.request.urlopen(
        f"{MAVEN_CENTRAL}/{SPARK_KAFKA_ARTIFACT}/maven-metadata.xml", timeout=20
    ) as r:
        listed = re.findall(r"<version>([0-9]+\.[0-9]+\.[0-9]+)</version>", r.read().decode())
    major = spark_version.split(".")[0]
    same = [
        v
        for v in listed
        if v.split(".")[0] == major and _version_key(v) <= _version_key(spark_version)
    ]
    if not same:
        raise KafkaError(
            f"Maven Central has no spark-sql-kafka-0-10_2.13 for Spark {spark_version}"
        )
    chosen = max(same, key=_version_key)
    return package(chosen), (
        f"spark-sql-kafka-0-10_2.13:{spark_version} is not on Maven Central; "
        f"using {chosen}, the newest {major}.x release not newer than pyspark"
    )
