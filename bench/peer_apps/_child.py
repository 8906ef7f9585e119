"""The side of ``bench/peers.py`` that runs inside a peer's own venv (no ``worker``, no bench).

Each ``<peer>.py`` beside this file defines its no-op task (which counts its runs in
:class:`Tally`, in process memory, so no Redis command is added), a ``fill`` coroutine (enqueue
N jobs with the peer's own client API) and a ``prepare`` coroutine (build and connect the
peer's worker; return the coroutine function that runs it), then calls :func:`main`:

    python <peer>.py versions          # JSON {distribution: version} on stdout
    python <peer>.py fill URL N        # enqueue N no-op jobs, exit
    python <peer>.py worker URL        # see below

``worker`` speaks a line protocol on stdin/stdout with the parent: it prints ``ready`` once the
worker is built and connected, waits for ``go <T0>`` (a wall-clock time; the parent fills the
queue before sending it), starts consuming at T0, and answers each later ``count`` line with
the number of jobs its no-op task ran. Everything else (the peer's own logs) goes to stderr.
Every peer runs on uvloop, as ours and tuned arq do.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from importlib import metadata
from typing import Any

import uvloop

Fill = Callable[[str, int], Awaitable[None]]
Prepare = Callable[[str], Awaitable[Callable[[], Awaitable[Any]]]]


class Tally:
    """Runs of the no-op task in this process."""

    ran = 0


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def _answer_counts() -> None:
    for line in sys.stdin:
        if line.strip() == "count":
            print(Tally.ran, flush=True)


async def _worker(url: str, prepare: Prepare) -> None:
    start = await prepare(url)
    print("ready", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    word, t0 = line.split()
    if word != "go":
        raise SystemExit(f"expected 'go <T0>', got {line!r}")
    threading.Thread(target=_answer_counts, daemon=True).start()
    await asyncio.sleep(max(0.0, float(t0) - time.time()))
    await start()


def main(distributions: list[str], fill: Fill, prepare: Prepare) -> None:
    mode = sys.argv[1]
    if mode == "versions":
        print(json.dumps({d: metadata.version(d) for d in distributions}))
    elif mode == "fill":
        _run(fill(sys.argv[2], int(sys.argv[3])))
    elif mode == "worker":
        _run(_worker(sys.argv[2], prepare))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
