"""What an operator action did (:class:`~worker.ops.actions.Operations`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """What an action did: ``ok`` is false when it was refused or did nothing it was asked
    to; ``message`` is one line for a person; ``details`` holds counts and ids."""

    action: str
    target: str
    ok: bool
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
