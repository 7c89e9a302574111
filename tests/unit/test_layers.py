"""The import layering of python/narwhal (docs/architecture.md): packages import downward only,
and no modules import each other in a loop, within a package or across packages.

Imports under ``if TYPE_CHECKING:`` count: they tie the modules together all the same.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "python" / "narwhal"

LAYERS: dict[str, int] = {
    # the base: no imports from the rest of the router
    "_narwhal_fast": 0, "config": 0, "errors": 0, "http1": 0, "sim": 0, "tasks": 0,
    # a request as data; the engine HTTP client; the client-facing HTTP server
    "request": 1, "upstream": 1, "server": 1,
    "fleet": 2,        # engines, health, outlier ejection, maintenance, HA
    "observe": 2,      # the access log, traces (W3C context, OTLP export), log format
    "learning": 3,     # the latency model, profiling, drift, output lengths
    "cluster": 3,      # several routers sharing one fleet through Redis: limits, load, admin
    "scheduling": 4,   # placement and the slots a placement holds
    "admission": 5,    # the queue, predictive admission, sizing, worker wake-ups
    "flow": 6,         # the request's journey: intake, attempts, relay, prefill leg
    "api": 7,          # routes only
    "control": 8,      # changing the running router: reload, engines added and removed
    "app": 9,          # the composition root
    "prefork": 10,     # worker processes on one port: fork, signals, reaping
    "serve": 11,       # running the router: one process or the workers
    "cli": 12,
    "__main__": 13,
}
"""Each top-level package or module of ``narwhal`` and its layer: a unit may import only
units of a lower layer (units of one layer are independent of each other)."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> Iterator[str]:
    """Every ``narwhal...`` name the module imports (modules and names from them)."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)


def _sources() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "narwhal" and len(parts) > 1 else None


def test_every_package_has_a_layer() -> None:
    units = {p.name.removesuffix(".py") for p in ROOT.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    units.add("_narwhal_fast")
    units.discard("__init__")
    assert units - set(LAYERS) == set(), "place new packages in LAYERS (and the architecture doc)"


def test_packages_import_downward_only() -> None:
    upward = []
    for path in _sources():
        source = _unit(_module_name(path))
        if source is None:
            continue
        for target in {_unit(t) for t in _imports(path)} - {None, source}:
            assert target is not None
            if target in LAYERS and LAYERS[target] >= LAYERS[source]:
                upward.append(f"{path.relative_to(ROOT)}: {source} (layer {LAYERS[source]}) "
                              f"imports {target} (layer {LAYERS[target]})")
    assert upward == []


def _module_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in _sources()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target in _imports(path):
            # "from narwhal.sim import segments" names the module narwhal.sim.segments;
            # importing a package's own __init__ from inside it is no loop of modules
            if target in modules and target != name and target != package:
                graph.setdefault(name, set()).add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_modules_import_each_other_in_a_loop() -> None:
    assert _cycles(_module_graph()) == []


@pytest.mark.parametrize(("graph", "expected"), [
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
])
def test_the_loop_finder_finds_loops(graph: dict[str, set[str]],
                                     expected: list[list[str]]) -> None:
    assert _cycles(graph) == expected
