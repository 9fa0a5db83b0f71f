"""The package's shape, read from its source with ``ast``: layers import only downwards, no
import cycles, modules of at most about 500 lines (a longer one says why in its docstring), and
the store knows nothing of Spark or of the services above it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "rmq_spark"
PKG = "rmq_spark"

# lowest first: a module may import its own layer and the layers below it
LAYERS = [
    "errors",
    "store",
    "filter",
    "access",
    "services",
    "remoting",
    "cluster",
    "namesrv",
    "broker",
    "admin",
    "datasource",
]
# modules outside the layers: the package's entry points
TOP = {"rmq_spark", "rmq_spark.__init__"}
MAX_LINES = 520  # "about 500"
LONG_REASON = "Why this module is long:"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(module: str, name: str) -> str | None:
    """The package module ``name`` denotes (a module, or the module holding a name)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    """Every package module that ``module`` imports: at module level, in functions, under
    TYPE_CHECKING, and through ``importlib.import_module`` strings or tables of module names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")
                up = up[: len(up) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # import strings: "rmq_spark.x.y" or "rmq_spark.x.y:attr" (not logger names: those
            # are passed to logging.getLogger, skipped below)
            if re.fullmatch(r"rmq_spark(\.\w+)+(:\w+)?", node.value):
                names = [node.value.split(":")[0]]
        for name in names:
            if name == PKG or name.startswith(PKG + "."):
                target = _resolve(module, name)
                if target and target != module:
                    out.add(target)
    # logger names are not imports
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "getLogger":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    out.discard(arg.value)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else None


def test_every_module_is_in_a_layer():
    unplaced = [m for m in MODULES if m not in TOP and _layer(m) is None]
    assert not unplaced, f"modules outside the layers {LAYERS}: {unplaced}"


def test_no_upward_import():
    bad = []
    for m, deps in GRAPH.items():
        lm = _layer(m)
        if lm is None:
            continue
        for d in sorted(deps):
            ld = _layer(d)
            if ld is not None and ld > lm:
                bad.append(f"{m} -> {d}")
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


def _cycle_graph(graph: dict[str, set[str]], packages: set[str]) -> dict[str, set[str]]:
    """``graph`` without a package's imports of its own modules: a package's ``__init__`` that
    re-exports them (or loads them lazily, as ``rmq_spark`` does) forms no cycle with them,
    though every module of the package imports its ``__init__`` first.  Every other edge stays,
    so a cycle among the modules of one package or one layer is found."""
    return {
        m: {d for d in deps if not (m in packages and d.startswith(m + "."))}
        for m, deps in graph.items()
    }


PACKAGES = {m for m, p in MODULES.items() if p.name == "__init__.py"}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    cycles = _cycles(_cycle_graph(GRAPH, PACKAGES))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_cycle_check_finds_a_cycle_inside_one_package():
    """A cycle among the modules of one package (one layer) is found, also when the top package
    and the package's ``__init__`` import them all; those imports alone are no cycle."""
    top, pkg = "rmq_spark", "rmq_spark.datasource"
    a, b, c = f"{pkg}.embedded", f"{pkg}.read.files", f"{pkg}.read.partition"
    graph = {top: {pkg, a}, pkg: {a, b}, a: {b, top}, b: {c, pkg}, c: {a}}
    assert _cycles(_cycle_graph(graph, {top, pkg})) == [[a, b, c]]
    del graph[c]
    assert _cycles(_cycle_graph(graph, {top, pkg})) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_size(module):
    path = MODULES[module]
    text = path.read_text(encoding="utf-8")
    lines = text.count("\n")
    if lines <= MAX_LINES:
        return
    doc = ast.get_docstring(ast.parse(text)) or ""
    assert LONG_REASON in doc, (
        f"{path.name}: {lines} lines; split it or say why in its docstring ({LONG_REASON!r})"
    )


# what the services above the store name: their system topics, the properties that ask for them,
# and their configuration.  The store may carry such records (it stores what it is given) but no
# code of the store may act on these names; layout.py, the table of RocketMQ's constants that every
# layer shares, only defines them.  A message's own fields as MessageExt exposes them (its delivery
# time TIMER_OUT_MS, its transaction id) are the bulk reader's to decode.
SERVICE_NAMES = frozenset(
    {
        "SCHEDULE_TOPIC", "TIMER_TOPIC", "TRANS_HALF_TOPIC", "TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC", "P_DELAY", "P_TIMER_DELIVER_MS", "P_TIMER_DELAY_SEC",
        "P_TIMER_DELAY_MS", "P_TRAN_MSG", "P_REAL_TOPIC", "P_REAL_QID",
        "delay_levels", "delay_levels_ms", "BrokerConfig",
    }
)  # fmt: skip
SPARK = re.compile(r"\b(py)?spark\b", re.I)


def test_store_knows_nothing_of_spark_or_the_services():
    found = []
    for m, path in MODULES.items():
        if _layer(m) != LAYERS.index("store"):
            continue
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT.parent)
        for n, line in enumerate(text.splitlines(), 1):
            if SPARK.search(line):
                found.append(f"{rel}:{n}: mentions Spark: {line.strip()}")
        if path.name == "layout.py":
            continue
        for node in ast.walk(ast.parse(text)):
            name = (
                node.attr
                if isinstance(node, ast.Attribute)
                else node.id
                if isinstance(node, ast.Name)
                else None
            )
            if name in SERVICE_NAMES:
                found.append(f"{rel}:{node.lineno}: uses {name}")
    assert not found, "the store knows what is above it:\n" + "\n".join(found)
