"""Find the text, sections and fenced blocks of README.md and the docs site's pages (docs/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def page(name: str) -> str:
    """The text of ``README.md`` or of a docs page (``"guarantees"`` is docs/guarantees.md)."""
    path = ROOT / name if name == "README.md" else DOCS / f"{name.removesuffix('.md')}.md"
    return path.read_text()


def section(name: str, heading: str) -> str:
    """The section of page ``name`` under the heading ``heading`` (any level, e.g. ``## X``),
    up to the next heading of the same or a higher level (``#`` lines inside fenced blocks are
    code, not headings); ``KeyError`` if there is none."""
    lines = page(name).splitlines(keepends=True)
    fenced, start, level = False, -1, 0
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"(#+) (.*)\n", line)
        if match is None:
            continue
        if start < 0 and match.group(2) == heading:
            start, level = i, len(match.group(1))
        elif start >= 0 and len(match.group(1)) <= level:
            return "".join(lines[start:i])
    if start < 0:
        raise KeyError(f"{name}: no heading {heading!r}")
    return "".join(lines[start:])


def python_blocks(text: str) -> list[str]:
    """The ```python fenced blocks of ``text``, in order (their code, without the fences)."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def python_block(name: str, heading: str, index: int = 0) -> str:
    """The ``index``-th Python block of the section ``heading`` of page ``name``."""
    blocks = python_blocks(section(name, heading))
    if len(blocks) <= index:
        raise KeyError(f"{name}, {heading!r}: no Python block {index}")
    return blocks[index]
