"""The shared (reverse-mode) normal form: linear in depth, the same numbers as the expanded form,
the derivative of the loss (finite differences in float64), and readable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from oracle import weight_values

import fdsl
from fdsl.calculus.forms import coeff, form, weights
from fdsl.core import terms as T
from fdsl.numbers.numpy_eval import Evaluator

ROOT = Path(__file__).resolve().parent.parent
HEADER = (ROOT / "examples" / "deep.fd").read_text().split("\nE := ")[0]
REL_TOL = 1e-6  # against central finite differences


def program(L):
    return fdsl.parse(HEADER + "\nE := Y - X(%d)\n" % L)


def test_shared_form_grows_linearly_with_depth():
    sizes = {L: T.dag_size(program(L).apply_rules("backprop", form(program(L)["E"]))) for L in (4, 8, 16)}
    assert sizes[16] - sizes[8] == 2 * (sizes[8] - sizes[4])  # a constant number of nodes per layer


def test_shared_form_is_a_normal_form_of_weights_only():
    p = program(3)
    w = p.apply_rules("backprop", form(p["E"]))
    names = [x.data[0].printed() for x in weights(w)]
    assert names == sorted(names, key=lambda s: (s.split("_")[0], int(s.split("_")[1])))
    assert len(names) == 18
    for s in T.summands(w):
        word = T.factors(s.args[0])
        assert s.op == "trace" and word[-1].op == "d" and not any(f.has_d for f in word[:-1])


@pytest.mark.parametrize("L", [1, 2, 3])
def test_expanded_and_shared_forms_give_the_same_numbers(L):
    p = program(L)
    shared = p.apply_rules("backprop", form(p["E"]))
    expanded = p.apply_rules("expanded", form(p["E"]))
    assert weights(shared) == weights(expanded)
    vals = weight_values(p, weights(shared), seed=L)
    a, b = Evaluator(vals, p.dims), Evaluator(vals, p.dims)
    for W in weights(shared):
        gs, ge = a.value(coeff(shared, W)), b.value(coeff(expanded, W))
        assert np.max(np.abs(gs - ge)) <= 1e-12 * max(1.0, np.max(np.abs(ge)))


@pytest.mark.parametrize("L", [1, 4, 8])
def test_shared_form_is_the_derivative_of_the_loss(L):
    p = program(L)
    E = p["E"]
    w = p.apply_rules("backprop", form(E))
    ws = weights(w)
    vals = weight_values(p, ws, seed=10 + L)
    rng = np.random.default_rng(L)
    direction = {W.data[0].printed(): rng.standard_normal(vals[W.data[0].printed()].shape) for W in ws}

    def loss(v):
        e = Evaluator(v, p.dims).value(E.args[0])
        return 0.5 * float(np.sum(e * e))

    h = 1e-6
    shifted = lambda sign: {k: v + sign * h * direction[k] if k in direction else v for k, v in vals.items()}
    fd = (loss(shifted(1)) - loss(shifted(-1))) / (2 * h)
    ev = Evaluator(vals, p.dims)
    symbolic = -sum(float(np.trace(ev.value(coeff(w, W)) @ direction[W.data[0].printed()])) for W in ws)
    assert abs(symbolic - fd) <= REL_TOL * abs(fd)


def test_deep_example_answers_the_manuals_question():
    r = subprocess.run([sys.executable, "-m", "fdsl.cli", "run", "examples/deep.fd"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "48"  # 6 weights x 8 layers
    # the coefficient of dK_5 is one readable line in X_5 and G_6, then its bindings
    assert out[1].startswith("s Q_5^t X_5^t aa(") and "G_6" in out[1] and len(out[1]) < 200
    assert out[2] == "where"
    bindings = [line.split(" := ")[0].strip() for line in out[3:-2]]
    assert "X_5" in bindings and "G_6" in bindings
    assert out[-2] == "true, via X_5 > m(...) > X_4 > m(...) > a(...) > Q_3"
    assert out[-1].startswith("true, via ") and out[-1].endswith("Q_5")
