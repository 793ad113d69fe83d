"""Initial values in a weight's declaration (issue 31, item 6): ``weight g : 1 x d = ones``, ``=
zeros``, ``= identity``, ``= normal(STD)`` and ``= normal(MEAN, STD)``, used by ``random`` and
``--random``, by ``eval`` (ones, zeros, identity need no seed), by training, and by the generated
torch ``Model``; a value file replaces them; a shape and its value apply to the names before it
that have neither; a value that is none of these is refused with the list of those that are.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import fdsl
from fdsl.base.errors import FdslError
from fdsl.calculus.gradients import loss_of
from fdsl.codegen import generated as codegen
from fdsl.lang.listing import declarations
from fdsl.numbers.values import evaluate_in, random_values

HEAD = "dim n = 3, d = 4, r = 400, c = 50\n"


def value(program, text, seed=None):
    if seed is not None:
        random_values(program, seed)
    return evaluate_in(program, program.expr(text))


def test_ones_zeros_and_identity_need_no_seed():
    p = fdsl.parse(HEAD + "weight g : 1 x d = ones, b : 1 x d = zeros, I : d x d = identity, t : scalar = ones\n")
    assert (value(p, "g") == 1).all() and value(p, "g").shape == (1, 4)
    assert (value(p, "b") == 0).all()
    assert (value(p, "I") == np.eye(4)).all()
    assert value(p, "t").item() == 1
    assert (value(p, "g", seed=0) == 1).all()  # and a seed does not redraw them


@pytest.mark.parametrize("init, mean, std", [("normal(0.02)", 0, 0.02), ("normal(1/50)", 0, 0.02),
                                             ("normal(1, 0.5)", 1, 0.5), ("normal(-2, c^(-1/2))", -2, 50 ** -0.5)])
def test_a_scaled_normal_draws_with_that_mean_and_deviation(init, mean, std):
    p = fdsl.parse(HEAD + "weight W : r x c = %s, V : r x c\n" % init)
    W = value(p, "W", seed=3)
    assert abs(W.mean() - mean) < 5 * std / (400 * 50) ** 0.5
    assert abs(W.std() / std - 1) < 0.03
    assert abs(value(p, "V").std() * 400 ** 0.5 - 1) < 0.03  # undeclared: normal entries / sqrt(rows)
    again = fdsl.parse(HEAD + "weight W : r x c = %s\n" % init)
    assert (value(again, "W", seed=3) == W).all()  # per symbol and seed, as random draws
    with pytest.raises(FdslError, match=r"W has no value: its initial value normal\(.*\) is drawn by 'random SEED'"):
        value(fdsl.parse(HEAD + "weight W : r x c = %s\n" % init), "W")


def test_families_and_the_names_before_a_shape_take_its_value():
    p = fdsl.parse(HEAD + "weight g1[i], g2[i] : 1 x d = ones, b, b2 : 1 x d = zeros, h : 1 x d, e : 1 x d = ones\n"
                   "const C, D : n x 1 = ones\n")
    for name in ("g1[0]", "g1[3]", "g2[1]", "e"):
        assert (value(p, name) == 1).all(), name
    assert (value(p, "b") == 0).all() and (value(p, "b2") == 0).all()
    assert (value(p, "C") == 1).all() and (value(p, "D") == 1).all()
    with pytest.raises(FdslError, match="h has no value"):  # h has a shape of its own and no value
        value(p, "h")
    assert "weight g1[i] : 1 x d = ones" in declarations(p) and "weight h : 1 x d" in declarations(p)


def test_a_values_file_replaces_the_initial_value(tmp_path):
    path = tmp_path / "v.npz"
    np.savez(path, g=np.full((1, 4), 3.0))
    p = fdsl.parse(HEAD + 'weight g : 1 x d = ones, W : d x d = normal(0.1)\nvalues "%s"\nrandom 0\n' % path)
    assert (value(p, "g") == 3).all()
    assert value(p, "W").std() < 0.5


def test_the_listing_writes_what_was_declared_and_reads_back():
    p = fdsl.parse(HEAD + "weight W : d x d = normal(1/50), U : d x d = normal(1, 0.5), g : 1 x d = ones\n")
    lines = declarations(p)
    assert lines[1:] == ["weight W : d x d = normal(0.02)", "weight U : d x d = normal(1.0, 0.5)",
                         "weight g : 1 x d = ones"]
    again = fdsl.parse("\n".join(lines) + "\n")
    assert [again[n].data[0].init for n in "WUg"] == [p[n].data[0].init for n in "WUg"]


@pytest.mark.parametrize("decl, message, at", [
    ("W : d x d = causal", "a weight's initial value is ones, zeros, identity, normal(STD) or normal(MEAN, STD)",
     "causal"),
    ("W : d x d = normal", "a weight's initial value is ones, zeros, identity", "normal"),
    ("W : d x d = normal(1, 2, 3)", "a weight's initial value is ones, zeros, identity", "normal"),
    ("W : d x d = 2", "a weight's initial value is ones, zeros, identity", "2"),
    ("g : 1 x d = identity", "g = identity needs a square shape, not (1 x d)", "identity"),
    ("W : d x d = normal(-1)", "the standard deviation of normal(...) is a number >= 0, not -1.0", "-1"),
    ("W : d x d = normal(X)", "the arguments of normal(...) in a declaration are numbers", "X"),
])
def test_a_value_a_weight_cannot_start_at_is_refused_at_its_place(decl, message, at):
    with pytest.raises(FdslError, match=re.escape(message)) as e:
        fdsl.parse(HEAD + "const X : d x d\nweight " + decl + "\n", "w.fd")
    assert (e.value.line, e.value.col) == (3, 1 + len("weight ") + decl.index(at, decl.index("=")))


def test_const_keeps_its_own_values_and_says_which():
    with pytest.raises(FdslError, match="a const can be given the value ones, identity or causal"):
        fdsl.parse(HEAD + "const X : d x d = zeros\n")


def test_the_generated_model_starts_where_the_declarations_say():
    torch = pytest.importorskip("torch")
    p = fdsl.parse("dim n = 6, d = 40, c = 30\nconst X : n x d, Y : n x c, C : n x 1 = ones\n"
                   "weight W : d x c = normal(0.02), V : d x c, g : 1 x c = ones, b : 1 x c = zeros, "
                   "I : c x c = identity, t : scalar = ones\n"
                   "E := Y - t (layernorm(X W + X V) * (C g) + C b) I\nw = form(E)\n")
    ns = codegen.compile_namespace(codegen.gradients_source(p.normal_form(p["w"]), p.dims, "t", "torch", None,
                                                            loss_of(p["w"])))
    assert ns["INIT"] == {"W": ("normal", 0.0, 0.02), "g": ("ones",), "b": ("zeros",), "I": ("identity",),
                          "t": ("ones",)}
    model = ns["Model"](dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    w = {name: p.detach() for name, p in model.named_weights()}
    assert (w["g"] == 1).all() and w["g"].shape == (30,) and (w["b"] == 0).all() and w["b"].dtype == torch.float32
    assert (w["I"] == torch.eye(30)).all() and w["t"].shape == () and float(w["t"]) == 1
    assert abs(float(w["W"].std()) / 0.02 - 1) < 0.1
    assert abs(float(w["V"].std()) * 40 ** 0.5 - 1) < 0.1  # undeclared: normal entries / sqrt(rows)
    given = ns["Model"](weights={"g": np.full((1, 30), 2.0)})
    assert (given.weight("g") == 2).all()  # initial values by name replace the declared ones


def test_fdsl_train_and_grad_start_where_the_declarations_say(run_fdsl, tmp_path):
    src = HEAD + ("const X : n x d, Y : n x d, C : n x 1 = ones\nweight W : d x d = normal(0.1), "
                  "g : 1 x d = ones, b : 1 x d = zeros\nE := Y - (layernorm(X W) * (C g) + C b)\nw = form(E)\n")
    path = tmp_path / "ln.fd"
    path.write_text(src)
    r = run_fdsl("grad", path, "--form", "w", "--random", "0", "--out", tmp_path / "g.npz")
    assert r.returncode == 0, r.stderr
    p = fdsl.parse(src)
    random_values(p, 0)
    E = value(p, "E")
    # the gradient of b at b = 0, g = 1 is the column sums of E: E computed with the declared start
    assert np.allclose(np.load(tmp_path / "g.npz")["b"], E.sum(axis=0, keepdims=True))
    assert np.allclose(value(p, "layernorm(X W) * (C g) + C b"), value(p, "layernorm(X W)"))
    r = run_fdsl("train", path, "--form", "w", "--random", "0", "--steps", "2", "--lr", "0.01")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split()[-1] == "%.6e" % (0.5 * float((E * E).sum()))
