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

from .fusion import Stmt, targets, transposed

_ADD = re.compile(r"(\w+) = ([\w.]+) \+ ([\w.]+)\Z")
_SIMPLE = re.compile(r"[\w.]+\Z|\([^()]*\)(?:\.mT)?\Z")


def added_products(body: list, kept: set) -> list:
    """``P = A @ B`` read only by ``Y = X + P`` (a residual stream adding a layer's output, a bias
    row added to a layer's product) as ``Y = _addmm(X, A, B)``: torch's addmm adds X while it
    multiplies, as ``nn.Linear`` does its bias, one pass over the result fewer. The runtime's
    ``_addmm`` falls back to ``X + A @ B`` where the shapes do not fold (a matrix beside a batch).
    ``kept``: variables read after the body."""
    reads: dict = {}
    for i, st in enumerate(body):
        for u in st.uses:
            reads.setdefault(u, []).append(i)
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
                if any(w in body[k].code.split(" = ")[0].split(", ") for k in range(i + 1, j)
                       for w in (x.split(".")[0],)):
                    continue  # X changes between the product and the sum: keep them apart
                uses = tuple(dict.fromkeys((x.split(".")[0],) + tuple(u for u in body[i].uses)))
                out[j] = Stmt(y, "%s = _addmm(%s, %s, %s)" % (y, x, left, right), uses)
                drop.add(i)
                break
    return [st for k, st in enumerate(out) if k not in drop]


# ---- an affine layer norm: one kernel forward, one backward -----------------------------------------

_STATS = re.compile(r"(\w+), (\w+), (\w+) = _layernorm_stats\(([\w.]+)\)\Z")
_HAD = re.compile(r"(\w+) = \(([\w.]+) \* ([\w.]+)\)\Z")
_BACKWARD = re.compile(r"(\w+) = _dlayernorm_stats\(([\w.]+), (\w+)\.mT, (\w+), (\w+)\)\Z")
_SUM_TOTAL = re.compile(r"(\w+) = _sum_total\(([\w.]+), (-[12]), _nb\)(\.mT)?\Z")


def _other(m, one: str):
    """The other factor of a Hadamard product statement ``v = (a * b)`` whose factor is ``one``."""
    a, b = m.group(2), m.group(3)
    return b if a == one else a if b == one else None


def affine_layernorms(body: list, kept: set) -> list:
    """Each affine layer norm (see the module doc) whose forward and backward statements are all
    here, in the forms the lowering writes, done by torch's fused kernels: ``X, m, r =
    _layernorm_stats(A)``, ``M = (X * g)``, ``S = M + b`` become ``S, m, r = _layernorm_affine(A,
    g, b)``; ``U = (E * g.mT)``, ``D = _dlayernorm_stats(A, U.mT, m, r)``, the gain's gradient
    ``V = (E * X.mT)``, ``Wg = _sum_total(V, -1, _nb).mT`` and the bias's ``Wb = _sum_total(E, -1,
    _nb).mT`` (or of E^t over -2) become ``D, Wg, Wb = _dlayernorm_affine(E^t, A, m, r, g, b,
    _nb)``. A layer norm where any of these is missing, or whose X, M or U something else reads,
    stays as it is. ``kept``: variables read after the body."""
    reads: dict = {}
    defs: dict = {}  # variable -> the statements that assign it (in place too)
    for i, st in enumerate(body):
        for u in st.uses:
            reads.setdefault(u, []).append(i)
        for t in targets(st):
            defs.setdefault(t, []).append(i)
    hads = {i: m for i, st in enumerate(body) if (m := _HAD.match(st.code))}
    sums = {i: m for i, st in enumerate(body) if (m := _SUM_TOTAL.match(st.code))}
    once = lambda v, i: reads.get(v) == [i] and v not in kept and len(defs.get(v, ())) == 1  # noqa: E731
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
        # the backward: U = (E * g.mT) read by D = _dlayernorm_stats(A, U.mT, mean, rstd)
        back = [j for j in reads.get(mean, ()) if (d := _BACKWARD.match(body[j].code)) and d.group(2) == a
                and d.group(4) == mean and d.group(5) == rstd]
        if len(back) != 1:
            continue
        d = _BACKWARD.match(body[back[0]].code)
        u = d.group(3)
        f_u = defs.get(u, [None])[0]
        if f_u not in hads or not once(u, back[0]) or _other(hads[f_u], g + ".mT") is None:
            continue
        e = _other(hads[f_u], g + ".mT")
        # the gain's gradient: V = (E * X.mT), Wg = _sum_total(V, -1, _nb).mT
        gain = [j for j in xr if j in hads and _other(hads[j], x + ".mT") == e]
        if len(gain) != 1 or not set(xr) <= {f2, gain[0]}:
            continue
        v = hads[gain[0]].group(1)
        wg = [j for j in reads.get(v, ()) if j in sums and sums[j].group(2) == v and sums[j].group(3) == "-1"
              and sums[j].group(4)]
        if len(wg) != 1 or not once(v, wg[0]):
            continue
        # the bias's gradient: the sum of E over its last axis (or of E^t over rows)
        wb = [j for j in sums if (sums[j].group(2), sums[j].group(3), bool(sums[j].group(4))) in
              ((e, "-1", True), (transposed(e), "-2", False))]
        if not wb:
            continue
        wb = wb[0]
        if min(wg[0], wb) < back[0] or any(f_u < k <= max(wg[0], wb) for k in defs.get(e.split(".")[0], ())):
            continue  # the gradients are assigned where the backward is, from E as it is there
        replace[i] = Stmt(s, "%s, %s, %s = _layernorm_affine(%s, %s, %s)" % (s, mean, rstd, a, g, b),
                          (a.split(".")[0], g, b))
        drop |= {f2, f3, f_u, gain[0], wg[0], wb}
        grad = transposed(e)
        uses = tuple(dict.fromkeys([grad.split(".")[0], a.split(".")[0], mean, rstd, g, b]))
        dv, wgv, wbv = d.group(1), sums[wg[0]].group(1), sums[wb].group(1)
        replace[back[0]] = Stmt(dv, "%s, %s, %s = _dlayernorm_affine(%s, %s, %s, %s, %s, %s, _nb)"
                                % (dv, wgv, wbv, grad, a, mean, rstd, g, b), uses)
    if not replace:
        return body
    return [replace.get(k, st) for k, st in enumerate(body) if k not in drop or k in replace]
