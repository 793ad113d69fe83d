"""The fdsl language (issue 2): operators, declarations, definitions, sharing, shapes, printers.

Table-driven: each row is an expression written in the language and what elaborating it must
give (its head operator, its shape, how ``show`` prints it). The program every row is read in
is PROGRAM below; sizes are numeric except ``p``, which stays symbolic.
"""

from __future__ import annotations

import io
import re
from fractions import Fraction

import pytest

import fdsl
from fdsl.calculus.forms import weights
from fdsl.core import printers
from fdsl.core import terms as T
from fdsl.core.functions import as_term, render
from fdsl.core.terms import Symbol, dag_size, tree_size
from fdsl.lang.program import Family

PROGRAM = """\
dim n = 8, d = 6, k = 4, h = 5
dim p                                   # symbolic: no size
const X : n x d, Y : n x d, A : n x n, B : n x n, G : p x n, N3 : 3 x n
const C : n x 1 = ones, I : n x n = identity
scalar s = k^(-1/2), r
weight Q[i], K[i] : d x k
weight W : n x n, P[i, j] : n x n
"""


@pytest.fixture(scope="module")
def prog():
    return fdsl.parse(PROGRAM, "lang.fd")


def ev(prog, text):
    """An expression's value as a term (numbers become number terms)."""
    return as_term(prog.expr(text))


# (expression, head operator, shape, text as ``show`` prints it)
OPERATORS = [
    ("A B", "mul", ("n", "n"), "A B"),  # product by juxtaposition
    ("X^t A X", "mul", ("d", "d"), "X^t A X"),
    ("A + B", "add", ("n", "n"), "A + B"),
    ("A - B", "add", ("n", "n"), "A - B"),  # binary minus: a sum with -1 B
    ("-A", "mul", ("n", "n"), "-A"),  # unary minus: the product -1 A
    ("2 A", "mul", ("n", "n"), "2 A"),  # scalar multiples
    ("s A", "mul", ("n", "n"), "s A"),
    ("k^(-1/2) A", "mul", ("n", "n"), "k^(-1/2) A"),
    ("A / 2", "mul", ("n", "n"), "(1/2) A"),
    ("A^t", "t", ("n", "n"), "A^t"),
    ("X^t", "t", ("d", "n"), "X^t"),
    ("A * B", "had", ("n", "n"), "A * B"),  # Hadamard product
    ("2 * A", "mul", ("n", "n"), "2 A"),  # componentwise by a scalar: a scalar multiple
    ("trace(A)", "trace", (1, 1), "trace(A)"),
    ("d(W)", "d", ("n", "n"), "dW"),
    ("d(A B)", "d", ("n", "n"), "d(A B)"),
    ("m(A)", "m", ("n", "n"), "m(A)"),
    ("a(X Q[0])", "a", ("n", "k"), "a(X Q_0)"),
    ("mm(A, B)", "mm", ("n", "n"), "mm(A, B)"),
    ("aa(A, B)", "aa", ("n", "n"), "aa(A, B)"),
    ("0 A", "zero", ("n", "n"), "0"),  # 0 times a matrix is the zero matrix of its shape
    ("A + 0", "sym", ("n", "n"), "A"),  # the number 0 is the zero of every shape
    ("0 - A", "mul", ("n", "n"), "-A"),
    ("A * 0", "zero", ("n", "n"), "0"),
    ("mm(A, 0)", "zero", ("n", "n"), "0"),  # mm is linear in its second argument
    ("(A + B) A", "mul", ("n", "n"), "(A + B) A"),
    ("s (A + B)", "mul", ("n", "n"), "s (A + B)"),
    ("s(A + B)", "mul", ("n", "n"), "s (A + B)"),  # a symbol called like a function scales
    ("(A B)^t", "t", ("n", "n"), "(A B)^t"),
    ("G A", "mul", ("p", "n"), "G A"),  # symbolic size
    ("N3 A N3^t", "mul", (3, 3), "N3 A N3^t"),  # numeric size
    ("C^t A C", "mul", (1, 1), "C^t A C"),  # 1 x 1, but a matrix, not a scalar
    ("s r", "mul", (1, 1), "s r"),
    ("r^2", "pow", (1, 1), "r^2"),
    ("eye(n) A", "sym", ("n", "n"), "A"),  # the identity is the unit of products
    ("zeros(n, d)", "zero", ("n", "d"), "0"),
    ("Q[0]", "sym", ("d", "k"), "Q_0"),
    ("Q_0", "sym", ("d", "k"), "Q_0"),
    ("P[1, 2]", "sym", ("n", "n"), "P_1_2"),
    ("m(a(s X Q[0] K[0]^t X^t) X)", "m", ("n", "d"), "m(a(s X Q_0 K_0^t X^t) X)"),
]


@pytest.mark.parametrize("text, op, shape, shown", OPERATORS, ids=[row[0] for row in OPERATORS])
def test_operator(prog, text, op, shape, shown):
    t = ev(prog, text)
    assert (t.op, t.shape, str(t)) == (op, shape, shown)


SCALARS = ["s", "r", "k", "s r", "trace(A)", "r^2", "k^(-1/2)", "2 s", "s + r", "trace(A) s"]
MATRICES = ["A", "C^t A C", "d(A)", "A * B", "eye(n)"]


@pytest.mark.parametrize("text", SCALARS)
def test_scalars_commute(prog, text):
    """Scalars are 1 x 1, flagged scalar, and stand first in a product whatever the order written."""
    t = ev(prog, text)
    assert t.scalar and t.shape == (1, 1)
    assert ev(prog, "A (%s) B" % text) is ev(prog, "(%s) A B" % text)


@pytest.mark.parametrize("text", MATRICES)
def test_matrices_are_not_scalars(prog, text):
    assert not ev(prog, text).scalar


def test_structure_of_operators(prog):
    A, B = prog["A"], prog["B"]
    assert ev(prog, "A - B").args == (A, T.mul(T.num(-1), B))
    assert ev(prog, "-A").args == (T.num(-1), A)
    assert ev(prog, "k^(-1/2) A").args[0] is T.power(prog.dim_term("k"), Fraction(-1, 2))
    assert ev(prog, "A^t").args == (A,)
    assert ev(prog, "mm(A, B)").args == (A, B)
    assert ev(prog, "A / 2").args == (T.num(Fraction(1, 2)), A)
    assert ev(prog, "0 A") is T.zero(("n", "n"))
    assert prog.expr("0") == 0 and prog.expr("2 - 3/4") == Fraction(5, 4)  # numbers stay exact
    assert ev(prog, "2 (3 A)").args == (T.num(6), A)  # one leading coefficient


def test_parentheses_only_group(prog):
    assert ev(prog, "((A))") is prog["A"]
    assert ev(prog, "(A B) (A B)") is ev(prog, "A B A B")


def test_indexed_names_are_one_symbol(prog):
    """Q_0 and Q[0] name the same symbol: one interned object."""
    assert ev(prog, "Q_0") is ev(prog, "Q[0]")
    assert ev(prog, "P_1_2") is ev(prog, "P[1, 2]")
    assert ev(prog, "Q[0]") is not ev(prog, "Q[1]")
    assert ev(prog, "Q[0]").data[0] == Symbol("Q", (0,), "weight", None)


def test_flat_products_and_sums_keep_their_order(prog):
    A, B, W = prog["A"], prog["B"], prog["W"]
    assert ev(prog, "A (B (A W))").args == (A, B, A, W)
    assert ev(prog, "((A B) A) W").args == (A, B, A, W)
    assert ev(prog, "(A + B) + (W + A)").args == (A, B, W, A)
    assert ev(prog, "A + (B + (W + A))").args == (A, B, W, A)
    assert ev(prog, "B + A").args == (B, A)  # summands are not sorted
    assert ev(prog, "(A * B) * (W * A)").args == (A, B, W, A)
    assert ev(prog, "A s B r").args == (prog["s"], prog["r"], A, B)  # scalars first, in order


# ---- declarations ------------------------------------------------------------------------------


def test_dims(prog):
    assert prog.dims == {"n": 8, "d": 6, "k": 4, "h": 5, "p": None}
    assert ev(prog, "k").data[0] == Symbol("k", (), "dim", 4)


def test_consts(prog):
    assert prog.symbols["X"].data[0] == Symbol("X", (), "const", None)
    assert prog.symbols["C"].data[0].value == "ones" and prog.symbols["C"].shape == ("n", 1)
    assert prog.symbols["I"].data[0].value == "identity"
    assert not prog.symbols["X"].has_weight


def test_scalars(prog):
    s, r = prog.symbols["s"], prog.symbols["r"]
    assert s.data[0].kind == "scalar" and s.data[0].value is ev(prog, "k^(-1/2)")
    assert r.data[0].value is None and r.scalar


def test_weight_families(prog):
    assert prog.families["Q"] == Family("weight", ("i",), ("d", "k"), None)
    assert prog.families["K"] == Family("weight", ("i",), ("d", "k"), None)  # shape shared with Q
    assert prog.families["P"].indices == ("i", "j")
    assert ev(prog, "Q[3]").has_weight and prog.symbols["W"].has_weight


def test_shape_applies_to_the_names_before_it():
    p = fdsl.parse("dim n, m\nweight A, B : n x m, c : m x m\n")
    assert [p.symbols[x].shape for x in "ABc"] == [("n", "m"), ("n", "m"), ("m", "m")]


# ---- definitions -------------------------------------------------------------------------------

DEFINITIONS = PROGRAM + """\
layer(i, Z) = m(a(s Z Q[i] K[i]^t Z^t) Z + C C^t Z) + Z
encoder(0) = X
encoder(L) = layer(L-1, encoder(L-1))
pick(i) = Q[2 i + 1]                    # an index computed from an integer argument
fib(0) = A
fib(1) = B
fib(j) = fib(j-1) fib(j-2)
M = A + B                               # transparent: M is its value
N := A + B                              # named: prints as N
named(L) := m(encoder(L))
"""


@pytest.fixture(scope="module")
def defs():
    return fdsl.parse(DEFINITIONS, "defs.fd")


def test_recursion_on_integers(defs):
    X = defs["X"]
    assert ev(defs, "encoder(0)") is X
    assert ev(defs, "encoder(1)") is ev(defs, "layer(0, X)")
    assert ev(defs, "encoder(3)") is ev(defs, "layer(2, layer(1, layer(0, X)))")
    assert ev(defs, "encoder(1+1)") is ev(defs, "encoder(2)")
    assert defs.call_definition("encoder", 2) is ev(defs, "encoder(2)")


def test_computed_indices(defs):
    assert ev(defs, "pick(1)") is ev(defs, "Q[3]")
    assert ev(defs, "fib(4)") is ev(defs, "B A B B A")


def test_transparent_definition(defs):
    assert defs["M"] is ev(defs, "A + B")
    assert str(ev(defs, "M A")) == "(A + B) A"


def test_named_definitions(defs):
    N = defs["N"]
    assert N.op == "let" and N.args == (ev(defs, "A + B"),) and N.shape == ("n", "n")
    assert printers.text(ev(defs, "N A")) == "N A"
    assert str(ev(defs, "N A")) == "N A\nwhere\n  N := A + B"  # str carries the bindings, as show does
    assert printers.string(N) == "(N where N := A + B)"  # named intermediates are written inline
    named = ev(defs, "named(2)")
    assert named.op == "let" and named.data == ("named", (2,)) and named.args[0] is ev(defs, "m(encoder(2))")
    assert printers.text(named) == "named_2" and str(named).startswith("named_2 := m(")
    # encoder(1), used three times, is bound first, transparently (=)
    assert printers.string(named).startswith("(named[2] where encoder[1] = m(")
    assert ", named[2] := m(m(a(s encoder[1] Q[1] " in printers.string(named)
    assert ev(defs, "named(2)") is named


def test_later_clauses_do_not_hide_base_cases(defs):
    assert len(defs.clauses["fib"]) == 3 and ev(defs, "fib(0)") is defs["A"]


# ---- sharing -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def encoder2(examples):
    program = fdsl.load(examples / "encoder2.fd")
    with program.active():  # its printers' names (encoder_1) are the program's own: the tests print with them
        yield program


def test_encoder_grows_linearly_as_a_graph_and_3x_as_a_tree(encoder2):
    """encoder(L) uses encoder(L-1) three times: the DAG grows by a constant, the tree by 3x."""
    layers = [encoder2.call_definition("encoder", L) for L in range(8)]
    dag = [dag_size(t) for t in layers]
    tree = [tree_size(t) for t in layers]
    steps = {dag[L + 1] - dag[L] for L in range(2, 7)}
    assert len(steps) == 1 and steps.pop() > 0
    assert len({tree[L + 1] - 3 * tree[L] for L in range(1, 7)}) == 1  # tree(L+1) = 3 tree(L) + c
    assert tree[7] > 100 * dag[7]


def test_deep_encoder_is_shared(encoder2):
    sizes = [dag_size(encoder2.call_definition("encoder", L)) for L in (38, 39, 40)]
    assert sizes[2] - sizes[1] == sizes[1] - sizes[0]
    assert tree_size(encoder2.call_definition("encoder", 40)) > 3 ** 40  # counted on the graph, never built


def test_equal_terms_are_one_object(prog):
    assert ev(prog, "m(A B) + s A") is ev(prog, "m(A B) + s A")
    left = ev(prog, "m(A B) m(A B)")
    assert left.args[0] is left.args[1]


# ---- printers ----------------------------------------------------------------------------------

# (expression, text, string, latex, html); html without the outer <span class="fdsl">...</span>
PRINTED = [
    ("s X Q[0] K[0]^t X^t", "s X Q_0 K_0^t X^t", "s X Q[0] K[0]^t X^t", r"s \, X \, Q_{0} \, {K_{0}}^{t} \, {X}^{t}",
     "<i>s</i> <i>X</i> <i>Q</i><sub>0</sub> <i>K</i><sub>0</sub><sup>t</sup> <i>X</i><sup>t</sup>"),
    ("A - 2 B", "A - 2 B", "A - 2 B", r"A - 2 \, B", "<i>A</i> &minus; 2 <i>B</i>"),
    ("-(1/2) A^t B", "-(1/2) A^t B", "-(1/2) A^t B", r"-\left(\tfrac{1}{2}\right) \, {A}^{t} \, B",
     "&minus;(1/2) <i>A</i><sup>t</sup> <i>B</i>"),
    ("mm(A, d(W)) * B", "mm(A, dW) * B", "mm(A, d(W)) * B", r"\operatorname{mm}\left(A, \mathrm{d}W\right) \circ B",
     '<span class="op">mm</span>(<i>A</i>, d<i>W</i>) &#8728; <i>B</i>'),
    ("trace(A) + r^2", "trace(A) + r^2", "trace(A) + r^2", r"\operatorname{trace}\left(A\right) + {r}^{2}",
     '<span class="op">trace</span>(<i>A</i>) + <i>r</i><sup>2</sup>'),
    ("d(P[0, 1])", "dP_0_1", "d(P[0, 1])", r"\mathrm{d}P_{0,1}", "d<i>P</i><sub>0,1</sub>"),
    ("k^(-1/2) A", "k^(-1/2) A", "k^(-1/2) A", r"{k}^{-1/2} \, A", "<i>k</i><sup>-1/2</sup> <i>A</i>"),
    ("eye(n)", "I_n", "eye(n)", "I_{n}", "<i>I</i><sub>n</sub>"),
    ("zeros(n, d)", "0", "zeros(n, d)", "0", "0"),
    ("m(A)^t", "m(A)^t", "m(A)^t", r"{m\left(A\right)}^{t}", '<span class="op">m</span>(<i>A</i>)<sup>t</sup>'),
    ("(A + B) * (A - B)", "(A + B) * (A - B)", "(A + B) * (A - B)", r"\left(A + B\right) \circ \left(A - B\right)",
     "(<i>A</i> + <i>B</i>) &#8728; (<i>A</i> &minus; <i>B</i>)"),
]


@pytest.mark.parametrize("text, shown, string, latex, html", PRINTED, ids=[row[0] for row in PRINTED])
def test_printers(prog, text, shown, string, latex, html):
    t = ev(prog, text)
    assert printers.text(t) == shown == str(t)
    assert printers.string(t) == string
    assert printers.latex(t) == latex
    assert printers.html(t) == '<span class="fdsl">%s</span>' % html


def test_jupyter_shows_latex(prog):
    t = ev(prog, "s X Q[0]")
    assert t._repr_latex_() == r"$s \, X \, Q_{0}$"
    assert repr(t) == "Term(s X Q[0])"


def test_printing_functions_in_the_language(prog):
    for f in ("text", "string", "latex", "html"):
        assert prog.expr("%s(A B^t)" % f) == getattr(printers, f)(ev(prog, "A B^t"))
    assert prog.expr("shape(G A)") == "(p x n)" and prog.expr("shape(trace(A))") == "scalar"
    assert prog.expr("nodes(A B + A)") == 4  # A, B, A B and the sum: A is stored once


# ---- the Python API and the command line ----------------------------------------------------------


def test_load_and_parse_give_programs_of_terms(examples):
    loaded = fdsl.load(examples / "encoder2.fd")
    parsed = fdsl.parse((examples / "encoder2.fd").read_text())
    assert isinstance(loaded, fdsl.Program) and isinstance(loaded["E"], fdsl.Term)
    assert loaded["E"] is parsed["E"]  # interned across programs: same declarations, same terms
    assert loaded["E"].shape == ("n", "d")


def test_effects_wait_for_run(examples):
    program = fdsl.load(examples / "encoder2.fd")
    assert len(program.effects) == 5
    out = io.StringIO()
    program.run(out)
    assert out.getvalue().splitlines()[0] == "-trace(E^t dE)"
    assert program.effects == []


def test_show_spellings():
    p = fdsl.parse("dim n\nconst A : n x n\nshow A\nshow(A)\nA\nshow A, A^t; show string(A)\n")
    out = io.StringIO()
    p.run(out)
    assert out.getvalue() == "A\nA\nA\nA\nA^t\nA\n"


def test_command_keywords_match_the_statement_table(repo):
    """The grammar's COMMAND and METRIC terminals and fdsl.lang.statements.STATEMENTS list the same keywords."""
    from fdsl.lang.statements import STATEMENTS

    grammar = (repo / "grammar" / "fdsl.lark").read_text()
    keywords = re.search(r"^COMMAND\.\d+: /\((.*)\)\\b/", grammar, re.M).group(1).split("|")
    keywords += re.findall(r"^METRIC\.\d+: /(\w+)\\b/", grammar, re.M)
    assert set(keywords) == set(STATEMENTS)


def test_run_encoder2_through_the_cli(run_fdsl, examples, encoder2):
    """The README's first command does the main job: the form, the size of the manual's expanded
    form, a coefficient of the normal form for a weight of each layer, and the manual's question."""
    proc = run_fdsl("run", examples / "encoder2.fd")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    N = encoder2["N"]
    E = encoder2["E"]
    # the first show that refers to E binds it; later ones name it only
    expected = [render(encoder2["w"]), str(len(T.summands(encoder2.expr("forms(E)"))))]
    expected += [render(encoder2.expr(x), {E}) for x in
                 ("coeff(N, W[1])", "coeff(N, W[0])", "depends(coeff(N, K[0]), Q[1])")]
    assert proc.stdout == "\n".join(expected) + "\n"
    # E's binding uses encoder_1, bound beside it (encoder(1) is used three times)
    assert proc.stdout.startswith("-trace(E^t dE)\nwhere\n  encoder_1 = m(a(s X Q_0 K_0^t X^t) X V_0 + C b_0)"
                                  " W_0 + C f_0\n  E := Y - (m(a(s encoder_1 Q_1 K_1^t encoder_1^t) encoder_1 V_1")
    assert proc.stdout.count("E := ") == 1
    assert "true, via " in proc.stdout and proc.stdout.rstrip().endswith("Q_1")
    assert {x.data[0].name for x in weights(N)} == {"Q", "K", "V", "W", "b", "f"}
    assert len(T.summands(N)) == 12  # one term per weight of the two layers


def test_trace_of_encoder2_shows_the_rules_firing(run_fdsl, examples):
    proc = run_fdsl("run", "--trace", examples / "encoder2.fd")
    assert proc.returncode == 0, proc.stderr
    fired = {line.split()[0][1:] for line in proc.stderr.splitlines() if line.startswith("[")}
    assert {"leibniz", "d-relu", "d-softmax", "flip-mm", "flip-aa", "cycle", "collect"} <= fired


