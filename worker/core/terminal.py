"""Text for a terminal: what the command line prints never carries control characters.

Stored text (an exception message in a dead letter, an instance name, a periodic job's last
error) reaches ``status``, ``dead``, ``doctor`` and the other commands' output; written raw, an
escape sequence in it could retitle the terminal, clear it, move the cursor over other lines
or (OSC 52) write the clipboard. :func:`safe` shows every control character as a visible
escape (``\\x1b``, ``\\u202e``) instead; line breaks and tabs of the text itself stay.
"""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO

# C0 and C1 controls and DEL (but \t and \n), bidirectional overrides and isolates (text that
# reads differently from what it is), and the Unicode line/paragraph separators.
_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2028\u2029\u2066-\u2069]"
)
_CONTROL_LINE = re.compile(_CONTROL.pattern[:-1] + "\t\n]")


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: str, *, one_line: bool = False) -> str:
    """``text`` with its control characters escaped (``one_line``: tabs and newlines too)."""
    return (_CONTROL_LINE if one_line else _CONTROL).sub(_escape, text)


def say(*values: Any, file: TextIO | None = None, sep: str = " ", flush: bool = False) -> None:
    """:func:`print`, with :func:`safe` text."""
    text = sep.join(str(v) for v in values)
    print(safe(text), file=file if file is not None else sys.stdout, flush=flush)
