"""Small helpers shared by the benchmarks (timing, a scratch directory, table printing)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Self


@contextmanager
def scratch_dir(prefix: str) -> Iterator[str]:
    """A temporary directory on the same disk as the project (not tmpfs), removed afterwards."""
    base = os.environ.get("RMQ_BENCH_DIR") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), ".scratch"
    )
    os.makedirs(base, exist_ok=True)
    d = tempfile.mkdtemp(prefix=prefix, dir=base)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Timer:
    def __enter__(self) -> Self:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


def row(*cols: object, widths: tuple[int, ...] = (34, 16, 12, 16, 10)) -> str:
    out = []
    for c, w in zip(cols, widths, strict=True):
        text = (
            f"{c:,.0f}"
            if isinstance(c, float) and abs(c) >= 100
            else (f"{c:.2f}" if isinstance(c, float) else str(c))
        )
        out.append(text.rjust(w) if not isinstance(c, str) or c[:1].isdigit() else text.ljust(w))
    return " ".join(out)
