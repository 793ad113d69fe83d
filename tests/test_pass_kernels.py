"""The torch kernels' passes (``fdsl.codegen.kernels``: addmm, add into, the affine layer norm, the
log-softmax backward) and the early results (``fdsl.codegen.schedule``), each on small sweeps built
by hand: the ops each leaves (kinds, values, attrs), the checker after every pass, the cases where
each must not fire (one for every guard), and the values of the sweep before and after, computed
op by op with the torch runtime's helpers (a batch and one example)."""

from __future__ import annotations

import pytest

from fdsl.codegen import ir
from fdsl.codegen.ir import Dim, Op, Read, Sweep, Value
from fdsl.codegen.kernels import added_in_place, added_products, affine_layernorms, logsoftmax_backwards, scattered_into
from fdsl.codegen.schedule import early_results

torch = pytest.importorskip("torch")
from fdsl.codegen import torch_runtime as rt  # noqa: E402 (torch first)


def V(*shape, batched=False, scalar=False) -> Value:
    return Value(shape=shape or None, batched=batched, scalar=scalar)


def R(v: Value, t: bool = False, *scale) -> Read:
    return Read(v, t, tuple(scale))


def add(out, *terms, signs=None, head=2) -> Op:
    return Op("sum", [out], terms, signs=tuple(signs or (1,) * len(terms)), head=min(head, len(terms)))


def had(out, a, b) -> Op:
    return Op("template", [out], (a, b), op="had")


def run(pass_, ops, kept, given):
    """The sweep of ``ops`` after ``pass_``, checked before and after."""
    sweep = Sweep(ops)
    ir.check(sweep, given)
    pass_(sweep, set(kept))
    ir.check(sweep, given)
    return sweep


# ---- the sweep's values, op by op ------------------------------------------------------------------


def _scalar(env, s):
    if isinstance(s, Dim):
        return float(env[s.size] if isinstance(s.size, Value) else s.size)
    return env[s] if isinstance(s, Value) else s


def _read(env, r):
    x = env[r.value].mT if r.t else env[r.value]
    for s in r.scale:
        x = _scalar(env, s) * x
    return x


def _op(op: Op, a: list, nb: int):
    k, at = op.kind, op.attrs
    if k == "matmul":
        v = rt._matmul_total(a[0], a[1], nb) if at.get("total") else rt._bmm(*a) if at.get("bmm") else a[0] @ a[1]
        for s in at.get("out_scale", ()):
            v = v * s
        return v
    if k == "sum":
        return sum(s * x for s, x in zip(at["signs"], a))
    if k == "sum_axis":
        v = rt._sum_total(a[0], at["axis"], nb) if at.get("total") else a[0].sum(dim=at["axis"], keepdim=True)
        return v.mT if at.get("view_t") else v
    if k == "template":
        return a[0] * a[1] if at["op"] == "had" else torch.log_softmax(a[0], dim=-1)
    if k == "scatter":
        return rt._scatter_total(a[0], a[1], at["vocab"], nb) if at.get("total") else rt._scatter(*a, at["vocab"])
    if k == "scatter_into":
        return rt._scatter_into(*a, at["vocab"], nb if at.get("total") else None, at["t"])
    table = {"scale": lambda x: x, "cat_matmul": lambda w, *bs: w @ rt._cat(bs, -2),
             "cat_addmm": lambda c, w, *bs: rt._addmm(c, w, rt._cat(bs, -2)),
             "layernorm_affine": lambda A, g, b=None: rt._layernorm_affine(A, g, b),
             "dlayernorm_affine": lambda *xs: rt._dlayernorm_affine(*xs, nb) if len(xs) == 6
             else rt._dlayernorm_affine(*xs, None, nb)[:2]}  # (the gain alone: no bias)
    return table.get(k, getattr(rt, "_" + k, None))(*a)


def values(ops, env: dict, nb: int = 0) -> dict:
    """Every value the ops make from ``env`` (value -> tensor), computed in order."""
    env = dict(env)
    for op in ops:
        got = _op(op, [_read(env, x) if isinstance(x, Read) else _scalar(env, x) for x in op.args], nb)
        env.update(zip(op.outs, got) if len(op.outs) > 1 else [(op.out, got)])
    return env


def same(before, after, env, kept, nb=0, exact=False):
    want, got = values(before, env, nb), values(after, env, nb)
    for v in kept:
        ok = torch.equal(want[v], got[v]) if exact else torch.allclose(want[v], got[v], atol=1e-12)
        assert ok and want[v].shape == got[v].shape, (v, nb)


def randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


# ---- a product added to a matrix: one addmm -------------------------------------------------------


def _residual():
    A, B, X, B2, r = V(5, 4, batched=True), V(4, 6), V(5, 6, batched=True), V(6, 2), V(1, 2)
    p, y, q, z = V(5, 6, batched=True), V(5, 6, batched=True), V(5, 2, batched=True), V(5, 2, batched=True)
    ops = [Op("matmul", [p], (R(A), R(B))), add(y, R(X), R(p)), Op("matmul", [q], (R(y), R(B2))), add(z, R(q), R(r))]
    return (A, B, X, B2, r), (p, y, q, z), ops


def test_a_product_added_to_a_matrix_is_one_addmm():
    # P = A @ B read only by Y = X + P: Y = addmm(X, A, B) (a residual, or a bias row, on either
    # side of the +), for a batch, one example, a row and a matrix beside a batch (the fallback)
    given, (p, y, q, z), ops = _residual()
    A, B, X, B2, r = given
    sweep = run(added_products, ops, {z}, given)
    assert [(op.kind, op.outs, op.args) for op in sweep] == [
        ("addmm", (y,), (R(X), R(A), R(B))), ("addmm", (z,), (R(r), R(y), R(B2)))], sweep.ops
    gen = torch.Generator().manual_seed(7)
    for a_lead, x_lead in (((3,), (3,)), ((), ()), ((3,), ())):
        env = {A: randn(gen, *a_lead, 5, 4), B: randn(gen, 4, 6), X: randn(gen, *x_lead, 5, 6),
               B2: randn(gen, 6, 2), r: randn(gen, 1, 2)}
        same(ops, sweep.ops, env, [z])


def test_a_product_read_again_or_after_the_sweep_is_not_added_by_addmm():
    given, (p, y, q, z), ops = _residual()
    w = V(5, 6)
    read_again = run(added_products, ops + [Op("scale", [w], (R(p, False, 2.0),))], {z, w}, given)
    assert read_again.ops[:2] == ops[:2] and read_again.ops[2].kind == "addmm", read_again.ops
    assert run(added_products, ops, {z, p}, given).ops[:2] == ops[:2]


def test_a_product_is_not_moved_into_its_sum_past_an_update_in_place_of_an_operand():
    # A updated in place (add_into) between P = A @ B and Y = X + P: the product stays where A is as
    # it read it (the checker would find A read after its update); after the sum, it may move
    A, B, X, W = V(5, 4), V(4, 6), V(5, 6), V(5, 4)
    p, a2, y = V(5, 6), V(5, 4), V(5, 6)
    ops = [Op("matmul", [p], (R(A), R(B))), Op("add_into", [a2], (R(A), R(W))), add(y, R(X), R(p))]
    assert run(added_products, ops, {y, a2}, (A, B, X, W)).ops == ops
    later = [ops[0], ops[2], ops[1]]
    assert [op.kind for op in run(added_products, later, {y, a2}, (A, B, X, W))] == ["addmm", "add_into"]


@pytest.mark.parametrize("case", ["minus", "head", "transposed", "scaled", "itself", "total", "bmm", "out_scale"])
def test_a_product_that_addmm_cannot_do_stays(case):
    # the sum's head must be X + P with P read as it is; the product one array, not scaled after
    A, B, X = V(5, 5), V(5, 5), V(5, 5)
    p, y = V(5, 5), V(5, 5)
    prod = Op("matmul", [p], (R(A), R(B)), total=case == "total", bmm=case == "bmm",
              out_scale=(2.0,) if case == "out_scale" else ())
    term = R(p, case == "transposed", *((0.5,) if case == "scaled" else ()))
    other = R(p) if case == "itself" else R(X)
    plus = add(y, other, term, R(X), signs=(1, -1, 1) if case == "minus" else None, head=3 if case == "head" else 2)
    assert run(added_products, [prod, plus], {y}, (A, B, X)).ops == [prod, plus]


def test_the_head_of_a_longer_sum_is_one_addmm_and_the_rest_is_added_to_it():
    # Y = X + P + c (head X + P, as the residual stream adds a layer's output and its bias): the
    # addmm makes the head, a new value, and the sum adds c to it
    A, B, X, c = V(5, 4, batched=True), V(4, 6), V(5, 6, batched=True), V(1, 6)
    p, y = V(5, 6, batched=True), V(5, 6, batched=True)
    ops = [Op("matmul", [p], (R(A), R(B))), add(y, R(X), R(p), R(c, False, -1.0), signs=(1, 1, -1))]
    sweep = run(added_products, ops, {y}, (A, B, X, c))
    mm, rest = sweep.ops
    part = mm.out
    assert mm.kind == "addmm" and mm.args == (R(X), R(A), R(B)) and part is not y and part.hint is y
    assert rest.kind == "sum" and rest.out is y and rest.args == (R(part), R(c, False, -1.0))
    assert rest.attrs["signs"] == (1, -1) and rest.attrs["head"] == 1 and part.batched and part.shape == (5, 6)
    gen = torch.Generator().manual_seed(1)
    same(ops, sweep.ops, {A: randn(gen, 3, 5, 4), B: randn(gen, 4, 6), X: randn(gen, 3, 5, 6), c: randn(gen, 1, 6)},
         [y])


def test_a_product_by_a_concatenation_is_one_addmm_of_it():
    # the heads' outputs side by side times the output weight's blocks, added to the residual
    H, O1, O2, X = V(5, 4, batched=True), V(2, 3), V(2, 3), V(5, 3, batched=True)
    p, y = V(5, 3, batched=True), V(5, 3, batched=True)
    ops = [Op("cat_matmul", [p], (R(H), R(O1), R(O2))), add(y, R(X), R(p))]
    sweep = run(added_products, ops, {y}, (H, O1, O2, X))
    assert [(op.kind, op.args) for op in sweep] == [("cat_addmm", (R(X), R(H), R(O1), R(O2)))]
    gen = torch.Generator().manual_seed(2)
    for lead in ((3,), ()):
        same(ops, sweep.ops, {H: randn(gen, *lead, 5, 4), O1: randn(gen, 2, 3), O2: randn(gen, 2, 3),
                              X: randn(gen, *lead, 5, 3)}, [y])


def test_a_scaled_operand_is_added_by_addmm_whatever_spelled_its_scale():
    # (c A) @ B + X: a literal, a scalar given with the data, a dim's size, a learned temperature
    # times a scalar: the same decision, the scale kept on its read
    A, B, X = V(5, 4, batched=True), V(4, 6), V(5, 6, batched=True)
    s, tau, n = V(scalar=True), V(scalar=True), V(scalar=True)
    gen = torch.Generator().manual_seed(3)
    env = {A: randn(gen, 3, 5, 4), B: randn(gen, 4, 6), X: randn(gen, 3, 5, 6), s: 0.5, tau: 1.5, n: 4}
    for scale in ((0.125,), (s,), (Dim(4),), (Dim(n),), (tau, s)):
        p, y = V(5, 6, batched=True), V(5, 6, batched=True)
        ops = [Op("matmul", [p], (R(A, False, *scale), R(B))), add(y, R(p), R(X))]
        sweep = run(added_products, ops, {y}, (A, B, X, s, tau, n))
        assert [(op.kind, op.args) for op in sweep] == [("addmm", (R(X), R(A, False, *scale), R(B)))], scale
        same(ops, sweep.ops, env, [y])


# ---- a sum into a product that dies there ----------------------------------------------------------


def _scores():
    A, B, M, Big = V(4, 5, batched=True), V(5, 4, batched=True), V(4, 4), V(4, 4, batched=True)
    p, y, q, z = (V(4, 4, batched=True) for _ in range(4))
    ops = [Op("matmul", [p], (R(A), R(B)), bmm=True), add(y, R(p), R(M)),
           Op("matmul", [q], (R(A), R(B))), add(z, R(Big), R(q))]
    return (A, B, M, Big), (p, y, q, z), ops


def test_the_mask_is_added_into_the_scores():
    # P = bmm(...) read only by Y = P + Z: Y = add_into(P, Z) where Z broadcasts to P (the causal
    # mask added to the scores), P on either side of the +; the runtime adds the larger Z out of place
    given, (p, y, q, z), ops = _scores()
    A, B, M, Big = given
    sweep = run(added_in_place, ops, {y, z}, given)
    assert [(op.kind, op.outs, op.args) for op in sweep] == [
        ("matmul", (p,), (R(A), R(B))), ("add_into", (y,), (R(p), R(M))),
        ("matmul", (q,), (R(A), R(B))), ("add_into", (z,), (R(q), R(Big)))], sweep.ops
    gen = torch.Generator().manual_seed(10)
    env = {A: randn(gen, 3, 4, 5), B: randn(gen, 3, 5, 4), M: torch.triu(torch.full((4, 4), float("-inf"),
                                                                                  dtype=torch.float64), 1),
           Big: randn(gen, 2, 3, 4, 4)}
    same(ops[:2], sweep.ops[:2], env, [y], exact=True)
    same(ops, sweep.ops, env, [z])
    assert values(sweep.ops, env)[z].shape == (2, 3, 4, 4)


@pytest.mark.parametrize("case", ["read again", "kept", "itself", "transposed", "scaled term", "scaled z",
                                  "minus", "total", "out_scale", "scaled plain product", "given"])
def test_a_sum_that_cannot_go_into_its_product_stays(case):
    A, B, Z = V(4, 4), V(4, 4), V(4, 4)
    p, y, w = V(4, 4), V(4, 4), V(4, 4)
    left = R(A, False, 0.5) if case == "scaled plain product" else R(A)
    prod = Op("matmul", [p], (left, R(B)), total=case == "total", out_scale=(2.0,) if case == "out_scale" else ())
    term = R(p, case == "transposed", *((0.5,) if case == "scaled term" else ()))
    other = R(p) if case == "itself" else R(Z, False, 0.5) if case == "scaled z" else R(Z)
    plus = add(y, term, other, signs=(1, -1) if case == "minus" else None)
    ops = [prod, plus] + ([Op("scale", [w], (R(p),))] if case == "read again" else [])
    kept = {y, w} | ({p} if case == "kept" else set())
    if case == "given":  # P made before the sweep: not known to be a new array
        ops, given = [add(y, R(p), R(Z))], (p, Z)
    else:
        given = (A, B, Z)
    assert run(added_in_place, ops, kept, given).ops == ops


def test_a_scaled_batched_product_takes_the_sum_whatever_spelled_its_scale():
    # bmm((c Q), K^t) + M: any scale (literal, given, a dim, temperature times scalar) fires
    Q, K, M, s, tau = V(4, 5, batched=True), V(4, 5, batched=True), V(4, 4), V(scalar=True), V(scalar=True)
    for scale in ((0.125,), (s,), (Dim(5),), (tau, s)):
        p, y = V(4, 4, batched=True), V(4, 4, batched=True)
        ops = [Op("matmul", [p], (R(Q, False, *scale), R(K, True)), bmm=True), add(y, R(p), R(M))]
        assert [op.kind for op in run(added_in_place, ops, {y}, (Q, K, M, s, tau))] == ["matmul", "add_into"]


def test_the_head_of_a_longer_sum_goes_into_its_product():
    Q, K, M, c = V(4, 5, batched=True), V(4, 5, batched=True), V(4, 4), V(4, 4, batched=True)
    p, y = V(4, 4, batched=True), V(4, 4, batched=True)
    ops = [Op("matmul", [p], (R(Q), R(K, True)), bmm=True), add(y, R(p), R(M), R(c), signs=(1, 1, -1))]
    sweep = run(added_in_place, ops, {y}, (Q, K, M, c))
    mm, into, rest = sweep.ops
    assert mm is ops[0] and into.kind == "add_into" and into.args == (R(p), R(M)) and into.out is not y
    assert rest.kind == "sum" and rest.args == (R(into.out), R(c)) and rest.attrs["signs"] == (1, -1)
    gen = torch.Generator().manual_seed(11)
    same(ops, sweep.ops, {Q: randn(gen, 3, 4, 5), K: randn(gen, 3, 4, 5), M: randn(gen, 4, 4),
                          c: randn(gen, 3, 4, 4)}, [y])


# ---- an affine layer norm: one kernel forward, one backward -----------------------------------------


def _layernorm(frame="t", **change):
    """The ops of layernorm(A) o g + b and its backward from the upstream E (``frame`` "t": E = G^t,
    the sums over -1 read transposed; "rows": E = G); ``change``: name -> a function of the values
    giving the op put in place of the named one (None: none). (given, values, ops)."""
    A, g, b, W = V(5, 4, batched=True), V(1, 4), V(1, 4), V(4, 2)
    E = V(4, 5, batched=True) if frame == "t" else V(5, 4, batched=True)
    x, m, r = V(5, 4, batched=True), V(5, 1, batched=True), V(5, 1, batched=True)
    h, s, y, dA, wb, wg = V(5, 4, batched=True), V(5, 4, batched=True), V(5, 2, batched=True), \
        V(5, 4, batched=True), V(1, 4), V(1, 4)
    u, v = (V(4, 5, batched=True), V(4, 5, batched=True)) if frame == "t" else \
        (V(5, 4, batched=True), V(5, 4, batched=True))
    t = frame == "t"
    ops = {"stats": Op("layernorm_stats", [x, m, r], (R(A),)), "h": had(h, R(x), R(g)), "s": add(s, R(h), R(b)),
           "y": Op("matmul", [y], (R(s), R(W))), "u": had(u, R(E), R(g, t)),
           "dA": Op("dlayernorm_stats", [dA], (R(A), R(u, t), R(m), R(r))),
           "wb": Op("sum_axis", [wb], (R(E, t),), axis=-2, total=True),
           "v": had(v, R(E), R(x, t)) if t else had(v, R(x), R(E)),
           "wg": Op("sum_axis", [wg], (R(v),), axis=-1 if t else -2, total=True, view_t=t)}
    names = dict(A=A, g=g, b=b, W=W, E=E, x=x, m=m, r=r, h=h, s=s, y=y, dA=dA, wb=wb, wg=wg, u=u, v=v)
    ops.update({k: f and f(names) for k, f in change.items()})
    return (A, g, b, W, E), names, [op for op in ops.values() if op is not None]


def _layernorm_env(names, nb, gen):
    lead = (nb,) if nb else ()
    A, E = names["A"], names["E"]
    return {A: randn(gen, *lead, *A.shape), E: randn(gen, *lead, *E.shape), names["g"]: randn(gen, 1, 4),
            names["b"]: randn(gen, 1, 4), names["W"]: randn(gen, 4, 2)}


@pytest.mark.parametrize("frame", ["t", "rows"])
def test_an_affine_layer_norm_is_one_kernel_forward_and_one_backward(frame):
    # layernorm(A) o g + b and its backward (the input's adjoint, the gain's and the bias's
    # gradients) as torch's fused kernels, in either frame of the upstream, a batch and one example
    given, n, ops = _layernorm(frame)
    kept = {n["y"], n["dA"], n["wg"], n["wb"]}
    sweep = run(affine_layernorms, ops, kept, given)
    grad = R(n["E"], frame == "t")
    assert [(op.kind, op.outs, op.args) for op in sweep] == [
        ("layernorm_affine", (n["s"], n["m"], n["r"]), (R(n["A"]), R(n["g"]), R(n["b"]))),
        ("matmul", (n["y"],), (R(n["s"]), R(n["W"]))),
        ("dlayernorm_affine", (n["dA"], n["wg"], n["wb"]),
         (grad, R(n["A"]), R(n["m"]), R(n["r"]), R(n["g"]), R(n["b"])))], sweep.ops
    gen = torch.Generator().manual_seed(8)
    for nb in (3, 0):
        same(ops, sweep.ops, _layernorm_env(n, nb, gen), kept, nb)


def _unchanged_layernorm(frame="t", extra=(), kept_more=(), **change):
    given, n, ops = _layernorm(frame, **change)
    ops = ops + [f(n) for f in extra]
    kept = {n["y"], n["dA"], n["wg"], n["wb"]} | {n[k] for k in kept_more}
    assert run(affine_layernorms, ops, kept | {op.out for op in ops[len(ops) - len(extra):]}, given).ops == ops


def _gain_only_layernorm(frame="t", extra=(), kept_more=(), numbers=True, **change):
    """The layer norm with its gain alone as the kernels (M = X o g made by the forward, the gain's
    gradient by the backward), the rest as it was, and the same numbers (``numbers``: where the
    ops are shaped to be computed)."""
    given, n, ops = _layernorm(frame, **change)
    ops = ops + [f(n) for f in extra]
    kept = {n["y"], n["dA"], n["wg"]} | {op.out for op in ops if op.kind == "sum_axis"} | {n[k] for k in kept_more}
    kept |= {op.out for op in ops[len(ops) - len(extra):]}
    sweep = run(affine_layernorms, ops, kept, given)
    kinds = [op.kind for op in sweep]
    forward = next(op for op in sweep if op.kind == "layernorm_affine")
    backward = next(op for op in sweep if op.kind == "dlayernorm_affine")
    assert forward.outs == (n["h"], n["m"], n["r"]) and forward.args == (R(n["A"]), R(n["g"]))
    assert backward.outs == (n["dA"], n["wg"]) and len(backward.args) == 5
    assert "layernorm_stats" not in kinds and "dlayernorm_stats" not in kinds
    gen = torch.Generator().manual_seed(9)
    for nb in (3, 0) if numbers else ():
        same(ops, sweep.ops, _layernorm_env(n, nb, gen), kept, nb)


def test_an_affine_layer_norm_read_elsewhere_stays():
    # its X, its U or its V read by anything else, or kept after the sweep
    for read in ("x", "u", "v"):
        _unchanged_layernorm(extra=[lambda n, read=read: Op("scale", [V()], (R(n[read], False, 2.0),))])
        _unchanged_layernorm(kept_more=[read])


@pytest.mark.parametrize("frame", ["t", "rows"])
def test_a_layer_norm_with_its_gain_alone_is_one_kernel_forward_and_one_backward(frame):
    # nanoGPT's bias=False: layernorm(A) o g and no bias; and where the bias cannot join the kernel
    # (X o g read by anything else, kept, the bias read scaled or transposed or subtracted, or no
    # gradient of it asked), the gain's kernel makes X o g and the sum with the bias stays
    _gain_only_layernorm(frame, s=lambda n: None, wb=None,
                         y=lambda n: Op("matmul", [n["y"]], (R(n["h"]), R(n["W"]))))
    _gain_only_layernorm(frame, extra=[lambda n: Op("scale", [V()], (R(n["h"], False, 2.0),))])
    _gain_only_layernorm(frame, kept_more=["h"])
    _gain_only_layernorm(frame, wb=None)
    _gain_only_layernorm(frame, s=lambda n: add(n["s"], R(n["h"]), R(n["b"], False, 2.0)))
    _gain_only_layernorm(frame, s=lambda n: add(n["s"], R(n["h"]), R(n["b"], True)), numbers=False)
    _gain_only_layernorm(frame, s=lambda n: add(n["s"], R(n["h"]), R(n["b"]), signs=(1, -1)))


def test_an_affine_layer_norm_in_another_form_stays():
    # no backward; a frame that does not fit (the gain summed over the other axis); the upstream's
    # frame not the one U is read in; a gain read scaled; the sums not summed over the batch
    _unchanged_layernorm("rows", dA=None)
    _unchanged_layernorm("rows", wg=lambda n: Op("sum_axis", [n["wg"]], (R(n["v"]),), axis=-1, total=True,
                                                 view_t=True))
    _unchanged_layernorm("rows", wg=lambda n: Op("sum_axis", [n["wg"]], (R(n["v"]),), axis=-2))
    _unchanged_layernorm("rows", h=lambda n: had(n["h"], R(n["x"]), R(n["g"], False, 2.0)))
    _unchanged_layernorm("t", dA=lambda n: Op("dlayernorm_stats", [n["dA"]], (R(n["A"]), R(n["u"]), R(n["m"]),
                                                                              R(n["r"]))))
    _unchanged_layernorm("t", stats=lambda n: Op("layernorm_stats", [n["x"], n["m"], n["r"]], (R(n["A"], False, 0.5),)),
                         dA=lambda n: Op("dlayernorm_stats", [n["dA"]], (R(n["A"], False, 0.5), R(n["u"], True),
                                                                         R(n["m"]), R(n["r"]))))
    # two backwards read the statistics: which one the kernel would do is not known
    _unchanged_layernorm("rows", extra=[lambda n: Op("dlayernorm_stats", [V()], (R(n["A"]), R(n["E"]), R(n["m"]),
                                                                                 R(n["r"])))])


def test_an_affine_layer_norm_whose_gradients_come_before_its_backward_stays():
    given, n, ops = _layernorm("rows")
    wb = ops.pop(6)
    ops.insert(5, wb)  # the bias's gradient before the input's adjoint
    assert ops[5].out is n["wb"] and ops[6].out is n["dA"]
    assert run(affine_layernorms, ops, {n["y"], n["dA"], n["wg"], n["wb"]}, given).ops == ops


def test_an_affine_layer_norm_whose_upstream_is_updated_in_place_stays():
    # the upstream G updated in place (add_into) before the gain's gradient is summed: the
    # gradients are not taken from G where the backward is
    given, n, ops = _layernorm("rows")
    Z, G2 = V(5, 4), V(5, 4, batched=True)
    ops.insert(8, Op("add_into", [G2], (R(n["E"]), R(Z))))
    kept = {n["y"], n["dA"], n["wg"], n["wb"], G2}
    assert run(affine_layernorms, ops, kept, given + (Z,)).ops == ops
    # after the last of them it may be
    ops.append(ops.pop(8))
    assert [op.kind for op in run(affine_layernorms, ops, kept, given + (Z,))][-1] == "add_into"


def test_an_affine_layer_norm_whose_gain_is_made_after_its_statistics_stays():
    given, n, ops = _layernorm("rows")
    g, source = n["g"], V(1, 4)
    ops.insert(1, Op("scale", [g], (R(source, False, 2.0),)))
    given = tuple(v for v in given if v is not g) + (source,)
    assert run(affine_layernorms, ops, {n["y"], n["dA"], n["wg"], n["wb"]}, given).ops == ops
    # made before them, it may be
    ops.insert(0, ops.pop(1))
    assert run(affine_layernorms, ops, {n["y"], n["dA"], n["wg"], n["wb"]}, given).ops[1].kind == "layernorm_affine"


def test_the_head_of_a_longer_sum_is_the_affine_layer_norm():
    given, n, ops = _layernorm("rows", s=None)  # the sum put back below, with a third term
    c, s = V(5, 4, batched=True), n["s"]
    ops.insert(2, add(s, R(n["h"]), R(n["b"]), R(c)))
    kept = {n["y"], n["dA"], n["wg"], n["wb"]}
    sweep = run(affine_layernorms, ops, kept, given + (c,))
    fwd, rest = sweep.ops[:2]
    assert fwd.kind == "layernorm_affine" and fwd.out is not s and rest.out is s
    assert rest.args == (R(fwd.out), R(c)) and rest.attrs["head"] == 1
    gen = torch.Generator().manual_seed(5)
    env = _layernorm_env(n, 3, gen)
    env[c] = randn(gen, 3, 5, 4)
    same(ops, sweep.ops, env, kept, 3)


# ---- a log-softmax's derivative from its forward --------------------------------------------------


def _logsoftmax(**change):
    Z, Y = V(5, 6, batched=True), V(5, 6, batched=True)
    L, p, r, h, d = V(5, 6, batched=True), V(5, 6, batched=True), V(5, 1, batched=True), V(5, 6, batched=True), \
        V(5, 6, batched=True)
    ops = {"L": Op("template", [L], (R(Z),), op="logsoftmax"), "p": Op("softmax", [p], (R(Z),)),
           "r": Op("sum_axis", [r], (R(Y),), axis=-1), "h": had(h, R(p), R(r)), "d": add(d, R(Y), R(h), signs=(1, -1))}
    names = dict(Z=Z, Y=Y, L=L, p=p, r=r, h=h, d=d)
    ops.update({k: f and f(names) for k, f in change.items()})
    return (Z, Y), names, [op for op in ops.values() if op is not None]


def test_a_log_softmax_derivative_is_the_fused_backward_from_its_forward():
    # Y - softmax(Z) o rowsum(Y) with logsoftmax(Z) computed: torch's log-softmax backward from it,
    # the Hadamard product's factors in either order
    for swap in (False, True):
        given, n, ops = _logsoftmax()
        if swap:
            ops[3] = had(n["h"], R(n["r"]), R(n["p"]))
        sweep = run(logsoftmax_backwards, ops, {n["L"], n["d"]}, given)
        assert [(op.kind, op.outs, op.args) for op in sweep] == [
            ("template", (n["L"],), (R(n["Z"]),)), ("dlogsoftmax_given", (n["d"],), (R(n["L"]), R(n["Y"])))]
        gen = torch.Generator().manual_seed(9)
        for lead in ((3,), ()):
            env = {n["Z"]: randn(gen, *lead, 5, 6), n["Y"]: torch.rand(*lead, 5, 6, generator=gen,
                                                                        dtype=torch.float64)}
            same(ops, sweep.ops, env, [n["d"]])


def test_a_log_softmax_derivative_in_another_form_stays():
    def same_ops(ops, kept, given):
        assert run(logsoftmax_backwards, ops, kept, given).ops == ops

    forms = [dict(L=None),  # no log-softmax of Z computed
             dict(L=lambda n: Op("template", [n["L"]], (R(n["Z"], True),), op="logsoftmax")),  # of another read
             dict(L=lambda n: Op("template", [n["L"]], (R(n["Y"]),), op="logsoftmax")),
             dict(r=lambda n: Op("sum_axis", [n["r"]], (R(n["Z"]),), axis=-1)),  # the row sum of another B
             dict(r=lambda n: Op("sum_axis", [n["r"]], (R(n["Y"]),), axis=-2)),
             dict(r=lambda n: Op("sum_axis", [n["r"]], (R(n["Y"]),), axis=-1, total=True)),
             dict(p=lambda n: Op("template", [n["p"]], (R(n["Z"]),), op="logsoftmax")),
             dict(d=lambda n: add(n["d"], R(n["Y"]), R(n["h"]))),  # a sum, not a difference
             dict(d=lambda n: add(n["d"], R(n["Y"]), R(n["h"], False, 2.0), signs=(1, -1))),
             dict(d=lambda n: add(n["d"], R(n["Y"], False, 2.0), R(n["h"]), signs=(1, -1))),
             dict(h=lambda n: had(n["h"], R(n["p"], False, 2.0), R(n["r"])))]
    for change in forms:
        given, n, ops = _logsoftmax(**change)
        same_ops(ops, {n["d"]} | ({n["L"]} if "L" not in change else set()), given)
    # the log-softmax after the difference
    given, n, ops = _logsoftmax()
    ops.append(ops.pop(0))
    same_ops(ops, {n["L"], n["d"]}, given)
    # a factor or the product read elsewhere, or kept
    for k in "prh":
        given, n, ops = _logsoftmax()
        same_ops(ops + [Op("scale", [V()], (R(n[k], False, 2.0),))], {n["L"], n["d"]}, given)
        same_ops(ops, {n["L"], n["d"], n[k]}, given)


def test_the_head_of_a_longer_difference_is_the_log_softmax_backward():
    c = V(5, 6, batched=True)
    given, n, ops = _logsoftmax(d=lambda n: add(n["d"], R(n["Y"]), R(n["h"]), R(c), signs=(1, -1, 1)))
    sweep = run(logsoftmax_backwards, ops, {n["L"], n["d"]}, given + (c,))
    _, back, rest = sweep.ops
    assert back.kind == "dlogsoftmax_given" and rest.args == (R(back.out), R(c)) and rest.out is n["d"]
    gen = torch.Generator().manual_seed(12)
    same(ops, sweep.ops, {n["Z"]: randn(gen, 3, 5, 6), n["Y"]: randn(gen, 3, 5, 6), c: randn(gen, 3, 5, 6)}, [n["d"]])


# ---- results as soon as their operands are known -----------------------------------------------------


def test_a_gradient_is_computed_as_soon_as_its_operands_are_known():
    # a result (read by nothing in the sweep, by the return) moves up to just after the op that
    # makes the last value it reads, so its operands can be freed there; past an update in place
    # of what it reads it does not move, nor does an update in place
    X, W, Vw = V(4, 3), V(3, 3), V(3, 3)
    a, b, c, a2, e, ga, gb = V(4, 3), V(4, 3), V(4, 3), V(4, 3), V(4, 1), V(3, 3), V(3, 3)
    ops = [Op("matmul", [a], (R(X), R(W))), Op("scale", [b], (R(a, False, 2.0),)), Op("matmul", [c], (R(b), R(Vw))),
           Op("add_into", [a2], (R(a), R(c))), Op("sum_axis", [e], (R(c),), axis=-1),
           Op("matmul", [ga], (R(X, True), R(b))), Op("matmul", [gb], (R(a2, True), R(X)))]
    sweep = run(early_results, ops, {ga, gb, e}, (X, W, Vw))
    assert [op.out for op in sweep] == [a, b, ga, c, e, a2, gb], sweep.ops
    rng = torch.Generator().manual_seed(13)
    same(ops, sweep.ops, {X: randn(rng, 4, 3), W: randn(rng, 3, 3), Vw: randn(rng, 3, 3)}, [ga, gb, e])
    # an update in place that is a result stays where it is (moved up it would pass b's reads of a)
    a3 = V(4, 3)
    ops = [ops[0], ops[1], Op("matmul", [c], (R(b), R(Vw))), Op("add_into", [a3], (R(a), R(W)))]
    assert run(early_results, ops, {c, a3}, (X, W, Vw)).ops == ops


def test_a_result_is_not_moved_into_the_prologue_nor_is_a_value_read_in_the_sweep():
    x, w, dn, a, ga, gs = V(4, 3), V(3, 3), V(scalar=True), V(4, 3), V(3, 3), V(4, 3)
    ops = [Op("input", [x], (), name="X"), Op("input", [w], (), name="W"), Op("dim", [dn], (R(x),), axis=0),
           Op("matmul", [a], (R(x), R(w))), Op("scale", [V(4, 3)], (R(a, False, 2.0),)),
           Op("matmul", [ga], (R(x, True), R(x)), total=True), Op("scale", [gs], (R(x, False, Dim(dn)),))]
    sweep = run(early_results, ops, {ga, gs, a}, ())
    assert [op.out for op in sweep] == [x, w, dn, ga, gs, a, ops[4].out], sweep.ops
    # a value read after the sweep that the sweep reads too is not a result: it stays
    p, k, z = V(4, 3), V(3, 3), V(3, 3)
    ops = [Op("scale", [p], (R(x, False, 2.0),)), Op("matmul", [k], (R(x, True), R(x))), Op("scale", [z], (R(k),))]
    assert run(early_results, ops, {p, k, z}, (x,)).ops == ops


def test_the_early_results_are_one_walk_over_a_deep_sweep():
    # a sweep of 20,000 layers each with its gradient at the end: every one moves, in one reorder
    X = V(4, 3)
    ops, grads = [], []
    last = X
    for _ in range(20000):
        nxt = V(4, 3)
        ops.append(Op("scale", [nxt], (R(last, False, 0.5),)))
        last = nxt
    for op in ops[::2]:
        g = V(3, 3)
        grads.append(Op("matmul", [g], (R(X, True), R(op.out))))
    kept = {op.out for op in grads} | {last}
    sweep = Sweep(ops + grads)
    early_results(sweep, kept)
    assert sweep.ops[1] is grads[0] and sweep.ops[-1] is ops[-1] and len(sweep) == len(ops) + len(grads)


# ---- a scatter added to a product: into it ----------------------------------------------------------


def _tied(total=False, transposed=True):
    """Y = P + S^t (or S): P = H^t G1 (d x v, an unembedding's gradient), S = scatter(ids, G2) (v x d,
    the embedding's); summed over the batch (``total``) or of one example."""
    ids = V(5, 7, batched=total)
    ids.ids = True
    H, G1, G2 = V(5, 3, batched=total), V(5, 7, batched=total), V(5, 3, batched=total)
    p, s_, y = V(3, 7), V(7, 3), V(3, 7)
    ops = [Op("matmul", [p], (R(H, True), R(G1)), **({"total": True} if total else {})),
           Op("scatter", [s_], (R(ids), R(G2)), vocab=7, **({"total": True} if total else {})),
           add(y, R(p), R(s_, transposed)) if transposed else add(y, R(s_), R(p))]
    if not transposed:
        y.shape = p.shape = (7, 3)
        ops[0] = Op("matmul", [p], (R(G1, True), R(H)), **({"total": True} if total else {}))
    return (ids, H, G1, G2), (p, s_, y), ops


def _tied_env(given, total, gen):
    ids, H, G1, G2 = given
    lead = (2,) if total else ()
    return {ids: torch.randint(0, 7, (*lead, 5), generator=gen), H: randn(gen, *lead, 5, 3),
            G1: randn(gen, *lead, 5, 7), G2: randn(gen, *lead, 5, 3)}


@pytest.mark.parametrize("total", [False, True])
@pytest.mark.parametrize("transposed", [True, False])
def test_a_scatter_added_to_a_product_goes_into_it(total, transposed):
    # the tied embedding's gradient: its unembedding's product and its lookup's scatter, one array
    given, (p, s_, y), ops = _tied(total, transposed)
    ids, H, G1, G2 = given
    sweep = run(scattered_into, ops, {y}, given)
    assert [op.kind for op in sweep] == ["matmul", "scatter_into"], sweep.ops
    into = sweep.ops[1]
    assert into.outs == (y,) and into.args == (R(p), R(ids), R(G2)) and into.attrs["t"] is transposed
    assert into.attrs["vocab"] == 7 and bool(into.attrs.get("total")) is total
    gen = torch.Generator().manual_seed(3)
    same(ops, sweep.ops, _tied_env(given, total, gen), [y], nb=2 if total else 0)


@pytest.mark.parametrize("case", ["product read again", "scatter read again", "kept", "scaled after", "updated",
                                  "totals differ"])
def test_a_scatter_that_cannot_go_into_its_product_stays(case):
    given, (p, s_, y), ops = _tied(True)
    ids, H, G1, G2 = given
    kept = {y}
    if case in ("product read again", "scatter read again"):
        w = V(3, 7) if case == "product read again" else V(7, 3)
        ops = ops + [Op("scale", [w], (R(p if case == "product read again" else s_, False, 2.0),))]
        kept.add(w)
    elif case == "kept":
        kept.add(p)
    elif case == "scaled after":
        ops[0].attrs["out_scale"] = (0.5,)
    elif case == "updated":  # G2 written into between the scatter and the sum
        g3 = V(5, 3, batched=True)
        ops.insert(2, Op("add_into", [g3], (R(G2), R(H))))
    elif case == "totals differ":
        ops[0].attrs.pop("total")
    before = [op.kind for op in ops]
    assert [op.kind for op in run(scattered_into, ops, kept, given)] == before


# ---- a gradient made in its weight's layout ----------------------------------------------------------


@pytest.mark.parametrize("scatter", [False, True])
def test_a_gradient_handed_out_transposed_is_made_the_other_way_round(scatter):
    from fdsl.codegen.kernels import returned_as_stored
    from fdsl.codegen.products import _Ref

    given, (p, s_, y), ops = _tied(total=True)
    ids, H, G1, G2 = given
    if scatter:  # E's gradient: (H^t G1 + scatter(ids, G2)^t)^t, the scatter into the product
        sweep = run(scattered_into, ops, {y}, given)
        out = y
    else:  # a product alone: (H^t G1)^t
        sweep = Sweep(ops[:1])
        out = p
    before = list(sweep.ops)
    results = returned_as_stored(sweep, {"E": ("plain", _Ref(out, True), True)})
    ir.check(sweep, given)
    how, ref, summed = results["E"]
    assert how == "plain" and summed and not ref.flip and ref.var.shape == (7, 3), results
    product = next(op for op in sweep.ops if op.kind == "matmul")
    assert product.args == (R(G1, True), R(H)) and product.out.shape == (7, 3), sweep.ops
    if scatter:
        assert sweep.ops[-1].kind == "scatter_into" and sweep.ops[-1].attrs["t"] is False
    gen = torch.Generator().manual_seed(5)
    env = _tied_env(given, True, gen)
    want, got = values(before, env, 2)[out].mT, values(sweep.ops, env, 2)[ref.var]
    assert got.is_contiguous() and torch.allclose(got, want, atol=1e-12)


def test_a_gradient_read_elsewhere_or_handed_out_as_it_is_stays():
    from fdsl.codegen.kernels import returned_as_stored
    from fdsl.codegen.products import _Ref

    given, (p, s_, y), ops = _tied(total=True)
    w = V(3, 7)
    sweep = Sweep(ops[:1] + [Op("scale", [w], (R(p, False, 2.0),))])
    before = list(sweep.ops)
    results = {"E": ("plain", _Ref(p, True), True), "F": ("plain", _Ref(w), True)}
    assert returned_as_stored(sweep, dict(results)) == results and sweep.ops == before
    sweep = Sweep(ops[:1])
    results = {"E": ("plain", _Ref(p), True)}
    assert returned_as_stored(sweep, dict(results)) == results and sweep.ops == ops[:1]


def test_a_layer_norm_times_a_matrix_is_not_the_gain_kernel():
    # layernorm(A) o W with W a matrix (not a row of gains): no fused kernel takes it, with a bias
    # row or without
    for change in ({"s": lambda n: None, "wb": None}, {}):
        given, n, ops = _layernorm("rows", **change)
        W2 = V(5, 4)
        ops = [had(op.out, R(n["x"]), R(W2)) if op.kind == "template" and op.out is n["h"] else op for op in ops]
        ops = [had(op.out, R(n["E"]), R(W2)) if op.kind == "template" and op.out is n["u"] else op for op in ops]
        if "s" in change:
            ops = [Op("matmul", [n["y"]], (R(n["h"]), R(n["W"]))) if op.out is n["y"] else op for op in ops]
        kept = {n["y"], n["dA"], n["wg"]} | ({n["wb"]} if not change else set())
        assert run(affine_layernorms, ops, kept, given + (W2,)).ops == ops
