"""The lowering: terms to the ops of one straight-line sweep (the statement IR), shared work done once.

Vocabulary
----------
outputs      the terms to compute, by name: for gradients, ``G_W^t`` for every weight W of a normal
             form ``w = sum_W trace(G_W d(W))`` (``gradient_terms``), keyed by printed weight name.
lowering     the outputs turned into a sweep of IR ops (``fdsl.codegen.ir``): one op per distinct computation, in
             topological order of the shared term graph of all outputs (looking through ``let``
             bodies), so the forward sweep (X_1, X_2, ...) and the backward sweep (the adjoints
             G_i of ``backprop``) are each done once, whatever number of outputs share them.
base         a term with its transposes and ``let`` names stripped: ``X_1``, ``X_1^t`` and the body
             of X_1 have one base. Each base is computed once; transposes are views (``.T``).
ref          how a term is read from the sweep's values: a value, transposed or not; a scalar term is
             a scalar operand (a float when it is a constant such as ``s = k^(-1/2)``, a scalar
             value, a dim's size): a scale is an operand, however the program wrote it.
word         the matrix factors of a product as (base, transposed) pairs; its scalar factors stand
             apart and are multiplied in last, into the smallest of the two operands of the last
             multiplication or its result.
sub-word     a contiguous run of a word. Sub-words are shared between products up to transposition
             (``Q^t X^t`` is ``(X Q)^t``): each distinct one is computed at most once.
chain order  a product is bracketed by dynamic programming on the numeric sizes (the matrix-chain
             problem), where a sub-word already computed costs nothing and one that k products
             contain costs 1/k of its work (it is done once for all of them).
storage      a base may be computed transposed when its consumers read it that way: the mask of
             ``mm`` and the elementwise operands beside it are then read contiguously.

Besides products, the lowering knows the operators whose derivatives share work: ``mm(A, B) =
[A > 0] o B`` computes the mask ``A > 0`` once per distinct A, and ``aa(A, B)`` reuses ``a(A)``
(the softmax S, from the forward sweep when it is there, else computed once per distinct A). Sums
whose summand is ``C r`` with C a column of ones add the row r by broadcasting, and products with
a ones vector at an end are row or column sums. Every other operator is lowered through its numpy
template in the operator table (``fdsl.core.ops.OPS[op].numpy``, placeholders as in
``numpy_eval._compile``), so an operator declared by a rule file works here too.

Subterms equal up to ``let`` names are one base (``fusion.unlet`` strips the names first and keeps
them for the variables): the body of ``gpt_2 := ...`` and its copy inline in the loss, or in a
natural spelling whose names were found, are computed once. A Hadamard factor whose rows are all one
row, ``C r``, is r broadcast. On a target that ``folds_batches`` (torch), a product whose right side
alone varies per example is computed as the transpose of the reversed product, so the batch is on
the left, where torch folds it into one matrix product; on one with ``fused_layernorm``,
``layernorm(A)`` keeps its row statistics and ``dlayernorm(A, B)`` is the library's fused backward
from them. Before any of this, ``factoring.factored`` writes ``F A + F B`` as ``F (A + B)`` where
``A + B`` is computed anyway (the terms a bias adds, found again), and ``trace(P Q)`` is lowered as
the sum of ``P^t o Q`` (``trace(P aa(A, B))`` as ``trace(aa(A, P^t)^t B)`` where that aa is computed
anyway: a learned temperature's gradient). Products are ``fdsl.codegen.products`` (a mixin). The
passes then rewrite the sweep (``run_passes``; the tests check the IR after each): first
``fdsl.codegen.cse`` makes once the ops that two spellings of one term made twice; then
``fdsl.codegen.fusion``: a weight's gradient summed over the batch inside its last product, sums of
products and products that share an operand as one product, and (torch) a product of two batches as
one ``bmm`` and the heads of an attention as one stacked chain (``heads``); on torch, ``heads``
reads the stacks without unstacking them, ``kernels`` calls torch's fused kernels (addmm, the
affine layer norm and its backward, the log-softmax backward, a tied embedding's scatter into its
product) and ``causal`` marks the products a causal mask makes triangular; last, ``schedule``
computes every weight's gradient as soon as what it reads is known, ``remade`` (torch) lets a traced
graph make an elementwise value again where the backward reads it rather than keep it, and a gradient handed
out transposed is made in its weight's layout (``kernels.returned_as_stored``) and the products
that make gradients take the seed as their alpha (``kernels.seeded_products``).

The writer (``fdsl.codegen.writer``) spells the sweep as the function's body, with the function and
the module around it (imports, the runtime helpers); the torch training classes are
``fdsl.codegen.generated``'s.
"""

from __future__ import annotations

import os
from fractions import Fraction
from typing import Mapping, Optional

from ..base.errors import FdslError
from ..core import terms as T
from ..core.ops import OPS
from ..core.ops import shown as op_name
from ..core.printers import short
from ..core.terms import Term, postorder
from .causal import causal_products
from .cse import shared_ops
from .factoring import factored
from .fusion import (
    batched_products,
    group_products,
    group_sums,
    shared_scalings,
    summed_product,
    summed_reduction,
    summed_sum,
    transposed_reads,
    unlet,
)
from .heads import (
    biased_kinds,
    grouped_kinds,
    products_side_by_side,
    side_by_side,
    stacked_heads,
    stacked_traces,
)
from .ir import Dim, Op, Read, Sweep, Value, check
from .kernels import (
    added_in_place,
    added_products,
    affine_layernorms,
    logsoftmax_backwards,
    returned_as_stored,
    scattered_into,
    seeded_products,
)
from .onehot import OneHot, summed_scatter
from .products import Products, _Ref, canon
from .remade import remade_in_backward
from .schedule import early_results
from .targets import DTYPES, TARGETS
from .writer import ModuleWriter, Writer

# the IR is checked after every pass where this is set, or FDSL_CHECK_IR=1 (the tests set it)
check_passes = False

#: the sums looked through for one that a new sum extends (a residual stream's last one)
_RECENT = 64
#: size assumed for a dim without one when choosing the order of products
_GUESSED_SIZE = 64


def nodes(roots) -> list:
    """Every distinct node under any of ``roots`` (through let bodies) once, children first."""
    out, seen = [], set()
    for root in roots:
        for node in postorder(root, descend=lambda x: x not in seen):
            if node not in seen:
                seen.add(node)
                out.append(node)
    return out


# ---- the lowering -------------------------------------------------------------------------------


class Lowering(Products, OneHot, ModuleWriter):
    """Lower ``outputs`` (name -> term) to the body of ``grads(values)``; see the module doc."""

    def __init__(self, outputs: Mapping, dims: Optional[Mapping] = None, target: str = "numpy",
                 dtype: Optional[str] = None, loss: Optional[Term] = None):
        if target not in TARGETS:
            raise FdslError("unknown target %r: the targets are %s" % (target, ", ".join(TARGETS)))
        if dtype is not None and dtype not in DTYPES:
            raise FdslError("unknown dtype %r: the dtypes are %s" % (dtype, ", ".join(DTYPES)))
        self.target, self.dtype = TARGETS[target], dtype
        self.outputs = dict(outputs)
        # the loss the module also returns: E for 1/2 ||E||^2 (w = form(E)), or a scalar L (w = -d(L))
        self.loss = loss
        self.sizes = {k: v for k, v in (dims or {}).items() if isinstance(v, int) and not isinstance(v, bool)}
        self.module_consts: list = []  # const ops: built once, at import
        self.inputs: list = []  # input and scalar_input ops: values[...]
        self.array_inputs: dict = {}  # Value -> printed name, of the matrix inputs
        self.batch_inputs: set = set()  # the Values of inputs that may carry a batch axis
        self.dim_stmts: list = []  # dim ops: sizes read off input shapes
        self.runtime_consts: list = []  # const ops whose shape has a dim known only at call time
        self.sweep = Sweep()  # the ops of the sweep, in topological order
        self.seeded: set = set()  # the results made times the seed (kernels.seeded_products)
        self._aas: Optional[dict] = None  # the aa terms by their arguments (_aa_index)
        self.values: list = []  # every value the lowering made, in order (the writer names them so)
        self.refs: dict = {}  # base -> _Ref
        self.avail: dict = {}  # canonical sub-word key -> (Value, flip)
        self.masks: dict = {}  # base -> the Value holding (value of base > 0) in its storage
        self.softmaxes: dict = {}  # (base, flip) -> _Ref of the row softmax of that argument
        self.layernorm_stats: dict = {}  # (base, flip) -> the variables of its row mean and 1/sigma
        self.sums: list = []  # (summands as (sign, broadcast, base, flip), flip, _Ref) of each sum computed
        self.const_memo: dict = {}
        self.flops = 0  # multiply-adds of the matrix products, for reports
        self.runtime_dims: dict = {}  # dim name -> the Value of its size
        self.let_names: dict = {}  # base -> the name of a let bound to it (X_1, G_7): its variable
        self._comments: dict = {}  # Value -> the binding it computes, for the reader
        # subterms equal up to let names are one computation: the body of ``gpt_2 := ...`` in the
        # normal form and its copy inline in the loss (or in a natural spelling, where the names
        # were found) are one base. Lets are stripped from every term first, their names kept.
        named = nodes(list(self.outputs.values()) + ([loss] if loss is not None else []))
        plain = unlet(named)
        for n in named:
            if n.op == "let":
                base, flip = canon(plain[n])
                if not flip and base not in self.let_names:
                    name, index = n.data
                    self.let_names[base] = name + "".join("_%d" % i for i in index)
        order = nodes([plain[t] for t in self.outputs.values()] + ([plain[loss]] if loss is not None else []))
        fewer = factored(order)  # F A + F B as F (A + B) where A + B is computed anyway
        self.outputs = {k: fewer[plain[t]] for k, t in self.outputs.items()}
        if loss is not None:
            self.loss = fewer[plain[loss]]
        self.nodes = nodes(list(self.outputs.values()) + ([self.loss] if loss is not None else []))
        self._order()
        self.writer = Writer(self.target)

    # -- values

    def _value(self, hint=None, shape=None, batched=False, scalar=False, prefix="", suffix="") -> Value:
        """A new value (the writer names it: after ``hint``, a string or another value)."""
        v = Value(shape, batched, scalar=scalar, hint=hint, prefix=prefix, suffix=suffix, numbered=True)
        self.values.append(v)
        return v

    def _add(self, op: Op) -> Op:
        """Append ``op`` to the sweep; its results vary per example when anything it reads does (a
        number of each example too: trace(X) of a batch of X)."""
        scale = [s for s in op.attrs.get("out_scale", ()) if isinstance(s, Value)]
        if any(v.batched for v in op.values_read() + scale):
            for v in op.outs:
                v.batched = True
        return self.sweep.append(op)

    # -- sizes and constants

    def size(self, dim) -> Optional[int]:
        if isinstance(dim, int):
            return dim
        return self.sizes.get(dim)

    def _guess(self, dim) -> int:
        s = self.size(dim)
        return s if s is not None else _GUESSED_SIZE

    def _dim_code(self, dim) -> tuple:
        """(the size of ``dim``: an int, or the Value of a size read at call time, whether it is
        known only at call time)."""
        s = self.size(dim)
        if s is not None:
            return s, False
        var = self.runtime_dims.get(dim)
        if var is None:
            var = self.runtime_dims[dim] = self._bind_dim(dim)
        return var, True

    def _bind_dim(self, dim) -> Value:
        for value, shape in self._input_shapes:
            for axis, side in enumerate(shape):
                if side == dim:
                    var = self._value("n_" + dim, scalar=True)
                    # the axis counted from the end: a batch axis before the rows does not move it
                    self.dim_stmts.append(Op("dim", [var], [Read(value)], axis=axis))
                    return var
        raise FdslError("dim %s has no size, and no input whose shape has it: declare it with one "
                        "(dim %s = 8) to generate code" % (dim, dim))

    def _shape_code(self, shape) -> tuple:
        """(the sizes of ``shape``: ints or Values, whether one is known only at call time)."""
        parts = [self._dim_code(side) for side in shape]
        return tuple(p for p, _ in parts), any(r for _, r in parts)

    def _constant(self, make: str, shape, hint) -> _Ref:
        """A constant array ``ones(shape)``, ``zeros(shape)`` or ``eye(rows)`` (``make``) in the
        working dtype: built once per dtype (and device) when its size is known."""
        sizes, runtime = self._shape_code(shape)
        var = self._value(hint, tuple(shape))
        op = Op("const", [var], make=make, shape=sizes)
        (self.runtime_consts if runtime else self.module_consts).append(op)
        return _Ref(var)

    def const_scalar(self, t: Term) -> Optional[float]:
        """The value of a scalar term built only from numbers, dims with sizes and scalars with
        constant values (``s = k^(-1/2)``), or None."""
        if t in self.const_memo:
            return self.const_memo[t]
        value = None
        if t.scalar and all(self._constant_leaf(leaf) for leaf in postorder(t) if leaf.op == "sym"):
            from ..numbers.numpy_eval import Evaluator  # lazily: only scalars need the interpreter

            value = float(Evaluator({}, self.sizes).value(t)[0, 0])
        self.const_memo[t] = value
        return value

    def _constant_leaf(self, leaf: Term) -> bool:
        symbol = leaf.data[0]
        if symbol.kind == "dim":
            return self.size(symbol.name) is not None or isinstance(symbol.value, int)
        if symbol.kind == "scalar" and isinstance(symbol.value, Term):
            return self.const_scalar(symbol.value) is not None
        return False

    # -- the order of computation

    def _summand(self, s: Term) -> tuple:
        """(sign, broadcast, term) of a summand: ``-X`` is subtracted, ``C r`` (C a column of
        ones, r a row) is the row r added by broadcasting."""
        sign = 1
        c, rest = T.coefficient(s)
        if c == -1 and not rest.scalar:
            sign, s = -1, rest
        if s.op == "mul" and len(s.args) == 2 and self._ones(s.args[0]) and s.args[0].shape[1] == 1 \
                and not s.args[1].scalar:
            return sign, True, s.args[1]
        return sign, False, s

    @staticmethod
    def _ones(t: Term) -> bool:
        base, _ = canon(t)
        return base.op == "ones" or (base.op == "sym" and base.data[0].value == "ones")

    def _deps(self, b: Term) -> list:
        """The bases the statement computing base ``b`` reads."""
        if b.scalar and self.const_scalar(b) is not None:
            return []
        op = b.op
        if op == "sym":
            value = b.data[0].value
            return [canon(value)[0]] if isinstance(value, Term) else []
        if op == "add" and not b.scalar:
            return [d for s in b.args for d in self._summand_deps(*self._summand(s))]  # (onehot: X c)
        if op == "aa":
            a, fa = canon(b.args[0])
            extra = [self._softmax_nodes[(a, fa)]] if (a, fa) in self._softmax_nodes else []
            return [a, canon(b.args[1])[0]] + extra
        if op == "had":
            return [canon(x)[0] for x in self._hadamard_args(b)]
        if op == "trace" and (word := self._trace_word(b)) is not None:  # trace(P Q): P and Q, not P Q
            return [x for x, _ in word]
        if op == "dlayernorm" and self.target.fused_layernorm:  # the statistics of the forward's
            a, fa = canon(b.args[0])
            extra = [self._layernorm_nodes[(a, fa)]] if (a, fa) in self._layernorm_nodes else []
            return [a, canon(b.args[1])[0]] + extra
        return [canon(x)[0] for x in b.args if not (x.scalar and self.const_scalar(x) is not None)]

    def _order(self):
        """Every base the outputs need, children first (iteratively: terms can be deep)."""
        self._softmax_nodes, self._layernorm_nodes = {}, {}
        for n in self.nodes:
            if n.op == "a":
                self._softmax_nodes.setdefault(canon(n.args[0]), n)
            if n.op == "layernorm":
                self._layernorm_nodes.setdefault(canon(n.args[0]), n)
        # Roots that need fewer named intermediates beneath them first: for a deep encoder, the
        # weights of the last layer (after the forward sweep), then each layer's as soon as its
        # adjoint G_i is known, so that the values of a layer can be freed once it is done.
        rank: dict = {}
        for n in self.nodes:
            rank[n] = max((rank[c] for c in n.args), default=0) + (n.op == "let")
        roots = sorted(self.outputs.values(), key=lambda t: rank[t])
        if self.loss is not None:
            roots.insert(0, self.loss)  # E: known after the forward sweep
        order, seen = [], set()
        stack = [(canon(t)[0], False) for t in reversed(roots)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if node in seen:
                continue
            seen.add(node)
            stack.append((node, True))
            for child in reversed(self._deps(node)):
                if child not in seen:
                    stack.append((child, False))
        self.order = order
        # the bases that vary per example: those computed from a constant input (X0, Y), which
        # may carry a batch axis; a sum is accumulated into one of them (see _sum)
        self.batched = set()
        for b in order:
            if (b.op == "sym" and self._is_input(b) and b.data[0].kind == "const") or \
                    any(c in self.batched for c in self._deps(b)):
                self.batched.add(b)
        # the words of all products, to share their sub-words (counted once per product)
        self.uid = {b: i for i, b in enumerate(order)}
        self.counts: dict = {}
        self.words: dict = {}
        for b in order:
            if b.op == "mul" and not b.scalar:
                word = self._word(b)[2]
                self.words[b] = word
                keys = set()
                for i in range(len(word)):
                    for j in range(i + 1, len(word)):
                        keys.add(self._key(word[i:j + 1])[0])
                for k in keys:
                    self.counts[k] = self.counts.get(k, 0) + 1
        self._storage()
        # inputs: read first, so that dims known only at call time can be taken from their shapes
        self._input_shapes = []
        for b in order:
            if b.op == "sym" and self._is_input(b):
                self.refs[b] = self._input(b)

    def _storage(self):
        """Which bases to compute transposed: ``mm(A, B)`` is computed in the frame where the mask
        of A is stored contiguously, and a product or sum B is computed in that frame too (either
        orientation costs the same), so the elementwise product reads both operands in order. A
        product that is an output is computed in the orientation it is returned in."""
        self.store_flip: dict = {}
        for t in self.outputs.values():  # outputs come out contiguous, when they are products
            b, f = canon(t)
            if b.op == "mul":
                self.store_flip.setdefault(b, f)
        for b in reversed(self.order):  # consumers before producers
            if b.op != "mm":
                continue
            a, fa = canon(b.args[0])
            frame = fa ^ self.store_flip.get(a, False)
            x, fx = canon(b.args[1])
            if x.op in ("mul", "add") and x not in self.store_flip:
                self.store_flip[x] = fx ^ frame

    # -- emission

    def lower(self) -> dict:
        """Emit the sweep, run the passes over it; the results: printed name -> (how it is handed
        out: "full" (a scalar as an array of the output's shape), "copy" or "plain", the ref,
        whether it is already summed over a batch (the shape's sizes, for "full"))."""
        for b in self.order:
            if b not in self.refs:
                self.refs[b] = self._emit(b)
        self.check_ids()
        results = {}
        inputs = {op.out for op in self.inputs}
        consts = {op.out for op in self.module_consts + self.runtime_consts}
        handed_out: dict = {}  # value -> whether it is summed over the batch already
        refs = {name: self.ref(t) for name, t in self.outputs.items()}
        returned = {r.var for r in refs.values() if isinstance(r.var, Value)}
        for name, t in self.outputs.items():
            ref = refs[name]
            if ref.scalar:
                results[name] = ("full", ref, self._shape_code(t.shape)[0])
            elif ref.var in consts or ref.var in inputs or ref.var in handed_out:
                # never hand out a constant, the caller's own array, or one array as two results
                # (a copy of a gradient summed over the batch in its product is not summed again)
                results[name] = ("copy", ref, handed_out.get(ref.var, False))
            else:
                summed = bool(self.batched) and (any(
                    f(self.sweep, ref.var) for f in (summed_product, summed_reduction, summed_scatter))
                    or summed_sum(self.sweep, ref.var, returned))
                results[name] = ("plain", ref, summed)
                handed_out[ref.var] = summed
        loss = {self.ref(self.loss).var} if self.loss is not None else set()
        loss = {v for v in loss if isinstance(v, Value)}
        self.run_passes(returned, loss)
        if self.target.folds_batches:  # torch: each gradient in its weight's layout
            results = returned_as_stored(self.sweep, results)
            if self.loss is not None:  # gradients the Function scales (the training section's SEEDED)
                self.seeded = seeded_products(self.sweep, results)
            if check_passes or os.environ.get("FDSL_CHECK_IR") == "1":
                check(self.sweep, self.given())
        return results

    def run_passes(self, returned: set, loss: set) -> None:
        """The passes over the sweep (see the module doc), each a structural rewrite of the IR;
        with ``check_passes`` set (the tests set it), the IR is checked after every one."""
        folds = self.target.folds_batches
        given = self.given()
        steps = [
            lambda s: shared_ops(s, returned | loss),  # what two spellings of one term make twice
            lambda s: transposed_reads(s, returned, folds),
            lambda s: group_sums(s, returned, folds),
            lambda s: group_products(s, returned),
            lambda s: shared_scalings(s, returned),
        ]
        if folds:  # torch: a product of two batches is one bmm, not matmul's five calls
            kept = returned | loss
            masks = {op.out for op in self.module_consts + self.runtime_consts if op.attrs.get("make") == "causal"}
            steps += [
                lambda s: batched_products(s, kept),
                lambda s: stacked_heads(s, kept),  # the heads of an attention as one chain on stacks
                lambda s: grouped_kinds(s, kept),
                lambda s: biased_kinds(s, kept),  # the heads' bias rows added in the grouped product
                lambda s: side_by_side(s, kept),
                lambda s: stacked_traces(s, kept),
                lambda s: added_products(s, kept),
                lambda s: scattered_into(s, kept),  # a tied embedding's scatter into its product
                lambda s: added_in_place(s, kept),
                lambda s: affine_layernorms(s, kept),
                lambda s: logsoftmax_backwards(s, kept),
                lambda s: causal_products(s, kept, masks),  # blocks a causal mask zeroes not multiplied
                lambda s: products_side_by_side(s, kept),  # stacks made into their side-by-side matrix
            ]
        steps.append(lambda s: early_results(s, returned | loss))  # each gradient when its adjoint is known
        if folds:  # (after early_results: where the backward first reads a value is where it ends up)
            steps.append(lambda s: remade_in_backward(s, loss, returned))  # a traced graph keeps less to the backward
        for step in steps:
            step(self.sweep)
            if check_passes or os.environ.get("FDSL_CHECK_IR") == "1":
                check(self.sweep, given)

    def given(self) -> list:
        """The values made before the sweep: inputs, dims, constants."""
        return [v for op in self.inputs + self.dim_stmts + self.module_consts + self.runtime_consts for v in op.outs]

    def ref(self, t: Term) -> _Ref:
        b, f = canon(t)
        if t.scalar:
            c = self.const_scalar(t)
            if c is not None:
                return _Ref(c, False, True)
        r = self.refs[b]
        return r.t() if f else r

    def _new(self, b: Optional[Term], kind: str, args, scalar=False, flip=False, shape=None, **attrs) -> _Ref:
        """The ref of a new value, made by a new op of ``kind`` (of ``b``, or of nothing a term
        names: ``shape`` then gives its shape), stored transposed when ``flip``."""
        if shape is None and b is not None and not scalar and b.shape:
            shape = b.shape[::-1] if flip else b.shape
        var = self._value(self._hint(b), shape, scalar=scalar)
        self._add(Op(kind, [var], args, **attrs))
        return _Ref(var, flip, scalar)

    def _hint(self, b: Optional[Term]) -> Optional[str]:
        return self.let_names.get(b)

    def _is_input(self, b: Term) -> bool:
        symbol = b.data[0]
        return symbol.kind != "dim" and symbol.value is None

    def _input(self, b: Term) -> _Ref:
        symbol, shape = b.data
        name = symbol.printed()
        if symbol.onehot:  # its ids (fdsl.codegen.onehot)
            return self._ids_input(b, name)
        if b.scalar:  # declared scalars and scalar weights
            var = self._value(name, scalar=True)
            self.inputs.append(Op("scalar_input", [var], name=name))
            return _Ref(var, False, True)
        batched = symbol.kind == "const"  # a constant may vary per example; a weight may not
        var = self._value(name, shape, batched=batched)
        self._input_shapes.append((var, shape))
        known = tuple(self.size(side) for side in shape)
        self.array_inputs[var] = name
        if batched:
            self.batch_inputs.add(var)
        self.inputs.append(Op("input", [var], name=name, shape=known if None not in known else None, batched=batched))
        return _Ref(var)

    def _emit(self, b: Term) -> _Ref:
        if b.scalar:
            c = self.const_scalar(b)
            if c is not None:
                return _Ref(repr(c), False, True)
        op = b.op
        if op == "sym":
            return self._symbol(b)
        if op == "num":
            return _Ref(float(b.data), False, True)
        if op == "zero":
            return self._constant("zeros", b.data, "zeros")
        if op == "eye":
            return self._constant("eye", (b.data, b.data), "eye")
        if op == "ones":
            return self._constant("ones", b.data, "ones")
        if op == "d":
            raise FdslError("cannot generate code for %s: a differential has no numeric value; generate "
                            "the coefficients of a normal form instead" % short(b))
        if b.scalar:
            return self._scalar_op(b)
        if op == "mul":
            return self._product(b)
        if op == "add":
            return self._sum(b)
        if op == "mm":
            return self._mm(b)
        if op == "aa":
            return self._aa(b)
        if op == "a":  # the softmax kind, as aa's softmax: one op for one meaning
            a, fa = canon(b.args[0])
            x = self._matrix(self.ref(b.args[0]))
            ref = self._new(b, "softmax", [x.read()])
            self.softmaxes.setdefault((a, fa), ref)
            return ref
        if op == "rowsum":  # the sum_axis kind, as a product with a column of ones
            ones = self._rowsum_onehot(b)
            if ones is not None:
                return ones
            x = self._matrix(self.ref(b.args[0]))
            kind, args, attrs = self._sum_axis(x.read(), 1)
            return self._new(b, kind, args, **attrs)
        if op in ("layernorm", "dlayernorm") and self.target.fused_layernorm:
            return self._layernorm(b)
        return self._template(b)

    def _layernorm(self, b: Term) -> _Ref:
        """layernorm(A) with its row statistics (mean, 1/sigma), kept for the layer-norm backward
        at the same A, ``dlayernorm(A, B)``, which the target's fused kernel computes from them (a
        target with ``fused_layernorm``); a dlayernorm whose A has no layernorm goes by template."""
        a, fa = canon(b.args[0])
        if b.op == "dlayernorm":
            stats = self.layernorm_stats.get((a, fa))
            if stats is None:
                return self._template(b)
            x, y = (self._matrix(self.ref(t)) for t in b.args)
            return self._new(b, "dlayernorm_stats", [x.read(), y.read()] + [Read(s) for s in stats])
        x = self._matrix(self.ref(b.args[0]))
        var = self._value(self._hint(b), b.shape)
        rows = (b.shape[0], 1)
        stats = (self._value(var, rows, suffix="_mean"), self._value(var, rows, suffix="_rstd"))
        self._add(Op("layernorm_stats", [var, *stats], [x.read()]))
        self.layernorm_stats[(a, fa)] = stats
        return _Ref(var)

    def _symbol(self, b: Term) -> _Ref:
        symbol, shape = b.data
        if symbol.kind == "dim":
            size, _ = self._dim_code(symbol.name)
            return _Ref(Dim(size), False, True)
        if symbol.value == "ones":
            return self._constant("ones", shape, symbol.printed())
        if symbol.value == "identity":
            return self._constant("eye", shape, symbol.printed())
        if symbol.value == "causal":
            return self._constant("causal", shape, symbol.printed())
        if isinstance(symbol.value, Term):
            return self.ref(symbol.value)
        return self.refs[b]

    def _trace_word(self, b: Term) -> Optional[list]:
        """The two matrix factors of ``trace(P Q)`` (a product of two, nothing scalar), which is
        the sum of ``P^t o Q``: n m multiplications instead of the n m n of the product (the
        cross-entropy's ``trace(Y^t logsoftmax(Z))``); else None."""
        a, _ = canon(b.args[0])
        if a.op != "mul" or a.scalar:
            return None
        coeff, scalars, word = self._word(a)
        if coeff != 1.0 or scalars:
            return None
        return word if len(word) == 2 else self._flipped_trace(word)

    def _flipped_trace(self, word) -> Optional[list]:
        """``trace(P aa(A, B))`` as ``trace(aa(A, P^t)^t B)`` (softmax's row Jacobian is symmetric:
        the manual's flip), the two factors aa(A, P^t)^t and B, where aa(A, P^t) is computed
        anyway: the coefficient of a learned temperature tau in the scores ``a(tau s Q K^t + M)``
        is the flipped form of the scores' adjoint, which the gradients of Q and K need, so tau's
        gradient costs a sum of an elementwise product, not an aa and two products a head."""
        at = [i for i, (x, f) in enumerate(word) if x.op == "aa" and not f]
        if len(at) != 1:
            return None
        i = at[0]
        aa = word[i][0]
        rest = word[i + 1:] + word[:i]  # trace is cyclic: trace(aa(A, B) P)
        wanted = tuple((x, not f) for x, f in reversed(rest))  # P^t
        found = self._aa_index().get((canon(aa.args[0]), wanted))
        return None if found is None else [(found, True), canon(aa.args[1])]

    def _aa_index(self) -> dict:
        """(the base of A and its transpose, the word of B) -> aa(A, B), of every aa to compute."""
        if self._aas is None:
            self._aas = {}
            for n in self.nodes:
                if n.op != "aa":
                    continue
                y, fy = canon(n.args[1])
                if y.op == "mul" and not y.scalar:
                    coeff, scalars, word = self._word(y)
                    if coeff != 1.0 or scalars:
                        continue
                else:
                    word = [(y, False)]
                if fy:
                    word = [(x, not f) for x, f in reversed(word)]
                self._aas.setdefault((canon(n.args[0]), tuple(word)), n)
        return self._aas

    def _scalar_op(self, b: Term) -> _Ref:
        word = self._trace_word(b) if b.op == "trace" else None
        args = [] if word is not None else [self.ref(x) for x in b.args]
        if b.op in ("add", "mul"):
            return self._new(b, "scalar_op", [a.var for a in args], scalar=True, op=b.op)
        if b.op == "pow":
            return self._new(b, "scalar_op", [args[0].var], scalar=True, op="pow", exponent=float(b.data))
        if word is not None and (picked := self._onehot_trace(word)) is not None:  # a gather at the ids
            ids, partner = picked
            return self._new(b, "pick_sum", [ids, partner.read()], scalar=True)
        if word is not None:  # trace(P Q)
            p, q = (self._factor(f) for f in word)
            return self._new(b, "trace_product", [p.read(), q.read()], scalar=True)
        if b.op == "trace":
            return self._new(b, "trace", [self._matrix(args[0]).read()], scalar=True)
        # a template on 1 x 1 arrays (the scalars made so), read back as a number
        self._template_of(b)
        operands = [a.var if a.scalar else a.read() for a in args]
        return self._new(b, "scalar_template", operands, scalar=True, op=b.op, data=self._data(b))

    def _template_of(self, b: Term) -> str:
        """The target's template of ``b``'s operator (an FdslError where it has none)."""
        spec = OPS.get(b.op)
        template = self.target.template(spec, b.op) if spec is not None else None
        if template is None:
            raise FdslError("operator %s has no %s implementation, so code cannot be generated for %s%s"
                            % (op_name(b.op), self.target.name, short(b), "" if self.target.name == "numpy" else
                               " (its numpy template uses functions torch does not spell the same way)"))
        return template

    @staticmethod
    def _data(b: Term):
        """The number an operator's template may read (``{value}``, ``{exponent}``), as a float."""
        return float(b.data) if isinstance(b.data, Fraction) else b.data

    def _hadamard_args(self, b: Term) -> list:
        """The factors of a Hadamard product as computed: a factor ``C r`` (C a column of ones, r a
        row: every row is r) is r, broadcast, and ``c R`` (R a row of ones: every column is the
        column c) is c, as long as one factor has the full shape."""
        out, full = [], False
        for x in b.args:
            base, flip = canon(x)
            if base.op == "mul" and len(base.args) == 2 and self._ones(base.args[1]) and base.args[1].shape[0] == 1 \
                    and self._ones_column(base.args[0]) and len(b.args) > 1:
                continue  # rowsum(X) 1^t of a onehot X: all ones, it multiplies nothing
            if base.op == "mul" and len(base.args) == 2 and self._ones(base.args[0]) \
                    and base.args[0].shape[1] == 1 and not base.args[1].scalar:
                out.append(T.transpose(base.args[1]) if flip else base.args[1])
            elif base.op == "mul" and len(base.args) == 2 and self._ones(base.args[1]) \
                    and base.args[1].shape[0] == 1 and not base.args[0].scalar:  # c 1^t: every column is c
                out.append(T.transpose(base.args[0]) if flip else base.args[0])
            else:
                out.append(x)
                full = True
        return out if full else list(b.args)

    def _template(self, b: Term) -> _Ref:
        args = [self._matrix(self.ref(x)) for x in (self._hadamard_args(b) if b.op == "had" else b.args)]
        if b.op == "had" and len(args) == 1:  # the other factors were all ones
            return args[0]
        spec = OPS.get(b.op)
        self._template_of(b)
        if spec is not None and spec.elementwise and all(a.flip for a in args):
            # f(A^t, B^t) = f(A, B)^t entry by entry: computed on the stored matrices, read transposed
            # (a kernel over transposed views is a third slower: dgelu in a backward sweep)
            return self._new(b, "template", [a.t().read() for a in args], flip=True, op=b.op, data=self._data(b))
        return self._new(b, "template", [a.read() for a in args], op=b.op, data=self._data(b))

    # -- sums and the derivatives of relu and softmax

    def _sum(self, b: Term) -> _Ref:
        with_ids = self._onehot_sum(b, [self._summand(s) for s in b.args])
        if with_ids is not None:
            return with_ids
        flip = self.store_flip.get(b, False)
        parts, keys = [], []
        for s in b.args:
            sign, broadcast, t = self._summand(s)
            ref = self._matrix(self.ref(t))  # a number added to a 1 x 1 matrix is one too
            if flip:
                ref = ref.t()
            parts.append((broadcast, sign < 0, ref, canon(t)[0] in self.batched))
            keys.append((sign, broadcast, *canon(t)))
        reused = self._sum_from_earlier(b, keys, flip, dict(zip(keys, parts)))
        if reused is not None:
            return reused
        # full positive, full negative, rows: the first is full; among them, one that may carry a
        # batch axis first, so that the rest can be added in place into it
        parts.sort(key=lambda p: (p[0], not p[3], p[1]))
        broadcast0, negative0, first, _ = parts[0]
        # the terms of the first statement (the writer adds the rest in place, into an array of its own)
        if broadcast0:  # only rows: start from zeros of the full shape
            zeros = self._constant("zeros", b.shape if not flip else b.shape[::-1], "zeros")
            head, rest = [(False, zeros), parts[0][1:3]], parts[1:]
        elif negative0:
            head, rest = [(True, first)], parts[1:]
        else:
            head, rest = [(False, first), parts[1][1:3]], parts[2:]
        if rest and any(p[3] for p in rest) and (broadcast0 or not parts[0][3]):
            # the head has no batch axis but a later part may: add that one out of place
            i = next(i for i, p in enumerate(rest) if p[3])
            head.append(rest[i][1:3])
            rest = rest[:i] + rest[i + 1:]
        terms = head + [p[1:3] for p in rest]
        ref = self._new(b, "sum", [r.read() for _, r in terms], flip=flip,
                        signs=tuple(-1 if negative else 1 for negative, _ in terms), head=len(head))
        if len(set(keys)) == len(keys) and not broadcast0:
            self.sums.append((frozenset(keys), flip, ref))
        return ref

    def _sum_from_earlier(self, b: Term, keys: list, flip: bool, parts: dict) -> Optional[_Ref]:
        """A sum with every summand of a sum computed before as that sum plus the rest: a residual
        stream adds each layer's output to the last layer's sum (as the forward does), instead of
        the whole flat sum of the normal form again (then full parts, one with a batch first)."""
        wanted = set(keys)
        if len(wanted) != len(keys):
            return None
        best = None
        # the latest sum of these terms: a residual stream's last sum, a few sums back (an earlier,
        # smaller one would be as right, with more terms added again); looked for among the last
        # _RECENT sums only, so that the lowering stays linear in the sums of a deep program
        for summands, stored_flip, ref in reversed(self.sums[-_RECENT:]):
            if stored_flip == flip and len(summands) < len(wanted) and summands < wanted:
                best = (summands, ref)
                break
        if best is None or len(best[0]) < 2:
            return None
        summands, earlier = best
        rest = sorted((p for key, p in parts.items() if key not in summands), key=lambda p: (not p[3], p[0]))
        terms = [(False, earlier)] + [p[1:3] for p in rest]
        ref = self._new(b, "sum", [r.read() for _, r in terms], flip=flip,
                        signs=tuple(-1 if negative else 1 for negative, _ in terms), head=2)
        self.sums.append((frozenset(keys), flip, ref))
        return ref

    def _mask(self, a: Term) -> _Ref:
        """The mask ``a > 0`` of a base, as stored (flip as the base's storage). A scalar base (the
        number 1 of ``mm(eye(1), B)``, a trace) has no statement of its own: its mask is 1 x 1."""
        var = self.masks.get(a)
        if var is None:
            stored = self._matrix(self.ref(a)) if a.scalar else self.refs[a]
            var = self.masks[a] = self._value(stored.var, stored.var.shape, prefix="mask_")
            self._add(Op("mask", [var], [Read(stored.var)]))
        return _Ref(var, False if a.scalar else self.refs[a].flip)

    def _matrix(self, ref: _Ref) -> _Ref:
        """``ref`` as a 1 x 1 array when it is a scalar (a Python number): an argument of a matrix
        operator (mm, aa, a template) may be a scalar term such as eye(1) = 1 or trace(A)."""
        if not ref.scalar:
            return ref
        return self._new(None, "scalar_matrix", [ref.var], shape=(1, 1))

    def _mm(self, b: Term) -> _Ref:
        a, fa = canon(b.args[0])
        mask = self._mask(a)
        if fa:
            mask = mask.t()
        flip = mask.flip  # compute in the frame where the mask is contiguous
        x = self._matrix(self.ref(b.args[1]))
        if flip:
            x = x.t()
        return self._new(b, "masked", [Read(mask.var), x.read()], flip=flip)

    def _aa(self, b: Term) -> _Ref:
        a, fa = canon(b.args[0])
        s = self.softmaxes.get((a, fa))
        if s is None:  # no a(A) in the forward sweep: the softmax once per distinct A
            arg = self._matrix(self.ref(b.args[0]))
            s = self._new(None, "softmax", [arg.read()], shape=b.shape)
            self.softmaxes[(a, fa)] = s
        with_ids = self._onehot_aa(b, s)  # aa(A, X): S o (X - p 1^t), p the entries of S at the ids
        if with_ids is not None:
            return with_ids
        x = self._matrix(self.ref(b.args[1]))
        return self._new(b, "aa_given", [s.read(), x.read()])
