"""The project as a user gets it: the sdist and the wheel built as a release is (``python -m
build``: the wheel from the sdist, so the sdist is complete), ``twine check`` on both, and the
wheel installed into a fresh virtualenv that cannot see the source tree, where the quickstart
runs and a Spark Connect session finds ``format("rmq")`` and makes a round trip.

The fresh virtualenv takes its dependencies from the test run's own environment (one path line,
so that environment's ``.pth`` files -- the editable install of this tree among them -- are not
read) instead of installing pyspark again; the wheel goes in with ``--no-deps``, and every
requirement of ``rmq_spark[spark]`` that its metadata declares is checked against what is there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from rmq_spark.datasource.embedded import stop_broker

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ("setup.cfg", "pyproject.toml", "README.md")
PACKAGES = ("rmq_spark", "pyspark_rmq")
QUICKSTART_PRINTS = (
    "--- micro-batch",
    "read 5 messages",
    "the cancelled (rolled-back) one: never seen",
)

# run by the fresh virtualenv's python: where things come from, and rmq_spark[spark]'s
# requirements met
CHECK_INSTALL = r"""
import importlib.metadata as md, pkgutil, sys
from packaging.requirements import Requirement
import rmq_spark, pyspark_rmq
root = sys.argv[1]
assert not any(p and p.rstrip("/") == root for p in sys.path), sys.path
for m in (rmq_spark, pyspark_rmq):
    assert m.__file__.startswith(sys.prefix), m.__file__
assert "pyspark_rmq" in {m.name for m in pkgutil.iter_modules()}
dist = md.distribution("rmq_spark")
assert str(dist.locate_file("")).startswith(sys.prefix), dist.locate_file("")
unmet = []
for text in dist.requires or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": "spark"}):
        continue
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        unmet.append(text)
        continue
    if not req.specifier.contains(version, prereleases=True):
        unmet.append(f"{text} (have {version})")
assert not unmet, unmet
print("installed from", rmq_spark.__file__)
"""

# a Spark Connect session (pyspark[connect]) on a local server: write, then read back
CONNECT_ROUND_TRIP = r"""
import sys
from pyspark.sql import SparkSession
store = sys.argv[1]
spark = (SparkSession.builder.remote("local[2]")
         .config("spark.ui.enabled", "false")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
         .getOrCreate())
assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
df = spark.createDataFrame([(f"m{i}", "t" if i % 2 else None) for i in range(20)], "body string, tags string")
df.write.format("rmq").mode("append").option("path", store).option("topic", "Connect").save()
rows = (spark.read.format("rmq").option("path", store).option("topics", "Connect")
        .load().selectExpr("cast(body as string) as body", "tags").collect())
assert sorted(r.body for r in rows) == sorted(f"m{i}" for i in range(20)), rows
assert sum(1 for r in rows if r.tags == "t") == 10
print("connect round trip:", len(rows), "rows")
spark.stop()
"""


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: int = 600) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s,
                          check=False)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{cmd[:4]} failed:\n{out[-4000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel, built from a copy of the project's packaging files and packages
    (the tree is left as it was)."""
    tmp = tmp_path_factory.mktemp("package")
    project = tmp / "project"
    project.mkdir()
    for name in PACKAGING:
        shutil.copy(ROOT / name, project / name)
    for name in PACKAGES:
        shutil.copytree(ROOT / name, project / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(project)],
         tmp, dict(os.environ))  # fmt: skip
    return out


@pytest.fixture(scope="module")
def fresh(dist, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A new virtualenv with the wheel installed; its python and the environment to run it in."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], venv.parent, dict(os.environ))
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     venv.parent, dict(os.environ)).strip())  # fmt: skip
    # the dependencies: this environment's site-packages as one path line (its .pth files unread)
    (site / "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (wheel,) = dist.glob("*.whl")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
          "--no-index", "--quiet", str(wheel)], venv.parent, dict(os.environ))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python),
               VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")  # fmt: skip
    return python, env


def test_sdist_and_wheel_pass_twine_check_and_hold_the_packages(dist):
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    assert sdist.name.startswith("rmq_spark-") and wheel.name.startswith("rmq_spark-")
    out = _run([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)], dist,
               dict(os.environ))  # fmt: skip
    assert out.count("PASSED") == 2, out
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "pyspark_rmq/__init__.py" in names and "rmq_spark/datasource/source.py" in names
    assert not [n for n in names if n.startswith("tests/")], names
    assert 'Requires-Dist: pyspark[sql]>=4.0; extra == "spark"' in metadata, metadata[:3000]


def test_the_installed_wheel_runs_the_quickstart_and_a_spark_connect_round_trip(fresh, tmp_path):
    python, env = fresh
    work = tmp_path / "work"
    work.mkdir()
    out = _run([str(python), "-c", CHECK_INSTALL, str(ROOT)], work, env)
    assert "installed from" in out
    # the quickstart as a user runs it: a copy of the script, outside the tree
    shutil.copy(ROOT / "examples" / "quickstart.py", work / "quickstart.py")
    out = _run([str(python), "quickstart.py", str(tmp_path / "store")], work, env)
    for line in QUICKSTART_PRINTS:
        assert line in out, out[-3000:]
    assert "SEEN?!" not in out
    store = str(tmp_path / "connect-store")
    try:
        out = _run([str(python), "-c", CONNECT_ROUND_TRIP, store], work, env)
    finally:
        stop_broker(store)  # the embedded broker the connector started on that store
    assert "connect round trip: 20 rows" in out, out[-3000:]
