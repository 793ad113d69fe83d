"""Flows: 1-forms dualized against the program's metric, in numbers.

Vocabulary
----------
flow         the metric dual v of a 1-form ``w = sum_W trace(G_W dW)``: ``g(v, .) = w`` for the
             metric g the program chose (``fdsl.learn.metrics``). One array per weight, shaped like it.
w^sharp      the Euclidean dual, ``grad(w, W) = G_W^t`` (``fdsl.codegen.grads.gradients``,
             the one numeric lowering): every metric starts from it.
block        the weights one gaussnewton(E, lambda) metric was given: their flow is solved jointly.
J v          the differential of E applied to a direction v: ``d(E)`` differentiated by the stdlib's
             ruleset ``differentiate`` one named intermediate at a time (so its size stays linear
             in depth), with ``d(W)`` replaced by the direction's component on W, lowered to
             numpy by ``fdsl.codegen.generated``. Forward mode, from fdsl's own rules.
J^t u        the coefficients of the normal form of ``trace(U^t d(E))`` at ``U = u``: the same
             generated reverse sweep as ``grad``. J itself is never formed.
solve        conjugate gradients on ``(J^t J + lambda I) v = w^sharp``: the iterations it took and
             the relative residual ``|b - A v| / |b|`` it reached (computed afresh at the end, not
             the recursion's estimate), reported with every Gauss-Newton flow.

``flow(w)`` / ``flow(w, W)`` in a program, ``fdsl flow FILE --form NAME --out v.npz`` on the
command line (one array per weight, like ``fdsl grad``), and ``fdsl train`` all go through
``Dualizer``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..base.errors import FdslError
from ..base.estimate import Clock, check_estimate
from ..core import terms as T
from ..core.functions import as_term, function
from ..core.printers import short
from ..core.terms import Symbol, Term, postorder
from .metrics import EUCLIDEAN, GaussNewton, Kron, metric_of


class Overlay(Mapping):
    """``extra`` in front of ``base`` (which may draw random values on lookup)."""

    def __init__(self, base, extra: dict):
        self.base, self.extra = base, extra

    def __getitem__(self, name):
        return self.extra[name] if name in self.extra else self.base[name]

    def __contains__(self, name):
        return name in self.extra or name in self.base

    def __iter__(self):
        return iter(set(self.extra) | set(self.base))

    def __len__(self):
        return len(set(self.extra) | set(self.base))


def weight_leaves(term: Term) -> list:
    """The weights under ``term`` (through named intermediates), in weight order."""
    found = {n for n in postorder(term) if n.op == "sym" and n.data[0].kind == "weight"}
    return sorted(found, key=_order)


def _order(x: Term):
    return (x.data[0].name, x.data[0].index)


def _name(x: Term) -> str:
    return x.data[0].printed()



# ---- J v and J^t u from fdsl's own forms --------------------------------------------------------


def substitute(term: Term, mapping: dict) -> Term:
    """``term`` with every node in ``mapping`` replaced, over the shared graph (each node once)."""
    out: dict = {}
    for node in postorder(term, descend=lambda n: n not in mapping):
        out[node] = mapping[node] if node in mapping else T.rebuild(node, [out[a] for a in node.args])
    return out[term]


def tangent_term(program, error: Term, directions: dict) -> Term:
    """``d(E)`` with ``d(W)`` replaced by ``directions[W]`` (a term shaped like W): J v as a term.
    Each named intermediate X of E gets its own tangent ``δX := d(body of X)``, so the term is
    as shared as E."""
    mapping = {T.d(w): v for w, v in directions.items()}
    lets = [n for n in postorder(error) if n.op == "let"]  # inner ones first
    for x in lets:
        name, index = x.data
        body = _differentiated(program, x.args[0], error, mapping)
        mapping[T.d(x)] = T.let("δ" + name, index, body)
    if error.op == "let":
        return mapping[T.d(error)]
    return _differentiated(program, error, error, mapping)


def _differentiated(program, body: Term, error: Term, mapping: dict) -> Term:
    t = substitute(program.apply_rules("differentiate", T.d(body)), mapping)
    left = next((n for n in postorder(t) if n.op == "d"), None)
    if left is not None:
        raise FdslError("gaussnewton(%s, ...): the rules leave %s undifferentiated, so the direction "
                        "cannot be applied to it" % (short(error, 30), short(left)))
    return t


class Jacobian:
    """J = dE/d(block weights) as two maps, J v and J^t u, each one generated numpy function."""

    def __init__(self, program, error: Term, weights: list):
        from ..codegen import generated as codegen
        from ..codegen.grads import normal_form

        self.error, self.weights = error, weights
        dims = program.dims
        block = set(weights)
        self.direction = {}  # printed weight name -> the name of its direction's symbol
        directions = {}
        for w in weight_leaves(error):
            if w in block:
                symbol = Symbol("δ" + w.data[0].name, w.data[0].index, "const")
                self.direction[_name(w)] = symbol.printed()
                directions[w] = T.sym(symbol, w.shape)
            else:
                directions[w] = T.zero(w.shape)  # another metric's weight: not a column of this J
        tangent = tangent_term(program, error, directions)
        self.zero = T.is_zero(tangent)  # E does not depend on the block: J = 0
        if not self.zero:
            source = codegen.generate({"Jv": tangent}, dims, "J v for gaussnewton, generated by fdsl.")
            self._forward = codegen._checked(codegen.compile_source(source), source)
            u = T.sym(Symbol("ΔE", (), "const"), error.shape)
            self.cotangent = u.data[0].printed()
            form = T.make("trace", [T.mul(T.transpose(u), T.d(error))])
            normal = normal_form(program, form, "trace(U^t d(E)) of gaussnewton")
            self._backward = codegen.compile_gradients(normal, dims)

    def apply(self, values, v: dict) -> np.ndarray:
        """J v, for ``v`` by printed weight name."""
        return self._forward(Overlay(values, {self.direction[n]: v[n] for n in self.direction}))["Jv"]

    def transpose(self, values, u: np.ndarray, shapes: dict) -> dict:
        """J^t u, by printed weight name (zeros for a weight of ``shapes`` that E's form lacks)."""
        grads = self._backward(Overlay(values, {self.cotangent: u}))
        return {n: grads[n] if n in grads else np.zeros(s) for n, s in shapes.items()}


# ---- conjugate gradients ------------------------------------------------------------------------


@dataclass
class Solve:
    """How a Gauss-Newton flow was solved: reported with it."""

    spec: GaussNewton
    weights: list
    iterations: int
    residual: float  # |b - A v| / |b|, computed afresh

    def line(self) -> str:
        return ("%s on %s: conjugate gradients reached a relative residual of %.2g (tol %g) in %d iteration%s"
                % (self.spec.describe(), _names(self.weights), self.residual, self.spec.tol,
                   self.iterations, "" if self.iterations == 1 else "s"))


def _names(names: list, n: int = 6) -> str:
    return ", ".join(names) if len(names) <= n else "%s, ... (%d weights)" % (", ".join(names[:n - 1]), len(names))


def conjugate_gradients(apply, b: np.ndarray, tol: float, limit: int, check=None) -> tuple:
    """Solve ``A x = b`` for symmetric positive (semi)definite A given as ``apply``: (x, iterations,
    relative residual |b - A x| / |b|, converged). Restarts from x when the recursion's residual
    says it has converged and the true one disagrees (rounding drift). ``check(iterations)``, if
    given, is called before every iteration (the run's clock: it may stop the solve)."""
    x = np.zeros_like(b)
    bnorm = float(np.linalg.norm(b))
    if bnorm == 0.0:
        return x, 0, 0.0, True
    done = 0
    r = b.copy()
    while True:
        p, rr = r.copy(), float(r @ r)
        while done < limit:
            if check is not None:
                check(done)
            ap = apply(p)
            pap = float(p @ ap)
            if not pap > 0.0:
                raise FdslError("conjugate gradients broke down: the metric is singular along the direction "
                                "reached (p^t A p = %g); give gaussnewton a lambda > 0" % pap)
            alpha = rr / pap
            x += alpha * p
            r -= alpha * ap
            done += 1
            rr_new = float(r @ r)
            if math.sqrt(rr_new) <= tol * bnorm:
                break
            p = r + (rr_new / rr) * p
            rr = rr_new
        r = b - apply(x)  # the true residual
        residual = float(np.linalg.norm(r)) / bnorm
        if residual <= tol or done >= limit:
            return x, done, residual, residual <= tol


# ---- the dual of a 1-form ----------------------------------------------------------------------


class Dualizer:
    """Turns the Euclidean gradients of a 1-form's weights into its flow under the program's
    metric. Built once (the symbolic work: J v and J^t u), then called at any values."""

    def __init__(self, program, weights: list, what: str = "the form"):
        metric = metric_of(program)
        self.what = what
        terms = {w: metric.spec(w) for w in weights}  # weight -> its metric
        for spec in set(s for s in terms.values() if isinstance(s, GaussNewton)):
            for w in weight_leaves(spec.error):  # a block is every weight of E with that metric, jointly
                if metric.spec(w) == spec:
                    terms.setdefault(w, spec)
        ordered = sorted(terms, key=_order)
        self.weights = [_name(w) for w in ordered]
        self.specs = {_name(w): terms[w] for w in ordered}
        self.shapes = {_name(w): w.shape for w in ordered}
        self.blocks = []  # (spec, its weights' names, Jacobian)
        for spec in dict.fromkeys(terms[w] for w in ordered if isinstance(terms[w], GaussNewton)):
            block = [w for w in ordered if terms[w] == spec]
            self.blocks.append((spec, [_name(w) for w in block], Jacobian(program, spec.error, block)))
        self.euclidean = all(s == EUCLIDEAN for s in self.specs.values())
        self.time_limit = program.options.get("time_limit")  # None: DEFAULT_TIME_LIMIT

    def terms(self) -> list:
        """The terms the metric needs values for: the factors of kron metrics, the errors of
        Gauss-Newton ones."""
        out = []
        for spec in dict.fromkeys(self.specs.values()):
            if isinstance(spec, Kron):
                out += [spec.left, spec.right]
            elif isinstance(spec, GaussNewton):
                out.append(spec.error)
        return out

    def describe(self) -> str:
        """The metric, one clause per kind: ``euclidean on b_0, b_1; kron(L, R) on Q_0``."""
        groups: dict = {}
        for name in self.weights:
            groups.setdefault(self.specs[name].describe(), []).append(name)
        return "; ".join("%s on %s" % (d, _names(ns)) for d, ns in groups.items())

    def __call__(self, grads: dict, values, evaluator, clock=None, where: str = "") -> tuple:
        """(flows by printed weight name, [Solve for each Gauss-Newton block]) at ``values``, from the
        Euclidean gradients ``grads`` (missing weights: zero) and an evaluator over the same values
        (for the factors of kron metrics). ``clock``: the run's (a training run's, ``where`` saying
        at which step), else one of its own: the solves stop at the time limit."""
        if clock is None:
            clock = Clock("the flow of %s" % self.what, self.time_limit)
        sharp = {}
        for name in self.weights:
            g = grads.get(name)
            sharp[name] = np.asarray(g, dtype=np.float64) if g is not None else np.zeros(self._size(evaluator, name))
        flows, solves = {}, []
        for name in self.weights:
            spec = self.specs[name]
            if spec == EUCLIDEAN:
                flows[name] = sharp[name]
            elif isinstance(spec, Kron):
                flows[name] = self._kron(spec, name, sharp[name], evaluator)
        for spec, names, jac in self.blocks:
            block, solve = self._gauss_newton(spec, names, jac, sharp, values, clock, where)
            flows.update(block)
            solves.append(solve)
        return {n: flows[n] for n in self.weights}, solves

    def _size(self, evaluator, name):
        return evaluator.shape(self.shapes[name], "the flow of %s" % name)

    def _kron(self, spec: Kron, name: str, sharp: np.ndarray, evaluator) -> np.ndarray:
        left = _spd(evaluator.value(spec.left), spec.left, "L", name, sharp.shape[0])
        right = _spd(evaluator.value(spec.right), spec.right, "R", name, sharp.shape[1])
        x = np.linalg.solve(left, sharp)  # L^-1 G^t
        return np.linalg.solve(right, x.T).T  # ... R^-1 (R is symmetric)

    def _gauss_newton(self, spec: GaussNewton, names: list, jac: Jacobian, sharp: dict, values, clock: Clock,
                      where: str) -> tuple:
        shapes = [sharp[n].shape for n in names]
        sizes = [int(np.prod(s)) for s in shapes]
        offsets = np.cumsum([0] + sizes)

        def split(x):
            return {n: x[offsets[i]:offsets[i + 1]].reshape(shapes[i]) for i, n in enumerate(names)}

        def join(parts):
            return np.concatenate([np.asarray(parts[n], dtype=np.float64).reshape(-1) for n in names])

        def apply(x):  # (J^t J + lambda I) x
            if jac.zero:
                return spec.damping * x
            return join(jac.transpose(values, jac.apply(values, split(x)), dict(zip(names, shapes)))) + spec.damping * x

        b = join(sharp)
        limit = spec.limit(b.size)
        # the estimate of running every iteration allowed, asked for or implied (2N + 50), is checked
        what = spec.describe() if spec.iterations is not None else \
            "%s (at most 2N + 50 iterations for its N = %d coordinates)" % (spec.describe(), b.size)
        apply = _estimated(apply, what, limit, self.time_limit)

        def check(done):  # and the run's clock at every iteration, whatever the estimate said
            clock.check("%s(%s: conjugate gradients at iteration %d)" % (where + " " if where else "",
                                                                        spec.describe(), done))

        with np.errstate(over="ignore", invalid="ignore"):
            x, iterations, residual, converged = conjugate_gradients(apply, b, spec.tol, limit, check)
        if not converged:
            raise FdslError("%s: conjugate gradients reached a relative residual of %.2g, not the tolerance "
                            "%g, within %d iterations (the limit): raise the limit or the tolerance, "
                            "gaussnewton(E, %g, TOL, ITERATIONS), or the damping lambda"
                            % (spec.describe(), residual, spec.tol, limit, spec.damping))
        return split(x), Solve(spec, names, iterations, residual)


def _estimated(apply, what: str, limit: int, time_limit):
    """``apply`` that, on its second call (the first may compile the code of J), refuses the solve
    if ``limit`` iterations at that call's cost would take longer than the time limit."""
    calls = [0]

    def timed(x):
        calls[0] += 1
        if calls[0] != 2:
            return apply(x)
        start = time.perf_counter()
        out = apply(x)
        check_estimate(what, limit, "iterations", time.perf_counter() - start, time_limit)
        return out

    return timed


def _spd(a: np.ndarray, term: Term, which: str, name: str, size: int) -> np.ndarray:
    """A kron factor as a size x size SPD matrix (a scalar c is c I), or an error saying why not."""
    where = "%s = %s of the metric kron(L, R) on %s" % (which, short(term, 40), name)
    if a.shape == (1, 1) and size != 1:
        a = a[0, 0] * np.eye(size)
    if not np.all(np.isfinite(a)):
        raise FdslError("%s is not finite" % where)
    scale = float(np.max(np.abs(a))) if a.size else 0.0
    if float(np.max(np.abs(a - a.T))) > 1e-10 * scale:
        raise FdslError("%s is not symmetric (|L - L^t| = %.3g): a metric is symmetric positive definite"
                        % (where, float(np.max(np.abs(a - a.T)))))
    try:
        np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        low = float(np.min(np.linalg.eigvalsh(a)))
        raise FdslError("%s is not positive definite (its smallest eigenvalue is %.3g): a metric is "
                        "symmetric positive definite" % (where, low)) from None
    return a


# ---- the language: flow(w, W?) ----------------------------------------------------------------------


class Flows(dict):
    """Flows by printed weight name, with the metric and how each Gauss-Newton block was solved;
    ``show`` prints them, ``save "v.npz" flow(w)`` writes one array per weight."""

    def __init__(self, flows: dict, metric: str = "", solves=()):
        super().__init__(flows)
        self.metric, self.solves = metric, list(solves)

    def notes(self) -> list:
        return ["metric: %s" % self.metric] + [s.line() for s in self.solves]

    def show(self) -> str:
        if not self:
            return "(no weights: the form is 0)"
        parts = ["%s (%d x %d):\n%s" % ((name,) + v.shape + (np.array2string(v, precision=6, max_line_width=120),))
                 for name, v in self.items()]
        return "\n".join(parts + self.notes())


def flows_of(program, w, values=None, evaluator=None, what: str = "the form") -> Flows:
    """The flow of the 1-form ``w`` under the program's metric, at the program's values."""
    from ..codegen.grads import coefficients, gradients, normal_form
    from ..numbers.values import program_evaluator, program_values

    w = normal_form(program, w, what)
    weights = list(coefficients(program, w, what))
    dual = Dualizer(program, weights, what)
    grads = gradients(program, w, what=what) if weights else {}
    values = program_values(program) if values is None else values
    evaluator = program_evaluator(program) if evaluator is None else evaluator
    flows, solves = dual(grads, values, evaluator)
    return Flows(flows, dual.describe(), solves)


@function("flow(w, W?)", "the flow of the 1-form w: its dual under the program's metric (metric statements; "
          "Euclidean by default, where it is grad), every weight by name, or the one of W")
def _flow(program, w, weight=None):
    from ..numbers.values import Numeric, program_evaluator

    flows = flows_of(program, w, what="the first argument of flow")
    if weight is None:
        return flows
    x = as_term(weight, "the second argument of flow")
    if x.op != "sym" or x.data[0].kind != "weight":
        raise FdslError("the second argument of flow must be a weight, not %s" % short(x))
    v = flows.get(_name(x))
    if v is None:  # neither the form nor the metric involves W: its flow is zero
        v = program_evaluator(program).value(T.zero(x.shape))
    return Numeric(v, x)


def _gauss_newton_specs(program, coeffs: dict) -> list:
    metric = metric_of(program)
    specs = [metric.spec(w) for w in coeffs] + [metric.default] + [s for *_, s in metric.entries]
    return list(dict.fromkeys(s for s in specs if isinstance(s, GaussNewton)))
