"""Imports run one way: core <- protocol/stats <- adapters <- CLI (README, "Layout").

Reads the source of ``src/autellix`` (every import, module level or inside a
function, outside ``if TYPE_CHECKING:``) and checks the package graph."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "autellix"

#: Cycles that exist and are being removed by their owners. A new cycle fails
#: the test; this list only shrinks (empty since ``workloads`` broke sim <-> bench).
KNOWN_CYCLES: list[set[str]] = []

#: Modules of ours that must stay on the standard library alone.
STANDARD_LIBRARY_ONLY = ("protocol", "stats", "endpointslices")


def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "autellix"


def imports(tree: ast.AST) -> Iterator[str]:
    """Absolute module names imported anywhere in the tree, except under TYPE_CHECKING; ``from P import m``
    yields ``P.m`` as well as ``P`` (``m`` may be a module of package ``P``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (name for child in node.orelse for name in imports(child))
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        yield from imports(node)


def module_imports() -> dict[str, set[str]]:
    out = {}
    for path in SRC.rglob("*.py"):
        name = ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")
        out[name] = set(imports(ast.parse(path.read_text())))
    return out


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, imported in module_imports().items():
        source = package(module)
        graph.setdefault(source, set()).update(
            package(m) for m in imported if m.startswith("autellix.") and package(m) != source)
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one package."""
    nodes = set(graph) | {n for targets in graph.values() for n in targets}
    return [comp for comp in {frozenset(n2 for n2 in reachable(graph, n) if n in reachable(graph, n2)) | {n}
                              for n in nodes} if len(comp) > 1]


def module_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (a package's ``__init__`` is the package's name). A module's
    import of its own package's ``__init__`` is not an edge: the package runs before its modules do."""
    modules = module_imports()
    return {module: {m for m in imported if m in modules and m != module and not module.startswith(m + ".")}
            for module, imported in modules.items()}


def test_no_import_cycle_between_modules() -> None:
    """Within a package too: two modules that import each other (at any depth, even inside a function)
    are one module in two files, or a missing third."""
    graph = module_graph()
    found = [sorted(c) for c in cycles(graph)]
    assert not found, f"import cycles between modules: {found}"


def test_no_import_cycle_between_packages() -> None:
    found = cycles(package_graph())
    unexpected = [sorted(c) for c in found if not any(c <= known for known in KNOWN_CYCLES)]
    assert not unexpected, f"import cycles between packages: {unexpected}"


def test_the_gateway_imports_nothing_from_the_simulator_or_the_benchmark() -> None:
    graph = package_graph()
    for adapter in ("gateway", "control", "backends"):
        assert not reachable(graph, adapter) & {"sim", "loadgen", "cli", "kube", "launcher", "engine", "mesh"}, (
            adapter, sorted(reachable(graph, adapter)))


def test_the_layers_run_one_way() -> None:
    graph = package_graph()
    assert graph.get("core", set()) == set(), "the policy core imports nothing of ours"
    for name in STANDARD_LIBRARY_ONLY:
        assert graph.get(name, set()) == set(), f"{name} imports nothing of ours"
    assert graph.get("backends", set()) <= {"protocol", "core", "stats"}
    assert graph.get("control", set()) <= {"protocol", "core", "stats", "backends"}
    assert "gateway" not in reachable(graph, "kube"), "the operator reaches the gateway only over HTTP"
    # the agent programs and a run's metrics serve the benchmark and the simulator alike
    workloads_reach = reachable(graph, "workloads")
    assert not workloads_reach & {"sim", "loadgen", "gateway", "cli"}, sorted(workloads_reach)
    assert "loadgen" not in reachable(graph, "sim"), "the simulator runs the workloads, not the benchmark"
    assert not [p for p, targets in graph.items() if "cli" in targets and p != "__main__"], "nothing imports the CLI"


def test_the_wire_contract_and_statistics_use_the_standard_library_alone() -> None:
    modules = module_imports()
    for name in STANDARD_LIBRARY_ONLY:
        outside = {m for m in modules[f"autellix.{name}"] if m.split(".")[0] not in sys.stdlib_module_names}
        assert outside <= {"__future__"}, (name, outside)
