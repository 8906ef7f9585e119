"""Suite sizes and soak sizes of the long multi-process scenarios (no pytest import here:
``bench/soak.py`` reads it too).

The suite runs each such scenario at a short size that still reaches its invariant (and
fails without the behaviour it pins); ``python -m bench soak`` runs the very same tests with
``BENCH_SOAK=1``, i.e. at their original, longer sizes (more ticks, rounds, deletions).
"""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")

#: ``BENCH_SOAK=1`` in the environment: the tests run at their soak (original) sizes.
SOAK = os.environ.get("BENCH_SOAK") == "1"


def size(suite: T, soak: T) -> T:
    """``suite`` in the test suite, ``soak`` under ``python -m bench soak``."""
    return soak if SOAK else suite
