"""Gradients: the numbers of a normal form, by the duality contract of issue 4.

Vocabulary
----------
1-form       a scalar term linear in differentials, ``form(E)`` or ``trace(E^t d(E))``.
normal form  ``w = sum_W trace(G_W d(W))`` (``fdsl.calculus.forms``); a 1-form not in it is first brought
             there with the stdlib strategy ``normal`` (a form already normal is used as it is:
             normalising again would multiply its coefficients out a second time).
gradient     ``grad(w, W) = G_W^t``, the dual of the form under the Euclidean (Frobenius) metric:
             ``w(V) = sum_W trace(G_W V_W) = sum_W <G_W^t, V_W>``. For ``E = Y - F``,
             ``form(E) = -dL`` with ``L = 1/2 ||E||^2``, so ``grad(form(E), W) = -dL/dW`` is the
             descent direction, and ``grad(trace(E^t d(E)), W) = +dL/dW``.
gradients    all of them at once, keyed by printed weight name (``Q_0``, ``K_1``, ``b_0``):
             ``gradients(program, w)`` is the one function the CLI, ``grad(w)``, ``save`` and the
             repl go through, and training runs the same generated code: the normal form lowered
             by ``fdsl.codegen.generated`` (one forward and one backward sweep, each shared subterm
             once), which ``fdsl.verify.differential`` holds against torch and finite differences.

The gradients are computed from the symbolic normal form, never by numerical differentiation;
tests/test_grad.py holds them against finite differences of the loss.
"""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from ..base.errors import FdslError
from ..calculus import gradients as gradients_of
from ..core import normal
from ..core import terms as T
from ..core.functions import as_term, describe, function
from ..core.printers import short
from ..core.terms import Term, postorder
from ..numbers import numpy_eval
from ..numbers.values import Numeric, program_evaluator, program_values

# ---- normal forms and coefficients ---------------------------------------------------------------


def check_one_form(w, what: str = "the form") -> Term:
    """``w`` as a term, or an FdslError saying why it is not a scalar 1-form."""
    if not isinstance(w, Term):
        raise FdslError("%s must be a scalar 1-form such as form(E), not %s" % (what, describe(w)))
    if T.is_zero(w):
        return w
    if not w.scalar:
        raise FdslError("%s is a (%s x %s) matrix, not a scalar 1-form: gradients are of scalar forms "
                        "such as form(E) = -trace(E^t d(E))" % ((what,) + tuple(w.shape)))
    if not w.has_d:
        raise FdslError("%s has no differential: it is a number, not a 1-form (write form(E), or "
                        "trace(... d(W) ...))" % what)
    return w


def normal_form(program, w, what: str = "the form") -> Term:
    """``w`` in normal form: as it is if it already is one (every summand trace(G d(W)) with W a
    weight), else through the strategy ``backprop`` (the shared normal form: the same numbers as
    ``normal``, linear in depth)."""
    return program.normal_form(check_one_form(w, what))


def coefficients(program, w, what: str = "the form") -> dict:
    """Weight term -> its coefficient G_W (the sum of them, if a weight has several summands), in
    weight order."""
    w = normal_form(program, w, what)
    if T.is_zero(w):
        return {}
    if normal.pairs(w) is None:
        raise FdslError("%s did not reach a normal form sum_W trace(G_W d(W)); the strategy normal "
                        "left %s" % (what, short(w)))
    return gradients_of.coefficients(w, what)


def no_weight(program, what: str = "the form", so: str = "") -> FdslError:
    """The error for a form without a weight (every symbol declared const, or a form that is 0):
    a gradient of nothing is a mistake, not 0 gradients."""
    consts = [name for name, t in program.symbols.items()
              if t.op == "sym" and t.data[0].kind in ("const", "scalar") and t.data[0].value is None]
    consts += ["%s[%s]" % (name, ", ".join(f.indices)) for name, f in program.families.items()
               if f.kind != "weight"]
    weights = [name for name, t in program.symbols.items() if t.op == "sym" and t.data[0].kind == "weight"]
    weights += ["%s[%s]" % (name, ", ".join(f.indices)) for name, f in program.families.items() if f.kind == "weight"]
    if weights:
        why = "it involves none of the weights %s" % ", ".join(weights)
    else:
        why = "the program declares no weight"
    said = (" (%s %s declared const)" % (", ".join(consts), "is" if len(consts) == 1 else "are")) if consts else ""
    return FdslError("%s has no gradient%s: %s%s; declare what is learned with weight instead of const"
                     % (what, so, why, said))


def gradients(program, w, values: Optional[Mapping] = None, what: str = "the form") -> dict:
    """Printed weight name -> ``G_W^t`` (a float64 array shaped like W), for every weight of the
    1-form ``w``, over ``values`` (arrays by printed name; by default the program's values): the
    generated code of ``fdsl codegen`` (one forward and one backward sweep), the one lowering
    every gradient goes through."""
    from .generated import compile_gradients

    w = normal_form(program, w, what)
    coeffs = coefficients(program, w, what)  # the checks: a normal form, of weights only
    if T.is_zero(w):
        return {}
    values = program_values(program) if values is None else values
    with np.errstate(all="ignore"):  # a non-finite gradient is reported below, with its term
        grads = compile_gradients(w, program.dims)(values)
    for name, g in grads.items():
        bad = numpy_eval.first_non_finite(g)
        if bad is not None:
            # find the term that made it: the interpreter stops at the first non-finite value
            ev = numpy_eval.Evaluator(values, program.dims)
            for G in coeffs.values():
                ev.value(G)
            raise numpy_eval.NonFinite("the gradient %s is not finite: %s" % (name, bad))
    for x in coeffs:  # the gradient of a scalar weight is a number: 0-d, as its value in a values file
        name = x.data[0].printed()
        if x.scalar and np.size(grads[name]) == 1:
            grads[name] = np.reshape(grads[name], ())
    return grads


# ---- the sign of a gradient ------------------------------------------------------------------------
# grad(w, W) is the dual of w, which for w = form(E) = -dL is -dL/dW (the descent direction), the
# opposite of PyTorch's W.grad. Every gradient that leaves fdsl (a printed grad(w), a file of
# gradients, the line fdsl grad prints) says which it holds, so it is never used with the wrong sign.
DESCENT = "-dL/dW, the descent direction (W + lr g lowers L)"
PYTORCH = "+dL/dW, as PyTorch's W.grad (W - lr g lowers L)"
DUAL = "the dual G_W^t of the form (-dL/dW where the form is -d(L))"
SIGN_KEY = "_sign"  # the entry of a gradients file that says which; no weight's name starts with _


def is_descent(w) -> bool:
    """Whether ``w`` is ``-d(L)`` for a scalar L, or ``form(E)`` (= -d(1/2 ||E||^2)): then its dual
    is -dL/dW."""
    from ..calculus.gradients import error_of

    if not isinstance(w, Term):
        return False
    c, rest = T.coefficient(w)
    return (c == -1 and rest.op == "d" and rest.args[0].scalar) or error_of(w) is not None


def sign_of(w, pytorch: bool = False) -> str:
    """What the gradients of ``w`` hold, in words (``pytorch``: negated, +dL/dW)."""
    if pytorch:
        return PYTORCH if is_descent(w) else "minus " + DUAL
    return DESCENT if is_descent(w) else DUAL


def symbol_leaves(terms) -> dict:
    """Printed name -> symbol leaf, for the symbols under ``terms`` whose values must be given (no
    dims, no built-in values), in first-seen order."""
    out: dict = {}
    for term in terms:
        for leaf in postorder(term):
            if leaf.op == "sym":
                symbol = leaf.data[0]
                if symbol.kind != "dim" and symbol.value is None:
                    out.setdefault(symbol.printed(), leaf)
    return out



# ---- the language: grad(w, W) and grad(w) ----------------------------------------------------------


class Gradients(dict):
    """Gradients by printed weight name; ``show`` prints each, ``save "g.npz" grad(w)`` writes one
    array per weight, and the entry ``_sign`` that says which sign they hold."""

    sign = DUAL

    def show(self) -> str:
        if not self:
            return "(no weights: the form is 0)"
        parts = ["gradients: %s" % self.sign]
        for name, g in self.items():
            if g.ndim == 0:  # a scalar weight
                parts.append("%s (scalar): %.10g" % (name, g))
                continue
            parts.append("%s (%d x %d):\n%s"
                         % ((name,) + g.shape + (np.array2string(g, precision=6, max_line_width=120),)))
        return "\n".join(parts)


@function("grad(w, W?)", "the gradient G_W^t of the 1-form w = ... + trace(G_W d(W)) + ... (all of them, "
          "by weight name, without W); grad(form(E), W) is the descent direction of 1/2 ||E||^2")
def _grad(program, w, weight=None):
    if weight is None:
        grads = gradients(program, w, what="the first argument of grad")
        if not grads:
            raise no_weight(program, "the first argument of grad")
        out = Gradients(grads)
        out.sign = sign_of(w)
        return out
    x = as_term(weight, "the second argument of grad")
    if x.op != "sym" or x.data[0].kind != "weight":
        raise FdslError("the second argument of grad must be a weight, not %s" % short(x))
    grads = gradients(program, w, what="the first argument of grad")  # one sweep, the same numbers
    g = grads.get(x.data[0].printed())
    if g is None:  # the form does not involve W: its gradient there is zero
        g = program_evaluator(program).value(T.zero(x.shape))
    return Numeric(np.reshape(g, (1, 1)) if np.ndim(g) == 0 else g, x)




def form_named(program, name: str) -> Term:
    """The value of ``--form NAME`` (a definition, or any expression), checked to be a 1-form."""
    if name in program.clauses and name not in program.definitions:
        raise FdslError("%s is a parameterised definition; --form takes a form, e.g. a definition "
                        "w = form(E)" % name, file="--form")
    label = "--form %s" % (name if name.isprintable() else repr(name))  # a newline would split the message
    try:
        value = program.expr(name)
    except FdslError as e:
        if e.file == "<expr>":
            e.file, e.line, e.col, e.source = label, None, None, None
        raise
    try:
        return check_one_form(value, name)
    except FdslError as e:
        e.file = e.file or label
        raise


def check_given(program, terms, source: Optional[str], drawn: bool = False) -> None:
    """With ``--values`` and no ``--random`` (``drawn``): every symbol the terms need must be in
    the file, since nothing fills it in."""
    if source is None or drawn:
        return
    given = program.values if program.values is not None else {}
    missing = [n for n in symbol_leaves(terms) if n not in given]
    if missing:
        raise FdslError("--values may omit nothing the form needs: %s %s no value (the file gives %s)"
                        % (", ".join(missing), "has" if len(missing) == 1 else "have",
                           ", ".join(sorted(given)) or "nothing"), file=source,
                        notes=["note: add --random SEED to draw the rest (data from the file, weights at random)"])
