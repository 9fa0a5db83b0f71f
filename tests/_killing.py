"""SIGKILL a worker process in the middle of its work, and keep what it printed before."""

from __future__ import annotations

import os
import signal
import subprocess
import time


def lines_until_killed(
    proc: subprocess.Popen, window_s: float, start_timeout_s: float = 60.0
) -> list[str]:
    """The lines ``proc`` (text stdout) printed until it was SIGKILLed ``window_s`` after its first
    line: the kill falls while it works however long its start took (its imports, on a loaded
    machine, can outlast a window counted from the launch).  The last line may be cut."""
    lines: list[str] = []
    os.set_blocking(proc.stdout.fileno(), False)  # type: ignore[union-attr]
    deadline = time.monotonic() + start_timeout_s  # for its first line, then for the window
    while time.monotonic() < deadline and (lines or proc.poll() is None):
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if line and not lines:
            deadline = time.monotonic() + window_s
        if line:
            lines.append(line)
        else:
            time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    lines += (proc.stdout.read() or "").splitlines(keepends=True)  # type: ignore[union-attr]
    return lines
