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

ROOT = Path(__file__).resolve().parents[2]
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


APP_MODULE = """
from worker import App, JobContext

app = App("pkgcheck")


@app.task
async def greet(ctx: JobContext, name: str) -> str:
    return f"hello {name} from redis-py " + __import__("redis").__version__
"""

CLIENT_SCRIPT = """
import asyncio, sys
import worker


async def main(url: str, prefix: str) -> None:
    client = await worker.Client.connect(url, key_prefix=prefix)
    try:
        job_id = await client.enqueue("greet", "wheel")
        print(await client.job(job_id).result(timeout=90, poll_delay=0.1))
        print((await client.job(job_id).status()).value)
    finally:
        await client.close()


asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.slow
def test_the_wheel_runs_a_job_beside_redis_py_8_and_fastapi(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    """``pip install fenced-worker`` into an environment that already has redis-py 8 and
    FastAPI keeps them (no arq, which pins redis<6), and a worker from that environment runs a
    job its client enqueued, on a real server. Before: the install failed to resolve."""
    import os

    from harness.timings import FAST_ENV

    dist = tmp_path / "dist"
    build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)]
    subprocess.run([*build, str(ROOT)], capture_output=True, timeout=240, check=True)
    (wheel,) = dist.glob("*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], timeout=120, check=True)
    py, pip = str(venv / "bin" / "python"), [str(venv / "bin" / "python"), "-m", "pip"]
    quiet = ["install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *quiet, "redis>=8,<9", "fastapi"], timeout=600, check=True)
    done = subprocess.run(
        [*pip, *quiet, str(wheel)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    probe = "import importlib.util as u, redis; print(redis.__version__, u.find_spec('arq'))"
    versions = subprocess.run(
        [py, "-c", probe],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split()  # fmt: skip
    assert versions[0].startswith("8.") and versions[1] == "None", versions

    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "pkgapp.py").write_text(APP_MODULE)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WORKER_", "PYTHON"))},
        **FAST_ENV,
        "WORKER_REDIS_URL": redis_url,
        "WORKER_KEY_PREFIX": key_prefix,
        "WORKER_APP": "pkgapp:app",
        "PYTHONPATH": str(app_dir),  # the app only: the package comes from the wheel
    }
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(venv / "bin" / "worker"), "run", "--role", "all", "--instance-name", "pkg"],
            env=env, cwd=app_dir, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            client = subprocess.run(
                [py, "-c", CLIENT_SCRIPT, redis_url, key_prefix],
                env=env, cwd=app_dir, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(30)
    said = client.stdout.split("\n")
    assert client.returncode == 0, client.stderr + log.read_text(errors="replace")[-3000:]
    assert said[0] == f"hello wheel from redis-py {versions[0]}" and said[1] == "complete", said
