"""Every ``pip install`` line a user can copy names this project by its distribution name.

The PyPI name ``worker`` belongs to an unrelated 2018 package that ships its own top-level
``worker/`` package: ``pip install 'worker[otel]'`` installs that one. So every install line in
the README, the docs, the examples, the config and deploy files and the package's own messages
must say ``fenced-worker`` (or ``.`` from a clone).
"""

from __future__ import annotations

import re
from pathlib import Path

from worker.version import DIST_NAME

ROOT = Path(__file__).resolve().parents[2]
#: Where a user reads install lines. CHANGELOG.md is left out: it quotes the old mistake.
SCANNED = [
    *("README.md", "Dockerfile", "mkdocs.yml", "docs", "examples", "worker"),
    *("config", "deploy", "roles", "bench", ".ci"),
]
TEXT_SUFFIXES = {"", ".md", ".py", ".toml", ".yaml", ".yml", ".txt", ".env", ".sh", ".example"}
#: The requirements of one ``pip install``: up to the end of the code span, a shell separator
#: or comment, or the line.
_ARGS = re.compile(r"pip install\b([^`#;&|()\n]*)")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def wrong_names(line: str) -> list[str]:
    """The requirements on ``line``'s ``pip install`` commands that name the distribution
    ``worker`` (PEP 503-normalized: ``Worker``, ``worker[otel]``, ``worker>=1`` too)."""
    found = []
    for match in _ARGS.finditer(line):
        for token in match.group(1).split():
            token = token.strip("'\"\\,.:")
            if token.startswith("-"):
                continue  # an option (-e, -c, --no-cache-dir); its argument is a path
            name = _NAME.match(token)
            if name and re.sub(r"[-_.]+", "-", name.group()).lower() == "worker":
                found.append(token)
    return found


def install_lines() -> list[tuple[str, int, str]]:
    files: list[Path] = []
    for entry in SCANNED:
        path = ROOT / entry
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    lines = []
    for path in files:
        if path.suffix not in TEXT_SUFFIXES and path.name != "Dockerfile":
            continue
        if "__pycache__" in path.parts:
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "pip install" in line:
                lines.append((str(path.relative_to(ROOT)), n, line))
    return lines


def test_the_scanner_finds_the_wrong_name_and_only_it() -> None:
    for wrong in (
        "pip install 'worker[otel]'",
        "`pip install worker` and",
        'needs the API: pip install "Worker[embedded]" (or set X=off)',
        "RUN pip install --no-cache-dir -c constraints.txt worker==0.1",
        "pip install redis 'worker[otel]>=0.1'",
    ):
        assert wrong_names(wrong), wrong
    for right in (
        f"pip install '{DIST_NAME}[otel]'",
        "pip install -e '.[embedded]' && python -m worker --role all",
        "`pip install sentry-sdk`; then the worker starts",
        'RUN pip install --no-cache-dir ".[examples]"',
        "pip install -e . flask  # the worker and the web app",
        "systems refuse a plain `pip install`): a worker",
    ):
        assert not wrong_names(right), right


def test_every_install_line_names_the_distribution() -> None:
    lines = install_lines()
    # the scan reaches the places that matter (the docs, the package's messages, the README)
    scanned = {path.split("/", 1)[0] for path, _, _ in lines}
    assert {"README.md", "docs", "worker", "examples"} <= scanned, scanned
    wrong = [f"{path}:{n}: {line.strip()}" for path, n, line in lines if wrong_names(line)]
    assert not wrong, "install lines naming the unrelated PyPI package `worker`:\n" + "\n".join(
        wrong
    )
    otel = [line for path, _, line in lines if "[otel]" in line]
    assert otel and all(f"'{DIST_NAME}[otel]'" in line for line in otel), otel


def test_no_stale_readme_copy() -> None:
    assert not (ROOT / "README.new.md").exists()
