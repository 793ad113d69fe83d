"""One-hot constants given as ids: the lowering's rules for them (a part of ``Lowering``).

Vocabulary
----------
onehot    a const declared ``n x v onehot`` (``Symbol.onehot``): each row is one-hot, and its value
          is given as ids, one integer in [0, v) per row, shape (n,) or (batch, n). The terms and
          the normal form are those of the one-hot matrix; only how they are computed changes.
ids       the value that holds them in the sweep (``Value.ids``; the op ``ids_input`` reads and
          checks them). The kinds below read ids and make no (n, v) one-hot matrix; they compute
          every use of a onehot constant a GPT makes (its embedding, the embedding's gradient, the
          cross-entropy and its adjoint).
onehot    the one-hot matrix made from the ids, for any other use (``check_ids``: a Hadamard
          product with it, ``Y o exp(U)``, an operator of it), read by the ops of that use alone.
lookup    ``X A`` as ``A[ids]``: the rows of A that the ids pick (an embedding lookup).
scatter   ``X^t G`` as the rows of G added into the rows ids of a (v, cols) array of zeros (the
          embedding's gradient, index_add); ``total``: summed over the batch too, one scatter of
          every example's rows.
pick_sum  ``trace(X^t A)`` as the sum of ``A[i, ids_i]`` (the cross-entropy's
          ``trace(Y^t logsoftmax(Z))``: a gather of the log-probabilities).
add_ids   ``P + s X`` as ``P[i, ids_i] += s``, in place in P, an array of this sum's own (s a number
          times scalars, which may vary per example: ``trace(X^t W) X`` in a gradient): the
          adjoint of the cross-entropy, ``Y - a(Z) rowsum(Y)``, is ``-a(Z)`` with 1 added at the
          ids, where ``rowsum(Y)`` is a column of ones (one 1 a row) and multiplies nothing.
aa_ids    ``aa(A, X)`` (the derivative of ``trace(X^t a(A))``, the probability of the ids) from
          S = a(A) as ``S o (X - p 1^t)`` with p_i = S[i, ids_i]: -p S, with p (1 - p) at the ids.

A product with a onehot factor at an end is a lookup or a scatter of the rest (``X A B`` is
``(A B)[ids]``; ``A X`` and ``A X^t`` are the transposes of ``X^t A^t`` and ``X A^t``), and costs the
chain order the size of its result, not a product's.
"""

from __future__ import annotations

from typing import Optional

from ..base.errors import FdslError
from ..core.printers import short
from ..core.terms import Term
from .ir import Op, Read, Sweep, Value, reread
from .products import _Ref, canon

# the kinds that read ids (the only ones that may)
IDS_KINDS = ("lookup", "scatter", "pick_sum", "add_ids", "aa_ids", "scatter_into", "onehot")


def is_onehot(t: Term) -> bool:
    """Whether ``t`` (a base) is a const declared onehot."""
    return t.op == "sym" and t.data[0].onehot


class OneHot:
    """The rules of ``Lowering`` for onehot constants (see the module doc). A mixin: the state it
    reads is the lowering's."""

    def _onehot_factor(self, word) -> Optional[bool]:
        """For a word of one factor that is a onehot constant: whether it is read transposed; else None."""
        if len(word) == 1 and is_onehot(word[0][0]):
            return word[0][1]
        return None

    def _ids_input(self, b: Term, name: str) -> _Ref:
        """The ids of a onehot constant, read and checked (integers in [0, v), (n,) or (batch, n))."""
        symbol, (rows, vocab) = b.data
        size = self.size(vocab)
        if size is None:
            raise FdslError("%s is declared onehot: generating code for it needs the size of dim %s (its ids are "
                            "checked against it); declare it with one (dim %s = 8)" % (name, vocab, vocab))
        var = Value((rows, vocab), batched=True, hint=name, numbered=True)
        var.ids = True
        self.values.append(var)
        self.array_inputs[var] = name
        self.batch_inputs.add(var)
        self.inputs.append(Op("ids_input", [var], name=name, rows=self.size(rows), vocab=size))
        return _Ref(var)

    def _onehot_product(self, lhs: Read, rhs: Read, lword, rword) -> Optional[tuple]:
        """(kind, operands, attributes) of ``lhs @ rhs`` where ``lhs`` is a onehot constant alone:
        a lookup of the rows of ``rhs`` (X) or a scatter of them (X^t); else None. (A product
        with the onehot on the right is computed as the transpose of one with it on the left.)"""
        t = self._onehot_factor(lword)
        if t is None or self._onehot_factor(rword) is not None:  # two onehots: left to check_ids
            return None
        ids = Read(lhs.value)
        if lhs.scale:  # the scale goes on the other side (_product keeps it off the ids)
            rhs = rhs._replace(scale=tuple(lhs.scale) + tuple(rhs.scale))
        if t:
            return "scatter", [ids, rhs], {"vocab": self.size(lword[0][0].shape[1])}
        return "lookup", [ids, rhs], {}

    def _onehot_split(self, word, i: int, s: int, j: int) -> bool:
        """Whether the product of ``word[i:s+1]`` and ``word[s+1:j+1]`` has a onehot constant alone
        on a side: a lookup or a scatter, whose work is the size of its result (the chain order)."""
        return (s == i and self._onehot_factor(word[i:i + 1]) is not None) or \
            (s + 1 == j and self._onehot_factor(word[j:j + 1]) is not None)

    def _onehot_unscaled(self, lword, rword) -> tuple:
        """The places of ``lword rword`` a scale may not go when a onehot constant is alone on a
        side: that side (nothing there to scale) and the result (a lookup or a scatter has no
        out_scale), so that the scale goes on the other side."""
        side = self._onehot_side(lword, rword)
        return () if side is None else (side, "out")

    def _onehot_scaled(self, b: Term, word, scale: tuple) -> Optional[_Ref]:
        """``c X`` (a product of numbers and scalars and one onehot constant) as c added at the ids
        into zeros, a sum of one summand (``_onehot_sum``); else None."""
        if len(word) != 1 or not scale or self._onehot_factor(word) is None:
            return None
        return self._onehot_sum(b, [(1, False, b)])

    def _onehot_side(self, lword, rword) -> Optional[str]:
        """Which side of ``lword rword`` is a onehot constant alone, if either."""
        if self._onehot_factor(lword) is not None:
            return "left"
        if self._onehot_factor(rword) is not None:
            return "right"
        return None

    def _onehot_trace(self, word) -> Optional[tuple]:
        """(the read of the ids, the other factor's ref) of ``trace(P Q)`` with P or Q a onehot
        constant X, the sum of the other factor's entries at the ids (``pick_sum``); else None.
        trace(P Q) is the sum of P^t o Q, so the other factor is read as written beside X^t (first
        or second: trace(X^t A), trace(A X^t)), and transposed beside X."""
        for i, (x, f) in enumerate(word):
            if is_onehot(x) and not is_onehot(word[1 - i][0]):
                other = self._factor(word[1 - i])
                partner = other if f else other.t()
                return Read(self.refs[x].var), partner
        return None

    def _onehot_aa(self, b: Term, s: _Ref) -> Optional[_Ref]:
        """``aa(A, X)`` of a onehot X (not transposed), given S = a(A): ``aa_ids``; else None."""
        x, f = canon(b.args[1])
        if not is_onehot(x) or f:
            return None
        return self._new(b, "aa_ids", [s.read(), Read(self.refs[x].var)])

    def _rowsum_onehot(self, b: Term) -> Optional[_Ref]:
        """``rowsum(X)`` of a onehot X: a column of ones (one 1 a row), whatever the ids."""
        x, f = canon(b.args[0])
        if not is_onehot(x) or f:
            return None
        return self._constant("ones", (b.shape[0], 1), "ones")

    def _ones_column(self, t: Term) -> bool:
        """Whether ``t`` is ``rowsum(X)`` of a onehot X (a column of ones: a factor of a Hadamard
        product that multiplies nothing)."""
        x, f = canon(t)
        return x.op == "rowsum" and not f and is_onehot(canon(x.args[0])[0]) and not canon(x.args[0])[1]

    def _onehot_term(self, broadcast: bool, t: Term) -> Optional[tuple]:
        """(the onehot constant, whether transposed, number, scalar terms) of a summand ``c s X`` (c
        a number, s scalars: the gradient of ``trace(X^t W) A`` holds ``trace(...) X``); else None."""
        if broadcast:
            return None
        x, f = canon(t)
        if is_onehot(x):
            return x, f, 1.0, []
        if x.op != "mul":
            return None
        coeff, scalars, word = self._word(x)
        if len(word) != 1 or not is_onehot(word[0][0]):
            return None
        return word[0][0], word[0][1] ^ f, coeff, scalars

    def _summand_deps(self, sign: int, broadcast: bool, t: Term) -> list:
        """The bases a summand of a sum reads: a onehot summand ``c s X`` reads X and the scalars
        s, and is not computed on its own (that would be the scaled one-hot matrix)."""
        found = self._onehot_term(broadcast, t)
        if found is None:
            return [canon(t)[0]]
        return [found[0]] + [canon(s)[0] for s in found[3]]

    def _onehot_summand(self, sign: int, broadcast: bool, t: Term) -> Optional[tuple]:
        """(the onehot constant, whether transposed, its scale) of a summand ``sign c s X``
        (``_onehot_term``); the scale is the number first, then the scalar values."""
        found = self._onehot_term(broadcast, t)
        if found is None:
            return None
        x, f, coeff, scalars = found
        return x, f, (float(sign) * coeff,) + tuple(self.ref(s).var for s in scalars)

    def _onehot_sum(self, b: Term, parts: list) -> Optional[_Ref]:
        """A sum with onehot summands (``parts``: (sign, broadcast, term)), each perhaps times
        numbers and scalars: the rest summed into an array of its own (``-P`` alone is
        ``scale``), then the scale added at the ids of each onehot summand, in place
        (``add_ids``). None: no onehot summand. (A product ``c X`` alone is such a sum too.)"""
        found = [self._onehot_summand(*p) for p in parts]
        ones = [f for f in found if f is not None]
        if not ones:
            return None
        # ids make the rows of a one-hot matrix: a sum where every onehot summand is transposed
        # (a gradient G^t = c X^t + ...) is computed as its transpose, and read transposed
        flips = {f for _, f, _ in ones}
        rest = [p for p, f in zip(parts, found) if f is None]
        flip = flips.pop()
        if flips or (flip and any(bc for _, bc, _ in rest)):
            raise FdslError("cannot generate code for %s: a onehot constant is added %s, and its ids make its "
                            "rows, not its columns" % (short(b), "both as it is and transposed" if flips else
                                                       "transposed to rows added to every row"))
        shape = b.shape[::-1] if flip else b.shape
        if not rest:
            zeros = self._constant("zeros", shape, "zeros")
            acc = self._new(None, "scale", [zeros.read((1.0,))], shape=shape)
        elif len(rest) == 1 and not rest[0][1]:
            ref = self._matrix(self.ref(rest[0][2]))
            ref = ref.t() if flip else ref
            acc = self._new(None, "scale", [ref.read((float(rest[0][0]),))], shape=shape)
        else:
            terms = [(bc, s < 0, self._matrix(self.ref(t))) for s, bc, t in rest]
            terms = [(bc, neg, r.t() if flip else r) for bc, neg, r in terms]
            terms.sort(key=lambda p: (p[0], p[1]))
            if terms[0][0]:  # only rows: start from zeros of the full shape
                terms.insert(0, (False, False, self._constant("zeros", shape, "zeros")))
            acc = self._new(None, "sum", [r.read() for _, _, r in terms],
                            signs=tuple(-1 if neg else 1 for _, neg, _ in terms), head=2, shape=shape)
        for x, _, scale in ones:
            out = self._value(self._hint(b), shape)
            # the scalar values (a number of each example, perhaps) are operands after the ids
            self._add(Op("add_ids", [out], [acc.read(), Read(self.refs[x].var), *scale[1:]], sign=scale[0]))
            acc = _Ref(out)
        return _Ref(acc.var, flip)

    def check_ids(self) -> None:
        """Where an op other than the kinds that read ids reads them (a use of a onehot constant that
        only its one-hot matrix computes: ``trace(Y^t exp(U))``, whose derivative is ``Y o exp(U)``),
        the one-hot matrix made from the ids (``onehot``) just before the first such op, and those
        ops reading it: the program computes, at the cost of that (n, v) array, where every other
        use of the constant makes none."""
        first: dict = {}  # ids value -> the first op that needs its one-hot matrix
        for op in self.sweep:
            if op.kind in IDS_KINDS:
                continue
            for v in op.values_read():
                if getattr(v, "ids", False):
                    first.setdefault(v, op)
        if not first:
            return
        dense = {}
        for v in first:
            dense[v] = Value(v.shape, batched=True, hint=v, prefix="onehot_")
            self.values.append(dense[v])
        mapping = {}
        for op in self.sweep:
            if op.kind not in IDS_KINDS and any(v in dense for v in op.values_read()):
                mapping[op] = [reread(op, dense)]
        for v, op in first.items():  # (each first op reads ids: it is among those rewritten)
            mapping[op].insert(0, Op("onehot", [dense[v]], [Read(v)], vocab=self.size(v.shape[1])))
        self.sweep.rewrite(mapping)


def summed_scatter(sweep: Sweep, v: Value) -> bool:
    """A gradient that is a scatter (the embedding's), read by nothing but the return, summed over
    the batch in the same scatter (``total``): every example's rows added into one (v, cols)
    array, never a (batch, v, cols) one. False: left as it is."""
    op = sweep.maker.get(v)
    if op is None or op.kind != "scatter" or op.attrs.get("total") or sweep.readers.get(v):
        return False
    op.attrs["total"] = True  # as in fusion.summed_product
    return True
