"""The fusion passes (fdsl.codegen.fusion) on sweeps built by hand: what each makes of its pattern,
where each must leave the sweep as it is, the IR's checker after every pass, and the values the
sweep computes, before and after, by a small numpy interpreter of the kinds these passes use."""

from __future__ import annotations

import numpy as np

from fdsl.codegen import fusion
from fdsl.codegen.ir import Dim, Op, Read, Sweep, Value, check

# ---- building sweeps and running them ----------------------------------------------------------


class Build:
    """A sweep built by hand: its inputs (given to the checker) with numbers, and its ops."""

    def __init__(self, seed=0):
        self.sweep = Sweep()
        self.env: dict = {}
        self.rng = np.random.default_rng(seed)

    def input(self, name, rows, cols, batch=0) -> Value:
        v = Value((rows, cols), batched=bool(batch), hint=name)
        self.env[v] = self.rng.standard_normal((batch, rows, cols) if batch else (rows, cols))
        return v

    def number(self, name, x) -> Value:
        v = Value(scalar=True, hint=name)
        self.env[v] = x
        return v

    def op(self, kind, args, shape, **attrs) -> Value:
        batched = any(a.value.batched for a in args if isinstance(a, Read))
        out = Value(shape, batched=batched)
        self.sweep.append(Op(kind, [out], args, **attrs))
        return out

    def mm(self, left, right, **attrs) -> Value:
        left, right = read(left), read(right)
        return self.op("matmul", [left, right], (left.shape[0], right.shape[1]), **attrs)

    def sum(self, *terms, signs=None, head=2) -> Value:
        terms = [read(t) for t in terms]
        return self.op("sum", terms, terms[0].shape, signs=tuple(signs or (1,) * len(terms)), head=head)

    def check(self):
        check(self.sweep, given=self.env)

    def run(self) -> dict:
        self.check()  # the sweep as built is well formed
        return run(self.sweep, self.env)


def read(x, t=False, *scale) -> Read:
    return x if isinstance(x, Read) else Read(x, t, tuple(scale))


def _total(x):
    return x.reshape(-1, *x.shape[-2:]).sum(0) if x.ndim > 2 else x


def _T(x):
    return np.swapaxes(x, -1, -2)


def run(sweep: Sweep, env: dict) -> dict:
    """The values of a sweep of the kinds these passes make and read, in numpy."""
    vals = dict(env)

    def number(s):
        if isinstance(s, Dim):
            return float(s.size if isinstance(s.size, int) else vals[s.size])
        return vals[s] if isinstance(s, Value) else s

    def get(a):
        x = vals[a.value]
        x = _T(x) if a.t and not a.value.scalar else x
        for s in a.scale:
            x = number(s) * x
        return x

    for op in sweep.ops:
        a, k = op.attrs, op.kind
        if k == "matmul":
            x = get(op.args[0]) @ get(op.args[1])
            for s in a.get("out_scale", ()):
                x = number(s) * x
            outs = [_total(x) if a.get("total") else x]
        elif k == "sum":
            outs = [sum(sign * get(t) for sign, t in zip(a["signs"], op.args))]
        elif k == "scale":
            outs = [get(op.args[0])]
        elif k == "sum_axis":
            x = get(op.args[0]).sum(axis=a["axis"], keepdims=True)
            x = _total(x) if a.get("total") else x
            outs = [_T(x) if a.get("view_t") else x]
        elif k == "grouped":
            pairs = ([(op.args[0], b) for b in op.args[1:]] if a["side"] == "cols"
                     else [(b, op.args[-1]) for b in op.args[:-1]])
            outs = [get(p) @ get(q) for p, q in pairs]
            outs = [_total(x) for x in outs] if a["total"] else outs
        elif k == "sum_of_products":
            n = a["n"]
            outs = [sum(get(p) @ get(q) for p, q in zip(op.args[:n], op.args[n:]))]
        elif k == "add_into":
            outs = [get(op.args[0]) + get(op.args[1])]
        elif k == "template" and a["op"] == "had":
            outs = [get(op.args[0]) * get(op.args[1])]
        else:
            raise AssertionError("the test interpreter has no %s" % k)
        vals.update(zip(op.outs, outs))
    return vals


def same(before: dict, after: dict, values, total=()):
    """``values`` computed alike before and after a pass (those in ``total``: summed over the
    batch after it)."""
    for v in values:
        want = _total(before[v]) if v in total else before[v]
        assert np.allclose(after[v], want), v


def kinds(sweep) -> list:
    return [op.kind for op in sweep.ops]


# ---- summed_product, summed_reduction ---------------------------------------------------------------


def test_a_gradient_is_summed_over_the_batch_inside_its_product():
    b = Build()
    X, Y = b.input("X", 6, 4, batch=5), b.input("Y", 6, 3, batch=5)
    G = b.mm(read(X, True), Y)
    before = b.run()
    assert fusion.summed_product(b.sweep, G)
    b.check()
    (op,) = b.sweep.ops
    assert op.kind == "matmul" and op.attrs["total"] and b.sweep.maker[G] is op
    same(before, b.run(), [G], total={G})


def test_a_gradient_is_not_summed_in_its_product_where_something_else_reads_it_or_it_is_no_plain_product():
    b = Build()
    X, W = b.input("X", 6, 4, batch=2), b.input("W", 4, 4)
    read_on = b.mm(X, W)
    b.mm(read_on, W)  # another op reads it
    summed = b.mm(read(X, True), X, total=True)  # already summed
    scaled = b.mm(X, W, out_scale=(0.5,))  # scaled after: two steps
    reduction = b.op("sum_axis", [read(X)], (6, 1), axis=-1)
    for v in (read_on, summed, scaled, reduction, X):
        assert not fusion.summed_product(b.sweep, v), v
    assert [op.attrs.get("total", False) for op in b.sweep.ops] == [False, False, True, False, False]
    b.check()


def test_a_gradient_that_sums_an_axis_is_summed_over_the_batch_in_the_same_reduction():
    b = Build()
    X = b.input("X", 5, 3, batch=4)
    rows = b.op("sum_axis", [read(X)], (5, 1), axis=-1)
    cols = b.op("sum_axis", [read(X, True)], (1, 5), axis=-2, view_t=True)
    before = b.run()
    assert fusion.summed_reduction(b.sweep, rows) and fusion.summed_reduction(b.sweep, cols)
    b.check()
    assert [(op.kind, op.attrs) for op in b.sweep.ops] == [
        ("sum_axis", {"axis": -1, "total": True}), ("sum_axis", {"axis": -2, "view_t": True, "total": True})]
    same(before, b.run(), [rows, cols], total={rows, cols})


def test_a_reduction_read_on_scaled_summed_or_no_reduction_is_not_summed_over_the_batch():
    b = Build()
    X = b.input("X", 5, 3, batch=4)
    s = b.number("s", 0.5)
    read_on = b.op("sum_axis", [read(X)], (5, 1), axis=-1)
    b.op("scale", [read(read_on, False, 2.0)], (5, 1))
    scaled = b.op("sum_axis", [read(X, False, s)], (5, 1), axis=-1)
    summed = b.op("sum_axis", [read(X)], (5, 1), axis=-1, total=True)
    product = b.mm(X, read(X, True))
    for v in (read_on, scaled, summed, product):
        assert not fusion.summed_reduction(b.sweep, v), v
    assert [op.attrs.get("total", False) for op in b.sweep.ops] == [False, False, False, True, False]
    b.check()


# ---- group_products ----------------------------------------------------------------------------------


def test_products_that_share_an_operand_are_one_product():
    b = Build()
    X, Q, K = b.input("X", 6, 4), b.input("Q", 4, 3), b.input("K", 4, 3)
    A, B = b.mm(X, Q), b.mm(X, K)
    R, S = b.mm(read(Q, True), read(X, True)), b.mm(read(K, True), read(X, True))  # a shared right side
    C = b.mm(read(X, True), X, total=True)
    Y = b.input("Y", 6, 3)
    D = b.mm(read(X, True), Y, total=True)  # summed over the batch: a group of its own kind
    E = b.mm(X, read(X, True), total=True)  # X^t as the right side of a total, not of R and S
    before = b.run()
    fusion.group_products(b.sweep, set())
    b.check()
    # all three go first (their operands are given), each before the one found before it, as
    # taking one at a time would put them
    assert [(g.kind, g.outs, g.args, g.attrs) for g in b.sweep.ops] == [
        ("grouped", (C, D), (read(X, True), read(X), read(Y)), {"side": "cols", "total": True}),
        ("grouped", (R, S), (read(Q, True), read(K, True), read(X, True)), {"side": "rows", "total": False}),
        ("grouped", (A, B), (read(X), read(Q), read(K)), {"side": "cols", "total": False}),
        ("matmul", (E,), (read(X), read(X, True)), {"total": True}),
    ]
    same(before, b.run(), [A, B, R, S, C, D, E])


def test_products_are_grouped_by_the_same_read_whatever_spells_its_scale():
    # a scale is an operand: (s X) Q and (s X) K share (s X) as (0.5 X) Q and (0.5 X) K do; a
    # transposed read, another scale or a total are other operands
    b = Build()
    X = b.input("X", 6, 4)
    Q, K, V, Q2, K2, V2 = (b.input(n, 4, 3) for n in ("Q", "K", "V", "Q2", "K2", "V2"))
    s, tau = b.number("s", 0.5), b.number("tau", 1.5)
    A, B = b.mm(read(X, False, tau, s), Q), b.mm(read(X, False, tau, s), K)
    C = b.mm(read(X, False, s), V)
    D = b.mm(read(X, False, Dim(4)), Q2)
    E = b.mm(read(X, False, Dim(4)), K2)
    F = b.mm(read(X, False, 0.5), V2)
    before = b.run()
    fusion.group_products(b.sweep, set())
    b.check()
    assert [(op.kind, op.outs) for op in b.sweep.ops] == [
        ("grouped", (D, E)), ("grouped", (A, B)), ("matmul", (C,)), ("matmul", (F,))]
    assert b.sweep.ops[1].args[0] == read(X, False, tau, s)
    same(before, b.run(), [A, B, C, D, E, F])


def test_the_largest_group_is_made_first_and_a_product_is_in_one_group():
    b = Build()
    X, Y = b.input("X", 6, 4), b.input("Y", 6, 4)
    Q, K, V = b.input("Q", 4, 3), b.input("K", 4, 3), b.input("V", 4, 3)
    A, B, C, D = b.mm(Y, Q), b.mm(X, Q), b.mm(X, K), b.mm(X, V)
    fusion.group_products(b.sweep, set())
    b.check()
    assert [(op.kind, op.outs) for op in b.sweep.ops] == [("grouped", (B, C, D)), ("matmul", (A,))]


def test_a_group_goes_where_its_last_operand_is_made_and_before_its_first_reader():
    b = Build()
    X, W, V = b.input("X", 5, 4), b.input("W", 4, 4), b.input("V", 4, 4)
    A = b.mm(X, W)
    U = b.mm(W, V)
    B = b.mm(X, U)  # the group waits for U ...
    P = b.mm(A, V)  # ... and A's reader waits for the group
    C = b.mm(X, V)  # this one moves up
    before = b.run()
    fusion.group_products(b.sweep, set())
    b.check()
    assert [(op.kind, op.outs) for op in b.sweep.ops] == [("matmul", (U,)), ("grouped", (A, B, C)),
                                                          ("matmul", (P,))]
    same(before, b.run(), [A, B, C, P])


def test_products_are_not_grouped_where_one_reads_another_or_a_result_is_read_before_the_place():
    b = Build()
    X, W = b.input("X", 5, 5), b.input("W", 5, 5)
    A = b.mm(X, W)
    b.mm(X, read(A, True))  # X (X W)^t beside X W
    c = Build()
    X, W, V1, V2 = c.input("X", 5, 4), c.input("W", 4, 4), c.input("V1", 4, 4), c.input("V2", 4, 4)
    A = c.mm(X, W)
    c.mm(A, V1)  # A is read before U, the operand of the other one, is made
    U = c.mm(W, V2)
    c.mm(X, U)
    for built in (b, c):
        ops = list(built.sweep.ops)
        fusion.group_products(built.sweep, set())
        built.check()
        assert built.sweep.ops == ops


def test_a_product_whose_operand_is_updated_in_place_is_not_moved():
    # A reads Y before Y is updated in place (add_into); grouping A with the later X Z would read
    # Y after the update. Where Y is summed into a new value instead, the group is made there.
    for inplace in (True, False):
        b = Build()
        X, W, V, U = b.input("X", 5, 4), b.input("W", 4, 4), b.input("V", 4, 4), b.input("U", 4, 4)
        Y = b.mm(W, V)
        A = b.mm(X, Y)
        Y2 = b.op("add_into", [read(Y), read(U)], (4, 4)) if inplace else b.sum(Y, U)
        Z = b.mm(Y2, V)
        B = b.mm(X, Z)
        before = b.run()
        fusion.group_products(b.sweep, set())
        b.check()
        assert ("grouped" in kinds(b.sweep)) is not inplace, b.sweep.ops
        same(before, b.run(), [A, B])


def test_a_product_scaled_after_it_is_made_is_not_grouped():
    b = Build()
    X, Q, K = b.input("X", 6, 4), b.input("Q", 4, 3), b.input("K", 4, 3)
    b.mm(X, Q, out_scale=(0.5,))
    b.mm(X, K)
    fusion.group_products(b.sweep, set())
    b.check()
    assert kinds(b.sweep) == ["matmul", "matmul"]


def _group_rounds(monkeypatch, b) -> int:
    """group_products on ``b``'s sweep, checked; the rounds it took (each computes the positions once)."""
    calls = []
    positions = Sweep.positions
    monkeypatch.setattr(Sweep, "positions", lambda self: calls.append(1) or positions(self))
    fusion.group_products(b.sweep, set())
    b.check()
    return len(calls)


def test_a_group_that_reads_what_another_makes_goes_after_it_in_the_same_round(monkeypatch):
    # the layers of a network: each layer's two products read the sum of the layer before's,
    # or one of them: a group of the same round, which the group goes just after
    b = Build()
    Z = b.input("X", 5, 4)
    outs = []
    for layer in range(6):
        Q, K = b.input("Q%d" % layer, 4, 4), b.input("K%d" % layer, 4, 4)
        A, B = b.mm(Z, Q), b.mm(Z, K)
        Z = A if layer % 2 else b.sum(A, B)
        outs += [A, B, Z]
    W, V = b.input("W", 4, 4), b.input("V", 4, 4)
    outs += [b.mm(Z, W), b.mm(Z, V)]
    before = b.run()
    rounds = _group_rounds(monkeypatch, b)
    assert kinds(b.sweep) == ["grouped", "sum", "grouped"] * 3 + ["grouped"] and rounds == 2, b.sweep.ops
    same(before, b.run(), outs)


def test_the_groups_of_a_deep_sweep_are_found_in_a_few_rounds(monkeypatch):
    # 300 layers, each with X_l Q_l, X_l K_l (a group) and Y_l Q_l (a group with X_l Q_l, which
    # waits): the groups of all the layers are made in one round; the positions are computed once
    # a round, and one more round finds nothing to do
    b = Build()
    outs = []
    for layer in range(300):
        X, Y = b.input("X%d" % layer, 5, 4), b.input("Y%d" % layer, 5, 4)
        Q, K = b.input("Q%d" % layer, 4, 4), b.input("K%d" % layer, 4, 4)
        outs += [b.mm(X, Q), b.mm(X, K), b.mm(Y, Q)]
    before = b.run()
    rounds = _group_rounds(monkeypatch, b)
    assert kinds(b.sweep) == ["grouped"] * 300 + ["matmul"] * 300 and rounds == 2, rounds
    same(before, b.run(), outs)


def test_groups_that_share_a_product_are_decided_largest_first_over_rounds():
    # cols key X: {X Q, X K, X V} first; rows keys Q: {Y Q, X Q} and V: {X V, Z V} share a
    # product with it, and cols key Z: {Z V, Z W} one with V's: they wait, and in the next
    # round Z's group is made (Q's and V's have one product left)
    b = Build()
    X, Y, Z = b.input("X", 5, 4), b.input("Y", 5, 4), b.input("Z", 5, 4)
    Q, K, V, W = (b.input(n, 4, 4) for n in "QKVW")
    A = b.mm(Y, Q)
    B, C, D = b.mm(X, Q), b.mm(X, K), b.mm(X, V)
    E, F = b.mm(Z, V), b.mm(Z, W)
    before = b.run()
    fusion.group_products(b.sweep, set())
    b.check()
    assert [(op.kind, op.outs) for op in b.sweep.ops] == [("grouped", (E, F)), ("grouped", (B, C, D)),
                                                          ("matmul", (A,))]
    same(before, b.run(), [A, B, C, D, E, F])


def test_a_group_that_touches_a_waiting_one_waits_with_it():
    # X's group (4) takes D, so V's group {D, E2, E} waits for the next round with {E2, E} left;
    # Z's {E, F} touches it and waits too: in the next round V's group, found first, takes E
    b = Build()
    X, Y, Z = b.input("X", 4, 4), b.input("Y", 4, 4), b.input("Z", 4, 4)
    Q, K, V, U, W = (b.input(n, 4, 4) for n in "QKVUW")
    B, C, D, D2 = b.mm(X, Q), b.mm(X, K), b.mm(X, V), b.mm(X, U)
    E2, E, F = b.mm(Y, V), b.mm(Z, V), b.mm(Z, W)
    before = b.run()
    fusion.group_products(b.sweep, set())
    b.check()
    assert [(op.kind, op.outs) for op in b.sweep.ops] == [("grouped", (E2, E)), ("grouped", (B, C, D, D2)),
                                                          ("matmul", (F,))]
    same(before, b.run(), [B, C, D, D2, E2, E, F])


def test_a_group_that_did_not_place_is_tried_again_before_what_touches_it():
    # Y's group {u1, u2, u3} cannot go after c1 (u1 is read before); X's group {c0, c1} moves c1
    # up, so Y's can go after it: W2's group {u2, d} waits for that, and then has u2 no more
    b = Build()
    X, Y, Z = b.input("X", 4, 4), b.input("Y", 4, 4), b.input("Z", 4, 4)
    W1, W2, V, Q, K = (b.input(n, 4, 4) for n in ("W1", "W2", "V", "Q", "K"))
    u1 = b.mm(Y, W1)
    R = b.mm(u1, V)
    c0, c1 = b.mm(X, Q), b.mm(X, K)
    u2, u3 = b.mm(Y, W2), b.mm(Y, c1)
    d = b.mm(Z, W2)
    before = b.run()
    fusion.group_products(b.sweep, set())
    b.check()
    assert [(op.kind, op.outs) for op in b.sweep.ops] == [("grouped", (c0, c1)), ("grouped", (u1, u2, u3)),
                                                          ("matmul", (R,)), ("matmul", (d,))]
    same(before, b.run(), [u1, R, c0, c1, u2, u3, d])


# ---- group_sums ------------------------------------------------------------------------------------


def _products_sum(b, signs=(1, 1, 1), t=(False, False)):
    """X A U + X B V + X (signs), the products read transposed or not (t)."""
    X = b.input("X", 5, 4)
    XA, XB = b.input("XA", 5, 3), b.input("XB", 5, 3)
    U, V = b.input("U", 3, 4), b.input("V", 3, 4)
    P1 = b.mm(XA, U) if not t[0] else b.mm(read(U, True), read(XA, True))
    P2 = b.mm(XB, V) if not t[1] else b.mm(read(V, True), read(XB, True))
    G = b.sum(read(P1, t[0]), read(P2, t[1]), X, signs=signs)
    return G, (X, XA, XB, U, V, P1, P2)


def test_a_sum_of_products_is_one_product():
    b = Build()
    G, (X, XA, XB, U, V, _, _) = _products_sum(b)
    before = b.run()
    fusion.group_sums(b.sweep, {G}, False)
    b.check()
    sp, rest = b.sweep.ops
    assert sp.kind == "sum_of_products" and sp.args == (read(XA), read(XB), read(U), read(V)) and sp.attrs == {"n": 2}
    assert rest.kind == "sum" and rest.outs == (G,) and rest.args == (read(sp.out), read(X))
    assert rest.attrs == {"signs": (1, 1), "head": 2} and sp.out.hint is G and sp.out.suffix == "_sp"
    same(before, b.run(), [G])


def test_a_subtracted_product_joins_the_sum_of_products_negated():
    b = Build()
    G, (X, XA, XB, U, V, _, _) = _products_sum(b, signs=(1, -1, 1))
    before = b.run()
    fusion.group_sums(b.sweep, {G}, False)
    b.check()
    sp, rest = b.sweep.ops
    assert sp.args == (read(XA), read(XB, False, -1.0), read(U), read(V)) and rest.attrs["signs"] == (1, 1)
    same(before, b.run(), [G])


def test_a_sum_of_products_read_transposed_is_computed_as_most_of_them_are():
    # both products computed transposed (read so by the sum): the one product too, read transposed;
    # then all of them turned, as they read their operands without a view: (V^t XB^t)^t = XB V
    b = Build()
    G, (X, XA, XB, U, V, P1, P2) = _products_sum(b, t=(True, True))
    before = b.run()
    fusion.group_sums(b.sweep, set(), False)
    b.check()
    sp, rest = b.sweep.ops
    assert sp.args == (read(XA), read(XB), read(U), read(V)) and rest.args == (read(sp.out), read(X))
    same(before, b.run(), [G])
    # a batch on the left stays there, where torch folds it into one product: XA^t U^t, XA a
    # batch, read transposed by the sum, stays as computed (the sum reading the one product
    # transposed), where turning it would read no view but put the batch on the right
    b = Build()
    X = b.input("X", 4, 5)
    XA, XB = b.input("XA", 3, 5, batch=2), b.input("XB", 3, 5, batch=2)
    U, V = b.input("U", 4, 3), b.input("V", 4, 3)
    P1, P2 = b.mm(read(XA, True), read(U, True)), b.mm(read(XB, True), read(V, True))
    G = b.sum(read(P1, True), read(P2, True), X)
    for folds, want in ((True, (read(XA, True), read(XB, True), read(U, True), read(V, True))),
                        (False, (read(U), read(V), read(XA), read(XB)))):
        sweep = Sweep(b.sweep.ops)
        before = run(sweep, b.env)
        fusion.group_sums(sweep, set(), folds)
        check(sweep, b.env)
        assert sweep.ops[0].args == want, folds
        assert sweep.ops[1].args[0].t is folds
        same(before, run(sweep, b.env), [G])


def test_a_sum_of_products_takes_the_orientation_most_of_them_are_read_in():
    b = Build()
    X, XA, XB, XC = b.input("X", 5, 4), b.input("XA", 5, 3), b.input("XB", 5, 3), b.input("XC", 5, 3)
    U, V, W = b.input("U", 3, 4), b.input("V", 3, 4), b.input("W", 3, 4)
    P1, P2 = b.mm(XA, U), b.mm(XB, V)
    P3 = b.mm(read(W, True), read(XC, True))  # read transposed: turned, as the two others are not
    G = b.sum(P1, read(P3, True), P2, X)
    before = b.run()
    fusion.group_sums(b.sweep, set(), False)
    b.check()
    sp, rest = b.sweep.ops
    assert sp.args == (read(XA), read(XC), read(XB), read(U), read(W), read(V)) and sp.attrs["n"] == 3
    assert rest.args == (read(sp.out), read(X))
    same(before, b.run(), [G])


def test_a_sum_of_a_single_product_after_the_others_are_grouped_is_that_product():
    b = Build()
    XA, XB, U, V = b.input("XA", 5, 3), b.input("XB", 5, 3), b.input("U", 3, 4), b.input("V", 3, 4)
    G = b.sum(b.mm(XA, U), b.mm(XB, V), signs=(1, -1))
    before = b.run()
    fusion.group_sums(b.sweep, set(), False)
    b.check()
    sp, rest = b.sweep.ops
    assert rest.args == (read(sp.out),) and rest.attrs == {"signs": (1,), "head": 1}
    same(before, b.run(), [G])


def _sum_unchanged(b, folds=False, kept=()):
    ops = list(b.sweep.ops)
    fusion.group_sums(b.sweep, set(kept), folds)
    b.check()
    assert b.sweep.ops == ops, b.sweep.ops


def test_the_products_of_a_sum_that_something_else_reads_or_is_kept_stay_as_they_are():
    b = Build()
    G, (X, XA, XB, U, V, P1, P2) = _products_sum(b)
    b.mm(P2, read(U, True))
    _sum_unchanged(b)
    b = Build()
    G, (X, XA, XB, U, V, P1, P2) = _products_sum(b)
    _sum_unchanged(b, kept={P1})


def test_a_product_added_twice_or_summed_over_the_batch_or_scaled_after_is_not_a_term_of_the_one_product():
    for spoil in ("twice", "total", "out_scale", "bmm"):
        b = Build()
        XA, XB, U, V = b.input("XA", 5, 3), b.input("XB", 5, 3), b.input("U", 3, 4), b.input("V", 3, 4)
        P1 = b.mm(XA, U)
        P2 = b.mm(XB, V, **({spoil: True} if spoil in ("total", "bmm") else {"out_scale": (0.5,)}
                            if spoil == "out_scale" else {}))
        if spoil == "twice":
            b.sum(P1, P2, P2)  # P1 and 2 P2: P2's reads alike are not split between two products
        else:
            b.sum(P1, P2)
        _sum_unchanged(b)


def test_a_sum_whose_first_statement_is_not_two_added_terms_is_left_as_it_is():
    # a sum starting negated (head 1: v = -a), three terms at once (head 3), scaled terms
    for signs, head, scale in (((-1, 1), 1, ()), ((1, 1, 1), 3, ()), ((1, 1), 2, (0.5,))):
        b = Build()
        XA, XB, XC = b.input("XA", 5, 3), b.input("XB", 5, 3), b.input("XC", 5, 3)
        U, V, W = b.input("U", 3, 4), b.input("V", 3, 4), b.input("W", 3, 4)
        terms = [read(b.mm(XA, U), False, *scale), read(b.mm(XB, V)), read(b.mm(XC, W))][:len(signs)]
        b.sum(*terms, signs=signs, head=head)
        _sum_unchanged(b)


def test_the_terms_of_a_sum_after_a_scaled_one_are_left_as_they_are():
    b = Build()
    XA, XB, XC, XD = (b.input(n, 5, 3) for n in ("XA", "XB", "XC", "XD"))
    U, V, W, Y = (b.input(n, 3, 4) for n in "UVWY")
    P1, P2, P3, P4 = b.mm(XA, U), b.mm(XB, V), b.mm(XC, W), b.mm(XD, Y)
    G = b.sum(P1, P2, read(P3, False, 2.0), P4)
    before = b.run()
    fusion.group_sums(b.sweep, set(), False)
    b.check()
    assert [(op.kind, op.outs) for op in b.sweep.ops][:2] == [("matmul", (P3,)), ("matmul", (P4,))]
    assert b.sweep.ops[2].args == (read(XA), read(XB), read(U), read(V))
    same(before, b.run(), [G])


def test_a_row_added_to_every_row_is_not_a_term_of_the_one_product():
    b = Build()
    XA, XB, g = b.input("XA", 5, 3), b.input("XB", 5, 3), b.input("g", 1, 3)
    U, V, W = b.input("U", 3, 4), b.input("V", 3, 4), b.input("W", 3, 4)
    G = b.sum(b.mm(XA, U), b.mm(g, W), b.mm(XB, V))  # g W: a 1 x 4 row, broadcast
    before = b.run()
    fusion.group_sums(b.sweep, set(), False)
    b.check()
    assert b.sweep.ops[-2].args == (read(XA), read(XB), read(U), read(V))
    same(before, b.run(), [G])


def test_a_product_whose_operand_is_updated_in_place_before_the_sum_is_not_moved_into_it():
    b = Build()
    XA, XB, U, V, Z = b.input("XA", 5, 3), b.input("XB", 5, 3), b.input("U", 3, 4), b.input("V", 3, 4), \
        b.input("Z", 5, 3)
    Y = b.mm(XA, b.mm(U, read(U, True)))  # made in the sweep, so that it may be updated in place
    P1 = b.mm(Y, U)
    b.op("add_into", [read(Y), read(Z)], (5, 3))  # Y dies here: P1 must stay before
    P2, P3 = b.mm(XB, V), b.mm(XA, V)
    G = b.sum(P1, P2, P3)
    before = b.run()
    fusion.group_sums(b.sweep, set(), False)
    b.check()
    assert b.sweep.maker[P1].kind == "matmul" and b.sweep.ops[-2].args == (read(XB), read(XA), read(V), read(V))
    same(before, b.run(), [G])


# ---- transposed_reads --------------------------------------------------------------------------------


def _read_transposed(b, scale=(0.5,)):
    X, W, V, Z = b.input("X", 4, 3), b.input("W", 4, 2), b.input("V", 3, 5), b.input("Z", 3, 2)
    a = b.mm(read(X, True), W)
    c = b.mm(read(a, True, *scale), V)
    e = b.mm(read(a, True), Z)
    return (X, W, V, Z), a, c, e


def test_a_product_read_only_transposed_is_computed_transposed():
    b = Build()
    (X, W, V, Z), a, c, e = _read_transposed(b)
    before = b.run()
    fusion.transposed_reads(b.sweep, set(), False)
    b.check()
    assert [op.args for op in b.sweep.ops] == [(read(W, True), read(X)), (read(a, False, 0.5), read(V)),
                                               (read(a), read(Z))]
    same(before, b.run(), [c, e])


def test_a_product_read_transposed_with_a_scale_given_with_the_data_is_computed_transposed_too():
    # the point of scales as operands: (s a)^t, (tau s a)^t and (sqrt(k) a)^t turn as (0.5 a)^t does
    for scale in ("s", "tau s", "dim"):
        b = Build()
        s, tau = b.number("s", 0.5), b.number("tau", 2.0)
        factors = {"s": (s,), "tau s": (tau, s), "dim": (Dim(4),)}[scale]
        (X, W, V, Z), a, c, e = _read_transposed(b, factors)
        before = b.run()
        fusion.transposed_reads(b.sweep, set(), False)
        b.check()
        assert b.sweep.ops[1].args == (read(a, False, *factors), read(V)), scale
        same(before, b.run(), [c, e])


def test_a_product_read_as_it_is_elementwise_kept_or_with_a_batch_leaving_the_left_is_not_turned():
    cases = {
        "plain": lambda b, a, Z: b.mm(a, read(a, True)),
        "elementwise": lambda b, a, Z: b.op("template", [read(a, True), read(Z, True)], (2, 3), op="had"),
        "scaled": lambda b, a, Z: b.op("scale", [read(a, True, 2.0)], (2, 3)),
    }
    for name, extra in cases.items():
        b = Build()
        (X, W, V, Z), a, c, e = _read_transposed(b)
        extra(b, a, Z)
        ops = list(b.sweep.ops)
        fusion.transposed_reads(b.sweep, set(), False)
        b.check()
        assert b.sweep.ops == ops, name
    b = Build()
    (X, W, V, Z), a, c, e = _read_transposed(b)
    ops = list(b.sweep.ops)
    fusion.transposed_reads(b.sweep, {a}, False)
    assert b.sweep.ops == ops
    b = Build()
    X, W, V = b.input("X", 5, 4, batch=3), b.input("W", 5, 2), b.input("V", 6, 4)
    a = b.mm(read(X, True), W)  # X^t W, X a batch on the left: turned, W^t X would put it on the right
    b.mm(read(a, True), read(V, True))
    ops = list(b.sweep.ops)
    fusion.transposed_reads(b.sweep, set(), True)
    assert b.sweep.ops == ops
    fusion.transposed_reads(b.sweep, set(), False)  # numpy: no batch is folded
    b.check()
    assert b.sweep.ops[0].args == (read(W, True), read(X))


def test_a_product_is_not_turned_where_that_takes_as_many_views_as_it_saves():
    b = Build()
    X, W, V = b.input("X", 3, 4), b.input("W", 4, 2), b.input("V", 3, 5)
    a = b.mm(X, W)  # turned: W^t X^t, two views for the one it saves
    b.mm(read(a, True), V)
    ops = list(b.sweep.ops)
    fusion.transposed_reads(b.sweep, set(), False)
    assert b.sweep.ops == ops


def test_products_are_turned_in_order_each_as_the_turns_before_it_left_it():
    # p2 = p1^t U reads p1 transposed, p3 = p2^t V reads p2 so, the last op reads p3 so. p1 turns;
    # p2 then reads p1 as it is and turning it would take two views for the one it saves: it
    # stays (looked at as it was, it would have turned); p3 turns
    b = Build()
    X, W, U, V, Y = b.input("X", 4, 3), b.input("W", 4, 2), b.input("U", 3, 6), b.input("V", 2, 5), b.input("Y", 6, 1)
    p1 = b.mm(read(X, True), W)  # 3 x 2
    p2 = b.mm(read(p1, True), U)  # 2 x 6
    p3 = b.mm(read(p2, True), V)  # 6 x 5
    end = b.mm(read(p3, True), Y)
    before = b.run()
    fusion.transposed_reads(b.sweep, set(), False)
    b.check()
    assert [op.args for op in b.sweep.ops] == [(read(W, True), read(X)), (read(p1), read(U)),
                                               (read(V, True), read(p2)), (read(p3), read(Y))]
    assert p1.shape == (2, 3) and p2.shape == (2, 6) and p3.shape == (5, 6)
    same(before, b.run(), [end])


# ---- shared_scalings ---------------------------------------------------------------------------------


def test_a_value_scaled_in_two_ops_is_scaled_once():
    b = Build()
    X, W, V, Z = b.input("X", 3, 4), b.input("W", 4, 2), b.input("V", 3, 5), b.input("Z", 2, 3)
    a = b.mm(X, W)
    c = b.mm(read(a, True, 0.5), V)  # (0.5 a)^t V
    d = b.sum(read(a, True, 0.5), Z)  # (0.5 a)^t + Z
    e = b.sum(read(a, False, 2.0), a)  # another scale, once: as it is
    before = b.run()
    fusion.shared_scalings(b.sweep, set())
    b.check()
    a_s = b.sweep.ops[1].out
    assert [(op.kind, op.args) for op in b.sweep.ops] == [
        ("matmul", (read(X), read(W))), ("scale", (read(a, False, 0.5),)), ("matmul", (read(a_s, True), read(V))),
        ("sum", (read(a_s, True), read(Z))), ("sum", (read(a, False, 2.0), read(a)))]
    assert a_s.hint is a and a_s.suffix == "_s" and a_s.shape == a.shape and b.sweep.readers[a_s]
    same(before, b.run(), [c, d, e])


def test_a_scale_given_with_the_data_a_temperature_or_a_dim_is_shared_as_a_literal_is():
    # the point of scales as operands: s (a scalar input), tau s (a learned temperature times
    # it), a dim; compared by equality, so s and tau s are two scalings, each shared; two reads
    # in one op count as two; the scaling goes before its first reader, not after the product
    b = Build()
    X, W, V = b.input("X", 3, 4), b.input("W", 4, 3), b.input("V", 3, 3)
    s, tau = b.number("s", 0.5), b.number("tau", 3.0)
    a = b.mm(X, W)
    first = b.mm(V, V)
    outs = [first]
    for scale in ((s,), (tau, s), (Dim(4),)):
        outs += [b.mm(read(a, False, *scale), V), b.mm(read(a, True, *scale), V)]
    twice = b.mm(read(first, False, 0.25), read(first, True, 0.25))
    outs.append(twice)
    before = b.run()
    fusion.shared_scalings(b.sweep, set())
    b.check()
    scales = [op for op in b.sweep.ops if op.kind == "scale"]
    assert [op.args[0] for op in scales] == [read(a, False, s), read(a, False, tau, s), read(a, False, Dim(4)),
                                             read(first, False, 0.25)]
    assert kinds(b.sweep)[:4] == ["matmul", "matmul", "scale", "matmul"]
    assert not any(r.scale for op in b.sweep.ops if op.kind == "matmul" for r in op.args)
    same(before, b.run(), outs)


def test_an_input_a_single_read_or_a_scale_op_is_not_a_shared_scaling():
    b = Build()
    X, W = b.input("X", 3, 3), b.input("W", 3, 3)
    b.mm(read(X, False, 0.5), W), b.mm(read(X, True, 0.5), W)  # an input: scaled where read
    a = b.mm(X, W)
    b.op("scale", [read(a, False, 0.5)], (3, 3))  # already a scaling of its own
    b.mm(read(a, False, 0.5), W)
    b.mm(read(a, False, 0.25), W)
    ops = list(b.sweep.ops)
    fusion.shared_scalings(b.sweep, set())
    b.check()
    assert b.sweep.ops == ops


# ---- batched_products --------------------------------------------------------------------------------


def test_a_product_of_two_batches_is_one_bmm_whatever_scales_it():
    # a scale, a number given with the data, is no batch: (s A) (s X)^t is a product of two
    b = Build()
    X, W = b.input("X", 5, 3, batch=3), b.input("W", 3, 3)
    s = b.number("s", 0.5)
    A = b.mm(X, W)
    B = b.mm(A, read(X, True))
    C = b.mm(read(A, False, s), read(X, True, s))
    D = b.mm(read(X, True), X, total=True)  # summed over the batch: its own kernel
    E = b.mm(W, W)
    before = b.run()
    fusion.batched_products(b.sweep, set())
    b.check()
    assert [op.attrs.get("bmm", False) for op in b.sweep.ops] == [False, True, True, False, False]
    assert [op.outs[0] for op in b.sweep.ops] == [A, B, C, D, E]
    same(before, b.run(), [A, B, C, D, E])
