#!/usr/bin/env python3
"""Move flat ``tests/test_*.py`` files into the wing folders that mirror the package.

    python tools/move_tests.py            # from the repository root (or give its path)
    python tools/move_tests.py --check    # only say what would move; exit 1 if anything would

Idempotent: a file already in its wing is left alone, and the reference rewrite
(``tests.test_x`` -> ``tests.<wing>.test_x``, ``tests/test_x.py`` -> ``tests/<wing>/test_x.py``
in tests, harness, bench, docs, CI and the top-level docs) only touches references that still
name the flat path. Run it again after merging a branch that adds flat test files.

Where a flat file goes:

1. its name in :data:`WINGS` (add new files there when the guess below is wrong);
2. else ``test_<name>.py`` where ``<name>`` is a wing, or the package has exactly one module
   ``<name>`` in a wing (``worker/storage/fair.py`` -> ``storage``; a top-level module ->
   ``face``);
3. else a file that starts real worker processes (the ``spawn`` fixture, ``WorkerProc``) or is
   marked ``slow`` -> ``system``;
4. else the run stops before anything moves, naming the file and the wings of the ``worker``
   modules it imports: add it to :data:`WINGS` (``tests/house/test_house.py`` checks that every
   test file lives in a wing).

A branch written before ``harness/`` existed imports the support modules from ``tests``: those
references are rewritten too (``tests.conftest`` -> ``harness``, ``tests.apps``/``tests/apps/``,
``tests.topology``, ``tests.postgres``, ... -> ``harness``). The moved files are staged
(``git mv``); review with ``git diff --cached -M``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

#: wing folder -> the test files (``test_<name>.py``) that live there
WINGS: dict[str, str] = {
    "core": "clock component hash_tag ids schedule serializer jobhead outage logs malformed hooks",
    "storage": "scripts connection replication shards subscriptions workflow_scripts",
    "leadership": "leadership static_leader",
    "consumer": (
        "consumer consumer_integration consumer_parts failures task_stats shard_consumer "
        "tracing enqueue_limit decode_budget flow_control coalesce flow_keys"
    ),
    "duties": (
        "periodic poller poll_outcomes initializer keyed broadcast backlog registry "
        "unannounced progress schedules duty_kinds"
    ),
    "face": (
        "client_env context enqueue_many settings sync sync_client testing app app_identity "
        "arq_settings contract_arq"
    ),
    "runtime": "embedded preflight processes watchdog httpguard roles shutdown stranded",
    "ops": "status doctor jobsview shard_status dead_bounds one_door jobs_processes",
    "web": "web web_jobs web_browser",
    "outbox": "outbox outbox_ops",
    "cli": "cli",
    # real processes across failures: leaders, consumers, servers and topologies together
    "system": (
        "faults edges failover cluster cluster_shards_failover queue_shards clock_skew "
        "skewed_leader oom refused_writes poll_failover heartbeat_lag leader_orphans idle "
        "hostile_leadership handoff abort_processes broadcast_processes progress_processes "
        "sync_processes schedules_processes fencing_postgres first_hour startup_truth "
        "hardening acl tls resharding demo operations fleet_wake coalesce_processes deadlines "
        "duty_lane fair_processes outbox_failover workflows"
    ),
    # the project around the package: docs, packaging, deploy files, examples, benches, layout
    "house": (
        "docs doc_examples install_lines packaging release deploy monitoring layering "
        "example_app example_fastapi example_flask example_django node_producer bench_smoke house"
    ),
}
WHERE = {f"test_{n}": wing for wing, names in WINGS.items() for n in names.split()}
#: where references to test files are rewritten (CHANGELOG.md keeps its history as written)
REWRITE_DIRS = (
    "tests", "harness", "bench", "docs", "tools", ".ci", ".github",
    "worker", "examples", "deploy", "roles", "config",
)  # fmt: skip
REWRITE_FILES = ("README.md", "pyproject.toml", "mkdocs.yml", "CONTRIBUTING.md")
#: how a test file at tests/ finds the repository root, and how it does from a wing folder
DEEPER = [
    ("Path(__file__).resolve().parent.parent", "Path(__file__).resolve().parents[2]"),
    ("Path(__file__).parent.parent", "Path(__file__).parents[2]"),
    ("Path(__file__).resolve().parents[1]", "Path(__file__).resolve().parents[2]"),
]
SUFFIXES = {".py", ".md", ".yml", ".yaml", ".toml", ".json", ".txt", ""}


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True)


#: the support modules that lived in tests/ before harness/ (a branch from then still names them)
SUPPORT = (
    "apps", "arqfmt", "docpages", "failover_scenario", "postgres", "realredis",
    "shard_failover", "soak", "timings", "topology",
)  # fmt: skip
#: what marks a test file that starts real worker processes
PROCESSES = re.compile(r"\bspawn\b|\bWorkerProc\b|pytest\.mark\.slow")


def package_wings(root: Path) -> dict[str, set[str]]:
    """``module or package name -> the wings of worker/ that hold one by that name`` (a
    top-level module counts as ``face``, the folder its tests live in)."""
    found: dict[str, set[str]] = {}
    pkg = root / "worker"
    for path in pkg.rglob("*.py"):
        parts = path.relative_to(pkg).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not parts or parts[-1].startswith("_"):
            continue
        wing = parts[0] if len(parts) > 1 or (pkg / parts[0]).is_dir() else "face"
        if wing in WINGS:
            found.setdefault(parts[-1], set()).add(wing)
    return found


def guess(path: Path, modules: dict[str, set[str]]) -> str | None:
    """The wing of a flat test file :data:`WINGS` does not name, or ``None``."""
    name = path.stem.removeprefix("test_")
    wings = {name} if name in WINGS else modules.get(name, set())
    if len(wings) == 1:
        return next(iter(wings))
    if PROCESSES.search(path.read_text()):
        return "system"
    return None


def imported_wings(path: Path) -> list[str]:
    """The wings of the ``worker`` modules a test file imports (a hint for :data:`WINGS`)."""
    names = re.findall(r"^\s*(?:from|import) worker\.(\w+)", path.read_text(), re.M)
    return sorted({name if name in WINGS else "face" for name in names})


def plan(tests: Path) -> tuple[dict[Path, str], list[str]]:
    """``(flat file -> its wing, what to say of each flat file no rule places)``."""
    moves, unknown = {}, []
    modules = package_wings(tests.parent)
    for path in sorted(tests.glob("test_*.py")):
        wing = WHERE.get(path.stem) or guess(path, modules)
        if wing is None:
            hint = ", ".join(imported_wings(path)) or "none"
            unknown.append(f"{path.name} (imports from the wings: {hint})")
        else:
            moves[path] = wing
    return moves, unknown


def rewrite(text: str, *, in_wing: bool, where: dict[str, str] = WHERE) -> str:
    for stem, wing in where.items():
        text = re.sub(rf"(?<![\w.])tests\.{stem}\b", f"tests.{wing}.{stem}", text)
        text = re.sub(rf"(?<![\w/])tests/{stem}\.py\b", f"tests/{wing}/{stem}.py", text)
    text = re.sub(r"(?<![\w.])from tests\.conftest import\b", "from harness import", text)
    for name in SUPPORT:
        text = re.sub(rf"(?<![\w.])tests\.{name}\b", f"harness.{name}", text)
        text = re.sub(rf"(?<![\w/])tests/{name}(?=\.py\b|/)", f"harness/{name}", text)
    if in_wing:  # one folder deeper: the repository root is two folders up
        for old, new in DEEPER:
            text = text.replace(old, new)
    return text


def files_to_rewrite(root: Path) -> list[Path]:
    out = [
        p
        for d in REWRITE_DIRS
        if (root / d).exists()
        for p in (root / d).rglob("*")
        if p.is_file()
        and p.suffix in SUFFIXES
        and "node_modules" not in p.parts
        and "__pycache__" not in p.parts
        and p.resolve() != Path(__file__).resolve()  # its own patterns stay as written
    ]
    return out + [root / f for f in REWRITE_FILES if (root / f).exists()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default=".", type=Path)
    parser.add_argument("--check", action="store_true", help="only report; exit 1 if a move is due")
    args = parser.parse_args()
    root = args.root.resolve()
    tests = root / "tests"
    moves, unknown = plan(tests)
    if unknown:
        print("tests/ has test files no rule places; add each to WINGS in tools/move_tests.py:")
        for name in unknown:
            print(f"  {name}")
        return 2
    where = {**WHERE, **{path.stem: wing for path, wing in moves.items()}}
    if args.check:
        for path, wing in moves.items():
            print(f"would move {path.name} -> tests/{wing}/")
        return 1 if moves else 0
    for path, wing in moves.items():
        folder = tests / wing
        folder.mkdir(exist_ok=True)
        init = folder / "__init__.py"
        if not init.exists():
            init.write_text("")
            git(root, "add", str(init))
        git(root, "mv", str(path), str(folder / path.name))
    changed: list[Path] = []
    for path in files_to_rewrite(root):
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        in_wing = path.parent.parent == tests and path.parent.name in WINGS
        new = rewrite(text, in_wing=in_wing and path.name.startswith("test_"), where=where)
        if new != text:
            path.write_text(new)
            changed.append(path)
    print(f"moved {len(moves)} test files into wings; rewrote references in {len(changed)} files")
    tidy(root, [p for p in changed if p.suffix == ".py"])
    return 0


def tidy(root: Path, paths: list[Path]) -> None:
    """Imports sorted again and the code formatted (a longer module path moves an import or
    wraps a line); a docstring or comment line the longer paths pushed past the line limit is
    listed for a hand wrap."""
    if not paths:
        return
    beside = Path(sys.executable).with_name("ruff")  # the venv's, when run by its python
    ruff = shutil.which("ruff") or (str(beside) if beside.exists() else None)
    if ruff is None:
        print("ruff not found (activate the dev venv): run `ruff check --fix --select I` and")
        print("`ruff format` on the rewritten files, then wrap what `ruff check` finds too long")
        return
    names = [str(p) for p in paths]
    subprocess.run([ruff, "check", "--fix", "--select", "I", "--quiet", *names], cwd=root)
    subprocess.run([ruff, "format", "--quiet", *names], cwd=root)
    long_lines = [ruff, "check", "--select", "E501", "--output-format", "concise"]
    subprocess.run([*long_lines, *names], cwd=root)


if __name__ == "__main__":
    sys.exit(main())
