"""Patterns: the left and right sides of rules, matching, and building from bindings.

Vocabulary
----------
Var      ``?A``: matches one subterm; a variable used twice must match the same term twice.
Seq      ``?A...``: a (possibly empty) run of factors of a product, or of summands of a sum.
         Bound to a ``Run``: the items and the unit that stands for the empty run (the identity
         matrix of the boundary size in a product, the zero matrix of the sum's shape in a sum).
Op       an operator applied to argument patterns: ``d(?A)``, ``mm(?X, ?B)``, ``?A^t``.
Word     a product pattern: matched against the factors of a product, left to right
         (products are associative: ``A B C`` is one flat word).
Bag      a sum or Hadamard pattern: matched against the operands in any order (associative and
         commutative); at most one Seq, which takes the operands the other elements leave.
Num      a number.
bindings a dict from variable name to a Term (Var) or a Run (Seq).

A Word or Bag also matches a term that is not a product (or sum) as a one-letter word, when the
pattern has exactly one element that is not a Seq and that element is an operator pattern:
``trace(?P... mm(?X, ?B) ?S...)`` matches ``trace(mm(X, d(Y)))``. A pattern whose only fixed
element is a bare variable (``d(?A ?B...)``) needs a real product: otherwise every term would be
a product of itself and nothing, and the rule would rewrite forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Iterator

from . import terms as T
from .terms import Term


@dataclass(frozen=True)
class Var:
    name: str

    def __str__(self):
        return "?" + self.name


@dataclass(frozen=True)
class Seq:
    name: str

    def __str__(self):
        return "?%s..." % self.name


@dataclass(frozen=True)
class Op:
    op: str
    args: tuple
    data: object = None  # the exponent of a power

    def __str__(self):
        if self.op == "t":
            return "%s^t" % _atom(self.args[0])
        if self.op == "pow":
            return "%s^(%s)" % (_atom(self.args[0]), self.data)
        return "%s(%s)" % (self.op, ", ".join(map(str, self.args)))


@dataclass(frozen=True)
class Word:
    items: tuple

    def __str__(self):
        return " ".join(_atom(i) if isinstance(i, Bag) else str(i) for i in self.items)


@dataclass(frozen=True)
class Bag:
    op: str  # add | had
    items: tuple

    def __str__(self):
        return (" + " if self.op == "add" else " * ").join(map(str, self.items))


@dataclass(frozen=True)
class Num:
    value: Fraction

    def __str__(self):
        return str(self.value)


def _atom(p):
    return str(p) if isinstance(p, (Var, Seq, Op, Num)) else "(%s)" % p


@dataclass(frozen=True)
class Run:
    """What a Seq is bound to: a run of factors (kind "mul") or summands (kind "add"/"had")."""

    kind: str
    items: tuple
    unit: object  # the Term that stands for the empty run (None for Hadamard: no unit term)

    def term(self) -> Term:
        """The run as one term: its product (or sum), or the unit when it is empty."""
        if not self.items:
            if self.unit is None:
                raise ValueError("an empty run of a Hadamard product has no value")
            return self.unit
        return {"mul": T.mul, "add": T.add, "had": T.hadamard}[self.kind](*self.items)


def variables(p) -> set:
    """Every variable name in a pattern, with its kind: {("A", Var), ("B", Seq)}."""
    out = set()
    stack = [p]
    while stack:
        q = stack.pop()
        if isinstance(q, (Var, Seq)):
            out.add((q.name, type(q)))
        elif isinstance(q, Op):
            stack.extend(q.args)
        elif isinstance(q, (Word, Bag)):
            stack.extend(q.items)
    return out


def heads(p) -> set:
    """The operators a term must have at its root to possibly match ``p`` (None: any)."""
    if isinstance(p, Op):
        return {p.op}
    if isinstance(p, Num):
        return {"num"}
    if isinstance(p, (Word, Bag)):
        own = "mul" if isinstance(p, Word) else p.op
        single = _single_fixed(p)
        return {own} | (heads(single) if single is not None else set())
    return None  # a bare variable matches anything


def _single_fixed(p):
    """The one non-Seq element of a Word or sum if it may match a non-product term alone.
    (Hadamard products have no unit term, so their patterns need a real Hadamard product.)"""
    if isinstance(p, Bag) and p.op != "add":
        return None
    fixed = [i for i in p.items if not isinstance(i, Seq)]
    if len(fixed) == 1 and isinstance(fixed[0], (Op, Num)):
        return fixed[0]
    return None


# ---- matching ----------------------------------------------------------------------------------


def match(p, t: Term, b: dict) -> Iterator[dict]:
    """Every way ``t`` matches ``p`` extending bindings ``b``."""
    if isinstance(p, Var):
        bound = b.get(p.name)
        if bound is None:
            nb = dict(b)
            nb[p.name] = t
            yield nb
        elif bound is t:
            yield b
        return
    if isinstance(p, Op):
        if t.op != p.op or len(t.args) != len(p.args) or (p.data is not None and t.data != p.data):
            return
        yield from _match_args(p.args, t.args, 0, b)
        return
    if isinstance(p, Num):
        if t.op == "num" and t.data == p.value:
            yield b
        return
    if isinstance(p, Word):
        if t.op == "mul":
            word = t.args
        elif _single_fixed(p) is not None:
            word = (t,)
        else:
            return
        yield from _match_word(p.items, 0, word, 0, b, _Bounds(word))
        return
    if isinstance(p, Bag):
        if t.op == p.op:
            operands = t.args
        elif _single_fixed(p) is not None:
            operands = (t,)
        else:
            return
        yield from _match_bag(p, operands, t, b)
        return
    raise TypeError("not a pattern: %r" % (p,))


def _match_args(ps, ts, i, b):
    if i == len(ps):
        yield b
        return
    for nb in match(ps[i], ts[i], b):
        yield from _match_args(ps, ts, i + 1, nb)


class _Bounds:
    """The size between consecutive factors of a word: what an empty run there stands for."""

    def __init__(self, word):
        self.word = word

    def unit(self, j: int) -> Term:
        # cols of the last matrix factor before position j, else rows of the first one after it
        for f in reversed(self.word[:j]):
            if not f.scalar:
                return T.eye(f.shape[1])
        for f in self.word[j:]:
            if not f.scalar:
                return T.eye(f.shape[0])
        return T.ONE


def _match_word(items, i, word, j, b, bounds):
    n = len(word)
    if i == len(items):
        if j == n:
            yield b
        return
    p = items[i]
    if isinstance(p, Seq):
        rest_fixed = sum(1 for q in items[i + 1:] if not isinstance(q, Seq))
        bound = b.get(p.name)
        if bound is not None:
            k = len(bound.items)
            if tuple(word[j:j + k]) == bound.items and bound.kind == "mul":
                yield from _match_word(items, i + 1, word, j + k, b, bounds)
            return
        for k in range(0, n - j - rest_fixed + 1):
            nb = dict(b)
            nb[p.name] = Run("mul", tuple(word[j:j + k]), bounds.unit(j) if k == 0 else T.ONE)
            yield from _match_word(items, i + 1, word, j + k, nb, bounds)
        return
    if j >= n:
        return
    for nb in match(p, word[j], b):
        yield from _match_word(items, i + 1, word, j + 1, nb, bounds)


def _match_bag(p: Bag, operands, t: Term, b):
    fixed = [q for q in p.items if not isinstance(q, Seq)]
    seqs = [q for q in p.items if isinstance(q, Seq)]
    if len(fixed) > len(operands) or (not seqs and len(fixed) != len(operands)):
        return

    def assign(k, used, b):
        if k == len(fixed):
            rest = tuple(o for idx, o in enumerate(operands) if idx not in used)
            if not seqs:
                yield b
                return
            s = seqs[0]
            bound = b.get(s.name)
            if bound is not None:
                if bound.items == rest:
                    yield b
                return
            nb = dict(b)
            nb[s.name] = Run(p.op, rest, T.zero(t.shape) if p.op == "add" else None)
            yield nb
            return
        for idx, o in enumerate(operands):
            if idx in used:
                continue
            for nb in match(fixed[k], o, b):
                yield from assign(k + 1, used | {idx}, nb)

    yield from assign(0, frozenset(), b)


# ---- building ----------------------------------------------------------------------------------


def build(p, b: dict) -> Term:
    """The term a right-hand side pattern stands for under bindings ``b``."""
    if isinstance(p, Var):
        v = b[p.name]
        return v.term() if isinstance(v, Run) else v
    if isinstance(p, Seq):
        return b[p.name].term()
    if isinstance(p, Num):
        return T.num(p.value)
    if isinstance(p, Op):
        return T.make(p.op, [build(a, b) for a in p.args], p.data)
    if isinstance(p, Word):
        return T.mul(*_splice(p.items, b, "mul"))
    if isinstance(p, Bag):
        ctor = T.add if p.op == "add" else T.hadamard
        return ctor(*_splice(p.items, b, p.op))
    raise TypeError("not a pattern: %r" % (p,))


def _splice(items, b, kind):
    out = []
    for q in items:
        v = b.get(q.name) if isinstance(q, (Var, Seq)) else None
        if isinstance(v, Run) and v.kind == kind:
            # a run spliced into the same kind of operator; an empty run contributes its unit
            out.extend(v.items or ((v.unit,) if v.unit is not None else ()))
        else:
            out.append(build(q, b))
    return out
