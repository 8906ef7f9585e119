"""The FastAPI example (examples/fastapi) for real: ``uvicorn`` serving ``api:api`` on a free
port (two worker processes, each with its own lifespan client), a ``leader`` and a
``consumer`` running ``jobs:app``, one real server, driven over HTTP. Plus static checks of the
example's image and compose file (one image, two commands)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import ROOT, Spawn, free_port, wait_until
from harness.procs import repo_env
from worker.settings import Settings, env_names

EXAMPLE = ROOT / "examples" / "fastapi"
PYTHONPATH = os.pathsep.join([str(ROOT), str(EXAMPLE)])


class Api:
    """``uvicorn api:api`` in a subprocess; ``call()`` speaks JSON to it."""

    def __init__(self, env: dict[str, str], log_path: Path, workers: int = 2) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "uvicorn", "api:api", "--host", "127.0.0.1",
                "--port", str(self.port), "--workers", str(workers),
                "--timeout-graceful-shutdown", "5",
            ],
            env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def call(self, method: str, path: str) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.base + path, method=method, data=b"" if method == "POST" else None
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def up(self) -> bool:
        assert self.proc.poll() is None, f"uvicorn exited:\n{self.log()}"
        try:
            return self.call("GET", "/healthz") == (200, {"ok": True})
        except OSError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


@pytest.fixture
def api(redis_url: str, spawn: Spawn, tmp_path: Path) -> Iterator[Api]:
    env = repo_env(
        WORKER_REDIS_URL=redis_url,
        WORKER_KEY_PREFIX=spawn.prefix,  # type: ignore[attr-defined]
        PYTHONPATH=PYTHONPATH,
        PYTHONUNBUFFERED="1",
    )
    server = Api(env, tmp_path / "api.log")
    try:
        yield server
    finally:
        server.close()


@pytest.mark.slow
def test_the_example_runs_end_to_end(api: Api, spawn: Spawn) -> None:
    env = {"PYTHONPATH": PYTHONPATH}
    workers = [spawn(role, app="jobs:app", env=env) for role in ("leader", "consumer")]
    wait_until(api.up, timeout=60, what=f"the API to answer /healthz\n{api.log()}")
    prefix = spawn.prefix  # type: ignore[attr-defined]

    def complete(job_id: str) -> Any:
        code, body = api.call("GET", f"/jobs/{job_id}")
        assert code == 200, body
        return body if body["status"] == "complete" else None

    # enqueue -> the job runs -> its status and result are readable through the API
    code, body = api.call("POST", "/orders/42/receipt")
    assert code == 200 and body["job_id"]
    done = wait_until(lambda: complete(body["job_id"]), timeout=30, what="the receipt job")
    assert done["success"] is True and done["result"] == {"order_id": 42, "sent": True}
    assert api.call("GET", "/jobs/no-such-job")[0] == 404

    # the same unique_key twice -> one job, one run
    first = api.call("POST", "/packages/p-7/activate")
    second = api.call("POST", "/packages/p-7/activate")
    assert first == (200, {"job_id": f"{prefix}unique:activate:p-7", "enqueued": True})
    assert second == (200, {"job_id": f"{prefix}unique:activate:p-7", "enqueued": False})
    done = wait_until(lambda: complete(first[1]["job_id"]), timeout=30, what="the activation")
    assert done["result"] == {"package_id": "p-7", "activation": 1}
    assert api.call("POST", "/packages/p-7/activate")[1]["enqueued"] is False  # result kept
    assert api.call("GET", "/packages/p-7") == (200, {"package_id": "p-7", "activations": 1})

    # schedule a poll item -> the leader dispatches it -> poll_card runs (and reschedules it)
    assert api.call("POST", "/cards/card-1/poll")[0] == 200
    polled = wait_until(
        lambda: (b := api.call("GET", "/cards/card-1")[1])["polls"] >= 1 and b,
        timeout=30,
        what="card-1 to be polled",
    )
    assert polled["polls"] == 1 and polled["last_polled"]

    # the periodic job ticks in the workers (never in the API processes), once per tick
    st = wait_until(
        lambda: (s := api.call("GET", "/stats")[1])["expire_orders_ticks"] >= 1 and s,
        timeout=30,
        what="a tick of expire_orders",
    )
    assert st["max_runs_per_tick"] == 1

    api.proc.send_signal(signal.SIGTERM)  # the lifespan closes the client
    assert api.proc.wait(30) == 0, api.log()
    assert "Application shutdown complete" in api.log()
    for w in workers:
        assert w.alive(), w.log()
        assert w.terminate() == 0, w.log()


# -- the example's image and compose file -----------------------------------------------------


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLE / "compose.yaml").read_text())
    return data


def test_compose_runs_api_and_workers_from_one_image_with_two_commands() -> None:
    services = _compose()["services"]
    assert set(services) == {"redis", "api", "leader", "consumer"}
    app_services = {name: services[name] for name in ("api", "leader", "consumer")}
    images = {svc["image"] for svc in app_services.values()}
    assert len(images) == 1, images
    for name, svc in app_services.items():
        build = svc["build"]
        assert (EXAMPLE / build["context"]).resolve() == ROOT, name
        assert (ROOT / build["dockerfile"]).resolve() == EXAMPLE / "Dockerfile", name
        env = svc["environment"]
        assert env["WORKER_REDIS_URL"] == "redis://redis:6379/0"
        assert all(k in env_names() for k in env if k.startswith("WORKER_")), env
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
    # the only difference between the services of the image: command (and role profile)
    assert services["api"]["command"][:2] == ["uvicorn", "api:api"]
    assert "--workers" in services["api"]["command"]
    for role in ("leader", "consumer"):
        svc = services[role]
        assert svc["command"] == ["python", "-m", "worker", "run", "--role", role]
        env_file = (EXAMPLE / svc["env_file"][0]).resolve()
        assert env_file == ROOT / "roles" / f"{role}.env"
        profile = dict(
            ln.split("=", 1)
            for ln in env_file.read_text().splitlines()
            if ln.strip() and not ln.startswith("#")
        )
        fields = {k.removeprefix("WORKER_").lower(): v for k, v in profile.items()}
        grace = float(svc["stop_grace_period"].removesuffix("s"))
        assert grace > Settings(**fields).worst_case_shutdown_s(), role
    redis_cmd = " ".join(services["redis"]["command"])
    assert "--maxmemory-policy noeviction" in redis_cmd


def test_example_image_and_compose_pass_the_linters() -> None:
    yamllint = subprocess.run(
        [sys.executable, "-m", "yamllint", "-s", "-c", ".yamllint.yaml", "examples"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert yamllint.returncode == 0, yamllint.stdout + yamllint.stderr
    hadolint = Path(sys.executable).parent / "hadolint"
    cmd = str(hadolint) if hadolint.is_file() else "hadolint"
    proc = subprocess.run(
        [cmd, "--no-color", "examples/fastapi/Dockerfile"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr
    text = (EXAMPLE / "Dockerfile").read_text()
    assert ".[examples]" in text and "WORKER_APP=jobs:app" in text
    assert "COPY examples/fastapi/api.py examples/fastapi/jobs.py /app/" in text


def test_the_docs_point_at_the_web_app_path() -> None:
    from harness.docpages import page

    readme, web = (ROOT / "README.md").read_text(), page("web-apps")
    assert "(docs/web-apps.md)" in readme and "(examples/fastapi/)" in readme
    assert "(migration.md)" in web and "`examples/fastapi/`" in web
    assert '"worker:queue"' not in web  # the plain-arq recipe derives it from the prefix
    assert "Client.from_env" in web and "### Two apps on one Redis" in page("guarantees")
    migration = (ROOT / "docs" / "migration.md").read_text()
    for topic in ("--workers 4", "## 2. The cut-over", "## 4. Rollback", "ctx.once"):
        assert topic in migration, topic
    assert (EXAMPLE / "README.md").is_file()
