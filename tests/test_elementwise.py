"""Issue 12, first part: scalar weights, componentwise functions, division, broadcasting and row
reductions, each held against central finite differences in float64 (the oracle of tests/oracle.py:
evaluation only, never the rules).

A loss L (a scalar term) is written in fdsl; its 1-form ``d(L)`` is brought to a normal form by the
stdlib rules, and the gradients (generated code, and the interpreter over the normal form) must
match the finite-difference gradient of L to 1e-8 of the largest gradient.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracle import gradient, symbol_values

import fdsl
from fdsl.calculus.forms import weights
from fdsl.codegen import grads as numpy_grad
from fdsl.core import printers
from fdsl.numbers.numpy_eval import Evaluator, evaluate

HEAD = """\
dim n = 4, d = 3, h = 5
const X : n x d, Y : n x h, R : 1 x h = ones
weight W, U : d x h, V : h x h, g : scalar, tau[i] : scalar
"""

LOSSES = {
    "exp": "L = trace(Y^t exp(X W) V)",
    "log": "L = trace(Y^t log(1 + X W * X W) V)",
    "sqrt": "L = trace(Y^t sqrt(exp(X W)) V) + trace(Y^t sqrt(2 + tanh(X U)))",
    "tanh": "L = trace(Y^t tanh(X W) V)",
    "sigmoid": "L = trace(Y^t sigmoid(X W) V)",
    "gelu": "L = trace(Y^t gelu(X W) V)",
    "division": "L = trace(Y^t (X W / (2 + exp(X U))) V)",
    "division by a weight": "L = trace(Y^t (1 / (3 + tanh(X U))))",
    "broadcast": "L = trace(Y^t (1 - sigmoid(X W) + g)) + trace(Y^t (2 g - X U))",
    "scalar weights": "L = trace(Y^t (g X W + tau[0] tanh(X U) V)) + tau[1] tau[0] trace(Y^t X W)",
    "scalar weight inside": "L = trace(Y^t exp(g X W)) + trace(Y^t gelu(tau[2] X U / 2))",
    "rowsum": "L = trace(Y^t rowsum(X W * X W) R) + trace(rowsum(tanh(X U))^t rowsum(Y))",
    "rowmean": "L = trace(Y^t rowmean(sigmoid(X W)) R)",
    "rowvar": "L = trace(rowvar(X W V)^t rowmean(Y)) + trace(Y^t rowvar(X U) R)",
    "layer norm by hand": "A = X W\nL = trace(Y^t ((A - rowmean(A) R) / (sqrt(rowvar(A) + 1/100000) R)) V)",
}


def _program(body: str, seed: int = 0):
    return fdsl.parse(HEAD + body + "\nrandom %d\n" % seed)


def _fd_gradients(p, loss, names) -> dict:
    values = symbol_values(p, loss)
    for name in names:
        values.setdefault(name, np.array(p.values[name]))
    f = lambda v: evaluate(loss, v, p.dims)[0, 0]
    return values, gradient(f, values, names, h=1e-3)


def _largest_error(got: dict, want: dict) -> float:
    scale = max(float(np.max(np.abs(g))) for g in want.values())
    return max(float(np.max(np.abs(np.asarray(got[k]) - np.asarray(want[k]).reshape(np.shape(got[k])))))
               for k in want) / scale


@pytest.mark.parametrize("name", list(LOSSES))
def test_gradients_match_finite_differences(name):
    p = _program(LOSSES[name], seed=sorted(LOSSES).index(name))
    loss = p["L"]
    w = p.expr("d(L)")
    normal = numpy_grad.normal_form(p, w)
    names = [x.data[0].printed() for x in weights(normal)]
    assert names, "the loss involves no weight"
    values, want = _fd_gradients(p, loss, names)
    generated = numpy_grad.gradients(p, w)  # the generated code of fdsl codegen
    ev = Evaluator(values, p.dims)  # and the interpreter, over the coefficients of the normal form
    interpreted = {x.data[0].printed(): ev.value(g).T for x, g in numpy_grad.coefficients(p, normal).items()}
    assert set(generated) == set(want) == set(interpreted)
    assert _largest_error(generated, want) <= 1e-8, name
    assert _largest_error(interpreted, want) <= 1e-8, name


def test_a_scalar_weight_commutes_and_its_gradient_is_a_number():
    p = _program("L = trace(Y^t X W g) + g tau[0] trace(Y^t X U)")
    assert str(p["L"]) == "trace(g Y^t X W) + g tau_0 trace(Y^t X U)"
    w = p.expr("normal(d(L))")
    assert str(p.expr("coeff(normal(d(L)), g)")) == "trace(Y^t X W) + trace(tau_0 Y^t X U)"
    grads = numpy_grad.gradients(p, w)
    assert grads["g"].shape == () and grads["W"].shape == (3, 5)
    values, want = _fd_gradients(p, p["L"], ["g", "W"])
    assert _largest_error(grads, want) <= 1e-8


def test_scalar_weights_in_value_files_are_0d_and_so_are_their_gradients(tmp_path, run_fdsl):
    (tmp_path / "s.fd").write_text(HEAD + "L = trace(Y^t (tau[0] X W))\nw = d(L)\n")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "in.npz", X=rng.standard_normal((4, 3)), Y=rng.standard_normal((4, 5)),
             W=rng.standard_normal((3, 5)), tau_0=np.array(0.5))
    r = run_fdsl("grad", tmp_path / "s.fd", "--form", "w", "--values", tmp_path / "in.npz",
                 "--out", tmp_path / "g.npz")
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "g.npz") as g:
        assert g["tau_0"].shape == () and g["W"].shape == (3, 5)
        with np.load(tmp_path / "in.npz") as v:
            assert np.isclose(g["tau_0"], np.trace(v["Y"].T @ v["X"] @ v["W"]))
            assert np.allclose(g["W"], 0.5 * v["X"].T @ v["Y"])


def test_division_binds_like_hadamard_and_reads_back():
    p = fdsl.parse(HEAD + "A = X W / X U V\nB = 1 + exp(X W)\nC = X W / 2\n")
    a = p["A"]
    assert a.op == "div" and str(a) == "X W / X U V"
    # on one line (text, no bindings): X W, used twice, might be bound by a name another program
    # of this process gave it (share's hints are global)
    assert printers.text(p.expr("X W * X U / X W")) == "X W * X U / X W"
    assert printers.text(p.expr("X W * (X U / X W)")) == "X W * (X U / X W)"
    assert str(p["B"]) == "1 + exp(X W)" and p["C"].op == "mul"
    for name in ("A", "B", "C"):
        assert p.expr(fdsl.core.printers.string(p[name])) is p[name]  # string() reads back


def test_elementwise_values_are_the_functions_they_name():
    p = _program("")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3)) * 3
    vals = {"X": x}
    ev = lambda e: evaluate(p.expr(e), vals, p.dims)
    from math import erf

    assert np.allclose(ev("gelu(X)"), x * 0.5 * (1 + np.vectorize(erf)(x / np.sqrt(2))), rtol=1e-14, atol=1e-15)
    assert np.allclose(ev("sigmoid(X)"), 1 / (1 + np.exp(-x)), rtol=1e-14)
    assert np.allclose(ev("rowvar(X)"), x.var(axis=1, keepdims=True))
    assert np.allclose(ev("rowmean(X) - 1"), x.mean(axis=1, keepdims=True) - 1)
    assert np.allclose(ev("X / (2 + X * X)"), x / (2 + x * x))
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no overflow for large arguments
        big = {"X": np.array([[-800.0, 0.0, 800.0]] * 4)}
        assert np.array_equal(evaluate(p.expr("sigmoid(X)"), big, p.dims)[0], [0.0, 0.5, 1.0])


def test_the_shape_of_a_declaration_is_rows_x_cols_or_scalar(tmp_path, run_fdsl):
    (tmp_path / "bad.fd").write_text("weight g : const\n")
    r = run_fdsl("run", tmp_path / "bad.fd")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "a shape is rows x cols or scalar, not 'const'" in r.stderr
    p = fdsl.parse("const c : scalar\nweight g[i] : scalar\nshow g[3] c\n")
    assert p.expr("g[3]").scalar and p.expr("c").scalar and p.expr("d(g[3])").scalar
