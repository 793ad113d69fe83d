"""fdsl: a term-rewriting language for matrices of differential forms.

The system of the GPT Utility Manual: write a transformer as a few matrix equations, pull back
the Euler form ``form(E) = -trace(E^t d(E))``, and rewrite it with declarative rules
(``stdlib/*.rules``) into a normal form ``sum_W trace(G_W d(W))``: the gradient of every weight
in closed form, as a word one can read, query, draw and evaluate.

    >>> import fdsl
    >>> p = fdsl.parse("dim n\\nconst A : n x n\\nweight W : n x n\\nE = A W")
    >>> print(p["E"])
    A W

Modules, in pipeline order: ``parse`` (grammar/*.lark), ``program`` (elaboration and shapes),
``terms`` (hash-consed terms), ``ops`` (the operator table), ``rules``/``rewrite`` (rule files
and the engine), ``forms`` (the manual's verbs), ``printers``, ``backends`` (numpy, graphviz),
``cli`` and ``repl``; ``api`` is the Python side (operators on terms, ``d``, ``trace``, ``form``,
``diagram``).
"""

from .api import a, aa, d, deps, diagram, form, m, mm, trace
from .errors import FdslError
from .program import Program, load, parse
from .terms import Term

__all__ = ["FdslError", "Program", "Term", "load", "parse", "d", "trace", "form", "m", "a", "mm", "aa",
           "diagram", "deps"]
__version__ = "0.1.0"
