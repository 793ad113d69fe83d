"""The factoring of sums before the lowering (fdsl.codegen.factoring): the terms a bias adds to every
gradient it reaches, found again as products of the sums the forward computes.

Each structural test also runs with the factoring switched off and checks that it then sees more
work (so the test fails when the rule does not fire); each value test compares the factored
gradients with the unfactored ones (the lowering's earlier path) and with central differences.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import fdsl
from fdsl.calculus.gradients import gradient_terms, loss_of
from fdsl.codegen import lowering
from fdsl.codegen.factoring import factored
from fdsl.codegen.generated import compile_namespace, gradients_source
from fdsl.codegen.lowering import nodes

HEAD = """dim n = 5, d = 4, k = 3
const X : n x d, Y : n x d
const C : n x 1 = ones
const M : n x n = causal
weight Q, K, V : d x k, O : k x d, bq, bk, bv : 1 x k
Z = a((X Q + C bq) (X K + C bk)^t + M) (X V + C bv) O
L = 1/2 trace((Z - Y)^t (Z - Y))
w = -d(L)
"""

MINI_GPT = """dim n = 5, v = 7, d = 4, k = 2, f = 8
const X, Y : n x v onehot
const C : n x 1 = ones
const M : n x n = causal
scalar s = k^(-1/2)
weight E : v x d, P : n x d
weight Q[i, j], K[i, j], V[i, j] : d x k, O[i, j] : k x d
weight bq[i, j], bk[i, j], bv[i, j] : 1 x k
weight bo[i] : 1 x d
weight g1[i], b1[i], g2[i], b2[i], c2[i] : 1 x d
weight W1[i] : d x f, c1[i] : 1 x f, W2[i] : f x d
weight gf, bf : 1 x d
ln(Z, g, b) = layernorm(Z) * (C g) + C b
head(i, j, Z) = a(s (Z Q[i, j] + C bq[i, j]) (Z K[i, j] + C bk[i, j])^t + M) (Z V[i, j] + C bv[i, j]) O[i, j]
heads(i, 0, Z) = head(i, 0, Z)
heads(i, j, Z) = heads(i, j-1, Z) + head(i, j, Z)
attention(i, Z) = Z + heads(i, 1, ln(Z, g1[i], b1[i])) + C bo[i]
mlp(i, Z) = Z + gelu(ln(Z, g2[i], b2[i]) W1[i] + C c1[i]) W2[i] + C c2[i]
gpt(0) = X E + P
gpt(L) := mlp(L-1, attention(L-1, gpt(L-1)))
L = -trace(Y^t logsoftmax(ln(gpt(2), gf, bf) E^t))
w = -d(L)
"""


def _sweep(program) -> list:
    """The ops of the torch sweep the lowering makes for ``w`` of ``program``."""
    w = program["w"]
    low = lowering.Lowering(gradient_terms(program.normal_form(w)), program.dims, "torch", loss=loss_of(w))
    low.lower()
    return low.sweep.ops


def _sweep_kinds(program) -> Counter:
    """The op kinds of ``_sweep``, counted."""
    return Counter(op.kind for op in _sweep(program))


def _unfactored(order):
    """The factoring switched off: every node as it is."""
    return {n: n for n in order}


def _module(program, target: str):
    """(the generated module of ``w`` of ``program`` on ``target``, compiled; its source)."""
    w = program["w"]
    src = gradients_source(program.normal_form(w), program.dims, "test", target, loss=loss_of(w))
    return compile_namespace(src), src


def _same_gradients(got, want):
    """Every gradient of ``want`` within 1e-11 of its largest entry (or of 1) in ``got``."""
    for name in want:
        g, h = np.asarray(got[name]), np.asarray(want[name])
        assert np.abs(g - h).max() <= 1e-11 * max(1.0, float(np.abs(h).max())), name


def test_a_biased_head_has_one_softmax_backward_and_no_extra_products(monkeypatch):
    p = fdsl.parse(HEAD)
    kinds = _sweep_kinds(p)
    assert kinds.get("aa_given") == 1, kinds  # aa(H, G O^t (X V + C bv)^t): one, not two
    products = kinds.get("matmul", 0) + kinds.get("grouped", 0)
    monkeypatch.setattr(lowering, "factored", _unfactored)
    off = _sweep_kinds(p)
    assert off.get("aa_given", 0) >= 2 and off.get("matmul", 0) + off.get("grouped", 0) > products, (kinds, off)


def test_the_four_terms_of_a_bias_on_both_sides_are_one_product():
    # bk's gradient, -(X Q + C bq)^t aa(H, G O^t (X V + C bv)^t) C, is four products in the normal form
    p = fdsl.parse(HEAD)
    terms = gradient_terms(p.normal_form(p["w"]))
    order = nodes(list(terms.values()))
    out = factored(order)
    bk = terms["bk"]
    while bk.op == "t":
        bk = bk.args[0]
    assert bk.op == "add" and len(bk.args) == 4, bk
    assert out[bk].op == "mul" and sum(f.op == "aa" or (f.op == "t" and f.args[0].op == "aa")
                                       for f in out[bk].args) == 1, out[bk]


def test_a_sum_without_a_computed_sum_under_it_stays():
    # F u v^t + F w z^t: (u v^t + w z^t) is computed nowhere, so F (...) would be a new dense product
    p = fdsl.parse("dim n = 4\nconst F : n x n, u, w : n x 1, v, z : 1 x n\nT = F u v + F w z\n")
    T_ = p["T"]
    assert factored(nodes([T_]))[T_] is T_


@pytest.mark.parametrize("source", [HEAD, MINI_GPT], ids=["head", "mini-gpt"])
def test_factored_gradients_equal_the_unfactored_ones_and_central_differences(monkeypatch, source):
    from fdsl.numbers.values import evaluate_in, program_values, random_values

    p = fdsl.parse(source)
    random_values(p, 29)
    store = program_values(p)

    def grads():
        module, _ = _module(p, "numpy")
        return module["grads_and_loss"]({name: store[name] for name in module["INPUTS"]})

    g, loss = grads()
    with monkeypatch.context() as m:
        m.setattr(lowering, "factored", _unfactored)
        g_off, loss_off = grads()
    assert abs(float(loss) - float(loss_off)) <= 1e-12 * abs(float(loss_off))
    assert set(g) == set(g_off)
    _same_gradients(g, g_off)
    # central differences of the loss on an entry of each weight (w = -d(L): G_W^t = -dL/dW)
    rng = np.random.default_rng(29)
    for name in sorted(g):
        W = np.array(store[name], dtype=float)
        i = tuple(int(rng.integers(0, s)) for s in W.shape)
        h = 1e-6
        sides = []
        for sign in (1, -1):
            moved = W.copy()
            moved[i] += sign * h
            store[name] = moved
            sides.append(float(evaluate_in(p, p["L"])[0, 0]))
        store[name] = W
        fd = (sides[0] - sides[1]) / (2 * h)
        assert abs(-float(np.asarray(g[name])[i]) - fd) <= 1e-6 * max(1.0, abs(fd)), (name, i, fd)


def test_the_heads_bias_rows_are_added_in_their_grouped_product(monkeypatch):
    # nanoGPT's c_attn: q, k and v of every head with its bias row, one addmm (heads.biased_kinds)
    p = fdsl.parse(MINI_GPT)

    def biased_and_stacks():
        ops = _sweep(p)
        return (sum(1 for op in ops if op.kind == "grouped_heads" and op.attrs.get("biased")),
                sum(1 for op in ops if op.kind == "stack"))

    biased, stacks = biased_and_stacks()
    assert biased == 2  # one a block
    monkeypatch.setattr(lowering, "biased_kinds", lambda sweep, kept: None)
    assert biased_and_stacks() == (0, stacks + 2 * 3)  # the rows of q, k and v stacked in each block


def test_the_torch_module_with_biased_heads_has_the_gradients_of_the_path_without_them(monkeypatch):
    torch = pytest.importorskip("torch")
    from fdsl.numbers.values import program_values, random_values

    p = fdsl.parse(MINI_GPT)
    random_values(p, 3)
    store = program_values(p)

    def run():
        module, src = _module(p, "torch")
        values = {name: torch.as_tensor(np.asarray(store[name])) for name in module["INPUTS"]}
        return module["grads_and_loss"](values), src

    (g, loss), src = run()
    assert "bias=(" in src
    with monkeypatch.context() as m:
        m.setattr(lowering, "biased_kinds", lambda sweep, kept: None)
        m.setattr(lowering, "factored", _unfactored)
        (g_off, loss_off), src_off = run()
    assert "bias=(" not in src_off
    assert abs(float(loss) - float(loss_off)) <= 1e-12 * abs(float(loss_off))
    _same_gradients(g, g_off)


def test_the_tied_embeddings_gradient_is_summed_over_the_batch_inside_its_terms(monkeypatch):
    # E's gradient is its lookup's scatter plus its unembedding's product: each summed over the
    # batch as it is made (fusion.summed_sum), no (batch, v, d) array; the biases' gradients, a
    # sum one of whose terms is another bias's gradient, stay right (a term returned is not summed)
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    from fdsl.numbers.values import program_values, random_values

    p = fdsl.parse(MINI_GPT)
    random_values(p, 4)
    store = program_values(p)
    batch, v, d = 3, p.dims["v"], p.dims["d"]
    rng = np.random.default_rng(4)

    class Shapes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for x in out if isinstance(out, (tuple, list)) else (out,):
                if torch.is_tensor(x):
                    self.seen.add(tuple(x.shape))
            return out

    def run():
        module, _ = _module(p, "torch")
        values = {name: torch.as_tensor(np.asarray(store[name])) for name in module["INPUTS"]}
        values.update({name: torch.as_tensor(rng.integers(0, v, (batch, p.dims["n"]))) for name in ("X", "Y")})
        shapes = Shapes()
        with shapes:
            g, _ = module["grads_and_loss"](values)
        return g, shapes.seen

    g, seen = run()
    assert not {(batch, d, v), (batch, v, d)} & seen, seen
    rng = np.random.default_rng(4)
    monkeypatch.setattr(lowering, "summed_sum", lambda sweep, v, returned: False)
    g_off, seen_off = run()
    assert {(batch, d, v), (batch, v, d)} & seen_off
    _same_gradients(g, g_off)


def test_twelve_biased_heads_are_factored_and_stacked(monkeypatch):
    # GPT-2's twelve heads: the attention input's adjoint is a sum of some seven terms a head
    # (84), over the bound a sum once had to stay under to be factored (64), which left every
    # head's backward unstacked (each head its own products); with the bound above it, both
    # blocks are one grouped product of the heads' kinds forward and one side-by-side backward
    text = MINI_GPT.replace("heads(i, 1, ln", "heads(i, 11, ln").replace("dim n = 5, v = 7, d = 4, k = 2",
                                                                         "dim n = 5, v = 7, d = 24, k = 2")
    p = fdsl.parse(text)
    kinds = _sweep_kinds(p)
    wide = kinds.get("side_by_side", 0) + kinds.get("side_products", 0)  # (the stacks copied or made in)
    assert kinds.get("grouped_heads", 0) >= 4 and wide >= 4, kinds
    assert kinds.get("stack", 0) == 0 and kinds.get("aa_given") == 2, kinds  # one softmax backward a block
    monkeypatch.setattr(lowering, "factored", _unfactored)
    off = _sweep_kinds(p)
    assert off.get("aa_given", 0) > 2 or off.get("stack", 0) > 0, off
