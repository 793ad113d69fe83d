"""The normal form: sum over W of trace(G_W d(W)), checked structurally and numerically.

Oracle: for E = Y - F and L = 1/2 ||E||^2, form(E) = -trace(E^t dE) = -dL, so along any direction
D of the weights, sum_W trace(G_W D_W) must equal minus the central finite difference of L. The
finite differences use only evaluation (numpy), never the rules.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fdsl
from fdsl.calculus.forms import coeff, form, weights
from fdsl.core import printers
from fdsl.core import terms as T
from fdsl.numbers.numpy_eval import evaluate

ROOT = Path(__file__).resolve().parent.parent
# the declarations and definitions, without E (:= since the examples name it) and what follows
HEADER = re.split(r"\nE :?= ", (ROOT / "examples" / "encoder2.fd").read_text())[0]
REL_TOL = 1e-6  # relative error of the symbolic derivative against finite differences


def program(L):
    return fdsl.parse(HEADER + "\nE := Y - encoder(%d)\n" % L)


def check_normal_form(w):
    """The conditions of issue 3, on every summand."""
    seen = []
    for s in T.summands(w):
        c, rest = T.coefficient(s)
        assert rest.op == "trace", s
        word = T.factors(rest.args[0])
        last = word[-1]
        assert last.op == "d" and last.args[0].op == "sym", s  # the differential is the last factor
        assert last.args[0].data[0].kind == "weight"
        for f in word[:-1]:
            assert not f.has_d, s  # G has no d, so no d sits inside a function argument
        seen.append(last.args[0])
    assert len(seen) == len(set(seen)), "one term per weight after collect"
    keys = [(x.data[0].name, x.data[0].index) for x in seen]
    assert keys == sorted(keys), "terms are ordered by weight name, then index"
    return seen


@pytest.mark.parametrize("L", [1, 2, 3])
def test_normal_form_of_the_composition_encoder(L):
    p = program(L)
    w = p.apply_rules("normal", form(p["E"]))
    names = {x.data[0].printed() for x in check_normal_form(w)}
    expected = {"%s_%d" % (n, i) for n in "QKVWbf" for i in range(L)}
    assert names == expected  # exactly the 6L weights


def _values(p, w, seed):
    rng = np.random.default_rng(seed)
    dims = dict(p.dims)
    vals = {"X": rng.standard_normal((8, 6)), "Y": rng.standard_normal((8, 6))}
    for W in weights(w):
        r, c = (dims[x] if isinstance(x, str) else x for x in W.shape)
        vals[W.data[0].printed()] = rng.standard_normal((r, c)) / np.sqrt(r)
    return vals, dims


@pytest.mark.parametrize("L", [1, 2, 3])
def test_normal_form_is_the_derivative_of_the_loss(L):
    p = program(L)
    E = p["E"]
    w = p.apply_rules("normal", form(E))
    vals, dims = _values(p, w, seed=L)
    rng = np.random.default_rng(100 + L)
    direction = {k: rng.standard_normal(v.shape) for k, v in vals.items() if k not in ("X", "Y")}

    def loss(v):
        e = evaluate(E.args[0], v, dims)
        return 0.5 * float(np.sum(e * e))

    h = 1e-6
    plus = {k: v + h * direction[k] if k in direction else v for k, v in vals.items()}
    minus = {k: v - h * direction[k] if k in direction else v for k, v in vals.items()}
    fd = (loss(plus) - loss(minus)) / (2 * h)
    symbolic = sum(float(np.trace(evaluate(coeff(w, W), vals, dims) @ direction[W.data[0].printed()]))
                   for W in weights(w))
    assert abs(-symbolic - fd) <= REL_TOL * abs(fd)


@pytest.mark.parametrize("text, expected, shown", [
    # (form of, normal form, as show prints it: one weight per line, dW: G) for small programs:
    # table-driven, read off by hand
    ("A W", "trace(-W^t A^t A dW)", "dW: -W^t A^t A"),
    ("A W + B", "trace(-(A W + B)^t A dW)", "dW: -(A W + B)^t A"),
    ("W A W", "trace((-A W W^t A^t W^t - W^t A^t W^t W A) dW)", "dW: -A W W^t A^t W^t - W^t A^t W^t W A"),
])
def test_small_normal_forms(text, expected, shown):
    p = fdsl.parse("dim n\nconst A : n x n, B : n x n\nweight W : n x n\nx = " + text)
    w = p.apply_rules("expanded", form(p["x"]))
    assert printers.text(w) == expected
    assert str(w) == shown


def test_manual_walkthrough_runs_through_the_cli():
    r = subprocess.run([sys.executable, "-m", "fdsl.cli", "run", "examples/manual.fd"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[3] == "-trace(E^t dE)"  # form(E), E named, and bound here (its first show) only
    assert out[4:6] == ["where", "  E := Y"] and out[6].startswith("       - (m(a(s X_1 Q_1")
    assert sum(line.startswith("  E := ") for line in out) == 1
    out = out[:4] + out[7:]
    # the first line of each show (the others are its where block: a repeat is bound as S_1)
    heads = [line for line in out if line != "where" and not line.startswith(" ")]
    assert heads[4] == "24"  # len(z)
    # z[19]: dK_0 trapped in the second argument of mm, then flipped out, then last
    assert "mm(" in heads[5] and "dK_0^t" in heads[5].split("mm(", 1)[1]
    assert heads[7].endswith("X_0 dK_0)") and "dK_0" not in heads[7][:-10]
    # the shared normal form: the path runs through F_0, the first layer's value, used twice
    assert out[-2] == "true, via F_0 > m(...) > a(...) > Q_0"


def test_depends_answers_false_when_the_weight_is_absent():
    # the manual's reading: the error E is a known matrix (a constant), the weights are not
    p = fdsl.parse(HEADER + "\nconst E0 : n x d\nw = normal(trace(E0^t d(encoder(2))))\n")
    w = p["w"]
    assert not fdsl.calculus.forms.depends(coeff(w, p.expr("f[1]")), p.expr("Q[0]"))
    dep = fdsl.calculus.forms.depends(coeff(w, p.expr("W[1]")), p.expr("Q[0]"))
    assert dep and dep.show().startswith("true, via ") and dep.show().endswith("Q_0")
