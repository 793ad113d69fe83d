"""Causal attention's triangular products (fdsl.codegen.causal): which stacked products a causal
mask makes triangular (and none where it does not), the runtime's blocked product against the
whole one, and a GPT's gradients with the pass against the same module without it."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import fdsl  # noqa: E402
from fdsl.calculus.gradients import gradient_terms, loss_of  # noqa: E402
from fdsl.codegen import lowering  # noqa: E402
from fdsl.codegen import torch_runtime as rt  # noqa: E402
from fdsl.codegen.generated import compile_namespace, gradients_source  # noqa: E402

GPT = """dim n = {n}, v = 11, d = 8, k = 4, f = 16
const X, Y : n x v onehot
const C : n x 1 = ones
const M : n x n = {mask}
scalar s = k^(-1/2)
weight E : v x d, P : n x d
weight Q[j], K[j], V[j] : d x k, O[j] : k x d
weight g, b : 1 x d
head(j, Z) = a(s Z Q[j] K[j]^t Z^t + M) Z V[j] O[j]
Z1 = X E + P
N = layernorm(Z1) * (C g) + C b
Z2 = Z1 + head(0, N) + head(1, N)
L = -trace(Y^t logsoftmax(Z2 E^t))
w = -d(L)
"""


def _program(n=8, mask="causal"):
    return fdsl.parse(GPT.format(n=n, mask=mask))


def _sweep(program):
    w = program["w"]
    low = lowering.Lowering(gradient_terms(program.normal_form(w)), program.dims, "torch", loss=loss_of(w))
    low.lower()
    return low.sweep


def _marks(program) -> list:
    """The causal kinds of the torch sweep's products, in order ("softmax": a causal_softmax, the
    scores' product fused with the mask and the softmax)."""
    return [op.attrs["causal"] if op.kind == "matmul" else "softmax" for op in _sweep(program).ops
            if op.kind == "matmul" and op.attrs.get("causal") or op.kind == "causal_softmax"]


def test_the_six_products_of_a_causal_attention_are_marked():
    # forward: the scores (only their lower blocks are read: fused with the mask and the softmax,
    # one for each head stack), P V; backward: P^t dO, dO V^t (read by aa_given of P), dS K, dS^t Q
    marks = _marks(_program())
    assert sorted(marks) == ["L", "L", "U", "U", "out", "softmax"], marks


def test_the_scores_mask_and_softmax_are_one_op():
    # the scores s q k^t, plus the mask, and their softmax: one causal_softmax reading q, k and the
    # mask, the scale kept as the product's (no softmax op, no add_into of the mask left)
    ops = _sweep(_program()).ops
    fused = [op for op in ops if op.kind == "causal_softmax"]
    assert len(fused) == 1, fused
    assert not any(op.kind == "softmax" and op.out.shape[0] == op.out.shape[1] for op in ops)  # (the logits' is n x v)
    left, right, mask = fused[0].args
    assert left.scale and not right.scale and not mask.t and not mask.scale


def test_a_mask_that_is_not_the_causal_constant_marks_nothing():
    # a mask given with the data could be anything: nothing is known zero
    text = GPT.format(n=8, mask="causal").replace("const M : n x n = causal", "const M : n x n")
    assert _marks(fdsl.parse(text)) == []
    text = GPT.format(n=8, mask="causal").replace("+ M)", ")")  # no mask at all
    assert _marks(fdsl.parse(text)) == []


def _lower_and_rows(seed, lead, n):
    """(a generator of ``seed``, a float64 stack of ``lead`` lower-triangular n x n matrices, one of
    n x 5 matrices)."""
    g = torch.Generator().manual_seed(seed)
    return (g, torch.randn(*lead, n, n, generator=g, dtype=torch.float64).tril(),
            torch.randn(*lead, n, 5, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("kind", ["L", "U", "out"])
@pytest.mark.parametrize("lead", [(3,), (2, 3)])
@pytest.mark.parametrize("n", [200, 64])
def test_the_blocked_product_is_the_whole_product_where_it_is_read(kind, lead, n):
    g, tri, B = _lower_and_rows(11, lead, n)
    if kind == "L":
        A, want_rows = tri, None
    elif kind == "U":
        A, want_rows = tri.mT, None
    else:
        A = torch.randn(*lead, n, 5, generator=g, dtype=torch.float64)
        B = torch.randn(*lead, 5, n, generator=g, dtype=torch.float64)
        want_rows = True
    got = rt._bmm_causal(A, B, kind)
    want = A @ B
    if want_rows:  # only the blocks on and below the diagonal are read; the rest is finite
        keep = torch.ones(n, n, dtype=torch.bool).tril()
        assert torch.isfinite(got).all()
        assert torch.allclose(got[..., keep], want[..., keep], rtol=1e-12, atol=1e-12)
    else:
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def _same_with_and_without(p, seed, monkeypatch, name, off, call, least):
    """The torch module of p's gradients against the same module with the pass ``name`` of
    lowering switched off (``off``: its stand-in): ``call`` spelled at least ``least`` times with
    it and never without, and the same loss and gradients (random values of ``seed``)."""
    w = p["w"]
    from fdsl.numbers.values import program_values, random_values

    random_values(p, seed)
    store = program_values(p)

    def run():
        src = gradients_source(p.normal_form(w), p.dims, "test", "torch", loss=loss_of(w))
        module = compile_namespace(src)
        values = {name: torch.as_tensor(store[name]) for name in module["INPUTS"]}
        return module["grads_and_loss"](values), src

    (g, loss), src = run()
    assert src.count(call) >= least
    monkeypatch.setattr(lowering, name, off)
    (g_off, loss_off), src_off = run()
    assert call not in src_off.split("def grads_and_loss")[1]
    assert abs(float(loss) - float(loss_off)) <= 1e-12 * abs(float(loss_off))
    for weight in g_off:
        scale = max(1.0, float(torch.as_tensor(g_off[weight]).abs().max()))
        err = float((torch.as_tensor(g[weight]) - torch.as_tensor(g_off[weight])).abs().max())
        assert err <= 1e-11 * scale, weight


def test_a_gpts_gradients_with_the_blocked_products_are_those_without(monkeypatch):
    # n = 200: four blocks of 64 rows, the last of 8 (a context not a multiple of the block)
    _same_with_and_without(_program(n=200), 4, monkeypatch, "causal_products", lambda sweep, kept, masks: None,
                           "_bmm_causal(", 6)


@pytest.mark.parametrize("kind", ["L", "U", "out"])
def test_the_blocks_as_a_traced_graph_makes_them(kind, monkeypatch):
    # under torch.compile the blocks are concatenated (no writes into views): the same numbers
    g = torch.Generator().manual_seed(12)
    tri = torch.randn(2, 3, 150, 150, generator=g, dtype=torch.float64).tril()
    A = {"L": tri, "U": tri.mT, "out": torch.randn(2, 3, 150, 4, generator=g, dtype=torch.float64)}[kind]
    B = torch.randn(2, 3, 4, 150, generator=g, dtype=torch.float64) if kind == "out" else \
        torch.randn(2, 3, 150, 4, generator=g, dtype=torch.float64)
    eager = rt._bmm_causal(A, B, kind)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    traced = rt._bmm_causal(A, B, kind)
    assert torch.allclose(traced, eager, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lead", [(3,), (2, 3)])
@pytest.mark.parametrize("n", [200, 64])
@pytest.mark.parametrize("scale", [None, 0.25, "tensor"])
def test_the_causal_softmax_is_the_masked_softmax_of_the_product(lead, n, scale):
    # n = 200: blocks of 64 and a last one of 8; n = 64: too small to block, the whole spelling; a
    # scale of each example (a tensor): the whole spelling too
    g = torch.Generator().manual_seed(13)
    A = torch.randn(*lead, n, 5, generator=g, dtype=torch.float64)
    B = torch.randn(*lead, 5, n, generator=g, dtype=torch.float64)
    M = torch.triu(torch.full((n, n), float("-inf"), dtype=torch.float64), 1)
    c = torch.rand(*lead[:1], *[1] * (len(lead) + 1), generator=g, dtype=torch.float64) if scale == "tensor" \
        else scale
    got = rt._causal_softmax(A, B, M, c)
    want = torch.softmax((A @ B) * (1.0 if c is None else c) + M, -1)
    assert torch.allclose(got, want, rtol=1e-13, atol=1e-15)
    assert float(got.triu(1).abs().max()) == 0.0  # exact zeros above the diagonal, as P's


def test_the_causal_softmax_as_a_traced_graph(monkeypatch):
    g = torch.Generator().manual_seed(14)
    A = torch.randn(2, 3, 150, 4, generator=g, dtype=torch.float64)
    B = torch.randn(2, 3, 4, 150, generator=g, dtype=torch.float64)
    M = torch.triu(torch.full((150, 150), float("-inf"), dtype=torch.float64), 1)
    eager = rt._causal_softmax(A, B, M, 0.5)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert torch.allclose(rt._causal_softmax(A, B, M, 0.5), eager, rtol=1e-13, atol=1e-15)


# ---- the stacks made into their side-by-side matrix (heads.products_side_by_side) ----------------

NANOGPT = Path(__file__).resolve().parent.parent / "examples" / "nanogpt.fd"


def _nanogpt():
    """examples/nanogpt.fd (nanoGPT's heads: Q, K, V k x d, no biases) with one block of two heads,
    its dims as they are (the chain order, and so the stacks' layout, follows the dims)."""
    text = NANOGPT.read_text()
    assert "heads(i, 5, " in text and "gpt(6)" in text
    return fdsl.parse(text.replace("heads(i, 5, ", "heads(i, 1, ").replace("gpt(6)", "gpt(1)"))


def test_the_attentions_stacks_are_made_into_their_side_by_side_matrix():
    # forward: P V into the matrix the output projection reads; backward: dS K, dS^t Q (scaled by
    # s) and P^t dO into the matrix the weights' gradients and the input's adjoint read
    ops = _sweep(_nanogpt()).ops
    made = [op for op in ops if op.kind == "side_products"]
    assert sorted(op.attrs["kinds"] for op in made) == [("L",), ("L", "U", "U")], made
    back = next(op for op in made if len(op.attrs["kinds"]) == 3)
    assert back.attrs["scales"] == (0.125, 0.125, None) and len(back.args) == 6  # s = k^(-1/2), k = 64
    assert not any(op.kind == "side_by_side" for op in ops)


def test_stacks_read_by_two_matrices_are_made_and_copied():
    # GPT above (its dims: the chain order makes the backward's stacks read transposed, scaled by
    # one side-by-side matrix and as they are by another; the forward's P V read by a matrix and
    # another op): each is made, then copied in
    ops = _sweep(_program()).ops
    assert not any(op.kind == "side_products" for op in ops)
    assert sum(op.kind == "side_by_side" for op in ops) == 3


@pytest.mark.parametrize("lead", [(3,), (2, 3)])
@pytest.mark.parametrize("n", [200, 64])
def test_side_products_are_the_side_by_side_matrix_of_the_products(lead, n, monkeypatch):
    g, tri, B = _lower_and_rows(15, lead, n)
    A5 = torch.randn(*lead, n, 5, generator=g, dtype=torch.float64)
    B5 = torch.randn(*lead, 5, 5, generator=g, dtype=torch.float64)
    specs = ((tri, B, "L", 0.5), (tri.mT, B, "U", None), (A5, B5, None, 2.0), (tri, B, None, None))
    want = rt._side_by_side(tuple((A @ b) * (1.0 if c is None else c) for A, b, _, c in specs))
    got = rt._side_products(specs)
    assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # (a traced graph: the stacks joined)
    assert torch.allclose(rt._side_products(specs), want, rtol=1e-12, atol=1e-12)


def test_a_gpts_gradients_with_the_stacks_made_in_place_are_those_without(monkeypatch):
    # context 256: the causal products in four blocks, written into the matrix's columns
    _same_with_and_without(_nanogpt(), 5, monkeypatch, "products_side_by_side", lambda sweep, kept: None,
                           "_side_products(", 2)
