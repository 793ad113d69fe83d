"""The shared normal form: reverse-mode differentiation by the stdlib's own rules.

Vocabulary
----------
intermediate  a named term ``X_i := F(X_{i-1})`` (a ``let``); its differential d(X_i) is kept
              as it is by the ruleset ``expandlocal`` (everything ``expandAll`` does but unfold).
adjoint       G_i, the coefficient of d(X_i) once every term holding d(X_i) is collected:
              the form is ``... + trace(G_i d(X_i))``. Named ``G_i := ...`` (``G_N`` for an
              intermediate named N), unless it is as small as its name.
rank          how many intermediates lie beneath a named term (0 for the first one). The
              adjoint of X_i is complete once every intermediate of higher rank that uses X_i
              has been unfolded, so intermediates are unfolded from the highest rank down:
              the reverse (topological) order of backpropagation.

``backprop(w)``: name the intermediates the shared graph has (``fdsl.core.share``: a value used more
than once, ``encoder_3`` or ``E`` when the program gave it that name), expand w with the strategy
``layer`` (stdlib/backprop.rules); weight terms are final; for the pending intermediate of highest rank, name its
adjoint, replace d(X_i) by the
differential of X_i's body, expand that one term with ``layer``, and repeat. Each layer is
expanded once, so the result grows linearly with depth; the rules are the stdlib's, only the
order of application and the collection step are new.

``normal(w)`` is this shared form whenever w has intermediates, named or found, and the fully
multiplied-out ``expanded`` form (stdlib/normal.rules) on a term without any.
"""

from __future__ import annotations

from ..core import terms as T
from ..core.normal import split
from ..core.share import Sharing, found, has_intermediates
from ..core.terms import Term
from .forms import normal_terms, order


def _ranks(sharing: Sharing) -> dict:
    """Number of intermediates beneath each node (looking through let bodies)."""
    rank = {}
    for node in sharing.postorder():
        below = max((rank[c] for c in sharing.children(node)), default=0)
        rank[node] = below + (1 if node.op == "let" else 0)
    return rank


def adjoint_name(name: str) -> str:
    """G for the adjoints of X_i (the usual notation), G_N for an intermediate named N."""
    return "G" if name == "X" else "G_" + name


def _small(g: Term) -> bool:
    # A coefficient no longer than a name (E^t, -E^t, 2 X_3) reads better written out.
    core = T.coefficient(g)[1]
    if core.op == "t":
        core = core.args[0]
    return core.op in ("sym", "let", "num", "eye")


def merged(gs: list) -> Term:
    """The sum of the coefficients ``gs`` with equal summands merged, their numbers added:
    ``-(1/2) E^t - (1/2) E^t`` is ``-E^t``, ``trace(g A) + trace(g A)`` is ``2 trace(g A)``
    (the terms are interned, so equal is identical); in the order they first appear."""
    factors: dict = {}
    for g in gs:
        for s in T.summands(g):
            c, rest = T.coefficient(s)
            factors[rest] = factors.get(rest, 0) + c
    if len(factors) == sum(len(T.summands(g)) for g in gs):
        return T.add(*gs)  # nothing to merge: the sum as it was built
    kept = [rest if c == 1 else T.mul(T.num(c), rest) for rest, c in factors.items() if c != 0]
    return T.add(*kept) if kept else T.zero(gs[0].shape)


def backprop(t: Term, run) -> Term:
    sharing = Sharing(t)
    finals: dict = {}  # weight -> coefficients
    pending: dict = {}  # intermediate -> coefficients
    ranks = _ranks(sharing)

    def absorb(w: Term):
        for x, g in normal_terms(w):
            (pending if x.op == "let" else finals).setdefault(x, []).append(g)

    absorb(run("layer", sharing.term))
    while pending:
        x = max(pending, key=lambda v: ranks[v])  # the last intermediate first
        g = merged(pending.pop(x))
        name, index = x.data
        if not _small(g):
            g = T.let(adjoint_name(name), index, g)
        absorb(run("layer", T.make("trace", (T.mul(g, T.d(sharing.body(x))),))))
    terms = [T.make("trace", (T.mul(merged(gs), T.d(w)),)) for w, gs in finals.items()]
    return order(T.add(*terms))


def normal(t: Term, run) -> Term:
    if found(t)[0] or has_intermediates(t):
        return backprop(t, run)
    w = run("expanded", t)
    pairs, bad = split(w)
    if bad is not None or not pairs:
        return w  # not normal: the caller's check says why
    coefficients: dict = {}
    for x, g in pairs:
        coefficients.setdefault(x, []).append(g)
    if all(len(T.summands(merged(gs))) == sum(len(T.summands(g)) for g in gs) for gs in coefficients.values()):
        return w  # no equal summands: the form as the rules left it
    return order(T.add(*[T.make("trace", (T.mul(merged(gs), T.d(x)),)) for x, gs in coefficients.items()]))
