"""Library kernels that do several ops of the sweep at once, as autograd's do.

Vocabulary
----------
addmm          ``C + A @ B`` as one kernel (``addmm``): a residual stream adding a layer's output,
               a bias row added to a layer's product (``nn.Linear``'s bias); ``cat_addmm`` where
               the product's right side is a concatenation (``cat_matmul``: the heads' outputs
               times the blocks of the output weight).
add into       ``P + Z`` written into P (``add_into``), P a product made here and read nowhere
               else (the attention mask added to the scores, as autograd's ``masked_fill_``).
affine layer   ``layernorm(A) o C g + C b``, a layer norm with its gain row g and bias row b,
norm           the form every transformer block has: the forward is one ``native_layer_norm``
               with g and b (``layernorm_affine``), and its backward, the input's adjoint
               ``dlayernorm(A, G o C g)`` with the gradients of g (``G o layernorm(A)`` summed over
               the rows) and b (``G`` summed), is one ``native_layer_norm_backward`` that computes
               all three (``dlayernorm_affine``), instead of a multiplication, two products and
               two sums.
upstream       G, the adjoint of the layer norm's output, in the rows-by-columns layout of A; the
               ops read it in either orientation (a read of E, with ``G = E^t`` or ``G = E``).
head           the terms of a sum's first statement (``attrs head``): these passes match a sum's
               head ``Y = a + b`` (``a - b``), as the text passes matched a sum's first statement.
               A kernel that does the head of a longer sum makes a new value, the part, and the
               rest of the sum is added to it (a ``sum`` whose head is the part alone: the writer
               adds the rest into the part in place, which dies there, as ``Y = _addmm(...)``,
               ``Y += c`` did).

A sum is one ``sum`` op (``attrs signs``, ``head``); a Hadamard product is a ``template`` op with
``attrs op="had"``, a log-softmax one with ``op="logsoftmax"``; a row sum is ``sum_axis``. Where
the text passes matched an operand written as a bare name (``[\\w.]+``), the rewrites want a read
without a scale, as they did; where they matched any operand, any read.

Torch target only: these passes run on the sweep after ``fusion`` and ``heads``, and each keeps
the function's meaning (the runtime helpers fall back to the separate computations where the
shapes do not fit the kernel). Each is a set of rules for ``ir.graph_rewrite``, found from the
sweep's indexes (``maker``, ``readers``), so a pass is linear in the sweep.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional

from .ir import Op, Read, Sweep, Value, graph_rewrite, transposed_product, transposed_value

# ---- what the rules look for ------------------------------------------------------------------------


def _bare(r) -> bool:
    """A read of a value as it is: not transposed, not scaled."""
    return isinstance(r, Read) and not r.t and not r.scale


def _unscaled(r) -> bool:
    return isinstance(r, Read) and not r.scale


def _only_reader(sweep: Sweep, v: Value, op: Op, kept: set) -> bool:
    """``op`` is the one op that reads v, through one operand, and nothing after the sweep does."""
    users = sweep.readers.get(v, {})
    return v not in kept and len(users) == 1 and op in users and sum(
        1 for a in op.args if isinstance(a, Read) and a.value is v) == 1


def _head(op: Op, signs: tuple) -> Optional[tuple]:
    """The two terms of a sum whose first statement is ``Y = a + b`` (signs (1, 1)) or ``Y = a - b``
    (signs (1, -1)), else None."""
    if op.kind != "sum" or len(op.args) < 2 or op.attrs.get("head", len(op.args)) != 2:
        return None
    if tuple(op.attrs.get("signs", ()))[:2] != signs:
        return None
    return op.args[0], op.args[1]


def _head_done_by(op: Op) -> tuple:
    """(the value a kernel that does sum ``op``'s head makes, the ops that take the sum's place):
    the sum's own value and none for a sum of two terms; for a longer one a new part and the rest
    of the sum added to it (see the module doc: head)."""
    y = op.out
    if len(op.args) == 2:
        return y, []
    part = Value(shape=y.shape, batched=y.batched, heads=y.heads, hint=y, suffix="_head")
    attrs = dict(op.attrs, signs=(1,) + tuple(op.attrs["signs"][2:]), head=1)
    return part, [Op("sum", [y], (Read(part),) + op.args[2:], **attrs)]


def _made_before(sweep: Sweep, v: Value, at: int, pos: dict) -> bool:
    """``v`` is made before position ``at`` (or before the sweep)."""
    m = sweep.maker.get(v)
    return m is None or pos[m] < at


# ---- a product added to a matrix: one addmm -------------------------------------------------------


def _addable(op: Op) -> bool:
    """A plain product (one array of one example's layout, not scaled after: ``v = L @ R``) or a
    product by a concatenation, which an addmm can do while it adds."""
    if op.kind == "cat_matmul":
        return True
    return op.kind == "matmul" and not (op.attrs.get("total") or op.attrs.get("bmm") or op.attrs.get("out_scale"))


def _added_product(sweep: Sweep, op: Op, pos: dict, kept) -> Optional[dict]:
    # Y = X + P, P = A @ B  =>  Y = addmm(X, A, B)
    terms = _head(op, (1, 1))
    if terms is None:
        return None
    for x, p in (terms, terms[::-1]):
        prod = sweep.maker.get(p.value)
        if prod is None or not _bare(p) or x.value is p.value or not _addable(prod) \
                or not _only_reader(sweep, p.value, op, kept):
            continue
        if sweep.updated_between(prod.values_read(), pos, pos[prod] + 1, pos[op]):
            continue  # A or B is updated in place between the product and the sum: keep them apart
        out, rest = _head_done_by(op)
        kind = "addmm" if prod.kind == "matmul" else "cat_addmm"
        return {op: [Op(kind, [out], (x,) + prod.args, **_unsqueezed(op, prod))] + rest, prod: []}
    return None


def _unsqueezed(*ops) -> dict:
    """The ``unsqueeze`` of ops of a stacked chain that one kernel does: the shared values that
    take a head axis there (a batch of them must broadcast against the stacks, not the heads)."""
    values = tuple(dict.fromkeys(v for op in ops for v in op.attrs.get("unsqueeze", ())))
    return {"unsqueeze": values} if values else {}


def added_products(sweep: Sweep, kept: set) -> None:
    """``P = A @ B`` read only by ``Y = X + P`` (a residual stream adding a layer's output, a bias
    row added to a layer's product) as ``Y = addmm(X, A, B)``: torch's addmm adds X while it
    multiplies, as ``nn.Linear`` does its bias, one pass over the result fewer. The runtime's
    ``_addmm`` falls back to ``X + A @ B`` where the shapes do not fold (a matrix beside a batch).
    Not where A or B is updated in place between the product and the sum, nor where P is read
    after the sweep (``kept``: the values read after it)."""
    graph_rewrite(sweep, {"sum": [_added_product]}, kept)


# ---- a sum into a product that dies there ----------------------------------------------------------


def _fresh(op: Op) -> bool:
    """A product that makes a new array: a batched one (``_bmm``), or a plain one of two bare
    reads (as the text pass matched ``[\\w.]+ @ [\\w.]+``), not scaled after."""
    if op.kind != "matmul" or op.attrs.get("total") or op.attrs.get("out_scale"):
        return False
    return bool(op.attrs.get("bmm")) or all(_unscaled(a) for a in op.args)


def _sum_into(sweep: Sweep, op: Op, pos: dict, kept) -> Optional[dict]:
    # Y = P + Z, P a fresh product read nowhere else  =>  Y = add_into(P, Z)
    terms = _head(op, (1, 1))
    if terms is None:
        return None
    for p, z in (terms, terms[::-1]):
        prod = sweep.maker.get(p.value)
        if prod is None or not _fresh(prod) or not _bare(p) or not _unscaled(z) or z.value is p.value \
                or not _only_reader(sweep, p.value, op, kept):
            continue
        out, rest = _head_done_by(op)
        return {op: [Op("add_into", [out], (p, z), **_unsqueezed(op, prod))] + rest}
    return None


def added_in_place(sweep: Sweep, kept: set) -> None:
    """``P = A @ B`` (or a batched product: a new array) read only by ``Y = P + Z``: ``Y =
    add_into(P, Z)``, Z added into P where it broadcasts to P's shape (the attention mask added
    to the scores, as autograd's ``masked_fill_``), one array fewer to allocate and fill; the
    checker holds that nothing reads P after. ``kept``: the values read after the sweep."""
    graph_rewrite(sweep, {"sum": [_sum_into]}, kept)


# ---- a scatter added to a product: into it -------------------------------------------------------------


def _scatter_sum(sweep: Sweep, op: Op, pos: dict, kept) -> Optional[dict]:
    # Y = P + S (or S^t), P a product, S = scatter(ids, G), each read nowhere else  =>  Y = scatter_into(P, ids, G)
    terms = _head(op, (1, 1))
    if terms is None:
        return None
    for p, s in (terms, terms[::-1]):
        prod, scat = sweep.maker.get(p.value), sweep.maker.get(s.value)
        if prod is None or scat is None or scat.kind != "scatter" or prod.kind != "matmul" \
                or prod.attrs.get("out_scale") or prod.attrs.get("bmm") or not _bare(p) or not _unscaled(s):
            continue
        if scat.attrs.get("total") != prod.attrs.get("total") or p.value.heads \
                or not all(_only_reader(sweep, r.value, op, kept) for r in (p, s)):
            continue
        if sweep.updated_between(scat.values_read(), pos, pos[scat] + 1, pos[op]):
            continue  # G is updated in place between the scatter and the sum: keep them apart
        out, rest = _head_done_by(op)
        ids, g = scat.args
        into = Op("scatter_into", [out], (p, ids, g), t=s.t, **scat.attrs)
        return {op: [into] + rest, scat: []}
    return None


def scattered_into(sweep: Sweep, kept: set) -> None:
    """``Y = P + onehot(ids)^t G`` (or its transpose), P a product and the scatter each read only
    by the sum (a tied embedding's gradient: its unembedding's product plus its lookup's scatter):
    ``Y = scatter_into(P, ids, G)``, G's rows added at the ids into P in place (``index_add_``),
    instead of a (vocab, cols) array of zeros, the scatter into it, and a sum of two such arrays
    (GPT-2's vocabulary: 154 MB each). The scatter moves to the sum; nothing between them may
    update G. ``kept``: the values read after the sweep."""
    graph_rewrite(sweep, {"sum": [_scatter_sum]}, kept)


# ---- a gradient made in its weight's layout ----------------------------------------------------------


def returned_as_stored(sweep: Sweep, results: dict) -> dict:
    """Results handed out transposed (``'E': t.mT``: a weight's gradient whose product the chain
    order made as its transpose, G^t = H^t Y) whose value a product makes, or a scatter adds into
    a product (a tied embedding's), read by nothing else: the product made the other way round
    (Y^t H), the result handed out as it is. A gradient laid out as its weight is (a weight of
    (vocab, d), not the transpose of a (d, vocab) array) goes to ``.grad`` without a copy, and
    the product writes it row by row (GPT-2's embedding: 0.17 s and a 0.07 s copy a step, to 0.15
    s). ``results``: name -> (how, ref, summed), as ``Lowering.lower`` makes them; the new ones."""
    uses = Counter(ref.var for _, ref, _ in results.values() if isinstance(ref.var, Value))
    for name, (how, ref, summed) in results.items():
        v = ref.var
        if how != "plain" or not ref.flip or ref.scalar or not isinstance(v, Value) or uses[v] != 1 \
                or sweep.readers.get(v):
            continue
        op = sweep.maker.get(v)
        if op is not None and op.kind == "matmul" and not op.attrs.get("bmm") and not v.heads:
            product = transposed_product(op)
            new = product.out
            sweep.rewrite({op: [product]})
        elif op is not None and op.kind == "scatter_into" and not op.args[0].t and not op.args[0].scale:
            p = op.args[0].value
            inner = sweep.maker.get(p)
            if inner is None or inner.kind != "matmul" or inner.attrs.get("bmm") \
                    or list(sweep.readers.get(p, ())) != [op]:
                continue
            product = transposed_product(inner)
            new = transposed_value(v)
            into = Op("scatter_into", [new], (Read(product.out),) + op.args[1:],
                      **dict(op.attrs, t=not op.attrs.get("t")))
            sweep.rewrite({inner: [product], op: [into]})
        else:
            continue
        results[name] = (how, ref._replace(var=new, flip=False), summed)
    return results


def seeded_products(sweep: Sweep, results: dict) -> set:
    """The names of the results whose arrays the products that make them may multiply by the
    sweep's seed (``attrs seeded``: the writer passes ``alpha=_seed``, the product's own scalar,
    free in a GEMM): a result handed out plain whose value a product summed over the batch
    (``matmul`` total) or a ``split_total`` makes, read by nothing else (each part of a split
    so read). Why: the backward multiplies every gradient by the incoming gradient (a mean's
    1/tokens), one pass over a step's gradients (1.7 ms of a shakespeare_char step); made with
    the seed the Function guessed, the products' gradients need none where the guess holds. The
    others are small (biases, gains). A result read off such a value (a copy, a view, a sum over
    the batch) is made times the seed too: it is named with it. ``results`` as
    ``returned_as_stored``'s."""
    names: dict = {}  # value -> the results read off it (plain; a copy of it too: made seeded, it is)
    for name, (how, ref, _) in results.items():
        if how != "full" and isinstance(ref.var, Value) and not ref.scalar:
            names.setdefault(ref.var, []).append(name)
    seeded: set = set()
    for v in names:
        op = sweep.maker.get(v)
        if op is None or op.attrs.get("seeded"):
            continue
        if op.kind == "matmul" and op.attrs.get("total") and not op.attrs.get("bmm") and not op.attrs.get("causal") \
                and not op.attrs.get("out_scale") or op.kind == "split_total":
            if any(sweep.readers.get(out) or out not in names for out in op.outs):
                continue
            op.attrs["seeded"] = True
            seeded.update(name for out in op.outs for name in names[out])
    return seeded


# ---- an affine layer norm: one kernel forward, one backward -----------------------------------------


def _had(op: Optional[Op]) -> bool:
    """A Hadamard product of two reads without scales (as the text pass matched ``(a * b)``)."""
    return op is not None and op.kind == "template" and op.attrs.get("op") == "had" and len(op.args) == 2 \
        and all(_unscaled(a) for a in op.args)


def _other(op: Op, one: Read) -> Optional[Read]:
    """The other factor of a Hadamard product one of whose factors is read as ``one``."""
    if not _had(op):
        return None
    a, b = op.args
    return b if a == one else a if b == one else None


def _times(op: Op, factor: Read) -> tuple:
    """(G, whether transposed) where op is G o factor in the row frame, or (G o factor)^t = G^t o
    factor^t, read transposed; (None, None) if it is neither."""
    other = _other(op, factor)
    if other is not None:
        return other, False
    other = _other(op, factor.T())
    return (other.T(), True) if other is not None else (None, None)


def _row_sum(op: Op) -> Optional[Read]:
    """G of an op summing G over its rows and the batch, in either frame: ``sum_axis(G, -2,
    total)`` or ``sum_axis(G^t, -1, total, view_t)``; else None."""
    if op.kind != "sum_axis" or not op.attrs.get("total") or not _unscaled(op.args[0]):
        return None
    axis, view_t = op.attrs.get("axis"), op.attrs.get("view_t", False)
    if axis == -2 and not view_t:
        return op.args[0]
    if axis == -1 and view_t:
        return op.args[0].T()
    return None


def _row(r: Read) -> bool:
    """A row (1 x d) read as it is: a gain or bias the fused layer norm takes as its (d,) vector
    (a matrix of gains, ``layernorm(Z) * W``, is no such thing)."""
    shape = r.value.shape
    return not r.t and shape is not None and len(shape) == 2 and shape[0] == 1 and not r.value.batched


def _affine_layernorm(sweep: Sweep, stats: Op, pos: dict, kept: set) -> Optional[dict]:
    x, mean, rstd = stats.outs
    a = stats.args[0]
    if not _unscaled(a) or x in kept:
        return None
    # the forward: M = X o g, S = M + b (the first product of X by a bare row)
    xr = sorted(sweep.users(x), key=pos.get)
    f2 = next((j for j in xr if _bare(_other(j, Read(x)))), None)
    if f2 is None:
        return None
    g, m = _other(f2, Read(x)), f2.out
    if not _row(g) or not _made_before(sweep, g.value, pos[stats], pos):
        return None  # (the fused forward is where the statistics were: g must be known there)
    f3 = next(iter(sweep.readers.get(m, {})), None)
    terms = _head(f3, (1, 1)) if f3 is not None and _only_reader(sweep, m, f3, kept) else None
    b = None  # the bias row, if S = M + b follows (else a layer norm with its gain alone, as bias=False's)
    if terms is not None and Read(m) in terms:
        b = terms[1] if terms[0] == Read(m) else terms[0]
        if not _bare(b) or not _row(b) or b.value is m or not _made_before(sweep, b.value, pos[stats], pos):
            b = None
    # the backward: U = G o g read (in the same frame) by D = dlayernorm_stats(A, U, mean, rstd)
    back = [j for j in sweep.users(mean) if j.kind == "dlayernorm_stats" and j.args[0] == a
            and j.args[2] == Read(mean) and j.args[3] == Read(rstd)]
    if len(back) != 1 or not _unscaled(back[0].args[1]):
        return None
    back = back[0]
    u = back.args[1]
    f_u = sweep.maker.get(u.value)
    grad, flip = _times(f_u, g) if f_u is not None and _only_reader(sweep, u.value, back, kept) else (None, None)
    if grad is None or flip != u.t:
        return None
    # the gain's gradient: V = G o X summed over the rows; the bias's: G summed over the rows
    gain = [j for j in xr if _times(j, Read(x))[0] == grad]
    if len(gain) != 1 or not set(xr) <= {f2, gain[0]}:
        return None
    gain = gain[0]
    v, vflip = gain.out, _times(gain, Read(x))[1]
    wg = [j for j in sweep.users(v) if _row_sum(j) == Read(v, vflip)]
    wb = sorted((j for j in sweep.users(grad.value) if _row_sum(j) == grad), key=pos.get)
    if len(wg) != 1 or not _only_reader(sweep, v, wg[0], kept):
        return None
    wg = wg[0]
    if b is None or not wb:  # the gain alone (a bias that is no weight: added after, as it was)
        if pos[wg] < pos[back] or sweep.updated_between((grad.value,), pos, pos[f_u] + 1, pos[wg] + 1):
            return None
        gone = {f2: [], f_u: [], gain: [], wg: []}
        if len(set(gone) | {stats, back}) != 6:
            return None
        return gone, {stats: [Op("layernorm_affine", [m, mean, rstd], (a, g))],
                      back: [Op("dlayernorm_affine", [back.out, wg.out], (grad, a, Read(mean), Read(rstd), g))]}
    wb = wb[0]
    if min(pos[wg], pos[wb]) < pos[back] or sweep.updated_between((grad.value,), pos, pos[f_u] + 1,
                                                                  max(pos[wg], pos[wb]) + 1):
        return None  # the gradients are made where the backward is, from G as it is there
    s, rest = _head_done_by(f3)
    forward = Op("layernorm_affine", [s, mean, rstd], (a, g, b))
    backward = Op("dlayernorm_affine", [back.out, wg.out, wb.out], (grad, a, Read(mean), Read(rstd), g, b))
    gone = {f2: [], f3: rest, f_u: [], gain: [], wg: [], wb: []}
    if len(set(gone) | {stats, back}) != 8:
        return None  # (no op plays two parts)
    return gone, {stats: [forward], back: [backward]}


def affine_layernorms(sweep: Sweep, kept: set) -> None:
    """Each affine layer norm (see the module doc) whose forward and backward ops are all here, in
    the forms the lowering makes, done by torch's fused kernels: ``X, m, r =
    layernorm_stats(A)``, ``M = X o g``, ``S = M + b`` become ``S, m, r = layernorm_affine(A, g,
    b)``; ``U = G o g``, ``D = dlayernorm_stats(A, U, m, r)``, the gain's gradient ``V = G o X``,
    ``Wg = sum_axis(V, -2, total)`` and the bias's ``Wb = sum_axis(G, -2, total)`` become ``D, Wg,
    Wb = dlayernorm_affine(G, A, m, r, g, b)``, each of them also in the transposed frame (``U =
    G^t o g^t`` read as ``U^t``, sums over -1 read transposed). A layer norm where any of these
    is missing, or whose X, M or U something else reads, stays as it is. A layer norm with its
    gain alone (``M = X o g``, no bias: nanoGPT's ``bias=False``) is ``M, m, r =
    layernorm_affine(A, g)`` and ``D, Wg = dlayernorm_affine(G, A, m, r, g)``. ``kept``: the
    values read after the sweep."""
    pos = sweep.positions()
    gone: dict = {}
    kernels: dict = {}
    for op in [op for op in sweep.ops if op.kind == "layernorm_stats"]:
        got = _affine_layernorm(sweep, op, pos, kept)
        if got is not None and not any(k in gone or k in kernels for part in got for k in part):
            gone.update(got[0])
            kernels.update(got[1])
    # in one change: the kernels make values that ops after them made (the normalised sum, the
    # gradients), and a rewrite takes every replaced op out of the indexes before the new ones enter
    if kernels:
        sweep.rewrite({**gone, **kernels})


# ---- a log-softmax's derivative from its forward --------------------------------------------------


def _logsoftmax_backward(sweep: Sweep, op: Op, pos: dict, kept) -> Optional[dict]:
    # D = B - softmax(Z) o rowsum(B), L = logsoftmax(Z) before  =>  D = dlogsoftmax_given(L, B)
    terms = _head(op, (1, -1))
    if terms is None:
        return None
    b, h = terms
    fh = sweep.maker.get(h.value)
    if not _unscaled(b) or not _bare(h) or not _had(fh) or not _only_reader(sweep, h.value, op, kept) \
            or not all(_bare(f) for f in fh.args):
        return None
    p, r = fh.args
    fp, fr = sweep.maker.get(p.value), sweep.maker.get(r.value)
    if fp is None or fr is None:
        return None
    if fr.kind == "softmax":
        p, r, fp, fr = r, p, fr, fp
    rows = fr.kind == "sum_axis" and fr.attrs.get("axis") == -1 and not fr.attrs.get("total") \
        and not fr.attrs.get("view_t") and fr.args[0] == b
    if fp.kind != "softmax" or not rows:
        return None
    z = fp.args[0]
    logs = [j for j in sweep.users(z.value) if j.kind == "template" and j.attrs.get("op") == "logsoftmax"
            and j.args == (z,)]
    if not logs or not _unscaled(z):
        return None
    log = max(logs, key=pos.get)  # the last, as the text pass's index of them kept it
    if pos[log] > pos[op] or not all(_only_reader(sweep, f.value, fh, kept) for f in (p, r)):
        return None
    out, rest = _head_done_by(op)
    return {op: [Op("dlogsoftmax_given", [out], (Read(log.out), b))] + rest, fh: [], fp: [], fr: []}


def logsoftmax_backwards(sweep: Sweep, kept: set) -> None:
    """``B - softmax(Z) o (rowsum(B) 1^t)``, the derivative of log-softmax at Z applied to B (a
    cross-entropy's ``Y - softmax(Z) rowsum(Y)``), where the forward computed ``L =
    logsoftmax(Z)``: ``dlogsoftmax_given(L, B)``, torch's fused log-softmax backward from L,
    instead of a softmax, a row sum, a product and a difference. ``kept``: the values read after
    the sweep."""
    graph_rewrite(sweep, {"sum": [_logsoftmax_backward]}, kept)
