"""``pip install -e .`` without ``editable_mode=compat`` must leave ``pyspark_rmq`` where pyspark's
data source discovery looks: pyspark lists the modules on ``sys.path`` with
``pkgutil.iter_modules()`` and imports those named ``pyspark_*``; a module that only an import
hook (setuptools' editable finder, its default for a flat layout) can import is not listed, and
``format("rmq")`` then fails with DATA_SOURCE_NOT_FOUND under Spark Connect and in new sessions.

The editable wheel is built the way pip builds it (PEP 660 ``build_editable`` of the project's
own backend), from a copy of the project's packaging files and packages, so the tree is left
as it was."""

from __future__ import annotations

import pkgutil
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ("setup.cfg", "pyproject.toml", "README.md")
PACKAGES = ("rmq_spark", "pyspark_rmq")


def _build_editable(project: Path, out: Path) -> Path:
    code = "import sys; from setuptools import build_meta; print(build_meta.build_editable(sys.argv[1]))"
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=project, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out / proc.stdout.strip().splitlines()[-1]


def test_plain_editable_install_is_a_path_entry_pyspark_lists(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    for name in PACKAGING:
        shutil.copy(ROOT / name, project / name)
    for name in PACKAGES:
        shutil.copytree(ROOT / name, project / name, ignore=shutil.ignore_patterns("__pycache__"))
    wheel = _build_editable(project, tmp_path / "dist")
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if ".dist-info/" not in n]
        pth = [n for n in names if n.endswith(".pth")]
        assert len(pth) == 1, names
        entries = z.read(pth[0]).decode().split()
    # no import hook beside the path entry
    assert not [n for n in names if n.endswith(".py")], names
    assert [Path(e).resolve() for e in entries] == [project.resolve()]
    listed = {m.name for m in pkgutil.iter_modules([str(project)])}
    assert {"pyspark_rmq", "rmq_spark"} <= listed
