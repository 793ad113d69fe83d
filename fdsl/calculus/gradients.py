"""The symbolic side of gradients: from a normal form to what a backend computes.

Vocabulary
----------
coefficients  weight -> G_W, the sum of the coefficients of its summands ``trace(G d(W))`` in a
              normal form, in weight order (name, then index).
gradient      ``G_W^t``, shaped like W (the dual under the Euclidean metric, by the duality
              contract ``grad(w, W) = G_W^t``); ``gradient_terms`` keys them by printed name.
error         E, when the 1-form is ``form(E) = -trace(E^t d(E))``: then ``L = 1/2 ||E||^2`` is the
              loss whose descent direction the gradients are (``error_of``).
loss          the scalar L whose descent direction the 1-form is, when fdsl can name it
              (``loss_of``): ``form(E)`` is ``-d(1/2 ||E||^2)``, given as E itself (a matrix: the
              code computes ``1/2 ||E||^2`` directly), and ``-d(L)`` for a scalar term L (a
              cross-entropy ``-trace(Y^t logsoftmax(Z))``, any scalar) is given as L. Any other
              1-form (one already normalised, a sum of forms) has no loss fdsl can name.
"""

from __future__ import annotations

from typing import Optional

from ..base.errors import FdslError
from ..core import terms as T
from ..core.normal import is_weight
from ..core.printers import short
from ..core.terms import Term
from .forms import form, normal_terms


def coefficients(w: Term, what: str = "the form") -> dict:
    """Weight term -> its coefficient G_W in the normal form ``w`` (summed over its summands), in
    weight order; an error naming ``what`` if a differential is not of a weight."""
    out: dict = {}
    for x, g in normal_terms(w):
        if not is_weight(x):
            raise FdslError("%s has a differential d(%s) of something that is not a weight, so it "
                            "has no gradient there" % (what, short(x)))
        out.setdefault(x, []).append(g)
    ordered = sorted(out, key=lambda x: (x.data[0].name, x.data[0].index))
    return {x: T.add(*out[x]) for x in ordered}


def gradient_terms(w: Term) -> dict:
    """Printed weight name -> ``G_W^t`` (the gradient, by the duality contract), in weight order."""
    try:
        found = coefficients(w)
    except FdslError as e:
        if "of something that is not a weight" not in e.message:
            raise
        x = next(x for x, _ in normal_terms(w) if not is_weight(x))
        raise FdslError("not a normal form of weights: d(%s) is not the differential of a weight"
                        % short(x)) from None
    return {x.data[0].printed(): dual(x, g) for x, g in found.items()}


def dual(x: Term, g: Term) -> Term:
    """``G^t``, shaped like the weight x: a scalar coefficient c of a square weight (trace(c dW))
    stands for c I, whose dual is c I, not a matrix filled with c."""
    if g.scalar and x.shape != (1, 1):
        return T.mul(g, T.eye(x.shape[0]))
    return T.transpose(g)


def error_of(w) -> Optional[Term]:
    """E if ``w`` is ``form(E)``, else None."""
    if not isinstance(w, Term):
        return None
    c, rest = T.coefficient(w)
    if c != -1 or rest.op != "trace":
        return None
    last = T.factors(rest.args[0])[-1]
    if last.op != "d":
        return None
    e = last.args[0]
    return e if form(e) is w else None


def loss_of(w) -> Optional[Term]:
    """The loss whose descent direction ``w`` is: E (a matrix, standing for ``1/2 ||E||^2``) when
    ``w`` is ``form(E)``, the scalar term L when ``w`` is ``-d(L)``, else None (see the module doc)."""
    e = error_of(w)
    return e if e is not None else objective_of(w)


def objective_of(w) -> Optional[Term]:
    """L if ``w`` is ``-d(L)`` for a scalar L (the descent direction of L, e.g. a cross-entropy),
    else None."""
    if not isinstance(w, Term):
        return None
    c, rest = T.coefficient(w)
    if c == -1 and rest.op == "d" and rest.args[0].scalar:
        return rest.args[0]
    return None


def no_loss_note(name: str) -> str:
    """Why a 1-form has no loss to train with, and what to write instead."""
    return ("%s is neither form(E) nor -d(L) for a term E or a scalar L, so fdsl cannot name the loss it "
            "descends (give --form 'form(E)' or --form '-d(L)', or define w = -d(L) in the file)" % name)
