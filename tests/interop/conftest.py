"""Fixtures of the interop tests: Java programs built by Maven, run against a target server.

- ``target``: one server per session and per enabled target (``RMQ_INTEROP_TARGETS``, default
  both: ``apache``, a real Apache RocketMQ NameServer and two brokers from Maven Central's jars,
  and ``rmq-broker``);
  stopped by pid at the end of the session, also when a test failed.
- ``apache_cluster``: the Apache RocketMQ cluster itself, for tests that stop and restart a broker.
- ``rmq_java``: ``java`` against rmq-broker whatever the enabled targets (cross-protocol tests).
- ``programs``: the Java programs built against a client version (``client`` parameter,
  4.9.8 unless a test parametrizes it), built once per session and only when their sources
  changed.
- ``java``: runs a program against the target with the NameServer address filled in.

Run: ``python -m pytest -q tests/interop`` (needs Java 17 and Maven; the first run downloads the
jars into ~/.m2).  Everything here is marked ``interop``.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("_apache_store")  # its checks explain themselves as a test's do

from _java import (  # noqa: E402
    CLIENT_VERSION_DEFAULT,
    JavaPrograms,
    ProgramResult,
    RunningProgram,
    build_programs,
)
from _targets import ApacheTarget, RmqBrokerTarget, Target, enabled_targets  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.interop)


_built: dict[str, JavaPrograms] = {}


@pytest.fixture(scope="session")
def java_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The programs' user.home and rocketmq home: client logs, broadcast offset files."""
    return tmp_path_factory.mktemp("java-home")


@pytest.fixture
def client() -> str:
    """The rocketmq-client version of a test's programs (tests parametrize it to run both)."""
    return CLIENT_VERSION_DEFAULT


@pytest.fixture
def programs(client: str) -> JavaPrograms:
    if client not in _built:
        _built[client] = build_programs(client)
    return _built[client]


@pytest.fixture(scope="session")
def _apache(tmp_path_factory: pytest.TempPathFactory):
    target = ApacheTarget(tmp_path_factory.mktemp("apache-rocketmq"))
    yield target
    target.close()


@pytest.fixture(scope="session")
def apache_cluster(_apache: ApacheTarget):
    return _apache.cluster_process


@pytest.fixture
def apache_java(programs: JavaPrograms, _apache: ApacheTarget, java_home: Path) -> Java:
    """``java`` bound to the Apache RocketMQ target whatever RMQ_INTEROP_TARGETS says, for tests
    that stop and restart one of its brokers."""
    return Java(programs, _apache, java_home)


@pytest.fixture(scope="session")
def _rmq_broker(tmp_path_factory: pytest.TempPathFactory):
    target = RmqBrokerTarget(tmp_path_factory.mktemp("rmq-broker"))
    yield target
    target.close()


@pytest.fixture
def rmq_java(programs: JavaPrograms, _rmq_broker: RmqBrokerTarget, java_home: Path) -> Java:
    """``java`` bound to rmq-broker whatever RMQ_INTEROP_TARGETS says, for the cross-protocol
    tests (its gRPC endpoint is ``rmq_java.target.grpc_endpoint``)."""
    return Java(programs, _rmq_broker, java_home)


@pytest.fixture(scope="session", params=enabled_targets())
def target(request: pytest.FixtureRequest) -> Target:
    return request.getfixturevalue("_apache" if request.param == "apache" else "_rmq_broker")


class Held:
    """A consumer kept up by ``Java.held``: ``file`` releases it, ``result`` is set when it ended."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.result: ProgramResult | None = None


class Java:
    """Runs programs against one target: ``java.run("producer", topic=..., count=3)`` turns
    keyword arguments into ``--topic ... --count 3`` (underscores become dashes; True is a flag)."""

    def __init__(self, programs: JavaPrograms, target: Target, home: Path) -> None:
        self.programs = programs
        self.target = target
        self.home = home

    def run(
        self,
        program: str,
        *,
        check: bool = True,
        timeout_s: float = 120.0,
        jvm_flags: tuple[str, ...] = (),
        **options: Any,
    ) -> ProgramResult:
        return self.programs.run(
            program,
            *self._args(options),
            home=self.home,
            timeout_s=timeout_s,
            check=check,
            jvm_flags=jvm_flags,
        )

    def _args(self, options: dict[str, Any]) -> list[str]:
        args = ["--namesrv", self.target.namesrv_addr]
        for key, value in options.items():
            if value is False or value is None:
                continue
            args.append("--" + key.replace("_", "-"))
            if value is not True:
                args.append(str(value))
        return args

    def spawn(self, program: str, **options: Any) -> RunningProgram:
        """Like ``run``, in the background: ``.wait_for("started")``, then ``.wait()``."""
        return self.programs.spawn(program, *self._args(options), home=self.home)

    @contextlib.contextmanager
    def held(self, program: str, *, timeout_s: float = 120.0, **options: Any) -> Iterator[Held]:
        """Runs a push consumer until it has what it ``expect``s, and keeps it up (committing its
        offsets every 5 s, finishing its sends back) until the block ends; ``held.result`` is its
        result after the block.  For checks of what a consumer leaves on the broker: a client shut
        down straight after its last message may not have committed it or sent it back yet."""
        held = Held(self.home / f"hold-{uuid.uuid4().hex}")
        running = self.spawn(program, hold_file=held.file, **options)
        try:
            running.wait_for("expected", timeout_s=timeout_s)
            yield held
        finally:
            held.file.touch()
            held.result = running.wait(timeout_s=60)
            held.file.unlink(missing_ok=True)
        if held.result.returncode != 0:
            raise AssertionError(held.result.describe())

    def mqadmin(self, *args: str) -> str:
        return self.programs.mqadmin(*args, "-n", self.target.namesrv_addr, home=self.home)

    def create_topic(self, topic: str, queues: int = 4, order: bool = False) -> None:
        self.target.create_topic(self.programs, self.home, topic, queues, order)


@pytest.fixture
def java(programs: JavaPrograms, target: Target, java_home: Path) -> Java:
    return Java(programs, target, java_home)


@pytest.fixture
def names(request: pytest.FixtureRequest) -> str:
    """A prefix for this test's topics and groups, unique per test and parameter set."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", request.node.name)[:80]
