"""The operators' math, proven numerically and independently of the rewrite engine.

Each identity the rules rely on (DESIGN.md) is checked on random matrices of random shapes, by
evaluating both sides through the numpy lowering, and the two derivative laws against central
finite differences:

    d(m(A)) = mm(A, dA)                          d(a(A)) = aa(A, dA)
    trace(P mm(A, B)) = trace(mm(A^t, P) B)      trace(P aa(A, B)) = trace(aa(A, P^t)^t B)
    trace(P dW S) = trace(S P dW)                trace(G dW^t) = trace(G^t dW)
    trace(P (A * B)) = trace((P * A^t) B)

Tolerance: relative error below TOL = 1e-8 (finite differences, 4th-order stencil, float64) and
EXACT = 1e-12 for identities that hold in exact arithmetic.
"""

import numpy as np
import pytest
from oracle import central_difference, directional_derivative, kink_margin, rel_error

import fdsl
from fdsl.numbers.numpy_eval import evaluate
from fdsl.numbers.numpy_runtime import _aa, _mm, _softmax

TOL = 1e-8
EXACT = 1e-12
SEEDS = range(6)


def shapes_program(rng):
    """A program with random dims p, q and matrices A, B : p x q, P : q x p, plus the right
    shapes for the cycle identity (S : r x p, W : q x r)."""
    p, q, r = (int(x) for x in rng.integers(2, 8, size=3))
    text = (f"dim p = {p}, q = {q}, r = {r}\n"
            "const A : p x q, B : p x q, D : p x q, P : q x p\n"
            "const S : r x q, G : q x p\n"
            "weight W : p x r\n")
    program = fdsl.parse(text)
    values = {"A": rng.standard_normal((p, q)), "B": rng.standard_normal((p, q)),
              "D": rng.standard_normal((p, q)), "P": rng.standard_normal((q, p)),
              "S": rng.standard_normal((r, q)), "G": rng.standard_normal((q, p)),
              "W": rng.standard_normal((p, r))}
    return program, values


def away_from_zero(x, margin=0.1):
    """Entries pushed at least ``margin`` away from 0 (relu is smooth there)."""
    return np.sign(x) * (margin + np.abs(x))


def ev(program, expr, values):
    return evaluate(program.expr(expr), values, program.dims)


# ---- derivative laws ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_d_of_relu_is_mm(seed):
    rng = np.random.default_rng(seed)
    program, values = shapes_program(rng)
    values["A"] = away_from_zero(values["A"])
    # the direction of A is D: d(m(A)) along D is mm(A, D)
    assert kink_margin(program, program.expr("m(A)"), values) >= 0.1
    numeric = directional_derivative(program, program.expr("m(A)"), values, {"A": values["D"]}, h=1e-3)
    symbolic = ev(program, "mm(A, D)", values)
    assert rel_error(numeric, symbolic) < TOL


@pytest.mark.parametrize("seed", SEEDS)
def test_d_of_softmax_is_aa(seed):
    rng = np.random.default_rng(seed)
    program, values = shapes_program(rng)
    numeric = directional_derivative(program, program.expr("a(A)"), values, {"A": values["D"]}, h=1e-3)
    symbolic = ev(program, "aa(A, D)", values)
    assert rel_error(numeric, symbolic) < TOL


@pytest.mark.parametrize("seed", SEEDS)
def test_d_of_a_composite_through_the_chain_rule(seed):
    # d(m(a(A) B^t) P) = mm(a(A) B^t, aa(A, dA) B^t) P: both laws together inside products
    rng = np.random.default_rng(seed)
    program, values = shapes_program(rng)
    term = program.expr("m(a(A) B^t) P^t")
    margin = kink_margin(program, term, values)
    h = min(1e-3, margin / 100)
    numeric = directional_derivative(program, term, values, {"A": values["D"]}, h=h)
    symbolic = ev(program, "mm(a(A) B^t, aa(A, D) B^t) P^t", values)
    assert rel_error(numeric, symbolic) < 1e-6


def test_the_oracle_rejects_a_wrong_softmax_derivative():
    # the tests above can fail: S o B (the Jacobian without the row-sum term) is far off
    rng = np.random.default_rng(0)
    A, D = rng.standard_normal((4, 5)), rng.standard_normal((4, 5))
    numeric = central_difference(lambda v: _softmax(v["A"]), {"A": A}, {"A": D})
    assert rel_error(numeric, _aa(A, D)) < TOL
    assert rel_error(numeric, _softmax(A) * D) > 1e-2


# ---- flips and cycles (exact identities) ------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_mm_flip(seed):
    program, values = shapes_program(np.random.default_rng(seed))
    lhs = ev(program, "trace(P mm(A, B))", values)
    rhs = ev(program, "trace(mm(A^t, P) B)", values)
    assert lhs.shape == (1, 1)
    assert rel_error(lhs, rhs) < EXACT


# Trace identities the rules rely on, as (left, right) over the shapes of shapes_program.
IDENTITIES = [
    ("trace(P aa(A, B))", "trace(aa(A, P^t)^t B)"),  # flip-aa: the row Jacobian of softmax is symmetric
    # cycle, trace(P dW S) = trace(S P dW): B^t (q x p) stands before W (p x r), S (r x q) after
    ("trace(B^t W S)", "trace(S B^t W)"),
    # trace(G dW^t) = trace(G^t dW), with A standing for dW (G : q x p, A^t : q x p)
    ("trace(G^t A^t)", "trace(G A)"),
    ("trace(P (A * B))", "trace((P * A^t) B)"),  # flip-had
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("left, right", IDENTITIES, ids=["aa_flip", "cycle", "transposed_differential",
                                                         "hadamard_flip"])
def test_trace_identity(left, right, seed):
    program, values = shapes_program(np.random.default_rng(seed))
    assert rel_error(ev(program, left, values), ev(program, right, values)) < EXACT


# ---- the runtime's definitions ------------------------------------------------------------------


def test_mm_keeps_entries_where_a_is_positive():
    A = np.array([[1.0, -2.0], [0.0, 3.0]])
    B = np.array([[5.0, 6.0], [7.0, 8.0]])
    assert np.array_equal(_mm(A, B), [[5.0, 0.0], [0.0, 8.0]])


@pytest.mark.parametrize("seed", SEEDS)
def test_mm_and_aa_are_linear_in_their_second_argument(seed):
    rng = np.random.default_rng(seed)
    A, B, D = (rng.standard_normal((3, 4)) for _ in range(3))
    for f in (_mm, _aa):
        assert rel_error(f(A, 2.5 * B - D), 2.5 * f(A, B) - f(A, D)) < EXACT


def test_aa_rows_sum_to_zero_and_its_row_jacobian_is_symmetric():
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
    assert np.allclose(_aa(A, B).sum(axis=1), 0.0, atol=1e-15)
    # the Jacobian of one row, column by column, is symmetric
    J = np.stack([_aa(A[:1], np.eye(5)[j:j + 1])[0] for j in range(5)], axis=1)
    assert np.allclose(J, J.T, atol=1e-15)


def test_softmax_is_stable_for_large_entries():
    A = np.array([[1000.0, 999.0, -1000.0], [-1e300, 0.0, 1e300]])
    S = _softmax(A)
    assert np.all(np.isfinite(S))
    assert np.allclose(S.sum(axis=1), 1.0)
    assert np.isclose(S[0, 0] / S[0, 1], np.e)
    assert np.isfinite(_aa(A, np.ones_like(A))).all()
