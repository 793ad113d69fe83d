"""``parse(string(t)) == t``: the string printer writes what the parser reads back to the same term.

Terms are interned, so "the same term" is identity (``is``). Checked for every definition of
every example, every subterm of them, encoder(1..3), and for random well-shaped terms built with
the constructors of ``fdsl.core.terms`` (a hypothesis property).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fdsl
from fdsl.core import printers
from fdsl.core import terms as T
from fdsl.core.functions import as_term
from fdsl.core.terms import Term, postorder

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.fd"))


def reparse(program, t: Term) -> Term:
    """What ``string(t)`` reads back as, in the program that declared t's symbols."""
    return as_term(program.expr(printers.string(t)))


def assert_roundtrip(program, t: Term):
    back = reparse(program, t)
    assert back is t, "string(t) = %r reads back as %r" % (printers.string(t), printers.string(back))


def _definitions(path):
    """(program, name, value) of every definition of an example whose value is a term."""
    program = fdsl.load(path)
    return program, [(name, v) for name, v in program.definitions.items() if isinstance(v, Term)]


# Reading costs about 20 microseconds a character: subterms are checked when their string is short,
# which covers every construct of the examples without re-reading the big sums many times.
SUBTERM_CHARS = 400


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_definition_of_every_example(path):
    program, definitions = _definitions(path)
    if not definitions:
        pytest.skip("%s defines no terms" % path.name)
    for name, value in definitions:
        assert_roundtrip(program, value)
        for node in postorder(value):
            if len(printers.string(node)) <= SUBTERM_CHARS:
                assert_roundtrip(program, node)


def test_engine_named_intermediates_roundtrip(examples):
    # backprop names its adjoints G_i, which the program never defines: string() writes them inline
    program = fdsl.load(examples / "deep.fd")
    w = program.definitions["w"]
    assert "where G[7] := " in printers.string(w) or ", G[7] := " in printers.string(w)
    assert_roundtrip(program, w)


@pytest.mark.parametrize("L", [1, 2, 3])
def test_encoder(L, examples):
    program = fdsl.load(examples / "encoder2.fd")
    assert_roundtrip(program, program.call_definition("encoder", L))


# ---- random terms --------------------------------------------------------------------------------

PROGRAM = """\
dim n = 3, d = 2
dim p
const A : n x n, B : n x n, X : n x d, G : p x n
const C : n x 1 = ones, I : n x n = identity
scalar s = d^(-1/2), r
weight W : d x n, V[i] : n x n, P[i, j] : d x d, b : 1 x n
N := A B
nm(i) := A V[i] + B
"""

PROG = fdsl.parse(PROGRAM, "roundtrip.fd")
DIMS = ("n", "d", "p", 1)
SCALAR = (1, 1)


def _leaves():
    """Symbols, named definitions, identities and zeros, by shape (transposes included)."""
    ex = lambda text: as_term(PROG.expr(text))
    found = [PROG.symbols[x] for x in ("A", "B", "X", "G", "C", "I", "W", "b", "s", "r")]
    found += [ex("V[0]"), ex("V[2]"), ex("P[0, 1]"), ex("P_1_0"), PROG["N"], ex("nm(1)"), ex("eye(d)")]
    found += [PROG.dim_term(x) for x in ("n", "d", "p")]
    by_shape: dict = {}
    for t in found:
        by_shape.setdefault(SCALAR if t.scalar else t.shape, []).append(t)
        if not t.scalar and t.shape[0] != t.shape[1]:
            by_shape.setdefault(t.shape[::-1], []).append(T.transpose(t))
    return by_shape


LEAVES = _leaves()
MATRIX_SHAPES = [s for s in LEAVES if s != SCALAR]
rationals = st.fractions(min_value=-4, max_value=4, max_denominator=4)


@st.composite
def terms(draw, shape, depth=3):
    """A random term of ``shape`` (SCALAR for scalars) built by the constructors of fdsl.core.terms."""
    leaf = lambda: draw(st.sampled_from(LEAVES[shape] + [T.zero(shape)] if shape != SCALAR
                                        else LEAVES[SCALAR] + [T.num(draw(rationals))]))
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return leaf()
    sub = lambda s=shape: draw(terms(s, depth - 1))
    if shape == SCALAR:
        kind = draw(st.sampled_from(["trace", "mul", "add", "neg", "power", "coefficient", "d", "m", "had"]))
        if kind == "trace":
            return T.make("trace", [sub(draw(st.sampled_from([(x, x) for x in ("n", "d")])))])
        if kind == "power":
            base, exponent = sub(), draw(rationals)
            if T.is_zero(base) and exponent < 0:
                exponent = -exponent  # 0 to a negative power is a division by zero
            return T.power(base, exponent)
        if kind == "had":
            t = T.hadamard(sub(), sub())
            # hadamard() does not multiply numbers out (mul() does): 2 * 3 stays a had node, which
            # the language reads as the number 6. Keep such nodes out of the property.
            return T.mul(*t.args) if t.op == "had" and all(a.op == "num" for a in t.args) else t
    else:
        kind = draw(st.sampled_from(["product", "scale", "coefficient", "add", "sub", "neg", "transpose",
                                     "had", "m", "a", "mm", "aa", "d", "scale"]))
        rows, cols = shape
        if kind == "a" and cols == 1:  # the softmax of one column is refused (all ones): not a program
            kind = "m"
        if kind == "product":
            middle = draw(st.sampled_from([m for m in DIMS if (rows, m) in LEAVES and (m, cols) in LEAVES]))
            return T.mul(sub((rows, middle)), sub((middle, cols)))
        if kind == "scale":
            return T.mul(sub(SCALAR), sub())
        if kind == "transpose":
            return T.transpose(sub((cols, rows)))
        if kind == "had":
            return T.hadamard(sub(), sub())
        if kind in ("mm", "aa"):
            return T.make(kind, [sub(), sub()])
    if kind == "mul":
        return T.mul(sub(), sub())
    if kind == "coefficient":
        return T.mul(T.num(draw(rationals)), sub())
    if kind == "add":
        return T.add(sub(), sub())
    if kind == "sub":
        return T.sub(sub(), sub())
    if kind == "neg":
        return T.neg(sub())
    if kind in ("d", "m", "a"):
        return T.make(kind, [sub()])
    raise AssertionError(kind)


any_term = st.sampled_from(MATRIX_SHAPES + [SCALAR]).flatmap(lambda shape: terms(shape))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_term)
def test_random_terms_roundtrip(t):
    assert_roundtrip(PROG, t)
    for f in (printers.text, printers.latex, printers.html):  # the other printers accept it too
        assert isinstance(f(t), str)


EDGE_CASES = [
    "P[0, 1]", "d(P[1, 0])", "nm(2)", "nm(0) N", "-(1/2) A", "A - (1/2) B", "-1/2 + r", "(1/2)^(1/2)",
    "(-2)^(1/2) A", "2 3^(1/2) A", "(s^(1/2))^2", "s^(0)", "r^(-2)", "A^t^t", "A * (-B)", "-(A * B)",
    "-(A + B)", "r (A + B)", "trace(A) - 1", "-1 + r", "1/2 * s", "s * 1/2", "trace(-1)", "m(-2)", "d(2)",
    "eye(n)", "zeros(n, d)", "zeros(1, n)", "C^t C + s", "C^t C * s", "(r - 2 s) A", "mm(A, B + A) * B",
]


@pytest.mark.parametrize("text", EDGE_CASES)
def test_edge_cases(text):
    assert_roundtrip(PROG, as_term(PROG.expr(text)))


def test_constructors_fold_numbers_as_the_parser_does():
    """Terms the constructors leave unfolded would read back as another term."""
    assert T.power(T.num(0), 0) is T.num(1) and as_term(PROG.expr("0^0")) is T.num(1)
    assert T.power(T.num(4), Fraction(-1)) is as_term(PROG.expr("4^(-1)")) is T.num(Fraction(1, 4))
