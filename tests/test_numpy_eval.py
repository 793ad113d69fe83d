"""The numpy backend: evaluation against an independent numpy forward pass, values from files and
seeds, errors through the CLI, and ``save``."""

import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
from oracle import ENCODER, rel_error, symbol_values

import fdsl
from fdsl.base.errors import FdslError
from fdsl.cli import main
from fdsl.core.ops import OPS
from fdsl.core.terms import dag_size
from fdsl.numbers import values
from fdsl.numbers.numpy_eval import evaluate, lowering
from fdsl.numbers.values import Numeric, evaluate_in

ROOT = Path(__file__).resolve().parent.parent
ENCODER2 = ROOT / "examples" / "encoder2.fd"
N, D, K, H = 8, 6, 4, 5  # the sizes declared in examples/encoder2.fd

DECLARATIONS = ENCODER


# ---- an independent forward pass ----------------------------------------------------------------


def softmax_rows(A):
    e = np.exp(A - A.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def hand_encoder(v, layers):
    """Eq. 1 of the manual, composed: X_{i+1} = m(a(s X_i Q_i K_i^t X_i^t) X_i V_i + C b_i) W_i + C f_i."""
    Z = v["X"]
    ones = np.ones((Z.shape[0], 1))
    s = K ** -0.5
    for i in range(layers):
        scores = s * (Z @ v["Q_%d" % i] @ v["K_%d" % i].T @ Z.T)
        hidden = softmax_rows(scores) @ Z @ v["V_%d" % i] + ones @ v["b_%d" % i]
        Z = np.maximum(hidden, 0.0) @ v["W_%d" % i] + ones @ v["f_%d" % i]
    return Z


def encoder_arrays(rng, layers):
    """Values for every symbol of encoder(layers), drawn by the test, not by fdsl."""
    v = {"X": rng.standard_normal((N, D)), "Y": rng.standard_normal((N, D))}
    for i in range(layers):
        v.update({"Q_%d" % i: rng.standard_normal((D, K)), "K_%d" % i: rng.standard_normal((D, K)),
                  "V_%d" % i: rng.standard_normal((D, H)), "W_%d" % i: rng.standard_normal((H, D)),
                  "b_%d" % i: rng.standard_normal((1, H)), "f_%d" % i: rng.standard_normal((1, D))})
    return v


def run(capsys, *argv):
    """``fdsl ARGV`` in this process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# ---- evaluation -----------------------------------------------------------------------------------


def test_encoder2_matches_a_hand_written_forward_pass():
    program = fdsl.load(ENCODER2)
    values = encoder_arrays(np.random.default_rng(7), 2)
    got = evaluate(program.call_definition("encoder", 2), values, program.dims)
    assert got.dtype == np.float64 and got.shape == (N, D)
    assert rel_error(got, hand_encoder(values, 2)) < 1e-12
    E = evaluate(program["E"], values, program.dims)
    assert rel_error(E, values["Y"] - hand_encoder(values, 2)) < 1e-12


def test_encoder2_with_random_values_matches_the_forward_pass_on_the_same_arrays():
    program = fdsl.load(ENCODER2)
    values.random_values(program, 0)
    term = program.call_definition("encoder", 2)
    got = evaluate_in(program, term)
    # the arrays fdsl drew, read back by name, through the independent forward pass
    assert rel_error(got, hand_encoder(symbol_values(program, term), 2)) < 1e-12


def test_shared_encoder30_computes_each_distinct_node_once():
    program = fdsl.parse(DECLARATIONS)
    values.random_values(program, 1)
    term = program.call_definition("encoder", 30)
    ev = values.program_evaluator(program)
    got = ev.value(term)
    assert ev.evaluations == dag_size(term)  # 3^30 tree nodes, a few hundred distinct ones
    assert rel_error(got, hand_encoder(symbol_values(program, term), 30)) < 1e-9
    ev.value(term)
    assert ev.evaluations == dag_size(term)  # nothing recomputed


def test_scalars_multiply_as_scalars_and_builtins_have_their_values():
    program = fdsl.parse(DECLARATIONS + "dim m = 3\nconst I : m x m = identity\nscalar t\n")
    rng = np.random.default_rng(2)
    X, Y = rng.standard_normal((N, D)), rng.standard_normal((N, D))
    values = {"X": X, "Y": Y, "t": np.array(1.5)}  # a scalar may be given as a 0-d array
    cases = {
        "s X": 0.5 * X,
        "2 t X": 3.0 * X,
        "trace(X^t Y)": np.trace(X.T @ Y).reshape(1, 1),
        "trace(X^t Y) X s": np.trace(X.T @ Y) * 0.5 * X,
        "X^t C": X.T @ np.ones((N, 1)),
        "k^(-1/2) + n": np.array([[0.5 + 8]]),
        "X * Y - X": X * Y - X,
        "I": np.eye(3),
        "eye(n)": np.eye(N),
        "zeros(n, d)": np.zeros((N, D)),
        "m(X) - mm(X, Y)": np.maximum(X, 0) - (X > 0) * Y,
        "(t^2)^(1/2) X": 1.5 * X,
    }
    for expr, expected in cases.items():
        got = evaluate(program.expr(expr), values, program.dims)
        assert got.shape == expected.shape, expr
        assert rel_error(got, expected) < 1e-14, expr


def test_named_definitions_evaluate_as_their_body():
    program = fdsl.parse(DECLARATIONS + "E := Y - X\n")
    rng = np.random.default_rng(3)
    values = {"X": rng.standard_normal((N, D)), "Y": rng.standard_normal((N, D))}
    assert program["E"].op == "let"
    assert rel_error(evaluate(program["E"], values, program.dims), values["Y"] - values["X"]) == 0


def test_every_template_in_the_operator_table_compiles():
    for name, op in OPS.items():
        if op.numpy is not None:
            assert callable(lowering(name, op.arity if op.arity is not None else 3))


def test_a_broken_template_is_an_error_not_a_crash(monkeypatch):
    from dataclasses import replace

    monkeypatch.setitem(OPS, "m", replace(OPS["m"], numpy="np.maximum({0}, {bogus})"))
    program = fdsl.parse(DECLARATIONS)
    with pytest.raises(FdslError, match="unknown placeholder"):
        evaluate(program.expr("m(X)"), {"X": np.zeros((N, D))}, program.dims)


def test_show_prints_numbers_and_arrays():
    assert Numeric(np.array([[0.25]])).show() == "0.25"
    shown = Numeric(np.array([[1.0, 2.5], [3.0, 4.0]])).show()
    assert shown.startswith("[[1. ") and "2.5" in shown


def test_symbolic_dims_are_read_off_the_arrays(tmp_path, capsys):
    np.savez(tmp_path / "v.npz", X=np.arange(6.0).reshape(3, 2))
    prog = write(tmp_path, "p.fd", """\
        dim n, d
        const X : n x d
        show eval(X^t X)
        show eval(n)
        show eval(eye(n))
        """)
    code, out, err = run(capsys, "run", prog, "--values", tmp_path / "v.npz")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "[[20. 26.]" and lines[2] == "3"
    assert lines[3].startswith("[[1. 0. 0.]")


# ---- values from files and seeds ------------------------------------------------------------------


def test_values_from_npz_through_the_cli_and_the_values_statement(tmp_path, capsys):
    values = encoder_arrays(np.random.default_rng(11), 2)
    np.savez(tmp_path / "v.npz", **values)
    expected = 0.5 * np.sum((values["Y"] - hand_encoder(values, 2)) ** 2)
    prog = write(tmp_path, "p.fd", DECLARATIONS + "E = Y - encoder(2)\nshow eval(1/2 trace(E^t E))\n")
    code, out, err = run(capsys, "run", prog, "--values", tmp_path / "v.npz")
    assert code == 0, err
    assert abs(float(out) - expected) < 1e-8 * expected
    # the same from inside the program, with a path relative to the program's folder
    prog2 = write(tmp_path, "p2.fd", DECLARATIONS + 'values "v.npz"\nE = Y - encoder(2)\nshow eval(1/2 trace(E^t E))\n')
    code, out2, err = run(capsys, "run", prog2)
    assert code == 0, err
    assert out2 == out


def test_flat_vectors_are_accepted_for_row_and_column_shapes():
    program = fdsl.parse(DECLARATIONS)
    got = evaluate(program.expr("C b[0]"), {"b_0": np.arange(5.0)}, program.dims)
    assert np.array_equal(got, np.ones((N, 1)) @ np.arange(5.0).reshape(1, 5))


def test_random_values_are_deterministic_per_seed_and_name():
    def draw(seed, names):
        program = fdsl.parse(DECLARATIONS)
        values.random_values(program, seed)
        return {name: program.values[name] for name in names}

    a = draw(5, ["Q_7", "X", "W_0"])
    b = draw(5, ["W_0", "X", "Q_7"])  # a different order of first use
    c = draw(6, ["Q_7", "X", "W_0"])
    for name in a:
        assert np.array_equal(a[name], b[name])
        assert not np.array_equal(a[name], c[name])
    assert a["Q_7"].shape == (D, K) and a["W_0"].shape == (H, D)


def test_random_scales_weights_by_one_over_sqrt_rows_and_leaves_constants_standard():
    program = fdsl.parse("dim r = 400, c = 300\nconst A : r x c\nweight B : r x c\n")
    values.random_values(program, 0)
    assert abs(program.values["A"].std() - 1.0) < 0.01
    assert abs(program.values["B"].std() * np.sqrt(400) - 1.0) < 0.01


def test_given_values_win_over_random_ones(tmp_path):
    X = np.full((N, D), 3.0)
    np.savez(tmp_path / "v.npz", X=X)
    program = fdsl.parse(DECLARATIONS)
    values.random_values(program, 0)
    values.load_values(program, tmp_path / "v.npz")
    assert np.array_equal(evaluate_in(program, program.expr("X")), X)
    # a new seed draws the others afresh and keeps what was given
    q0 = program.values["Q_0"].copy()
    values.random_values(program, 1)
    assert not np.array_equal(program.values["Q_0"], q0)
    assert np.array_equal(program.values["X"], X)


def test_the_random_statement_and_the_cli_option_agree(tmp_path, capsys):
    prog = write(tmp_path, "p.fd", DECLARATIONS + "show eval(trace(encoder(2)^t encoder(2)))\n")
    prog2 = write(tmp_path, "p2.fd", DECLARATIONS + "random 4\nshow eval(trace(encoder(2)^t encoder(2)))\n")
    code, out, err = run(capsys, "run", prog, "--random", 4)
    assert code == 0, err
    code, out2, err = run(capsys, "run", prog2)
    assert code == 0, err
    assert out == out2 and float(out) > 0


# ---- errors: exit 2, a message naming what is wrong, no traceback -----------------------------------


def expect_error(capsys, argv, *fragments):
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err
    return err


@pytest.fixture
def encoder_prog(tmp_path):
    return write(tmp_path, "p.fd", DECLARATIONS + "show eval(encoder(1))\n")


def test_missing_values_file(tmp_path, capsys, encoder_prog):
    err = expect_error(capsys, ["run", encoder_prog, "--values", tmp_path / "nope.npz"],
                       "cannot read this values file: no such file")
    assert err.startswith(str(tmp_path / "nope.npz") + ":")


def test_values_file_that_is_not_an_archive(tmp_path, capsys, encoder_prog):
    (tmp_path / "bad.npz").write_text("these are not arrays\n")
    expect_error(capsys, ["run", encoder_prog, "--values", tmp_path / "bad.npz"], "bad.npz", "not an .npz archive")
    np.save(tmp_path / "one.npy", np.zeros(3))
    expect_error(capsys, ["run", encoder_prog, "--values", tmp_path / "one.npy"], "one unnamed array")
    np.savez(tmp_path / "cube.npz", X=np.zeros((2, 2, 2)))
    expect_error(capsys, ["run", encoder_prog, "--values", tmp_path / "cube.npz"], "X", "(2, 2, 2)")
    np.savez(tmp_path / "text.npz", X=np.array(["a", "b"]))
    expect_error(capsys, ["run", encoder_prog, "--values", tmp_path / "text.npz"], "X", "real numbers")


def test_values_file_with_a_wrong_shape_names_the_symbol_and_both_shapes(tmp_path, capsys, encoder_prog):
    np.savez(tmp_path / "v.npz", X=np.zeros((3, 3)))
    expect_error(capsys, ["run", encoder_prog, "--values", tmp_path / "v.npz", "--random", 0],
                 "shape mismatch for X", "(3 x 3)", "(n x d) = (8 x 6)")


def test_conflicting_sizes_of_a_symbolic_dim(tmp_path, capsys):
    np.savez(tmp_path / "v.npz", X=np.zeros((5, 2)), Y=np.zeros((4, 2)))
    prog = write(tmp_path, "p.fd", "dim n, d\nconst X : n x d, Y : n x d\nshow eval(X + Y)\n")
    expect_error(capsys, ["run", prog, "--values", tmp_path / "v.npz"],
                 "shape mismatch for Y", "(4 x 2)", "(n x d) = (5 x 2)", "n = 5 read off the value of X")


def test_names_that_match_no_symbol_are_reported(tmp_path, capsys, encoder_prog):
    np.savez(tmp_path / "v.npz", X=np.zeros((N, D)), Z=np.zeros(2), Q_0_1=np.zeros(2))
    expect_error(capsys, ["run", encoder_prog, "--values", tmp_path / "v.npz", "--random", 0],
                 "Z, Q_0_1", "match no declared symbol")
    np.savez(tmp_path / "c.npz", C=np.zeros((N, 1)))
    expect_error(capsys, ["run", encoder_prog, "--values", tmp_path / "c.npz", "--random", 0],
                 "C", "has a value in its declaration (ones)")


def test_a_missing_value_and_a_values_statement_error_point_at_the_program(tmp_path, capsys):
    prog = write(tmp_path, "p.fd", DECLARATIONS + "show eval(X)\n")
    expect_error(capsys, ["run", prog], "p.fd:10:", "X has no value", "random SEED")
    prog = write(tmp_path, "q.fd", DECLARATIONS + 'values "nope.npz"\n')
    expect_error(capsys, ["run", prog], "q.fd:10:", "cannot read this values file", 'values "nope.npz"')


def test_random_needs_every_dim_to_have_a_size(tmp_path, capsys):
    prog = write(tmp_path, "p.fd", "dim n, d = 2\nconst X : n x d\nrandom 0\nshow eval(X)\n")
    expect_error(capsys, ["run", prog], "p.fd:3:", "random values need the size of every dim", "n has none")
    prog = write(tmp_path, "q.fd", "dim n, d = 2\nconst X : n x d\nshow eval(X)\n")
    expect_error(capsys, ["run", prog, "--random", 0], "q.fd:3:", "size of dim n")


def test_a_differential_cannot_be_evaluated(tmp_path, capsys):
    prog = write(tmp_path, "p.fd", DECLARATIONS + "show eval(trace(K[0]^t d(Q[0])))\n")
    expect_error(capsys, ["run", prog, "--random", 0], "p.fd:10:", "cannot evaluate dQ_0", "coefficient")


# ---- save ---------------------------------------------------------------------------------------


def test_save_writes_an_npz_of_the_value(tmp_path, capsys):
    prog = write(tmp_path, "p.fd", DECLARATIONS + "E := Y - encoder(1)\nrandom 2\n"
                 'save "out/e.npz" E\nsave "x.npz" eval(X)\nsave "t.npz" trace(E^t E)\n')
    code, out, err = run(capsys, "run", prog)
    assert code == 0, err
    program = fdsl.load(prog)
    with np.load(tmp_path / "out" / "e.npz") as data:
        assert data.files == ["E"]
        assert rel_error(data["E"], evaluate_in(program, program["E"])) == 0
    with np.load(tmp_path / "x.npz") as data:
        assert data.files == ["X"]
    with np.load(tmp_path / "t.npz") as data:
        assert data["value"].shape == (1, 1)


def test_save_of_a_dict_of_arrays(tmp_path):
    program = fdsl.parse(DECLARATIONS)
    values.random_values(program, 0)
    effect = values.save_effect(program, tmp_path / "g.npz",
                                    {"Q_0": program.expr("Q[0]"), "raw": np.eye(2)})
    effect.perform(open(os.devnull, "w"), program)
    with np.load(tmp_path / "g.npz") as data:
        assert sorted(data.files) == ["Q_0", "raw"]
        assert np.array_equal(data["Q_0"], program.values["Q_0"])


def test_save_writes_nothing_when_the_program_fails_later(tmp_path, capsys):
    prog = write(tmp_path, "p.fd", DECLARATIONS + 'random 0\nsave "out.npz" X\nshow eval(undefined_name)\n')
    expect_error(capsys, ["run", prog], "unknown name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.fd"]  # no file, no temporary file
