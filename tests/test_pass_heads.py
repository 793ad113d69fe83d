"""The heads passes (fdsl.codegen.heads) on hand-built IR: which ops they make, where they must
not fire, the checker after every pass, and the rewritten sweep against the original one, run
op by op on the torch runtime's helpers (a batch and one example)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fdsl.codegen import torch_runtime as rt  # noqa: E402
from fdsl.codegen.heads import grouped_kinds, side_by_side, stacked_heads  # noqa: E402
from fdsl.codegen.ir import KINDS, Dim, Op, Read, Sweep, Value, check  # noqa: E402

# ---- running a sweep ---------------------------------------------------------------------------------


def _scalar(x, env):
    if isinstance(x, Value):
        return env[x]
    if isinstance(x, Dim):
        return float(env[x.size] if isinstance(x.size, Value) else x.size)
    return x


def _read(r, env, op=None):
    if not isinstance(r, Read):
        return _scalar(r, env)
    x = env[r.value]
    if op is not None and r.value in op.attrs.get("unsqueeze", ()):
        x = x.unsqueeze(-3)
    if r.t:
        x = x.mT
    for c in r.scale:
        x = _scalar(c, env) * x
    return x


def _product(xs):
    out = 1.0
    for x in xs:
        out = out * x
    return out


def _run(sweep: Sweep, env: dict) -> dict:
    """Every value of the sweep, from ``env`` (the given values; ``"nb"``: the batch, 0 for none)."""
    env = dict(env)
    nb = env["nb"]
    for op in sweep.ops:
        a = [_read(x, env, op) for x in op.args]
        k, at = op.kind, op.attrs
        if k == "matmul":
            out = rt._matmul_total(a[0], a[1], nb) if at.get("total") else (
                rt._bmm(a[0], a[1]) if at.get("bmm") else a[0] @ a[1])
        elif k == "softmax":
            out = rt._softmax(a[0])
        elif k == "aa_given":
            out = rt._aa_given(a[0], a[1])
        elif k == "mask":
            out = a[0] > 0
        elif k == "masked":
            out = a[0] * a[1]
        elif k == "template":
            assert at["op"] == "had"
            out = a[0] * a[1]
        elif k == "sum":
            out = sum(s * x for s, x in zip(at["signs"], a))
        elif k == "scale":
            out = a[0]
        elif k == "scalar_op":
            out = a[0] * a[1] if at["op"] == "mul" else a[0] + a[1]
        elif k == "stack":
            out = torch.stack(a, -3)
        elif k == "unbind":
            out = a[0].unbind(-3)
        elif k == "grouped":
            if at["side"] == "cols":
                out = rt._grouped_total(a[0], a[1:], nb) if at["total"] else rt._grouped(a[0], a[1:])
            else:
                out = rt._grouped_total_rows(a[:-1], a[-1], nb) if at["total"] else rt._grouped_rows(a[:-1], a[-1])
        elif k == "grouped_heads":
            out = rt._grouped_heads(a[0], a[1:], at["h"])
        elif k == "sum_of_products":
            out = rt._sum_of_products(a[:at["n"]], a[at["n"]:])
        elif k == "cat_matmul":
            out = a[0] @ rt._cat(a[1:], -2)
        elif k == "split_total":
            out = rt._split_total(a[0], a[1], nb, at["n"], at["axis"])
        elif k == "side_by_side":  # each stack scaled by the runtime as it is copied in
            scales = [_product([_scalar(c, env) for c in x.scale]) if x.scale else None for x in op.args]
            out = rt._side_by_side([_read(x._replace(scale=()), env, op) for x in op.args], scales)
        elif k == "sum_axis":
            assert at.get("total")
            out = rt._sum_total(a[0], at["axis"], nb)
            out = out.mT if at.get("view_t") else out
            for c in at.get("out_scale", ()):
                out = _scalar(c, env) * out
        elif k == "split":
            out = a[0].chunk(at["n"], at["axis"])
        else:
            raise AssertionError(k)
        outs = tuple(out) if KINDS[k].multi else (out,)
        assert len(outs) == len(op.outs), op
        env.update(zip(op.outs, outs))
    return env


def _same(before: Sweep, after: Sweep, given: dict, results, batch=3, seed=0):
    """The two sweeps agree on ``results`` for random ``given`` values (Value -> shape of one
    example; batched ones get a batch axis), with a batch and without."""
    gen = torch.Generator().manual_seed(seed)
    for nb in (batch, 0):
        env = {"nb": nb}
        for v, shape in given.items():
            lead = (nb,) if nb and v.batched else ()
            env[v] = torch.randn(*lead, *shape, generator=gen, dtype=torch.float64) if shape else 0.75
        want, got = _run(before, env), _run(after, env)
        for r in results:
            assert want[r].shape == got[r].shape, (nb, r)
            assert torch.allclose(want[r], got[r], atol=1e-12), (nb, r)


def _copy(sweep: Sweep) -> Sweep:
    return Sweep(Op(op.kind, op.outs, op.args, **op.attrs) for op in sweep.ops)


def _kinds(sweep: Sweep) -> list:
    return [op.kind for op in sweep.ops]


def V(name, shape=(4, 2), batched=False, **kw):
    return Value(shape=shape, batched=batched, hint=name, **kw)


# ---- stacked_heads -------------------------------------------------------------------------------------


def _attention(h=2, scale=(0.5,), batched_mask=False, mask_shape=(5, 5)):
    """h heads, each: scores = (scale * q_j) k_j^t (+ M); p = softmax; o = p v_j; then G = sum of
    the o_j (read after the heads). The given values and their shapes."""
    given, ops, outs = {}, [], []
    M = V("M", mask_shape, batched=batched_mask) if mask_shape else None
    if M is not None:
        given[M] = mask_shape
    heads = []
    for j in range(h):
        q, k, v = (V("%s%d" % (n, j), (5, 2), batched=True) for n in "qkv")
        given.update({q: (5, 2), k: (5, 2), v: (5, 2)})
        heads.append((q, k, v))
    for j, (q, k, v) in enumerate(heads):
        s, p, o = V("s%d" % j, (5, 5), True), V("p%d" % j, (5, 5), True), V("o%d" % j, (5, 2), True)
        ops.append(Op("matmul", [s], [Read(q, scale=scale), Read(k, True)], bmm=True))
        if M is not None:
            s2 = V("m%d" % j, (5, 5), True)
            ops.append(Op("sum", [s2], [Read(s), Read(M)], signs=(1, 1), head=2))
            s = s2
        ops += [Op("softmax", [p], [Read(s)]), Op("matmul", [o], [Read(p), Read(v)], bmm=True)]
        outs.append(o)
    G = V("G", (5, 2), True)
    ops.append(Op("sum", [G], [Read(o) for o in outs], signs=(1,) * h, head=2))
    return Sweep(ops), given, heads, outs, G


def _mask_of(given):
    return next(v for v in given if v.hint == "M")


def test_alike_heads_are_one_chain_on_stacks():
    sweep, given, heads, outs, G = _attention(h=3)
    before = _copy(sweep)
    stacked_heads(sweep, {G})
    check(sweep, given=given)
    assert _kinds(sweep) == ["stack"] * 3 + ["matmul", "sum", "softmax", "matmul", "unbind", "sum"], sweep.ops
    q_h, k_h = sweep.ops[0].out, sweep.ops[1].out
    assert [a.value for a in sweep.ops[0].args] == [q for q, _, _ in heads] and q_h.heads == 3
    assert q_h.hint is heads[0][0] and q_h.suffix == "_h" and q_h.shape == (5, 2) and q_h.batched
    scores = sweep.ops[3]
    assert scores.args == (Read(q_h, scale=(0.5,)), Read(k_h, True)) and scores.attrs == {"bmm": True}
    assert scores.out.heads == 3 and scores.out.hint.hint == "s0" and scores.out.suffix == "_h"
    # the mask, shared and without a batch axis, is read as it is
    assert sweep.ops[4].args[1] == Read(_mask_of(given)) and "unsqueeze" not in sweep.ops[4].attrs
    assert sweep.ops[7].outs == tuple(outs)  # the results, read after the run, are views of the stack
    _same(before, sweep, given, [G])


def test_a_shared_operand_with_a_batch_axis_is_read_with_a_head_axis_of_one():
    sweep, given, _, _, G = _attention(batched_mask=True)
    before = _copy(sweep)
    stacked_heads(sweep, {G})
    check(sweep, given=given)
    add = next(op for op in sweep.ops if op.kind == "sum" and op.out.heads)
    M = _mask_of(given)
    assert add.attrs["unsqueeze"] == (M,) and add.args[1] == Read(M), add
    _same(before, sweep, given, [G])


@pytest.mark.parametrize("scale", ["given", "temperature", "dim"])
def test_a_scale_that_is_an_operand_stacks_as_a_literal_does(scale):
    # the point of the issue: a scale given with the data, or a learned temperature tau_i * s
    # computed once per block and read by every head, or a dim's size, is an operand like 0.125
    s, tau, prod, n = (Value(scalar=True, hint=x) for x in ("s", "tau", "tau_s", "n"))
    factor = {"given": (s,), "temperature": (prod,), "dim": (Dim(n),)}[scale]
    sweep, given, _, _, G = _attention(scale=factor, mask_shape=None)
    ops = [Op("scalar_op", [prod], [tau, s], op="mul")] if scale == "temperature" else []
    sweep = Sweep(ops + sweep.ops)
    given.update({s: (), tau: (), n: ()})
    before = _copy(sweep)
    stacked_heads(sweep, {G})
    check(sweep, given=given)
    scores = next(op for op in sweep.ops if op.kind == "matmul")
    assert scores.out.heads == 2 and scores.args[0].scale == factor, sweep.ops
    assert sum(op.kind == "matmul" for op in sweep.ops) == 2
    _same(before, sweep, given, [G])


def test_heads_scaled_by_different_scales_are_not_stacked():
    s0, s1 = Value(scalar=True, hint="s0"), Value(scalar=True, hint="s1")
    sweep, given, _, _, G = _attention(scale=(s0,), mask_shape=None)
    second = next(op for op in sweep.ops if op.kind == "matmul" and op.out.hint == "s1")
    q1, k1 = second.args[0].value, second.args[1]
    sweep.rewrite({second: [Op("matmul", second.outs, [Read(q1, scale=(s1,)), k1], bmm=True)]})
    kinds = _kinds(sweep)
    stacked_heads(sweep, {G})
    check(sweep, given={**given, s0: (), s1: ()})
    assert _kinds(sweep) == kinds and "stack" not in kinds


def _two_heads(first, second, given):
    """A sweep of the chains ``first`` and ``second`` (ops), then a sum of their last results."""
    G = V("G", first[-1].out.shape, first[-1].out.batched)
    return Sweep(first + second + [Op("sum", [G], [Read(first[-1].out), Read(second[-1].out)], signs=(1, 1),
                                      head=2)]), G


def _not_stacked(first, second, given):
    """Two chains that must stay as they are."""
    sweep, G = _two_heads(first, second, given)
    kinds = _kinds(sweep)
    stacked_heads(sweep, {G})
    check(sweep, given=given)
    assert _kinds(sweep) == kinds, sweep.ops


def _head(j, a, b, bmm=True, kind="softmax"):
    s, p, o = V("s%d" % j, (5, 5), True), V("p%d" % j, (5, 5), True), V("o%d" % j, (5, 2), True)
    return [Op("matmul", [s], [Read(a), Read(b, True)], bmm=bmm), Op(kind, [p], [Read(s)]),
            Op("matmul", [o], [Read(p), Read(b)], bmm=bmm)]


def _operands(n=2, shape=(5, 2), batched=True):
    return [V("x%d" % j, shape, batched) for j in range(n)], [V("y%d" % j, shape, batched) for j in range(n)]


def test_a_chain_of_the_other_stackable_kinds_is_stacked():
    # Hadamard products, scalings, a mask and a masked product, on the last two axes alike
    (x0, x1), (y0, y1) = _operands()
    chains = []
    for j, (x, y) in enumerate(((x0, y0), (x1, y1))):
        s, t, u, m, w, o = (V("%s%d" % (n, j), (5, 5), True) for n in "stumwo")
        o = V("o%d" % j, (5, 2), True)
        chains.append([Op("matmul", [s], [Read(x), Read(y, True)], bmm=True),
                       Op("template", [t], [Read(s), Read(s, True)], op="had", data=None),
                       Op("scale", [u], [Read(t, scale=(-0.5,))]), Op("mask", [m], [Read(u)]),
                       Op("masked", [w], [Read(m), Read(s)]), Op("matmul", [o], [Read(w), Read(y)], bmm=True)])
    sweep, G = _two_heads(chains[0], chains[1], [x0, x1, y0, y1])
    before = _copy(sweep)
    stacked_heads(sweep, {G})
    check(sweep, given=[x0, x1, y0, y1])
    assert _kinds(sweep) == ["stack", "stack", "matmul", "template", "scale", "mask", "masked", "matmul", "unbind",
                             "sum"], sweep.ops
    assert sweep.ops[3].args[1].t and sweep.ops[4].args[0].scale == (-0.5,)
    _same(before, sweep, {v: (5, 2) for v in (x0, x1, y0, y1)}, [G])


def test_chains_that_are_not_alike_are_left_as_they_are():
    (x0, x1), (y0, y1) = _operands()
    given = {x0: (5, 2), x1: (5, 2), y0: (5, 2), y1: (5, 2)}
    cases = {
        "bmm in one head only": (_head(0, x0, y0), _head(1, x1, y1, bmm=False)),
        "an operator that is not stacked": (_head(0, x0, y0, kind="mask"), _head(1, x1, y1, kind="softmax")),
    }
    # a product summed over the batch, an operator not on the last two axes alike (or not known to)
    total = (_head(0, x0, y0), _head(1, x1, y1))
    for chain in total:
        chain[0] = Op("matmul", chain[0].outs, chain[0].args, total=True)
    cases["a product summed over the batch"] = total
    gelu = (_head(0, x0, y0), _head(1, x1, y1))
    for chain in gelu:
        chain[1] = Op("template", chain[1].outs, chain[1].args, op="gelu", data=None)
    cases["a template other than the Hadamard product's"] = gelu
    # operands of different shapes, or batching, or of a shape not known
    x1w, y1w = V("x1w", (5, 3), True), V("y1w", (5, 3), True)
    cases["operands of different shapes"] = (_head(0, x0, y0), _head(1, x1w, y1w))
    x1b = V("x1b", (5, 2), False)
    cases["operands of different batching"] = (_head(0, x0, y0), _head(1, x1b, y1))
    u0, u1 = V("u0", None, True), V("u1", None, True)
    cases["operands of unknown shapes"] = (_head(0, u0, y0), _head(1, u1, y1))
    for what, (first, second) in cases.items():
        _not_stacked(first, second, [*given, x1w, y1w, x1b, u0, u1])


def test_one_head_reading_another_heads_value_is_not_stacked():
    (x0, x1), (y0, y1) = _operands()
    given = [x0, x1, y0, y1]
    first = _head(0, x0, y0)
    # head 1 multiplies by head 0's probabilities, made within the run
    second = _head(1, x1, y1)
    p0 = first[1].out
    second[2] = Op("matmul", second[2].outs, [Read(p0), Read(y1)], bmm=True)
    _not_stacked(first, second, given)
    # head 1 reads head 0's result where head 0 reads an operand made before the run: a per-head
    # operand made within the run
    first = _head(0, x0, y0)
    third = _head(1, x1, y1)
    third[0] = Op("matmul", third[0].outs, [Read(first[2].out), Read(y1, True)], bmm=True)
    _not_stacked(first, third, given)


def test_heads_whose_results_are_read_at_other_places_in_their_chains_are_not_stacked():
    # head 0 multiplies its scores by its probabilities, head 1 the other way round
    (x0, x1), (y0, y1) = _operands()
    chains = []
    for j, (x, y) in enumerate(((x0, y0), (x1, y1))):
        s, p, o = V("s%d" % j, (5, 5), True), V("p%d" % j, (5, 5), True), V("o%d" % j, (5, 5), True)
        pair = [Read(s), Read(p)] if j == 0 else [Read(p), Read(s)]
        chains.append([Op("matmul", [s], [Read(x), Read(y, True)], bmm=True), Op("softmax", [p], [Read(s)]),
                       Op("matmul", [o], pair, bmm=True)])
    _not_stacked(chains[0], chains[1], [x0, x1, y0, y1])


def test_a_shared_operand_that_is_a_stack_is_not_stacked_again():
    (x0, x1), _ = _operands()
    T = Value(shape=(5, 2), batched=True, heads=2, hint="T")
    first, second = _head(0, x0, T), _head(1, x1, T)
    _not_stacked(first, second, [x0, x1, T])


def test_a_chain_without_a_product_is_not_stacked():
    (x0, x1), _ = _operands(shape=(5, 5))
    p0, p1, g = V("p0", (5, 5), True), V("p1", (5, 5), True), V("g", (5, 5), True)
    sweep = Sweep([Op("softmax", [p0], [Read(x0)]), Op("softmax", [p1], [Read(x1)]),
                   Op("sum", [g], [Read(p0), Read(p1)], signs=(1, 1), head=2)])
    stacked_heads(sweep, {g})
    assert _kinds(sweep) == ["softmax", "softmax", "sum"]


def test_an_update_in_place_in_a_chain_stops_it():
    (x0, x1), (y0, y1) = _operands()
    given = [x0, x1, y0, y1]
    first, second = _head(0, x0, y0), _head(1, x1, y1)
    for chain in (first, second):  # scores += M, in place, in each chain
        s, z = chain[0].out, V("z" + chain[0].out.hint, (5, 5), True)
        chain.insert(1, Op("add_into", [z], [Read(s), Read(given[0])]))
        chain[2] = Op("softmax", chain[2].outs, [Read(z)])
    _not_stacked(first, second, given)


def test_a_run_reads_the_stack_an_earlier_run_made_and_its_unread_views_go():
    # the forward's probabilities, stacked, are read again by the backward's run: it reads the
    # stack, and the views of it that nothing else reads are not made
    (x0, x1), (y0, y1) = _operands()
    e0, e1 = V("e0", (5, 2), True), V("e1", (5, 2), True)
    given = {x0: (5, 2), x1: (5, 2), y0: (5, 2), y1: (5, 2), e0: (5, 2), e1: (5, 2)}
    fwd = [_head(0, x0, y0), _head(1, x1, y1)]
    ops = fwd[0] + fwd[1]
    back = []
    for j, (chain, e) in enumerate(zip(fwd, (e0, e1))):
        p = chain[1].out
        d, a = V("d%d" % j, (5, 5), True), V("a%d" % j, (5, 5), True)
        back.append([Op("matmul", [d], [Read(e), Read(y0 if j == 0 else y1, True)], bmm=True),
                     Op("aa_given", [a], [Read(p), Read(d)])])
    ops += back[0] + back[1]
    G = V("G", (5, 2), True)
    A = V("A", (5, 5), True)
    ops.append(Op("sum", [G], [Read(fwd[0][-1].out), Read(fwd[1][-1].out)], signs=(1, 1), head=2))
    ops.append(Op("sum", [A], [Read(back[0][-1].out), Read(back[1][-1].out)], signs=(1, 1), head=2))
    sweep = Sweep(ops)
    before = _copy(sweep)
    stacked_heads(sweep, {G, A})
    check(sweep, given=given)
    assert _kinds(sweep) == ["stack", "stack", "matmul", "softmax", "matmul", "unbind",
                             "stack", "matmul", "aa_given", "unbind", "sum", "sum"], sweep.ops
    p_h = sweep.ops[3].out
    aa = sweep.ops[8]
    assert aa.args[0] == Read(p_h), aa  # the forward's stack, not a stack of its views
    assert sweep.ops[1].out is sweep.ops[7].args[1].value  # the stack of y0, y1 made once, read twice
    assert not any(op.kind == "unbind" and p_h in op.values_read() for op in sweep.ops)
    _same(before, sweep, given, [G, A])
    # the views of the probabilities kept where something else reads them (here: the result)
    sweep = _copy(before)
    stacked_heads(sweep, {G, A, fwd[0][1].out})
    check(sweep, given=given)
    assert sum(op.kind == "unbind" for op in sweep.ops) == 3


def test_heads_in_the_order_of_a_stack_made_before():
    # the second run's heads come in the other order: it follows the stack of (y0, y1) made before
    (x0, x1), (y0, y1) = _operands()
    z0, z1 = V("z0", (5, 2), True), V("z1", (5, 2), True)
    given = {v: (5, 2) for v in (x0, x1, y0, y1, z0, z1)}
    first = _head(0, x0, y0) + _head(1, x1, y1)
    second = _head(2, z1, y1) + _head(3, z0, y0)
    G, F = V("G", (5, 2), True), V("F", (5, 2), True)
    # (a sum between the runs: else the four heads are alike, two chains of two heads)
    between = Op("sum", [F], [Read(first[2].out), Read(first[5].out)], signs=(1, 1), head=2)
    outs = [F, second[2].out, second[5].out]
    sweep = Sweep(first + [between] + second + [Op("sum", [G], [Read(o) for o in outs], signs=(1,) * 3, head=2)])
    before = _copy(sweep)
    stacked_heads(sweep, {G})
    check(sweep, given=given)
    stacks = [op for op in sweep.ops if op.kind == "stack"]
    assert [[a.value for a in op.args] for op in stacks] == [[x0, x1], [y0, y1], [z0, z1]]
    unbinds = [op for op in sweep.ops if op.kind == "unbind"]
    assert unbinds[1].outs == (second[5].out, second[2].out)
    _same(before, sweep, given, [G])


def test_the_longest_run_is_stacked():
    # each head is one product then a softmax: stacked as runs of h = 2 chains of 2 ops, not of
    # 2 ops of 1 (the product alone)
    (x0, x1), (y0, y1) = _operands()
    ops = []
    for j, (x, y) in enumerate(((x0, y0), (x1, y1))):
        s, p = V("s%d" % j, (5, 5), True), V("p%d" % j, (5, 5), True)
        ops += [Op("matmul", [s], [Read(x), Read(y, True)], bmm=True), Op("softmax", [p], [Read(s)])]
    G = V("G", (5, 5), True)
    sweep = Sweep(ops + [Op("sum", [G], [Read(ops[1].out), Read(ops[3].out)], signs=(1, 1), head=2)])
    stacked_heads(sweep, {G})
    check(sweep, given=[x0, x1, y0, y1])
    assert _kinds(sweep) == ["stack", "stack", "matmul", "softmax", "unbind", "sum"]


def test_nothing_to_stack_leaves_the_sweep_alone():
    x, y, z = V("x", (5, 2)), V("y", (2, 5)), V("z", (5, 5))
    sweep = Sweep([Op("matmul", [z], [Read(x), Read(y)])])
    ops = list(sweep.ops)
    stacked_heads(sweep, {z})
    assert sweep.ops == ops


# ---- grouped_kinds -------------------------------------------------------------------------------------


def _grouped_qkv(widths=(2, 2, 2, 2, 2, 2), extra=False):
    S = V("S", (5, 4), True)
    names = ("Q0", "K0", "V0", "Q1", "K1", "V1")
    W = {n: V(n, (4, w) if w else None) for n, w in zip(names, widths)}
    a = [V("a%d" % k, (5, w), True) for k, w in enumerate(widths, 1)]
    q, k, v = (Value(shape=(5, 2), batched=True, heads=2, hint=n) for n in "qkv")
    s, r = V("s", (5, 5), True), V("r", (5, 2), True)
    ops = [Op("grouped", a, [Read(S)] + [Read(W[n]) for n in names], side="cols", total=False),
           Op("stack", [q], [Read(a[0]), Read(a[3])]), Op("stack", [k], [Read(a[1]), Read(a[4])]),
           Op("stack", [v], [Read(a[5]), Read(a[2])]),  # heads in another order
           Op("matmul", [s], [Read(q), Read(k, True)], bmm=True), Op("matmul", [r], [Read(s), Read(v)], bmm=True)]
    if extra:
        z = V("z", (5, 2), True)
        ops.append(Op("scale", [z], [Read(a[0], scale=(2.0,))]))
    given = {S: (5, 4), **{w: (4, 2) for w in W.values()}}
    return Sweep(ops), given, W, (q, k, v), r


def test_the_grouped_heads_product_gives_its_kinds_as_views():
    sweep, given, W, (q, k, v), r = _grouped_qkv()
    before = _copy(sweep)
    grouped_kinds(sweep, {r})
    check(sweep, given=given)
    assert _kinds(sweep) == ["grouped_heads", "matmul", "matmul"], sweep.ops
    op = sweep.ops[0]
    assert op.outs == (q, k, v) and op.attrs == {"h": 2}
    assert [a.value for a in op.args[1:]] == [W[n] for n in ("Q0", "Q1", "K0", "K1", "V1", "V0")]
    _same(before, sweep, given, [r])


def test_grouped_kinds_left_as_they_are():
    # values of another width than queries and keys, widths not known, a slice read by anything
    # but a stack, an out read after the sweep
    for what, (sweep, given, _, _, r), kept in [
            ("wider values", _grouped_qkv(widths=(2, 2, 3, 2, 2, 3)), set()),
            ("unknown widths", _grouped_qkv(widths=(None,) * 6), set()),
            ("a slice read elsewhere", _grouped_qkv(extra=True), set()),
            ("kept", _grouped_qkv(), None)]:
        kept = kept if kept is not None else {sweep.ops[0].outs[0]}
        kinds = _kinds(sweep)
        grouped_kinds(sweep, kept | {r})
        assert _kinds(sweep) == kinds, what
    # a grouped product summed over the batch, or grouped by rows, or a stack of a transposed slice
    sweep, given, _, _, r = _grouped_qkv()
    grouped = sweep.ops[0]
    sweep.rewrite({grouped: [Op("grouped", grouped.outs, grouped.args, side="cols", total=True)]})
    grouped_kinds(sweep, {r})
    assert sweep.ops[0].kind == "grouped"
    sweep, given, _, _, r = _grouped_qkv()
    stack = sweep.ops[1]
    sweep.rewrite({stack: [Op("stack", stack.outs, [stack.args[0].T(), stack.args[1]])]})
    grouped_kinds(sweep, {r})
    assert sweep.ops[0].kind == "grouped"


def test_a_grouped_product_read_by_anything_but_stacks_is_left_as_it_is():
    S, B0, B1 = V("S", (5, 4), True), V("B0", (4, 2)), V("B1", (4, 2))
    a0, a1, z = V("a0", (5, 2), True), V("a1", (5, 2), True), V("z", (5, 2), True)
    sweep = Sweep([Op("grouped", [a0, a1], [Read(S), Read(B0), Read(B1)], side="cols", total=False),
                   Op("sum", [z], [Read(a0), Read(a1)], signs=(1, 1), head=2)])
    grouped_kinds(sweep, {z})
    check(sweep, given=[S, B0, B1])
    assert _kinds(sweep) == ["grouped", "sum"]


def test_one_kind_of_heads_is_a_grouped_heads_product_too():
    # the backward's G O^t: one grouped product read by one stack
    G, O0, O1 = V("G", (5, 4), True), V("O0", (2, 4)), V("O1", (2, 4))
    a0, a1 = V("a0", (5, 2), True), V("a1", (5, 2), True)
    d = Value(shape=(5, 2), batched=True, heads=2, hint="d")
    e = V("e", (5, 5), True)
    sweep = Sweep([Op("grouped", [a0, a1], [Read(G), Read(O0, True), Read(O1, True)], side="cols", total=False),
                   Op("stack", [d], [Read(a0), Read(a1)]), Op("matmul", [e], [Read(d), Read(d, True)], bmm=True)])
    before = _copy(sweep)
    grouped_kinds(sweep, {e})
    check(sweep, given=[G, O0, O1])
    assert _kinds(sweep) == ["grouped_heads", "matmul"] and sweep.ops[0].outs == (d,)
    _same(before, sweep, {G: (5, 4), O0: (2, 4), O1: (2, 4)}, [e])


# ---- side_by_side --------------------------------------------------------------------------------------


def _heads_sweep(scale=(0.5,), widths=(4, 4), updated=False, read_elsewhere=False):
    """Two stacks X_h (a, b) and Y_h (c, e); a_s, b_s the heads of X_h scaled; a weight's
    gradients (grouped, total, by columns and by rows) and an adjoint (a sum of products) of them."""
    X_h = Value(shape=(5, widths[0]), batched=True, heads=2, hint="X_h")
    Y_h = Value(shape=(5, widths[1]), batched=True, heads=2, hint="Y_h")
    a, b = V("a", (5, widths[0]), True), V("b", (5, widths[0]), True)
    c, e = V("c", (5, widths[1]), True), V("e", (5, widths[1]), True)
    a_s, b_s = V("a_s", (5, widths[0]), True), V("b_s", (5, widths[0]), True)
    S, H = V("S", (5, 6), True), V("H", (5, 7), True)
    P = [V("P1", (widths[1], 3)), V("P2", (widths[0], 3)), V("P3", (widths[1], 3)), V("P4", (widths[0], 3))]
    g = [V("g%d" % k, (6, w), True) for k, w in enumerate((widths[0], widths[0], widths[1], widths[1]), 1)]
    G, r1, r2 = V("G", (5, 3), True), V("r1", (widths[1], 7)), V("r2", (widths[1], 7))
    ops = [Op("unbind", [a, b], [Read(X_h)]), Op("unbind", [c, e], [Read(Y_h)]),
           Op("scale", [a_s], [Read(a, scale=scale)]), Op("scale", [b_s], [Read(b, scale=scale)]),
           Op("grouped", g, [Read(S, True), Read(a_s), Read(b_s), Read(c), Read(e)], side="cols", total=True),
           Op("sum_of_products", [G], [Read(c), Read(a_s), Read(e), Read(b_s)] + [Read(p) for p in P], n=4),
           Op("grouped", [r1, r2], [Read(c, True), Read(e, True), Read(H)], side="rows", total=True)]
    if updated:  # Y_h updated in place after its heads are read
        Z = Value(shape=(5, widths[1]), batched=True, heads=2, hint="Z")
        ops.append(Op("add_into", [Value(shape=Z.shape, batched=True, heads=2, hint="Y2")], [Read(Y_h), Read(Z)]))
    if read_elsewhere:
        z = V("z", (5, widths[0]), True)
        ops.append(Op("sum", [z], [Read(a), Read(a_s)], signs=(1, 1), head=2))
    given = {X_h: (2, 5, widths[0]), Y_h: (2, 5, widths[1]), S: (5, 6), H: (5, 7), **{p: p.shape for p in P}}
    if updated:
        given[Z] = (2, 5, widths[1])
    kept = set(g) | {G, r1, r2}
    return Sweep(ops), given, kept


def test_the_heads_of_stacks_are_read_side_by_side():
    sweep, given, kept = _heads_sweep()
    before = _copy(sweep)
    side_by_side(sweep, kept)
    check(sweep, given=given)
    assert _kinds(sweep) == ["side_by_side", "split_total", "cat_matmul", "side_by_side", "split_total"], sweep.ops
    X_h, Y_h = before.ops[0].args[0].value, before.ops[1].args[0].value
    wide, total, adjoint, wide2, rows = sweep.ops
    # (a_s, b_s) scaled as the stack is copied in (no array of it scaled); the stacks side by side
    # in the order they were made
    assert wide.args == (Read(X_h, scale=(0.5,)), Read(Y_h)) and wide.out.shape == (5, 16) and wide.out.hint is X_h
    g = before.ops[4].outs
    assert total.outs == g and total.args == (Read(before.ops[4].args[0].value, True), Read(wide.out))
    assert total.attrs == {"n": 4, "axis": -1}
    # the pairs of the sum of products in the matrix's order: a_s, b_s, c, e
    P = [a.value for a in before.ops[5].args[4:]]
    assert adjoint.args == (Read(wide.out), Read(P[1]), Read(P[3]), Read(P[0]), Read(P[2])), adjoint
    assert wide2.args == (Read(Y_h),) and rows.args[0] == Read(wide2.out, True) and rows.attrs["axis"] == -2
    _same(before, sweep, given, sorted(kept, key=lambda v: v.id))


@pytest.mark.parametrize("scale", ["given", "temperature"])
def test_heads_scaled_by_an_operand_are_side_by_side_as_by_a_literal(scale):
    s, tau = Value(scalar=True, hint="s"), Value(scalar=True, hint="tau")
    factor = (s,) if scale == "given" else (tau, s)
    sweep, given, kept = _heads_sweep(scale=factor)
    before = _copy(sweep)
    side_by_side(sweep, kept)
    check(sweep, given=[*given, s, tau])
    assert _kinds(sweep).count("side_by_side") == 2 and "scale" not in _kinds(sweep), sweep.ops
    assert sweep.ops[0].args[0].scale == factor
    _same(before, sweep, {**given, s: (), tau: ()}, sorted(kept, key=lambda v: v.id))


def test_heads_read_with_a_scale_of_their_own_join_the_scaled_stack():
    # grouped(S^t, (0.5 a), (0.5 b)) reads the heads scaled within the read: the stack scaled once
    X_h = Value(shape=(5, 4), batched=True, heads=2, hint="X_h")
    a, b, S = V("a", (5, 4), True), V("b", (5, 4), True), V("S", (5, 6), True)
    g1, g2 = V("g1", (6, 4)), V("g2", (6, 4))
    sweep = Sweep([Op("unbind", [a, b], [Read(X_h)]),
                   Op("grouped", [g1, g2], [Read(S, True), Read(b, scale=(0.5,)), Read(a, scale=(0.5,))],
                      side="cols", total=True)])
    before = _copy(sweep)
    side_by_side(sweep, {g1, g2})
    check(sweep, given=[X_h, S])
    assert _kinds(sweep) == ["side_by_side", "split_total"] and sweep.ops[1].outs == (g2, g1)
    assert sweep.ops[0].args == (Read(X_h, scale=(0.5,)),)
    _same(before, sweep, {X_h: (2, 5, 4), S: (5, 6)}, [g1, g2])


def test_heads_not_put_side_by_side():
    # heads of unequal widths (the matrix is cut evenly again): nothing is put side by side
    # (c and e alone would be, but they are grouped with a_s and b_s)
    sweep, given, kept = _heads_sweep(widths=(4, 3))
    side_by_side(sweep, kept)
    check(sweep, given=given)
    assert "side_by_side" in _kinds(sweep) and _kinds(sweep).count("grouped") == 1, sweep.ops
    assert "sum_of_products" in _kinds(sweep) and _kinds(sweep)[4] == "grouped"
    # a stack updated in place: its heads are not read from it
    sweep, given, kept = _heads_sweep(updated=True)
    side_by_side(sweep, kept)
    check(sweep, given=given)
    assert _kinds(sweep).count("grouped") == 2 and "sum_of_products" in _kinds(sweep), sweep.ops
    # an incomplete stack (one of its heads) is not a group
    X_h = Value(shape=(5, 4), batched=True, heads=2, hint="X_h")
    a, b, S = V("a", (5, 4), True), V("b", (5, 4), True), V("S", (5, 6), True)
    g1, g2 = V("g1", (6, 4)), V("g2", (6, 4))
    sweep = Sweep([Op("unbind", [a, b], [Read(X_h)]),
                   Op("grouped", [g1, g2], [Read(S, True), Read(a), Read(a)], side="cols", total=True)])
    side_by_side(sweep, {g1, g2})
    assert _kinds(sweep) == ["unbind", "grouped"]
    # heads read transposed whose widths as read differ (5 x 4 heads read as 4 x 5 beside a 5 x 3 one)
    c = V("c", (5, 3), True)
    Y_h = Value(shape=(5, 3), batched=True, heads=1, hint="Y_h")
    g3 = V("g3", (6, 3))
    sweep = Sweep([Op("unbind", [a, b], [Read(X_h)]), Op("unbind", [c], [Read(Y_h)]),
                   Op("grouped", [g1, g2, g3], [Read(S, True), Read(a, True), Read(b, True), Read(c)],
                      side="cols", total=True)])
    side_by_side(sweep, {g1, g2, g3})
    assert _kinds(sweep) == ["unbind", "unbind", "grouped"]
    # a grouped product not summed over the batch
    sweep = Sweep([Op("unbind", [a, b], [Read(X_h)]),
                   Op("grouped", [g1, g2], [Read(S, True), Read(a), Read(b)], side="cols", total=False)])
    side_by_side(sweep, {g1, g2})
    assert _kinds(sweep) == ["unbind", "grouped"]


def _transposed_heads(sums=("a", "b")):
    """A stack of two heads stored transposed, as a backward makes q^t dS (4 x 5 each), read
    transposed (and scaled) by a weight's gradients and an adjoint; ``sums``: the heads whose
    scaled sums along their rows (their bias rows' gradients) are made too."""
    X_h = Value(shape=(4, 5), batched=True, heads=2, hint="X_h")
    a, b, S = V("a", (4, 5), True), V("b", (4, 5), True), V("S", (5, 6), True)
    g1, g2, G = V("g1", (6, 4)), V("g2", (6, 4)), V("G", (5, 3), True)
    P1, P2 = V("P1", (4, 3)), V("P2", (4, 3))
    heads = {"a": a, "b": b}
    ops = [Op("unbind", [a, b], [Read(X_h)]),
           Op("grouped", [g1, g2], [Read(S, True), Read(a, True, (0.5,)), Read(b, True, (0.5,))], side="cols",
              total=True),
           Op("sum_of_products", [G], [Read(b, True, (0.5,)), Read(a, True, (0.5,)), Read(P2), Read(P1)], n=2)]
    rows = []
    for name in sums:
        r = V("r" + name, (1, 4))
        rows.append(r)
        ops.append(Op("sum_axis", [r], [Read(heads[name])], axis=-1, total=True, view_t=True, out_scale=(0.5,)))
    given = {X_h: (2, 4, 5), S: (5, 6), P1: (4, 3), P2: (4, 3)}
    return Sweep(ops), given, [g1, g2, G, *rows], X_h


def test_heads_stored_transposed_are_side_by_side_and_their_sums_one_sum():
    # the stack's heads read transposed are the stack transposed, side by side, scaled as copied
    # in; the heads' sums along their rows are one sum of the matrix's columns, cut
    sweep, given, results, X_h = _transposed_heads()
    before = _copy(sweep)
    side_by_side(sweep, set(results))
    check(sweep, given=list(given))
    assert _kinds(sweep) == ["side_by_side", "sum_axis", "split", "split_total", "cat_matmul"], sweep.ops
    wide, column_sum, cut, total, adjoint = sweep.ops
    assert wide.args == (Read(X_h, True, (0.5,)),) and wide.out.shape == (5, 8)
    assert column_sum.args == (Read(wide.out),) and column_sum.attrs == {"axis": -2, "total": True}
    assert cut.outs == tuple(results[3:]) and cut.attrs == {"n": 2, "axis": -1}
    assert adjoint.args[1:] == (before.ops[2].args[3], before.ops[2].args[2])  # P1, P2: the matrix's order
    _same(before, sweep, given, results)


def test_a_stack_put_side_by_side_transposed_is_made_the_other_way_round():
    # X_h = A^t B^t (q^t dS), read only transposed by the matrix: made as B A, read as it is
    sweep, given, results, X_h = _transposed_heads(sums=())
    A_h = Value(shape=(5, 4), batched=True, heads=2, hint="A_h")
    B_h = Value(shape=(5, 5), batched=True, heads=2, hint="B_h")
    sweep = Sweep([Op("matmul", [X_h], [Read(A_h, True), Read(B_h, True)], bmm=True)] + sweep.ops)
    before = _copy(sweep)
    side_by_side(sweep, set(results))
    check(sweep, given=[A_h, B_h, *given])
    product, wide = sweep.ops[:2]
    assert product.kind == "matmul" and product.args == (Read(B_h), Read(A_h)) and product.attrs == {"bmm": True}
    assert product.out.shape == (5, 4) and product.out.heads == 2
    assert wide.kind == "side_by_side" and wide.args == (Read(product.out, False, (0.5,)),), sweep.ops
    given = {A_h: (2, 5, 4), B_h: (2, 5, 5), **{v: shape for v, shape in given.items() if v is not X_h}}
    _same(before, sweep, given, results)
    # read by anything else too (or after the sweep), it stays as it is made
    sweep, _, results, X_h = _transposed_heads(sums=())
    sweep = Sweep([Op("matmul", [X_h], [Read(A_h, True), Read(B_h, True)], bmm=True)] + sweep.ops)
    side_by_side(sweep, set(results) | {X_h})
    assert sweep.ops[0].args == (Read(A_h, True), Read(B_h, True)) and sweep.ops[1].args[0].t


def test_heads_sums_of_some_heads_stay():
    # one head's sum alone is not a cut of the matrix's column sum: it stays, and its head
    sweep, given, results, _ = _transposed_heads(sums=("b",))
    before = _copy(sweep)
    side_by_side(sweep, set(results))
    check(sweep, given=list(given))
    assert _kinds(sweep) == ["unbind", "side_by_side", "split_total", "cat_matmul", "sum_axis"], sweep.ops
    _same(before, sweep, given, results)


def test_stacks_side_by_side_in_the_order_of_the_forwards_weights():
    # Y_h is made before X_h, but X_h's heads multiply W1, W2 (the first B of the forward's grouped
    # product) in the adjoint: the matrix puts X_h first, and the adjoint's weights are
    # concatenated as the forward's are
    A = V("A", (5, 6), True)
    W = [V("W%d" % j, (6, 4)) for j in range(1, 5)]
    q_h, k_h = (Value(shape=(5, 4), batched=True, heads=2, hint=n) for n in ("q_h", "k_h"))
    Y_h = Value(shape=(5, 4), batched=True, heads=2, hint="Y_h")
    X_h = Value(shape=(5, 4), batched=True, heads=2, hint="X_h")
    c, e, a, b = (V(n, (5, 4), True) for n in "ceab")
    S, G = V("S", (5, 6), True), V("G", (5, 6), True)
    g = [V("g%d" % j, (6, 4)) for j in range(4)]
    sweep = Sweep([Op("grouped_heads", [q_h, k_h], [Read(A)] + [Read(w) for w in W], h=2),
                   Op("unbind", [c, e], [Read(Y_h)]), Op("unbind", [a, b], [Read(X_h)]),
                   Op("grouped", g, [Read(S, True), Read(c), Read(e), Read(a), Read(b)], side="cols", total=True),
                   Op("sum_of_products", [G], [Read(c), Read(e), Read(a), Read(b)]
                      + [Read(W[2], True), Read(W[3], True), Read(W[0], True), Read(W[1], True)], n=4)])
    before = _copy(sweep)
    kept = {q_h, k_h, G, *g}
    side_by_side(sweep, kept)
    check(sweep, given=[A, *W, Y_h, X_h, S])
    wide = next(op for op in sweep.ops if op.kind == "side_by_side")
    adjoint = next(op for op in sweep.ops if op.kind == "cat_matmul")
    assert wide.args == (Read(X_h), Read(Y_h)), wide
    assert adjoint.args[1:] == tuple(Read(w, True) for w in W), adjoint
    given = {A: (5, 6), **{w: (6, 4) for w in W}, Y_h: (2, 5, 4), X_h: (2, 5, 4), S: (5, 6)}
    _same(before, sweep, given, sorted(kept, key=lambda v: v.id))


def test_heads_read_elsewhere_are_still_made():
    sweep, given, kept = _heads_sweep(read_elsewhere=True)
    before = _copy(sweep)
    side_by_side(sweep, kept | {sweep.ops[-1].out})
    check(sweep, given=given)
    kinds = _kinds(sweep)
    # a and a_s are read by the sum: the unbind of X_h and a_s stay, b_s goes; Y_h's unbind goes
    assert kinds.count("unbind") == 1 and kinds.count("scale") == 1, sweep.ops
    assert [op.out.hint for op in sweep.ops if op.kind == "scale" and not op.out.heads] == ["a_s"]
    _same(before, sweep, given, sorted(kept, key=lambda v: v.id) + [before.ops[-1].out])


def test_stacks_of_a_batch_are_multiplied_where_they_are():
    # the kinds of a grouped product, (batch, h, n, k) views whose two leading axes do not fold:
    # _bmm gives @'s product without copying them (one bmm an example)
    g = torch.Generator().manual_seed(5)
    R = torch.randn(3, 7, 2 * 4 * 5, dtype=torch.float64, generator=g).unflatten(-1, (2, 4, 5))
    q, k = (R.select(-3, j).transpose(-3, -2) for j in range(2))
    assert not rt._foldable(q)
    want = q @ k.mT
    copies = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            copies.extend([func.__name__] if func.__name__.startswith(("clone", "_unsafe_view", "copy_")) else [])
            return func(*args, **(kwargs or {}))

    with Spy():
        got = rt._bmm(q, k.mT)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12) and copies == [], copies
