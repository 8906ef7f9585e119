"""What this host's running workers tell the command line: the embedded server's URL and each
process's health address, as small files in a private runtime directory.

A worker writes ``<kind>-<pid>.json`` when it starts (``embedded``: the private server it
started; ``worker``: its instance name and health port) and removes it when it stops. Admin
commands read them: ``status`` in a second terminal finds the demo's embedded server without a
``WORKER_REDIS_URL``, and ``health`` probes the port a process actually bound. A file whose
process is gone (SIGKILL) is ignored and removed. The directory is ``$XDG_RUNTIME_DIR/worker``,
else ``<tmp>/worker-<uid>``, mode 0700: only this user's processes are seen.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["embedded", "worker"]


def runtime_dir() -> Path:
    """This user's private directory for the files (created on first use, mode 0700)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = (
        Path(base) / "worker"
        if base and os.path.isdir(base)
        else Path(tempfile.gettempdir()) / f"worker-{os.getuid()}"
    )
    path.mkdir(mode=0o700, exist_ok=True)
    if path.stat().st_uid != os.getuid():  # someone else's directory: never trust it
        raise PermissionError(f"{path} belongs to another user")
    return path


@dataclass(frozen=True)
class Announcement:
    """One running process's file: what it said, and its pid."""

    kind: Kind
    pid: int
    data: dict[str, Any]
    path: Path


def announce(kind: Kind, data: dict[str, Any]) -> Path | None:
    """Write this process's ``kind`` file; ``None`` when the directory is unusable (a
    read-only filesystem in a container: nothing to tell, nothing lost)."""
    try:
        directory = runtime_dir()
        path = directory / f"{kind}-{os.getpid()}.json"
        pid = os.getpid()
        record = {**data, "pid": pid, "pid_started": _started(pid), "written": time.time()}
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{kind}-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
        return path
    except OSError:
        return None


def withdraw(path: Path | None) -> None:
    """Remove a file :func:`announce` wrote (idempotent)."""
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def discover(kind: Kind) -> list[Announcement]:
    """The ``kind`` files of live processes, oldest first; files of dead ones are removed."""
    try:
        directory = runtime_dir()
    except OSError:
        return []
    found = []
    for path in directory.glob(f"{kind}-*.json"):
        try:
            data = json.loads(path.read_text())
            pid = int(data["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not _alive(pid, data.get("pid_started")):
            withdraw(path)
            continue
        found.append(Announcement(kind, pid, data, path))
    return sorted(found, key=lambda a: float(a.data.get("written", 0)))


def _alive(pid: int, started: object) -> bool:
    """``pid`` runs and is the process that wrote the file (not a later one given its pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return started is None or _started(pid) in (None, started)


def _started(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux ``/proc``), else ``None``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])  # field 22 of the whole line
