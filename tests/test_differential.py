"""Gradients of ordinary models, every way fdsl computes them, against torch autograd and finite
differences (fdsl.verify.differential): the programs of issue 11, on which the generated code was wrong
(a scalar moved onto a vector of ones and dropped when the product became a row sum), a mean-pooling
model, a scaled residual and a centring layer, on sizes where each side of a product is the
smaller one.
"""

from __future__ import annotations

import pytest

from fdsl.verify.differential import check

torch_eval = pytest.importorskip("fdsl.verify.torch_eval")

LOSS = "\nL = trace(E^t E) / 2\n"

SCALED_ONES = """\
dim n = {n}, d = {d}
const X : n x d, Y : n x 1
const Cd : d x 1 = ones
weight u : n x 1
E := Y - m(2 X Cd) * u
w = form(E)
"""

ONES_SUM = """\
dim n = {n}, d = {d}
const Y : n x d
const C : n x 1 = ones
const Cd : d x 1 = ones
weight g : 1 x d
F = C (Cd + Cd + g^t)^t
E = Y - F
w = trace(E^t d(E))
"""

MEAN_POOLING = """\
dim n = {n}, d = {d}, h = 4, o = 2
const X : n x d, Y : 1 x o
const C : n x 1 = ones
weight W1 : d x h, b1 : 1 x h, W2 : h x o
H := m(X W1 + C b1)
P = (1/n) C^t H
E := Y - P W2
w = form(E)
"""

SCALED_RESIDUAL = """\
dim n = {n}, d = {d}, h = 3
const X : n x d, Y : n x d
const C : n x 1 = ones
scalar al = 1/2
weight W1 : d x h, b : 1 x h, W2 : h x d, f : 1 x d
body(Z) = m(Z W1 + C b) W2 + C f
Z1 := X + al body(X)
E := Y - Z1
w = form(E)
"""

CENTRED = """\
dim n = {n}, d = {d}
const X : n x d, Y : n x d
const Cd : d x 1 = ones
scalar r = d^(-1)
weight W : d x d
Z := X W
E := Y - (Z - r Z Cd Cd^t)
w = form(E)
"""

SIZES = [(6, 5), (3, 7), (1, 4), (4, 1), (1, 1)]


@pytest.mark.parametrize("n, d", SIZES)
@pytest.mark.parametrize("program, sign", [(SCALED_ONES, -1), (ONES_SUM, 1), (MEAN_POOLING, -1),
                                           (SCALED_RESIDUAL, -1), (CENTRED, -1)],
                         ids=["scaled-ones", "ones-sum", "mean-pooling", "scaled-residual", "centred"])
def test_ordinary_models_give_torchs_gradients(program, sign, n, d):
    if not torch_eval.available():
        pytest.skip("torch is not installed")
    for seed in range(10):  # values where the relus are not all dead: a zero gradient proves nothing
        report = check(program.format(n=n, d=d) + LOSS, sign=sign, seed=seed)
        if report.scale > 1e-3:
            break
    assert report.reference == "torch"
    # every method: eval and generated code of the shared and expanded forms, grad(w), torch
    assert {"code[shared]", "code[expanded]", "eval[shared]", "eval[expanded]", "grad(w)"} <= set(report.gradients)
    assert report.ok, report.describe()
    assert report.scale > 1e-3 or (program is CENTRED and d == 1)  # there Z - Z 1 1^t = 0


def test_the_sign_of_the_form_matters():
    """The check can fail: claiming the wrong sign for w = trace(E^t d(E)) is caught."""
    report = check(ONES_SUM.format(n=3, d=7) + LOSS, sign=-1, use_torch=False)
    assert not report.ok
    assert {m for m, _, _ in report.disagreements} == {"finite differences"}


# Models that every gradient path once got wrong or refused, each checked every way (torch and
# finite differences among them):
ONE_BY_ONE = "dim n = 1\nconst X11 : 1 x 1\nweight U11 : 1 x 1\n"
REGRESSIONS = {
    # found by the fuzzer: eye(1) is the number 1, and aa(eye(1), X) lowered to _softmax(1.0)
    "scalar-arguments": ONE_BY_ONE + "F = U11 + aa(eye(1), X11) + aa(X11, eye(1)) U11 + m(eye(1)) U11 "
                                     "+ mm(eye(1), X11) U11\n",
    # found by the fuzzer (seed 21): mm(eye(1), U) with a weight in its second argument flips to
    # mm(1, E^t), and the generated code looked for a statement computing the number 1 (KeyError)
    "mask-of-a-scalar": ONE_BY_ONE + "F = mm(eye(1), U11) + mm(-1, U11) + mm(trace(X11), U11)\n",
    # d(trace(X U) A) = trace(X dU) A + ...: in the form the trace with the differential stands among
    # other scalars, trace(X dU) trace(E^t A), and no rule brought it into one trace (normal refused
    # the program); the stdlib's scalar-in-d does, and the fuzzer generates such traces now
    "differential-in-a-scalar-factor": "dim n = 3, k = 2\nscalar s = k^(-1/2)\nconst X : n x n, Y : n x n\n"
                                       "weight U : n x n, V : n x n\nweight g : scalar\n"
                                       "F = trace(X U) X + trace(U) Y + s trace(V X) trace(U) U + g trace(U V) X\n",
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_models_once_got_wrong(name):
    target = "X11" if "X11" in REGRESSIONS[name] else "Y"
    source = REGRESSIONS[name] + "E := %s - F\nL = trace(E^t E) / 2\nw = form(E)\n" % target
    report = check(source, sign=-1)
    assert report.ok, report.describe()
    assert {"code[shared]", "code[expanded]", "grad(w)"} <= set(report.gradients)


# Found by the fuzzer (seed 11): a scalar before the differential of a square weight stands for a
# multiple of the identity. collect built -(1/2) X^t + 1/2 (1/2 added to every entry) from
# trace(-(1/2) X^t dU) + trace((1/2) dU), and a lone trace(s dU) had the number s as coefficient.
UNIT = "dim n = 3, k = 2\nscalar s = k^(-1/2)\nconst X : n x n\nweight U : n x n, V : n x n\n"
SCALAR_WORDS = {
    "seed-11": "F = ((eye(n)) + U) + U\nE = X - F\nL = trace(E^t E) / 2\nw = d(L)\n",
    "halves": "F = (eye(n) + U) + U\nE = X - F\nL = trace(E^t E) / 2\nw = trace(d(E)^t E) / 2 - form(E) / 2\n",
    "declared-scalar": "L = trace(s U) + trace(X U)\nw = d(L)\n",
    "alone": "L = trace(s U) + trace(2 V)\nw = d(L)\n",
    "two-weights": "L = trace(2 U) + trace(U V) + trace(s V)\nw = d(L)\n",
    "adjoint": "H := U V\nL = trace(s H) + trace(X H)\nw = d(L)\n",
    "hadamard-alone": "L = trace(X * U) + trace(s (X * V))\nw = d(L)\n",
}


@pytest.mark.parametrize("body", SCALAR_WORDS.values(), ids=SCALAR_WORDS.keys())
def test_a_scalar_before_the_differential_of_a_square_weight_is_a_multiple_of_the_identity(body):
    report = check(UNIT + body, sign=1, use_torch=torch_eval.available())
    assert report.ok, report.describe()
    assert report.checked_fd == len(report.gradients[report.reference])  # every weight, by finite differences too
    assert {"code[shared]", "code[expanded]", "eval[expanded]", "grad(w)"} <= set(report.gradients)


def test_the_coefficient_of_a_lone_scalar_term_is_a_matrix():
    """coeff(w, U) of w = d(trace(s U)) is s I (shaped like U^t), not the number s: its entries are
    the finite-difference derivatives of the loss along each entry of U."""
    import numpy as np

    from fdsl.lang.program import parse
    from fdsl.numbers.numpy_eval import Evaluator

    program = parse(UNIT + "L = trace(s U) + 3 trace(V)\nw = d(L)\nN = normal(w)\n", "<case>")
    values = {"U": np.arange(9.0).reshape(3, 3), "V": np.ones((3, 3)), "X": np.eye(3)}
    dims = dict(program.dims)
    for weight in ("U", "V"):
        g = Evaluator(values, dims).value(program.expr("coeff(N, %s)" % weight))
        assert g.shape == (3, 3)
        L = program.expr("L")
        fd = np.zeros((3, 3))
        for i in range(3):
            for j in range(3):
                step = {k: v.copy() for k, v in values.items()}
                step[weight][i, j] += 1.0  # L is linear in U and V: one-sided differences are exact
                fd[i, j] = (Evaluator(step, dims).value(L) - Evaluator(values, dims).value(L)).item()
        assert np.allclose(g.T, fd, atol=1e-12), (weight, g, fd)


def test_a_sharply_bending_loss_is_measured_with_a_finer_step():
    """Found by the fuzzer (seed 13): layernorm of rows of two nearly equal softmax entries bends
    so sharply that the fourth-order stencil at step 1e-3 is off by 2.8e-6 of the gradient. Every
    exact method agrees with torch; halving the step twice brings the stencil within 1e-8."""
    source = """\
dim n = 2
const Xnn : n x n
weight Unn : n x n
F = dlayernorm(a(Unn), Unn)
E := Xnn - F
L = trace(E^t E) / 2
w = form(E)
"""
    report = check(source, sign=-1, seed=9407, use_torch=torch_eval.available())
    assert report.ok, report.describe()
    assert report.checked_fd == 1 and report.refined_fd == 1


def test_a_loss_flat_in_its_weight():
    """Found by the fuzzer (seed 13): mm(U, X) = [U > 0] o X has derivative 0 in U, so torch's loss
    has no graph back to U; the torch oracle says 0, as finite differences do, instead of failing."""
    source = """\
dim n = 2
const X : n x n
weight U : n x n
E := X - mm(U, X)
L = trace(E^t E) / 2
w = form(E)
"""
    report = check(source, sign=-1, use_torch=torch_eval.available())
    assert report.ok, report.describe()
    assert report.checked_fd == 1
    for grads in report.gradients.values():
        assert not grads["U"].any()


FLAT = {  # models whose loss is flat in U (shapes as the fuzzer drew them), and the seed of the values
    "dlayernorm(U, ones)": ("dim n = 2, d = 2", "F = dlayernorm(U, J)", 59),
    "layernorm-at-ones": ("dim n = 1, d = 3", "F = dlayernorm(J, dlogsoftmax(U, X))", 0),
}


@pytest.mark.parametrize("dims, model, seed", FLAT.values(), ids=FLAT.keys())
def test_a_gradient_that_is_zero_in_exact_arithmetic(dims, model, seed):
    """Found by the fuzzer (seed 13): dlayernorm(U, ones) is 0 for every U (layernorm ignores a
    constant added to a row), and so is the Jacobian of layernorm at a row of ones applied to
    dlogsoftmax(U, X) (U only shifts its rows by a constant): dL/dU is 0. fdsl's is rounding
    noise of 4e-14 or 0, torch's 0 or 1.1e-12 (layernorm at a constant row amplifies it by
    1/sqrt(1e-5)). That is agreement (1e-11 absolute below a largest gradient of 1e-3); a
    wrong gradient is not."""
    source = dims + """
const X : n x d
const J : n x d = ones
weight U : n x d
%s
E := X - F
L = trace(E^t E) / 2
w = form(E)
"""
    report = check(source % model, sign=-1, seed=seed, use_torch=torch_eval.available())
    assert report.ok, report.describe()
    assert max(abs(g).max() for grads in report.gradients.values() for g in grads.values()) < 1e-11
    assert not report.skipped and report.checked_fd == 1
    wrong = check(source % (model + " + (1/2) U"), sign=1, seed=seed, use_torch=torch_eval.available())
    assert not wrong.ok  # a gradient of the size of the floor or above is still compared


def test_a_kink_of_relu_at_the_point_is_not_compared():
    """Found by the fuzzer (seed 13): ddlayernorm(X, X, ones) is 0 in exact arithmetic (layernorm
    ignores a constant added to a row) and 2e-16 in floating point, so mm(it, U) = [it > 0] o U has
    a mask made of rounding: numpy's and torch's differ by 2.8e3 x the gradient. No derivative
    exists there; the case is run every way and reported as skipped, not as agreeing."""
    source = """\
dim n = 1, d = 3
const Xnd : n x d
const Jnd : n x d = ones
weight Und : n x d
F = mm(ddlayernorm(Xnd, Xnd, Jnd), Und)
E := Xnd - F
L = trace(E^t E) / 2
w = form(E)
"""
    report = check(source, sign=-1, use_torch=torch_eval.available())
    assert report.ok and not report.checked_fd
    assert [m for m, _ in report.skipped] == ["every method"] and "0 up to rounding" in report.skipped[0][1]
    assert {"code[shared]", "code[expanded]", "grad(w)"} <= set(report.gradients)  # every way was run
    # an argument of relu that is exactly 0 is no kink of rounding: both sides mask it alike
    exact = check(source.replace("ddlayernorm(Xnd, Xnd, Jnd)", "zeros(n, d)") + "\n", sign=-1)
    assert exact.ok and not exact.skipped


def test_a_loss_of_size_1e122_is_measured_with_a_step_of_1_5e_5():
    """Found by the fuzzer (seed 14): exp of layernorm's Jacobian at rows of nearly equal entries
    makes gradients of 2e61; the stencil's error at the steps 1e-3 ... 6.25e-5 is 0.46, 0.02,
    1.2e-3, 7.2e-5, 4.4e-6 of the gradient (16-fold per halving: truncation), 1.5e-8 at 1.5e-5."""
    source = """\
dim n = 2, d = 4
const Xnd : n x d
weight Und : n x d, Unn : n x n
H0 := Unn
F = exp(dlayernorm(sqrt(1 + Und * Und), Xnd))
E := Xnd - F
L = trace(E^t E) / 2
w = form(E)
"""
    report = check(source, sign=-1, seed=2330, use_torch=torch_eval.available())
    assert report.ok, report.describe()
    assert report.scale > 1e60 and report.checked_fd == 1 and report.refined_fd == 1


def test_a_loss_that_overflows_is_skipped_not_compared():
    """Found by the fuzzer (seed 15): exp(exp(...)) of normal values is inf in float64, so the
    loss has no number and nor has any gradient; the case is skipped with the reason."""
    source = """\
dim n = 4, d = 1
const Xdn : d x n
weight Udn : d x n
F = dexp(exp(dexp(Udn, dexp(Udn, Udn))), Udn)
E := Xdn - F
L = trace(E^t E) / 2
w = form(E)
"""
    report = check(source, sign=-1, seed=0, use_torch=torch_eval.available())
    assert report.ok and not report.gradients
    assert [m for m, _ in report.skipped] == ["every method"] and "not finite" in report.skipped[0][1]


# Found by the fuzzer on the statement IR (issue 28). "same-heads": the expanded form computes
# E * Und twice, alike; they were stacked as two heads of one value (no head axis: unbinding it
# failed). "per-example-scale": a bias-like gradient scaled after its row sum by trace(Xdd), a
# number of each example, was summed over the batch before the scale (a wrong batch gradient).
# "scaled-by-each-example": below.
IR_FOUND = {
    "same-heads": ("dim n = 2, d = 1\nconst Xnd : n x d\nweight Udd : d x d, Und : n x d\nF = Und * (Und Udd)\n"
                   "E := Xnd - F\nL = trace(E^t E) / 2\nw = d(L)\n", 1),
    "per-example-scale": ("dim n = 2, d = 1\nconst Xdd : d x d, Xnn : n x n\nconst Jn1 : n x 1 = ones\n"
                          "weight U1n : 1 x n\nF = trace(Xdd) (Jn1 U1n)\nE := Xnn - F\nL = trace(E^t E) / 2\n"
                          "w = form(E)\n", -1),
    # (J1n Unn) scaled after the product by trace(2 Xnn), a number of each example: scaled in place,
    # the row could not take the batch axis (a RuntimeError on a batch)
    "scaled-by-each-example": ("dim n = 2, d = 1\nconst Xnn : n x n\nconst Jn1 : n x 1 = ones\n"
                               "const J1n : 1 x n = ones\nweight Unn : n x n\n"
                               "F = Jn1 (sqrt(1 + (trace(2 Xnn) (J1n Unn)) * (trace(2 Xnn) (J1n Unn))))\n"
                               "E := Xnn - F\nL = trace(E^t E) / 2\nw = form(E)\n", -1),
    # two weights with one gradient (Udn and Wdn_0 of Und (Udn + Wdn_0)): the second is a copy of
    # the first, which its product had summed over the batch already; the copy was summed again
    # (nb times the gradient on a batch; also before the IR)
    "one-gradient-twice": ("dim n = 1, d = 1\nconst Xnn : n x n\nweight Udn : d x n, Und : n x d\n"
                           "weight Wdn[i] : d x n\nF = Und (Udn + (Wdn[0]))\nE := Xnn - F\nL = trace(E^t E) / 2\n"
                           "w = form(E)\n", -1),
    # (fuzz seed 62, issue 29) a scaled product with ids alone on one side (which takes no scale,
    # nor does a lookup's result) and a column of ones on the other: no place took the scale
    # (ValueError of an empty min); the product is now made and a copy scaled
    "no-place-for-the-scale": ("dim n = 1, d = 2\nconst Xnd : n x d\nconst Ynn : n x n onehot\n"
                               "const J1n : 1 x n = ones\nweight Und : n x d, Un1 : n x 1\n"
                               "F = trace(Ynn^t (Un1 J1n)) Und\nE := Xnd - F\nL = trace(E^t E) / 2\n"
                               "w = form(E)\n", -1),
}


@pytest.mark.parametrize("name", sorted(IR_FOUND))
def test_models_the_ir_passes_once_got_wrong(name):
    source, sign = IR_FOUND[name]
    report = check(source, sign=sign)
    assert report.ok, report.describe()
    assert any(k.startswith("torch-code") for k in report.gradients)
