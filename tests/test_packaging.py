"""The distribution as a user gets it: its own name and version, a wheel and an sdist that
build and pass ``twine check`` with what a user needs in them, and types a user's
``mypy --strict`` can see (the docs' app type-checks with no ignores)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from worker.version import DIST_NAME, __version__

ROOT = Path(__file__).resolve().parent.parent
#: The docs' "Writing an app" app, a complete file with its stand-ins (examples/myservice/).
EXAMPLE_APP = ROOT / "examples" / "myservice"


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
def test_the_docs_app_passes_mypy_strict(tmp_path: Path) -> None:
    """A user's app written like the docs' (``examples/myservice``: its jobs, stand-ins and
    Harness tests), checked with ``mypy --strict`` against the installed package: no
    import-untyped (``py.typed``), no untyped decorator."""
    shutil.copytree(EXAMPLE_APP, tmp_path / "myservice", ignore=shutil.ignore_patterns("*.ini"))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "myservice"],
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
