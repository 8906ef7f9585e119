"""The layering stays honest: worker/'s import graph has no cycles (type-only imports
included), and only the wiring module and the command line decide anything by role."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "worker"
#: The wiring table, the command line, and where the role setting is defined.
ROLE_AWARE = {"roles", "cli", "settings"}


def modules() -> dict[str, ast.Module]:
    """Every module of worker/, subpackages included, by dotted name under ``worker``
    (``storage.keys``; a package's ``__init__`` by the package's name, ``storage``)."""
    out: dict[str, ast.Module] = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = p.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = ast.parse(p.read_text(), str(p))
    return out


def imports(tree: ast.Module, known: set[str] | None = None) -> set[str]:
    """worker.* modules a module imports, anywhere (inside functions and TYPE_CHECKING too),
    by dotted name under ``worker``; ``from worker.pkg import sub`` names the submodule when
    ``known`` has it (and the package too: Python runs its ``__init__`` first)."""
    known = known or set()
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "worker":
                out |= {a.name for a in node.names}
            elif node.module.startswith("worker."):
                base = node.module.removeprefix("worker.")
                subs = {f"{base}.{a.name}" for a in node.names} & known
                out |= subs if len(subs) == len(node.names) else subs | {base}
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
            out |= {n.removeprefix("worker.") for n in names if n.startswith("worker.")}
    if not known:  # the flat view: top-level modules only
        out = {m.split(".")[0] for m in out}
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def graph_of(mods: dict[str, ast.Module]) -> dict[str, set[str]]:
    """The import graph. ``from worker.pkg import sub`` inside ``pkg`` is an edge to ``sub``
    only (the package's ``__init__`` is already running); from outside, to both; a name from
    the package's ``__init__`` itself is an edge to it from anywhere."""
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for name, tree in mods.items():
        if name in ("__init__", "__main__"):
            continue
        edges = set()
        for m in imports(tree, known):
            # importing a submodule from outside its package runs the package's __init__
            parents = [".".join(m.split(".")[:i]) for i in range(1, m.count(".") + 1)]
            edges |= {m} | {p for p in parents if not name.startswith(p + ".")}
        graph[name] = {m for m in edges if m in mods and m != name} - {"__init__", "__main__"}
    return graph


def test_the_import_graph_has_no_cycles() -> None:
    # __init__ and __main__ only re-export and start; everything else is a real layer
    graph = graph_of(modules())
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph) or [])}"


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_only_the_wiring_and_the_cli_decide_by_role() -> None:
    offenders = []
    for name, tree in modules().items():
        if name in ROLE_AWARE:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "worker.settings":
                bad = {a.name for a in node.names} & {"ROLES", "Role"}
                if bad:
                    offenders.append(f"{name} imports {sorted(bad)}")
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    if (isinstance(side, ast.Attribute) and side.attr == "role") or (
                        isinstance(side, ast.Name) and side.id == "role"
                    ):
                        offenders.append(f"{name}:{node.lineno} compares a role")
    assert not offenders, offenders
