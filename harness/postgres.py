"""A throwaway PostgreSQL server for tests: Debian's binaries, ``initdb`` and ``pg_ctl`` on a
temporary directory, listening on a free loopback port; no service, no mocks.

``initdb`` refuses to run as root, so as root (CI) the server runs as the ``postgres`` user the
Debian package creates, or ``nobody``, in a directory of its own outside pytest's (which only
root may enter)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from harness import free_port


def binaries() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl``: the newest ``/usr/lib/postgresql/*/bin``
    (Debian), else wherever ``PATH`` finds ``initdb``; ``None`` when PostgreSQL is absent."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).resolve().parent if on_path else None


class Postgres:
    """One server: :meth:`start`, :attr:`dsn` (superuser ``postgres``, trust auth on loopback),
    :meth:`dsn_for` a database, :meth:`stop` (immediate) and the directory removed."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="worker-pg-"))
        self.data = self.dir / "data"
        self.user: str | None = None
        if os.geteuid() == 0:  # initdb refuses root: run the server as an unprivileged user
            names = [u.pw_name for u in pwd.getpwall()]
            self.user = "postgres" if "postgres" in names else "nobody"
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self.running = False

    def _run(self, *args: str, timeout: float = 60.0) -> None:
        proc = subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            user=self.user,
            cwd=self.dir,
            env={**os.environ, "LC_ALL": "C"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {proc.stdout}{proc.stderr}")

    def start(self) -> None:
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync", "-E",
            "UTF8",
        )  # fmt: skip
        # max_connections: the example apps open a connection per job, and after a Redis
        # failover two workers run the backlog at once (100, the default, ran out under load)
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off"
            " -c max_connections=400"
        )
        log = str(self.dir / "server.log")
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "-t", "60", "start"
        )
        self.running = True

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def dsn_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def database(self, name: str) -> str:
        """A fresh database ``name`` (dropped first if it exists): its DSN."""
        import psycopg  # the test extra's; tests/ imports this module without it too

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
        return self.dsn_for(name)

    def log(self) -> str:
        path = self.dir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.running:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            self.running = False
        shutil.rmtree(self.dir, ignore_errors=True)
