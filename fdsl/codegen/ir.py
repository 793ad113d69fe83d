"""The statement IR: the generated sweep as data, from the lowering to the writers.

Vocabulary
----------
value     ``Value``: an array (or a number) made once, by one op: its shape as stored (rows, cols:
          ints or dim names; None where unknown), whether it may carry a batch axis (``batched``:
          computed from the data), the heads it stacks (``heads``: h for ``(..., h, rows, cols)``,
          0 for a plain matrix), whether it is a Python number (``scalar``), and a name hint. The
          writer gives it its name.
scalar    an operand that is a number: a float literal, a scalar ``Value`` (a scalar given with
          the data, a learned scalar weight, a scalar computed in the sweep) or a ``Dim`` (a dim's
          size as a float). A scale is a tuple of them, multiplied: however the program spelled
          it (``0.125``, ``k^(-1/2)``, ``s`` from the data, ``tau[i] s``), it is an operand.
ids       a value that holds the ids of a onehot constant (``Value.ids``): its shape is the one-hot
          matrix's, (n, v), its array one integer a row; only ``lookup``, ``scatter``, ``pick_sum``,
          ``add_ids``, ``aa_ids``, ``scatter_into`` and ``onehot`` read it (``fdsl.codegen.onehot``).
read      ``Read(value, t, scale)``: how an op reads a value: as stored or transposed (``t``), and
          multiplied by a scale (a tuple of scalars; empty: not scaled).
op        ``Op(kind, outs, args, attrs)``: one step of the sweep. ``kind`` is from the closed table
          ``KINDS`` (what it does, whether it updates an operand in place); ``outs`` the values it
          makes; ``args`` its operands (reads, scalars; an n-ary op lists them flat and keeps the
          structure in ``attrs``); ``attrs`` the rest (an axis, an operator's name, signs, a
          scale applied after it is made, ``out_scale``, whose scalars it reads too).
sweep     ``Sweep``: the ordered ops of the generated function with two indexes that every
          change keeps up to date, ``maker`` (value -> the op that makes it) and ``readers``
          (value -> the ops that read it), so a pass finds what it rewrites without scanning.
check     ``check(sweep)``: single assignment, every read after its value is made, the inner
          sizes of every product equal where known, and no read of a value after an op that
          updated it in place. The tests run it after every pass.

How each kind is encoded (operands, attributes) and how the writers spell it: ``docs/ir.md``.

Passes rewrite a sweep structurally, pattern against op: ``graph_rewrite`` drives rules indexed by
op kind (tinygrad's ``PatternMatcher``), or a pass walks the sweep once; only the writer
(``fdsl.codegen.writer``) spells Python. Anchors: tinygrad's UOps, torch.fx's Graph and
Node (``users`` kept by the graph), JAX's jaxprs and ``typecheck_jaxpr``.
"""

from __future__ import annotations

import itertools
from typing import Iterable, NamedTuple, Optional, Union

from ..base.errors import FdslError


class Value:
    """An array or number made once (see the module doc). Compared by identity."""

    __slots__ = ("id", "shape", "batched", "heads", "scalar", "hint", "prefix", "suffix", "numbered", "name", "ids")
    _ids = itertools.count()

    def __init__(self, shape=None, batched=False, heads=0, scalar=False, hint=None, prefix="", suffix="",
                 numbered=False):
        self.id = next(Value._ids)  # creation order: the writer names values in it
        self.shape = tuple(shape) if shape is not None else None
        self.batched = batched
        self.heads = heads
        self.scalar = scalar
        self.hint = hint  # a name hint (a let's name, an input's printed name), or a Value ...
        self.prefix = prefix  # ... whose name this one's takes between this prefix (``mask_X``) ...
        self.suffix = suffix  # ... and this suffix (``X_h``)
        # a clash of names is resolved by a number (``X_2``: the lowering's values) or by
        # underscores (``X_h_``: values the passes make)
        self.numbered = numbered
        self.name = None  # set by the writer
        # the ids of a onehot constant (an input): ``shape`` is the one-hot matrix's, (n, v), and the
        # array holds one integer a row, (n,) or (batch, n); only the kinds that read ids read it
        self.ids = False

    def __repr__(self):
        return "%%%d%s" % (self.id, "" if self.hint is None or isinstance(self.hint, Value) else ":" + self.hint)

    def t_shape(self, t: bool):
        """The shape as read, transposed or not."""
        if self.shape is None:
            return None
        return self.shape[::-1] if t else self.shape


class Dim(NamedTuple):
    """A dim's size as a float scalar: an int, or the Value that holds a size read at run time."""

    size: Union[int, Value]


class Read(NamedTuple):
    """How an op reads a value: transposed or not, times a scale (see the module doc)."""

    value: Value
    t: bool = False
    scale: tuple = ()

    def T(self) -> "Read":
        return self if self.value.scalar else self._replace(t=not self.t)

    @property
    def shape(self):
        return self.value.t_shape(self.t)


class Kind(NamedTuple):
    """An entry of the table of op kinds."""

    doc: str
    inplace: Optional[int] = None  # the operand (an index into args) updated in place, if any
    multi: bool = False  # makes several values


KINDS = {
    # the prologue: what the sweep reads
    "input": Kind("an array input: values[name], checked against its shape, cast to the working dtype"),
    "scalar_input": Kind("a number input: values[name]"),
    "dim": Kind("a dim's size read off an input's shape (attrs axis)"),
    "const": Kind("a constant array: ones, zeros, eye, causal (attrs make, shape)"),
    "ids_input": Kind("the ids of a onehot constant: values[name], checked (attrs name, rows, vocab)"),
    # products
    "matmul": Kind("left @ right (attrs: total, summed over the batch; bmm, two batches; out_scale)"),
    "sum_axis": Kind("a sum along an axis, kept 2-d (attrs axis; total; view_t: read transposed after)"),
    "grouped": Kind("products sharing an operand as one (attrs side cols|rows, total)", multi=True),
    "sum_of_products": Kind("sum_i A_i B_i as one product (attrs n: the A_i are args[:n])"),
    "cat_matmul": Kind("A @ [B_1; ...; B_k] (the B_i concatenated along the rows)"),
    # onehot constants given as ids (fdsl.codegen.onehot): no one-hot matrix is made but by "onehot"
    "lookup": Kind("onehot(ids) @ A as the rows of A at the ids (an embedding lookup)"),
    "scatter": Kind("onehot(ids)^t @ G as G's rows added at the ids into zeros (attrs vocab; total)"),
    "pick_sum": Kind("trace(onehot(ids)^t A) as the sum of A's entries at the ids"),
    "scatter_into": Kind("P + onehot(ids)^t G (read transposed: attrs t) as G's rows added at the ids into P, "
                         "which dies there (attrs vocab; total)", inplace=0),
    "aa_ids": Kind("aa(A, onehot(ids)) from S = a(A): S o (onehot(ids) - p 1^t), p the entries of S at the ids"),
    "add_ids": Kind("P + sign s onehot(ids), written into P, which dies there (attrs sign; the scalars s are "
                    "the operands after the ids)", inplace=0),
    "onehot": Kind("the one-hot matrix of ids, (n, vocab) or (batch, n, vocab), for a use no kind above computes "
                   "(attrs vocab)"),
    "split_total": Kind("the products of a side-by-side matrix summed over the batch, split (attrs n, axis)",
                        multi=True),
    # sums and scaling
    "sum": Kind("a signed sum of reads (attrs signs, head: the terms of its first statement)"),
    "scale": Kind("a read times its scale (a new array)"),
    "add_into": Kind("P + Z written into P, which dies there", inplace=0),
    "addmm": Kind("C + A @ B as one kernel"),
    # not an addmm of more operands: the checker reads an addmm's last two as the product's sides
    "cat_addmm": Kind("C + A @ [B_1; ...; B_k] as one kernel (the B_i concatenated along the rows)"),
    # elementwise and row-wise operators
    "template": Kind("an operator of the table by its target template (attrs op, data)"),
    "remade": Kind("a value V = f(U...) made again for the backward: f(U...) in a traced graph, V itself run "
                   "eagerly (args V, then f's; attrs of, f's op kind, and f's own; fdsl.codegen.remade)"),
    "mask": Kind("A > 0"),
    "masked": Kind("mask * B: mm(A, B)"),
    "softmax": Kind("row-wise softmax"),
    "aa_given": Kind("aa(A, B) from S = a(A)"),
    "causal_softmax": Kind("softmax(L R + M) for M a causal mask, made a block of rows at a time up to the "
                           "diagonal (fdsl.codegen.causal)"),
    "layernorm_stats": Kind("layernorm(A) with its row mean and 1/sigma", multi=True),
    "dlayernorm_stats": Kind("dlayernorm(A, B) from the forward's statistics"),
    "layernorm_affine": Kind("layernorm(A) o C g + C b, one kernel, with its statistics", multi=True),
    "dlayernorm_affine": Kind("the affine layer norm's backward: input, gain and bias gradients", multi=True),
    "dlogsoftmax_given": Kind("B - softmax(Z) o rowsum(B) 1^t from L = logsoftmax(Z)"),
    # scalars
    "scalar_op": Kind("a scalar sum, product or power of scalars (attrs op, exponent)"),
    "trace": Kind("trace(A)"),
    "trace_product": Kind("trace(P Q) as the sum of P^t o Q"),
    "scalar_template": Kind("an operator's template on 1 x 1 arrays, read back as a number"),
    "scalar_matrix": Kind("a number as a 1 x 1 array"),
    # the heads of an attention
    "stack": Kind("matrices stacked along a head axis before the last two"),
    "unbind": Kind("a stack's heads as views", multi=True),
    "grouped_heads": Kind("the grouped Q, K, V product whose kinds are stacks of heads (attrs h; biased: the "
                          "second half of its B are the heads' bias rows, added)", multi=True),
    "side_by_side": Kind("stacks' heads as the columns of one matrix"),
    "side_products": Kind("side_by_side of the products A_i B_i of stacks, each written into its columns (attrs "
                          "kinds: causal kinds or None; scales: numbers or None)"),
    "split": Kind("a matrix cut into n equal parts along an axis, views (attrs n, axis)", multi=True),
}


# the kinds of the prologue: what the sweep reads, made before it (an input, a dim, a constant)
PROLOGUE = frozenset({"input", "ids_input", "scalar_input", "dim", "const"})


class Op:
    """One step of the sweep (see the module doc)."""

    __slots__ = ("kind", "outs", "args", "attrs")

    def __init__(self, kind: str, outs, args=(), **attrs):
        if kind not in KINDS:
            raise FdslError("internal: unknown op kind %r" % kind)
        self.kind = kind
        self.outs = tuple(outs)
        self.args = tuple(args)
        self.attrs = attrs

    @property
    def out(self) -> Value:
        return self.outs[0]

    def reads(self) -> list:
        """The Reads among the operands, in order."""
        return [a for a in self.args if isinstance(a, Read)]

    def values_read(self) -> list:
        """Every value the op reads (through reads, scales and scalar operands), once each, in order."""
        out: dict = {}
        for a in tuple(self.args) + tuple(self.attrs.get("out_scale", ())):  # (a scale after it is read too)
            for v in values_of(a):
                out[v] = None
        return list(out)

    def inplace(self) -> Optional[Value]:
        """The value this op updates in place (it dies here), if any."""
        k = KINDS[self.kind].inplace
        return None if k is None else self.args[k].value

    def __repr__(self):
        return "%s = %s(%s%s)" % (", ".join(map(repr, self.outs)), self.kind, ", ".join(map(_show, self.args)),
                                  "".join(", %s=%r" % kv for kv in self.attrs.items()))


def transposed_value(v: Value) -> Value:
    """A new value to hold the transpose of ``v``: its shape reversed, its batch and heads kept."""
    return Value(shape=v.shape[::-1] if v.shape is not None else None, batched=v.batched, heads=v.heads, hint=v)


def transposed_product(op: Op) -> Op:
    """The product ``op`` (``matmul``, A @ B) made the other way round, B^t A^t, into a new value:
    its result is the transpose of ``op``'s (its attributes kept: a scale after it commutes)."""
    a, b = op.args
    return Op("matmul", [transposed_value(op.out)], [b.T(), a.T()], **op.attrs)


def reread(op: Op, to: dict) -> Op:
    """``op`` reading, for each value in ``to``, its image instead: a read's value (its transpose
    and scale kept), a scalar operand, the scalars of a scale and of ``out_scale``; ``op`` itself
    where it reads none of them (a pass that replaces values rewrites their readers with it)."""
    def swap(a):
        if isinstance(a, Read):
            return Read(to.get(a.value, a.value), a.t, tuple(swap(s) for s in a.scale))
        return to.get(a, a) if isinstance(a, Value) else a

    args = tuple(swap(a) for a in op.args)
    attrs = op.attrs
    if "out_scale" in attrs:
        attrs = dict(attrs, out_scale=tuple(swap(s) for s in attrs["out_scale"]))
    return op if args == op.args and attrs == op.attrs else Op(op.kind, op.outs, args, **attrs)


def values_of(a) -> list:
    """The values an operand reads: a value, a read's value and its scale's, a dim's size."""
    if isinstance(a, Value):
        return [a]
    if isinstance(a, Read):
        return [a.value] + [v for s in a.scale for v in values_of(s)]
    if isinstance(a, Dim):
        return [a.size] if isinstance(a.size, Value) else []
    return []


def _show(a) -> str:
    if isinstance(a, Read):
        text = repr(a.value) + ("^t" if a.t else "")
        return text if not a.scale else "(%s * %s)" % (" * ".join(map(_show, a.scale)), text)
    if isinstance(a, Dim):
        return "dim(%s)" % (a.size,)
    return repr(a)


class Sweep:
    """The ordered ops of the generated function and the indexes kept with them (module doc).

    The order is a list; passes that move ops compute positions once (``positions``) and rebuild
    the list once (``reorder``), so a pass stays linear in the sweep."""

    def __init__(self, ops: Iterable[Op] = ()):
        self.ops: list = []
        self.maker: dict = {}
        self.readers: dict = {}
        for op in ops:
            self.append(op)

    # -- the indexes

    def _index(self, op: Op):
        for v in op.outs:
            if v in self.maker:
                raise FdslError("internal: %r is made twice (%r and %r)" % (v, self.maker[v], op))
            self.maker[v] = op
        for v in op.values_read():
            self.readers.setdefault(v, {})[op] = None

    def _unindex(self, op: Op):
        for v in op.outs:
            if self.maker.get(v) is op:
                del self.maker[v]
        for v in op.values_read():
            users = self.readers.get(v)
            if users is not None:
                users.pop(op, None)

    def users(self, v: Value) -> list:
        """The ops that read ``v``, in no particular order."""
        return list(self.readers.get(v, ()))

    def updater(self, v: Value) -> Optional[Op]:
        """The op that updates ``v`` in place, if one does (one at most: nothing reads it after)."""
        return next((op for op in self.readers.get(v, ()) if op.inplace() is v), None)

    def updated_between(self, values, pos: dict, lo: int, hi: int) -> bool:
        """Whether an op at a position in [lo, hi) (``pos``: the positions) updates one of
        ``values`` in place: a pass may not move a reader of it across that op."""
        return any((op := self.updater(v)) is not None and lo <= pos[op] < hi for v in values)

    # -- changes

    def append(self, op: Op) -> Op:
        self._index(op)
        self.ops.append(op)
        return op

    def replace(self, ops_out: Iterable[Op], ops_in: Iterable[Op], at: Optional[Op] = None) -> None:
        """Remove ``ops_out`` and put ``ops_in`` where ``at`` was (default: the first of ``ops_out``)."""
        ops_out = list(ops_out)
        anchor = at if at is not None else ops_out[0]
        mapping = {op: [] for op in ops_out}
        mapping[anchor] = list(ops_in) + ([anchor] if anchor not in ops_out else [])
        self.rewrite(mapping)

    def rewrite(self, mapping: dict, before: Optional[dict] = None, after: Optional[dict] = None) -> None:
        """Many changes at once, in one pass over the list: ``mapping`` op -> the ops replacing it
        (an empty list removes it; the op itself among them keeps it); ``before``/``after``: op ->
        ops put just before/after it. Every replaced op leaves the indexes before any new op
        enters them, so a new op may make a value that a replaced one made."""
        before, after = before or {}, after or {}
        for op in mapping:
            self._unindex(op)
        out = []
        for op in self.ops:
            out.extend(before.get(op, ()))
            new = mapping.get(op, None)
            out.extend([op] if new is None else new)
            out.extend(after.get(op, ()))
        for new in mapping.values():
            for n in new:
                self._index(n)
        for extra in list(before.values()) + list(after.values()):
            for n in extra:
                self._index(n)
        self.ops = out

    def reorder(self, ops: list) -> None:
        """The same ops in another order (a permutation)."""
        assert len(ops) == len(self.ops)
        self.ops = list(ops)

    def positions(self) -> dict:
        """op -> its position now."""
        return {op: i for i, op in enumerate(self.ops)}

    def substitute(self, op: Op, old: Value, new: Read) -> Op:
        """``op`` with every read of ``old`` replaced by ``new`` composed with it (transposes and
        scales combine), put in its place; the new op."""
        def swap(a):
            if isinstance(a, Read) and a.value is old:
                return Read(new.value, new.t ^ a.t, new.scale + a.scale)
            return a
        changed = Op(op.kind, op.outs, [swap(a) for a in op.args], **op.attrs)
        self.rewrite({op: [changed]})
        return changed

    def __iter__(self):
        return iter(self.ops)

    def __len__(self):
        return len(self.ops)


# ---- the checker -------------------------------------------------------------------------------


def check(sweep: Sweep, given: Iterable[Value] = ()) -> None:
    """Raise FdslError where the sweep breaks an invariant (see the module doc); ``given``: the
    values made before the sweep (inputs, dims, constants)."""
    made = set(given)
    dead: dict = {}  # value -> the op that updated it in place
    for op in sweep.ops:
        for v in op.values_read():
            if v in dead:
                raise FdslError("internal: %r reads %r after %r updated it in place" % (op, v, dead[v]))
            if v not in made:
                raise FdslError("internal: %r reads %r before it is made" % (op, v))
        victim = op.inplace()
        if victim is not None:
            dead[victim] = op
        for v in op.outs:
            if v in made:
                raise FdslError("internal: %r assigns %r a second time" % (op, v))
            made.add(v)
        if op.kind in ("matmul", "addmm", "causal_softmax"):
            left, right = op.args[:2] if op.kind == "causal_softmax" else op.args[-2:]
            a, b = left.shape, right.shape
            if a is not None and b is not None and a[1] != b[0]:
                raise FdslError("internal: %r multiplies %s by %s" % (op, a, b))
    live = set(sweep.ops)
    for v, users in sweep.readers.items():
        for op in users:
            if op not in live:
                raise FdslError("internal: the index has %r reading %r, but it is not in the sweep" % (op, v))
    for v, op in sweep.maker.items():
        if v not in op.outs or op not in live:
            raise FdslError("internal: the index says %r makes %r" % (op, v))


# ---- the driver of the passes ------------------------------------------------------------------


def graph_rewrite(sweep: Sweep, rules: dict, ctx=None, rounds: int = 16) -> int:
    """Apply ``rules`` (op kind -> functions, tinygrad's PatternMatcher indexed by head) until none
    fires; the number of rewrites. Each function is called as ``fn(sweep, op, pos, ctx)`` with
    ``pos`` the positions at the start of the round, and returns None (no match) or a mapping
    op -> the ops that replace it (``[]``: removed; the op itself among them: kept, with new ops
    beside it). The changes of a round are applied together, once (a round is linear in the
    sweep); an op that an earlier match of the round claimed is not matched again in it. More
    rounds than ``rounds`` is a loop among the rules: an internal error, not a hang."""
    total = 0
    for _ in range(rounds):
        pos = sweep.positions()
        claimed: set = set()
        mapping: dict = {}
        for op in list(sweep.ops):
            if op in claimed:
                continue
            for fn in rules.get(op.kind, ()):
                got = fn(sweep, op, pos, ctx)
                if got is None or any(o in claimed for o in got):
                    continue
                claimed.update(got)
                mapping.update(got)
                total += 1
                break
        if not mapping:
            return total
        sweep.rewrite(mapping)
    raise FdslError("internal: the passes over the generated code do not settle (infinite loop in graph_rewrite)")
