"""Imports run one way: core <- protocol/stats <- adapters <- CLI (README, "Layout").

Reads the source of ``src/autellix`` (every import, module level or inside a
function, outside ``if TYPE_CHECKING:``) and checks the package graph; and keeps
what ships apart from what tests and experiments use: ``src/autellix_lab`` is
never imported by ``autellix``, never packaged, and every module of ``autellix``
is reached from a product entry point."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "autellix"
#: Tests' and experiments' scaffolding: on the path of a source checkout, in no image.
LAB = "autellix_lab"

#: Cycles that exist and are being removed by their owners. A new cycle fails
#: the test; this list only shrinks (empty since ``workloads`` broke sim <-> bench).
KNOWN_CYCLES: list[set[str]] = []

#: Modules of the shipped package that no entry point reaches, and why they stay (none: a module only tests,
#: experiments or a maintainer's ``python -m`` use goes to ``autellix_lab``). This list only shrinks.
KNOWN_UNREACHABLE: set[str] = set()

#: Names vLLM loads a module by (module-level string constants, read from the source): the engine's
#: ``--scheduler-cls`` and ``--middleware`` classes, and the KV connector's ``kv_connector_module_path``.
NAMED_BY_STRING = {
    "engine/launch.py": ("SCHEDULER_CLS", "TRACED_SCHEDULER_CLS", "FEEDBACK_MIDDLEWARE", "RESPONSES_MIDDLEWARE"),
    "engine/kv/connector.py": ("MODULE",),
}

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


# ---- what ships: autellix, reached from its entry points; autellix_lab stays outside ----------------------


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes (a module's, a class's, a function's): prose, not a use."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def strings(tree: ast.AST) -> Iterator[str]:
    """String constants of the code, docstrings left out."""
    skip = docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.value


def named_module(name: str, modules: set[str]) -> str | None:
    """The module of ours a dotted name means: ``pkg.mod``, ``pkg.mod.Attr`` or ``pkg.mod:attr``."""
    name = name.partition(":")[0]
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def constant(path: Path, name: str) -> str:
    for node in ast.parse(path.read_text()).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node.value.value
    raise AssertionError(f"{path}: no module-level string {name}")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def entry_points() -> dict[str, str]:
    """Where the product starts -> the dotted name it starts from: pyproject's console scripts and entry
    points, ``python -m autellix``, what vLLM loads by name, and the ``python -m`` the images run."""
    project = pyproject()["project"]
    out = {f"script {k}": v for k, v in project.get("scripts", {}).items()}
    out |= {f"entry point {group} {k}": v for group, points in project.get("entry-points", {}).items()
            for k, v in points.items()}
    out["python -m autellix"] = "autellix.__main__"
    out |= {f"{file}:{name}": constant(SRC / file, name) for file, names in NAMED_BY_STRING.items() for name in names}
    images = [*ROOT.glob("*/Dockerfile*"), *(ROOT / "charts").rglob("*.yaml"), *(ROOT / "charts").rglob("*.tpl")]
    out |= {f"{path.relative_to(ROOT)}: -m {m}": m for path in images
            for m in re.findall(r"-m\s+(autellix(?:\.\w+)*)", path.read_text())}
    return out


def shipped_reach() -> set[str]:
    """Modules of ``autellix`` reached from its entry points through static imports, a module's package
    (``__init__``, run before it), and the dotted names a reached module's code names as strings (what
    vLLM or importlib.resources load: ``--scheduler-cls``, a connector's module path, a data package)."""
    trees = {module_name(path): ast.parse(path.read_text()) for path in SRC.rglob("*.py")}
    modules = set(trees)
    edges = {m: {n for n in (named_module(s, modules) for s in [*imports(tree), *strings(tree)]) if n}
             for m, tree in trees.items()}
    todo = [named_module(name, modules) for name in entry_points().values()]
    seen: set[str] = set()
    while todo:
        m = todo.pop()
        if m is None or m in seen:
            continue
        seen.add(m)
        parts = m.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += edges[m]
    return seen


def test_the_entry_points_name_modules_of_ours() -> None:
    modules = {module_name(path) for path in SRC.rglob("*.py")}
    points = entry_points()
    missing = {where: name for where, name in points.items() if named_module(name, modules) is None}
    assert not missing, f"entry points naming no module of autellix: {missing}"
    # vLLM's classes and the connector's module path are among them, as the engine is started with them
    for name in ("autellix.engine.scheduler.AutellixScheduler", "autellix.engine.kv.connector"):
        assert name in points.values(), (name, points)


def test_every_shipped_module_is_reached_from_an_entry_point() -> None:
    """A module of ``autellix`` used only by tests or experiments belongs in ``autellix_lab``."""
    unreached = {module_name(path) for path in SRC.rglob("*.py")} - shipped_reach()
    assert not unreached - KNOWN_UNREACHABLE, (
        f"modules no entry point reaches (used by tests or experiments only? move them to src/{LAB}): "
        f"{sorted(unreached - KNOWN_UNREACHABLE)}")
    assert not KNOWN_UNREACHABLE - unreached, f"reached or gone: drop from KNOWN_UNREACHABLE: " \
                                              f"{sorted(KNOWN_UNREACHABLE - unreached)}"


def test_nothing_shipped_imports_the_lab() -> None:
    """Not in an import, nor by name (``python -m``, importlib): an image has no ``autellix_lab``."""
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        named = [n for n in [*imports(tree), *strings(tree)] if re.search(rf"(?<!\w){LAB}\b", n)]
        assert not named, (str(path.relative_to(ROOT)), named)


def test_the_packaging_ships_autellix_alone() -> None:
    """setuptools' package discovery as pyproject configures it (include / exclude are fnmatch patterns
    over dotted names): every package of ``autellix`` and nothing of ``autellix_lab``."""
    find = pyproject()["tool"]["setuptools"]["packages"]["find"]
    where = ROOT / find.get("where", ["."])[0]
    include, exclude = find.get("include", ["*"]), find.get("exclude", [])
    candidates = {".".join(d.relative_to(where).parts) for d in where.rglob("*")
                  if d.is_dir() and any(d.glob("*.py"))}
    shipped = {p for p in candidates
               if any(fnmatchcase(p, i) for i in include) and not any(fnmatchcase(p, e) for e in exclude)}
    lab = {p for p in candidates if p == LAB or p.startswith(LAB + ".")}
    assert lab, f"src/{LAB} is gone: update this test"
    assert not shipped & lab, f"packaged: {sorted(shipped & lab)}"
    ours = {p for p in candidates if p == "autellix" or p.startswith("autellix.")}
    assert ours <= shipped, f"left out of the package: {sorted(ours - shipped)}"
