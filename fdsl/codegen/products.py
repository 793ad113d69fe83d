"""The products of the lowering: words, chain order, shared sub-words (a part of ``Lowering``).

Vocabulary
----------
ref          how a term is read from the sweep's values (``_Ref``): a value, transposed or not;
             a scalar term is a scalar operand (a float, a scalar value, a dim's size).
word         the matrix factors of a product as (base, transposed) pairs (``canon``: a term's base
             and whether it is its transpose, let names looked through); its scalar factors stand
             apart and are multiplied in last, into the smallest of the two operands of the last
             multiplication or its result.
sub-word     a contiguous run of a word, shared between products up to transposition.
chain order  a product bracketed by dynamic programming on the numeric sizes (the matrix-chain
             problem), a sub-word already computed costing nothing and one that k products
             contain 1/k of its work.

``Products`` is a mixin of ``fdsl.codegen.lowering.Lowering``: the state it reads (``refs``,
``avail``, ``counts``, ``order``, the target) is the lowering's; see that module's doc.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from ..core.terms import Term
from .ir import Op, Read


class _Ref(NamedTuple):
    var: object  # a Value; for a constant scalar, a float or a Dim
    flip: bool = False  # the term is the transpose of the value
    scalar: bool = False

    def read(self, scale: tuple = ()) -> Read:
        """The IR read of this ref (a matrix), times ``scale``."""
        return Read(self.var, self.flip, tuple(scale))

    def t(self) -> "_Ref":
        return self if self.scalar else _Ref(self.var, not self.flip, False)


def _turned(word) -> list:
    """The word of the transpose: reversed, each factor transposed."""
    return [(x, not f) for x, f in reversed(word)]


def canon(t: Term) -> tuple:
    """(base, transposed): ``t`` is the base, or its transpose, with let names looked through."""
    flip = False
    while t.op in ("t", "let"):
        if t.op == "t":
            flip = not flip
        t = t.args[0]
    return t, flip


class Products:
    """The products of a ``Lowering``: their words, the chain order of each and the sub-words they
    share (see the lowering's module doc). A mixin: the state it reads is the lowering's."""

    # -- words of products

    def _word(self, b: Term) -> tuple:
        """(numeric coefficient, scalar factors, matrix word) of a product. A factor that is the
        transpose of a product is written out, ``(Z K)^t`` as ``K^t Z^t``: both spellings of
        ``Z Q (Z K)^t`` are then one word, computed once (a let's product stays one factor: its
        value is the let's)."""
        coeff = 1.0
        scalars, word = [], []

        def factors(f: Term, flip: bool) -> list:
            nonlocal coeff
            if f.scalar:
                c = self.const_scalar(f)
                if c is not None:
                    coeff *= c
                else:
                    scalars.append(f)
                return []
            if f.op == "t" and f.args[0].op in ("t", "mul"):
                return factors(f.args[0], not flip)
            if f.op == "mul":
                seq = [x for g in f.args for x in factors(g, False)]
                return [(u, not t) for u, t in reversed(seq)] if flip else seq
            base, t = canon(f)
            return [(base, t ^ flip)]

        for f in b.args:
            word += factors(f, False)
        return coeff, scalars, word

    def _key(self, word) -> tuple:
        """(canonical key of a word up to transposition, whether the word is its transpose)."""
        key = tuple((self.uid[b], f) for b, f in word)
        tkey = tuple((u, not f) for u, f in reversed(key))
        return (key, False) if key <= tkey else (tkey, True)

    def _oriented_shape(self, factor) -> tuple:
        b, f = factor
        r, c = b.shape
        return (c, r) if f else (r, c)

    # -- products

    def _product(self, b: Term) -> _Ref:
        coeff, scalars, word = self._word(b)
        flip = self.store_flip.get(b, False)
        if flip:  # compute the transpose: the reversed word, each factor transposed
            word = [(x, not f) for x, f in reversed(word)]
        # the scale is an operand, however it was written: a number, a scalar of the data, a weight
        scale = ([coeff] if coeff != 1.0 else []) + [self.ref(s).var for s in scalars]
        scale = tuple(scale)
        with_ids = self._onehot_scaled(b, word, scale)  # c X: c added at the ids into zeros
        if with_ids is not None:
            return with_ids
        if len(word) == 1:
            x = self._factor(word[0])
            if not scale:
                return x.t() if flip else x
            return self._new(b, "scale", [x.read(scale)], flip=flip)
        split = self._plan(word)
        self._release(word, split)
        key, _ = self._key(word)
        if not scale:
            ref = self._interval(word, split, 0, len(word) - 1, self._hint(b))
            return ref.t() if flip else ref
        s = split[0][len(word) - 1]
        if key in self.avail or self.counts.get(key, 1) > 1 or not self._scalable(word, s):
            # the unscaled product is (or will be) shared, or no place of it takes a scale: compute
            # it once, scale a copy
            whole = self._interval(word, split, 0, len(word) - 1)
            return self._new(b, "scale", [whole.read(scale)], flip=flip)
        left = self._interval(word, split, 0, s)
        right = self._interval(word, split, s + 1, len(word) - 1)
        rows, inner, cols = (self._guess(d) for d in (self._oriented_shape(word[0])[0],
                                                       self._oriented_shape(word[s])[1],
                                                       self._oriented_shape(word[-1])[1]))
        self.flops += rows * inner * cols
        sizes = {"left": rows * inner, "right": inner * cols, "out": rows * cols}
        for side in self._unscalable(word, s):
            sizes.pop(side, None)
        where = min(sizes, key=sizes.get)
        lhs, rhs = left.read(), right.read()
        if where == "left":
            lhs = left.read(scale)
        elif where == "right":
            rhs = right.read(scale)
        if where != "out" and self._folds(word[:s + 1], word[s + 1:]):  # as in _interval
            kind, args, attrs = self._matmul(rhs.T(), lhs.T(), _turned(word[s + 1:]), _turned(word[:s + 1]),
                                             right.t(), left.t())
            return self._new(b, kind, args, flip=not flip, **attrs)
        kind, args, attrs = self._matmul(lhs, rhs, word[:s + 1], word[s + 1:], left, right)
        if where == "out":
            attrs["out_scale"] = scale
        return self._new(b, kind, args, flip=flip, **attrs)

    def _unscalable(self, word, s) -> set:
        """The places of the product ``word`` split after ``s`` ("left", "right", "out") that may not
        take a scale: a side that is a vector of ones is not multiplied but summed over (_matmul),
        so a scalar put on it would be lost; with ids alone on a side, that side and the result
        (a lookup or a scatter has no out_scale)."""
        return {self._ones_side(word[:s + 1], word[s + 1:])} | set(self._onehot_unscaled(word[:s + 1], word[s + 1:]))

    def _scalable(self, word, s) -> bool:
        """Whether some place of the product ``word`` split after ``s`` takes a scale."""
        return bool({"left", "right", "out"} - self._unscalable(word, s))

    def _factor(self, factor) -> _Ref:
        b, f = factor
        r = self.refs[b]
        return r.t() if f else r

    def _release(self, word, split):
        """Count this product out of the sub-words its bracketing does not compute: they are shared
        with one product fewer than planned (so a later product does not take one of them at a
        share of its cost that nobody else pays)."""
        used = set()
        stack = [(0, len(word) - 1)]
        while stack:
            i, j = stack.pop()
            if i == j:
                continue
            used.add(self._key(word[i:j + 1])[0])
            s = split[i][j]
            if s is not None:
                stack += [(i, s), (s + 1, j)]
        for key in {self._key(word[i:j + 1])[0] for i in range(len(word)) for j in range(i + 1, len(word))} - used:
            if self.counts.get(key, 0) > 1:
                self.counts[key] -= 1

    def _plan(self, word) -> list:
        """split[i][j]: where the cheapest bracketing of word[i..j] splits it (None: available)."""
        m = len(word)
        p = [self._guess(self._oriented_shape(word[0])[0])] + [self._guess(self._oriented_shape(f)[1]) for f in word]
        cost = [[0.0] * m for _ in range(m)]
        split = [[None] * m for _ in range(m)]
        for length in range(2, m + 1):
            for i in range(m - length + 1):
                j = i + length - 1
                key, _ = self._key(word[i:j + 1])
                if key in self.avail:
                    continue  # already computed: free
                best, where = None, None
                for s in range(i, j):
                    work = p[i] * p[s + 1] * p[j + 1]
                    if self._onehot_split(word, i, s, j):
                        work = p[i] * p[j + 1]  # a lookup or a scatter: the size of its result
                    c = cost[i][s] + cost[s + 1][j] + work
                    if best is None or c < best:
                        best, where = c, s
                cost[i][j] = best / self.counts.get(key, 1)
                split[i][j] = where
        return split

    def _interval(self, word, split, i, j, hint=None) -> _Ref:
        if i == j:
            return self._factor(word[i])
        key, rel = self._key(word[i:j + 1])
        if key in self.avail:
            var, f = self.avail[key]
            return _Ref(var, f ^ rel)
        s = split[i][j]
        left = self._interval(word, split, i, s)
        right = self._interval(word, split, s + 1, j)
        self.flops += (self._guess(self._oriented_shape(word[i])[0]) * self._guess(self._oriented_shape(word[s])[1])
                       * self._guess(self._oriented_shape(word[j])[1]))
        rows, cols = self._oriented_shape(word[i])[0], self._oriented_shape(word[j])[1]
        if self._folds(word[i:s + 1], word[s + 1:j + 1]):  # (B^t A^t)^t: the batch (or ids) on the left
            var = self._value(hint, (cols, rows))
            kind, args, attrs = self._matmul(right.t().read(), left.t().read(), _turned(word[s + 1:j + 1]),
                                             _turned(word[i:s + 1]), right.t(), left.t())
            self._add(Op(kind, [var], args, **attrs))
            self.avail[key] = (var, not rel)
            return _Ref(var, True)
        var = self._value(hint, (rows, cols))
        kind, args, attrs = self._matmul(left.read(), right.read(), word[i:s + 1], word[s + 1:j + 1], left, right)
        self._add(Op(kind, [var], args, **attrs))
        self.avail[key] = (var, rel)
        return _Ref(var)

    def _folds(self, lword, rword) -> bool:
        """Whether to compute the product ``lword rword`` as the transpose of ``rword^t lword^t``:
        when only its right side varies per example and the target folds a batch on the left of a
        product into one matrix product (torch: ``(b, n, d) @ (d, k)`` is one ``mm``, while
        ``(d, n) @ (b, n, k)`` broadcasts the left side and makes b of them)."""
        onehot = self._onehot_side(lword, rword)
        if onehot is not None:  # ids alone on the right: the transpose of a lookup or a scatter (any target)
            return onehot == "right"
        if not self.target.folds_batches or self._ones_side(lword, rword) is not None:
            return False
        return (not any(b in self.batched for b, _ in lword)) and any(b in self.batched for b, _ in rword)

    def _ones_side(self, lword, rword) -> Optional[str]:
        """Which side of the product ``lword rword`` is a single vector of ones (a column on the
        right, a row on the left), so that the product is a row or column sum of the other side."""
        if len(rword) == 1 and self._ones_factor(rword[0]) and self._oriented_shape(rword[0])[1] == 1:
            return "right"
        if len(lword) == 1 and self._ones_factor(lword[0]) and self._oriented_shape(lword[0])[0] == 1:
            return "left"
        return None

    def _matmul(self, lhs: Read, rhs: Read, lword, rword, left, right) -> tuple:
        """(kind, operands, attributes) of ``lhs @ rhs``, or of a row or column sum when one side
        is a single vector of ones (which must then be read plain: nothing on that side is read)."""
        with_ids = self._onehot_product(lhs, rhs, lword, rword)
        if with_ids is not None:
            return with_ids
        side = self._ones_side(lword, rword)
        if side == "right":
            assert rhs == right.read(), "a scaled vector of ones would be summed away"
            return self._sum_axis(lhs, 1)
        if side == "left":
            assert lhs == left.read(), "a scaled vector of ones would be summed away"
            return self._sum_axis(rhs, 0)
        return "matmul", [lhs, rhs], {}

    @staticmethod
    def _ones_factor(factor) -> bool:
        b, _ = factor
        return b.op == "ones" or (b.op == "sym" and b.data[0].value == "ones")

    def _sum_axis(self, x: Read, axis: int) -> tuple:
        """(kind, operands, attributes) of the sum of the columns (axis 0) or rows (axis 1) of a
        matrix, kept 2-d; counted from the end (-2, -1), so that a batch of matrices is summed
        matrix by matrix."""
        if x.t and not x.scale:  # sum the stored array along the other axis: contiguous, then a view
            return "sum_axis", [x.T()], {"axis": -1 - axis, "view_t": True}
        return "sum_axis", [x], {"axis": axis - 2}
