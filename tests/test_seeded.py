"""The seed in the products (fdsl.codegen.kernels.seeded_products): the gradients a product makes
are made times the scale the Function guessed (the last backward's), so the backward multiplies
nothing where the guess holds and by the ratio where it does not. Checked against the sweep's
own unscaled gradients, in float64, for a guess that is right, one that is wrong, a first step
and a mean's scale, and the pass's marks against the module without it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import fdsl  # noqa: E402
from fdsl.calculus.gradients import gradient_terms, loss_of  # noqa: E402
from fdsl.codegen import lowering  # noqa: E402
from fdsl.codegen.generated import compile_namespace, gradients_source  # noqa: E402

GPT = """dim n = 6, v = 7, d = 8, k = 4, f = 12
const X, Y : n x v onehot
const C : n x 1 = ones
const M : n x n = causal
scalar s = k^(-1/2)
weight E : v x d, P : n x d
weight Q[j], K[j], V[j] : d x k, O[j] : k x d
weight W1 : d x f, W2 : f x d, g, b : 1 x d
head(j, Z) = a(s Z Q[j] K[j]^t Z^t + M) Z V[j] O[j]
Z1 = X E + P
N = layernorm(Z1) * (C g) + C b
Z2 = Z1 + head(0, N) + head(1, N)
Z3 = Z2 + gelu(Z2 W1) W2
L = -trace(Y^t logsoftmax(Z3 E^t))
w = -d(L)
"""


def _module():
    p = fdsl.parse(GPT)
    w = p["w"]
    return compile_namespace(gradients_source(p.normal_form(w), p.dims, "test", "torch", loss=loss_of(w)))


def _model_and_batch(seed, batch):
    """(the module's namespace, its float64 Model, ids X and Y of ``batch`` examples), drawn from ``seed``."""
    ns = _module()
    g = torch.Generator().manual_seed(seed)
    model = ns["Model"](dtype=torch.float64, generator=g)
    return (ns, model) + tuple(torch.randint(0, 7, (batch, 6), generator=g) for _ in range(2))


def test_the_products_that_make_gradients_are_seeded():
    p = fdsl.parse(GPT)
    w = p["w"]
    low = lowering.Lowering(gradient_terms(p.normal_form(w)), p.dims, "torch", loss=loss_of(w))
    low.lower()
    assert {"Q_0", "K_1", "V_0", "O_1", "W1", "W2"} <= low.seeded
    assert not {"g", "b"} & low.seeded  # (a layer norm's kernel makes those: the backward scales them)
    marked = [op for op in low.sweep.ops if op.attrs.get("seeded")]
    assert marked and all(op.kind in ("matmul", "split_total") for op in marked)
    for op in marked:  # nothing in the sweep reads what a seeded product makes
        assert not any(low.sweep.readers.get(out) for out in op.outs)


def test_without_a_loss_nothing_is_seeded():
    p = fdsl.parse(GPT)
    src = gradients_source(p.normal_form(p["w"]), p.dims, "test", "torch")
    assert "alpha=_seed" not in src


@pytest.mark.parametrize("scales", [(3.0, 3.0, 5.0), (1.0,), (-0.25, 2.0, 2.0, 2.0)])
def test_each_backward_gives_its_scale_times_the_gradient(scales):
    ns, model, x, y = _model_and_batch(5, 2)
    values = dict({name: p.detach().clone() for name, p in model.named_weights()}, X=x, Y=y)
    values = {k: (v.reshape(1, -1) if v.dim() == 1 else v) for k, v in values.items()}
    want = ns["grads"](values)  # G_W^t unscaled: dL/dW = -G
    ns["_SEED"][0] = 1.0
    for c in scales:
        model.zero_grad(set_to_none=True)
        (c * model(X=x, Y=y)).backward()
        for name, param in model.named_weights():
            expect = (-c * want[name]).reshape(param.shape)
            err = float((param.grad - expect).abs().max())
            assert err <= 1e-12 * max(1.0, float(expect.abs().max())), (name, c, err)
        assert ns["_SEED"][0] == -c  # the next step's guess


def test_the_mean_of_a_training_loop_scales_nothing_after_its_first_step(monkeypatch):
    ns, model, x, y = _model_and_batch(6, 3)
    calls = []
    real = torch._foreach_mul_
    monkeypatch.setattr(torch, "_foreach_mul_", lambda xs, c: (calls.append(len(xs)), real(xs, c)))
    ns["_SEED"][0] = 1.0
    for _ in range(3):
        calls.clear()
        model.zero_grad(set_to_none=True)
        (model(X=x, Y=y) / x.numel()).backward()
    # the last step: the products made their gradients times -1/18 already; only the others
    # (the layer norm's gain and bias, the embedding's and position's, ...) were multiplied
    assert len(ns["SEEDED"]) >= 6 and calls == [len(set(ns["WEIGHTS"]) - ns["SEEDED"])]
