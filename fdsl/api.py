"""The Python side of the language, for scripts and notebooks.

Vocabulary
----------
composing    terms combine with Python operators as in the language (``A + B``, ``A - B``,
             ``A @ B`` for the product ``A B``, ``A * B`` Hadamard, ``A / s``, ``A.T``), and with
             the functions here (``d``, ``trace``, ``form``, ``m``, ``a``, ``mm``, ``aa``), with
             the same shape checks and messages: a mismatch is an ``FdslError``.
picture      ``diagram(E)`` (also ``E.diagram()``) and ``deps(w, V, W)`` return a
             ``fdsl.pictures.graphviz.Diagram``: inline SVG in a notebook, ``.save("f.png")``.

    >>> import fdsl
    >>> p = fdsl.parse("dim n = 2\\nconst X : n x n\\nweight W : n x n")
    >>> X, W = p["X"], p["W"]
    >>> print(fdsl.trace((X @ W).T @ fdsl.d(X @ W)))
    trace((X W)^t d(X W))
"""

from __future__ import annotations

from .core import terms as T
from .core.functions import as_term
from .core.terms import Term, _checked
from .lang.program import Program, load, parse  # noqa: F401  (fdsl.load, fdsl.parse)


def _op(name: str, *args) -> Term:
    return _checked(T.make, name, [as_term(a, "an argument of %s" % name) for a in args])


def d(x) -> Term:
    """The differential ``d(x)``."""
    return _op("d", x)


def trace(x) -> Term:
    """``trace(x)`` of a square matrix."""
    return _op("trace", x)


def m(x) -> Term:
    """relu, entrywise."""
    return _op("m", x)


def a(x) -> Term:
    """Row-wise softmax."""
    return _op("a", x)


def mm(x, y) -> Term:
    """``[x > 0] o y``: the derivative of relu at x applied to y."""
    return _op("mm", x, y)


def aa(x, y) -> Term:
    """The softmax Jacobian at x applied to y."""
    return _op("aa", x, y)


def form(e) -> Term:
    """The pulled-back Euler form ``-trace(E^t d(E))``."""
    from .calculus.forms import form as _form

    e = as_term(e, "E")
    return _checked(_form, e)


def diagram(value, expand="auto", split_leaves: bool = False, title=None, max_nodes=None, max_edges=None):
    """The picture of a term (inline in a notebook; ``.save("e.svg")``). Named intermediates are
    boxes unless the whole picture is small; ``expand=["X_5"]`` or ``"all"`` draws definitions."""
    from .pictures.graphviz import notebook_diagram

    return notebook_diagram(value, expand=expand, split_leaves=split_leaves, title=title, max_nodes=max_nodes,
                            max_edges=max_edges)


def deps(w, weight, of):
    """The picture of "does the coefficient of d(of) in the normal form w involve weight?"."""
    from .pictures.graphviz import notebook_deps

    return notebook_deps(w, weight, of)
