"""Issue 21: any scalar loss trains (``w = -d(L)`` gets ``loss``, ``grads_and_loss``, ``FdslLoss``
and ``Model``, numpy and torch, and ``fdsl train`` takes batches of it), named and natural
spellings compute the same work, once, and the lowering's rules for training speed (let names
looked through, fused torch kernels, products sharing an operand as one product, a gradient summed
over the batch inside its product, batches folded on the left) each hold. Float64; gradients
against the numpy module of the same form and torch autograd."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from oracle import symbol_values

import fdsl
from fdsl.codegen import generated as codegen
from fdsl.codegen import grads as numpy_grad
from fdsl.numbers.numpy_eval import evaluate

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rel(got: dict, want: dict) -> float:
    scale = max(float(np.max(np.abs(w))) for w in want.values())
    return max(float(np.max(np.abs(np.asarray(got[k]) - want[k]))) for k in want) / scale


@pytest.fixture(scope="module")
def gpt():
    return fdsl.load(ROOT / "examples" / "gpt.fd")


def _batch(values: dict) -> dict:
    """Two examples: the tokens of examples/gpt_tokens.npz, and the same read backwards."""
    out = dict(values)
    out["X"] = np.stack([values["X"], values["X"][::-1]])
    out["Y"] = np.stack([values["Y"], values["Y"][::-1]])
    return out


def _one(values: dict, b: int) -> dict:
    out = dict(values)
    out["X"], out["Y"] = values["X"][b], values["Y"][b]
    return out


# ---- any scalar loss trains ----------------------------------------------------------------------


def test_a_cross_entropy_gets_loss_and_model_from_the_torch_target(gpt, tmp_path, run_fdsl):
    r = run_fdsl("codegen", ROOT / "examples" / "gpt.fd", "--form", "w", "--target", "torch", "-o", tmp_path / "m.py")
    assert r.returncode == 0, r.stderr
    assert "loss(values), FdslLoss and Model for 39 weights" in r.stdout and "note" not in r.stdout
    module = _import(tmp_path / "m.py", "gpt_torch_loss")
    values = symbol_values(gpt, gpt["L"])
    want = numpy_grad.gradients(gpt, gpt["w"], values)  # -dL/dW
    for batch in (False, True):
        vals = _batch(values) if batch else values
        t = {k: torch.tensor(np.asarray(v, dtype=np.float64)) for k, v in vals.items()}
        weights = [k for k in t if k in module.WEIGHTS]  # the scalar weights tau_0, tau_1 too
        for k in weights:
            t[k].requires_grad_(True)
        loss = module.loss(t)
        loss.backward()
        if batch:  # summed over the batch: the loss and gradients of the two examples, added
            ones = [_one(vals, b) for b in range(2)]
            want_loss = sum(float(evaluate(gpt["L"], v, gpt.dims)[0, 0]) for v in ones)
            grads = [numpy_grad.gradients(gpt, gpt["w"], v) for v in ones]
            want_b = {k: grads[0][k] + grads[1][k] for k in grads[0]}
        else:
            want_loss, want_b = float(evaluate(gpt["L"], vals, gpt.dims)[0, 0]), want
        assert abs(float(loss.detach()) - want_loss) <= 1e-12 * abs(want_loss)
        got = {k: -t[k].grad.numpy() for k in weights}
        assert _rel(got, {k: want_b[k] for k in weights}) <= 1e-12
        with torch.no_grad():
            g, value = module.grads_and_loss(t)  # the same sweep gives both
        assert abs(float(value) - want_loss) <= 1e-12 * abs(want_loss)
    model = module.Model(weights={k: values[k] for k in module.WEIGHTS})  # today's constructor
    assert abs(float(model(X=torch.tensor(values["X"]), Y=torch.tensor(values["Y"])).detach())
               - float(evaluate(gpt["L"], values, gpt.dims)[0, 0])) <= 1e-10


def test_the_numpy_module_of_a_cross_entropy_has_grads_and_loss(gpt, tmp_path, run_fdsl):
    r = run_fdsl("codegen", ROOT / "examples" / "gpt.fd", "--form", "w", "-o", tmp_path / "n.py")
    assert r.returncode == 0, r.stderr
    assert "grads(values), grads_and_loss(values) for 39 weights" in r.stdout
    module = _import(tmp_path / "n.py", "gpt_numpy_loss")
    values = symbol_values(gpt, gpt["L"])
    for vals in (values, _batch(values)):
        g, value = module.grads_and_loss(vals)
        ones = [vals] if np.ndim(vals["X"]) == 2 else [_one(vals, b) for b in range(2)]
        want = sum(float(evaluate(gpt["L"], v, gpt.dims)[0, 0]) for v in ones)
        assert abs(value - want) <= 1e-12 * abs(want)
        assert _rel(g, numpy_grad.gradients(gpt, gpt["w"], vals)) <= 1e-12


def test_a_form_that_is_not_the_differential_of_a_named_loss_says_so(tmp_path, run_fdsl):
    r = run_fdsl("codegen", ROOT / "examples" / "gpt.fd", "--form", "g", "--target", "torch", "-o", tmp_path / "g.py")
    assert r.returncode == 0, r.stderr
    assert "note: g is neither form(E) nor -d(L)" in r.stdout and "no loss, FdslLoss or Model" in r.stdout
    assert "class Model" not in (tmp_path / "g.py").read_text()


def test_fdsl_train_of_a_cross_entropy_takes_a_batch(gpt, tmp_path, run_fdsl):
    # examples/gpt.fd up to w = -d(L), its weights at random; the tokens a batch of two (before,
    # the loss was evaluated by the interpreter, which takes one example: exit 2)
    (tmp_path / "gpt.fd").write_text((ROOT / "examples" / "gpt.fd").read_text().split("g = backprop")[0]
                                     + "random 0\n")
    values = _batch(symbol_values(gpt, gpt["L"]))
    np.savez(tmp_path / "batch.npz", X=values["X"], Y=values["Y"])
    r = run_fdsl("train", tmp_path / "gpt.fd", "--form", "w", "--values", tmp_path / "batch.npz",
                 "--steps", "10", "--lr", "0.02", "--every", "5")
    assert r.returncode == 0, r.stderr
    losses = [float(line.split()[-1]) for line in r.stdout.splitlines() if line.startswith("step")]
    want = sum(float(evaluate(gpt["L"], _one(values, b), gpt.dims)[0, 0]) for b in range(2))
    assert abs(losses[0] - want) <= 1e-5 * want, (losses, want)  # the summed loss, as printed
    assert losses[-1] < losses[0]


# ---- the work of one call: named and natural, forward and one backward ------------------------------


class _Count:
    """The aten calls of a block of torch code, by name."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counts = self.counts = Counter()

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counts[func.overloadpacket.__name__] += 1
                return func(*args, **(kwargs or {}))

        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)

    def products(self) -> int:
        return sum(self.counts[k] for k in ("mm", "bmm", "addmm", "baddbmm", "matmul"))


def _spelled(how: str):
    source = (ROOT / "examples" / "gpt.fd").read_text()
    if how == "natural":
        source = source.replace("gpt(L) := mlp", "gpt(L) = mlp")
    return fdsl.parse(source, base_dir=ROOT / "examples")


@pytest.fixture(scope="module")
def counted():
    """aten counts of one torch grads_and_loss call of gpt.fd, named and natural, and of torch
    autograd's forward and backward of the same loss (tests/test_transformer.py's torch_gpt)."""
    from test_transformer import torch_gpt

    out = {}
    for how in ("named", "natural"):
        p = _spelled(how)
        w = p["w"]
        ns = codegen.compile_namespace(codegen.gradients_source(numpy_grad.normal_form(p, w), p.dims, target="torch",
                                                                loss=fdsl.calculus.gradients.loss_of(w)))
        values = {k: torch.tensor(np.asarray(v, dtype=np.float64)) for k, v in symbol_values(p, p["L"]).items()}
        ns["grads_and_loss"](values)
        with _Count() as c:
            ns["grads_and_loss"](values)
        out[how] = c
    leaves = {k: v.clone().requires_grad_(True) for k, v in values.items()}
    with _Count() as c:
        torch_gpt(leaves, 2, 2, 4).backward()
    out["autograd"] = c
    return out


def test_named_and_natural_spellings_do_the_same_work(counted):
    named, natural = counted["named"].counts, counted["natural"].counts
    for op in ("_softmax", "_log_softmax", "native_layer_norm", "native_layer_norm_backward",
               "_softmax_backward_data", "gelu", "gelu_backward"):
        assert named[op] == natural[op], (op, named[op], natural[op])
    assert counted["named"].products() == counted["natural"].products()


def test_one_call_does_what_the_forward_and_one_backward_need(counted):
    got, auto = counted["named"].counts, counted["autograd"].counts
    # 2 blocks of 2 heads of attention, each block's heads one stacked softmax (torch: stacked_heads),
    # and the log-softmax of the loss, whose derivative is torch's log-softmax backward from it (no
    # softmax of the logits); a layer norm at each of its 5 places, forward and backward; a GELU per
    # block, forward and backward
    assert got["_softmax"] == 2 and got["_log_softmax"] == 1 and auto["_softmax"] == 4
    assert got["_log_softmax_backward_data"] == auto["_log_softmax_backward_data"] == 1
    assert got["native_layer_norm"] == 5 and got["native_layer_norm_backward"] == 5
    assert got["gelu"] == 2 and got["gelu_backward"] == 2
    # the heads' softmax backward, stacked per block (autograd: one per head); tau's gradient reads the
    # scores' adjoint that Q and K need (trace(P aa(A, B)) flipped), not an aa(S, scores) of its own
    assert auto["_softmax_backward_data"] == 4 and got["_softmax_backward_data"] == 2
    assert counted["named"].products() <= counted["autograd"].products(), (counted["named"].products(),
                                                                           counted["autograd"].products())


# ---- the lowering's rules, one by one ---------------------------------------------------------------


def _body(source: str) -> str:
    return source.split("def grads(")[1]


def test_let_names_are_looked_through(tmp_path):
    # layernorm(Z) with Z named and the same body inline: one layer norm, not two
    p = fdsl.parse("dim n = 4, d = 3\nconst X : n x d\nweight W : d x d\nZ := X W\n"
                   "A = layernorm(Z)\nB = layernorm(X W) W\n")
    body = _body(codegen.Lowering({"A": p["A"], "B": p["B"]}, p.dims).source("test"))
    assert body.count("_layernorm(") + body.count("layer_norm(") == 1, body


def test_products_that_share_an_operand_are_one_product():
    p = fdsl.parse("dim n = 6, d = 4, k = 3\nconst X : n x d\nweight Q, K : d x k\nA = X Q\nB = X K\n"
                   "R = Q^t X^t\nS = K^t X^t\n")
    rng = np.random.default_rng(0)
    vals = {"X": rng.standard_normal((6, 4)), "Q": rng.standard_normal((4, 3)), "K": rng.standard_normal((4, 3))}
    for target in ("numpy", "torch"):
        lowering = codegen.Lowering({"A": p["A"], "B": p["B"]}, p.dims, target)
        source = lowering.source("test")
        # outputs are gradients: summed over a batch inside the one product
        lp = ", _lp" if target == "torch" else ""  # torch: the products' dtype under autocast
        assert "_grouped_total(X, (Q, K,), _nb%s)" % lp in _body(source) and " @ " not in _body(source), \
            _body(source)
        ns = codegen.compile_namespace(source)
        got = ns["grads"]({k: torch.tensor(v) for k, v in vals.items()} if target == "torch" else vals)
        assert np.allclose(np.asarray(got["A"]), vals["X"] @ vals["Q"]) and np.allclose(np.asarray(got["B"]),
                                                                                         vals["X"] @ vals["K"])
    source = codegen.Lowering({"R": p["R"], "S": p["S"]}, p.dims).source("test")  # a shared right side
    assert "_grouped_total_rows(" in _body(source), _body(source)
    got = codegen.compile_namespace(source)["grads"](vals)
    assert np.allclose(got["R"], vals["Q"].T @ vals["X"].T) and np.allclose(got["S"], vals["K"].T @ vals["X"].T)


def test_a_product_whose_operand_is_updated_in_place_is_not_moved():
    # G = X W + X V is accumulated in place (G += ...): grouping X W with a later X U must not
    # read a value of G's operands from after the update
    p = fdsl.parse("dim n = 5, d = 4\nconst X : n x d\nweight W, V, U : d x d\n"
                   "G = X W + X V\nH = (X W + X V) U\nK = X U\n")
    rng = np.random.default_rng(2)
    vals = {k: rng.standard_normal((5, 4) if k == "X" else (4, 4)) for k in "XWVU"}
    got = codegen.compile_namespace(codegen.Lowering({"H": p["H"], "K": p["K"], "G": p["G"]}, p.dims)
                                    .source("test"))["grads"](vals)
    g = vals["X"] @ vals["W"] + vals["X"] @ vals["V"]
    assert np.allclose(got["G"], g) and np.allclose(got["H"], g @ vals["U"]) and np.allclose(got["K"],
                                                                                            vals["X"] @ vals["U"])


def test_a_gradient_is_summed_over_the_batch_inside_its_product():
    p = fdsl.parse("dim n = 6, d = 4, k = 3\nconst X : n x d, Y : n x k\nweight W : d x k\nG = X^t Y\nH = X^t X W\n")
    rng = np.random.default_rng(1)
    vals = {"X": rng.standard_normal((5, 6, 4)), "Y": rng.standard_normal((5, 6, 3)), "W": rng.standard_normal((4, 3))}
    for target in ("numpy", "torch"):
        source = codegen.Lowering({"G": p["G"], "H": p["H"]}, p.dims, target).source("test")
        assert "_matmul_total(" in _body(source) or "_grouped_total" in _body(source), _body(source)
        assert "_total(t" not in _body(source).replace("_matmul_total(", "").replace("_grouped_total", "")
        ns = codegen.compile_namespace(source)
        got = ns["grads"]({k: torch.tensor(v) for k, v in vals.items()} if target == "torch" else vals)
        want_g = sum(vals["X"][b].T @ vals["Y"][b] for b in range(5))
        want_h = sum(vals["X"][b].T @ vals["X"][b] @ vals["W"] for b in range(5))
        assert np.allclose(np.asarray(got["G"]), want_g) and np.allclose(np.asarray(got["H"]), want_h)


def test_torch_folds_a_batch_on_the_left_of_a_product():
    # K^t X^t with X a batch: torch computes (X K)^t, one matrix product; numpy as written
    p = fdsl.parse("dim n = 6, d = 4, k = 3\nconst X : n x d\nweight K : d x k\nA = m(K^t X^t)\n")
    torch_body = _body(codegen.Lowering({"A": p["A"]}, p.dims, "torch").source("test"))
    numpy_body = _body(codegen.Lowering({"A": p["A"]}, p.dims, "numpy").source("test"))
    assert "= _matmul(X, K, _lp)" in torch_body and "= X @ K" not in numpy_body, (torch_body, numpy_body)
    rng = np.random.default_rng(3)
    vals = {"X": rng.standard_normal((2, 6, 4)), "K": rng.standard_normal((4, 3))}
    got = codegen.compile_namespace(codegen.Lowering({"A": p["A"]}, p.dims, "torch").source("test"))["grads"](
        {k: torch.tensor(v) for k, v in vals.items()})
    assert np.allclose(got["A"].numpy(), sum(np.maximum(vals["K"].T @ vals["X"][b].T, 0) for b in range(2)))


def test_the_chargpt_trains_in_step_with_the_model_pytorch_users_write():
    # bench/training.py's two models, a few Adam steps: float64 losses to 1e-10 at every step
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import training
    finally:
        sys.path.pop(0)
    module = training.fdsl_module(None)
    ids = training.corpus()
    ours, theirs, diff = training.agreement(module, ids, torch.float64, 4, 2)
    assert diff <= 1e-10, (ours, theirs)
    assert ours[-1] < ours[0]


def test_a_hadamard_factor_of_equal_rows_is_broadcast():
    # (X W) * (C g): g times every row, not the n x d matrix C g made by a product first
    p = fdsl.parse("dim n = 5, d = 3\nconst X : n x d\nconst C : n x 1 = ones\nweight g : 1 x d, W : d x d\n"
                   "A = (X W) * (C g)\nB = (X W)^t * (C g)^t\n")
    rng = np.random.default_rng(4)
    vals = {"X": rng.standard_normal((5, 3)), "W": rng.standard_normal((3, 3)), "g": rng.standard_normal((1, 3))}
    for target in ("numpy", "torch"):
        source = codegen.Lowering({"A": p["A"], "B": p["B"]}, p.dims, target).source("test")
        assert "C @" not in _body(source) and "C.mT" not in _body(source) and "(C," not in _body(source), _body(source)
        got = codegen.compile_namespace(source)["grads"]({k: torch.tensor(v) for k, v in vals.items()}
                                                         if target == "torch" else vals)
        want = (vals["X"] @ vals["W"]) * vals["g"]
        assert np.allclose(np.asarray(got["A"]), want) and np.allclose(np.asarray(got["B"]), want.T)


def test_a_sum_of_products_is_one_product():
    # X A U + X B V (the heads' adjoints G_0 Q_0^t + G_1 Q_1^t + ... are such sums): [X A, X B] [U; V]
    p = fdsl.parse("dim n = 5, d = 4, k = 3\nconst X : n x d\nweight A, B : d x k, U, V : k x d\n"
                   "G = m(X A U + X B V + X)\n")
    rng = np.random.default_rng(5)
    vals = {"X": rng.standard_normal((2, 5, 4)), **{k: rng.standard_normal((4, 3)) for k in "AB"},
            **{k: rng.standard_normal((3, 4)) for k in "UV"}}
    for target in ("numpy", "torch"):
        source = codegen.Lowering({"G": p["G"]}, p.dims, target).source("test")
        assert "_sum_of_products(" in _body(source), _body(source)
        got = codegen.compile_namespace(source)["grads"]({k: torch.tensor(v) for k, v in vals.items()}
                                                         if target == "torch" else vals)
        want = sum(np.maximum(x @ vals["A"] @ vals["U"] + x @ vals["B"] @ vals["V"] + x, 0) for x in vals["X"])
        assert np.allclose(np.asarray(got["G"]), want)


def test_torch_multiplies_two_batches_with_one_bmm():
    # (X W) X^t with X a batch: torch.bmm, not matmul's expand, reshape and view around it
    p = fdsl.parse("dim n = 5, d = 3\nconst X : n x d\nweight W : d x d\nA = m(X W X^t)\n")
    source = codegen.Lowering({"A": p["A"]}, p.dims, "torch").source("test")
    assert "_bmm(" in _body(source), _body(source)
    assert "_bmm(" not in _body(codegen.Lowering({"A": p["A"]}, p.dims, "numpy").source("test"))
    rng = np.random.default_rng(6)
    X, W = rng.standard_normal((3, 5, 3)), rng.standard_normal((3, 3))
    grads = codegen.compile_namespace(source)["grads"]
    for x in (X, X[0]):  # a batch, and one example (then @)
        got = grads({"X": torch.tensor(x), "W": torch.tensor(W)})["A"].numpy()
        want = sum(np.maximum(e @ W @ e.T, 0) for e in (x if x.ndim == 3 else [x]))
        assert np.allclose(got, want)


def test_a_sum_that_extends_an_earlier_sum_adds_to_it():
    # a residual stream: X + X W is summed once, and X + X W - X W V is that sum minus X W V (as
    # the forward adds each layer's output to the last), not X + X W - X W V summed from the start
    p = fdsl.parse("dim n = 5, d = 3\nconst X : n x d\nweight W, V : d x d\nA = m(X + X W)\n"
                   "B = m(X + X W - X W V) + A\n")
    rng = np.random.default_rng(7)
    vals = {"X": rng.standard_normal((2, 5, 3)), "W": rng.standard_normal((3, 3)), "V": rng.standard_normal((3, 3))}
    for target in ("numpy", "torch"):
        source = codegen.Lowering({"A": p["A"], "B": p["B"]}, p.dims, target).source("test")
        body = _body(source)
        assert body.count("X + ") + body.count("+= X\n") == 1 and body.count(" - ") == 1, body
        got = codegen.compile_namespace(source)["grads"]({k: torch.tensor(v) for k, v in vals.items()}
                                                         if target == "torch" else vals)
        a = [np.maximum(x + x @ vals["W"], 0) for x in vals["X"]]
        b = [np.maximum(x + x @ vals["W"] - x @ vals["W"] @ vals["V"], 0) + ai for x, ai in zip(vals["X"], a)]
        assert np.allclose(np.asarray(got["A"]), sum(a)) and np.allclose(np.asarray(got["B"]), sum(b))


def test_a_subtracted_product_joins_the_sum_of_products():
    # X A U - X B V + X: [X A, X B] [U; V] with one side negated, -(L R) = (-L) R
    p = fdsl.parse("dim n = 5, d = 4, k = 3\nconst X : n x d\nweight A, B : d x k, U, V : k x d\n"
                   "G = m(X A U - X B V + X)\n")
    rng = np.random.default_rng(8)
    vals = {"X": rng.standard_normal((2, 5, 4)), **{k: rng.standard_normal((4, 3)) for k in "AB"},
            **{k: rng.standard_normal((3, 4)) for k in "UV"}}
    for target in ("numpy", "torch"):
        source = codegen.Lowering({"G": p["G"]}, p.dims, target).source("test")
        assert "_sum_of_products(" in _body(source) and "(-" in _body(source), _body(source)
        got = codegen.compile_namespace(source)["grads"]({k: torch.tensor(v) for k, v in vals.items()}
                                                         if target == "torch" else vals)
        want = sum(np.maximum(x @ vals["A"] @ vals["U"] - x @ vals["B"] @ vals["V"] + x, 0) for x in vals["X"])
        assert np.allclose(np.asarray(got["G"]), want)


def test_the_chargpt_scales_each_score_adjoint_once():
    # the attention's score adjoints, read by a weight's gradient and by the adjoint below, are
    # scaled by s once for both (shared_scalings), not once in each, and once for all heads: as
    # the stacks of the heads are made into their side-by-side matrix (heads.side_by_side,
    # products_side_by_side: the scale the products' alpha), 2 stacks a block (gradients: the
    # chargpt test)
    from fdsl.calculus.gradients import loss_of

    p = fdsl.load(ROOT / "examples" / "chargpt.fd")
    source = codegen.gradients_source(p.normal_form(p["w"]), p.dims, "test", "torch", loss=loss_of(p["w"]))
    body = source.split("def grads_and_loss(")[1].split("def grads(")[0]
    s = repr(12 ** -0.5)
    backward = body[body.index("_aa_given("):]
    # (less the probabilities a traced graph makes again, whose scores carry s: fdsl.codegen.remade)
    backward = "\n".join(line for line in backward.split("\n") if "is_compiling() else" not in line)
    wide = r"\w+_w = _side_products\(\(\([^()]+, 'L', %s\), \([^()]+, 'U', %s\), \([^()]+, 'U', None\),\)" % (
        (re.escape(s),) * 2)
    assert backward.count(s) == 4 and len(re.findall(wide, backward)) == 2, backward


HEADS = """dim n = 6, d = 16, k = 4
const X : n x d, Y : n x d
scalar s = k^(-1/2)
weight E : d x d, Q[j], K[j], V[j] : d x k, O[j] : k x d
head(j, Z) = a(s Z Q[j] K[j]^t Z^t) Z V[j] O[j]
L = -trace(Y^t logsoftmax(head(0, X E) + head(1, X E)))
w = -d(L)
"""


def _heads_loss(t):
    z = t["X"] @ t["E"]
    out = 0
    for j in range(2):
        scores = torch.softmax(0.5 * z @ t["Q_%d" % j] @ t["K_%d" % j].mT @ z.mT, dim=-1)
        out = out + scores @ z @ t["V_%d" % j] @ t["O_%d" % j]
    return -(t["Y"] * torch.log_softmax(out, dim=-1)).sum()


def _heads_against_autograd(ns, vals):
    """The loss and gradients of the generated module ``ns`` against torch autograd of
    ``_heads_loss``, on the batch of ``vals`` and on its first example."""
    for batch in (vals, {k: v[0] if k in "XY" else v for k, v in vals.items()}):
        t = {k: torch.tensor(v, requires_grad=k not in "XY") for k, v in batch.items()}
        _heads_loss(t).backward()
        with torch.no_grad():
            got, value = ns["grads_and_loss"]({k: v.detach() for k, v in t.items()})
        assert abs(float(value) - float(_heads_loss(t).detach())) <= 1e-12 * abs(float(value))
        for k in t:
            if k not in "XY":
                assert torch.allclose(-got[k], t[k].grad, rtol=1e-9, atol=1e-12), k


def test_torch_does_the_heads_of_an_attention_as_one_stacked_chain():
    # each head's scores, softmax and products are one statement on a stack of the heads (a head
    # axis before the last two), forward and backward; gradients against torch autograd
    from fdsl.calculus.gradients import loss_of

    p = fdsl.parse(HEADS)
    source = codegen.gradients_source(p.normal_form(p["w"]), p.dims, "test", "torch", loss=loss_of(p["w"]))
    body = source.split("def grads_and_loss(")[1].split("def grads(")[0]
    assert "_grouped_heads(" in body and "_h = _softmax(" in body and "_h = _aa_given(" in body, body
    # the heads' softmax is one of the stack, made once (before fdsl.codegen.cse the attention and
    # the logits were made twice: the forward's spelling and the adjoint's, (Z K)^t and K^t Z^t);
    # the log-softmax's backward reads the log-softmax
    assert body.count(" _softmax(") == body.count("_h = _softmax(") == 1, body
    assert body.count("_side_products(") == 1 and body.count("torch.log_softmax(") == 1, body
    numpy_body = _body(codegen.gradients_source(p.normal_form(p["w"]), p.dims, "test", "numpy"))
    assert "stack" not in numpy_body
    ns = codegen.compile_namespace(source)
    rng = np.random.default_rng(12)
    vals = {"X": rng.standard_normal((3, 6, 16)), "Y": rng.random((3, 6, 16)), "E": rng.standard_normal((16, 16)) / 4,
            **{"%s_%d" % (w, j): rng.standard_normal((16, 4)) / 4 for w in "QKV" for j in range(2)},
            **{"O_%d" % j: rng.standard_normal((4, 16)) / 2 for j in range(2)}}
    _heads_against_autograd(ns, vals)


def test_a_gradient_that_sums_an_axis_is_summed_over_the_batch_in_the_same_reduction():
    # a bias's gradient, ones^t A: one reduction over the batch and the rows, not two
    p = fdsl.parse("dim n = 5, d = 3\nconst X : n x d\nconst C : n x 1 = ones\nconst R : 1 x d = ones\n"
                   "A = C^t m(X)\nB = m(X) R^t\n")
    rng = np.random.default_rng(13)
    X = rng.standard_normal((4, 5, 3))
    for target in ("numpy", "torch"):
        source = codegen.Lowering({"A": p["A"], "B": p["B"]}, p.dims, target).source("test")
        assert _body(source).count("_sum_total(") == 2 and ".sum(" not in _body(source), _body(source)
        grads = codegen.compile_namespace(source)["grads"]
        for x in (X, X[0]):
            got = grads({"X": torch.tensor(x)} if target == "torch" else {"X": x})
            r = np.maximum(x, 0).reshape(-1, 5, 3)
            assert np.allclose(np.asarray(got["A"]), r.sum(axis=(0, 1))[None, :])
            assert np.allclose(np.asarray(got["B"]), r.sum(axis=(0, 2))[:, None])


def test_a_trace_of_a_product_is_summed_without_the_product():
    # trace(Y^t logsoftmax(Z)) is the sum of Y o logsoftmax(Z): the v x v product (a bmm of the
    # batch) is never made, numpy and torch, one example and a batch; the loss against evaluate
    from fdsl.calculus.gradients import loss_of

    p = fdsl.parse("dim n = 5, d = 4, v = 6\nconst X : n x d, Y : n x v\nweight W : d x v\n"
                   "L = -trace(Y^t logsoftmax(X W))\nw = -d(L)\n")
    rng = np.random.default_rng(21)
    vals = {"X": rng.standard_normal((3, 5, 4)), "Y": rng.random((3, 5, 6)), "W": rng.standard_normal((4, 6))}
    for target in ("numpy", "torch"):
        source = codegen.gradients_source(p.normal_form(p["w"]), p.dims, "test", target, loss=loss_of(p["w"]))
        body = source.split("def grads_and_loss(")[1].split("def grads(")[0]
        assert "_inner(Y, " in body and "_trace(" not in body and "_bmm(" not in body, body
        ns = codegen.compile_namespace(source)
        for batch in (vals, {k: v[0] if k in "XY" else v for k, v in vals.items()}):
            given = {k: torch.tensor(v) for k, v in batch.items()} if target == "torch" else batch
            _, value = ns["grads_and_loss"](given)
            ones = [batch] if batch["X"].ndim == 2 else [{**batch, "X": batch["X"][b], "Y": batch["Y"][b]}
                                                         for b in range(3)]
            want = sum(float(evaluate(p["L"], v, p.dims)[0, 0]) for v in ones)
            assert abs(float(value) - want) <= 1e-12 * abs(want), (target, float(value), want)


def test_products_that_share_a_factor_read_the_sum_computed_anyway():
    # F A + F C b is F (A + C b) where A + C b is a node of the computation (an MLP's first weight
    # after a layer norm: its gradient is one product); where that sum is not there, it stays
    from fdsl.codegen.factoring import factored
    from fdsl.codegen.lowering import nodes

    p = fdsl.parse("dim n = 4, d = 3\nconst X : n x d, F : d x n, C : n x 1 = ones\nweight b : 1 x d\n"
                   "S = layernorm(X) + C b\nT = F layernorm(X) + F C b\n")
    S, T_ = p["S"], p["T"]
    assert T_.op == "add" and all(x.op == "mul" for x in T_.args), T_
    out = factored(nodes([S, T_]))
    assert out[T_].op == "mul" and out[T_].args[-1] is S, out[T_]
    assert factored(nodes([T_]))[T_] is T_  # no S: nothing to read, nothing changes
    rng = np.random.default_rng(22)
    vals = {"X": rng.standard_normal((4, 3)), "F": rng.standard_normal((3, 4)), "b": rng.standard_normal((1, 3))}
    assert np.allclose(evaluate(out[T_], vals, p.dims), evaluate(T_, vals, p.dims))
    # in the chargpt, every weight's gradient after a layer norm is one product summed over the batch
    from fdsl.calculus.gradients import loss_of

    g = fdsl.load(ROOT / "examples" / "chargpt.fd")
    body = codegen.gradients_source(g.normal_form(g["w"]), g.dims, "test", "torch", loss=loss_of(g["w"]))
    assert "_sum_of_products(" not in body.split("def grads_and_loss(")[1], "a sum of products is left"


def _run(stmts, env):
    from fdsl.codegen import torch_runtime

    ns = {k: getattr(torch_runtime, k) for k in dir(torch_runtime) if k.startswith("_") and not k.startswith("__")}
    ns["torch"] = torch
    ns.update(env)
    for st in stmts:
        exec(st.code, ns)  # noqa: S102 (test-made statements)
    return ns


def test_the_last_mlp_weight_gradient_comes_before_the_first_blocks_adjoint():
    # each result as soon as its operands are known (schedule.early_results, whose unit tests are
    # in test_pass_kernels.py): in the chargpt, the last MLP's weight gradient comes before the
    # first block's adjoint is known
    from fdsl.calculus.gradients import loss_of

    g = fdsl.load(ROOT / "examples" / "chargpt.fd")
    src = codegen.gradients_source(g.normal_form(g["w"]), g.dims, "test", "torch", loss=loss_of(g["w"]))
    lines = src.split("def grads_and_loss(")[1].splitlines()
    w2 = next(i for i, s in enumerate(lines) if "_matmul_total(" in s and "t76" in s.split("=", 1)[1])
    first = next(i for i, s in enumerate(lines) if "_dlayernorm_affine(" in s and "gpt_0" in s)
    assert w2 < first, (w2, first)


def test_an_elementwise_operator_of_transposed_arguments_runs_on_the_stored_arrays():
    # dgelu(A^t, B^t) = dgelu(A, B)^t: computed on A and B as stored, read transposed (a kernel
    # over transposed views is a third slower); the gradients against the numpy module's
    from fdsl.calculus.gradients import loss_of

    p = fdsl.parse("dim n = 5, d = 4, f = 6\nconst X : n x d, Y : n x d\nweight W1 : d x f, W2 : f x d\n"
                   "L = trace((Y - gelu(X W1) W2)^t (Y - gelu(X W1) W2)) / 2\nw = -d(L)\n")
    sources = {t: codegen.gradients_source(p.normal_form(p["w"]), p.dims, "test", t, loss=loss_of(p["w"]))
               for t in ("numpy", "torch")}
    for target, source in sources.items():
        calls = [s for s in source.split("def grads_and_loss(")[1].splitlines() if "_dgelu(" in s]
        args = [c.split("_dgelu(", 1)[1].rstrip(")").split(", ") for c in calls]
        assert args and not any(all(a.endswith(".mT") for a in both) for both in args), (target, calls)
    rng = np.random.default_rng(14)
    vals = {"X": rng.standard_normal((3, 5, 4)), "Y": rng.standard_normal((3, 5, 4)),
            "W1": rng.standard_normal((4, 6)) / 2, "W2": rng.standard_normal((6, 4)) / 2}
    want = numpy_grad.gradients(p, p["w"], {k: v[0] if k in "XY" else v for k, v in vals.items()})
    for target, source in sources.items():
        ns = codegen.compile_namespace(source)
        one = {k: v[0] if k in "XY" else v for k, v in vals.items()}
        got = ns["grads"]({k: torch.tensor(v) for k, v in one.items()} if target == "torch" else one)
        assert _rel({k: np.asarray(v) for k, v in got.items()}, want) <= 1e-12, target


def test_the_loss_alone_under_no_grad_is_the_forward_sweep():
    # evaluation: Model(...) and loss(values) under torch.no_grad() stop once the loss is known
    # (no layer-norm or softmax backward is called), with the same value as a training call
    from fdsl.calculus.gradients import loss_of

    p = fdsl.load(ROOT / "examples" / "chargpt.fd")
    ns = codegen.compile_namespace(codegen.gradients_source(p.normal_form(p["w"]), p.dims, "test", "torch",
                                                            loss=loss_of(p["w"])))
    model = ns["Model"](generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 96, (2, 33), generator=gen)
    X = torch.nn.functional.one_hot(ids[:, :-1], 96).double()
    Y = torch.nn.functional.one_hot(ids[:, 1:], 96).double()
    trained = model(X=X, Y=Y).detach()
    with torch.no_grad(), _Count() as c:
        alone = model(X=X, Y=Y)
    assert abs(float(alone) - float(trained)) <= 1e-12 * abs(float(trained))
    assert c.counts["native_layer_norm_backward"] == 0 and c.counts["_softmax_backward_data"] == 0, c.counts
    assert c.counts["native_layer_norm"] == 5 and c.counts["_log_softmax"] == 1, c.counts
    values = dict(X=X, Y=Y, **dict(model.named_weights()))
    with torch.no_grad():
        assert abs(float(ns["loss"](values)) - float(trained)) <= 1e-12 * abs(float(trained))


def test_heads_whose_values_are_wider_than_their_keys_agree_with_autograd():
    # value heads of another width than the query and key heads: the stacked and side-by-side
    # passes must not cut them evenly; gradients against torch autograd, a batch and one example
    from fdsl.calculus.gradients import loss_of

    p = fdsl.parse(HEADS.replace("dim n = 6, d = 16, k = 4", "dim n = 6, d = 16, k = 4, v = 6")
                   .replace("Q[j], K[j], V[j] : d x k, O[j] : k x d",
                            "Q[j], K[j] : d x k\nweight V[j] : d x v, O[j] : v x d"))
    ns = codegen.compile_namespace(codegen.gradients_source(p.normal_form(p["w"]), p.dims, "test", "torch",
                                                            loss=loss_of(p["w"])))
    rng = np.random.default_rng(15)
    vals = {"X": rng.standard_normal((3, 6, 16)), "Y": rng.random((3, 6, 16)), "E": rng.standard_normal((16, 16)) / 4,
            **{"%s_%d" % (w, j): rng.standard_normal((16, 4)) / 4 for w in "QK" for j in range(2)},
            **{"V_%d" % j: rng.standard_normal((16, 6)) / 4 for j in range(2)},
            **{"O_%d" % j: rng.standard_normal((6, 16)) / 2 for j in range(2)}}
    _heads_against_autograd(ns, vals)


def test_a_sum_spliced_from_a_named_residual_stream_is_lowered():
    # unlet splices a named run of a flat sum into its parent: the run itself is then under no
    # output, and the factoring of sums must not look it up (a KeyError once): gradients of a
    # named residual encoder against the numpy evaluation of its gradient terms
    from fdsl.numbers.numpy_eval import Evaluator

    p = fdsl.parse("dim n = 3\nconst X : n x n, Y : n x n\nweight W[i] : n x n\nv1 = m(X W[0])\n"
                   "v2 = m(v1 W[1]) + X\nv3 := a(v2 W[2]) v2\nv4 = m(v3 W[3])\nv5 = m(v4 W[4]) + v2\n"
                   "E = Y - v5\nw = form(E)\n")  # (hypothesis found it: tests/test_shared.py)
    nf = p.expr("normal(w)")
    rng = np.random.default_rng(16)
    vals = {"X": rng.standard_normal((3, 3)), "Y": rng.standard_normal((3, 3)),
            **{"W_%d" % i: rng.standard_normal((3, 3)) / 2 for i in range(5)}}
    got = codegen.compile_gradients(nf, p.dims)(vals)
    ev = Evaluator(vals, p.dims)
    want = {k: ev.value(t) for k, t in codegen.gradient_terms(nf).items()}
    assert _rel(got, want) <= 1e-12


def test_an_operator_whose_value_is_not_entry_by_entry_is_not_computed_transposed(tmp_path):
    # an operator defined in a rule file by a row-wise body (layernorm) is not elementwise: applied
    # to a product the lowering stores the other way round, it must not be computed on the stored
    # product and read transposed (a silent wrong answer once); against the numpy evaluation
    from fdsl.codegen.lowering import Lowering
    from fdsl.core.ops import OPS

    (tmp_path / "g.rules").write_text("operator g(A) = layernorm(A)\noperator h(A) = 2 tanh(A) * A\n")
    p = fdsl.parse('rules "g.rules"\ndim n = 4, d = 3\nconst X : n x d\nweight W : d x d\n'
                   "F = g(W^t X^t) + 2 g(X W)^t + h(W^t X^t)\n", base_dir=tmp_path)
    shown = {spec.shown: spec.elementwise for spec in OPS.values() if spec.user}
    assert shown["g"] is False and shown["h"] is True, shown
    rng = np.random.default_rng(17)
    vals = {"X": rng.standard_normal((4, 3)), "W": rng.standard_normal((3, 3))}
    for target in ("numpy", "torch"):
        ns = codegen.compile_namespace(Lowering({"F": p["F"]}, p.dims, target).source("test"))
        got = ns["grads"]({k: torch.tensor(v) for k, v in vals.items()} if target == "torch" else vals)["F"]
        assert np.allclose(np.asarray(got), evaluate(p["F"], vals, p.dims), atol=1e-12), target
