"""Training along flows, with watched quantities, a CSV log and a plot.

The flows themselves are held against dense solves in tests/test_flow.py; here: a step moves each
weight by exactly lr times its flow under the program's metric, the watched numbers are the norms
they claim to be, and the files are written (all or nothing) from the CLI and from a program.
"""

import csv
import textwrap

import numpy as np
import pytest

import fdsl
from fdsl.learn.flow import flows_of
from fdsl.numbers.values import Values

PNG = b"\x89PNG\r\n\x1a\n"


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def test_the_issue_command_writes_the_log_and_the_plot(run_fdsl, examples, tmp_path):
    log, plot, g = tmp_path / "w.csv", tmp_path / "w.png", tmp_path / "g.npz"
    r = run_fdsl("train", examples / "encoder2.fd", "--form", "w", "--steps", "20", "--lr", "0.01", "--random",
                 "0", "--watch", "coeff(w, K[1])", "--log", log, "--plot", plot)
    assert r.returncode == 0, r.stderr
    assert "wrote %s: 21 steps of loss, coeff(w, K[1])" % log in r.stdout
    header, rows = read_csv(log)
    assert header == ["step", "loss", "coeff(w, K[1])"]
    assert [int(row[0]) for row in rows] == list(range(21))
    assert plot.read_bytes()[:8] == PNG
    # the watched number at the start is |coeff(w, K_1)| = |grad(w, K_1)|, from fdsl grad
    assert run_fdsl("grad", examples / "encoder2.fd", "--form", "w", "--random", "0", "--out", g).returncode == 0
    assert float(rows[0][2]) == pytest.approx(np.linalg.norm(np.load(g)["K_1"]), rel=1e-10)
    # the loss column is the printed loss, falling
    losses = [float(row[1]) for row in rows]
    assert "loss %.6g -> %.6g in 20 steps" % (losses[0], losses[-1]) in r.stdout
    assert losses[-1] < losses[0]


def test_watches_record_norms_and_scalar_values(run_fdsl, examples, tmp_path):
    log = tmp_path / "w.csv"
    out = tmp_path / "final.npz"
    r = run_fdsl("train", examples / "train.fd", "--form", "w", "--steps", "3", "--lr", "0.01", "--random", "0",
                 "--watch", "W", "--watch", "trace(E^t E) / 2", "--log", log, "--out", out)
    assert r.returncode == 0, r.stderr
    header, rows = read_csv(log)
    assert header == ["step", "loss", "W", "trace(E^t E) / 2"]
    for row in rows:
        assert float(row[3]) == pytest.approx(float(row[1]), rel=1e-12)  # a scalar: its value, the loss
    assert float(rows[-1][2]) == pytest.approx(np.linalg.norm(np.load(out)["W"]), rel=1e-12)


@pytest.mark.parametrize("watch, message", [
    ("w", "--watch w is a matrix of 1-forms, which has no numbers: watch a coefficient, coeff(w, W)"),
    ("coeff(w, X)", "X is not a weight"),
    ("nope(", "--watch nope("),
])
def test_bad_watches(run_fdsl, examples, watch, message, tmp_path):
    log = tmp_path / "w.csv"
    r = run_fdsl("train", examples / "train.fd", "--form", "w", "--steps", "3", "--lr", "0.01", "--random", "0",
                 "--watch", watch, "--log", log)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert message in r.stderr
    assert not log.exists()


ONE_LAYER = """\
dim n = 8, d = 3, h = 4
const X : n x d, Y : n x h, Z : h x h
weight U : d x h, b : 1 x h
const C : n x 1 = ones
E := Y - m(X U + C b)
w = form(E)
random 0
"""


def start_values(program):
    store = Values(program)
    store.seed = 0
    return {name: np.array(store[name]) for name in ("X", "Y", "Z", "U", "b")}


@pytest.mark.parametrize("metric", [
    "metric U = kron(X^t X / n + eye(d), Z Z^t + eye(h))",
    "metric gaussnewton(E, 1/2, 1.0e-12)",
    "metric b = kron(3, Z Z^t + eye(h))\nmetric gaussnewton(E, 1/10, 1.0e-12)",
])
def test_a_step_moves_each_weight_by_lr_times_its_flow(metric):
    text = ONE_LAYER + metric + "\n"
    before = fdsl.parse(text)
    start = start_values(before)
    v = flows_of(before, before["w"])
    trained = fdsl.parse(text + "t = train(w, 1, 1/4)\n")
    for name in ("U", "b"):
        assert np.allclose(trained.values[name], start[name] + 0.25 * v[name], rtol=1e-12, atol=1e-14)
    assert not np.allclose(v["U"], fdsl.parse(ONE_LAYER).expr("grad(w)")["U"])  # not the Euclidean step


def test_gauss_newton_training_reports_its_solves(run_fdsl, examples, tmp_path):
    fd = tmp_path / "gn.fd"
    fd.write_text((examples / "train.fd").read_text().replace("random 0\n", "metric gaussnewton(E, 1/10)\nrandom 0\n"))
    log = tmp_path / "gn.csv"
    r = run_fdsl("train", fd, "--form", "w", "--steps", "10", "--lr", "0.5", "--random", "0", "--log", log)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("metric: gaussnewton(E, 0.1) on K, Q, V, W, b, f\n")
    assert "  cg " in r.stdout and "(residual " in r.stdout
    header, rows = read_csv(log)
    assert header == ["step", "loss", "cg_iterations", "cg_residual"]
    assert all(int(row[2]) >= 1 and float(row[3]) <= 1e-10 for row in rows)
    assert float(rows[-1][1]) < 0.5 * float(rows[0][1])


def test_runs_in_a_program_are_plotted_and_saved_together(tmp_path):
    fd = tmp_path / "runs.fd"
    fd.write_text(ONE_LAYER + textwrap.dedent("""\
        plain = train(w, 4, 1/10, 2, "coeff(w, U)", "U")
        random 0
        metric gaussnewton(E, 1/10)
        gn = train(w, 4, 1/10, 2, "coeff(w, U)")
        plot "runs.png" plain, gn
        save "runs.csv" plain, gn
        show plain
        """))
    program = fdsl.load(fd)
    import io

    out = io.StringIO()
    program.run(out)
    assert out.getvalue().splitlines()[0].startswith("step     0  loss ")
    assert (tmp_path / "runs.png").read_bytes()[:8] == PNG
    header, rows = read_csv(tmp_path / "runs.csv")
    assert header == ["run", "step", "loss", "coeff(w, U)", "U", "cg_iterations", "cg_residual"]
    assert [r[0] for r in rows] == ["plain"] * 5 + ["gn"] * 5
    assert rows[0][2] == rows[5][2]  # the same start
    assert rows[0][6] == "" and rows[5][4] == ""  # what a run does not record is empty


def test_plot_and_save_refuse_what_is_not_a_run():
    with pytest.raises(fdsl.FdslError, match="expected a training run, e = train"):
        fdsl.parse(ONE_LAYER + 'plot "x.png" w\n')
    with pytest.raises(fdsl.FdslError, match="after train\\(w, steps, lr, every\\?\\) come watched expressions"):
        fdsl.parse(ONE_LAYER + "t = train(w, 2, 1/10, 1, w)\n")
