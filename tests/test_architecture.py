"""The package's shape (issue 35): no import cycles among tuner's modules, no module (nor CUDA
source) over 700 lines, and the CLI imports its modules at the top (lazy only for heavy optional
dependencies).

CPU only: the package is parsed with ``ast``, nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "tuner"
MAX_LINES = 700
# The package an export copies verbatim: relative imports of its own, never imports tuner.
SHIPPED = PKG / "ship" / "fa_tune_ops"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The tuner module an imported name lives in (``tuner.kernel.build.render`` ->
    ``tuner.kernel.build``); None outside tuner."""
    while name:
        if name in MODULES:
            return name
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return None


def _imports(mod: str) -> dict[str, set[str]]:
    """{"top": modules imported at module level, "lazy": ... inside functions} (TYPE_CHECKING
    blocks left out: they never run)."""
    path = MODULES[mod]
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: dict[str, set[str]] = {"top": set(), "lazy": set()}

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module or ""
        if node.level:
            parts = pkg.split(".")
            parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        # "from pkg import sub" imports the submodule; "from mod import name", the module
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                for a in node.names]

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for name in targets(child):
                    found = _resolve(name)
                    if found and found != mod:
                        out["lazy" if lazy else "top"].add(found)
            visit(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(path.read_text()), False)
    out["lazy"] -= out["top"]
    return out


IMPORTS = {m: _imports(m) for m in MODULES}


def _parents(mod: str) -> set[str]:
    """Importing a.b.c runs a and a.b first: a module depends on its packages' __init__."""
    parts = mod.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))} & MODULES.keys()


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
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

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


@pytest.mark.parametrize("which", ["top", "all"])
def test_no_import_cycles(which: str) -> None:
    """Module-level imports alone, and with the imports inside functions counted too."""
    edges = {}
    for m, imp in IMPORTS.items():
        deps = set(imp["top"]) | (imp["lazy"] if which == "all" else set())
        edges[m] = deps
    assert not _cycles(edges), _cycles(edges)


def test_layer_packages_import_nothing() -> None:
    """Importing one module of a layer runs its package's __init__ first: those stay empty (a
    docstring), so no module drags in its whole layer, and no cycle runs through them."""
    for pkg in ("tuner.kernel", "tuner.measure", "tuner.search", "tuner.ship", "tuner.analysis"):
        assert not IMPORTS[pkg]["top"] | IMPORTS[pkg]["lazy"], pkg


def test_no_module_over_700_lines() -> None:
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


CUDA_SRC = PKG.parent / "cuda_src"
# Generated, one function per wgmma shape (scripts/gen_wgmma_atoms.py; tests/test_device_pass.py)
GENERATED = {CUDA_SRC / "fa_tune" / "wgmma_atoms.cuh"}


def test_no_cuda_source_over_700_lines() -> None:
    """The kernel's and the oracle's sources too: one piece per file (the oracle's in
    cuda_src/oracle/), the generated wgmma table aside."""
    files = [p for p in sorted(CUDA_SRC.rglob("*")) if p.suffix in (".cu", ".cuh", ".h")]
    assert files
    long = {str(p.relative_to(CUDA_SRC)): n for p in files if p not in GENERATED
            and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_shipped_package_does_not_import_tuner() -> None:
    """fa_tune_ops is copied verbatim into exports, where no tuner is installed."""
    for m, p in MODULES.items():
        if p.is_relative_to(SHIPPED):
            outside = {d for d in IMPORTS[m]["top"] | IMPORTS[m]["lazy"]
                       if not d.startswith("tuner.ship.fa_tune_ops")}
            assert not outside, (m, outside)


# Layers, lowest first: a module may import its own layer and those below, never above.
LAYERS = [
    {"tuner", "tuner._paths", "tuner.errors", "tuner.problem", "tuner.problem_text",
     "tuner.problem_class", "tuner.paging", "tuner.yaml_file", "tuner.child_process"},
    {"tuner.kernel"},
    {"tuner.measure"},
    {"tuner.search"},
    {"tuner.ship", "tuner.analysis", "tuner.doctor"},
    {"tuner.cli", "tuner.entry"},
]


def _layer(mod: str) -> int:
    for i, names in enumerate(LAYERS):
        if mod in names or any(mod.startswith(n + ".") for n in names if n != "tuner"):
            return i
    raise AssertionError(f"{mod} is in no layer")


def test_layers_import_downwards() -> None:
    """kernel < measure < search < ship/analysis < cli (doctor probes the toolchain and ncu)."""
    up = sorted(f"{m} -> {d}" for m, imp in IMPORTS.items()
                for d in imp["top"] | imp["lazy"]
                if not MODULES[m].is_relative_to(SHIPPED) and _layer(d) > _layer(m))
    assert not up, up


def test_reading_a_study_does_not_import_the_search_loop() -> None:
    """show, export, profile and compare read a study through tuner.search.study and
    tuner.search.trials alone: neither they nor what they import needs the search loop, its GPU
    worker client or its policy."""
    seen: set[str] = set()
    todo = ["tuner.analysis.show", "tuner.ship.export", "tuner.analysis.profile",
            "tuner.analysis.compare", "tuner.ship.dispatch"]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(IMPORTS[m]["top"] | _parents(m))
    bad = seen & {"tuner.search.loop", "tuner.search.worker_client", "tuner.search.policy",
                  "tuner.search.fleet"}
    assert not bad, bad


def test_cli_imports_at_the_top() -> None:
    """The CLI's imports inside functions are only the ones that keep a heavy optional
    dependency off its start path, each with a comment saying so."""
    for m, p in MODULES.items():
        if not m.startswith("tuner.cli"):
            continue
        lines = p.read_text().splitlines()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        text = lines[sub.lineno - 1] + lines[sub.lineno - 2]
                        assert "#" in text and "lazy" in text.lower(), (
                            f"{p.name}:{sub.lineno}: a function-level import without a "
                            "'lazy: why' comment")
