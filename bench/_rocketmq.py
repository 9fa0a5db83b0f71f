"""A real Apache RocketMQ (NameServer + brokers from Maven Central's jars) for the benchmarks.

    from _rocketmq import apache_rocketmq, java_programs

    with apache_rocketmq(brokers=1, heap="1g") as cluster:
        programs = java_programs()               # the Java programs of tests/interop/java
        programs.run("producer", "--namesrv", cluster.namesrv_addr, ..., home=cluster.home)

The implementation is the interop tests' harness (``tests/interop/_apache.py`` and
``_java.py``); this module puts it on ``sys.path`` and gives it benchmark-sized defaults: a
scratch directory on the project's disk (``_util.scratch_dir``), G1 and a larger heap.
Needs Java 17 and Maven; the first run downloads the jars into ~/.m2.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_INTEROP = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "interop"
)
if _INTEROP not in sys.path:
    sys.path.insert(0, _INTEROP)

from _apache import SERVER_VERSION_DEFAULT, ApacheRocketMQ  # noqa: E402
from _java import CLIENT_VERSION_5X, CLIENT_VERSION_DEFAULT, JavaPrograms, build_programs  # noqa: E402
from _util import scratch_dir  # noqa: E402

__all__ = [
    "CLIENT_VERSION_5X",
    "CLIENT_VERSION_DEFAULT",
    "ApacheRocketMQ",
    "apache_rocketmq",
    "java_programs",
]


@contextmanager
def apache_rocketmq(
    brokers: int = 1,
    *,
    heap: str = "1g",
    version: str = SERVER_VERSION_DEFAULT,
    broker_config: dict[str, str] | None = None,
) -> Iterator[ApacheRocketMQ]:
    """Starts a NameServer and ``brokers`` brokers (broker-a, broker-b, ...) of one cluster on
    127.0.0.1 with free ports; stops them by pid on exit.  ``cluster.startup_s`` has the
    seconds each process took to start; ``cluster.pids`` the pids to sample CPU from."""
    names = tuple(f"broker-{chr(ord('a') + i)}" for i in range(brokers))
    with scratch_dir("rocketmq-") as workdir:
        cluster = ApacheRocketMQ(
            workdir,
            brokers=names,
            version=version,
            heap=heap,
            jvm_flags=("-XX:+UseG1GC",),
            broker_config=broker_config,
        )
        with cluster:
            yield cluster


def java_programs(client_version: str = CLIENT_VERSION_DEFAULT) -> JavaPrograms:
    """The interop Java programs built against ``client_version`` (cached build)."""
    return build_programs(client_version)
