"""The distribution as a user gets it: its own name and version, a wheel and an sdist that
build and pass ``twine check`` with what a user needs in them, and types a user's
``mypy --strict`` can see (the README's app type-checks with no ignores)."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from worker.version import DIST_NAME, __version__

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()

#: The helpers the README's app calls but leaves to the reader (a database, a mailer, a
#: gateway), typed as a user's own code would be.
HELPERS = """
from collections.abc import AsyncIterator
from typing import Any


async def create_db_pool() -> Any:
    raise NotImplementedError


async def mail(order_id: int) -> None: ...
async def expire_orders(db: Any, before: Any) -> None: ...
async def reset_daily_usage(db: Any) -> None: ...
async def gateway_query(card_id: str) -> None: ...


async def due_packages(db: Any) -> list[Any]:
    raise NotImplementedError


def fetch_cards_after(db: Any, cursor: str | None, batch: int) -> AsyncIterator[list[Any]]:
    raise NotImplementedError


def blocking_idle(seconds: float, mailbox: str | None = None) -> None: ...
def list_mailboxes(ctx: Any) -> list[str]:
    return []
"""


def readme_app() -> str:
    """The README's "Writing an app" file (the block that starts ``# myservice/jobs.py``)."""
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    (app,) = [b for b in blocks if b.startswith("# myservice/jobs.py")]
    return app


def test_the_distribution_has_its_own_name() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DIST_NAME == "fenced-worker"
    assert project["scripts"] == {"worker": "worker.cli:main"}
    # every extra that names the project itself names it by the distribution's name
    for extra, reqs in project["optional-dependencies"].items():
        for req in reqs:
            assert not req.startswith("worker["), (extra, req)
    assert (ROOT / "worker" / "py.typed").exists()
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert "Typing :: Typed" in project["classifiers"]


def test_version_flag_prints_the_distribution_and_its_version() -> None:
    script = Path(sys.executable).parent / "worker"
    for cmd in ([sys.executable, "-m", "worker", "--version"], [str(script), "--version"]):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"fenced-worker {__version__}", (cmd, out.stdout)


@pytest.mark.slow
def test_the_readme_app_passes_mypy_strict(tmp_path: Path) -> None:
    """A user's app written like the README's, checked with ``mypy --strict`` against the
    installed package: no import-untyped (``py.typed``), no untyped decorator."""
    app = readme_app()
    header, _, body = app.partition("from worker import")
    (tmp_path / "jobs.py").write_text(header + HELPERS + "\nfrom worker import" + body)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "jobs.py"],
        cwd=tmp_path,  # not the repository's pyproject.toml: a user's own, default setup
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_wheel_and_sdist_build_and_pass_twine_check(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    assert wheel.name == f"fenced_worker-{__version__}-py3-none-any.whl"
    assert sdist.name == f"fenced_worker-{__version__}.tar.gz"
    check = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr

    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(f"fenced_worker-{__version__}.dist-info/METADATA").decode()
    assert "worker/py.typed" in names and "worker/web/static/index.html" in names
    assert f"fenced_worker-{__version__}.dist-info/licenses/LICENSE" in names
    assert not any(n.startswith(("tests/", "bench/")) or "__pycache__" in n for n in names)
    assert "Name: fenced-worker" in meta and "License-Expression: MIT" in meta
    assert "Classifier: Typing :: Typed" in meta

    with tarfile.open(sdist) as t:
        files = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "worker/py.typed"} <= files
    junk = [
        n
        for n in files
        if n.startswith(("tests/", "bench/", ".venv", ".ci", "dist/", "build/"))
        or "__pycache__" in n
        or n.endswith((".pyc", ".rdb", ".log"))
    ]
    assert not junk, junk
