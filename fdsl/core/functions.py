"""Built-in functions of the language: one registry, one entry per function.

Vocabulary
----------
Function   a name callable in programs and the repl (``latex(E)``, ``form(E)``, ``eval(E)``):
           its implementation, how many arguments it takes and a one-line doc for ``:help``.
value      what evaluating an expression gives: a Term, a number (Fraction), a string, a bool,
           a list, or an object with a ``show()`` method (e.g. a numpy result).

Modules add their functions with ``@function(...)`` at import time; ``fdsl.lang.program`` imports
them all. Operators (``m``, ``mm``, ``d``...) and rulesets are callable too, but they live in the
operator table and the rule book, not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Optional

from ..base.errors import FdslError
from . import printers
from .terms import Term, dag_size, eye, ones, tree_size, zero


@dataclass(frozen=True)
class Function:
    name: str
    impl: Callable  # impl(program, *values) -> value
    min_args: int
    max_args: Optional[int]
    doc: str
    signature: str


FUNCTIONS: dict[str, Function] = {}


def function(signature: str, doc: str, min_args: Optional[int] = None, max_args: Optional[int] = -1):
    """Register ``impl(program, *args)`` under the name in ``signature`` (e.g. ``"forms(E, j?)"``)."""
    name, _, rest = signature.partition("(")
    params = [p.strip() for p in rest.rstrip(")").split(",") if p.strip()]
    required = sum(1 for p in params if not p.endswith("?"))

    def register(impl):
        FUNCTIONS[name] = Function(name, impl, required if min_args is None else min_args,
                                   len(params) if max_args == -1 else max_args, doc, signature)
        return impl

    return register


def as_term(value, what="argument") -> Term:
    """A value as a term: numbers become scalar terms; anything else is an error."""
    from .terms import num

    if isinstance(value, Term):
        return value
    if isinstance(value, (int, Fraction)) and not isinstance(value, bool):
        return num(value)
    raise FdslError("%s must be a matrix expression, not %s" % (what, describe(value)))


def as_int(value, what="argument") -> int:
    if isinstance(value, Fraction) and value.denominator == 1:
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, Term) and value.op == "sym" and value.data[0].kind == "dim":
        if isinstance(value.data[0].value, int):
            return value.data[0].value
    raise FdslError("%s must be a whole number, not %s" % (what, describe(value)))


def describe(value) -> str:
    if isinstance(value, Term):
        return "the matrix expression %s" % _cut(printers.text(value))
    if isinstance(value, bool):
        return "a truth value"
    if isinstance(value, (int, Fraction)):
        return "the number %s" % value
    if isinstance(value, str):
        return "the string %s" % _cut(repr(value))
    return "a %s" % type(value).__name__


def _cut(text: str, n: int = 120) -> str:
    """A message keeps to one readable line: long text is cut, with its length said."""
    return text if len(text) <= n else "%s... (%d characters)" % (text[: n - 3], len(text))


def render(value, known=()) -> str:
    """How ``show`` prints a value. A term that refers to named intermediates is followed by their
    bindings (``where X_1 := ...``), except those in ``known`` (the program's own definitions)."""
    if isinstance(value, Term):
        return printers.text_with_bindings(value, known)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Fraction):
        return str(value.numerator) if value.denominator == 1 else str(value)
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "\n".join("[%d] %s" % (i, render(v)) for i, v in enumerate(value))
    if hasattr(value, "show"):
        return value.show()
    return str(value)


# ---- the manual's three manifestations, and LaTeX -----------------------------------------------


class Printed(str):
    """What ``string(E)``, ``latex(E)`` and ``html(E)`` give: the text, which also remembers the term
    it prints (``fdsl serve`` typesets that term rather than showing the text raw)."""

    term: Term


def _printed(text: str, term: Term) -> Printed:
    out = Printed(text)
    out.term = term
    return out


@function("string(E)", "the re-parseable form of E: parse(string(E)) == E")
def _string(program, e):
    t = as_term(e)
    return _printed(printers.string(t), t)


@function("latex(E)", "E as LaTeX math")
def _latex(program, e):
    t = as_term(e)
    return _printed(printers.latex(t), t)


@function("html(E)", "E as an HTML fragment, in the manual's style")
def _html(program, e):
    t = as_term(e)
    return _printed(printers.html(t), t)


@function("text(E)", "E as show prints it")
def _text(program, e):
    return printers.text(as_term(e))


# ---- sizes and shapes -----------------------------------------------------------------------------


@function("nodes(E)", "the number of distinct nodes of E's shared term graph")
def _nodes(program, e):
    return Fraction(dag_size(as_term(e)))


@function("treesize(E)", "the number of nodes E would have written out as a tree")
def _treesize(program, e):
    return Fraction(tree_size(as_term(e)))


@function("shape(E)", "the shape of E, as (rows x cols)")
def _shape(program, e):
    t = as_term(e)
    return "scalar" if t.scalar else "(%s x %s)" % t.shape


@function("eye(n)", "the identity matrix of dim n")
def _eye(program, n):
    return eye(program.dim_arg(n))


@function("zeros(rows, cols)", "the zero matrix of a shape")
def _zeros(program, r, c):
    return zero((program.dim_arg(r), program.dim_arg(c)))


@function("ones(rows, cols)", "the matrix of ones of a shape (ones(n, 1) is a column of ones)")
def _ones(program, r, c):
    return ones((program.dim_arg(r), program.dim_arg(c)))
