"""``fdsl rules --check``: every rule held, numerically, against random instances of its variables.

Vocabulary
----------
instance   bindings of a rule's pattern variables to random terms of consistent shapes: ``?A`` to one
           term, ``?A...`` to a run of 0 to 2 factors (in a product) or summands (in a sum or a
           Hadamard product). A run of factors is sometimes only scalars where a square matrix
           stands (the engine binds ``?A...`` of ``trace(?A... d(?W))`` to ``c`` in
           ``trace(c d(W))``): it means ``c I`` there, and a right side that uses it outside a
           product must keep that. Both sides are built from the same bindings
           (``fdsl.rewrite.patterns.build``) and evaluated; the engine's own application of the rule to the left side
           (``Rule.apply``) is evaluated too, so a matcher that binds differently is caught as well.
dim        a size variable. Every variable has (rows, cols) dims; the rule's products (inner sizes
           equal), sums, Hadamard products, ``mm``/``aa`` and elementwise operators (equal shapes),
           traces (square), transposes (swapped), scalars (1 x 1) and runs (a run of factors chains
           its own inner dims; an empty one is an identity, so its two ends are one dim) equate
           them, in a union-find; each class then gets a size from 1..5, drawn anew every trial.
flavour    what a variable's terms are made of, read off the rule's guards: ``const`` (no weight),
           ``weighty`` (weights under relu, softmax, products: something with a real derivative),
           ``form`` (holds a differential: d(W), P d(W), mm(X, d(W)), d(m(W + C))...), and the
           literal kinds ``weight``, ``symbol``, ``number``, ``identity``, ``zero``; ``named``
           wraps a term in a let; ``scalar`` makes it a commuting 1 x 1 scalar.
oracle     ``d(T)`` evaluates as the derivative of T along a random tangent of all weights, by central
           finite differences in float64 (``numpy_eval.Evaluator`` with a tangent): evaluation
           only, never the rules. A stencil that crosses a kink of relu is resampled.
verdict    ``sound``: every trial agreed within TOLERANCE; ``UNSOUND``: a trial disagreed (or the
           right side could not be built with shapes the left side allows, or the engine refused);
           ``skipped``: no instance could be generated, with the reason (never silently).

The relative difference of two values is ||L - R|| / max(||L||, ||R||, 1e-6): relative for values
of ordinary size, absolute for values that are (nearly) zero on both sides.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Optional

import numpy as np

from ..base.errors import FdslError, say
from ..core import ops as O
from ..core import terms as T
from ..core.ops import ShapeError
from ..core.printers import text
from ..core.terms import Symbol, Term
from ..rewrite import patterns as P
from ..rewrite.engine import PREDICATES, Rule, guard_value

TOLERANCE = 1e-6  # the finite differences agree to about 1e-9; a wrong rule is off by O(1)
FLOOR = 1e-6  # norms below this count as zero when comparing
STEP = 1e-3  # finite-difference step of the oracle (fourth order: truncation ~ STEP^4)
SIZES = (1, 2, 3, 4, 5)
MAX_RUN = 2
ATTEMPTS_PER_TRIAL = 25  # rejected instances (kinks, unmet guards) allowed per trial asked for


class Reject(Exception):
    """This instance cannot be used (shapes conflict, a guard fails, a stencil crosses a kink)."""


class Skip(Exception):
    """No instance of this rule can be generated at all."""


class Unsound(Exception):
    """A trial in which the two sides differ (or the right side cannot exist)."""

    def __init__(self, message, diff=float("inf")):
        super().__init__(message)
        self.diff = diff


# ---- dims ---------------------------------------------------------------------------------------


class Dims:
    """Union-find over dim variables; a class may be fixed to a size (1 for scalars)."""

    def __init__(self):
        self.parent: list = []
        self.fixed: dict = {}

    def new(self, size: Optional[int] = None) -> int:
        self.parent.append(len(self.parent))
        if size is not None:
            self.fixed[len(self.parent) - 1] = size
        return len(self.parent) - 1

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: int, b: int) -> None:
        a, b = self.find(a), self.find(b)
        if a == b:
            return
        fa, fb = self.fixed.get(a), self.fixed.get(b)
        if fa is not None and fb is not None and fa != fb:
            raise Reject("the shapes the rule needs conflict")
        self.parent[b] = a
        if fa is None and fb is not None:
            self.fixed[a] = fb

    def sizes(self, rng) -> dict:
        """A size for every class: the fixed one, else drawn from SIZES."""
        out = {}
        for d in range(len(self.parent)):
            root = self.find(d)
            if root not in out:
                out[root] = self.fixed.get(root, int(rng.choice(SIZES)))
        return {d: out[self.find(d)] for d in range(len(self.parent))}


@dataclass
class Shape:
    rows: int
    cols: int
    scalar: bool = False


# ---- what the rule asks of each variable ----------------------------------------------------------


@dataclass
class Need:
    """Requirements of one variable (or run), from the guards and the operators around it."""

    name: str
    seq: bool
    context: str = "arg"  # for runs: mul | add | had (where the left side has it)
    guards: dict = field(default_factory=dict)  # predicate -> required truth
    scalar_arg: bool = False  # stands directly under pow
    positive: bool = False  # stands where its operator is defined for positive entries only (log)
    under_d: bool = False  # stands directly under d: a constant there only tests 0 = 0


def _walk(p):
    stack = [p]
    while stack:
        q = stack.pop()
        yield q
        if isinstance(q, P.Op):
            stack.extend(q.args)
        elif isinstance(q, (P.Word, P.Bag)):
            stack.extend(q.items)


def _needs(rule: Rule) -> dict:
    needs: dict = {}
    exponents = P.exponents(rule.lhs)  # ?p of ?a^(?p): a number, drawn by Instance, not a term
    for name, kind in sorted(P.variables(rule.lhs), key=lambda v: v[0]):
        if name not in exponents:
            needs[name] = Need(name, kind is P.Seq)
    for q in _walk(rule.lhs):
        if isinstance(q, (P.Word, P.Bag)):
            ctx = "mul" if isinstance(q, P.Word) else q.op
            for item in q.items:
                if isinstance(item, P.Seq) and needs[item.name].context == "arg":
                    needs[item.name].context = ctx
        if isinstance(q, P.Op) and q.op == "pow" and isinstance(q.args[0], P.Var):
            needs[q.args[0].name].scalar_arg = True
            if isinstance(q.data, P.Exponent):  # any exponent, 1/2 and -1 included: a positive base
                needs[q.args[0].name].positive = True
        if isinstance(q, P.Op) and q.op == "d" and isinstance(q.args[0], P.Var):
            needs[q.args[0].name].under_d = True
        if isinstance(q, P.Op) and q.op in O.OPS:
            for i in O.OPS[q.op].positive:
                arg = q.args[i]
                if isinstance(arg, P.Op) and arg.op == "t":  # log(?X^t): ?X is positive too
                    arg = arg.args[0]
                if isinstance(arg, P.Var):
                    needs[arg.name].positive = True
    for negated, pred, arg in rule.guards:
        if isinstance(arg, (P.Var, P.Seq)):
            guards = needs[arg.name].guards
            if guards.get(pred, not negated) != (not negated):
                raise Skip("the guards ask for both %s(%s) and not %s(%s)" % (pred, arg, pred, arg))
            guards[pred] = not negated
    for need in needs.values():
        if need.positive and need.guards.get("has_d"):
            raise Skip("?%s must be positive, and a form is not" % need.name)
    return needs


def _compound_guards(rule: Rule) -> list:
    """Guards on compound patterns: (required truth, predicate, [variable names in it])."""
    out = []
    for negated, pred, arg in rule.guards:
        if not isinstance(arg, (P.Var, P.Seq)):
            names = sorted({n for n, _ in P.variables(arg)})
            out.append((not negated, pred, names))
    return out


# operators without a numpy lowering that the checker still knows how to shape and evaluate
_STRUCTURAL = {"t", "d", "let", "onescol", "onesrow", "cols", "eyerows"}


def _static_check(rule: Rule) -> None:
    for q in list(_walk(rule.lhs)) + list(_walk(rule.rhs)):
        if isinstance(q, P.Op) and q.op not in _STRUCTURAL:
            spec = O.OPS.get(q.op)
            if spec is None or spec.arity is None:
                raise Skip("the checker knows no shape rule for operator %s" % O.shown(q.op))
            if spec.numpy is None:
                raise Skip("operator %s has no numpy implementation to evaluate" % O.shown(q.op))


# ---- one trial ----------------------------------------------------------------------------------


_NUMBERS = (Fraction(2), Fraction(-1), Fraction(1, 2), Fraction(3, 2), Fraction(-3), Fraction(2, 3))


class Instance:
    """One random instance of a rule: run lengths, flavours, dims, then terms for the variables."""

    def __init__(self, rule: Rule, needs: dict, compound: list, rng):
        self.rule, self.needs, self.rng = rule, needs, rng
        self.dims = Dims()
        self.one = self.dims.new(1)
        self.counter = Counter()
        self.values: dict = {}
        self.weights: list = []
        self.lengths: dict = {}
        self.flavours: dict = {}  # name -> flavour (runs: a list, one per item)
        self.scalar: dict = {}
        self.scalar_runs: set = set()  # runs of factors drawn as only scalars (standing for c I)
        self._decide(compound)
        self.shapes: dict = {}  # name -> (rows dim, cols dim); runs: also their inner dims
        self._constrain()
        self.size = self.dims.sizes(rng)
        self.bindings = self._generate()
        for name in sorted(P.exponents(rule.lhs)):  # ?p of ?a^(?p): one of a few exponents
            self.bindings[name] = T.num(_NUMBERS[rng.integers(len(_NUMBERS))])

    # -- flavours and run lengths

    def _decide(self, compound):
        rng = self.rng
        force_d, no_d, no_w, need_w = set(), set(), set(), set()
        for truth, pred, names in compound:
            if pred == "has_d":
                if truth:
                    force_d.add(names[int(rng.integers(len(names)))])
                else:
                    no_d.update(names)
            elif pred == "const":
                if truth:
                    no_w.update(names)
                else:
                    need_w.add(names[int(rng.integers(len(names)))])
        # runs that begin a product of the left side: only these can be bound to scalars alone
        # (a product keeps its scalars first, so a run after a matrix factor holds matrices)
        leading = {q.items[0].name for q in _walk(self.rule.lhs)
                   if isinstance(q, P.Word) and q.items and isinstance(q.items[0], P.Seq)}
        for name, need in self.needs.items():
            g = need.guards
            scalar = g.get("scalar") is True or need.scalar_arg
            self.scalar[name] = scalar
            want_d = g.get("has_d") is True or name in force_d
            avoid_d = g.get("has_d") is False or name in no_d
            if want_d and avoid_d:
                raise Reject("guards ask for and against a differential")
            avoid_w = g.get("const") is True or name in no_w
            want_w = g.get("const") is False or name in need_w or want_d
            literal = next((k for k in ("weight", "symbol", "number", "identity", "zero") if g.get(k)), None)
            if need.seq:
                lo, hi = 0, MAX_RUN
                if g.get("empty") is True:
                    hi = 0
                elif g.get("empty") is False or want_d or want_w:
                    lo = 1
                n = int(rng.integers(lo, hi + 1))
                self.lengths[name] = n
                if n and name in leading and not scalar and rng.random() < 0.25:
                    self.scalar_runs.add(name)
                items = [self._flavour(None, avoid_d, avoid_w, False, False) for _ in range(n)]
                if n and (want_d or want_w):
                    items[int(rng.integers(n))] = "form" if want_d else "weighty"
                self.flavours[name] = items
            else:
                self.flavours[name] = self._flavour(literal, avoid_d, avoid_w, want_d, want_w, need.under_d)
                if need.positive:
                    if self.flavours[name] not in ("const", "weighty"):
                        raise Reject("?%s must be positive, and a %s is not" % (name, self.flavours[name]))
                    self.flavours[name] = "positive " + self.flavours[name]
                if g.get("named"):
                    self.flavours[name] = ("named", self.flavours[name])

    def _flavour(self, literal, avoid_d, avoid_w, want_d, want_w, under_d=False):
        if literal is not None:
            return literal
        if want_d:
            return "form"
        if want_w:
            return "weighty"
        if avoid_w:
            return "const"
        # unconstrained: mostly terms with a real derivative, sometimes constants
        return "weighty" if self.rng.random() < (0.9 if under_d else 0.7) else "const"

    # -- shapes

    def _constrain(self):
        dims = self.dims
        for name, need in self.needs.items():
            if self.scalar[name]:
                r = c = self.one
            else:
                r, c = dims.new(), dims.new()
            inner = []
            if name in self.scalar_runs:
                dims.union(r, c)  # scalars where a square matrix stands: c I
            elif need.seq and need.context == "mul" and not self.scalar[name]:
                n = self.lengths[name]
                chain = [r] + [dims.new() for _ in range(n - 1)] + [c] if n else [r, c]
                if n == 0:
                    dims.union(r, c)  # an empty run of factors is the identity
                inner = chain
            flav = self.flavours[name]
            if flav == "identity" or (isinstance(flav, tuple) and flav[1] == "identity"):
                dims.union(r, c)
            self.shapes[name] = (r, c, inner)
        for p in [self.rule.lhs, self.rule.rhs] + [a for _, _, a in self.rule.guards]:
            self._shape(p)

    def _shape(self, p) -> Shape:
        dims = self.dims
        if isinstance(p, (P.Var, P.Seq)):
            if p.name not in self.shapes:  # ?p, an exponent standing as a factor: a number
                return Shape(self.one, self.one, True)
            r, c, _ = self.shapes[p.name]
            return Shape(r, c, self.scalar[p.name])
        if isinstance(p, P.Num):
            return Shape(self.one, self.one, True)
        if isinstance(p, P.Op):
            args = [self._shape(a) for a in p.args]
            if p.op == "t":
                return Shape(args[0].cols, args[0].rows, args[0].scalar)
            if p.op == "trace":
                dims.union(args[0].rows, args[0].cols)
                return Shape(self.one, self.one, True)
            if p.op == "pow":
                if not args[0].scalar:
                    raise Reject("a power of a matrix")
                return Shape(self.one, self.one, True)
            if p.op in ("onescol", "onesrow", "cols"):
                width = args[0].cols
                return {"onescol": Shape(width, self.one), "onesrow": Shape(self.one, width),
                        "cols": Shape(self.one, self.one, True)}[p.op]
            if p.op == "eyerows":
                return Shape(args[0].rows, args[0].rows)
            if O.OPS[p.op].rows:  # a row reduction: (n x d) -> (n x 1)
                return Shape(args[0].rows, self.one, args[0].scalar)
            for a in args[1:]:  # d, m, a, let, mm, aa, div and the elementwise operators: one shape
                dims.union(args[0].rows, a.rows)
                dims.union(args[0].cols, a.cols)
            return Shape(args[0].rows, args[0].cols, all(a.scalar for a in args))
        if isinstance(p, P.Word):
            shapes = [self._shape(i) for i in p.items]
            mats = [s for s in shapes if not s.scalar]
            for x, y in zip(mats, mats[1:]):
                dims.union(x.cols, y.rows)
            if not mats:
                return Shape(self.one, self.one, True)
            return Shape(mats[0].rows, mats[-1].cols, False)
        if isinstance(p, P.Bag):
            shapes = [self._shape(i) for i in p.items]
            for s in shapes[1:]:
                dims.union(shapes[0].rows, s.rows)
                dims.union(shapes[0].cols, s.cols)
            return Shape(shapes[0].rows, shapes[0].cols, all(s.scalar for s in shapes))
        raise TypeError(p)

    # -- terms

    def _generate(self) -> dict:
        b = {}
        for name, need in self.needs.items():
            r, c, inner = self.shapes[name]
            rows, cols = self.size[r], self.size[c]
            scalar = self.scalar[name]
            if not need.seq:
                b[name] = self.term(self.flavours[name], rows, cols, scalar)
                continue
            flavours = self.flavours[name]
            if need.context == "mul":
                if scalar or name in self.scalar_runs:  # bound as the engine binds them: unit 1
                    items = [self.term(f, 1, 1, True) for f in flavours]
                    unit = T.ONE
                else:
                    sizes = [self.size[d] for d in inner]
                    items = [self.term(f, sizes[i], sizes[i + 1], False) for i, f in enumerate(flavours)]
                    unit = T.eye(rows)
                b[name] = P.Run("mul", tuple(items), unit)
            else:
                items = [self.term(f, rows, cols, scalar) for f in flavours]
                unit = T.zero((rows, cols)) if need.context in ("add", "arg") else None
                b[name] = P.Run("add" if need.context == "arg" else need.context, tuple(items), unit)
        return b

    def symbol(self, kind: str, rows: int, cols: int, scalar_weight: bool = False) -> Term:
        prefix = {"const": "C", "weight": "g" if scalar_weight else "W", "scalar": "s"}[kind]
        self.counter[prefix] += 1
        name = "%s%d" % (prefix, self.counter[prefix])
        shape = (1, 1) if kind == "scalar" or scalar_weight else (rows, cols)
        self.values[name] = self.rng.standard_normal(shape)
        if kind == "weight":
            self.weights.append(name)
        return T.sym(Symbol(name, (), kind, None, scalar_weight), shape)

    def _k(self) -> int:
        return int(self.rng.choice(SIZES))

    def term(self, flavour, rows: int, cols: int, scalar: bool) -> Term:
        """A random term of the flavour and shape."""
        rng = self.rng
        if isinstance(flavour, tuple):  # ("named", inner flavour)
            self.counter["N"] += 1
            return T.let("N%d" % self.counter["N"], (), self.term(flavour[1], rows, cols, scalar))
        C = lambda r, c: self.symbol("const", r, c)
        W = lambda r, c: self.symbol("weight", r, c)
        if flavour == "number":
            return T.num(_NUMBERS[int(rng.integers(len(_NUMBERS)))])
        if flavour == "zero":
            return T.ZERO if scalar else T.zero((rows, cols))
        if flavour == "identity":
            if scalar:
                return T.ONE
            return T.eye(rows)
        if flavour in ("weight", "symbol"):
            if scalar:  # a scalar weight (weight g : scalar), or a declared scalar
                if flavour == "weight" or rng.random() < 0.5:
                    return self.symbol("weight", 1, 1, scalar_weight=True)
                return self.symbol("scalar", 1, 1)
            kind = "weight" if flavour == "weight" or rng.random() < 0.5 else "const"
            return self.symbol(kind, rows, cols)
        if flavour.startswith("positive "):  # for log, sqrt and divisors: entries > 0
            inner = self.term(flavour[len("positive "):], rows, cols, scalar)
            if scalar or rng.random() < 0.5:
                return T.make("exp", (inner,))
            return T.add(T.mul(inner, inner) if inner.scalar else T.hadamard(inner, inner), T.num(Fraction(1, 2)))
        if scalar:
            k, l = self._k(), self._k()
            choice = int(rng.integers(3))
            tr = lambda x: T.make("trace", (x,))
            if flavour == "const":
                return (lambda: T.num(_NUMBERS[int(rng.integers(len(_NUMBERS)))]),
                        lambda: self.symbol("scalar", 1, 1),
                        lambda: tr(T.mul(C(k, l), C(l, k))))[choice]()
            if flavour == "weighty":
                if rng.random() < 0.25:  # a scalar weight
                    return T.mul(self.symbol("weight", 1, 1, scalar_weight=True), tr(C(k, k)))
                return (lambda: tr(W(k, k)),
                        lambda: tr(T.mul(C(k, l), T.make("m", (W(l, k),)))),
                        lambda: T.mul(self.symbol("scalar", 1, 1), tr(T.make("a", (W(k, k),)))))[choice]()
            if flavour == "form":
                if rng.random() < 0.25:  # the differential of a scalar weight
                    return T.mul(tr(C(k, k)), T.d(self.symbol("weight", 1, 1, scalar_weight=True)))
                return (lambda: tr(T.mul(C(k, l), T.d(W(l, k)))),
                        lambda: tr(T.d(W(k, k))),
                        lambda: tr(T.mul(C(k, l), T.d(T.make("m", (W(l, k),))))))[choice]()
            raise AssertionError(flavour)
        if flavour == "const":
            choice = int(rng.integers(3))
            if choice == 0:
                return C(rows, cols)
            if choice == 1:
                k = self._k()
                return T.mul(C(rows, k), C(k, cols))
            return T.transpose(C(cols, rows))
        if flavour == "weighty":
            choice = int(rng.integers(6))
            k = self._k()
            return (lambda: W(rows, cols),
                    lambda: T.mul(C(rows, k), W(k, cols)),
                    lambda: T.make("m", (T.add(W(rows, cols), C(rows, cols)),)),
                    lambda: T.make("a", (W(rows, cols),)),
                    lambda: T.hadamard(W(rows, cols), C(rows, cols)),
                    lambda: T.transpose(W(cols, rows)))[choice]()
        if flavour == "form":
            choice = int(rng.integers(6))
            k = self._k()
            return (lambda: T.d(W(rows, cols)),
                    lambda: T.mul(C(rows, k), T.d(W(k, cols))),
                    lambda: T.make("mm", (C(rows, cols), T.d(W(rows, cols)))),
                    lambda: T.make("aa", (C(rows, cols), T.d(W(rows, cols)))),
                    lambda: T.transpose(T.d(W(cols, rows))),
                    lambda: T.d(self.term("weighty", rows, cols, False)))[choice]()
        raise AssertionError(flavour)

    def tangent(self) -> dict:
        return {name: self.rng.standard_normal(self.values[name].shape) for name in self.weights}

    def describe(self) -> str:
        parts = []
        for name, v in self.bindings.items():
            if isinstance(v, P.Run):
                parts.append("?%s... = [%s]" % (name, ", ".join(text(i) for i in v.items)))
            else:
                parts.append("?%s = %s" % (name, text(v)))
        sizes = ", ".join("%s: %s" % (n, "x".join(map(str, a.shape))) for n, a in self.values.items())
        return "%s  (sizes %s)" % ("; ".join(parts), sizes or "none")


# ---- checking a rule ------------------------------------------------------------------------------


def _named(p):
    """The pattern with a name on each let(...) it builds (the parser leaves let patterns unnamed,
    which matches any name but prints as nothing)."""
    if isinstance(p, P.Op):
        data = p.data if p.op != "let" or p.data is not None else ("N", ())
        return P.Op(p.op, tuple(_named(a) for a in p.args), data)
    if isinstance(p, P.Word):
        return P.Word(tuple(_named(a) for a in p.items))
    if isinstance(p, P.Bag):
        return P.Bag(p.op, tuple(_named(a) for a in p.items))
    return p


def relative_difference(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    scale = max(np.linalg.norm(a), np.linalg.norm(b), FLOOR)
    return float(np.linalg.norm(a - b) / scale)


@dataclass
class Verdict:
    rule: Rule
    status: str  # sound | UNSOUND | skipped
    trials: int = 0
    worst: float = 0.0
    reason: str = ""  # why skipped, or the counterexample

    def line(self) -> str:
        where = "%s:%d" % (self.rule.file, self.rule.line)
        if self.status == "skipped":
            detail = "skipped: %s" % self.reason
        else:
            detail = "%2d trials  max rel diff %.1e" % (self.trials, self.worst)
        return "%-8s %-18s %-26s %s" % (self.status, self.rule.name, where, detail)


def _trial(rule: Rule, needs, compound, rng) -> float:
    """One instance: the largest relative difference between the left side and the right side
    (and the engine's rewrite of the left side). Raises Reject or Unsound."""
    inst = Instance(rule, needs, compound, rng)
    b = inst.bindings
    try:
        lhs = P.build(_named(rule.lhs), b)
    except (ShapeError, ValueError) as e:
        raise Reject("the left side cannot be built: %s" % e)
    if next(P.match(rule.lhs, lhs, {}), None) is None:
        # e.g. an empty run left a sum of one summand: the engine never sees this term as an
        # instance of the rule, so it says nothing about the rule
        raise Reject("the left side built is not an instance of the pattern")
    for negated, pred, arg in rule.guards:
        try:
            holds = PREDICATES[pred][0](guard_value(arg, b))
        except (ShapeError, ValueError) as e:
            raise Reject("a guard cannot be evaluated: %s" % e)
        if holds == negated:
            raise Reject("the random instances do not meet the guard %s%s(%s)"
                         % ("not " if negated else "", pred, arg))
    try:
        rhs = P.build(_named(rule.rhs), b)
    except ValueError as e:
        raise Reject("the right side cannot be built: %s" % e)
    except ShapeError as e:
        raise Unsound("the right side is ill-shaped for %s: %s" % (inst.describe(), e))
    if T.is_zero(rhs) and rhs.shape != lhs.shape:
        rhs = T.zero(lhs.shape)  # a right side "0" takes the shape of what it replaces (as the engine)
    if rhs.shape != lhs.shape:
        raise Unsound("the right side has shape %s, the left %s, for %s"
                      % (O.shape_str(rhs.shape), O.shape_str(lhs.shape), inst.describe()))
    try:
        engine = rule.apply(lhs)
    except FdslError as e:
        raise Unsound("the engine refused: %s" % e.message)
    tangent = inst.tangent()
    left, right, rewritten = _evaluate(inst, tangent, STEP, lhs, rhs, engine)
    diff = relative_difference(left, right)
    if diff > TOLERANCE or relative_difference(left, rewritten) > TOLERANCE:
        # a function that bends sharply at this point (layer norm of a row of nearly equal
        # entries) is beyond the step's truncation error: a sound rule agrees at a finer step,
        # an unsound one stays off by O(1)
        left, right, rewritten = _evaluate(inst, tangent, STEP / 16, lhs, rhs, engine)
        diff = relative_difference(left, right)
    if diff > TOLERANCE:
        raise Unsound("for %s: left side %s = %s, right side %s = %s (relative difference %.2g)"
                      % (inst.describe(), text(lhs), _numbers(left), text(rhs), _numbers(right), diff), diff)
    diff_engine = relative_difference(left, rewritten)
    if diff_engine > TOLERANCE:
        raise Unsound("for %s: the engine rewrote %s = %s to %s = %s (relative difference %.2g)"
                      % (inst.describe(), text(lhs), _numbers(left), text(engine), _numbers(rewritten),
                         diff_engine), diff_engine)
    return max(diff, diff_engine)


def _evaluate(inst, tangent, step, *terms):
    """The values of ``terms`` (None: the first one's again) with d along ``tangent`` by finite
    differences of ``step``."""
    from ..numbers.numpy_eval import Evaluator, NonFinite, NotDifferentiable

    ev = Evaluator(inst.values, {}, tangent=tangent, step=step)
    try:
        values = [ev.value(t) if t is not None else None for t in terms]
    except NotDifferentiable:
        raise Reject("the finite differences cross a kink of relu")
    except NonFinite as e:  # values outside an operator's domain: draw others (and say so if none fit)
        raise Reject("%s; an operator defined for positive entries only says so: operator f(A) ... "
                     "domain A positive" % e.message)
    except FloatingPointError as e:
        raise Reject("floating point: %s" % e)
    return [v if v is not None else values[0] for v in values]


def _numbers(a) -> str:
    return np.array2string(np.asarray(a), precision=4, max_line_width=200).replace("\n", "")


def check_rule(rule: Rule, trials: int = 20, seed: int = 0) -> Verdict:
    """Check one rule on ``trials`` random instances."""
    rng = np.random.default_rng([seed, _stable_hash(rule.name)])
    try:
        _static_check(rule)
        needs = _needs(rule)
    except Skip as e:
        return Verdict(rule, "skipped", reason=str(e))
    compound = _compound_guards(rule)
    done, worst, rejected = 0, 0.0, Counter()
    attempts = 0
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        while done < trials and attempts < trials * ATTEMPTS_PER_TRIAL:
            attempts += 1
            try:
                diff = _trial(rule, needs, compound, rng)
            except Reject as e:
                rejected[str(e)] += 1
                continue
            except Unsound as e:
                return Verdict(rule, "UNSOUND", done + 1, e.diff, str(e))
            done += 1
            worst = max(worst, diff)
    if done == 0:
        reason, _ = rejected.most_common(1)[0]
        return Verdict(rule, "skipped", reason="no instance in %d attempts: %s" % (attempts, reason))
    return Verdict(rule, "sound", done, worst)


# ---- on load: a user's rule file is checked as it is read --------------------------------------

LOAD_TRIALS = 20  # as fdsl rules --check: a rule of the stdlib's kind costs about 10 ms
# Distinct rules (the same sides and guards under another name count once) checked per load: about
# 2 s at most for ordinary rules; a file with more says which it left unchecked. Each rule's own
# work is bounded too (LOAD_TRIALS * ATTEMPTS_PER_TRIAL instances at most).
MAX_CHECKED_ON_LOAD = 200
_LOADED: dict = {}  # sha256 of the user files' contents -> the note of a load that passed


def check_loaded(rules, key: str) -> Optional[str]:
    """Hold rules just loaded from a user's file (``fdsl.lang.rules.RuleBook.load``): an FdslError
    at the first unsound one, naming the instance on which its two sides differ; else a note for the
    rules left unchecked (none could be generated, or beyond MAX_CHECKED_ON_LOAD), or None. ``key``
    is the digest of the files' contents: the same files pass again without a second check."""
    if key in _LOADED:
        return _LOADED[key]
    seen, skipped, beyond = set(), [], []
    for rule in rules:
        sides = (str(rule.lhs), str(rule.rhs), tuple(str(g) for g in rule.guards))
        if sides in seen:
            continue
        if len(seen) >= MAX_CHECKED_ON_LOAD:
            beyond.append(rule)
            continue
        seen.add(sides)
        verdict = check_rule(rule, LOAD_TRIALS)
        if verdict.status == "UNSOUND":
            raise FdslError("rule %s is unsound: %s. Fix the rule, or load the file "
                            "with --unchecked (unchecked=True in the API, :check off in the repl) to use "
                            "it as it is" % (rule.name, verdict.reason), rule.file, rule.line, rule.col or None)
        if verdict.status == "skipped":
            skipped.append(rule)
    notes = []
    if skipped:
        notes.append("%d rule%s could not be checked numerically (%s): fdsl rules --check %s says why"
                     % (len(skipped), "" if len(skipped) == 1 else "s", ", ".join(r.name for r in skipped[:5])
                        + (", ..." if len(skipped) > 5 else ""), skipped[0].file))
    if beyond:
        notes.append("%d rules were not checked numerically, beyond the %d distinct rules checked when a file "
                     "is loaded (the first is %s at %s): fdsl rules --check %s checks them all"
                     % (len(beyond), MAX_CHECKED_ON_LOAD, beyond[0].name, beyond[0].where(), beyond[0].file))
    note = "note: " + "; ".join(notes) if notes else None
    _LOADED[key] = note
    return note


def _stable_hash(name: str) -> int:
    import zlib

    return zlib.crc32(name.encode())


def rules_to_check(program, files) -> list:
    """The rules of ``files`` loaded on top of the stdlib (default: the stdlib's own rules)."""
    book = program.rulebook
    before = set(book.rule_names)
    if files:
        loaded = set(book.files)
        book.load(*[Path(f) for f in files], checked=False)  # (checked below, every rule, with a verdict each)
        # a file the stdlib loaded already (fdsl rules --check stdlib/d.rules) is checked all the same
        again = {str(Path(f).resolve()) for f in files} & loaded
        return [r for n, r in book.rule_names.items() if n not in before or _rule_file(r) in again]
    return list(book.rule_names.values())


def _rule_file(rule) -> str:
    """The resolved path of the file ``rule`` was read from (``rule.file`` shows stdlib files as
    stdlib/NAME)."""
    from ..base.resources import stdlib_dir

    if rule.file.startswith("stdlib/"):
        return str((stdlib_dir() / rule.file[len("stdlib/"):]).resolve())
    return str(Path(rule.file).resolve())


def check(files=(), trials: int = 20, seed: int = 0, out=None) -> int:
    """Check the rules and print a verdict per rule and a summary; 1 if any is unsound, else 0."""
    from ..lang.program import Program

    out = out or sys.stdout
    program = Program("<rules --check>")
    rules = rules_to_check(program, files)
    verdicts = [check_rule(r, trials, seed) for r in rules]
    for v in verdicts:
        say(v.line(), out)
    bad = [v for v in verdicts if v.status == "UNSOUND"]
    skipped = [v for v in verdicts if v.status == "skipped"]
    for v in bad:
        say("\nUNSOUND %s (%s:%d): %s\n  %s" % (v.rule.name, v.rule.file, v.rule.line, v.rule, v.reason), out)
    checked = [v for v in verdicts if v.status != "skipped"]
    out.write("\n%d rules: %d sound, %d UNSOUND, %d skipped; up to %d random trials per rule, largest "
              "relative difference of a sound rule %.1e (tolerance %.0e)\n"
              % (len(verdicts), len(checked) - len(bad), len(bad), len(skipped), trials,
                 max((v.worst for v in checked if v.status == "sound"), default=0.0), TOLERANCE))
    return 1 if bad else 0
