"""Tests marked ``xdist_group(name)`` run on one pytest-xdist worker, one after the other.

pytest-xdist (3.8) tells ``--dist loadgroup`` which tests belong together by appending
``@<name>`` to each marked test's node id, written to ``item._nodeid``; pytest 9.2 keeps a node
id in ``item._id`` and no longer reads ``_nodeid``, so the suffix was lost and every grouped
test went to any worker (the bench smoke tests ran on two workers at once, each starting every
bench). :func:`mark` writes the suffix where the running pytest reads it, and fails the
collection if the node id still lacks it (a later pytest moving it again is caught at once,
not by a slow, overloaded run). Used by ``tests/conftest.py`` on the workers.
"""

from __future__ import annotations

from typing import Any


def group_of(item: Any) -> str | None:
    """``a_b`` for a test marked ``xdist_group("a")`` and ``xdist_group("b")``; ``None``."""
    names = {
        str(m.args[0] if m.args else m.kwargs.get("name", "default"))
        for m in item.iter_markers("xdist_group")
    }
    return "_".join(sorted(names)) or None


def mark(item: Any) -> None:
    """Give a grouped test the ``@<group>`` node id suffix the loadgroup scheduler reads."""
    group = group_of(item)
    if group is None or item.nodeid.endswith(f"@{group}"):
        return  # not grouped, or pytest-xdist's own suffix held
    wanted = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):  # pytest 9.2+: the node id is a NodeId
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(wanted)
    else:
        item._nodeid = wanted
    if item.nodeid != wanted:
        raise RuntimeError(
            f"{item.nodeid}: cannot put it in its xdist group {group!r} (this pytest keeps a "
            "node id where harness/xdist_group.py does not write): it would run beside its group"
        )
