"""Sums of products written back as products of sums the sweep computes anyway (before the lowering).

Vocabulary
----------
summand      one term of a sum, as (its scalar factors, its matrix factors): ``-Q^t X^t H C`` is
             ((-1,), (Q^t, X^t, H, C)).
computed     a sum is computed when it is a node of the terms to lower (a forward's ``X V + C
             bv``), or the transpose of one: its summands, each transposed (``V^t X^t + bv^t
             C^t``), are that node's, in any order.
grounded     a factoring is grounded when every sum it leaves is computed: the factored term
             costs no product that the distributed sum did not, and saves the rest. Only
             grounded factorings are made; a sum that has none stays as it is.
linear op    a built-in operator of two arguments linear in the second (``aa``, ``mm``, the
             derivatives ``dgelu``, ``dlayernorm``, ...: ``OPS[op].linear == (1,)``): ``f(A, B_1)
             + f(A, B_2)`` is ``f(A, B_1 + B_2)``. Not a rule file's operator: its declared
             linearity says only that a zero there gives zero.

Why: the normal form distributes every product over every sum, so a bias, a rank-one ``C b``
added to a product, doubles the terms of each gradient it reaches: ``(X Q + C bq)^t aa(H, G O^t
(X V + C bv)^t) C`` is four products and two softmax backwards, ``Q^t X^t aa(H, G O^t V^t X^t)
C + Q^t X^t aa(H, G O^t bv^t C^t) C + bq^t C^t aa(...) C + ...``. ``factored`` finds them again:
a shared left or right factor is taken out, ``F R_1 + F R_2 = F (R_1 + R_2)``; summands that
share an end factor are grouped and the groups' results factored in turn (``A_1 B_1 + A_1 B_2 +
A_2 B_1 + A_2 B_2 = (A_1 + A_2)(B_1 + B_2)``); a linear operator takes a sum of its second
arguments; and the recursion ends at a computed sum. The layer norm's MLP gradient, ``S^t A + S^t
C b = S^t (A + C b)`` with ``A + C b`` the forward's, is the simplest case.
"""

from __future__ import annotations

from typing import Optional

from ..core import terms as T
from ..core.ops import OPS

_MOST = 256  # the most summands of one sum factored (a wider sum stays as it is: a bound on the work)


def _bag(terms) -> frozenset:
    """The multiset of ``terms`` (a sum's summands in any order)."""
    counts: dict = {}
    for t in terms:
        counts[t] = counts.get(t, 0) + 1
    return frozenset(counts.items())


def _flipped(f):
    """A factor transposed: ``V`` as ``V^t``, ``(X V + C bv)^t`` as ``X V + C bv``."""
    return f.args[0] if f.op == "t" else T.transpose(f)


def _transposed(t):
    """A summand transposed as the normal form spells it, with the transposes on its factors
    (``(X V)^t`` as ``V^t X^t``; a sum among them as ``(...)^t``)."""
    if t.scalar:
        return t
    if t.op == "mul":
        scalars = [f for f in t.args if f.scalar]
        return T.mul(*scalars, *(_flipped(f) for f in reversed([f for f in t.args if not f.scalar])))
    return _flipped(t)


def _split(t) -> tuple:
    """(scalar factors, matrix factors) of a summand (module doc)."""
    if t.op == "mul":
        return tuple(f for f in t.args if f.scalar), tuple(f for f in t.args if not f.scalar)
    return (), (t,)


def _linear(t) -> bool:
    """A built-in operator additive in its second argument (a rule file's declaration of
    linearity says only that a zero there gives zero, not that sums pass through)."""
    op = OPS.get(t.op)
    return op is not None and not op.user and op.arity == 2 and tuple(op.linear) == (1,)


class _Factoring:
    """The computed sums of the terms to lower, and the factorings found (memoised by bag)."""

    def __init__(self, order: list):
        self.sums: dict = {}  # bag of summands -> the computed sum (or its transpose)
        for n in order:
            if n.op == "add" and not n.scalar:
                self.sums.setdefault(_bag(n.args), n)
        for n in list(self.sums.values()):
            self.sums.setdefault(_bag(_transposed(a) for a in n.args), T.transpose(n))
        self.memo: dict = {}

    def whole(self, summands: list, computed: bool = True) -> Optional[T.Term]:
        """A grounded factoring of the sum of ``summands`` as one term, or None (module doc);
        ``computed`` false: not the computed sum itself (a sum of the terms being factored)."""
        if len(summands) == 1:
            return summands[0]
        key = _bag(summands)
        if computed and key in self.sums:
            return self.sums[key]
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = None  # a sum met again inside its own factoring has none
        found = self._find(summands) if len(summands) <= _MOST else None
        self.memo[key] = found
        return found

    def _find(self, summands: list) -> Optional[T.Term]:
        parts = [_split(s) for s in summands]
        scalars = {p[0] for p in parts}
        if len(scalars) != 1:
            return None  # summands of different scales: no factor is common to all of them
        scale = next(iter(scalars))
        mats = [p[1] for p in parts]
        plain = [T.mul(*m) for m in mats]
        found = self._linear_op(mats) or self._end_factor(mats) or self._grouped(mats)
        if found is None and scale:
            found = self.sums.get(_bag(plain))  # the scale outside a computed sum
        return None if found is None else T.mul(*scale, found)

    def _linear_op(self, mats) -> Optional[T.Term]:
        """f(A, B_1) + ... + f(A, B_k) as f(A, B_1 + ... + B_k), that sum grounded."""
        heads = [m[0] for m in mats if len(m) == 1]
        if len(heads) != len(mats):
            return None
        flipped = all(h.op == "t" for h in heads)  # f(A, B_1)^t + f(A, B_2)^t: the same, transposed
        if flipped:
            heads = [h.args[0] for h in heads]
        first = heads[0]
        if not all(_linear(h) for h in heads) or any(
                h.op != first.op or h.args[0] is not first.args[0] or h.data != first.data for h in heads):
            return None
        inner = self.whole([h.args[1] for h in heads])
        if inner is None:
            return None
        merged = T.renamed(first, (first.args[0], inner))
        return T.transpose(merged) if flipped else merged

    def _end_factor(self, mats) -> Optional[T.Term]:
        """F R_1 + ... + F R_k as F (R_1 + ... + R_k) (or with F on the right), that sum grounded."""
        for end in (0, -1):
            if all(len(m) >= 2 for m in mats) and all(m[end] is mats[0][end] for m in mats):
                rest = self.whole([T.mul(*(m[1:] if end == 0 else m[:-1])) for m in mats])
                if rest is not None:
                    return T.mul(mats[0][0], rest) if end == 0 else T.mul(rest, mats[0][-1])
        return None

    def _grouped(self, mats) -> Optional[T.Term]:
        """The summands grouped by an end factor, each group factored, and the groups' results
        factored in turn (module doc): the sum has fewer summands at each step, so this ends."""
        for end in (0, -1):
            groups: dict = {}
            for m in mats:
                groups.setdefault(m[end] if len(m) >= 2 else T.mul(*m), []).append(m)
            if len(groups) in (1, len(mats)):
                continue
            results = []
            for members in groups.values():
                r = self.whole([T.mul(*m) for m in members])
                if r is None:
                    break
                results.append(r)
            else:
                found = self.whole(results)
                if found is not None:
                    return found
        return None


def factored(order: list) -> dict:
    """Node -> the same node with every sum that has a grounded factoring (module doc) written as
    that product; where only some summands have one (they share an end factor, or a linear
    operator's first argument), those are written so and the others kept. ``order``: the terms to
    lower, children first."""
    factoring = _Factoring(order)
    out: dict = {}
    for n in order:
        args = tuple(out[a] for a in n.args)
        new = T.renamed(n, args) if args != n.args else n
        if new.op == "add" and not new.scalar and len(new.args) > 1:
            new = _factor_sum(new, factoring)
        out[n] = new
    return out


def _factor_sum(s, factoring: _Factoring):
    summands = list(s.args)
    if len(summands) > _MOST:
        return s
    whole = factoring.whole(summands, computed=False)
    if whole is not None:
        return whole
    for end in (0, -1):  # some summands alone: those sharing an end factor (or a linear op's A)
        groups: dict = {}
        for x in summands:
            scale, mats = _split(x)
            if len(mats) >= 2:
                key = (scale, mats[end])
            elif len(mats) == 1 and _linear(mats[0].args[0] if mats[0].op == "t" else mats[0]):
                head = mats[0].args[0] if mats[0].op == "t" else mats[0]
                key = (scale, mats[0].op, head.op, head.args[0])
            else:
                continue
            groups.setdefault(key, []).append(x)
        for members in groups.values():
            if len(members) < 2:
                continue
            product = factoring.whole(members)
            if product is not None:
                kept = [x for x in summands if not any(x is m for m in members)]
                return _factor_sum(T.add(*kept, product), factoring) if kept else product
    return s
