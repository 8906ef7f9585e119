"""Every duty kind the operator side knows, in the order ``status`` shows them.

A new kind of duty declares a :class:`worker.core.dutykinds.Kind` in its own module and is
listed here: the cluster snapshot, ``status``, the doctor, ``pause``/``resume``/``trigger``
(CLI, actions and console) then read, show, judge and act on it without naming it. They read
this list when they run (``kinds.KINDS``), not when they are imported.
"""

from __future__ import annotations

from worker.core.dutykinds import Kind
from worker.duties import keyed, outbox_kind, periodic_kind
from worker.duties.initializer import KIND as INITIALIZERS
from worker.duties.poller import KIND as POLLERS

KINDS: tuple[Kind, ...] = (
    periodic_kind.KIND, POLLERS, INITIALIZERS, keyed.KIND, outbox_kind.KIND,
)  # fmt: skip


def pausable() -> tuple[Kind, ...]:
    """The kinds an operator pauses and resumes by name (``<kind>:<name>``)."""
    return tuple(k for k in KINDS if k.pausable)


def triggerable() -> tuple[Kind, ...]:
    """The kinds an operator runs one of now (``trigger``)."""
    return tuple(k for k in KINDS if k.trigger is not None)


def each(some: tuple[Kind, ...]) -> str:
    """``some`` named one by one for a sentence: ``"a periodic job, a poller"``."""
    return ", ".join(f"a {k.noun}" for k in some)
