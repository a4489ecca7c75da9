"""The dependency rule of ../shared/DESIGN.md, checked on the sources: which package may
import which, no circle between packages or between modules, `cluster` never reaching the
store, `control` never the API, and no underscore name taken from another module.

Every import counts, those inside functions too: a lazy import is still a dependency.
Where today's tree is not yet the map, the exception is written here with its reason, so
that no new one comes unseen.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import corral

SOURCES = Path(corral.__file__).parent
# Modules of corral's top level that any package may use.
SHARED = {"lazy"}
# DESIGN.md's table: package -> what it may import.
MAY_IMPORT: dict[str, set[str]] = {
    "model": set(),
    "engine": {"model"},
    # spec: DESIGN.md's table omits it, though spec is "used by ... scenario files".
    "scenario": {"model", "engine", "spec"},
    "sim": {"model", "engine", "scenario"},
    "spec": {"model"},
    "store": {"model"},
    "control": {"store", "engine", "cluster", "spec", "model"},
    "api": {"control", "store", "spec", "model"},
    "workspaces": {"api", "store", "model"},
    "dashboard": {"api", "store", "model"},
    "messages": {"model"},
    "agent": {"messages", "model"},
    "cluster": {"agent", "messages", "model"},
    "cli": {"model", "scenario", "sim", "sdk", "spec"},
    "sdk": {"model"},
}
# Where the code is not yet the map (issue 40), or the map leaves out what the code needs
# (proposed for DESIGN.md in the note), each with its reason.
NOT_YET = {
    # The composition root: builds the control plane and the app, mounts the API, the
    # workspaces and the dashboard (not yet a row of DESIGN.md's table).
    "server": {"api", "control", "workspaces", "dashboard", "cluster", "agent", "store"}
    | {"spec", "model", "engine", "messages"},
    # The API reads the log format the agents write (agent.logcap).
    "api": {"agent"},
    # Dispatch is the agents' `Reports` (messages); a user's uid comes from agent.identity.
    "control": {"agent", "messages"},
    # Exec takes the session's descriptors from an agent in this process, or through the
    # node's agent over the cluster's relay.
    "workspaces": {"agent", "cluster"},
    # The node's snapshot cache validates an archive with the server's own check
    # (spec.snapshots, issue 45): one definition of a valid snapshot, for both.
    "agent": {"spec"},
    # `corral up`, `corral server` and `corral agent` start the server or an agent in the
    # CLI's process, with the server's options (threads, workspace origins).
    "cli": {"agent", "server", "api", "workspaces"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCES.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, modules: set[str]) -> Iterable[tuple[str, str]]:
    """(module imported, name taken from it or "") for every import of corral in `path`."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "corral":
                    yield alias.name, ""
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            if source.split(".")[0] != "corral":
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                yield (full, "") if full in modules else (source, alias.name)


def graph() -> tuple[dict[str, set[str]], list[str]]:
    """Each module's corral modules, and the underscore names taken across modules."""
    paths = {module_name(path): path for path in SOURCES.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    private = []
    for name, path in paths.items():
        found = edges.setdefault(name, set())
        for source, taken in imports(path, set(paths)):
            if source != name and source in paths:
                found.add(source)
            if taken.startswith("_") and not taken.startswith("__") and source != name:
                private.append(f"{name} imports {taken} from {source}")
    return edges, private


def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
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


def package_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for module, targets in edges.items():
        for target in targets:
            if package(module) != package(target):
                packages.setdefault(package(module), set()).add(package(target))
    return packages


def test_each_package_imports_only_what_the_design_allows() -> None:
    edges, _ = graph()
    wrong = []
    for source, targets in sorted(package_edges(edges).items()):
        if source in SHARED:
            continue
        allowed = MAY_IMPORT.get(source, set()) | NOT_YET.get(source, set()) | SHARED
        if source not in MAY_IMPORT and source not in NOT_YET:
            wrong.append(f"{source} is not in DESIGN.md's table of packages")
        for target in sorted(targets - allowed):
            users = sorted(
                m
                for m in edges
                if package(m) == source and any(package(t) == target for t in edges[m])
            )
            wrong.append(f"{source} imports {target} ({', '.join(users)})")
    assert not wrong, "\n".join(wrong)


def test_the_cluster_never_reaches_the_store_nor_control_the_api() -> None:
    packages = package_edges(graph()[0])
    assert "store" not in packages.get("cluster", set())
    assert "api" not in packages.get("control", set())


def test_no_circle_between_packages_or_modules() -> None:
    edges, _ = graph()
    assert circles(package_edges(edges)) == []
    assert circles(edges) == []


def test_no_underscore_name_is_taken_from_another_module() -> None:
    assert graph()[1] == []


def test_the_checks_find_what_they_look_for() -> None:
    """The checker itself, on a made-up graph: a circle of three, and one of two."""
    made = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d", "a"}, "f": set()}
    assert sorted(circles(made)) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert package("corral.engine.actions.reclaim") == "engine"
