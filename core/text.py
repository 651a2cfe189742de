"""Which characters a stored string may hold.

PostgreSQL's text columns refuse NUL, UTF-8 cannot encode a lone surrogate (which JSON
may spell as ``\\ud800``), and no other control character belongs in a name, an id, a
URL or a model's prompt: each would fail deep in a driver or a receiver as a server
error, so every field that is stored is checked at its schema instead. Prose (a speech
input, a prompt, a metadata value) keeps tab, line feed and carriage return.
"""

from __future__ import annotations

import re

# C0 controls, DEL, the C1 range and the surrogate block; prose allows \t \n \r
_IN_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_IN_PROSE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def refused_character(value: str, *, prose: bool = False) -> str | None:
    """Why ``value`` may not be stored (naming the first bad character), or None."""
    found = (_IN_PROSE if prose else _IN_LINE).search(value)
    if found is None:
        return None
    point = ord(found.group())
    kind = "a lone surrogate" if 0xD800 <= point <= 0xDFFF else "a control character"
    return f"must not contain {kind} (U+{point:04X} at position {found.start()})"


def check_text(value: str, *, prose: bool = False) -> str:
    """``value`` unchanged, or ValueError saying which character is refused."""
    reason = refused_character(value, prose=prose)
    if reason is not None:
        raise ValueError(reason)
    return value


def printable(text: str) -> str:
    """``text`` with anything UTF-8 cannot encode escaped, so an error that quotes a
    caller's value can always be written."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
