"""The tests' own house rules: helpers are written once (in ``harness/``, the support package
the tests and the benchmarks share), the benchmarks never import the tests, and the support
package imports neither the tests nor pytest. Each rule is shown firing on a small case."""

from __future__ import annotations

import ast
import os
import runpy
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import pytest

from harness import ROOT

TESTS = ROOT / "tests"
HARNESS = ROOT / "harness"
BENCH = ROOT / "bench"


def _is_fixture(node: ast.AST) -> bool:
    decorators = getattr(node, "decorator_list", [])
    return any("fixture" in ast.unparse(d) for d in decorators)


def _helpers(tree: ast.Module) -> Iterable[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    """Top-level functions and classes that are neither tests nor pytest hooks."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and not (
            node.name.startswith(("test_", "Test", "pytest_"))
        ):
            yield node


def _code(node: ast.AST) -> str:
    """The helper's code without its docstring and name (a copy renamed is still a copy)."""
    node = ast.parse(ast.unparse(node)).body[0]
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        del body[0]
    node.name = "_"  # type: ignore[attr-defined]
    return ast.dump(node)


def shared_names() -> set[str]:
    """The public top-level names the support package defines."""
    names: set[str] = set()
    for path in HARNESS.rglob("*.py"):
        if "apps" in path.relative_to(HARNESS).parts:
            continue  # the worker apps' tasks are not helpers
        for node in _helpers(ast.parse(path.read_text())):
            if not node.name.startswith("_"):
                names.add(node.name)
    return names


def helper_problems(files: dict[str, str], shared: set[str]) -> list[str]:
    """``{file name: source}`` -> every helper written twice: a test file defining a name the
    support package defines, or two test files defining the same code (fixtures included)."""
    problems: list[str] = []
    copies: dict[str, list[str]] = defaultdict(list)
    for name, source in sorted(files.items()):
        for node in _helpers(ast.parse(source)):
            if node.name in shared and not _is_fixture(node):
                problems.append(f"{name} defines {node.name}, which harness/ defines: import it")
            if len(ast.unparse(node).splitlines()) > 2:  # a one-line alias is not a helper
                copies[_code(node)].append(f"{name}:{node.name}")
    for where in copies.values():
        if len({w.split(":")[0] for w in where}) > 1:
            problems.append(f"one helper written in {len(where)} test files: {', '.join(where)}")
    return problems


def test_no_helper_is_written_in_two_test_files() -> None:
    files = {str(p.relative_to(TESTS)): p.read_text() for p in TESTS.rglob("*.py")}
    assert helper_problems(files, shared_names()) == []


def test_the_helper_rule_fires_on_a_shared_name_and_on_a_copy() -> None:
    copy = "def ping(r, key):\n    v = r.get(key)\n    return v is not None\n"
    renamed = copy.replace("def ping", "def _ping")
    files = {
        "a.py": "async def eventually(pred):\n    return pred()\n" + copy,
        "b.py": renamed,
        "c.py": "import pytest\n@pytest.fixture\ndef redis_url():\n    return 'x'\n",
    }
    problems = helper_problems(files, {"eventually", "redis_url"})
    assert problems == [
        "a.py defines eventually, which harness/ defines: import it",
        "one helper written in 2 test files: a.py:ping, b.py:_ping",
    ]


def imports_of(source: str, *, anywhere: bool = True) -> set[str]:
    """The top-level packages a module imports (at any depth in the module, or only at its
    top level)."""
    out: set[str] = set()
    tree = ast.parse(source)
    for node in ast.walk(tree) if anywhere else tree.body:
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def import_problems(
    files: dict[str, str], forbidden: set[str], *, anywhere: bool = True
) -> list[str]:
    out = []
    for name, src in sorted(files.items()):
        if found := imports_of(src, anywhere=anywhere) & forbidden:
            out.append(f"{name} imports {sorted(found)}")
    return out


def test_bench_never_imports_the_tests_and_harness_neither_tests_bench_nor_pytest() -> None:
    bench = {str(p.relative_to(ROOT)): p.read_text() for p in BENCH.rglob("*.py")}
    harness = {str(p.relative_to(ROOT)): p.read_text() for p in HARNESS.rglob("*.py")}
    assert import_problems(bench, {"tests"}) == []
    assert import_problems(harness, {"tests", "bench"}) == []
    # pytest only inside a function that a test calls (harness.arqfmt.require_arq)
    assert import_problems(harness, {"pytest"}, anywhere=False) == []


def test_the_import_rule_fires() -> None:
    files = {"x.py": "def f():\n    from tests.test_flat import probe\n", "y.py": "import os\n"}
    assert import_problems(files, {"tests"}) == ["x.py imports ['tests']"]


# -- the layout: tests mirror the package's wings ----------------------------------------------

#: the folders under tests/ (each a wing of worker/, plus system/ for multi-process runs across
#: failures and house/ for the project around the package), as tools/move_tests.py places them
TEST_WINGS = {
    "core", "storage", "leadership", "face", "outbox", "consumer", "duties", "runtime", "ops",
    "web", "cli", "system", "house",
}  # fmt: skip


def layout_problems(paths: Iterable[str]) -> list[str]:
    """Test files (relative to tests/) outside a wing folder."""
    out = []
    for path in sorted(paths):
        parts = path.split("/")
        if not parts[-1].startswith("test_"):
            continue
        if len(parts) != 2 or parts[0] not in TEST_WINGS:
            out.append(f"{path}: not in a wing folder (python tools/move_tests.py places it)")
    return out


def test_every_test_file_lives_in_a_wing_folder() -> None:
    placed = runpy.run_path(str(ROOT / "tools" / "move_tests.py"))["WINGS"]
    assert set(placed) == TEST_WINGS  # the folders the move script fills are the ones allowed
    paths = [str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")]
    assert len(paths) > 100
    assert layout_problems(paths) == []


def test_the_layout_rule_fires() -> None:
    paths = ["test_flat.py", "consumer/test_consumer.py", "misc/test_x.py", "conftest.py"]
    assert layout_problems(paths) == [
        "misc/test_x.py: not in a wing folder (python tools/move_tests.py places it)",
        "test_flat.py: not in a wing folder (python tools/move_tests.py places it)",
    ]


def test_the_move_script_places_a_file_no_table_names_or_stops_naming_it(tmp_path: Path) -> None:
    """A flat test file the WINGS table does not know goes to the one wing holding a module of
    its name, or to system/ when it starts real processes; else the run stops, naming it."""
    script = runpy.run_path(str(ROOT / "tools" / "move_tests.py"))
    for module in ("storage/fairness.py", "storage/twice.py", "duties/twice.py", "outbox/a.py"):
        (tmp_path / "worker" / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "worker" / module).write_text("")
    tests = tmp_path / "tests"
    tests.mkdir()
    flat = {
        "test_fairness.py": "from worker.storage import fairness\n",
        "test_outbox.py": "def test_x(spawn): ...\n",
        "test_twice.py": "def test_x(spawn): ...\n",
        "test_misc.py": "from worker.core import ids\nfrom worker.client import Client\n",
    }
    for name, text in flat.items():
        (tests / name).write_text(text)
    moves, unknown = script["plan"](tests)
    assert {p.name: wing for p, wing in moves.items()} == {
        "test_fairness.py": "storage",  # worker/storage/fairness.py
        "test_outbox.py": "outbox",  # a wing of that name
        "test_twice.py": "system",  # two wings hold twice.py; it spawns workers
    }
    assert unknown == ["test_misc.py (imports from the wings: core, face)"]


GROUPED = """
import os, time, pytest

@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("n", range(4))
def test_grouped(n, tmp_path_factory):
    time.sleep(0.3)
    with open(os.environ["GROUP_OUT"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.parametrize("n", range(4))
def test_free(n):
    time.sleep(0.3)
"""


@pytest.mark.slow
def test_an_xdist_group_runs_on_one_worker(tmp_path: Path) -> None:
    """The README's command relies on ``xdist_group`` (the bench smoke tests, the fault tests
    that must not share the box): tests/conftest.py keeps the mark working on this pytest."""
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    out = tmp_path / "workers.txt"
    env = {**os.environ, "GROUP_OUT": str(out), "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "-c", os.devnull, "--rootdir", str(tmp_path), "-n", "2", "--dist", "loadgroup", "-q",
         str(tmp_path / "test_grouped.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    workers = out.read_text().split()
    assert len(workers) == 4 and len(set(workers)) == 1, workers
