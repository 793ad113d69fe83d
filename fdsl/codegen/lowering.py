"""The lowering: terms to the statements of one straight-line function, shared work done once.

Vocabulary
----------
outputs      the terms to compute, by name: for gradients, ``G_W^t`` for every weight W of a normal
             form ``w = sum_W trace(G_W d(W))`` (``gradient_terms``), keyed by printed weight name.
lowering     the outputs turned into Python source: one statement per distinct computation, in
             topological order of the shared term graph of all outputs (looking through ``let``
             bodies), so the forward sweep (X_1, X_2, ...) and the backward sweep (the adjoints
             G_i of ``backprop``) are each done once, whatever number of outputs share them.
base         a term with its transposes and ``let`` names stripped: ``X_1``, ``X_1^t`` and the body
             of X_1 have one base. Each base is computed once; transposes are views (``.T``).
ref          how a term is read from the generated variables: a variable, transposed or not; scalar
             terms are Python floats (literals when they are constants such as ``s = k^(-1/2)``).
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
natural spelling whose names were found, are computed once. A Hadamard factor whose rows are all
one row, ``C r``, is r broadcast. On a target that ``folds_batches`` (torch), a product whose right
side alone varies per example is computed as the transpose of the reversed product, so the batch
is on the left, where torch folds it into one matrix product; on one with ``fused_layernorm``,
``layernorm(A)`` keeps its row statistics and ``dlayernorm(A, B)`` is the library's fused backward
from them. Before any of this, ``fusion.factored`` writes ``F A + F B`` as ``F (A + B)`` where
``A + B`` is computed anyway, and ``trace(P Q)`` is lowered as the sum of ``P^t o Q``. Products are
``fdsl.codegen.products`` (a mixin). The statements then go through ``fdsl.codegen.fusion``: a
weight's gradient summed over the batch inside its last product, sums of products and products
that share an operand as one product, and (torch) a product of two batches as one ``bmm`` and the
heads of an attention as one stacked chain; on torch, ``heads`` reads the stacks without
unstacking them and ``kernels`` calls torch's fused kernels (addmm, the affine layer norm and its
backward, the log-softmax backward); last, ``schedule`` computes every weight's gradient as soon as
what it reads is known.

The function around these statements and the module around it (imports, the runtime helpers) are
written by ``fdsl.codegen.writer``; the torch training classes by ``fdsl.codegen.generated``.
"""

from __future__ import annotations

import builtins
import keyword
import re
from fractions import Fraction
from typing import Mapping, Optional

from ..base.errors import FdslError
from ..core import terms as T
from ..core.ops import OPS
from ..core.ops import shown as op_name
from ..core.printers import short
from ..core.terms import Term, postorder
from .fusion import Stmt as _Stmt
from .fusion import (
    batched_products,
    factored,
    group_products,
    group_sums,
    shared_scalings,
    stacked_heads,
    summed_product,
    summed_reduction,
    transposed_reads,
    unlet,
)
from .heads import grouped_kinds, side_by_side
from .kernels import added_in_place, added_products, affine_layernorms, logsoftmax_backwards
from .products import Products, _Ref, canon
from .schedule import early_results
from .targets import DTYPES, TARGETS
from .writer import ModuleWriter

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


# ---- names ---------------------------------------------------------------------------------------


_TEMP = re.compile(r"t\d+\Z")
# Names the generated module gives a meaning of its own: its imports, its globals and functions,
# the builtins. A symbol called INPUTS or grads gets a variable with a suffix (INPUTS_2): a local
# of the name would hide the global from the function reading it (UnboundLocalError).
_RESERVED = {"np", "torch", "math", "values", "INPUTS", "DTYPE", "EXAMPLES", "EXAMPLE_SIZE", "WEIGHTS",
             "SHAPES", "DATA", "grads", "grads_and_loss", "loss", "FdslLoss", "Model"} | set(dir(builtins))


# ---- the lowering -------------------------------------------------------------------------------


class Lowering(Products, ModuleWriter):
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
        self.module_consts: list = []  # (var, code): built once, at import
        self.inputs: list = []  # statements reading values[...]
        self.array_inputs: dict = {}  # variable -> printed name, of the matrix inputs
        self.batch_inputs: set = set()  # the variables of inputs that may carry a batch axis
        self.dim_stmts: list = []  # sizes read off input shapes
        self.runtime_consts: list = []  # constants whose shape has a dim known only at call time
        self.body: list = []  # _Stmt, in topological order
        self.refs: dict = {}  # base -> _Ref
        self.names: set = set(_RESERVED)
        self.counter = 0
        self.avail: dict = {}  # canonical sub-word key -> (var, flip)
        self.masks: dict = {}  # base -> variable holding (value of base > 0) in its storage
        self.softmaxes: dict = {}  # (base, flip) -> _Ref of the row softmax of that argument
        self.layernorm_stats: dict = {}  # (base, flip) -> the variables of its row mean and 1/sigma
        self.sums: list = []  # (summands as (sign, broadcast, base, flip), flip, _Ref) of each sum computed
        self.const_memo: dict = {}
        self.flops = 0  # multiply-adds of the matrix products, for reports
        self.runtime_dims: dict = {}  # dim name -> variable
        self.let_names: dict = {}  # base -> the name of a let bound to it (X_1, G_7): its variable
        self._comments: dict = {}  # variable -> the binding it computes, for the reader
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

    # -- names

    def _fresh(self, hint: Optional[str] = None) -> str:
        if hint is not None:
            base = re.sub(r"\W", "_", hint)
            if not base.isidentifier() or keyword.iskeyword(base) or base.startswith("_") or _TEMP.match(base):
                base = "v_" + base
            name, i = base, 1
            while name in self.names:
                i += 1
                name = "%s_%d" % (base, i)
            self.names.add(name)
            return name
        while True:
            self.counter += 1
            name = "t%d" % self.counter
            if name not in self.names:
                self.names.add(name)
                return name

    # -- sizes and constants

    def size(self, dim) -> Optional[int]:
        if isinstance(dim, int):
            return dim
        return self.sizes.get(dim)

    def _guess(self, dim) -> int:
        s = self.size(dim)
        return s if s is not None else _GUESSED_SIZE

    def _dim_code(self, dim) -> tuple:
        """(code for the size of ``dim``, whether it is known only at call time)."""
        s = self.size(dim)
        if s is not None:
            return str(s), False
        var = self.runtime_dims.get(dim)
        if var is None:
            var = self.runtime_dims[dim] = self._bind_dim(dim)
        return var, True

    def _bind_dim(self, dim) -> str:
        for stmt, shape in self._input_shapes:
            for axis, side in enumerate(shape):
                if side == dim:
                    var = self._fresh("n_" + dim)
                    self.dim_stmts.append(_Stmt(var, "%s = %s.shape[%d]" % (var, stmt, axis), ()))
                    return var
        raise FdslError("dim %s has no size, and no input whose shape has it: declare it with one "
                        "(dim %s = 8) to generate code" % (dim, dim))

    def _shape_code(self, shape) -> tuple:
        parts = [self._dim_code(side) for side in shape]
        return "(%s)" % ", ".join(p for p, _ in parts), any(r for _, r in parts)

    def _constant(self, make: str, shape, hint) -> _Ref:
        """A constant array ``ones(shape)``, ``zeros(shape)`` or ``eye(rows)`` (``make``) in the
        working dtype: built once per dtype (and device) when its size is known."""
        parts = [self._dim_code(side) for side in shape]
        runtime = any(r for _, r in parts)
        args = parts[0][0] if make in ("eye", "causal") else "(%s)" % ", ".join(p for p, _ in parts)
        var = self._fresh(hint)
        stmt = (var, "%s = %s" % (var, self.target.constant(make, args)))
        (self.runtime_consts if runtime else self.module_consts).append(stmt)
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
            return [canon(self._summand(s)[2])[0] for s in b.args]
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

    def lower(self):
        for b in self.order:
            if b not in self.refs:
                self.refs[b] = self._emit(b)
        results = {}
        device = ", _dev" if self.target.device else ""
        inputs = {s.target for s in self.inputs}
        handed_out: set = set()
        for name, t in self.outputs.items():
            ref = self.ref(t)
            # (code without a batch, code with one): a gradient is summed over a batch
            if ref.scalar:
                shape, _ = self._shape_code(t.shape)
                code = "_full(%s, %s, _nb, _dt%s)" % (shape, ref.var, device)
                results[name] = ((code, code), (ref.var,))
            elif (ref.var in self._module_vars() or ref.var in self._runtime_const_vars() or ref.var in inputs
                  or ref.var in handed_out):
                # never hand out a constant, the caller's own array, or one array as two results
                code = "_copy(%s)" % ref.expr()
                results[name] = ((code, "_total(%s, _nb)" % code), (ref.var,))
            else:
                summed = bool(self.batched) and any(f(self.body, ref.var) for f in (summed_product, summed_reduction))
                results[name] = ((ref.expr(), ref.expr() if summed else "_total(%s, _nb)" % ref.expr()), (ref.var,))
                handed_out.add(ref.var)
        folds = self._batched_vars() if self.target.folds_batches else None
        returned = {v for (codes, uses) in results.values() for v in uses}
        self.body = shared_scalings(group_products(group_sums(transposed_reads(self.body, returned, folds), folds)))
        if self.target.folds_batches:  # torch: a product of two batches is one bmm, not matmul's five calls
            self.body = batched_products(self.body, self._batched_vars())
            # and the heads of an attention as one chain on stacks (fusion.stacked_heads)
            returned |= {self.ref(self.loss).var} if self.loss is not None else set()
            shapes = {ref.var: (b.shape[::-1] if ref.flip else b.shape) for b, ref in self.refs.items()
                      if not ref.scalar and not b.scalar}
            for key, (var, f) in self.avail.items():  # the products within products (a grouped one's slices)
                ends = (self._oriented_shape((self.order[key[0][0]], key[0][1]))[0],
                        self._oriented_shape((self.order[key[-1][0]], key[-1][1]))[1])
                shapes.setdefault(var, ends[::-1] if f else ends)
            self.body = stacked_heads(self.body, self._batched_vars(), shapes, returned)
            returned = set(returned)
            self.body = side_by_side(grouped_kinds(self.body, shapes), returned, shapes)
            self.body = added_products(self.body, returned)
            self.body = added_in_place(self.body, returned)
            self.body = logsoftmax_backwards(affine_layernorms(self.body, returned), returned)
        loss = {self.ref(self.loss).var} if self.loss is not None else set()
        self.body = early_results(self.body, returned | loss)  # each gradient when its adjoint is known
        return results

    def _batched_vars(self) -> set:
        """The variables that hold a value computed from the data (so may carry a batch axis)."""
        out = {ref.var for b, ref in self.refs.items() if b in self.batched and not ref.scalar}
        for key, (var, _) in self.avail.items():
            if any(self.order[uid] in self.batched for uid, _ in key):
                out.add(var)
        return out

    def ref(self, t: Term) -> _Ref:
        b, f = canon(t)
        if t.scalar:
            c = self.const_scalar(t)
            if c is not None:
                return _Ref(repr(c), False, True)
        r = self.refs[b]
        return r.t() if f else r

    def _emit_stmt(self, target, code, uses):
        self.body.append(_Stmt(target, code, tuple(u for u in uses if u.isidentifier())))

    def _new(self, b: Optional[Term], code_of_target, uses, scalar=False, flip=False) -> _Ref:
        var = self._fresh(self._hint(b))
        self._emit_stmt(var, code_of_target(var), uses)
        return _Ref(var, flip, scalar)

    def _hint(self, b: Optional[Term]) -> Optional[str]:
        return self.let_names.get(b)

    def _is_input(self, b: Term) -> bool:
        symbol = b.data[0]
        return symbol.kind != "dim" and symbol.value is None

    def _input(self, b: Term) -> _Ref:
        symbol, shape = b.data
        name = symbol.printed()
        var = self._fresh(name)
        if b.scalar:  # declared scalars and scalar weights
            self.inputs.append(_Stmt(var, "%s = _scalar(values, %r)" % (var, name), ()))
            return _Ref(var, False, True)
        self._input_shapes.append((var, shape))
        known = [self.size(side) for side in shape]
        shape_code = "(%s)" % ", ".join(str(s) for s in known) if None not in known else "None"
        batched = symbol.kind == "const"  # a constant may vary per example; a weight may not
        self.array_inputs[var] = name
        if batched:
            self.batch_inputs.add(var)
        device = ", _dev" if self.target.device else ""
        self.inputs.append(_Stmt(var, "%s = _input(values, %r, %s, %s, _dt%s)" % (var, name, shape_code, batched,
                                                                                    device), ()))
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
            return _Ref(repr(float(b.data)), False, True)
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
        if op == "a":
            a, fa = canon(b.args[0])
            ref = self._template(b)
            self.softmaxes.setdefault((a, fa), ref)
            return ref
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
            return self._new(b, lambda v: "%s = _dlayernorm_stats(%s, %s, %s, %s)" % (v, x.expr(), y.expr(), *stats),
                             [x.var, y.var] + list(stats))
        x = self._matrix(self.ref(b.args[0]))
        var = self._fresh(self._hint(b))
        stats = (self._fresh(var + "_mean"), self._fresh(var + "_rstd"))
        self._emit_stmt(var, "%s, %s, %s = _layernorm_stats(%s)" % (var, stats[0], stats[1], x.expr()), [x.var])
        self.layernorm_stats[(a, fa)] = stats
        return _Ref(var)

    def _symbol(self, b: Term) -> _Ref:
        symbol, shape = b.data
        if symbol.kind == "dim":
            code, _ = self._dim_code(symbol.name)
            return _Ref("float(%s)" % code, False, True)
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
        return word if coeff == 1.0 and not scalars and len(word) == 2 else None

    def _scalar_op(self, b: Term) -> _Ref:
        word = self._trace_word(b) if b.op == "trace" else None
        args = [] if word is not None else [self.ref(x) for x in b.args]
        uses = [a.var for a in args]
        if b.op == "add":
            code = " + ".join("(%s)" % a.var for a in args)
        elif b.op == "mul":
            code = " * ".join("(%s)" % a.var for a in args)
        elif b.op == "pow":
            code = "(%s) ** %r" % (args[0].var, float(b.data))
        elif word is not None:  # trace(P Q)
            p, q = (self._factor(f) for f in word)
            code, uses = "_trace_product(%s, %s)" % (p.expr(), q.expr()), [p.var, q.var]
        elif b.op == "trace":
            code = "_trace(%s)" % args[0].expr()
        else:  # a template on 1 x 1 arrays, read back as a number
            arrays = [_Ref(self.target.constant("full", "(1, 1), %s" % a.var)) if a.scalar else a for a in args]
            code = "_as_float(%s)" % self._template_code(b, arrays)
        return self._new(b, lambda v: "%s = %s" % (v, code), uses, scalar=True)

    def _template_code(self, b: Term, args) -> str:
        spec = OPS.get(b.op)
        template = self.target.template(spec, b.op) if spec is not None else None
        if template is None:
            raise FdslError("operator %s has no %s implementation, so code cannot be generated for %s%s"
                            % (op_name(b.op), self.target.name, short(b), "" if self.target.name == "numpy" else
                               " (its numpy template uses functions torch does not spell the same way)"))
        exprs = [a.expr() for a in args]
        data = repr(float(b.data)) if isinstance(b.data, Fraction) else repr(b.data)
        try:
            return template.format(*exprs, args=", ".join(exprs), args_sum=" + ".join(exprs),
                                     args_had=" * ".join(exprs), value=data, exponent=data)
        except (KeyError, IndexError) as e:
            raise FdslError("the numpy template of operator %s, %r, uses an unknown placeholder %s"
                            % (op_name(b.op), spec.numpy, e)) from None

    def _hadamard_args(self, b: Term) -> list:
        """The factors of a Hadamard product as computed: a factor ``C r`` (C a column of ones, r a
        row: every row is r) is r, broadcast, and ``c R`` (R a row of ones: every column is the
        column c) is c, as long as one factor has the full shape."""
        out, full = [], False
        for x in b.args:
            base, flip = canon(x)
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
        spec = OPS.get(b.op)
        if spec is not None and spec.elementwise and all(a.flip for a in args):
            # f(A^t, B^t) = f(A, B)^t entry by entry: computed on the stored matrices, read transposed
            # (a kernel over transposed views is a third slower: dgelu in a backward sweep)
            code = self._template_code(b, [a.t() for a in args])
            return self._new(b, lambda v: "%s = %s" % (v, code), [a.var for a in args], flip=True)
        code = self._template_code(b, args)
        return self._new(b, lambda v: "%s = %s" % (v, code), [a.var for a in args])

    # -- sums and the derivatives of relu and softmax

    def _sum(self, b: Term) -> _Ref:
        flip = self.store_flip.get(b, False)
        parts, keys = [], []
        for s in b.args:
            sign, broadcast, t = self._summand(s)
            ref = self.ref(t)
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
        uses = [p[2].var for p in parts]
        if broadcast0:  # only rows: start from zeros of the full shape
            zeros = self._constant("zeros", b.shape if not flip else b.shape[::-1], "zeros")
            uses.append(zeros.var)
            head, rest = zeros.var, parts
        elif negative0:
            head, rest = "-%s" % first.expr(), parts[1:]
        else:
            (_, neg1, second, _), rest = parts[1], parts[2:]
            head = "%s %s %s" % (first.expr(), "-" if neg1 else "+", second.expr())
        if rest and any(p[3] for p in rest) and (broadcast0 or not parts[0][3]):
            # the head has no batch axis but a later part may: add that one out of place
            i = next(i for i, p in enumerate(rest) if p[3])
            _, negative, r, _ = rest[i]
            head = "%s %s %s" % (head, "-" if negative else "+", r.expr())
            rest = rest[:i] + rest[i + 1:]
        ref = self._new(b, lambda v: "%s = %s" % (v, head), uses, flip=flip)
        for _, negative, r, _ in rest:
            self._emit_stmt(ref.var, "%s %s= %s" % (ref.var, "-" if negative else "+", r.expr()), [ref.var, r.var])
        if len(set(keys)) == len(keys) and not broadcast0:
            self.sums.append((frozenset(keys), flip, ref))
        return ref

    def _sum_from_earlier(self, b: Term, keys: list, flip: bool, parts: dict) -> Optional[_Ref]:
        """A sum with every summand of a sum computed before as that sum plus the rest: a residual
        stream adds each layer's output to the last layer's sum (as the forward does), instead of
        the whole flat sum of the normal form again (then full parts, one with a batch first)."""
        best = None
        for summands, stored_flip, ref in self.sums:
            if stored_flip == flip and summands < set(keys) and (best is None or len(summands) > len(best[0])):
                best = (summands, ref)
        if best is None or len(best[0]) < 2 or len(set(keys)) != len(keys):
            return None
        summands, earlier = best
        rest = sorted((p for key, p in parts.items() if key not in summands), key=lambda p: (not p[3], p[0]))
        (_, negative, second, _), rest = rest[0], rest[1:]
        head = "%s %s %s" % (earlier.var, "-" if negative else "+", second.expr())
        ref = self._new(b, lambda v: "%s = %s" % (v, head), [earlier.var, second.var], flip=flip)
        for _, negative, r, _ in rest:
            self._emit_stmt(ref.var, "%s %s= %s" % (ref.var, "-" if negative else "+", r.expr()), [ref.var, r.var])
        self.sums.append((frozenset(keys), flip, ref))
        return ref

    def _mask(self, a: Term) -> _Ref:
        """The mask ``a > 0`` of a base, as stored (flip as the base's storage). A scalar base (the
        number 1 of ``mm(eye(1), B)``, a trace) has no statement of its own: its mask is 1 x 1."""
        var = self.masks.get(a)
        if var is None:
            stored = self._matrix(self.ref(a)) if a.scalar else self.refs[a]
            var = self.masks[a] = self._fresh("mask_" + stored.var if stored.var.isidentifier() else None)
            self._emit_stmt(var, "%s = %s > 0" % (var, stored.var), [stored.var])
        return _Ref(var, False if a.scalar else self.refs[a].flip)

    def _matrix(self, ref: _Ref) -> _Ref:
        """``ref`` as a 1 x 1 array when it is a scalar (a Python number): an argument of a matrix
        operator (mm, aa, a template) may be a scalar term such as eye(1) = 1 or trace(A)."""
        if not ref.scalar:
            return ref
        device = ", _dev" if self.target.device else ""
        return self._new(None, lambda v: "%s = _scalar_matrix(%s, _dt%s)" % (v, ref.var, device), [ref.var])

    def _mm(self, b: Term) -> _Ref:
        a, fa = canon(b.args[0])
        mask = self._mask(a)
        if fa:
            mask = mask.t()
        flip = mask.flip  # compute in the frame where the mask is contiguous
        x = self._matrix(self.ref(b.args[1]))
        if flip:
            x = x.t()
        return self._new(b, lambda v: "%s = %s * %s" % (v, mask.var, x.expr()), [mask.var, x.var], flip=flip)

    def _aa(self, b: Term) -> _Ref:
        a, fa = canon(b.args[0])
        s = self.softmaxes.get((a, fa))
        if s is None:  # no a(A) in the forward sweep: the softmax once per distinct A
            arg = self._matrix(self.ref(b.args[0]))
            s = self._new(None, lambda v: "%s = _softmax(%s)" % (v, arg.expr()), [arg.var])
            self.softmaxes[(a, fa)] = s
        x = self._matrix(self.ref(b.args[1]))
        return self._new(b, lambda v: "%s = _aa_given(%s, %s)" % (v, s.expr(), x.expr()), [s.var, x.var])
