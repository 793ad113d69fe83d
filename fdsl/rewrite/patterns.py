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

from ..core import terms as T
from ..core.ops import shown as op_name
from ..core.terms import Term


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
class Exponent:
    """An exponent variable: ``?p`` in ``?a^(?p)`` binds the exponent of a power (to the number
    term ``p``, so ``?p`` also stands as a factor); ``?a^(?p - 1)`` on a right side shifts it."""

    name: str
    offset: Fraction = Fraction(0)

    def __str__(self):
        if not self.offset:
            return "?%s" % self.name
        return "?%s %s %s" % (self.name, "-" if self.offset < 0 else "+", abs(self.offset))

    def value(self, b: dict) -> Fraction:
        return Fraction(b[self.name].data) + self.offset


@dataclass(frozen=True)
class Op:
    op: str
    args: tuple
    data: object = None  # the exponent of a power

    def __str__(self):
        if self.op == "t":
            return "%s^t" % _atom(self.args[0])
        if self.op == "pow":
            return "%s^(%s)" % (_atom(self.args[0]), self.data)  # a number or an Exponent
        return "%s(%s)" % (op_name(self.op), ", ".join(map(str, self.args)))


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
            if isinstance(q.data, Exponent):
                out.add((q.data.name, Var))
        elif isinstance(q, (Word, Bag)):
            stack.extend(q.items)
    return out


def exponents(p) -> set:
    """The names of the exponent variables of a pattern (``?p`` of ``?a^(?p)``)."""
    out = set()
    stack = [p]
    while stack:
        q = stack.pop()
        if isinstance(q, Op):
            stack.extend(q.args)
            if isinstance(q.data, Exponent):
                out.add(q.data.name)
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


# ---- quick tests ---------------------------------------------------------------------------------
# A quick test is a cheap necessary condition for a term to match a pattern, checked before the
# full matcher (a generator that enumerates bindings) is started: the operator at the root, the
# number of arguments and factors, and for a word its first and last fixed letters (the letters
# before the first run and after the last one stand at fixed places) and the operators of the
# fixed letters between runs. Most rules tried at a node fail here, at the price of a few
# attribute reads; ``match`` is only run where the test passes.


def _always(t) -> bool:
    return True


def quick_test(p):
    """A function ``term -> bool`` that is False only for terms that cannot match ``p``."""
    if isinstance(p, (Var, Seq)):
        return _always
    if isinstance(p, Num):
        value = p.value
        return lambda t: t.op == "num" and t.data == value
    if isinstance(p, Op):
        op, n, data = p.op, len(p.args), p.data
        if isinstance(data, Exponent):
            data = None
        subs = tuple((i, quick_test(a)) for i, a in enumerate(p.args) if not isinstance(a, (Var, Seq)))
        if data is None and not subs:  # the usual case, d(?A), mm(?X, ?B): the operator is the test
            return lambda t: t.op == op and len(t.args) == n
        if data is None and len(subs) == 1:
            (i, f), = subs
            return lambda t: t.op == op and len(t.args) == n and f(t.args[i])

        def test(t):
            if t.op != op or len(t.args) != n or (data is not None and t.data != data):
                return False
            for i, f in subs:
                if not f(t.args[i]):
                    return False
            return True
        return test
    if isinstance(p, Word):
        return _word_test(p)
    if isinstance(p, Bag):
        return _bag_test(p)
    raise TypeError("not a pattern: %r" % (p,))


def _word_test(p: Word):
    items = p.items
    seq_at = [i for i, q in enumerate(items) if isinstance(q, Seq)]
    fixed = len(items) - len(seq_at)
    lone = _single_fixed(p) is not None  # may match a non-product as a one-letter word
    if not seq_at:
        heads_ = tuple(quick_test(q) for q in items)

        def test(t):
            word = t.args if t.op == "mul" else ((t,) if lone else None)
            return (word is not None and len(word) == fixed
                    and all(f(x) for f, x in zip(heads_, word)))
        return test
    first, last = seq_at[0], seq_at[-1]
    prefix = tuple(quick_test(q) for q in items[:first])
    suffix = tuple(quick_test(q) for q in items[last + 1:])
    # fixed letters between runs: some factor must pass their test (wherever it stands)
    middle = tuple(quick_test(q) for q in items[first:last] if not isinstance(q, (Seq, Var)))
    tail = len(suffix)

    def test(t):
        word = t.args if t.op == "mul" else ((t,) if lone else None)
        if word is None or len(word) < fixed:
            return False
        for f, x in zip(prefix, word):
            if not f(x):
                return False
        if tail:
            for f, x in zip(suffix, word[len(word) - tail:]):
                if not f(x):
                    return False
        for f in middle:
            for x in word:
                if f(x):
                    break
            else:
                return False
        return True
    return test


def _bag_test(p: Bag):
    op = p.op
    fixed = tuple(q for q in p.items if not isinstance(q, Seq))
    exact = len(fixed) == len(p.items)
    lone = _single_fixed(p) is not None
    tests = tuple(quick_test(q) for q in fixed if not isinstance(q, Var))
    n = len(fixed)

    def test(t):
        operands = t.args if t.op == op else ((t,) if lone else None)
        if operands is None or len(operands) < n or (exact and len(operands) != n):
            return False
        return all(any(f(o) for o in operands) for f in tests)
    return test


# ---- matching ----------------------------------------------------------------------------------
# Each pattern is compiled once into a matcher, kept on the pattern. A pattern that can match a
# term in at most one way (variables, numbers, operators over such patterns) gets a *single*
# matcher, ``(t, b) -> bindings or None``, that enumerates nothing; words and bags, which may
# match in several ways, get a generator of bindings.


def match(p, t: Term, b: dict) -> Iterator[dict]:
    """Every way ``t`` matches ``p`` extending bindings ``b``."""
    single, many = _matcher(p)
    if many is not None:
        yield from many(t, b)
        return
    nb = single(t, b)
    if nb is not None:
        yield nb


def matcher(p):
    """``match`` compiled for one pattern: a function ``(t, bindings) -> iterable of bindings``."""
    single, many = _matcher(p)
    if many is not None:
        return many

    def once(t, b):
        nb = single(t, b)
        return () if nb is None else (nb,)
    return once


def _matcher(p) -> tuple:
    """(single, None) for a pattern that matches in at most one way, else (None, many)."""
    m = p.__dict__.get("_matcher") if not isinstance(p, (Var, Seq)) else None
    if m is None:
        m = _compile(p)
        if not isinstance(p, (Var, Seq)):
            object.__setattr__(p, "_matcher", m)  # a cache beside the frozen fields (not part of ==)
    return m


def _compile(p) -> tuple:
    if isinstance(p, Var):
        name = p.name

        def var(t, b):
            bound = b.get(name)
            if bound is None:
                nb = dict(b)
                nb[name] = t
                return nb
            return b if bound is t else None
        return var, None
    if isinstance(p, Num):
        value = p.value
        return (lambda t, b: b if t.op == "num" and t.data == value else None), None
    if isinstance(p, Op):
        return _compile_op(p)
    if isinstance(p, Word):
        lone = _single_fixed(p) is not None
        special = _run_letter_run(p)
        if special is not None:
            return None, special

        def word_many(t, b):
            if t.op == "mul":
                word = t.args
            elif lone:
                word = (t,)
            else:
                return
            yield from _match_word(_word_plan(p), 0, word, 0, b, _Bounds(word))
        return None, word_many
    if isinstance(p, Bag):
        lone = _single_fixed(p) is not None

        def bag_many(t, b):
            if t.op == p.op:
                operands = t.args
            elif lone:
                operands = (t,)
            else:
                return
            yield from _match_bag(p, operands, t, b)
        return None, bag_many
    raise TypeError("not a pattern: %r" % (p,))


def _run_letter_run(p: Word):
    """The matcher of the commonest word, ``?P... X ?S...`` (X one letter, runs unbound), as one
    loop over where X stands instead of the general recursion; None for any other word."""
    items = p.items
    if not (len(items) == 3 and isinstance(items[0], Seq) and isinstance(items[2], Seq)
            and not isinstance(items[1], Seq) and items[0].name != items[2].name):
        return None
    pre, post = items[0].name, items[2].name
    letter = items[1]
    test = quick_test(letter)
    single, many = _matcher(letter)
    lone = _single_fixed(p) is not None

    def word_many(t, b):
        if t.op == "mul":
            word = t.args
        elif lone:
            word = (t,)
        else:
            return
        if pre in b or post in b:  # bound before (a variable used twice): the general matcher
            yield from _match_word(_word_plan(p), 0, word, 0, b, _Bounds(word))
            return
        n = len(word)
        bounds = None
        for j in range(n):
            x = word[j]
            if not test(x):
                continue
            found = (single(x, b),) if many is None else many(x, b)
            for nb in found:
                if nb is None:
                    continue
                if bounds is None:
                    bounds = _Bounds(word)
                nb = dict(nb)
                nb[pre] = Run("mul", word[:j], bounds.unit(j) if j == 0 else T.ONE)
                nb[post] = Run("mul", word[j + 1:], bounds.unit(j + 1) if j + 1 == n else T.ONE)
                yield nb
    return word_many


def _compile_op(p: Op) -> tuple:
    op, n, data = p.op, len(p.args), p.data
    if isinstance(data, Exponent):
        return _compile_exponent(p)
    subs = tuple(_matcher(a) for a in p.args)

    def fits(t):
        return t.op == op and len(t.args) == n and (data is None or t.data == data)

    if all(many is None for _, many in subs):
        singles = tuple(single for single, _ in subs)

        def op_single(t, b):
            if not fits(t):
                return None
            for f, x in zip(singles, t.args):
                b = f(x, b)
                if b is None:
                    return None
            return b
        return op_single, None

    def op_many(t, b):
        if fits(t):
            yield from _match_args(subs, t.args, 0, b)
    return None, op_many


def _compile_exponent(p: Op) -> tuple:
    """``?a^(?p)``: the power's base matched as usual, its exponent bound to ``?p`` (as a number
    term; equal to an earlier binding of ``?p``, if any)."""
    name = p.data.name
    inner = Op(p.op, p.args)  # the same pattern with any exponent
    single, many = _compile_op(inner)

    def bind(t, b):
        bound = b.get(name)
        if bound is None:
            nb = dict(b)
            nb[name] = T.num(t.data)
            return nb
        return b if bound.op == "num" and bound.data == t.data else None

    def exp_many(t, b):
        if t.op != p.op or len(t.args) != len(p.args):
            return
        for nb in (many(t, b) if many is not None else [x for x in [single(t, b)] if x is not None]):
            nb = bind(t, nb)
            if nb is not None:
                yield nb
    return None, exp_many


def _match_args(subs, ts, i, b):
    if i == len(subs):
        yield b
        return
    single, many = subs[i]
    if many is None:
        nb = single(ts[i], b)
        if nb is not None:
            yield from _match_args(subs, ts, i + 1, nb)
        return
    for nb in many(ts[i], b):
        yield from _match_args(subs, ts, i + 1, nb)


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


def _word_plan(p: Word) -> tuple:
    """Per item of a word pattern: (the item, whether it is a run, its matcher, the quick test of
    the letter after it, how many fixed letters come after it, whether a run comes after it).
    Computed once per pattern and kept on it."""
    plan = p.__dict__.get("_plan")
    if plan is None:
        items = p.items
        plan = []
        for i, q in enumerate(items):
            later = items[i + 1:]
            nxt = later[0] if later and not isinstance(later[0], Seq) else None
            run = isinstance(q, Seq)
            plan.append((q, run, None if run else _matcher(q), quick_test(nxt) if nxt is not None else None,
                         sum(1 for r in later if not isinstance(r, Seq)),
                         any(isinstance(r, Seq) for r in later)))
        plan = tuple(plan)
        object.__setattr__(p, "_plan", plan)
    return plan


def _match_word(plan, i, word, j, b, bounds):
    n = len(word)
    if i == len(plan):
        if j == n:
            yield b
        return
    p, run, compiled, next_test, rest_fixed, run_later = plan[i]
    if run:
        bound = b.get(p.name)
        if bound is not None:
            k = len(bound.items)
            if bound.kind == "mul" and word[j:j + k] == bound.items:
                yield from _match_word(plan, i + 1, word, j + k, b, bounds)
            return
        # without a later run, the letters after this run fix its length; otherwise it may end
        # only where the next letter can match (the first fixed letter after the run)
        last = n - j - rest_fixed
        if last < 0:
            return
        if i + 1 == len(plan):  # a run at the end takes the rest of the word
            nb = dict(b)
            nb[p.name] = Run("mul", word[j:], bounds.unit(j) if j == n else T.ONE)
            yield nb
            return
        for k in ((last,) if not run_later else range(0, last + 1)):
            if next_test is not None and not next_test(word[j + k]):
                continue
            nb = dict(b)
            nb[p.name] = Run("mul", word[j:j + k], bounds.unit(j) if k == 0 else T.ONE)
            yield from _match_word(plan, i + 1, word, j + k, nb, bounds)
        return
    if j >= n:
        return
    single, many = compiled
    if many is None:
        nb = single(word[j], b)
        if nb is not None:
            yield from _match_word(plan, i + 1, word, j + 1, nb, bounds)
        return
    for nb in many(word[j], b):
        yield from _match_word(plan, i + 1, word, j + 1, nb, bounds)


def _match_bag(p: Bag, operands, t: Term, b):
    plan = p.__dict__.get("_plan")
    if plan is None:  # the fixed elements, their quick tests and matchers; the runs
        fixed = [q for q in p.items if not isinstance(q, Seq)]
        plan = (fixed, [quick_test(q) for q in fixed], [matcher(q) for q in fixed],
                [q for q in p.items if isinstance(q, Seq)])
        object.__setattr__(p, "_plan", plan)
    fixed, tests, matchers, seqs = plan
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
        test, match_k = tests[k], matchers[k]
        for idx, o in enumerate(operands):
            if idx in used or not test(o):
                continue
            for nb in match_k(o, b):
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
        if isinstance(p.data, Exponent):
            return T.power(build(p.args[0], b), p.data.value(b))
        return T.make(p.op, [build(a, b) for a in p.args], p.data)
    if isinstance(p, Word):
        return T.mul(*_splice(p.items, b, "mul"))
    if isinstance(p, Bag):
        ctor = T.add if p.op == "add" else T.hadamard
        return ctor(*_splice(p.items, b, p.op))
    raise TypeError("not a pattern: %r" % (p,))


def builder(p):
    """``build`` compiled for one right-hand side: a function ``bindings -> Term`` (the pattern is
    walked once, here, not at every rewrite)."""
    if isinstance(p, Var):
        name = p.name

        def var(b):
            v = b[name]
            return v.term() if v.__class__ is Run else v
        return var
    if isinstance(p, Seq):
        name = p.name
        return lambda b: b[name].term()
    if isinstance(p, Num):
        value = T.num(p.value)
        return lambda b: value
    if isinstance(p, Op):
        op, data, args = p.op, p.data, tuple(builder(a) for a in p.args)
        if isinstance(data, Exponent):
            (base,) = args
            return lambda b: T.power(base(b), data.value(b))
        if len(args) == 1:
            (only,) = args
            return lambda b: T.make(op, (only(b),), data)
        return lambda b: T.make(op, [f(b) for f in args], data)
    if isinstance(p, (Word, Bag)):
        kind = "mul" if isinstance(p, Word) else p.op
        ctor = {"mul": T.mul, "add": T.add, "had": T.hadamard}[kind]
        # per item: the name of a variable whose run is spliced in (runs of the same kind), or a builder
        parts = tuple((q.name if isinstance(q, (Var, Seq)) else None, builder(q)) for q in p.items)

        def splice(b):
            out = []
            for name, f in parts:
                v = b.get(name) if name is not None else None
                if v.__class__ is Run and v.kind == kind:
                    if v.items:
                        out.extend(v.items)
                    elif v.unit is not None:  # an empty run contributes its unit
                        out.append(v.unit)
                else:
                    out.append(f(b))
            return ctor(*out)
        return splice
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
