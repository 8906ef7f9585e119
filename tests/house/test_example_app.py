"""The "Writing an app" page's app is a complete file, ``examples/myservice/jobs.py``, that runs as
written: the page includes that file (no copy to drift), its testing example passes under the
pytest configuration it documents, and a real worker process runs every duty of it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from harness import ROOT, Spawn, wait_until
from harness.docpages import page
from worker import Client

EXAMPLE = ROOT / "examples" / "myservice"


async def receipt(url: str, prefix: str) -> object:
    """Enqueue ``send_receipt(42)`` and wait for its result (it raises if the job failed)."""
    client = await Client.connect(url, key_prefix=prefix)
    try:
        job = await client.enqueue("send_receipt", 42)
        return await client.job(job).result(timeout=30)
    finally:
        await client.close()


def test_the_page_includes_the_example_files() -> None:
    text = page("writing-an-app")
    assert '--8<-- "examples/myservice/jobs.py"' in text
    assert '--8<-- "examples/myservice/test_jobs.py"' in text
    assert 'asyncio_mode = "auto"' in text  # the pytest configuration the Harness needs


def test_the_testing_example_passes_with_its_documented_configuration() -> None:
    """``python -m pytest examples/myservice``: its own pytest.ini (asyncio_mode = auto), not
    the project's, as a user's project would have it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKER_", "PYTEST_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(EXAMPLE)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "configfile: pytest.ini" in proc.stdout and "2 passed" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_the_example_app_runs_every_duty_for_real(spawn: Spawn, redis_url: str) -> None:
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'examples'}"}
    proc = spawn("all", name="myservice", app="myservice.jobs:app", env=env)

    def events(name: str) -> list[dict[str, object]]:
        return [e for e in proc.events() if e.get("event") == name]

    done = wait_until(lambda: events("initializer done"), timeout=60, what="initializer done")
    assert done[0]["items"] == 2500  # every card of backend.Database, in the poller
    loops = wait_until(
        lambda: len(events("per-key loop started")) == 2 and events("per-key loop started"),
        timeout=60,
        what="a loop per mailbox",
    )
    assert sorted(str(e["key"]) for e in loops) == ["sales", "support"]
    assert asyncio.run(receipt(redis_url, spawn.prefix)) is None  # type: ignore[attr-defined]
    assert proc.alive(), proc.log()
    assert proc.terminate() == 0, proc.log()
    errors = [e for e in proc.events() if e.get("log_level") in ("error", "critical")]
    assert not errors, errors
