"""Reading a normal form, without printing it: what the printers and every floor above ask.

Vocabulary
----------
normal form  ``sum_W trace(G_W d(W))``: each summand a trace whose word ends in its only
             differential, ``c trace(G d(X))``, or ``G d(g)`` for a scalar g.
pairs        the (X, G) of its summands: X under the differential, G the word before it (``c I``
             when that word is only scalars). X is a weight, or a named intermediate in the steps
             of ``backprop``.
weight       a symbol declared ``weight``: ``is_weight`` is the one test of it.

The messages that say why a term is not a normal form print terms, so they live a floor up, in
``fdsl.calculus.forms`` (``normal_terms``, ``check_normal``, ``why_not_normal``); this module
only reads, so that the printers, which lay a normal form out one weight a line, stand on it.
"""

from __future__ import annotations

from . import terms as T
from .ops import OPS
from .terms import Term


def is_weight(x: Term) -> bool:
    """Whether ``x`` is a weight symbol (``weight W``, ``weight Q[i]``'s members)."""
    return x.op == "sym" and x.data[0].kind == "weight"


def differentials(t: Term) -> list:
    """The distinct terms X of the differentials d(X) under ``t``, in first-seen order."""
    return [n.args[0] for n in T.postorder(t, descend=lambda n: n.op != "let") if OPS[n.op].differential]


def split(w: Term):
    """``(pairs, None)`` for a normal form; ``(None, (summand, ends))`` at its first summand that is
    not one: ``ends`` says whether it is a trace (whose word does not end in its only
    differential)."""
    pairs = []
    for s in T.summands(w):
        c, rest = T.coefficient(s)
        scalar_d = T.factors(rest)[-1]
        if scalar_d.op == "d" and scalar_d.scalar and not any(f.has_d for f in T.factors(rest)[:-1]):
            pairs.append((scalar_d.args[0], T.mul(T.num(c), *T.factors(rest)[:-1])))  # G d(g), g a scalar
            continue
        if rest.op != "trace":
            return None, (s, False)
        word = T.factors(rest.args[0])
        last = word[-1]
        if last.op != "d" or any(f.has_d for f in word[:-1]):
            return None, (s, True)
        # the word before d(X) stands for a matrix: when it is only scalars (trace(c d(X)),
        # trace(s d(X))), for c I. The identity is dropped again beside a matrix factor.
        g = T.mul(T.num(c), *word[:-1], T.eye(last.shape[0]))
        pairs.append((last.args[0], g))
    return pairs, None


def pairs(w: Term):
    """The (X, G) pairs of a normal form, or None if ``w`` is not one."""
    return split(w)[0]


def is_normal_form(w: Term) -> bool:
    """A normal form over weights: every summand ``trace(G d(W))`` with W a weight (0 is one)."""
    found = pairs(w)
    return found is not None and all(is_weight(x) for x, _ in found)
