"""Building and running the Java programs of ``tests/interop/java`` (a Maven project).

    programs = build_programs("4.9.8")          # mvn package, skipped when nothing changed
    result = programs.run("producer", "--namesrv", addr, "--topic", "T", home=tmp)
    result.events("sent")                       # the JSON lines the program printed

Each client version builds into ``java/target/<version>/``: its classes, the resolved
classpath (``classpath.txt``, from ``mvn dependency:build-classpath``) and a stamp holding the
digest of the sources it was built from.  A build is skipped when the stamp matches, so only the
first run of a session after a change pays for Maven (about 5 s).  The jars themselves are
cached by Maven in the user's repository (``~/.m2/repository``): the first build on a machine
downloads them from Maven Central, later ones work from that cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CLIENT_VERSION_5X",
    "CLIENT_VERSION_DEFAULT",
    "JAVA_DIR",
    "JavaPrograms",
    "ProgramResult",
    "RunningProgram",
    "build_programs",
    "maven",
    "sources_digest",
]

JAVA_DIR = Path(__file__).resolve().parent / "java"
CLIENT_VERSION_DEFAULT = "4.9.8"
# The newest rocketmq-client Maven Central serves (checked with ``mvn dependency:get``: 5.5.1
# publishes the broker but not the client or tools); the pom's ``rocketmq5`` profile names it too.
CLIENT_VERSION_5X = "5.5.0"

MAVEN_TIMEOUT_S = 900.0
# Small client JVMs that start fast on two shared cores: C1 only, one GC thread.
CLIENT_JVM_FLAGS = ("-Xmx128m", "-Xss512k", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


def maven(args: list[str], cwd: Path, timeout_s: float = MAVEN_TIMEOUT_S) -> None:
    """Runs ``mvn -q -B ARGS`` in ``cwd``; raises with Maven's output when it fails."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("Maven (mvn) is not on PATH; the interop tests need Java 17 and Maven")
    proc = subprocess.run(
        [mvn, "-q", "-B", *args],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"mvn {' '.join(args)} failed ({proc.returncode}) in {cwd}:\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )


def sources_digest(root: Path, patterns: tuple[str, ...]) -> str:
    """SHA-256 over the relative paths and contents of the files matching ``patterns``."""
    digest = hashlib.sha256()
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


@dataclass
class ProgramResult:
    """What one program run printed: its JSON event lines, and the rest for diagnostics."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    lines: list[dict[str, Any]] = field(default_factory=list)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("event") == name]

    def describe(self) -> str:
        return (
            f"program {' '.join(self.args)} exited {self.returncode}\n--- stdout (tail)\n"
            f"{self.stdout[-6000:]}\n--- stderr (tail)\n{self.stderr[-6000:]}"
        )


def _parse(args: list[str], returncode: int, stdout: str, stderr: str) -> ProgramResult:
    result = ProgramResult(args, returncode, stdout, stderr)
    for line in stdout.splitlines():
        # the clients' own loggers may print to stdout too; the programs' lines are JSON objects
        if line.startswith('{"event":'):
            result.lines.append(json.loads(line))
    return result


class RunningProgram:
    """A program started in the background; its output goes to temporary files (no pipes to
    drain).  ``wait`` (or ``kill``) must be called: the tests do it in a ``finally``."""

    def __init__(self, cmd: list[str], args: list[str]) -> None:
        self.args = args
        self._out = tempfile.TemporaryFile()  # noqa: SIM115 -- closed by wait() or kill()
        self._err = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                cmd, stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL
            )
        except BaseException:
            self._close()
            raise

    def printed(self, event: str) -> bool:
        """Whether the program has printed an event line named ``event`` so far."""
        self._out.flush()
        with open(self._out.fileno(), "rb", closefd=False) as f:
            f.seek(0)
            return f'{{"event":"{event}"'.encode() in f.read()

    def wait_for(self, event: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.printed(event):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"{' '.join(self.args)} printed no {event!r}:\n{self.wait(5).describe()}"
                )
            time.sleep(0.1)

    def wait(self, timeout_s: float = 120.0, check: bool = False) -> ProgramResult:
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            self._out.seek(0)
            self._err.seek(0)
            result = _parse(
                self.args,
                self.proc.returncode,
                self._out.read().decode(errors="replace"),
                self._err.read().decode(errors="replace"),
            )
        finally:
            self._close()
        if check and result.returncode != 0:
            raise AssertionError(result.describe())
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close()

    def _close(self) -> None:
        self._out.close()
        self._err.close()


class JavaPrograms:
    """The programs built against one client version."""

    def __init__(self, version: str, classpath: str) -> None:
        self.version = version
        self.classpath = classpath
        self.last_stderr = ""  # what the last mqadmin printed on stderr

    def command(
        self,
        program: str,
        *args: str,
        home: str | os.PathLike[str],
        jvm_flags: tuple[str, ...] = (),
    ) -> list[str]:
        """The ``java`` command line; ``home`` holds the client's logs and local offset files
        (``-Duser.home``) and is its rocketmq home (mqadmin 4.9 reads ``conf/`` there)."""
        return [
            "java",
            *CLIENT_JVM_FLAGS,
            *jvm_flags,
            f"-Duser.home={home}",
            f"-Drocketmq.home.dir={home}",
            "-cp",
            self.classpath,
            "interop.Main",
            program,
            *args,
        ]

    def run(
        self,
        program: str,
        *args: str,
        home: str | os.PathLike[str],
        timeout_s: float = 120.0,
        check: bool = True,
        jvm_flags: tuple[str, ...] = (),
    ) -> ProgramResult:
        """Runs a program to its end.  ``check``: raise unless it exited 0.  A program still
        running at ``timeout_s`` is killed (its own --timeout-s should end it first)."""
        cmd = self.command(program, *args, home=home, jvm_flags=jvm_flags)
        try:
            proc = subprocess.run(
                cmd,
                check=False,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as e:
            out = (
                e.stdout.decode(errors="replace")
                if isinstance(e.stdout, bytes)
                else (e.stdout or "")
            )
            err = (
                e.stderr.decode(errors="replace")
                if isinstance(e.stderr, bytes)
                else (e.stderr or "")
            )
            raise AssertionError(
                f"program {program} {' '.join(args)} killed after {timeout_s}s\n"
                f"{out[-4000:]}\n{err[-4000:]}"
            ) from None
        result = _parse([program, *args], proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise AssertionError(result.describe())
        return result

    def spawn(
        self,
        program: str,
        *args: str,
        home: str | os.PathLike[str],
        jvm_flags: tuple[str, ...] = (),
    ) -> RunningProgram:
        """Starts a program in the background (a consumer that must be up before a producer
        sends); ``RunningProgram.wait`` collects it like ``run``."""
        return RunningProgram(
            self.command(program, *args, home=home, jvm_flags=jvm_flags), [program, *args]
        )

    def mqadmin(self, *args: str, home: str | os.PathLike[str], timeout_s: float = 60.0) -> str:
        """Runs the real mqadmin (``MQAdminStartup``) and returns what it printed."""
        proc = subprocess.run(
            self.command("mqadmin", *args, home=home),
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
        self.last_stderr = proc.stderr
        if proc.returncode != 0:
            raise AssertionError(
                f"mqadmin {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            )
        return proc.stdout


def build_programs(version: str = CLIENT_VERSION_DEFAULT) -> JavaPrograms:
    """Compiles the programs against rocketmq-client ``version`` (skipped when the sources and
    the version match the last build's stamp) and returns them with their classpath."""
    target = JAVA_DIR / "target" / version
    stamp = target / "build.sha256"
    classpath_file = target / "classpath.txt"
    digest = sources_digest(JAVA_DIR, ("pom.xml", "src/**/*.java")) + " " + version
    up_to_date = (
        stamp.is_file()
        and stamp.read_text() == digest
        and classpath_file.is_file()
        and (target / "classes" / "interop" / "Main.class").is_file()
    )
    if not up_to_date:
        maven(
            [
                f"-Drocketmq.client.version={version}",
                "package",
                "dependency:build-classpath",
                f"-Dmdep.outputFile={classpath_file}",
            ],
            cwd=JAVA_DIR,
        )
        stamp.write_text(digest)
    classpath = f"{target / 'classes'}{os.pathsep}{classpath_file.read_text().strip()}"
    return JavaPrograms(version, classpath)
