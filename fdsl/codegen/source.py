"""Writing Python source that fdsl generates: text from a program only ever enters it escaped.

docstring   the generated module's docstring names the program's file; ``docstring_literal``
            writes any text (backslashes, quotes, control characters) as a valid literal.
natural     the sort key that puts ``Q_2`` before ``Q_10`` in generated code and its results.
indent      a block of statements moved one level in, for a function body.
"""

from __future__ import annotations

import re


def _natural(s: str) -> tuple:
    """A sort key that puts Q_2 before Q_10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", s))


def _indent(block: str) -> str:
    return "\n".join(("    " + line).rstrip() for line in block.split("\n"))


def docstring_literal(text: str) -> str:
    """``text`` as a Python docstring literal, whatever it holds: the docstring names the program's
    file, and a path may contain a backslash (a backslash-x would start an escape), quotes or control
    characters, so each of those is escaped rather than pasted."""
    out = []
    for ch in text:
        if ch in ('\\', '"'):
            out.append("\\" + ch)
        elif ch == "\n" or ch.isprintable():
            out.append(ch)
        else:
            out.append(ascii(ch)[1:-1])  # a NUL byte as backslash-x00
    return '"""%s"""' % "".join(out)
