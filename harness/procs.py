"""Real ``python -m worker`` processes: :class:`WorkerProc` (output to a log file, signals,
JSON events), :func:`spawner` and :func:`cli_runner` behind the tests' ``spawn`` and ``cli``
fixtures, and their types."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.timings import FAST_ENV

#: The repository's root: worker processes run from it, with it on ``PYTHONPATH``.
ROOT = Path(__file__).resolve().parent.parent


class WorkerProc:
    """A real ``python -m worker`` process whose output goes to a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path, name: str) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "worker", *args],
            env=env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)

    def terminate(self, timeout: float = 30.0) -> int:
        self.signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(10)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines (non-JSON lines skipped)."""
        out = []
        for line in self.log().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def close(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


#: ``spawn(role, *, name=None, app="harness.apps.ledger:app", command="run", env=None)``;
#: ``spawn.prefix`` is the key prefix of the processes it starts.
Spawn = Callable[..., WorkerProc]
#: ``cli(*args, env=None, timeout=60.0)``: ``python -m worker ARGS`` run to completion.
CliRun = Callable[..., "subprocess.CompletedProcess[str]"]


def clean_env() -> dict[str, str]:
    """This environment minus every ``WORKER_*`` variable."""
    return {k: v for k, v in os.environ.items() if not k.startswith("WORKER_")}


def repo_env(**extra: str) -> dict[str, str]:
    """A child's environment: this one minus every ``WORKER_*`` variable, the repository on
    ``PYTHONPATH``, ``extra`` on top."""
    return {**clean_env(), "PYTHONPATH": str(ROOT), **extra}


def spawner(redis_url: str, log_dir: Path, prefix: str, procs: list[WorkerProc]) -> Spawn:
    """Start worker processes on ``redis_url`` with key prefix ``prefix`` and :data:`FAST_ENV`:
    ``spawn("leader", name="l1", app=..., env={...})`` (a ``None`` value unsets a variable);
    each process is appended to ``procs`` (the caller closes them) and logs to ``log_dir``."""

    def start(
        role: str,
        *,
        name: str | None = None,
        app: str = "harness.apps.ledger:app",
        command: str = "run",
        env: dict[str, str | None] | None = None,
    ) -> WorkerProc:
        name = name or f"{role}-{len(procs) + 1}"
        full = {
            **clean_env(),
            **FAST_ENV,
            "WORKER_REDIS_URL": redis_url,
            "WORKER_KEY_PREFIX": prefix,
            "WORKER_APP": app,
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        full = {k: v for k, v in full.items() if v is not None}  # None: unset it
        # run takes --role/--instance-name; another command (web) gets them from the env
        args = [command, "--role", role, "--instance-name", name] if command == "run" else [command]
        if command != "run":
            full.setdefault("WORKER_INSTANCE_NAME", name)
        p = WorkerProc(args, full, log_dir / f"{name}.log", name)
        procs.append(p)
        return p

    start.prefix = prefix  # type: ignore[attr-defined]
    return start


def cli_runner() -> CliRun:
    """Run ``python -m worker ARGS`` to completion: ``cli("plan", "--role", "leader", env={})``.

    The environment is this one minus every ``WORKER_*`` variable, plus ``env``; stdout and
    stderr are captured separately (text).
    """

    def run(
        *args: str, env: dict[str, str] | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        full = {**clean_env(), "PYTHONPATH": str(ROOT), **(env or {})}
        return subprocess.run(
            [sys.executable, "-m", "worker", *args],
            env=full,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run
