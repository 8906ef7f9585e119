"""Free TCP ports on 127.0.0.1, from a block of its own per pytest-xdist worker.

``PYTEST_XDIST_WORKER`` (``gw0``, ``gw1``, …) picks the block; outside xdist (a plain pytest
run, a bench) the last block is used. The blocks lie below the kernel's ephemeral range
(32768+) so a port the OS hands out for an outgoing connection or a ``bind(0)`` never lands
in them, and each port is tried (bound and released) before it is handed out. A port is
handed out once per process until the block is used up, so two ports taken one after the
other are never the same even before anything listens on them.
"""

from __future__ import annotations

import os
import random
import socket

BASE = 12_000
BLOCK = 500
BLOCKS = 17  # workers gw0..gw15, then the one for runs outside xdist
#: A cluster node listens on ``port`` and on its bus port ``port + BUS_OFFSET``.
BUS_OFFSET = 10_000

_given: set[int] = set()
_cursor: int | None = None


def worker_index() -> int:
    """``HARNESS_PORT_BLOCK`` when set (a process a test starts, given a block of its own);
    else the xdist worker's number (``gw3`` → 3), ``BLOCKS - 1`` outside xdist."""
    given = os.environ.get("HARNESS_PORT_BLOCK", "")
    if given.isdigit():
        return int(given) % BLOCKS
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    if name.startswith("gw") and name[2:].isdigit():
        return int(name[2:]) % (BLOCKS - 1)
    return BLOCKS - 1


def block() -> range:
    """This process's ports."""
    start = BASE + worker_index() * BLOCK
    return range(start, start + BLOCK)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _candidates() -> list[int]:
    global _cursor
    ports = block()
    if _cursor is None:
        _cursor = random.randrange(len(ports))  # two runs side by side start apart
    order = [ports[(_cursor + i) % len(ports)] for i in range(len(ports))]
    fresh = [p for p in order if p not in _given]
    if not fresh:
        _given.clear()
        fresh = order
    return fresh


def _take(port: int) -> int:
    global _cursor
    _given.add(port)
    _cursor = (port - block().start + 1) % BLOCK
    return port


def free_port() -> int:
    """A port of this worker's block that was free a moment ago."""
    for port in _candidates():
        if _bindable(port):
            return _take(port)
    raise RuntimeError(f"no free port in {block()}")


def free_ports(n: int) -> int:
    """A base port with ``n`` consecutive ports free (``base`` … ``base + n - 1``)."""
    for base in _candidates():
        run = range(base, base + n)
        if run.stop <= block().stop and all(p not in _given and _bindable(p) for p in run):
            for p in run:
                _take(p)
            return base
    raise RuntimeError(f"no {n} consecutive free ports in {block()}")


def free_port_pair(offset: int = BUS_OFFSET) -> int:
    """A free port ``p`` with ``p + offset`` free too (a cluster node and its bus port)."""
    for port in _candidates():
        if _bindable(port) and _bindable(port + offset):
            return _take(port)
    raise RuntimeError(f"no free port pair in {block()}")
