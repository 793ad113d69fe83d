"""Library kernels that do several of the lowering's statements at once, as autograd's do.

Vocabulary
----------
addmm          ``C + A @ B`` as one kernel (``_addmm``): a residual stream adding a layer's
               output, a bias row added to a layer's product (``nn.Linear``'s bias).
affine layer   ``layernorm(A) * C g + C b``, a layer norm with its gain row g and bias row b,
norm           the form every transformer block has: the forward is one ``native_layer_norm``
               with g and b (``_layernorm_affine``), and its backward, the input's adjoint
               ``dlayernorm(A, G o C g)`` with the gradients of g (``sum of G o layernorm(A)``)
               and b (``sum of G``), is one ``native_layer_norm_backward`` that computes all three
               (``_dlayernorm_affine``), instead of a multiplication, two products and two sums.
upstream       G, the adjoint of the layer norm's output, in the rows-by-columns layout of A; the
               statements read it in either orientation (``E``, with ``G = E^t`` or ``G = E``).

Torch target only: these passes run on the statements after ``fusion`` and ``heads``, and each
keeps the function's meaning (the runtime helpers fall back to the separate computations where
the shapes do not fit the kernel).
"""

from __future__ import annotations

import re
from typing import Optional

from .fusion import Stmt, index, targets, transposed

_ADD = re.compile(r"(\w+) = ([\w.]+) \+ ([\w.]+)\Z")
_SIMPLE = re.compile(r"[\w.]+\Z|\([^()]*\)(?:\.mT)?\Z")


def added_products(body: list, kept: set) -> list:
    """``P = A @ B`` read only by ``Y = X + P`` (a residual stream adding a layer's output, a bias
    row added to a layer's product) as ``Y = _addmm(X, A, B)``: torch's addmm adds X while it
    multiplies, as ``nn.Linear`` does its bias, one pass over the result fewer. The runtime's
    ``_addmm`` falls back to ``X + A @ B`` where the shapes do not fold (a matrix beside a batch).
    ``kept``: variables read after the body."""
    _, reads = index(body)
    products = {}
    for i, st in enumerate(body):
        head, _, code = st.code.partition(" = ")
        left, at, right = code.partition(" @ ")
        if at and st.target == head and _SIMPLE.match(left) and "@" not in right and st.target not in kept:
            products[st.target] = (i, left, right)
    out = list(body)
    drop = set()
    for j, st in enumerate(body):
        m = _ADD.match(st.code)
        if not m:
            continue
        y, a, b = m.groups()
        for x, p in ((a, b), (b, a)):
            if p in products and reads.get(p) == [j] and x.split(".")[0] != p:
                i, left, right = products[p]
                if any(set(targets(body[k])) & set(body[i].uses) for k in range(i + 1, j)):
                    continue  # A or B changes between the product and the sum: keep them apart
                uses = tuple(dict.fromkeys((x.split(".")[0],) + tuple(u for u in body[i].uses)))
                out[j] = Stmt(y, "%s = _addmm(%s, %s, %s)" % (y, x, left, right), uses)
                drop.add(i)
                break
    return [st for k, st in enumerate(out) if k not in drop]


# ---- an affine layer norm: one kernel forward, one backward -----------------------------------------

_STATS = re.compile(r"(\w+), (\w+), (\w+) = _layernorm_stats\(([\w.]+)\)\Z")
_HAD = re.compile(r"(\w+) = \(([\w.]+) \* ([\w.]+)\)\Z")
_BACKWARD = re.compile(r"(\w+) = _dlayernorm_stats\(([\w.]+), (\w+)(\.mT)?, (\w+), (\w+)\)\Z")
_SUM_TOTAL = re.compile(r"(\w+) = _sum_total\(([\w.]+), (-[12]), _nb\)(\.mT)?\Z")


def _other(m, one: str):
    """The other factor of a Hadamard product statement ``v = (a * b)`` whose factor is ``one``."""
    a, b = m.group(2), m.group(3)
    return b if a == one else a if b == one else None


def _row_sum(m) -> Optional[str]:
    """G of a statement summing G over its rows and the batch, written in either frame:
    ``_sum_total(G, -2, _nb)`` or ``_sum_total(G^t, -1, _nb).mT``; else None."""
    if m.group(3) == "-2" and not m.group(4):
        return m.group(2)
    if m.group(3) == "-1" and m.group(4):
        return transposed(m.group(2))
    return None


def affine_layernorms(body: list, kept: set) -> list:
    """Each affine layer norm (see the module doc) whose forward and backward statements are all
    here, in the forms the lowering writes, done by torch's fused kernels: ``X, m, r =
    _layernorm_stats(A)``, ``M = (X * g)``, ``S = M + b`` become ``S, m, r = _layernorm_affine(A,
    g, b)``; ``U = (G * g)``, ``D = _dlayernorm_stats(A, U, m, r)``, the gain's gradient ``V = (G *
    X)``, ``Wg = _sum_total(V, -2, _nb)`` and the bias's ``Wb = _sum_total(G, -2, _nb)`` become
    ``D, Wg, Wb = _dlayernorm_affine(G, A, m, r, g, b, _nb)``, each of them also in the transposed
    frame (``U = (G^t * g.mT)`` read as ``U.mT``, sums over -1 transposed). A layer norm where any
    of these is missing, or whose X, M or U something else reads, stays as it is. ``kept``:
    variables read after the body."""
    defs, reads = index(body)  # (variable -> the statements that assign it, in place too; ... that read it)
    hads = {i: m for i, st in enumerate(body) if (m := _HAD.match(st.code))}
    sums = {i: m for i, st in enumerate(body) if (m := _SUM_TOTAL.match(st.code))}

    def once(v, i) -> bool:
        return reads.get(v) == [i] and v not in kept and len(defs.get(v, ())) == 1

    def scaled(j, factor) -> tuple:
        """(G, whether transposed) where statement j is G o factor in the row frame, or (G o
        factor)^t = G^t o factor.mT transposed; (None, None) if it is neither."""
        if j not in hads:
            return None, None
        if _other(hads[j], factor) is not None:
            return _other(hads[j], factor), False
        other = _other(hads[j], factor + ".mT")
        return (transposed(other), True) if other is not None else (None, None)

    replace, drop = {}, set()
    for i, st in enumerate(body):
        m = _STATS.match(st.code)
        if not m:
            continue
        x, mean, rstd, a = m.groups()
        # the forward: M = (X * g), S = M + b
        xr = [j for j in reads.get(x, ()) if j != i]
        f2 = next((j for j in xr if j in hads and _other(hads[j], x) and "." not in _other(hads[j], x)), None)
        if f2 is None:
            continue
        g, mm = _other(hads[f2], x), hads[f2].group(1)
        f3 = reads.get(mm, [None])[0]
        add = _ADD.match(body[f3].code) if f3 is not None and once(mm, f3) else None
        if add is None or mm not in add.groups()[1:] or "." in (b := next(v for v in add.groups()[1:] if v != mm)):
            continue
        s = add.group(1)
        # the backward: U = G o g read by D = _dlayernorm_stats(A, U, mean, rstd)
        back = [j for j in reads.get(mean, ()) if (d := _BACKWARD.match(body[j].code)) and d.group(2) == a
                and d.group(5) == mean and d.group(6) == rstd]
        if len(back) != 1:
            continue
        d = _BACKWARD.match(body[back[0]].code)
        u, frame = d.group(3), bool(d.group(4))
        f_u = defs.get(u, [None])[0]
        grad, flip = scaled(f_u, g) if f_u is not None and once(u, back[0]) else (None, None)
        if grad is None or flip != frame:
            continue
        # the gain's gradient: V = G o X summed over the rows, the bias's: G summed
        gain = [j for j in xr if scaled(j, x)[0] == grad]
        if len(gain) != 1 or not set(xr) <= {f2, gain[0]}:
            continue
        v, vflip = hads[gain[0]].group(1), scaled(gain[0], x)[1]
        wg = [j for j in reads.get(v, ()) if j in sums and _row_sum(sums[j]) == (transposed(v) if vflip else v)]
        wb = [j for j in sums if _row_sum(sums[j]) == grad]
        if len(wg) != 1 or not once(v, wg[0]) or not wb:
            continue
        wg, wb = wg[0], wb[0]
        if min(wg, wb) < back[0] or any(f_u < k <= max(wg, wb) for k in defs.get(grad.split(".")[0], ())):
            continue  # the gradients are assigned where the backward is, from G as it is there
        replace[i] = Stmt(s, "%s, %s, %s = _layernorm_affine(%s, %s, %s)" % (s, mean, rstd, a, g, b),
                          (a.split(".")[0], g, b))
        drop |= {f2, f3, f_u, gain[0], wg, wb}
        uses = tuple(dict.fromkeys([grad.split(".")[0], a.split(".")[0], mean, rstd, g, b]))
        dv, wgv, wbv = d.group(1), sums[wg].group(1), sums[wb].group(1)
        replace[back[0]] = Stmt(dv, "%s, %s, %s = _dlayernorm_affine(%s, %s, %s, %s, %s, %s, _nb)"
                                % (dv, wgv, wbv, grad, a, mean, rstd, g, b), uses)
    if not replace:
        return body
    return [replace.get(k, st) for k, st in enumerate(body) if k not in drop or k in replace]


# ---- a log-softmax's derivative from its forward --------------------------------------------------

_LOGSOFTMAX = re.compile(r"(\w+) = torch\.log_softmax\(([\w.]+), dim=-1\)\Z")
_SOFTMAX = re.compile(r"(\w+) = _softmax\(([\w.]+)\)\Z")
_ROWSUM = re.compile(r"(\w+) = ([\w.]+)\.sum\(dim=-1, keepdim=True\)\Z")
_SUB = re.compile(r"(\w+) = ([\w.]+) - (\w+)\Z")


def logsoftmax_backwards(body: list, kept: set) -> list:
    """``B - softmax(Z) o (rowsum(B) 1^t)``, the derivative of log-softmax at Z applied to B (a
    cross-entropy's ``Y - softmax(Z) rowsum(Y)``), where the forward computed ``L =
    logsoftmax(Z)``: ``_dlogsoftmax_given(L, B)``, torch's fused log-softmax backward from L,
    instead of a softmax, a row sum, a product and a difference. ``kept``: variables read after."""
    where, reads = index(body)
    logs = {m.group(2): (i, m.group(1)) for i, st in enumerate(body) if (m := _LOGSOFTMAX.match(st.code))}
    replace, drop = {}, set()
    for j, st in enumerate(body):
        sub = _SUB.match(st.code)
        if not sub:
            continue
        d, b, h = sub.groups()
        fh = where.get(h, [None])
        had = _HAD.match(body[fh[0]].code) if len(fh) == 1 and fh[0] is not None else None
        if had is None or reads.get(h) != [j] or h in kept:
            continue
        p, r = had.group(2), had.group(3)
        fp, fr = where.get(p, [None]), where.get(r, [None])
        if len(fp) != 1 or len(fr) != 1 or fp[0] is None or fr[0] is None:
            continue
        if _SOFTMAX.match(body[fr[0]].code):
            p, r, fp, fr = r, p, fr, fp
        soft, rows = _SOFTMAX.match(body[fp[0]].code), _ROWSUM.match(body[fr[0]].code)
        if soft is None or rows is None or rows.group(2) != b or soft.group(2) not in logs:
            continue
        k, log = logs[soft.group(2)]
        if k > j or len(where.get(log, ())) != 1 or any(reads.get(v) != [fh[0]] or v in kept for v in (p, r)):
            continue
        replace[j] = Stmt(d, "%s = _dlogsoftmax_given(%s, %s)" % (d, log, b), (log, b.split(".")[0]))
        drop |= {fh[0], fp[0], fr[0]}
    if not replace:
        return body
    return [replace.get(k, st) for k, st in enumerate(body) if k not in drop]


# ---- a sum into a product that dies there ----------------------------------------------------------

_FRESH = re.compile(r"(\w+) = (?:_bmm\(.*\)|[\w.]+ @ [\w.]+)\Z")


def added_in_place(body: list, kept: set) -> list:
    """``P = A @ B`` (or ``_bmm``: a new array) read only by ``Y = P + Z``: ``Y = _add_into(P, Z)``,
    Z added into P where it broadcasts to P's shape (the attention mask added to the scores, as
    autograd's ``masked_fill_``), one array fewer to allocate and fill. ``kept``: variables read
    after the body."""
    defs, reads = index(body)
    out = list(body)
    for j, st in enumerate(body):
        m = _ADD.match(st.code)
        if not m:
            continue
        y, a, b = m.groups()
        for p, z in ((a, b), (b, a)):
            d = defs.get(p, [])
            if len(d) == 1 and d[0] < j and _FRESH.match(body[d[0]].code) and p not in kept \
                    and [r for r in reads.get(p, ()) if r != d[0]] == [j] and z.split(".")[0] != p:
                out[j] = Stmt(y, "%s = _add_into(%s, %s)" % (y, p, z), st.uses)
                break
    return out
