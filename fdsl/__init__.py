"""fdsl: a term-rewriting language for matrices of differential forms.

The system of the GPT Utility Manual: write a transformer as a few matrix equations, pull back
the Euler form ``form(E) = -trace(E^t d(E))``, and rewrite it with declarative rules
(``stdlib/*.rules``) into a normal form ``sum_W trace(G_W d(W))``: the gradient of every weight
in closed form, as a word one can read, query, draw and evaluate.

    >>> import fdsl
    >>> p = fdsl.parse("dim n\\nconst A : n x n\\nweight W : n x n\\nE = A W")
    >>> print(p["E"])
    A W

The house, floor by floor from the ground (a module imports only its own folder or floors below):
``base`` (errors, numbers, untrusted inputs, safe files, limits), ``core`` (the operator table,
hash-consed terms, sharing, printers, reading a normal form), ``rewrite`` (patterns and the engine)
beside ``calculus`` (the manual's verbs, backprop, the symbolic gradients), ``lang`` (grammar,
elaboration, rule files, statements, programs), ``numbers`` (numpy evaluation, values) beside
``pictures`` (Graphviz), ``codegen`` (the statement IR, its passes and writers, numpy and torch),
``learn`` (metrics, flows, training), ``verify`` (rules --check, the torch oracle, differential
checks, the fuzzer), and the faces: ``cli``, ``repl``, ``api`` and the composition root ``compose``.

The names below are loaded when first used, so ``import fdsl`` (and ``fdsl --version``) stay light.
"""

from .base import assembly as _assembly

__version__ = "0.1.0"

__all__ = ["FdslError", "Program", "Term", "load", "parse", "d", "trace", "form", "m", "a", "mm", "aa",
           "diagram", "deps"]


def _assemble() -> None:
    from . import compose

    compose.assemble()


_assembly.set_assembler(_assemble)


def __getattr__(name: str):
    """The public names, imported on first use (PEP 562)."""
    if name == "FdslError":
        from .base import errors as home
    elif name == "Term":
        from .core import terms as home
    elif name in __all__:
        from . import api as home
    else:
        raise AttributeError("module 'fdsl' has no attribute %r" % name)
    value = globals()[name] = getattr(home, name)
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
