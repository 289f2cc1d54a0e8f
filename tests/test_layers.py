"""Issue 15: the layers hold, read from the source with `ast` (so setup.py's folder mapping of
passes/ and backends/ into qcc.passes / qcc.backends cannot hide a violation), lazy imports
inside functions included.

Layers, lowest first; a module may import its own layer and the ones below:
  0 base      qcc.errors, limits, io, tables, archive, options, plugin_api, progress, qcc.quant (numerics)
  1 ir        qcc.ir
  2 core      qcc.target, qcc.formats, qcc.sim, qcc.data, qcc.runtimes
  3 machinery qcc.pm, qcc.plan, qcc.plugins, qcc.builtin_plugin
  4 parts     qcc.frontends, qcc.passes, qcc.backends, qcc.pipelines
  5 driver    everything else under qcc/ (driver, api, cli, inspect, reporting, ...)
Among the parts: passes import no backend or frontend, backends no frontend, frontends neither.
And no import cycle anywhere, between modules.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.cli_util import ROOT

LAYERS = [
    {"qcc.errors", "qcc.limits", "qcc.io", "qcc.tables", "qcc.archive", "qcc.options", "qcc.plugin_api",
     "qcc.progress", "qcc.quant"},
    {"qcc.ir"},
    {"qcc.target", "qcc.formats", "qcc.sim", "qcc.data", "qcc.runtimes"},
    {"qcc.pm", "qcc.plan", "qcc.plugins", "qcc.builtin_plugin"},
    {"qcc.frontends", "qcc.passes", "qcc.backends", "qcc.pipelines"},
]
FORBIDDEN = {"qcc.passes": {"qcc.backends", "qcc.frontends"}, "qcc.backends": {"qcc.frontends"},
             "qcc.frontends": {"qcc.passes", "qcc.backends"}}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in ("passes", "backends"):
        parts.insert(0, "qcc")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    files = [p for folder in ("qcc", "passes", "backends") for p in (ROOT / folder).rglob("*.py")]
    return {_module(p): p for p in files if "build" not in p.parts}


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """qcc modules `module` imports anywhere in its body (functions too), by their real name."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    type_checking = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                     and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("qcc"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("qcc"):
                continue
            for alias in node.names:  # `from qcc import limits` imports the module qcc.limits
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return {m for m in found if m in known and m != module}


def _graph() -> dict[str, set[str]]:
    sources = _sources()
    known = set(sources)
    return {m: _imports(m, p, known) for m, p in sources.items()}


def _layer(module: str) -> tuple[int, str]:
    for index, group in enumerate(LAYERS):
        for prefix in group:
            if module == prefix or module.startswith(prefix + "."):
                return index, prefix
    return len(LAYERS), module


def test_every_import_goes_down_the_layers() -> None:
    violations = []
    for module, targets in sorted(_graph().items()):
        if module == "qcc":  # the package's lazy public API re-exports from every layer
            continue
        level, group = _layer(module)
        for target in sorted(targets):
            t_level, t_group = _layer(target)
            if target == "qcc":
                continue
            if t_level > level or t_group in FORBIDDEN.get(group, set()):
                violations.append(f"{module} (layer {level}) imports {target} (layer {t_level})")
    assert violations == []


def test_no_import_cycles() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def connect(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt == "qcc":
                continue
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    assert cycles == []


def test_the_checker_sees_lazy_imports_and_the_folder_mapping() -> None:
    """The graph is read as installed names: passes/x.py is qcc.passes.x, lazy imports count."""
    graph = _graph()
    assert "qcc.formats.onnx_export" in graph["qcc.passes.calibrate"]  # imported inside a function
    assert "qcc.passes.quantutil" in graph["qcc.passes.fold_bn"]
    levels = defaultdict(set)
    for module in graph:
        levels[_layer(module)[0]].add(module)
    assert "qcc.backends.nnb.backend" in levels[4] and "qcc.ir.core" in levels[1]
