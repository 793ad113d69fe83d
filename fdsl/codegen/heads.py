"""The heads of an attention as stacks: alike chains done once on a head axis, read side by side.

Vocabulary
----------
chain        the ops of one head of an attention, one after the other (``scores = matmul((s * q),
             k^t, bmm); p = softmax(scores); out = matmul(p, v, bmm)``), each head's on its own
             slices of the grouped Q, K, V product.
alike        two ops are alike when they have the same kind and attributes and read alike: the
             same pattern of values (which operands are one value), each read transposed or not
             alike, with equal scales (a scale compares by equality, whatever spelled it: the
             literal 0.125, a scalar given with the data, ``tau_i * s`` computed once per block
             and read by every head: all stack). Two chains are alike when their ops are, one by
             one.
stackable    the kinds whose runtime acts on each matrix of a stack (a head axis before the last
             two) alike: ``matmul`` (not summed over the batch), ``softmax``, ``aa_given``,
             ``mask``, ``masked``, ``sum``, ``scale`` and the Hadamard product (``template`` of
             op ``had``), the calls and operators the text passes let into a chain (``_bmm``,
             ``_softmax``, ``_aa_given``, ``.mT``, ``@ * + - >``). Row-wise operators of the table
             (layer norms, sums along an axis, other templates) would act alike too, but are not
             stacked: no attention has them between its products, and this keeps what is
             generated as it was.
stack        a value of h heads' matrices along a head axis before the last two, shape ``(...,
             h, rows, cols)`` (``Value.heads = h``; its ``shape`` is one head's): a ``stack``
             op of per-head values, an op of a stacked chain, or a kind of ``grouped_heads``.
slot         how an operand of a stacked op is found: ``shared`` (one value read by every head:
             read as it is, and where it may carry a batch axis, with a head axis of 1 before its
             matrices, so it broadcasts against the heads, not the batch against them: the
             op's attribute ``unsqueeze``, the values so read), ``outer`` (one value per head,
             made before the run: their stack), ``inner`` (made by the chains: the stacked op's
             result).
element      a value that is one head of a stack (an out of ``unbind``), or such a head times a
             scale (a ``scale`` op of it): (stack, head, heads, scale).
side by side the heads of one or more stacks as the columns of one matrix, ``(..., rows, h cols)``
             per stack and the stacks one after the other (``side_by_side``): the one copy that
             autograd's multi-head attention makes too (its ``transpose(1, 2).reshape``).
kinds        the products of the forward's grouped Q, K, V product (``grouped``) that are stacked
             head by head: read as views of the one product (``grouped_heads``).

products     ``side_products``: a side-by-side matrix whose stacks are products (``matmul`` bmm,
             causal or not) that nothing else reads, each product written into its columns as it
             is made, its scale the product's alpha (``products_side_by_side``): the stacks are
             not made, nor copied in (an attention's dq, dk, dv; its forward's P V).

``stacked_heads`` does each run of h alike chains as one chain on stacks; after it the heads are
computed on stacks, but the ops around them still read them one by one: the grouped product of Q,
K and V is split into 3 h matrices and stacked again (3 copies), and the weights' gradients and
the adjoint of the attention's input concatenate the 3 h heads (``grouped`` summed over the
batch, ``sum_of_products``: a copy each), scaled one by one. ``grouped_kinds`` makes the first one
product whose kinds are views; ``side_by_side`` makes the others read one side-by-side matrix of
the (scaled) stacks, made once and shared: as the per-head operands commute in a sum of products,
its pairs are reordered to the matrix's columns, and the results of a grouped product are its
outs in that order. Views and splits cut evenly: only heads of widths known to be equal
(``Value.shape``, as stored) are put side by side. Torch target only (stacks are made only there).
"""

from __future__ import annotations

import math
from typing import Optional

from .families import concatenated
from .ir import Dim, Op, Read, Sweep, Value, transposed_product

# the kinds a stacked chain may have (module doc: stackable); a template only of these operators
_STACKABLE = {"matmul", "softmax", "aa_given", "mask", "masked", "sum", "scale", "template"}
_STACKABLE_TEMPLATES = {"had"}
_LONGEST = 12  # the most ops of one chain looked for


# ---- the heads of an attention as one stacked computation ------------------------------------------


def _pattern(op: Op) -> Optional[tuple]:
    """(what alike ops share: kind, attributes, each operand's slot in the op's values with its
    transpose and scale; the op's values in order of first appearance, its result first), or None
    for an op that cannot be part of a stacked chain."""
    if op.kind not in _STACKABLE or len(op.outs) != 1 or op.inplace() is not None:
        return None
    if op.kind == "template" and op.attrs.get("op") not in _STACKABLE_TEMPLATES:
        return None
    if op.kind == "matmul" and op.attrs.get("total"):
        return None  # summed over the batch: one matrix, not one per head
    values = [op.out]
    reads = []
    for a in op.args:
        if isinstance(a, Read):
            if not any(a.value is v for v in values):
                values.append(a.value)
            reads.append((next(k for k, v in enumerate(values) if v is a.value), a.t, a.scale))
        else:  # a scalar operand: the same for every head, or the ops are not alike
            reads.append(("operand", a))
    return (op.kind, tuple(sorted(op.attrs.items())), tuple(reads)), tuple(values)


def _known(shape) -> bool:
    return shape is not None and None not in shape


def stacked_heads(sweep: Sweep, kept: set) -> None:
    """Runs of h alike chains of ops, one after the other (the heads of an attention), done as one
    chain on stacks of h matrices: the per-head operands stacked along a head axis before the last
    two (a ``stack`` op, or a stack made before: the forward's probabilities, read again by the
    backward), one op for each op of a chain, and the results read after the run (or ``kept``:
    read after the sweep) as views of their stack (``unbind``). So the h heads' products are one
    batched product each, as autograd's multi-head attention does them. Of the runs from one op,
    the one that stacks the most ops; only runs with a product."""
    ops = list(sweep.ops)
    patterns = [_pattern(op) for op in ops]
    pos = sweep.positions()
    stacks: dict = {}  # tuple of per-head values -> their stack (a Value), for reuse
    by_set: dict = {}  # frozenset of per-head values -> the first tuple of them stacked
    mapping: dict = {}
    unbinds: list = []
    i = 0
    while i < len(ops):
        best = None
        for length in range(1, _LONGEST + 1):
            if i + 2 * length > len(ops) or any(p is None for p in patterns[i:i + length]):
                break
            h = 1
            while i + (h + 1) * length <= len(ops) and all(
                    patterns[i + h * length + p] is not None and patterns[i + h * length + p][0] == patterns[i + p][0]
                    for p in range(length)):
                h += 1
            if h >= 2 and (best is None or h * length > best[0] * best[1]) and any(
                    ops[i + p].kind == "matmul" for p in range(length)):  # a product to batch
                plan = _stack_plan(sweep, ops, patterns, i, length, h, pos, kept, stacks, by_set)
                if plan is not None:
                    best = (h, length, plan)
        if best is None:
            i += 1
            continue
        h, length, (order, slots, results) = best
        new: list = []
        made: dict = {}  # tuple of per-head values -> the stack that holds them in this run
        for kind, tup in (slot for op_slots in slots for slot in op_slots):
            if kind == "shared" or tup in made:
                continue
            if kind == "outer" and tup in stacks:
                made[tup] = stacks[tup]
                continue
            made[tup] = Value(shape=tup[0].shape, batched=any(v.batched for v in tup), heads=h, hint=tup[0],
                              suffix="_h")
            if kind == "outer":
                new.append(Op("stack", [made[tup]], [Read(v) for v in tup]))
                stacks[tup] = made[tup]
                by_set.setdefault(frozenset(tup), tup)
        for p in range(length):
            model = ops[i + order[0] * length + p]
            reads = patterns[i + order[0] * length + p][0][2]
            args, unsqueeze = [], []
            for a, read in zip(model.args, reads):
                if not isinstance(a, Read):
                    args.append(a)
                    continue
                kind, tup = slots[p][read[0]]
                if kind == "shared":
                    # a head axis of 1 before its matrices, so that it broadcasts against the stacks
                    # (batch, heads, rows, cols), not the batch against the heads
                    if a.value.batched and not a.value.scalar and a.value not in unsqueeze:
                        unsqueeze.append(a.value)
                    args.append(a)
                else:
                    args.append(Read(made[tup], a.t, a.scale))
            attrs = dict(model.attrs)
            if unsqueeze:
                attrs["unsqueeze"] = tuple(unsqueeze)
            new.append(Op(model.kind, [made[slots[p][0][1]]], args, **attrs))
        for tup in results:
            unbind = Op("unbind", tup, [Read(made[tup])])
            new.append(unbind)
            unbinds.append(unbind)
            stacks[tup] = made[tup]
            by_set.setdefault(frozenset(tup), tup)
        # the run's ops go, and the stacked chain takes the place of the last of them: a rewrite
        # unindexes the ops in order, so the results' views are made after their ops are gone
        for k in range(i, i + h * length - 1):
            mapping[ops[k]] = []
        mapping[ops[i + h * length - 1]] = new
        i += h * length
    if not mapping:
        return
    sweep.rewrite(mapping)
    # views of a stack that nothing reads now (a later run read the stack itself) are not made
    dead = [op for op in unbinds if not any(sweep.readers.get(v) or v in kept for v in op.outs)]
    if dead:
        sweep.rewrite({op: [] for op in dead})


def _stack_plan(sweep: Sweep, ops, patterns, i, length, h, pos, kept, stacks, by_set) -> Optional[tuple]:
    """(the order of the heads, each op's slots by its values (module doc: slot) as ("shared",
    (v,)), ("outer", one value per head: stacked before the run), ("inner", one per head: made in
    the chains), the inner tuples read after the run) for the run of ``h`` chains of ``length`` ops
    from ``i``; None where the chains are not alike (a value of one head read by another, a
    per-head operand made within the run, operands of different shapes, unknown shapes or
    different batching, an operand that is itself a stack)."""
    end = i + h * length
    inner: list = []  # per head: value -> the position in the chain of the op that makes it
    for j in range(h):
        inner.append({ops[i + j * length + p].out: p for p in range(length)})

    def made_in_run(v) -> bool:
        maker = sweep.maker.get(v)
        return maker is not None and i <= pos[maker] < end

    slots = []
    for p in range(length):
        per = [patterns[i + j * length + p][1] for j in range(h)]
        if len({len(vs) for vs in per}) != 1:
            return None
        row = []
        for s in range(len(per[0])):
            tup = tuple(per[j][s] for j in range(h))
            where = [inner[j].get(v) for j, v in enumerate(tup)]
            distinct = len(set(tup)) == h
            if all(w is not None for w in where):
                if len(set(where)) != 1 or where[0] > p or not distinct:
                    return None
                row.append(("inner", tup))
            elif any(w is not None for w in where):
                return None  # one head reads what another made
            elif len(set(tup)) == 1:  # (made in the run, it would be one head's: not alike above)
                if tup[0].heads:
                    return None
                row.append(("shared", tup[:1]))
            else:
                if not distinct or any(made_in_run(v) or v.heads for v in tup):
                    return None
                if len({v.batched for v in tup}) != 1 or len({v.shape for v in tup}) != 1 or not _known(tup[0].shape):
                    return None
                row.append(("outer", tup))
        if all(kind == "shared" for kind, _ in row[1:]):  # (row[0]: the op's own result)
            return None  # every head computes the same from the same operands: no head axis
        slots.append(row)
    # the heads in the order of a stack made before, where one of the operands has one
    order = list(range(h))
    found = next((tup for row in slots for kind, tup in row
                  if kind == "outer" and tup not in stacks and frozenset(tup) in by_set), None)
    if found is not None:
        made = by_set[frozenset(found)]
        order = [found.index(v) for v in made]
    slots = [[(kind, tup if kind == "shared" else tuple(tup[j] for j in order)) for kind, tup in row] for row in slots]
    results = []
    for row in slots:
        for kind, tup in row:
            if kind == "inner" and tup not in results and any(
                    v in kept or any(pos[r] >= end for r in sweep.readers.get(v, ())) for v in tup):
                results.append(tup)
    return order, slots, results


# ---- the grouped Q, K, V product whose kinds are stacks ----------------------------------------------


def _width(read: Read):
    """The number of columns of ``read`` as read, or None if unknown."""
    shape = read.shape
    return None if shape is None else shape[1]


def _alike(widths) -> bool:
    """All known and the same (the same dim, or the same number): the pieces split evenly."""
    return None not in widths and len(set(widths)) == 1


def _grouped_kinds(sweep: Sweep, op: Op, pos: dict, kept) -> Optional[tuple]:
    """``a_1, ..., a_3h = grouped(A, B_1, ..., B_3h)`` whose outs are read only by stacks of h
    heads, ``q_h = stack(a_1, a_4, ...)``, as ``q_h, k_h, v_h = grouped_heads(A, the B of q_h's
    heads, then k_h's, v_h's; h)``: the stacks are views of the one product, not copies of its
    slices (the stacks in the order the sweep makes them). (The product, the stacks it replaces),
    or None."""
    if op.attrs.get("side") != "cols" or op.attrs.get("total") or any(v in kept for v in op.outs):
        return None
    operand, bs = op.args[0], op.args[1:]
    if len(op.outs) != len(bs) or len(set(op.outs)) != len(op.outs) or not _alike([_width(b) for b in bs]):
        return None
    readers: dict = {}
    for v in op.outs:
        readers.update(dict.fromkeys(sweep.readers.get(v, ())))
    if not readers or any(r.kind != "stack" for r in readers):
        return None
    kinds = sorted(readers, key=pos.__getitem__)
    h = len(kinds[0].args)
    if any(len(k.args) != h or any(a.t or a.scale for a in k.args) for k in kinds):
        return None
    members = [a.value for k in kinds for a in k.args]
    where = {v: n for n, v in enumerate(op.outs)}
    if len(members) != len(op.outs) or set(members) != set(op.outs):
        return None
    if any(list(sweep.readers.get(a.value, ())) != [k] for k in kinds for a in k.args):
        return None  # a slice read by anything but its stack
    order = [bs[where[v]] for v in members]
    return Op("grouped_heads", [k.out for k in kinds], [operand] + order, h=h), kinds


def grouped_kinds(sweep: Sweep, kept: set) -> None:
    """Every grouped product (side by side on the columns, not summed over the batch) whose outs
    are read only by stacks of heads as one ``grouped_heads`` (``_grouped_kinds``) in its place;
    its widths must be known to be equal (the views cut the product evenly). ``kept``: values read
    after the sweep (a grouped product with one of them among its outs is left as it is)."""
    pos = sweep.positions()
    mapping: dict = {}
    before: dict = {}
    for op in sweep.ops:
        found = _grouped_kinds(sweep, op, pos, kept) if op.kind == "grouped" else None
        if found is not None:
            # put before the grouped product as it goes (a rewrite indexes what it puts before
            # an op last, after the stacks that made the kinds are gone)
            product, kinds = found
            before[op] = [product]
            mapping.update({x: [] for x in (op, *kinds)})
    if mapping:
        sweep.rewrite(mapping, before=before)


def _biased_kinds(sweep: Sweep, op: Op, kept) -> Optional[tuple]:
    """``q_h, k_h, v_h = grouped_heads(A, B...)`` whose every kind is read only by ``q_h + bq_h``,
    ``bq_h = stack(bq_1, ..., bq_h)`` the heads' bias rows (weights, the same for every example):
    (one ``grouped_heads`` with the bias rows, ``biased``, making the sums; the ops it replaces),
    or None."""
    if op.attrs.get("biased") or any(v in kept for v in op.outs):
        return None
    sums, stacks, rows = [], [], []
    for kind in op.outs:
        users = list(sweep.readers.get(kind, ()))
        if len(users) != 1:
            return None
        add = users[0]
        if add.kind != "sum" or len(add.args) != 2 or tuple(add.attrs.get("signs", ())) != (1, 1) \
                or add.attrs.get("unsqueeze") or not all(isinstance(a, Read) and not a.t and not a.scale
                                                          for a in add.args):
            return None
        other = [a.value for a in add.args if a.value is not kind]
        stack = sweep.maker.get(other[0]) if len(other) == 1 else None
        if stack is None or stack.kind != "stack" or other[0] in kept or len(stack.args) != op.attrs["h"] \
                or list(sweep.readers.get(other[0], ())) != [add] \
                or any(a.t or a.scale or a.value.batched or (a.value.shape or (None,))[0] != 1 for a in stack.args):
            return None
        sums.append(add)
        stacks.append(stack)
        rows += [a for a in stack.args]
    product = Op("grouped_heads", [a.out for a in sums], list(op.args) + rows, h=op.attrs["h"], biased=True)
    return product, [op, *sums, *stacks]


def biased_kinds(sweep: Sweep, kept: set) -> None:
    """The bias rows of an attention's query, key and value heads added as their grouped product is
    made (``_biased_kinds``): one addmm with the rows side by side, as nn.Linear's fused ``c_attn``
    adds its bias, instead of a stack of the rows and a pass over each kind's stack (nanoGPT's and
    GPT-2's attention). ``kept``: values read after the sweep."""
    mapping: dict = {}
    before: dict = {}
    for op in sweep.ops:
        found = _biased_kinds(sweep, op, kept) if op.kind == "grouped_heads" else None
        if found is not None:
            product, replaced = found
            before[op] = [product]
            mapping.update({x: [] for x in replaced})
    if mapping:
        sweep.rewrite(mapping, before=before)


# ---- stacks' heads side by side ------------------------------------------------------------------------


def _scale_key(scale: tuple) -> tuple:
    """An order of scales (any: floats, scalar values, dims) that is the same from run to run."""
    def one(x):
        if isinstance(x, Value):
            return (1, x.id)
        if isinstance(x, Dim):
            return (2, x.size.id) if isinstance(x.size, Value) else (3, x.size)
        return (0, x)
    return tuple(map(one, scale))


def _weight_ranks(sweep: Sweep, elements: dict) -> dict:
    """stack -> where the weights its heads multiply in a sum of products come in the forward's
    grouped product (its position, then the weight's among its B): the side-by-side matrix puts
    the stacks in that order, so the weights of the adjoint's product are concatenated as the
    forward's are (for a Model, a view of the family the two read, no copy: torch_runtime's
    ``_cat``)."""
    where: dict = {}
    for i, op in enumerate(sweep.ops):
        if op.kind == "grouped_heads":
            bs = concatenated(op)[0][0]  # its B (not the bias rows of a biased one)
            for j, b in enumerate(bs):
                if isinstance(b, Read):
                    where.setdefault(b.value, (i, j))
    rank: dict = {}
    if not where:
        return rank
    for op in sweep.ops:
        if op.kind != "sum_of_products":
            continue
        n = op.attrs["n"]
        for x, y in zip(op.args[:n], op.args[n:]):
            e = elements.get(x.value) if isinstance(x, Read) else None
            at = where.get(y.value) if isinstance(y, Read) else None
            if e is not None and at is not None:
                rank[e[0]] = min(rank.get(e[0], at), at)
    return rank


def side_by_side(sweep: Sweep, kept: set) -> None:
    """Grouped products summed over the batch and sums of products over the heads of stacks (see
    the module doc) read one side-by-side matrix of the stacks instead of their heads one by one:
    ``grouped`` (total) becomes ``split_total``, ``sum_of_products`` becomes ``cat_matmul``. Only
    heads of widths known to be equal are put side by side (the matrix is cut evenly again); a
    stack updated in place is left alone. Heads and scaled heads that nothing reads then (and
    that are not ``kept``: read after the sweep) are not made."""
    heads: dict = {}  # value -> (stack, head, heads)
    candidates: list = []  # unbinds and scaled heads, made only where something reads them
    for op in sweep.ops:
        if op.kind != "unbind":
            continue
        candidates.append(op)
        stack = op.args[0]
        if stack.t or stack.scale or sweep.updater(stack.value) is not None \
                or not _alike([_width(Read(v)) for v in op.outs]):
            continue
        for k, v in enumerate(op.outs):
            heads[v] = (stack.value, k, len(op.outs))
    if not heads:
        return
    elements = {v: (s, k, h, ()) for v, (s, k, h) in heads.items()}
    for op in sweep.ops:
        if op.kind == "scale" and not op.args[0].t and op.args[0].scale and op.args[0].value in heads:
            candidates.append(op)
            elements[op.out] = heads[op.args[0].value] + (op.args[0].scale,)
    shapes = {s: v.shape for v, (s, _, _) in heads.items()}  # stack -> one head's shape, as stored
    rank = _weight_ranks(sweep, elements)

    def width(s, flip):
        """The width of a head of stack s as read (transposed: ``flip``); None where unknown."""
        shape = shapes[s]
        return None if shape is None else shape[0 if flip else 1]

    def columns(reads, transposed=False) -> Optional[tuple]:
        """The (stack, heads, scale, flip) groups of ``reads`` in a canonical order, each complete,
        and the reads' positions in that order; None unless every read is of an element (read
        with a scale of its own: the element scaled so). An element read the other way round
        than ``transposed`` says is a head of its stack transposed (``flip``: the stacks a
        backward makes as q^t dS instead of dS^t q, which the factoring's transposed sums leave)."""
        found = []
        for r in reads:
            e = elements.get(r.value) if isinstance(r, Read) else None
            if e is None:
                return None
            s, k, h, c = e
            found.append((s, k, h, c + r.scale, r.t != transposed))
        groups = sorted({(s, h, c, f) for s, _, h, c, f in found},
                        key=lambda g: (rank.get(g[0], ()), g[0].id, g[1], _scale_key(g[2]), g[3]))
        slots, offset = {}, 0
        for s, h, c, f in groups:
            for k in range(h):
                slots[(s, k, c, f)] = offset + k
            offset += h
        where = [slots[(s, k, c, f)] for s, k, _, c, f in found]
        if sorted(where) != list(range(offset)) or not _alike([width(s, f) for s, _, _, f in groups]):
            return None
        return tuple(groups), where

    made: dict = {}  # groups -> their side-by-side matrix
    made_at: dict = {}  # groups -> the op their matrix is made just before
    before: dict = {}  # op -> the new ops put just before it
    mapping: dict = {}

    def wide(groups, at: Op) -> Value:
        if groups in made:
            return made[groups]
        # a scaled stack is scaled as it is copied into the matrix (no array of it scaled)
        parts = [Read(s, f, c) for s, _, c, f in groups]
        w = width(groups[0][0], groups[0][3])
        count = sum(h for _, h, _, _ in groups)
        shape = None if parts[0].shape is None else (parts[0].shape[0], w * count if isinstance(w, int) else None)
        v = made[groups] = Value(shape=shape, batched=any(p.value.batched for p in parts), hint=parts[0].value,
                                 suffix="_w")
        before.setdefault(at, []).append(Op("side_by_side", [v], parts))
        made_at[groups] = at
        return v

    def in_order(items, where) -> list:
        ordered = [None] * len(items)
        for x, k in zip(items, where):
            ordered[k] = x
        return ordered

    for op in list(sweep.ops):
        if op.kind == "grouped" and op.attrs.get("total"):
            # a weight's gradients: the matrix's columns (rows: its transpose's rows)
            cols = op.attrs.get("side") == "cols"
            operand, xs = (op.args[0], op.args[1:]) if cols else (op.args[-1], op.args[:-1])
            found = columns(xs, transposed=not cols) if len(op.outs) == len(xs) else None
            if found:
                w = wide(found[0], op)
                args = [operand, Read(w)] if cols else [Read(w, True), operand]
                mapping[op] = [Op("split_total", in_order(op.outs, found[1]), args, n=len(op.outs),
                                  axis=-1 if cols else -2)]
        elif op.kind == "sum_of_products":  # an adjoint: the pairs, which commute, in the matrix's order
            n = op.attrs["n"]
            xs, ys = op.args[:n], op.args[n:]
            found = columns(xs) if len(xs) == len(ys) else None
            if found:
                w = wide(found[0], op)
                mapping[op] = [Op("cat_matmul", op.outs, [Read(w)] + in_order(ys, found[1]))]
    if not mapping:
        return
    _column_sums(sweep, elements, made, made_at, mapping, before)
    sweep.rewrite(mapping, before=before)
    # heads and scaled heads that nothing reads now are not made (a scaled head first: then its head)
    while True:
        dead = [op for op in candidates if not any(sweep.readers.get(v) or v in kept for v in op.outs)]
        if not dead:
            break
        sweep.rewrite({op: [] for op in dead})
        gone = set(dead)
        candidates = [op for op in candidates if op not in gone]
    _stored_as_read(sweep, kept)


def _stored_as_read(sweep: Sweep, kept: set) -> None:
    """A stack put side by side transposed (``q^t dS``, (..., h, k, n)) that nothing else reads is
    made the other way round, ``dS^t q`` (a product of the transposed operands, swapped): the copy
    into the matrix then reads rows of k contiguous numbers, where it read every n-th one (a
    transposing copy, four times slower at nanoGPT's size)."""
    mapping: dict = {}
    for op in sweep.ops:
        if op.kind != "side_by_side" or not any(r.t for r in op.args):
            continue
        parts = list(op.args)
        for i, r in enumerate(parts):
            maker = sweep.maker.get(r.value)
            if not r.t or maker is None or maker.kind != "matmul" or maker.attrs.get("total") or maker in mapping \
                    or r.value in kept or list(sweep.readers.get(r.value, ())) != [op] \
                    or sum(1 for x in parts if x.value is r.value) != 1 or len(maker.args) != 2:
                continue
            product = transposed_product(maker)
            mapping[maker] = [product]
            parts[i] = Read(product.out, False, r.scale)
        if parts != list(op.args):
            mapping[op] = [Op(op.kind, op.outs, parts, **op.attrs)]
    if mapping:
        sweep.rewrite(mapping)


def _column_sums(sweep: Sweep, elements: dict, made: dict, made_at: dict, mapping: dict, before: dict) -> None:
    """The sums of the heads along their rows summed over the batch (the gradients of the heads'
    bias rows, ``_sum_total(q_j^t, -1, _nb)^t`` and ``0.125 *`` it, one or two calls a head) where
    a side-by-side matrix has those heads, scaled alike, as its columns: one sum of the matrix's
    columns, cut into the heads' rows (views), put after the matrix is made. Only where every
    head of the matrix has such a sum and nothing reads one before the matrix is made."""
    pos = sweep.positions()
    slots: dict = {}  # groups -> {column block: the sum op}
    index: dict = {}  # (stack, heads, scale, flip) -> (groups, the group's first block)
    for groups in made:
        offset = 0
        for g in groups:
            index.setdefault(g, (groups, offset))
            offset += g[1]
    for op in sweep.ops:
        if op.kind != "sum_axis" or not op.attrs.get("total") or op in mapping:
            continue
        r = op.args[0]
        e = elements.get(r.value) if isinstance(r, Read) and not r.t else None
        if e is None:
            continue
        stack, k, h, c = e
        # a head stored transposed (q_j^t) sums along its columns to the row its column block
        # in the matrix sums to; one stored as it is, along its rows
        flip = {(-1, True): True, (-2, False): False}.get((op.attrs["axis"], bool(op.attrs.get("view_t"))))
        found = index.get((stack, h, c + r.scale + tuple(op.attrs.get("out_scale", ())), flip))
        if flip is None or found is None:
            continue
        groups, first = found
        slots.setdefault(groups, {}).setdefault(first + k, []).append(op)
    for groups, found in slots.items():
        count = sum(g[1] for g in groups)
        at = made_at[groups]
        if any(len(found.get(j, ())) != 1 for j in range(count)):
            continue
        ops = [found[j][0] for j in range(count)]
        if any(pos[user] <= pos[at] for op in ops for user in sweep.users(op.out)):
            continue
        wide = made[groups]
        total = Value(shape=(1, wide.shape[1]) if wide.shape else None, hint=wide, suffix="_sum")
        before[at] += [Op("sum_axis", [total], [Read(wide)], axis=-2, total=True),
                       Op("split", [op.out for op in ops], [Read(total)], n=count, axis=-1)]
        mapping.update((op, []) for op in ops)


# ---- a sum of the heads' traces, on the stacks --------------------------------------------------


def stacked_traces(sweep: Sweep, kept: set) -> None:
    """``c trace(A_1^t B_1) + ... + c trace(A_h^t B_h)`` over the h heads of two stacks (each
    ``trace_product`` of the heads of one index, the same scale c for all) as ``c`` times one
    trace of the stacks, summed over the heads too (``trace_product`` with ``heads``): the
    gradient of a learned temperature of the scores, ``tau_i s sum_heads <G_h, q_h k_h^t>``, one
    elementwise product and one sum a block instead of a few calls a head."""
    changes: dict = {}
    for op in sweep.ops:
        if op.kind != "scalar_op" or op.attrs.get("op") != "add" or not all(isinstance(a, Value) for a in op.args):
            continue
        got = _traces_of_heads(sweep, op, kept)
        if got is None:
            continue
        gone, (a, b), scale = got
        if scale:  # the common scale times one trace of the stacks
            tp = Value(scalar=True, hint=op.out, suffix="_heads")
            new = [Op("trace_product", [tp], [a, b], heads=True),
                   Op("scalar_op", op.outs, list(scale) + [tp], op="mul")]
        else:  # the sum is the trace itself
            new = [Op("trace_product", op.outs, [a, b], heads=True)]
        changes.update((g, []) for g in gone)
        changes[op] = new
    if not changes:
        return
    sweep.rewrite(changes)
    dead = {}
    for op in sweep.ops:  # views of a stack that nothing reads now are not made
        if op.kind == "unbind" and not any(sweep.readers.get(v) or v in kept for v in op.outs):
            dead[op] = []
    if dead:
        sweep.rewrite(dead)


def _traces_of_heads(sweep: Sweep, op: Op, kept: set) -> Optional[tuple]:
    """(the ops the sum replaces, the reads of the two stacks, the common scale) where ``op`` sums
    one scaled trace of each head of two stacks; else None."""
    gone, scale, pairs = [], None, {}
    stacks = None
    for v in op.args:
        maker = sweep.maker.get(v)
        if maker is None or v in kept or sweep.users(v) != [op]:
            return None
        own = ()
        if maker.kind == "scalar_op" and maker.attrs.get("op") == "mul":
            traces = [a for a in maker.args if isinstance(a, Value) and sweep.maker.get(a) is not None
                      and sweep.maker[a].kind == "trace_product" and not sweep.maker[a].attrs.get("heads")]
            if len(traces) != 1 or sweep.users(traces[0]) != [maker] or traces[0] in kept:
                return None
            own = tuple(a for a in maker.args if a is not traces[0])
            gone.append(maker)
            maker = sweep.maker[traces[0]]
        if maker.kind != "trace_product" or maker.attrs.get("heads"):
            return None
        if scale is None:
            scale = own
        if own != scale:
            return None
        x, y = maker.args
        heads = []
        for r in (x, y):
            unbind = sweep.maker.get(r.value)
            if r.scale or unbind is None or unbind.kind != "unbind":
                return None
            heads.append((unbind, unbind.outs.index(r.value)))
        key = (heads[0][0], x.t, heads[1][0], y.t)
        if stacks is None:
            stacks = key
        if key != stacks or heads[0][1] != heads[1][1] or heads[0][1] in pairs:
            return None
        pairs[heads[0][1]] = maker
        gone.append(maker)
    if stacks is None or len(pairs) != len(stacks[0].outs) or len(stacks[0].outs) != len(stacks[2].outs):
        return None
    a, ta, b, tb = stacks
    return gone, (Read(a.args[0].value, ta), Read(b.args[0].value, tb)), scale


def products_side_by_side(sweep: Sweep, kept: set) -> None:
    """Each ``side_by_side`` whose stacks are products (``matmul`` of two stacks, ``bmm``, causal
    or not; not summed over the batch, not scaled after) that it alone reads, read as they are
    with scales that are numbers, as one ``side_products`` where the side-by-side matrix was
    made (attrs ``kinds``: each product's causal kind or None, ``scales``: each stack's number
    or None): the products are written into the matrix's columns (module doc). A product whose
    operands an op updates in place before that point stays as it is. ``kept``: the values read
    after the sweep."""
    pos = sweep.positions()
    mapping: dict = {}
    for op in sweep.ops:
        if op.kind != "side_by_side":
            continue
        makers = [sweep.maker.get(r.value) for r in op.args]
        if any(m is None or m.kind != "matmul" or not m.attrs.get("bmm") or m.attrs.get("total")
               or m.attrs.get("out_scale") or m.attrs.get("seeded") or m.attrs.get("unsqueeze")
               or len(m.args) != 2 or m in mapping for m in makers):  # (unsqueeze: a read the op spells)
            continue
        if any(r.t or not all(isinstance(c, (int, float)) for c in r.scale) or r.value in kept
               or list(sweep.readers.get(r.value, ())) != [op] for r in op.args) \
                or len({r.value for r in op.args}) != len(op.args):
            continue
        if any(sweep.updated_between(m.values_read(), pos, pos[m] + 1, pos[op]) for m in makers):
            continue
        scales = [math.prod(map(float, r.scale)) if r.scale else None for r in op.args]
        for m in makers:
            mapping[m] = []
        mapping[op] = [Op("side_products", op.outs, [a for m in makers for a in m.args],
                          kinds=tuple(m.attrs.get("causal") for m in makers), scales=tuple(scales))]
    if mapping:
        sweep.rewrite(mapping)
