"""Every example of README.md and the docs site runs as written or says it is a fragment, the
pages link only to what exists, and the site builds with ``mkdocs build --strict``.

A ```python block is preceded by ``<!-- tested: tests/test_x.py -->`` (that test extracts and
runs it, naming the page) or ``<!-- fragment -->`` (a piece of a larger program: it must still
compile, top-level ``await`` allowed). A block that is a snippet include
(``--8<-- "examples/…"``) shows a file of the repository, which must exist and compile.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.docpages import DOCS, ROOT, python_block
from worker.testing import Harness

PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
MARKER = re.compile(r"<!--\s*(tested:\s*(?P<test>\S+)|fragment)\s*-->")
INCLUDE = re.compile(r'^--8<-- "(?P<path>[^"]+)"$')


def python_blocks_with_markers(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, code, the HTML comments right above the fence) of each ```python block."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip().startswith("```") and lines[i].strip() != "```":
            lang = lines[i].strip().strip("`").strip()
            start = i
            i += 1
            body = []
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            if lang == "python":
                comments, j = [], start - 1
                while j >= 0 and lines[j].strip().startswith("<!--"):
                    comments.append(lines[j].strip())
                    j -= 1
                found.append((start + 1, "\n".join(body) + "\n", comments))
        i += 1
    return found


def every_block() -> list[tuple[str, int, str, list[str]]]:
    return [
        (str(p.relative_to(ROOT)), line, code, comments)
        for p in PAGES
        for line, code, comments in python_blocks_with_markers(p)
    ]


def test_every_python_block_is_tested_or_a_fragment() -> None:
    blocks = every_block()
    assert len(blocks) >= 10, blocks  # the walk finds the blocks at all
    unmarked, wrong = [], []
    for page, line, _, comments in blocks:
        marks = [m for c in comments if (m := MARKER.search(c))]
        if not marks:
            unmarked.append(f"{page}:{line}")
            continue
        for mark in marks:
            test = mark.group("test")
            if test is None:
                continue
            test_file = ROOT / test
            stem = Path(page).stem if page != "README.md" else "README.md"
            if not test_file.is_file() or stem not in test_file.read_text():
                wrong.append(f"{page}:{line}: {test} does not exist or never reads {stem}")
    assert not unmarked, f"neither <!-- tested: … --> nor <!-- fragment -->: {unmarked}"
    assert not wrong, wrong


def test_every_python_block_compiles() -> None:
    for page, line, code, _ in every_block():
        include = INCLUDE.match(code.strip())
        if include:
            source = ROOT / include.group("path")
            assert source.is_file(), f"{page}:{line}: includes a missing {source}"
            code = source.read_text()
        try:
            compile(code, f"{page}:{line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        except SyntaxError as exc:
            pytest.fail(f"{page}:{line}: {exc}")


def test_the_pages_point_only_at_files_that_exist() -> None:
    """Relative links of README.md (docs pages: ``mkdocs build --strict`` checks theirs) and
    every repository path the pages name in backquotes, such as ``examples/fastapi/``."""
    missing = []
    for page in PAGES:
        text = page.read_text()
        if page.name == "README.md":
            for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
                if not re.match(r"[a-z]+:", target) and not (ROOT / target).exists():
                    missing.append(f"{page.name}: ({target})")
        top = "examples|deploy|bench|docs|tests|config|roles"
        for path in re.findall(rf"`((?:{top})/[\w./-]*)`", text):
            if "…" not in path and not (ROOT / path).exists():
                missing.append(f"{page.relative_to(ROOT)}: `{path}`")
    assert not missing, missing


async def test_the_broadcast_example_reloads_the_prices() -> None:
    code = python_block("duties", "Broadcast to every process")
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/duties.md", "exec"), scope)
    async with Harness(scope["app"]) as h:
        assert h.state["prices"] == {}  # the startup hook loaded an empty price list
        await h.run("set_price", "sim-10g", 990)  # writes Redis, broadcasts "pricing"
        assert await h.redis.keys("*bcast:pricing*"), "no broadcast sent"
        with pytest.raises(KeyError):
            await h.run("quote", "sim-10g")  # this process has not reloaded yet
        await scope["reload"](h.context, {"sku": "sim-10g"})  # what each process's handler does
        assert await h.run("quote", "sim-10g") == 990


def test_the_site_builds_strict(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link between pages, a missing nav page, a snippet
    whose file is gone or a docstring mkdocstrings cannot render fails here (about 5 s)."""
    venv = str(Path(sys.executable).parent)  # the venv running the tests, even if not on PATH
    mkdocs = shutil.which("mkdocs", path=venv) or shutil.which("mkdocs")
    if mkdocs is None and os.environ.get("CI") != "1":
        pytest.skip("the docs extra is not installed: pip install -e '.[docs]'")
    assert mkdocs is not None, "CI: the docs extra is part of the test extra"
    proc = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "reference" / "index.html").is_file()
