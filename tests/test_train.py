"""Training with the symbolic gradients: the loss falls, through the CLI and inside a program.

Each step moves every weight W by lr grad(w, W); for w = form(E) that is -lr dL/dW, gradient
descent on L = 1/2 ||E||^2 (the gradients themselves are held against finite differences in
tests/test_grad.py). Here: the update rule is exactly that (a case with a closed form), and the
example's loss drops to well under half its start.
"""

import re
import textwrap

import numpy as np
import pytest

import fdsl
from fdsl.base.errors import FdslError

CURVE = re.compile(r"^step\s+(\d+)\s+loss (\S+)$", re.M)


def curve(text):
    return [(int(s), float(l)) for s, l in CURVE.findall(text)]


def test_fdsl_train_makes_the_loss_fall(run_fdsl, examples, tmp_path):
    out = tmp_path / "final.npz"
    r = run_fdsl("train", examples / "train.fd", "--form", "w", "--steps", "300", "--lr", "0.01",
                 "--random", "0", "--every", "30", "--out", out)
    assert r.returncode == 0, r.stderr
    points = curve(r.stdout)
    assert [s for s, _ in points] == list(range(0, 301, 30))
    first, last = points[0][1], points[-1][1]
    assert last < 0.5 * first  # the bar; in fact it falls by a factor of about 500
    assert last < points[len(points) // 2][1] < first  # still falling in the second half
    assert "loss %.6g -> %.6g in 300 steps" % (first, last) in r.stdout
    # the trained values: every symbol the form needs, usable as --values; L there is the last loss
    saved = dict(np.load(out))
    assert {"Q", "K", "V", "W", "b", "f", "X", "P", "R", "U", "T", "c", "g"} == set(saved)
    program = fdsl.load(examples / "train.fd", setup=lambda p: p.options.update(train=False))
    e = program.definitions["E"]
    loss = 0.5 * np.sum(fdsl.numbers.numpy_eval.evaluate(e, saved, program.dims) ** 2)
    assert loss == pytest.approx(last, rel=1e-6)
    g = run_fdsl("grad", examples / "train.fd", "--form", "w", "--values", out, "--out", tmp_path / "g.npz")
    assert g.returncode == 0, g.stderr


def test_fdsl_run_trains_inside_the_program(run_fdsl, examples):
    r = run_fdsl("run", examples / "train.fd")
    assert r.returncode == 0, r.stderr
    points = curve(r.stdout)
    assert points[0][0] == 0 and points[-1][0] == 300
    assert points[-1][1] < 0.5 * points[0][1]
    # after train(...), the program's weights are the trained ones: eval sees the last loss
    shown = r.stdout.strip().splitlines()[-1]
    assert float(shown) == pytest.approx(points[-1][1], rel=1e-6)  # the curve prints 7 digits


def test_fdsl_train_ignores_train_calls_in_the_file(run_fdsl, examples):
    """Under fdsl train the command line decides: the file's own train(...) does not run first."""
    a = curve(run_fdsl("run", examples / "train.fd").stdout)
    b = curve(run_fdsl("train", examples / "train.fd", "--form", "w", "--steps", "5", "--lr", "0.01",
                       "--random", "0").stdout)
    assert b[0] == a[0]  # the same untrained start


def test_the_update_is_descent_along_the_gradient():
    """form(A) for a weight A is -dL with L = 1/2 ||A||^2: each step A <- A - lr A, so after k
    steps A = (1 - lr)^k A0 and L = (1 - lr)^(2k) L0, exactly."""
    program = fdsl.parse(textwrap.dedent("""\
        dim n = 3
        weight A : n x n
        w = form(A)
        random 0
        train(w, 8, 1/4, 2)
        """))
    a0 = fdsl.numbers.values.Values(program)
    a0.seed = 0
    start = a0["A"]
    trained = program.values["A"]
    assert np.allclose(trained, 0.75 ** 8 * start, rtol=1e-12)
    points = curve(program.effects[0].text)
    assert [s for s, _ in points] == [0, 2, 4, 6, 8]
    l0 = 0.5 * np.sum(start ** 2)
    for s, l in points:
        assert l == pytest.approx(0.75 ** (2 * s) * l0, rel=1e-6)  # the curve prints 7 digits


def test_a_form_other_than_form_e_reports_the_gradient_size():
    program = fdsl.parse("dim n = 2\nweight A : n x n\nrandom 1\ntrain(2 form(A), 3, 1/10)\n")
    assert "|grad|" in program.effects[0].text


@pytest.mark.parametrize("args, message", [
    (["--steps", "0", "--lr", "0.01"], "--steps: the number of steps must be at least 1"),
    (["--steps", "10", "--lr", "-1"], "--lr: the learning rate must be a positive number"),
    (["--steps", "10", "--lr", "0.01", "--every", "0"], "--every"),
    (["--steps", "50", "--lr", "1"], "lower the learning rate"),
])
def test_cli_errors(run_fdsl, examples, args, message):
    r = run_fdsl("train", examples / "train.fd", "--form", "w", "--random", "0", *args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("source, message", [
    ("train(w, 0, 1/10)", "the number of steps must be at least 1"),
    ("train(w, 10, X)", "the learning rate must be a number"),
    ("train(X, 10, 1/10)", "not a scalar 1-form"),
    ("train(form(X), 10, 1/10)", "nothing to train"),
])
def test_language_errors(source, message):
    with pytest.raises(FdslError, match=message):
        fdsl.parse("dim n = 2\nconst X : n x n\nweight A : n x n\nw = form(A)\nrandom 0\n" + source)
