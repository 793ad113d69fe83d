"""How the house is assembled without the floors below knowing the floors above.

The language's tables (functions, statements) are filled by modules on several floors: the
calculus adds ``expandAll``, the backends ``eval`` and ``values``, learning ``train`` and ``flow``.
One module, the composition root ``fdsl.compose``, imports them all. It sits at the top, so a
lower floor cannot import it; instead ``fdsl/__init__.py`` (which Python runs before any module of
the package) hands it to ``set_assembler`` here, and ``Program`` calls ``assemble()`` before it
reads a program. ``import fdsl`` itself stays light: nothing is assembled until a program is.
"""

from __future__ import annotations

from typing import Callable, Optional

_assembler: Optional[Callable[[], None]] = None
_done = False


def set_assembler(assemble: Callable[[], None]) -> None:
    """Called once, by ``fdsl/__init__.py``, with the composition root's ``assemble``."""
    global _assembler
    _assembler = assemble


def assemble() -> None:
    """Import every module that adds a function, statement or strategy (once per process)."""
    global _done
    if not _done and _assembler is not None:
        _assembler()
        _done = True
