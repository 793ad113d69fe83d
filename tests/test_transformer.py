"""Issue 12, the transformer: examples/gpt.fd against torch autograd, one pre-LN block against
torch.nn.TransformerEncoderLayer with its weights copied in, Hessian-vector products of relu,
softmax, layer norm and GELU networks against torch's double backward, and the numbers of the
causal mask and of log-softmax. Float64; relative error at most 1e-8 of the largest gradient."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from oracle import symbol_values

import fdsl
from fdsl.codegen import grads as numpy_grad
from fdsl.numbers.numpy_eval import evaluate

torch = pytest.importorskip("torch")
F = torch.nn.functional
ROOT = Path(__file__).resolve().parent.parent
TOL = 1e-8


def _close(got: dict, want: dict) -> float:
    """max |got - want| over every weight, relative to the largest entry of want."""
    assert set(got) == set(want), (sorted(got), sorted(want))
    scale = max(float(np.max(np.abs(w))) for w in want.values())
    return max(float(np.max(np.abs(np.reshape(got[k], np.shape(want[k])) - want[k]))) for k in want) / scale


def _tensors(values: dict) -> dict:
    return {k: torch.tensor(np.asarray(v, dtype=np.float64), requires_grad=True) for k, v in values.items()}


def _grads(loss, leaves: dict, names) -> dict:
    gs = torch.autograd.grad(loss, [leaves[k] for k in names])
    return {k: g.detach().numpy() for k, g in zip(names, gs)}


def _weights(p, w) -> list:
    return [x.data[0].printed() for x in fdsl.calculus.forms.weights(numpy_grad.normal_form(p, w))]


# ---- examples/gpt.fd ----------------------------------------------------------------------------------


def torch_gpt(t: dict, blocks: int, heads: int, k: int):
    """The GPT of examples/gpt.fd written in torch from scratch: its loss L. Given the weights of
    examples/gpt2.fd instead (query, key and value biases bq, bk, bv and an output bias bo per
    block, no temperature tau, no U: the embedding E tied to the unembedding), that GPT's."""
    n = t["X"].shape[0]
    mask = torch.triu(torch.full((n, n), float("-inf"), dtype=torch.float64), diagonal=1)

    def ln(z, g, b):
        return F.layer_norm(z, z.shape[1:], weight=g.reshape(-1), bias=b.reshape(-1), eps=1e-5)

    def biased(x, name):  # + C b, where the model has the bias
        return x + t[name] if name in t else x

    z = t["X"] @ t["E"] + t["P"]
    for i in range(blocks):
        h = ln(z, t["g1_%d" % i], t["b1_%d" % i])
        scale = t["tau_%d" % i].reshape(()) * k ** -0.5 if "tau_%d" % i in t else k ** -0.5
        z = biased(z, "bo_%d" % i)
        for j in range(heads):
            q, kk, v = (biased(h @ t["%s_%d_%d" % (m, i, j)], "b%s_%d_%d" % (m.lower(), i, j)) for m in "QKV")
            att = torch.softmax(scale * q @ kk.T + mask, dim=1)
            z = z + att @ v @ t["O_%d_%d" % (i, j)]
        h = ln(z, t["g2_%d" % i], t["b2_%d" % i])
        z = z + F.gelu(h @ t["W1_%d" % i] + t["c1_%d" % i]) @ t["W2_%d" % i] + t["c2_%d" % i]
    logits = ln(z, t["gf"], t["bf"]) @ (t["U"] if "U" in t else t["E"].T)
    return -(t["Y"] * torch.log_softmax(logits, dim=1)).sum()


@pytest.fixture(scope="module")
def gpt():
    return fdsl.load(ROOT / "examples" / "gpt.fd")


def test_gpt_gradients_match_torch_autograd(gpt):
    p = gpt
    w = p["w"]
    names = _weights(p, w)
    assert "tau_0" in names and "tau_1" in names and "Q_1_1" in names and len(names) == 5 + 2 * 17
    got = numpy_grad.gradients(p, w)  # -dL/dW, through the generated code
    values = symbol_values(p, p["L"])
    t = _tensors(values)
    loss = torch_gpt(t, blocks=2, heads=2, k=4)
    assert abs(loss.item() - evaluate(p["L"], values, p.dims)[0, 0]) <= 1e-12 * abs(loss.item())
    want = {k: -g for k, g in _grads(loss, t, names).items()}
    assert got["tau_0"].shape == ()
    assert _close(got, want) <= TOL


def test_the_gpt_written_naturally_grows_linearly_and_has_the_same_gradients(gpt):
    source = (ROOT / "examples" / "gpt.fd").read_text().split("L = -trace")[0]
    natural = source.replace("gpt(L) := mlp", "gpt(L) = mlp")
    assert natural != source
    sizes, grads = {}, {}
    for how, text in (("named", source), ("natural", natural)):
        for depth in (2, 4, 8):
            p = fdsl.parse(text + "L = -trace(Y^t logsoftmax(ln(gpt(%d), gf, bf) U))\nw = -d(L)\nrandom 0\n" % depth,
                           base_dir=ROOT / "examples")
            sizes[how, depth] = fdsl.core.terms.dag_size(numpy_grad.normal_form(p, p["w"]))
            if depth == 2:
                grads[how] = numpy_grad.gradients(p, p["w"])
        assert sizes[how, 8] / sizes[how, 4] < 2.1 and sizes[how, 4] / sizes[how, 2] < 2.1, sizes
    assert _close(grads["natural"], grads["named"]) <= 1e-12


def test_fdsl_grad_writes_every_weight_of_the_gpt(tmp_path, run_fdsl, gpt):
    r = run_fdsl("grad", ROOT / "examples" / "gpt.fd", "--form", "w", "--random", "0", "--out", tmp_path / "g.npz")
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "g.npz") as g:
        assert set(g.files) == set(_weights(gpt, gpt["w"])) | {"_sign"}
        assert g["tau_1"].shape == () and g["U"].shape == (8, 7)


def test_training_the_gpt_lowers_its_loss(run_fdsl):
    r = run_fdsl("train", ROOT / "examples" / "gpt.fd", "--form", "w", "--steps", "30", "--lr", "0.05",
                 "--random", "0")
    assert r.returncode == 0, r.stderr
    losses = [float(line.split()[-1]) for line in r.stdout.splitlines() if line.startswith("step")]
    assert len(losses) >= 2 and losses[-1] < 0.5 * losses[0], r.stdout


# ---- one block against torch.nn.TransformerEncoderLayer ------------------------------------------------

BLOCK = """\
dim n = 5, d = 8, k = 4, f = 16
const X : n x d, R : n x d
const C : n x 1 = ones
const M : n x n = causal
scalar s = k^(-1/2)
weight Q[j], K[j], V[j] : d x k, O[j] : k x d, bq[j], bk[j], bv[j] : 1 x k, bo : 1 x d
weight g1, b1, g2, b2, c2 : 1 x d, W1 : d x f, c1 : 1 x f, W2 : f x d
ln(Z, g, b) = layernorm(Z) * (C g) + C b
head(j, Z) = a(s (Z Q[j] + C bq[j]) (Z K[j] + C bk[j])^t + M) (Z V[j] + C bv[j]) O[j]
heads(0, Z) = head(0, Z)
heads(j, Z) = heads(j-1, Z) + head(j, Z)
Z1 = X + heads(1, ln(X, g1, b1)) + C bo
F = Z1 + gelu(ln(Z1, g2, b2) W1 + C c1) W2 + C c2
L = trace(R^t F)
"""


def test_one_block_matches_torch_transformer_encoder_layer():
    torch.manual_seed(0)
    n, d, h, f = 5, 8, 2, 16
    k = d // h
    layer = torch.nn.TransformerEncoderLayer(d, h, dim_feedforward=f, dropout=0.0, activation="gelu",
                                             norm_first=True, batch_first=True).double()
    with torch.no_grad():  # not the default gains and biases: every parameter matters
        for param in layer.parameters():
            param.add_(0.3 * torch.randn_like(param))
    rng = np.random.default_rng(1)
    x, r = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    mask = torch.nn.Transformer.generate_square_subsequent_mask(n, dtype=torch.float64)
    out = layer(torch.tensor(x)[None], src_mask=mask)[0]
    loss = (torch.tensor(r) * out).sum()
    loss.backward()

    a = lambda t: t.detach().numpy().copy()  # noqa: E731
    sa = layer.self_attn
    w_in, b_in, w_out = a(sa.in_proj_weight), a(sa.in_proj_bias), a(sa.out_proj.weight)
    g_in, gb_in, g_out = a(sa.in_proj_weight.grad), a(sa.in_proj_bias.grad), a(sa.out_proj.weight.grad)
    values, want = {"X": x, "R": r}, {}
    for j in range(h):
        cols = slice(j * k, (j + 1) * k)
        for m, part in zip("QKV", range(3)):
            rows = slice(part * d, (part + 1) * d)
            values["%s_%d" % (m, j)] = w_in[rows].T[:, cols]
            want["%s_%d" % (m, j)] = g_in[rows].T[:, cols]
            values["b%s_%d" % (m.lower(), j)] = b_in[rows][cols].reshape(1, k)
            want["b%s_%d" % (m.lower(), j)] = gb_in[rows][cols].reshape(1, k)
        values["O_%d" % j], want["O_%d" % j] = w_out.T[cols], g_out.T[cols]
    pairs = {"bo": sa.out_proj.bias, "g1": layer.norm1.weight, "b1": layer.norm1.bias,
             "g2": layer.norm2.weight, "b2": layer.norm2.bias, "c1": layer.linear1.bias,
             "c2": layer.linear2.bias}
    for name, param in pairs.items():
        values[name], want[name] = a(param).reshape(1, -1), a(param.grad).reshape(1, -1)
    for name, lin in (("W1", layer.linear1), ("W2", layer.linear2)):
        values[name], want[name] = a(lin.weight).T, a(lin.weight.grad).T

    p = fdsl.parse(BLOCK)
    assert abs(evaluate(p["L"], values, p.dims)[0, 0] - loss.item()) <= 1e-12 * abs(loss.item())
    grads = fdsl.codegen.generated.compile_gradients(numpy_grad.normal_form(p, p.expr("d(L)")), p.dims)(values)
    assert _close(grads, want) <= TOL


# ---- Hessian-vector products ------------------------------------------------------------------------

HVP_HEAD = """\
dim n = 5, d = 4, h = 3
const X : n x d, Y : n x h, D : d x h
weight W1 : d x h, W2 : h x h, W3 : d x h
"""
NETWORKS = {  # F, and the same in torch
    "relu": ("m(X W1) W2", lambda t: torch.relu(t["X"] @ t["W1"]) @ t["W2"]),
    "softmax": ("a(X W1 W3^t X^t) X W1 W2",
                lambda t: torch.softmax(t["X"] @ t["W1"] @ t["W3"].T @ t["X"].T, dim=1) @ t["X"] @ t["W1"] @ t["W2"]),
    "layer norm": ("layernorm(X W1) W2 + X W3",
                   lambda t: F.layer_norm(t["X"] @ t["W1"], (3,), eps=1e-5) @ t["W2"] + t["X"] @ t["W3"]),
    "gelu": ("gelu(X W1) W2 + gelu(X W3)", lambda t: F.gelu(t["X"] @ t["W1"]) @ t["W2"] + F.gelu(t["X"] @ t["W3"])),
}


@pytest.mark.parametrize("name", list(NETWORKS))
def test_hessian_vector_products_match_torch_double_backward(name):
    text, torch_f = NETWORKS[name]
    p = fdsl.parse(HVP_HEAD + "F = %s\nE := Y - F\nL = 1/2 trace(E^t E)\nrandom 3\n" % text)
    hv = p.expr("d(trace(coeff(normal(d(L)), W1) D))")  # the Hessian of L applied to D, as a 1-form
    names = _weights(p, hv)
    values = symbol_values(p, p.expr("trace(D^t D) + L"))
    got = numpy_grad.gradients(p, hv)
    t = _tensors(values)
    e = t["Y"] - torch_f(t)
    loss = 0.5 * (e * e).sum()
    (g1,) = torch.autograd.grad(loss, [t["W1"]], create_graph=True)
    want = _grads((g1 * t["D"]).sum(), t, names)
    assert _close(got, want) <= TOL


# ---- the causal mask and log-softmax -----------------------------------------------------------------


def test_the_causal_mask_keeps_softmax_and_its_gradients_finite():
    p = fdsl.parse("dim n = 5, d = 3\nconst X : n x d, Y : n x d, M : n x n = causal\nweight W : d x d\n"
                   "E := Y - a(X W X^t + M) X\nw = form(E)\nrandom 2\n")
    with warnings.catch_warnings(), np.errstate(over="raise", invalid="raise", divide="raise"):
        warnings.simplefilter("error")
        s = evaluate(p.expr("a(X W X^t + M)"), symbol_values(p, p.expr("X W")), p.dims)
        grads = numpy_grad.gradients(p, p["w"])
    assert np.allclose(np.triu(s, 1), 0) and np.allclose(s.sum(axis=1), 1)
    assert all(np.all(np.isfinite(g)) for g in grads.values())
    m = evaluate(p.expr("M"), {}, p.dims)
    assert np.all(np.tril(m) == 0) and np.all(m[np.triu_indices(5, 1)] == -np.inf)


def test_logsoftmax_is_exact_at_large_logits_and_log_of_softmax_becomes_it():
    p = fdsl.parse("dim n = 2, v = 3\nconst A : n x v, Y : n x v\nweight W : v x v\n")
    big = np.array([[1e4, 0.0, -1e4], [3.0, 3.0, 3.0]])
    got = evaluate(p.expr("logsoftmax(A)"), {"A": big}, p.dims)
    assert np.array_equal(got[0], [0.0, -1e4, -2e4])
    assert np.allclose(got[1], -np.log(3.0), rtol=1e-15)
    w = p.expr("normal(d(trace(Y^t log(a(A W)))))")
    assert "logsoftmax" not in str(w) and "log(" not in str(w)  # d(log(a(.))) went through dlogsoftmax
    values = {"A": big, "Y": np.eye(3)[:2], "W": np.eye(3)}
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        g = numpy_grad.gradients(p, w, values)["W"]
    assert np.all(np.isfinite(g))


def test_the_torch_target_computes_the_gpts_gradients_too(gpt, tmp_path):
    from fdsl.codegen import generated as codegen

    w = numpy_grad.normal_form(gpt, gpt["w"])
    values = symbol_values(gpt, gpt["L"])
    want = numpy_grad.gradients(gpt, w, values)
    namespace: dict = {}
    exec(compile(codegen.gradients_source(w, gpt.dims, target="torch"), "<torch gpt>", "exec"), namespace)
    got = namespace["grads"]({k: torch.tensor(v) for k, v in values.items()})
    assert _close({k: g.numpy() for k, g in got.items()}, want) <= 1e-12
