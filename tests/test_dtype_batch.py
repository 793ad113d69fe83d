"""Generated numpy code at training scale: it computes in the dtype of its inputs (float32 held
against float64), ``--dtype`` forces one, and constants that vary per example take a leading batch
axis whose gradients are the sum of the examples' (held against the examples one by one, and the
interpreter on each); ``fdsl grad`` and ``fdsl train`` take such batches from a values file.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracle import max_rel_error, weight_values
from test_codegen import EXACT, ROOT, errors, interpreted, program, shared

import fdsl
from fdsl.base.errors import FdslError
from fdsl.calculus.forms import form, weights
from fdsl.calculus.gradients import error_of
from fdsl.cli import main
from fdsl.codegen import generated as codegen

# float32 against float64 (unit roundoff 6e-8): the whole gradient to F32, each weight to F32_EACH
# against its own size or, when that is smaller, 1e-3 of the largest (test_codegen.errors)
F32, F32_EACH = 1e-5, 1e-3


def whole(got, want) -> float:
    """||got - want|| / ||want|| over all the weights together."""
    num = sum(float(np.sum((np.asarray(got[k], dtype=np.float64) - want[k]) ** 2)) for k in want)
    return (num / sum(float(np.sum(v ** 2)) for v in want.values())) ** 0.5


def batch_values(p, w, batch, seed):
    """Weights as the codegen tests draw them, and ``batch`` examples of X0 and Y."""
    vals = weight_values(p, weights(w), seed=seed)
    rng = np.random.default_rng(seed + 100)
    vals["X0"] = rng.standard_normal((batch, 8, 6))
    vals["Y"] = rng.standard_normal((batch, 8, 6))
    return vals


def example(vals, i):
    return dict(vals, X0=vals["X0"][i], Y=vals["Y"][i])


def test_float32_inputs_are_computed_in_float32_close_to_float64():
    p = program(3)
    w = shared(p)
    grads = codegen.compile_gradients(w, p.dims)
    vals = weight_values(p, weights(w), seed=3)
    vals32 = {k: v.astype(np.float32) for k, v in vals.items()}
    got = grads(vals32)
    assert {g.dtype for g in got.values()} == {np.dtype(np.float32)}
    exact = grads({k: v.astype(np.float64) for k, v in vals32.items()})  # the same inputs, float64
    assert {g.dtype for g in exact.values()} == {np.dtype(np.float64)}
    assert whole(got, exact) <= F32
    assert max(errors(got, exact).values()) <= F32_EACH
    assert whole(got, exact) > 1e-10  # really computed in float32
    mixed = grads(dict(vals32, X0=vals["X0"]))  # one float64 input: float64
    assert {g.dtype for g in mixed.values()} == {np.dtype(np.float64)}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dtype_can_be_forced(dtype):
    p = program(2)
    w = shared(p)
    namespace = codegen.compile_namespace(codegen.gradients_source(w, p.dims, dtype=dtype))
    vals = weight_values(p, weights(w), seed=4)
    for given in (np.float32, np.float64):
        got = namespace["grads"]({k: v.astype(given) for k, v in vals.items()})
        assert {g.dtype for g in got.values()} == {np.dtype(dtype)}
    with pytest.raises(FdslError, match="unknown dtype"):
        codegen.gradients_source(w, p.dims, dtype="float16")


@pytest.mark.parametrize("L, batch", [(1, 3), (3, 4)])
def test_a_batch_gives_the_sum_of_the_examples_gradients(L, batch):
    p = program(L)
    w = shared(p)
    grads = codegen.compile_gradients(w, p.dims, error_of(p["w"]))
    vals = batch_values(p, w, batch, seed=L)
    got, loss = grads.with_loss(vals)
    singles = [grads.with_loss(example(vals, i)) for i in range(batch)]
    want = {k: sum(g[k] for g, _ in singles) for k in got}
    assert max(errors(got, want).values()) <= EXACT
    assert abs(loss - sum(l for _, l in singles)) <= EXACT * loss
    # each example against the interpreter: the batch is the sum of independent oracles too
    oracle = {k: sum(interpreted(p, w, example(vals, i))[k] for i in range(batch)) for k in got}
    assert max(errors(got, oracle).values()) <= EXACT


def test_a_part_no_example_changes_counts_once_per_example():
    # w = form(E) + form(Q): the gradient -Q of form(Q) does not depend on the data
    p = fdsl.parse("dim n = 5, d = 3\nconst X : n x d, Y : n x d\nweight Q : d x d\n"
                   "E := Y - X Q\nw = form(E) + form(Q)\n")
    w = p.apply_rules("backprop", p["w"])
    grads = codegen.compile_gradients(w, p.dims)
    rng = np.random.default_rng(0)
    vals = {"X": rng.standard_normal((4, 5, 3)), "Y": rng.standard_normal((4, 5, 3)),
            "Q": rng.standard_normal((3, 3))}
    got = grads(vals)["Q"]
    want = sum(grads({"X": vals["X"][i], "Y": vals["Y"][i], "Q": vals["Q"]})["Q"] for i in range(4))
    assert np.allclose(got, want, rtol=1e-12, atol=0)


def test_batches_that_do_not_fit_are_errors():
    p = program(1)
    w = shared(p)
    grads = codegen.compile_gradients(w, p.dims)
    vals = batch_values(p, w, 3, seed=0)
    with pytest.raises(FdslError, match=r"different batch sizes: \[2, 3\]"):
        grads(dict(vals, Y=vals["Y"][:2]))
    with pytest.raises(FdslError, match="Q_0 has shape"):  # weights have no batch axis
        grads(dict(vals, Q_0=np.stack([vals["Q_0"]] * 3)))
    with pytest.raises(FdslError, match="X0 has shape"):
        grads(dict(vals, X0=vals["X0"][:, :, :5]))


def _values_file(path, vals):
    np.savez(path, **vals)
    return str(path)


def test_fdsl_grad_sums_a_batch_from_a_values_file(tmp_path, capsys):
    fd = ROOT / "examples" / "encoder2.fd"
    p = fdsl.load(str(fd))
    rng = np.random.default_rng(5)
    vals = {"X": rng.standard_normal((3, 8, 6)), "Y": rng.standard_normal((3, 8, 6))}
    for W in weights(p.apply_rules("backprop", form(p["E"]))):
        r, c = (p.dims[x] if isinstance(x, str) else x for x in W.shape)
        vals[W.data[0].printed()] = rng.standard_normal((r, c)) / np.sqrt(r)
    outs = []
    for i, v in enumerate([vals] + [dict(vals, X=vals["X"][i], Y=vals["Y"][i]) for i in range(3)]):
        out = tmp_path / ("g%d.npz" % i)
        assert main(["grad", str(fd), "--form", "w", "--values", _values_file(tmp_path / ("v%d.npz" % i), v),
                     "--out", str(out)]) == 0
        with np.load(out) as f:
            outs.append({k: f[k] for k in f.files if k != "_sign"})
    assert max_rel_error(outs[0], {k: sum(o[k] for o in outs[1:]) for k in outs[0]}) <= EXACT
    capsys.readouterr()
    bad = dict(vals, Y=vals["Y"][:2])
    assert main(["grad", str(fd), "--form", "w", "--values", _values_file(tmp_path / "bad.npz", bad),
                 "--out", str(tmp_path / "bad_out.npz")]) == 2
    assert "different batch sizes" in capsys.readouterr().err
    assert not (tmp_path / "bad_out.npz").exists()


def test_fdsl_train_descends_on_a_batch(tmp_path, capsys):
    fd = ROOT / "examples" / "encoder2.fd"
    rng = np.random.default_rng(6)
    p = fdsl.load(str(fd))
    vals = {"X": rng.standard_normal((4, 8, 6)), "Y": rng.standard_normal((4, 8, 6))}
    for W in weights(p.apply_rules("backprop", form(p["E"]))):
        r, c = (p.dims[x] if isinstance(x, str) else x for x in W.shape)
        vals[W.data[0].printed()] = rng.standard_normal((r, c)) / np.sqrt(r)
    path = _values_file(tmp_path / "batch.npz", vals)
    assert main(["train", str(fd), "--form", "w", "--steps", "20", "--lr", "0.005", "--values", path]) == 0
    losses = [float(line.split()[-1]) for line in capsys.readouterr().out.splitlines() if line.startswith("step")]
    # the first loss is the batch's: the sum of the four examples' 1/2 ||E||^2
    first = sum(0.5 * float(np.sum((vals["Y"][i] - _encoder2(vals, vals["X"][i])) ** 2)) for i in range(4))
    assert abs(losses[0] - first) <= 1e-6 * first
    assert losses[-1] < 0.9 * losses[0]


def _encoder2(v, X):
    """examples/encoder2.fd by hand: two layers, s = 4^(-1/2)."""
    for i in range(2):
        A = 0.5 * (X @ v["Q_%d" % i]) @ (X @ v["K_%d" % i]).T
        S = np.exp(A - A.max(axis=1, keepdims=True))
        S /= S.sum(axis=1, keepdims=True)
        X = np.maximum(S @ X @ v["V_%d" % i] + v["b_%d" % i], 0.0) @ v["W_%d" % i] + v["f_%d" % i]
    return X


def test_eval_refuses_a_batch(tmp_path, capsys):
    fd = tmp_path / "b.fd"
    fd.write_text("dim n = 8, d = 6\nconst X : n x d\nweight Q : d x d\nshow eval(X Q)\n")
    rng = np.random.default_rng(0)
    path = _values_file(tmp_path / "v.npz", {"X": rng.standard_normal((2, 8, 6)), "Q": np.eye(6)})
    assert main(["run", str(fd), "--values", path]) == 2
    assert "X holds a batch of 2 examples: eval works on one example" in capsys.readouterr().err
