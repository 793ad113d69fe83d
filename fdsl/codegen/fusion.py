"""Passes over the generated sweep that do several of its ops as one, as autograd's kernels do.

Vocabulary
----------
product     a ``matmul`` op, ``v = L @ R`` with L and R reads (as stored or transposed, scaled or
            not), or one summed over the batch of the data (``total``: ``_matmul_total``, a
            weight's gradient). A *plain* product is neither summed over the batch, nor a
            product of two batches (``bmm``), nor scaled after it is made (``out_scale``).
group       products that share an operand (the same read: value, transpose and scale), done as
            one ``grouped`` op: ``Z Q_0, ..., Z V_3`` as ``Z [Q_0 ... V_3]`` (side ``cols``: the
            other operands side by side, the result split back into views), ``A_1 G, A_2 G`` as
            ``[A_1; A_2] G`` (side ``rows``), and the same for products summed over the batch
            (``total``).
sum of      a ``sum`` op, ``G = A_1 R_1 + A_2 R_2 + ...``, whose terms are products made for it
products    alone (the heads' ``G_0 Q_0^t + G_1 Q_1^t + ...``), as the one product
            ``[A_1 ... A_k] [R_1; ...; R_k]`` (``sum_of_products``).
scaling     a read with a scale, ``(c * v)``: c is any tuple of scalars (a literal, a scalar given
            with the data, a learned temperature, a dim), compared by equality, so that every
            spelling of a scale fuses alike.
moving      a pass moves an op only to where every value it reads is made and before anything
            reads what it makes; a value updated in place (``add_into``) between the two places
            keeps the op where it was.

Every pass rewrites the sweep through its own indexes (``Sweep.maker``, ``Sweep.readers``, the
positions computed once a round) and applies its changes together (``Sweep.rewrite``), so code
generation stays linear in the sweep. ``kept``: the values read after the sweep (the returned
gradients, the loss). ``folds``: the target folds a batch on the left of a product into one
product (torch: ``(b, n, d) @ (d, k)`` is one ``mm``), so a pass keeps a batched operand
(``Value.batched``) on the left. The helpers the writers spell for these kinds are in the
runtimes (``numpy_helpers``, ``torch_runtime``); how each kind is encoded: ``docs/ir.md``.

``unlet`` works on terms, before the lowering (as ``fdsl.codegen.factoring`` does): it decides what
is computed, not how the sweep does it.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple, Optional

from ..core import terms as T
from .ir import PROLOGUE, Op, Read, Sweep, Value, graph_rewrite


def _plain(op: Op) -> bool:
    """Whether ``op`` is a plain product (module doc)."""
    return (op.kind == "matmul" and not op.attrs.get("total") and not op.attrs.get("bmm")
            and not op.attrs.get("out_scale"))


def _with(op: Op, **attrs) -> Op:
    """``op`` with ``attrs`` changed."""
    return Op(op.kind, op.outs, op.args, **{**op.attrs, **attrs})


def _views(pairs) -> int:
    """The transposed views that the (left, right) operand pairs read."""
    return sum(int(a.t) + int(b.t) for a, b in pairs)


# ---- a gradient summed over the batch inside its product ------------------------------------------


def summed_product(sweep: Sweep, v: Value) -> bool:
    """Sum a gradient over the batch inside its product: ``G = A @ B``, read by nothing but the
    return, becomes ``total`` (``_matmul_total(A, B, _nb)``), which for a batch is the one
    product ``[A_1 ... A_b] [B_1; ...; B_b]`` (the examples side by side along the inner axis, as
    autograd's weight gradients are) instead of b products and a sum. False: left as it is."""
    op = sweep.maker.get(v)
    if op is None or not _plain(op) or sweep.readers.get(v):
        return False
    # an attribute, not an operand, changes: the indexes hold as they are, and the lowering asks
    # this of each gradient, so a rewrite (a pass over the sweep) each time would be quadratic
    op.attrs["total"] = True
    return True


def summed_sum(sweep: Sweep, v: Value, returned: set) -> bool:
    """Sum a gradient that is a sum of terms over the batch inside each term: ``G = A_1 @ B_1 +
    scatter(X, H)^t`` (a tied embedding's: its unembedding's product and its lookup's scatter),
    read by nothing but the return, each term made for it alone by a product, a sum along an axis
    or a scatter, every one varying per example and read with a scale that does not: each term
    ``total``, so no (batch, rows, cols) array of any of them is made (nor of the sum). A term
    that is itself ``returned`` (another weight's gradient: a bias's, read in the sum of the
    output bias's) is not. False: left as it is."""
    op = sweep.maker.get(v)
    if op is None or op.kind != "sum" or sweep.readers.get(v) or op.attrs.get("head", len(op.args)) != len(op.args):
        return False
    makers = []
    for a in op.args:
        if not isinstance(a, Read) or any(isinstance(c, Value) and c.batched for c in a.scale):
            return False
        m = sweep.maker.get(a.value)
        if m is None or not a.value.batched or a.value in returned or list(sweep.readers.get(a.value, ())) != [op] \
                or sum(1 for b in op.args if isinstance(b, Read) and b.value is a.value) != 1:
            return False
        summable = (m.kind == "matmul" and not m.attrs.get("out_scale")) or m.kind in ("sum_axis", "scatter")
        if not summable or m.attrs.get("total") or len(m.outs) != 1:
            return False
        if m.kind == "sum_axis" and m.args[0].scale:
            return False
        makers.append(m)
    for m in makers:  # as in summed_product: an attribute changes, the indexes hold
        m.attrs["total"] = True
        m.attrs.pop("bmm", None)
        m.out.batched = False
    v.batched = False
    return True


def summed_reduction(sweep: Sweep, v: Value) -> bool:
    """Sum a gradient that is a sum along an axis (a bias's, a gain's: ``sum_axis``), read by
    nothing but the return, over the batch in the same reduction (``total``: ``_sum_total(A, -1,
    _nb)``), one reduction over the batch and the axis instead of two. Of an unscaled read only,
    as before the IR (the generated code is pinned while the passes move to it). False: left as
    it is."""
    op = sweep.maker.get(v)
    if op is None or op.kind != "sum_axis" or op.attrs.get("total") or sweep.readers.get(v) or op.args[0].scale:
        return False
    if any(isinstance(s, Value) and s.batched for s in op.attrs.get("out_scale", ())):
        return False  # scaled after by a number of each example: summed over the batch after it
    op.attrs["total"] = True  # as in summed_product
    return True


# ---- products that share an operand ---------------------------------------------------------------


def group_products(sweep: Sweep, kept: set) -> None:
    """Products that share an operand done as one (see the module doc), largest groups first,
    until no two can be. ``kept`` is not needed: a group makes every value its members made.

    A round finds the candidates once (products by shared read) and tries them largest first,
    each without the products an earlier group of the round took; a group goes just after the
    last op (or group of the round) that makes one of its operands, before the op there
    (``slots``: the groups put before each op, in order), and only before every group of the
    round that reads what its products make. A group that could not go where it must, until a
    group taken after it made one of its operands (it may go there now), keeps its products for
    the next round: a later group of the round does not take them. A round is one rewrite; the
    next finds the groups the last made possible, and the rounds do not grow with the sweep."""
    while True:
        pos = sweep.positions()
        found: dict = {}  # (total, side, the shared read) -> the products, in order
        for op in sweep.ops:
            if op.kind == "matmul" and not op.attrs.get("bmm"):
                total = bool(op.attrs.get("total"))
                found.setdefault((total, "cols", op.args[0]), []).append(op)
                found.setdefault((total, "rows", op.args[1]), []).append(op)
        slots: dict = {}  # position -> the groups put before the op there, in order
        made: dict = {}  # value -> (the position of the slot of the group that makes it, the group)
        readers: dict = {}  # value -> [(the slot's position, a group of the round that reads it)]
        gone: dict = {}
        failed: dict = {}  # a value read by a group that did not place -> its products
        kept_back: set = set()  # the products of such groups that a later group might let place
        for (total, side, shared), members in sorted(found.items(), key=lambda kv: -len(kv[1])):
            members = [m for m in members if m not in gone]  # an earlier group took the others
            if len(members) < 2 or any(m in kept_back for m in members):
                continue
            reads = {m: m.values_read() for m in members}
            place = _place(sweep, pos, slots, made, readers, members, reads)
            if place is None:
                for m in members:
                    for v in reads[m]:
                        failed.setdefault(v, []).extend(members)
                continue
            for m in members:  # a group that did not place for want of these might place now
                kept_back.update(failed.pop(m.out, ()))
            others = [m.args[1] if side == "cols" else m.args[0] for m in members]
            group = Op("grouped", [m.out for m in members], [shared] + others if side == "cols" else others + [shared],
                       side=side, total=total)
            at, i = place
            slots.setdefault(at, []).insert(i, group)
            made.update((m.out, (at, group)) for m in members)
            for m in members:
                for v in reads[m]:
                    readers.setdefault(v, []).append((at, group))
            gone.update((m, []) for m in members)
        if not gone:
            return
        sweep.rewrite(gone, before={sweep.ops[at]: groups for at, groups in slots.items()})


def _place(sweep: Sweep, pos: dict, slots: dict, made: dict, readers: dict, members: list, reads: dict):
    """(position, index in its slot) of the group of ``members``: just after the last op (or
    group of the round) that makes one of their operands; None where it cannot go there."""
    outs = {m.out for m in members}
    if any(v in outs for m in members for v in reads[m]):
        return None  # one member reads another's result: X (X W)^t beside X W
    place = (0, 0)
    for m in members:
        for v in reads[m]:
            if v in made:
                at, group = made[v]
                place = max(place, (at, slots[at].index(group) + 1))
            elif v in sweep.maker:
                place = max(place, (pos[sweep.maker[v]] + 1, 0))
    ready = place[0]
    end = len(sweep.ops)
    for m in members:
        if m.attrs.get("out_scale"):
            # a group has no scale for one of its results: no group of it (before the IR, a
            # product scaled after was two statements, and no group was made of two)
            return None
        if min((pos[r] for r in sweep.readers.get(m.out, ())), default=end) < ready:
            return None  # read before the group could be made
        if any(place > (at, slots[at].index(group)) for at, group in readers.get(m.out, ())):
            return None  # a group of the round that reads it would come first
        if sweep.updated_between(reads[m], pos, min(pos[m], ready), max(pos[m], ready)):
            return None  # an operand is updated in place between the two places
    return place


# ---- sums of products ------------------------------------------------------------------------------


class _Round(NamedTuple):
    """What the rules of a pass read besides the op: the values kept, whether the target folds
    batches."""

    kept: set
    folds: bool


def group_sums(sweep: Sweep, kept: set, folds: bool) -> None:
    """Every sum of two or more products made for it alone, with those products as one (see the
    module doc); the sum's other terms stay as they were. ``folds``: keep a batch on the left."""
    graph_rewrite(sweep, {"sum": [_sum_of_products]}, _Round(kept, folds))


def _sum_of_products(sweep: Sweep, op: Op, pos: dict, ctx: _Round) -> Optional[dict]:
    # the sums the passes fused before the IR: a first statement of two unscaled terms, the first
    # added, then terms added or subtracted one by one, up to the first scaled one; a sum that
    # starts negated or with three terms (a batched term added out of place) stays as it is
    terms, signs = op.args, op.attrs["signs"]
    if op.attrs.get("head") != 2 or signs[0] != 1 or terms[0].scale or terms[1].scale:
        return None
    end = next((k for k in range(2, len(terms)) if terms[k].scale), len(terms))
    counts = Counter(zip(signs[:end], terms[:end]))
    members = []  # (position in terms, its product, left, right, read transposed)
    for k in range(end):
        r = terms[k]
        maker = sweep.maker.get(r.value)
        if maker is None or not _plain(maker) or pos[maker] >= pos[op] or r.value in ctx.kept:
            continue
        if any(user is not op for user in sweep.readers.get(r.value, ())) or counts[signs[k], r] > 1:
            continue
        if r.shape is not None and op.out.shape is not None and r.shape != op.out.shape:
            continue  # a row added to every row (broadcast): not a part of the one product
        if sweep.updated_between(maker.values_read(), pos, pos[maker], pos[op]):
            continue
        left, right = maker.args
        if signs[k] < 0:  # a subtracted product, - L R = (-L) R: one negation, not a product and a sum
            left = left._replace(scale=(-1.0,) + left.scale)
        members.append((k, maker, left, right, r.t))
    if len(members) < 2:
        return None
    # the products as they were computed (the orientation most of them are read in), the others
    # transposed, (L R)^t = R^t L^t: a product the lowering computed transposed stays so
    flip = sum(m[4] for m in members) * 2 > len(members)
    pairs = [(left, right) if t == flip else (right.T(), left.T()) for _, _, left, right, t in members]
    # or all of them transposed, read without a view, where that needs fewer transposed views:
    # sum_i (A_i^t B_i^t)^t as sum_i B_i A_i (each view is a dispatched call, and the concatenation
    # copies it); a batch stays on the left, where torch folds it into one product
    turned = [(right.T(), left.T()) for left, right in pairs]
    if _views(turned) + flip < _views(pairs) + (not flip) and not (
            ctx.folds and any(a.value.batched for a, _ in pairs) and not any(a.value.batched for a, _ in turned)):
        pairs, flip = turned, not flip
    out = op.out
    s = Value(shape=None if out.shape is None else out.t_shape(flip), batched=out.batched, heads=out.heads,
              hint=out, suffix="_sp")
    product = Op("sum_of_products", [s], [a for a, _ in pairs] + [b for _, b in pairs], n=len(pairs))
    first, dropped = members[0][0], {m[0] for m in members[1:]}
    remaining = [(Read(s, flip), 1) if k == first else (terms[k], signs[k])
                 for k in range(len(terms)) if k not in dropped]
    rest = Op("sum", op.outs, [t for t, _ in remaining], **{**op.attrs, "signs": tuple(sign for _, sign in remaining),
                                                              "head": min(2, len(remaining))})
    return {op: [product, rest], **{m[1]: [] for m in members}}


# ---- products read transposed --------------------------------------------------------------------


def transposed_reads(sweep: Sweep, kept: set, folds: bool) -> None:
    """A plain product every reader of which is a product that reads it transposed (``v^t``,
    ``(c * v)^t``, whatever the scale c) computed transposed, ``v = L @ R`` as ``v = R^t @ L^t``,
    where that takes fewer transposed views: the attention's score adjoints, which the weights'
    gradients and the adjoint below both read as their transposes. Not where another op reads it
    (an elementwise operator's operands keep one layout: a kernel on a transposed and a plain
    operand is many times slower), nor where a batch would leave the left side (``folds``), nor
    a value in ``kept``. One walk in order: a product is looked at as the turns of the products
    before it left it (its reads of them turned too)."""
    now: dict = {}  # op -> the op that replaces it, so far

    for op in sweep.ops:
        cur = now.get(op, op)
        v = cur.out
        if not _plain(cur) or v in kept:
            continue
        readers = list(sweep.readers.get(v, ()))
        saved = 0
        for r in readers:
            reader = now.get(r, r)
            reads = [a for a in reader.args if isinstance(a, Read) and a.value is v]
            if reader.kind != "matmul" or reader.attrs.get("bmm") or not reads or not all(a.t for a in reads):
                break
            saved += len(reads)
        else:
            left, right = cur.args
            turned = (right.T(), left.T())
            if not readers or folds and left.value.batched and not turned[0].value.batched:
                continue
            if _views([turned]) - _views([(left, right)]) >= saved:
                continue
            now[op] = Op(cur.kind, cur.outs, turned, **cur.attrs)
            # v holds its transpose now: its shape as stored turns with it (every reader is
            # rewritten below, and v is not kept, so nothing reads the old layout)
            v.shape = v.t_shape(True)
            for r in readers:
                reader = now.get(r, r)
                now[r] = Op(reader.kind, reader.outs, [a._replace(t=False) if isinstance(a, Read) and a.value is v
                                                       else a for a in reader.args], **reader.attrs)
    if now:
        sweep.rewrite({op: [new] for op, new in now.items()})


# ---- a value read with the same scale by several ops ---------------------------------------------


def shared_scalings(sweep: Sweep, kept: set) -> None:
    """A value read with the same scale two or more times, ``(c * v)`` (as stored or transposed;
    c any tuple of scalars: a literal, a scalar given with the data, a learned temperature),
    scaled once: a ``scale`` op ``v_s = c * v`` just before the first reader, and the readers read
    ``v_s`` (transposed where they read ``v`` so). The products of an attention's backward read
    the scaled scores both in a weight's gradient and in the adjoint of the layer below. Only
    of a value the sweep computes (as the text pass: an input stays scaled where it is read), and
    not counting a ``scale`` op's own read. ``kept`` is not needed: every value stays."""
    seen: dict = {}  # (scale, value) -> the ops that read it so, once per read, in order
    for op in sweep.ops:
        if op.kind == "scale":
            continue
        for a in op.args:
            if isinstance(a, Read) and a.scale:
                seen.setdefault((a.scale, a.value), []).append(op)
    names: dict = {}  # (scale, value) -> the value scaled once
    before: dict = {}
    for (scale, v), ops in seen.items():
        maker = sweep.maker.get(v)
        if len(ops) < 2 or maker is None or maker.kind in PROLOGUE:
            continue
        s = names[scale, v] = Value(shape=v.shape, batched=v.batched, heads=v.heads, scalar=v.scalar, hint=v,
                                    suffix="_s")
        before.setdefault(ops[0], []).append(Op("scale", [s], [Read(v, False, scale)]))
    if not names:
        return
    mapping: dict = {}
    for key in names:
        for op in seen[key]:
            if op not in mapping:
                mapping[op] = [Op(op.kind, op.outs, [_scaled_once(a, names) for a in op.args], **op.attrs)]
    sweep.rewrite(mapping, before=before)


def _scaled_once(a, names: dict):
    if isinstance(a, Read) and (a.scale, a.value) in names:
        return Read(names[a.scale, a.value], a.t)
    return a


# ---- products of two batches -----------------------------------------------------------------------


def batched_products(sweep: Sweep, kept: set) -> None:
    """A product of two values computed from the data (``Value.batched``; a scale, a number, is
    not a batch) as ``bmm``: torch's ``bmm`` when both are batches at run time (``@`` on two
    batches expands, reshapes and views around its bmm, five dispatched calls for one), else
    ``@``. ``kept`` is not needed."""
    graph_rewrite(sweep, {"matmul": [_bmm]})


def _bmm(sweep: Sweep, op: Op, pos: dict, ctx) -> Optional[dict]:
    left, right = op.args
    if op.attrs.get("total") or op.attrs.get("bmm") or not (left.value.batched and right.value.batched):
        return None
    return {op: [_with(op, bmm=True)]}


# ---- terms before the lowering ---------------------------------------------------------------------


def unlet(order: list) -> dict:
    """Node -> the same node with every ``let`` replaced by its body, for ``order`` (children
    first, as ``lowering.nodes`` gives them). Rebuilt as they are (``T.renamed``: no law of the
    constructors applies again), so a subterm that appears both named and inline becomes one."""
    plain: dict = {}
    for n in order:
        if n.op == "let":
            plain[n] = plain[n.args[0]]
        elif n.op == "add" and any(a.op == "let" and plain[a].op == "add" for a in n.args):
            # a residual stream: the run net_{L-1} of a flat sum was named; spliced back, the sum
            # is the flat one the forward computes (X E + P + heads, not (X E + P) + heads)
            args: list = []
            for a in n.args:
                args.extend(plain[a].args if a.op == "let" and plain[a].op == "add" else (plain[a],))
            plain[n] = T.renamed(n, tuple(args))
        elif n.args:
            plain[n] = T.renamed(n, tuple(plain[a] for a in n.args))
        else:
            plain[n] = n
    return plain
