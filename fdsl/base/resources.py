"""Where the grammar and the standard rule library live, installed or in a source checkout.

In a wheel, ``grammar/`` and ``stdlib/`` are installed as the packages ``fdsl.grammar`` and
``fdsl.stdlib``; in a checkout they sit beside the ``fdsl`` package.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent.parent  # the fdsl package (this file is fdsl/base/resources.py)


def _find(name: str) -> Path:
    for candidate in (_HERE / name, _HERE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("fdsl is installed without its %s/ folder" % name)


def grammar_path(file: str) -> Path:
    return _find("grammar") / file


def stdlib_dir() -> Path:
    return _find("stdlib")
