"""The console's JSON: standard JSON a browser parses, whatever a task returned."""

from __future__ import annotations

import json
import math
from typing import Any


def standard_json(value: Any) -> str:
    """``value`` as standard JSON, what a browser parses: a float that is not finite (a task
    that returned ``nan``) becomes ``null``, never ``NaN``."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
