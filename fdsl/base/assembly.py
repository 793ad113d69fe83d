"""How the house is assembled without the floors below knowing the floors above.

The language's tables (functions, statements) are filled by modules on several floors: the
calculus adds ``expandAll``, the backends ``eval`` and ``values``, learning ``train`` and ``flow``.
One module, the composition root ``fdsl.compose``, imports them all. It sits at the top, so a
lower floor cannot import it; instead ``fdsl/__init__.py`` (which Python runs before any module of
the package) hands it to ``set_assembler`` here, and ``Program`` calls ``assemble()`` before it
reads a program. ``import fdsl`` itself stays light: nothing is assembled until a program is.

The pictures come down the same way. ``Term.diagram``, ``Program.diagram`` and ``Program.deps``
(the notebook's conveniences, on floors below ``fdsl.pictures``) ask ``picture("diagram")`` or
``picture("deps")`` here; the composition root fills that registry with ``set_pictures`` as it
assembles, so no floor imports the pictures above it.

The rule checker comes down the same way: ``RuleBook.load`` (``fdsl.lang``) checks a user's rule
file numerically with ``fdsl.verify.check``, a floor above it, through ``rule_checker()``.
"""

from __future__ import annotations

from typing import Callable, Optional

from .errors import FdslError

_assembler: Optional[Callable[[], None]] = None
_done = False
_pictures: dict[str, Callable] = {}
_rule_checker: Optional[Callable] = None


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


def set_pictures(**pictures: Callable) -> None:
    """Called by the composition root as it assembles: ``diagram`` (the picture of a term) and
    ``deps`` (the dependency view of a normal form), as ``fdsl.diagram`` and ``fdsl.deps`` take them."""
    _pictures.update(pictures)


def picture(name: str) -> Callable:
    """The picture function ``name`` the composition root handed down (assembling first)."""
    assemble()
    draw = _pictures.get(name)
    if draw is None:
        raise FdslError("%s() is unavailable: this fdsl has no pictures (fdsl.pictures, which the composition "
                        "root fdsl.compose hands down when it assembles the language)" % name)
    return draw


def set_rule_checker(check: Callable) -> None:
    """Called by the composition root as it assembles: ``check(rules, key)`` holds a user's newly
    loaded rules numerically (``fdsl.verify.check.check_loaded``)."""
    global _rule_checker
    _rule_checker = check


def rule_checker() -> Optional[Callable]:
    """The checker the composition root handed down (assembling first), or None without one."""
    assemble()
    return _rule_checker
