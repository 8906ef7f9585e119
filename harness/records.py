"""Reading what the spawned processes' apps wrote."""

from __future__ import annotations

from typing import Any


def ledger(r: Any, prefix: str, name: str) -> dict[str, int]:
    """``harness.apps.ledger``'s counts (the hash ``{prefix}ledger:{name}``): job id or item
    -> runs, on a synchronous client."""
    return {k.decode(): int(v) for k, v in r.hgetall(f"{prefix}ledger:{name}").items()}
