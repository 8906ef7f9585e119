"""The layering stays honest: worker/'s import graph, subpackages included, has no cycles
(type-only imports and package ``__init__`` <-> submodule included), and only the wiring module
and the command line decide anything by role."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "worker"
#: The wiring table, the command line (a package), and where the role setting is defined.
ROLE_AWARE = {"roles", "cli", "settings"}


def modules() -> dict[str, ast.Module]:
    """Every module under worker/, subpackages included, by dotted name below ``worker``
    (a subpackage's ``__init__`` by the package's name: ``web``)."""
    out: dict[str, ast.Module] = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = p.relative_to(PACKAGE).with_suffix("").parts
        if len(parts) > 1 and parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = ast.parse(p.read_text(), str(p))
    return out


def imports(tree: ast.Module) -> set[str]:
    """worker.* modules a module imports, anywhere (inside functions and TYPE_CHECKING too);
    ``from worker.web import api`` counts both ``web`` and ``web.api``."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "worker":
                out |= {a.name for a in node.names}
            elif node.module.startswith("worker."):
                below = node.module.removeprefix("worker.")
                out |= {below} | {f"{below}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {
                a.name.removeprefix("worker.") for a in node.names if a.name.startswith("worker.")
            }
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


def test_the_import_graph_has_no_cycles() -> None:
    mods = modules()
    # __init__ and __main__ only re-export and start; everything else is a real layer
    graph = {
        name: {m for m in imports(tree) if m in mods and m != name}
        for name, tree in mods.items()
        if name not in ("__init__", "__main__")
    }
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph) or [])}"


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_only_the_wiring_and_the_cli_decide_by_role() -> None:
    offenders = []
    for name, tree in modules().items():
        if name.split(".")[0] in ROLE_AWARE:
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
