"""``bench/consumer.py --profile``: the consumer under ``cProfile`` for the timed drain only.

The worker runs as ``python bench/_profile.py OUT -m worker run ...``: a ``cProfile`` profiler
on its default timer (``time.perf_counter``: a CPU timer costs a system call per event, which
swamped a no-op job's own time) is switched on by
``SIGUSR1`` (sent just before the jobs are due) and off by ``SIGUSR2`` (sent once the queue is
empty), which writes the stats to ``OUT``. :func:`python_us` reads them: the time spent inside
Python functions and the C functions they call, per job — everything but the event loop's own C
(uvloop's ``run_forever``: its polling, idle waits and callbacks' dispatch). Profiling adds its
own cost to every call, and on a loaded box the time includes the moments the process was
descheduled inside Python: the figure is an upper bound of the unprofiled run's Python CPU.
"""

from __future__ import annotations

import cProfile
import pstats
import runpy
import signal
import sys
from pathlib import Path
from typing import Any

#: entries whose own time is the event loop's C, not Python's (nor called by Python per job)
LOOP = ("run_forever", "run_until_complete")


def main() -> None:
    out, module, argv = sys.argv[1], sys.argv[3], sys.argv[3:]
    prof = cProfile.Profile()

    def on(*_: Any) -> None:
        prof.enable()

    def off(*_: Any) -> None:
        prof.disable()
        prof.dump_stats(out)

    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)
    sys.argv = argv
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def python_us(path: Path, n: int, top: int = 15) -> tuple[float, float, list[str]]:
    """(µs per job in Python functions' own code, µs per job in the C functions they call,
    the ``top`` entries by own time) from the stats at ``path``."""
    read: Any = pstats.Stats(str(path))
    stats = read.stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    py = c = 0.0
    rows = []
    for (file, line, name), (_, calls, tt, _ct, _) in stats.items():
        if file == "~" and any(k in name for k in LOOP):
            continue
        if file == "~":
            c += tt
        else:
            py += tt
        where = name if file == "~" else f"{Path(file).name}:{line}({name})"
        rows.append((tt, f"{tt / n * 1e6:6.2f} us/job {calls / n:6.2f} calls/job  {where}"))
    rows.sort(reverse=True)
    return py / n * 1e6, c / n * 1e6, [r for _, r in rows[:top]]


if __name__ == "__main__":
    main()
