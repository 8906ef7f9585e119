"""Workflows as values: :class:`Job` steps composed with :func:`chain`, :func:`group`,
:func:`chord` or a :class:`Workflow` (a DAG), compiled into :class:`Step` rows; no I/O.

A step's task receives what the steps it depends on returned as its first argument after
``ctx``: the one parent's result, or a list in the order of ``after`` (a group's members in
group order) when the step has several parents or follows a group. Starting, advancing and
cancelling one is the store's part (:mod:`worker.storage.workflows`); the consumer's part is
:class:`worker.duties.workflows.WorkflowHook`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

#: What the rest of a workflow does when a step fails for good: ``fail`` (no further step
#: starts, the workflow fails) or ``continue`` (its dependents run, given ``None`` for it).
OnFailure = Literal["fail", "continue"]
#: A workflow's state, and a step's.
WorkflowState = Literal["running", "done", "failed", "cancelled"]
StepState = Literal["pending", "queued", "running", "done", "failed", "cancelled"]


class Job:
    """One step of a workflow: ``function(*args, **kwargs)``, given its parents' results
    first. ``Job("resize", 7)`` as a step; also :meth:`Client.enqueue_many`'s
    ``on_complete``."""

    __slots__ = ("args", "function", "kwargs")

    def __init__(self, function: str, *args: Any, **kwargs: Any) -> None:
        if not isinstance(function, str) or not function:
            raise TypeError(f"Job takes a task name first, not {function!r}")
        self.function = function
        self.args = args
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"Job({self.function!r}, *{self.args!r}, **{self.kwargs!r})"


@dataclass(frozen=True)
class Group:
    """Jobs that run side by side; what follows a group gets their results as a list."""

    members: tuple[Any, ...]  # Job, Group, Chain, Workflow


@dataclass(frozen=True)
class Chain:
    """Flows one after another, each given what the one before it returned."""

    links: tuple[Any, ...]  # Job, Group, Chain, Workflow


def group(*jobs: Any) -> Group:
    """``group(Job(...), Job(...))`` or ``group(Job(...) for ...)``: members in that order."""
    members = tuple(jobs[0]) if len(jobs) == 1 and not _is_flow(jobs[0]) else jobs
    if not members:
        raise ValueError("a group needs at least one member")
    return Group(tuple(_flow(m) for m in members))


def chain(*links: Any) -> Chain:
    """``chain(a, b, c)``: ``b`` gets ``a``'s result, ``c`` gets ``b``'s."""
    if not links:
        raise ValueError("a chain needs at least one link")
    return Chain(tuple(_flow(link) for link in links))


def chord(header: Group | Iterable[Job], callback: Job) -> Chain:
    """``chord(group(...), Job("collect"))``: the callback gets every member's result, as a
    list in group order, once all of them are done."""
    return Chain((header if isinstance(header, Group) else group(header), callback))


@dataclass(frozen=True)
class Step:
    """One compiled step: its job, its parents (step indexes, in argument order), and whether
    it takes their results as a list (``many``) or the one parent's result alone."""

    job: Job
    parents: tuple[int, ...]
    many: bool
    #: it gets ``{"done": n, "failed": m}`` of its parents instead of their results (a batch's
    #: completion callback)
    counts: bool = False


@dataclass
class Workflow:
    """A DAG of steps: ``a = wf.add(Job("extract")); wf.add(Job("clean"), after=[a])``.

    ``on_failure``: see :data:`OnFailure`."""

    on_failure: OnFailure = "fail"
    steps: list[Step] = field(default_factory=list)

    def add(self, job: Job, after: Sequence[int] = ()) -> int:
        """Add ``job`` to run once every step of ``after`` is done; its index."""
        if not isinstance(job, Job):
            raise TypeError(f"Workflow.add takes a Job, not {job!r}")
        parents = tuple(after)
        for p in parents:
            if not isinstance(p, int) or not 0 <= p < len(self.steps):
                raise ValueError(f"after: {p!r} is not a step of this workflow")
        if len(set(parents)) != len(parents):
            raise ValueError("after: a step is named twice")
        self.steps.append(Step(job, parents, len(parents) > 1))
        return len(self.steps) - 1


def _is_flow(value: Any) -> bool:
    return isinstance(value, Job | Group | Chain | Workflow)


def _flow(value: Any) -> Any:
    if not _is_flow(value):
        raise TypeError(f"a workflow is made of Job, group, chain, chord: not {value!r}")
    return value


def _place(
    wf: Workflow, flow: Any, after: tuple[int, ...], many: bool
) -> tuple[tuple[int, ...], bool]:
    """Add ``flow`` to ``wf`` after ``after``; the steps it ends with and whether what follows
    takes their results as a list."""
    if isinstance(flow, Job):
        wf.steps.append(Step(flow, after, many))
        return (len(wf.steps) - 1,), False
    if isinstance(flow, Group):
        ends: list[int] = []
        for member in flow.members:
            tail, _ = _place(wf, member, after, many)
            ends += tail
        return tuple(ends), True
    if isinstance(flow, Chain):
        tails, lst = after, many
        for link in flow.links:
            tails, lst = _place(wf, link, tails, lst)
        return tails, lst
    base = len(wf.steps)  # a Workflow inside another: its roots follow ``after``
    for s in flow.steps:
        shifted = tuple(p + base for p in s.parents)
        wf.steps.append(Step(s.job, shifted or after, s.many if shifted else many))
    children = {p for s in flow.steps for p in s.parents}
    return tuple(base + i for i in range(len(flow.steps)) if i not in children), True


def compile_flow(flow: Any, on_failure: OnFailure | None = None) -> Workflow:
    """``flow`` (a :class:`Job`, a group, a chain, a chord or a :class:`Workflow`) as one
    :class:`Workflow` whose steps are in an order where every parent precedes its children."""
    policy = on_failure or (flow.on_failure if isinstance(flow, Workflow) else "fail")
    if policy not in ("fail", "continue"):
        raise ValueError(f"on_failure: 'fail' or 'continue', not {policy!r}")
    if isinstance(flow, Workflow):
        if not flow.steps:
            raise ValueError("the workflow has no steps")
        return Workflow(policy, list(flow.steps))
    wf = Workflow(policy)
    _place(wf, _flow(flow), (), False)
    return wf


def batch(specs: Sequence[Any], on_complete: Job) -> Workflow:
    """``enqueue_many(specs, on_complete=...)`` as a workflow: every spec a step (``continue``
    on failure), then ``on_complete`` given the counts once every member ended."""
    if not isinstance(on_complete, Job):
        raise TypeError(f"on_complete takes a Job, not {on_complete!r}")
    if not specs:
        raise ValueError("on_complete needs at least one job")
    wf = Workflow("continue")
    for s in specs:
        options = (s.unique_key, s.job_id, s.defer_until, s.queue, s.shard_key)
        if any(o is not None for o in options) or s.defer_by:
            raise ValueError(f"{s.function}: a batch with on_complete takes no per-job options")
        wf.steps.append(Step(Job(s.function, *s.args, **s.kwargs), (), False))
    wf.steps.append(Step(on_complete, tuple(range(len(specs))), False, counts=True))
    return wf


def children_of(steps: Sequence[Step]) -> list[list[int]]:
    """Each step's children, in step order."""
    out: list[list[int]] = [[] for _ in steps]
    for i, s in enumerate(steps):
        for p in s.parents:
            out[p].append(i)
    return out


def parents_value(step_many: bool, results: Sequence[Any]) -> Any:
    """What a step gets from its parents: the one result, or the list of them."""
    return list(results) if step_many else results[0]


# -- step job ids: <prefix>wf:<workflow id>:<step> -------------------------------------------
def step_job_id(prefix: str, workflow_id: str, step: int) -> str:
    return f"{prefix}wf:{workflow_id}:{step}"


def parse_step(prefix: str, job_id: str) -> tuple[str, int] | None:
    """``(workflow id, step)`` of a step's job id, ``None`` for any other id."""
    head = prefix + "wf:"
    if not job_id.startswith(head):
        return None
    wid, sep, step = job_id[len(head) :].rpartition(":")
    if not sep or not wid or not step.isdigit():
        return None
    return wid, int(step)


@dataclass(frozen=True)
class Ready:
    """A step that may start: what its job is made of."""

    index: int
    function: str
    queue: str
    many: bool
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    parents: list[Any]  # each parent's result (None for a failed one), in argument order


@dataclass(frozen=True)
class StepInfo:
    """One step as :meth:`Client.workflow` reads it."""

    index: int
    function: str
    state: StepState
    job_id: str
    parents: tuple[int, ...]
    result: Any = None
    error: str | None = None


@dataclass(frozen=True)
class WorkflowInfo:
    """A workflow's state and its steps'."""

    id: str
    state: WorkflowState
    on_failure: OnFailure
    created_ms: int
    steps: tuple[StepInfo, ...]

    def results(self) -> list[Any]:
        """Every step's result, in step order (``None`` where it has none)."""
        return [s.result for s in self.steps]

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "on_failure": self.on_failure,
            "created_ms": self.created_ms,
            "steps": [
                {
                    "index": s.index,
                    "function": s.function,
                    "state": s.state,
                    "job_id": s.job_id,
                    "parents": list(s.parents),
                    "result": s.result,
                    "error": s.error,
                }
                for s in self.steps
            ],
        }
