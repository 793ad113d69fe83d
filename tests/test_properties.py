"""Property: every strategy keeps the value of every term it rewrites.

Hypothesis draws well-shaped terms over products, sums, transposes, traces, scalars, m, a, mm,
aa, Hadamard products and differentials of weights, with random values, and checks that each
stdlib strategy (expandAll, expandmm, flatten, shiftmm, cycle, collect, normal, and the shared
normal form backprop) leaves their numeric value unchanged:

- matrices of numbers (0-forms): the value itself, to 1e-9 relative;
- scalar 1-forms, wrapped as trace(P F S) around a matrix of 1-forms F so that shiftmm, cycle and
  collect have something to do: the value along a random tangent of the weights, d(T) evaluated by
  finite differences (numpy_eval.Evaluator with a tangent: evaluation only, never the rules), to
  1e-6 relative. A draw whose finite differences would cross a kink of relu is discarded.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import fdsl
from fdsl.core import terms as T
from fdsl.core.printers import text
from fdsl.numbers.numpy_eval import Evaluator, NotDifferentiable

PROGRAM = fdsl.parse("""\
dim p = 2, q = 3
const A : p x p, B : p x q, P : q x p, D : q x q
weight U : p x p, V : p x q, R : q x p, Z : q x q
scalar s
""")
SIZES = {"p": 2, "q": 3}
DIMS = ("p", "q")
CONSTS = {sym.shape: sym for sym in (PROGRAM[n] for n in "ABPD")}
WEIGHTS = {sym.shape: sym for sym in (PROGRAM[n] for n in "UVRZ")}
STRATEGIES = ("expandAll", "expandmm", "flatten", "shiftmm", "cycle", "collect", "normal", "expanded")
FORM_STRATEGIES = STRATEGIES + ("backprop",)
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def make(op, *args):
    return T.make(op, args)


@st.composite
def matrices(draw, rows, cols, depth):
    """A term of numbers (no differential) of shape rows x cols."""
    kinds = ["const", "weight"] + (["eye"] if rows == cols else [])
    if depth > 0:
        kinds += ["product", "sum", "transpose", "scalar", "m", "a", "mm", "aa", "hadamard"]
    kind = draw(st.sampled_from(kinds))
    sub = lambda r, c: draw(matrices(r, c, depth - 1))
    if kind == "const":
        return CONSTS[(rows, cols)]
    if kind == "weight":
        return WEIGHTS[(rows, cols)]
    if kind == "eye":
        return T.eye(rows)
    if kind == "product":
        k = draw(st.sampled_from(DIMS))
        return T.mul(sub(rows, k), sub(k, cols))
    if kind == "sum":
        return T.add(sub(rows, cols), sub(rows, cols))
    if kind == "transpose":
        return T.transpose(sub(cols, rows))
    if kind == "scalar":
        k = draw(st.sampled_from(DIMS))
        c = draw(st.sampled_from([PROGRAM["s"], T.num(draw(st.sampled_from([-2, 3]))),
                                  make("trace", sub(k, k))]))
        return T.mul(c, sub(rows, cols))
    if kind in ("m", "a"):
        return make(kind, sub(rows, cols))
    if kind in ("mm", "aa"):
        return make(kind, sub(rows, cols), sub(rows, cols))
    return T.hadamard(sub(rows, cols), sub(rows, cols))


@st.composite
def one_forms(draw, rows, cols, depth):
    """A matrix of 1-forms of shape rows x cols: linear in differentials, which are of weights
    (d(W)) or of whole terms (d(T), left for expandAll)."""
    kinds = ["dweight", "dterm"]
    if depth > 0:
        kinds += ["sum", "left", "right", "transpose", "scalar", "mm", "aa", "hadamard"]
    kind = draw(st.sampled_from(kinds))
    form = lambda r, c: draw(one_forms(r, c, depth - 1))
    mat = lambda r, c: draw(matrices(r, c, 1))
    if kind == "dweight":
        return T.d(WEIGHTS[(rows, cols)])
    if kind == "dterm":
        return T.d(draw(matrices(rows, cols, 2)))
    if kind == "sum":
        return T.add(form(rows, cols), form(rows, cols))
    if kind == "left":
        k = draw(st.sampled_from(DIMS))
        return T.mul(mat(rows, k), form(k, cols))
    if kind == "right":
        k = draw(st.sampled_from(DIMS))
        return T.mul(form(rows, k), mat(k, cols))
    if kind == "transpose":
        return T.transpose(form(cols, rows))
    if kind == "scalar":
        return T.mul(PROGRAM["s"], form(rows, cols))
    if kind in ("mm", "aa"):
        return make(kind, mat(rows, cols), form(rows, cols))
    return T.hadamard(mat(rows, cols), form(rows, cols))


@st.composite
def scalar_forms(draw):
    """trace(P F S), F a matrix of 1-forms: a scalar 1-form that the form strategies act on."""
    r, c, k = (draw(st.sampled_from(DIMS)) for _ in range(3))
    return make("trace", T.mul(draw(matrices(k, r, 1)), draw(one_forms(r, c, 2)), draw(matrices(c, k, 1))))


def values(seed):
    rng = np.random.default_rng(seed)
    out = {"s": rng.standard_normal((1, 1))}
    for sym in list(CONSTS.values()) + list(WEIGHTS.values()):
        shape = tuple(SIZES[x] for x in sym.shape)
        out[sym.data[0].name] = rng.standard_normal(shape)
    tangent = {sym.data[0].name: rng.standard_normal(tuple(SIZES[x] for x in sym.shape))
               for sym in WEIGHTS.values()}
    return out, tangent


def value(term, vals, tangent=None):
    return Evaluator(vals, SIZES, tangent=tangent).value(term)


def rel(a, b):
    scale = max(np.linalg.norm(a), np.linalg.norm(b), 1e-6)
    return float(np.linalg.norm(a - b) / scale)


@SETTINGS
@given(st.sampled_from(DIMS), st.sampled_from(DIMS), st.integers(0, 2 ** 31), st.data())
def test_strategies_keep_the_value_of_matrices(rows, cols, seed, data):
    term = data.draw(matrices(rows, cols, 3))
    vals, _ = values(seed)
    before = value(term, vals)
    for name in STRATEGIES:
        after = PROGRAM.apply_rules(name, term)
        assert after.shape == term.shape
        assert rel(value(after, vals), before) < 1e-9, "%s changed the value of %s to %s" % (name, text(term),
                                                                                             text(after))


@SETTINGS
@given(scalar_forms(), st.integers(0, 2 ** 31))
def test_strategies_keep_the_value_of_scalar_one_forms(w, seed):
    vals, tangent = values(seed)
    try:
        before = value(w, vals, tangent)
    except NotDifferentiable:
        assume(False)
    for name in FORM_STRATEGIES:
        after = PROGRAM.apply_rules(name, w, check=False)  # the rewriting alone; normal forms are checked elsewhere
        assert after.scalar
        try:
            got = value(after, vals, tangent)
        except NotDifferentiable:
            assume(False)
        assert rel(got, before) < 1e-6, "%s changed the value of %s to %s" % (name, text(w), text(after))


@pytest.mark.parametrize("name", ["normal", "backprop"])
def test_the_normal_forms_are_normal(name):
    """After normal (and backprop), a scalar 1-form is sum_W trace(G_W d(W)) over weights W, and
    its value is the pairing of the coefficients with the tangent: sum_W trace(G_W V_W)."""
    from fdsl.codegen.grads import coefficients

    w = make("trace", T.mul(CONSTS[("q", "p")], make("m", T.mul(WEIGHTS[("p", "q")], make("a", WEIGHTS[("q", "q")]))),
                            T.d(T.mul(make("a", WEIGHTS[("q", "p")]), WEIGHTS[("p", "q")])), CONSTS[("q", "q")]))
    vals, tangent = values(5)
    normal = PROGRAM.apply_rules(name, w)
    coeffs = coefficients(PROGRAM, normal)
    paired = sum(float(np.trace(value(g, vals) @ tangent[x.data[0].name])) for x, g in coeffs.items())
    assert rel(np.array(paired), value(w, vals, tangent)) < 1e-6
