"""Metrics on the space of weights: the choice that turns a 1-form into a flow.

Vocabulary
----------
metric       a Riemannian metric g on weight space, chosen per weight or family with the
             ``metric`` statement; a weight without one has the Euclidean (Frobenius) metric
             ``g(A, B) = trace(A^t B)``. The manual: a form "can be dualized against a choice of
             Riemannian metric to give a flow"; Euclidean is only the default.
flow         the metric dual of a 1-form w: the tangent vector v with ``g(v, .) = w``
             (``fdsl.learn.flow`` computes it). Under the Euclidean metric it is ``grad(w, W) = G_W^t``.
euclidean    ``g(A, B) = trace(A^t B)``: the flow of ``w = ... + trace(G_W dW) + ...`` on W is G_W^t.
kron(L, R)   ``g(A, B) = trace(A^t L B R)`` on a weight W (rows x cols), L (rows x rows) and R
             (cols x cols) symmetric positive definite (a number c stands for c times the
             identity): the flow on W is ``L^-1 G_W^t R^-1``. A Kronecker-factored metric, as K-FAC
             and Shampoo use. L and R are evaluated at the current values; they are checked to be
             symmetric positive definite there.
gaussnewton(E, lambda, tol?, iterations?)
             the pullback of the Euclidean metric on E's space along the error map, plus lambda
             times the Euclidean one: ``g(u, v) = <J u, J v> + lambda <u, v>`` with J = dE/dweights,
             over all the weights given it, jointly. The flow solves ``(J^t J + lambda I) v =
             w^sharp`` (w^sharp: the Euclidean dual) by conjugate gradients, to a relative residual
             of ``tol`` (default 1e-10) within ``iterations`` steps (default 2 N + 50, N the number
             of coordinates), never forming J. For ``w = form(E)`` this is the Gauss-Newton
             (Levenberg-Marquardt) step ``-(J^t J + lambda I)^-1 J^t vec(E)``.
target       what a ``metric`` statement applies to: a weight (``U``, ``K[1]``, ``K_1``) or a family
             (``K[i]``: every member; a bare name as an index stands for all of them).

The statement::

    metric K[i], Q[i] = kron(L, R)      those weights get this metric (a later statement overrides
    metric b[i] = euclidean             an earlier one for the weights they share)
    metric gaussnewton(E, lambda)       every weight without a metric of its own
    metric euclidean                    start again: every weight Euclidean

Weights given the same gaussnewton(...) share one joint block. This module is core: it checks
targets and shapes symbolically; the numbers are ``fdsl.learn.flow``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Optional

from ..base.errors import FdslError
from ..core.functions import as_int, as_term, describe
from ..core.printers import short
from ..core.terms import Symbol, Term
from ..lang.statements import statement

DEFAULT_TOL = 1e-10


@dataclass(frozen=True)
class Euclidean:
    def describe(self) -> str:
        return "euclidean"


@dataclass(frozen=True)
class Kron:
    left: Term  # L: rows x rows, or a scalar (times the identity)
    right: Term  # R: cols x cols, or a scalar

    def describe(self) -> str:
        return "kron(%s, %s)" % (short(self.left), short(self.right))


MIN_TOL = 1e-15  # CG's relative residual cannot go much below float64's precision
MAX_ITERATIONS = 1_000_000  # an iteration limit beyond this is a hang, not a limit


@dataclass(frozen=True)
class GaussNewton:
    error: Term  # E
    damping: float  # lambda >= 0
    tol: float = DEFAULT_TOL
    iterations: Optional[int] = None  # None: 2 N + 50 for N coordinates
    label: str = field(default="", compare=False)  # how E was written, for messages

    def describe(self) -> str:
        return "gaussnewton(%s, %s)" % (self.label or short(self.error, 30), _number(self.damping))

    def limit(self, size: int) -> int:
        return self.iterations if self.iterations is not None else 2 * size + 50


EUCLIDEAN = Euclidean()


@dataclass
class Metric:
    """A program's metric: entries (family or symbol name, index pattern, spec), latest last, and
    the default for weights no entry names."""

    entries: list = field(default_factory=list)
    default: object = EUCLIDEAN

    def spec(self, weight: Term):
        """The metric of one weight symbol."""
        symbol = weight.data[0]
        for name, pattern, spec in reversed(self.entries):
            if name == symbol.name and len(pattern) == len(symbol.index) and \
                    all(p is None or p == i for p, i in zip(pattern, symbol.index)):
                return spec
        return self.default

    def is_euclidean(self) -> bool:
        return self.default == EUCLIDEAN and all(spec == EUCLIDEAN for *_, spec in self.entries)


def metric_of(program) -> Metric:
    """The program's metric (Euclidean everywhere when no statement chose one)."""
    return program.metric if program.metric is not None else Metric()


# ---- the statement ---------------------------------------------------------------------------------

USAGE = "metric W, ... = euclidean | kron(L, R) | gaussnewton(E, lambda), or metric gaussnewton(E, lambda)"


@statement("metric", USAGE, "choose the metric that dualizes 1-forms into flows (flow, train): per weight or "
           "family (K[i]), or for every weight without its own")
def _metric(program, st):
    metric = metric_of(program)
    if st.body is None:
        if len(st.items) != 1:
            raise FdslError("usage: %s" % USAGE, line=st.line, col=st.col)
        spec = _spec(program, st.items[0], ())
        if isinstance(spec, Kron):
            raise program.error("kron(L, R) is the metric of one weight's shape: write metric W = kron(L, R)",
                                st.items[0])
        program.metric = Metric() if spec == EUCLIDEAN else Metric(list(metric.entries), spec)
        return
    targets = [_target(program, node) for node in st.items]
    spec = _spec(program, st.body, targets)
    program.metric = Metric(metric.entries + [(name, pattern, spec) for name, pattern, *_ in targets],
                            metric.default)


def _target(program, node) -> tuple:
    """(name, index pattern, shape, label) of a target node: a weight, or a family with names as indices."""
    if node.kind == "index" and node.args[0].kind == "name" and node.args[0].value in program.families:
        name = node.args[0].value
        family = program.families[name]
        pattern = []
        for i in node.args[1:]:
            if i.kind == "name" and i.value not in program.definitions and i.value not in program.dims:
                pattern.append(None)  # K[i]: every member
            else:
                pattern.append(as_int(program.evaluate(i, {}), "an index"))
        if len(pattern) != len(family.indices):
            raise program.error("%s takes %d index%s, not %d" % (name, len(family.indices),
                                "" if len(family.indices) == 1 else "es", len(pattern)), node)
        if family.kind != "weight":
            raise program.error("%s is a family of %ss, not of weights: a metric is on weights" % (name, family.kind),
                                node)
        label = "%s[%s]" % (name, ", ".join(i if p is None else str(p) for i, p in zip(family.indices, pattern)))
        return name, tuple(pattern), family.shape, label
    if node.kind == "name" and node.value in program.families:
        family = program.families[node.value]
        raise program.error("%s is an indexed family: write metric %s[%s] = ... for all its members"
                            % (node.value, node.value, ", ".join(family.indices)), node)
    value = program.evaluate(node, {})
    if not (isinstance(value, Term) and value.op == "sym" and value.data[0].kind == "weight"):
        raise program.error("a metric is on a weight (U, K[1]) or a family of weights (K[i]), not %s"
                            % describe(value), node)
    symbol: Symbol = value.data[0]
    return symbol.name, tuple(symbol.index), value.shape, symbol.printed()


def _spec(program, node, targets):
    """The metric a node names, checked against the targets' shapes."""
    if node.kind == "name" and node.value == "euclidean":
        return EUCLIDEAN
    if node.kind == "call" and node.value == "kron":
        if len(node.args) != 2:
            raise program.error("kron takes 2 arguments, L and R, not %d" % len(node.args), node)
        left, right = (_factor(program, a, w) for a, w in zip(node.args, ("L", "R")))
        for name, pattern, shape, label in targets:
            for factor, side, which, a in ((left, shape[0], "rows", node.args[0]),
                                           (right, shape[1], "columns", node.args[1])):
                if not factor.scalar and not (_same(program, factor.shape[0], side)
                                              and _same(program, factor.shape[1], side)):
                    raise program.error("kron(L, R) on %s (%s x %s): %s is (%s x %s), not square in its %s (%s)"
                                        % ((label,) + tuple(shape) + (short(factor),)
                                           + tuple(factor.shape) + (which, side)), a)
        return Kron(left, right)
    if node.kind == "call" and node.value == "gaussnewton":
        if not 2 <= len(node.args) <= 4:
            raise program.error("gaussnewton takes 2 to 4 arguments, not %d: gaussnewton(E, lambda, tol?, "
                                "iterations?)" % len(node.args), node)
        args = [program.evaluate(a, {}) for a in node.args]
        error = as_term(args[0], "E of gaussnewton")
        if not error.has_weight:
            raise program.error("E of gaussnewton(E, lambda) must depend on weights: it is the error whose "
                                "Jacobian J = dE/dweights makes the metric", node.args[0])
        if error.has_d:
            raise program.error("E of gaussnewton(E, lambda) is a matrix of numbers such as Y - F, not of "
                                "forms", node.args[0])
        damping = _number_arg(program, args[1], node.args[1], "lambda", lambda x: x >= 0, ">= 0")
        tol = DEFAULT_TOL
        if len(args) > 2:
            # a relative residual below float64's precision (2.2e-16) is never reached: CG would run to its limit
            tol = _number_arg(program, args[2], node.args[2], "the tolerance", lambda x: MIN_TOL <= float(x) < 1,
                              "between 1e-15 (float64's precision) and 1")
        iterations = None
        if len(args) > 3:
            iterations = as_int(args[3], "the iteration limit")
            if not 1 <= iterations <= MAX_ITERATIONS:
                raise program.error("the iteration limit must be between 1 and %d (conjugate gradients meet any "
                                    "reachable tolerance long before), not %d" % (MAX_ITERATIONS, iterations),
                                    node.args[3])
        label = node.args[0].value if node.args[0].kind == "name" else ""
        return GaussNewton(error, damping, tol, iterations, label)
    raise program.error("a metric is euclidean, kron(L, R) or gaussnewton(E, lambda), not %s" % _node_text(node), node)


def _factor(program, node, which) -> Term:
    t = as_term(program.evaluate(node, {}), "%s of kron(L, R)" % which)
    if t.has_d:
        raise program.error("%s of kron(L, R) is a matrix of numbers, not of forms" % which, node)
    if t.shape[0] != t.shape[1] and not t.scalar:
        raise program.error("%s of kron(L, R) must be square, not (%s x %s)" % ((which,) + tuple(t.shape)), node)
    return t


def _number_arg(program, value, node, what, ok, need) -> float:
    if isinstance(value, Term) and value.op == "num":
        value = value.data
    if not isinstance(value, Fraction) or not ok(value):
        raise program.error("%s must be a number %s, not %s" % (what, need, describe(value)), node)
    return float(value)


def _same(program, a, b) -> bool:
    size = lambda x: program.dims.get(x) if isinstance(x, str) else x
    return a == b or (size(a) is not None and size(a) == size(b))


def _node_text(node) -> str:
    if node.kind in ("name", "call"):
        return repr(node.value)
    return "this expression"


def _number(x: float) -> str:
    return "%g" % x
