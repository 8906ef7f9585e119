"""Recorded test durations, so a parallel run starts the longest tests first.

``tests/durations.json`` maps a test (its file name and test id, without the folder, so a
test keeps its figure when its file moves: ``test_x.py::test_y[a]``) to its seconds (setup +
call + teardown) in a full run. Refresh it from a run's ``--durations`` report::

    python -m pytest --durations=0 -q | python -m harness.durations > tests/durations.json

A test not in the file counts :data:`SLOW_DEFAULT_S` if marked ``slow``, else 0.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

#: what a ``slow`` test missing from the file is assumed to take
SLOW_DEFAULT_S = 10.0
#: below this a test is left out of the file (its order does not matter)
KEEP_OVER_S = 1.0
#: ``12.34s call     tests/test_x.py::test_y[a]``
_LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s+(setup|call|teardown)\s+(\S.*?)\s*$")


def key(nodeid: str) -> str:
    """``tests/core/test_x.py::test_y[a]`` -> ``test_x.py::test_y[a]``."""
    path, sep, rest = nodeid.partition("::")
    if "@" in rest and rest.rfind("@") > rest.rfind("]"):
        rest = rest[: rest.rfind("@")]  # an xdist group's suffix (harness/xdist_group.py)
    return path.rsplit("/", 1)[-1] + sep + rest


def parse_report(lines: Iterable[str]) -> dict[str, float]:
    """Seconds per test from pytest's ``--durations`` lines (phases added up), longest first."""
    out: dict[str, float] = defaultdict(float)
    for line in lines:
        m = _LINE.match(line)
        if m:
            out[key(m.group(3))] += float(m.group(1))
    kept = {k: round(v, 1) for k, v in out.items() if v >= KEEP_OVER_S}
    return dict(sorted(kept.items(), key=lambda kv: -kv[1]))


def load(path: Path) -> dict[str, float]:
    """The recorded durations (empty when the file is missing or unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


if __name__ == "__main__":
    json.dump(parse_report(sys.stdin), sys.stdout, indent=0)
    sys.stdout.write("\n")
