"""Renaming (fdsl.core.alpha): terms equal up to the names of their leaves share one rewrite.

The oracle is the engine with renaming turned off, run in a fresh interpreter (terms are interned
process-wide, so a second run in this one would only read the first one's memo): the normal forms
must be the same term, printed the same, for programs whose layers repeat and for ones with a
rule that reads let bodies (the expanded form's ``unfold``)."""

import subprocess
import sys
import textwrap

import pytest
from oracle import ENCODER  # examples/encoder2.fd's declarations, layer(i, Z) and encoder(L)

import fdsl
from fdsl.calculus.forms import form
from fdsl.core import alpha
from fdsl.core import terms as T

PROGRAMS = {
    "named": ENCODER + "N(0) = X\nN(L) := layer(L-1, N(L-1))\nE := Y - N(5)\n",
    "natural": ENCODER + "E = Y - encoder(5)\n",
    # a residual stream with a learned scalar: repeats with sums and scalars
    "residual": ENCODER + "weight g[i] : scalar\nR(0) = X\nR(L) = R(L-1) + g[L-1] layer(L-1, R(L-1))\n"
                          "E = Y - R(4)\n",
}

SCRIPT = textwrap.dedent("""\
    import sys
    import fdsl
    from fdsl.core import alpha
    from fdsl.core import printers
    from fdsl.calculus.forms import form
    if sys.argv[1] == "off":
        alpha.canonical = lambda root, lets: (root, {})
    p = fdsl.parse(sys.stdin.read())
    print(printers.string(p.apply_rules(sys.argv[2], form(p["E"]))))
""")


def normal_form_text(program: str, strategy: str, renaming: bool) -> str:
    r = subprocess.run([sys.executable, "-c", SCRIPT, "on" if renaming else "off", strategy], input=program,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_renaming_gives_the_normal_form_of_rewriting_every_layer(name):
    on = normal_form_text(PROGRAMS[name], "normal", True)
    off = normal_form_text(PROGRAMS[name], "normal", False)
    assert "d(Q[4])" in on or "d(Q[3])" in on  # the text really is a normal form of the deep program
    assert on == off


def test_a_ruleset_that_reads_let_bodies_keeps_lets_as_they_are():
    # expandAll unfolds d(X_i) into the d of X_i's body: a placeholder let would unfold to nothing
    program = ENCODER + "N(0) = X\nN(L) := layer(L-1, N(L-1))\nE := Y - N(2)\n"
    assert normal_form_text(program, "expanded", True) == normal_form_text(program, "expanded", False)


def test_two_layers_have_one_canonical_form_and_rename_back():
    p = fdsl.parse(PROGRAMS["named"])
    lets = {}
    for t in T.postorder(p["E"]):
        if t.op == "let":
            lets[t.data] = t
    layer = {i: T.make("trace", (T.mul(T.transpose(lets[("N", (i + 1,))]), T.d(lets[("N", (i + 1,))].args[0])),))
             for i in (2, 3)}
    (c2, back2), (c3, back3) = (alpha.canonical(layer[i], True) for i in (2, 3))
    assert c2 is c3 and layer[2] is not layer[3]
    assert alpha.rename(c2, back2) is layer[2] and alpha.rename(c3, back3) is layer[3]
    # the renaming keeps what rules can see: shapes, weights, differentials
    for placeholder, atom in back2.items():
        assert (placeholder.shape, placeholder.scalar, placeholder.has_weight, placeholder.has_d) == \
               (atom.shape, atom.scalar, atom.has_weight, atom.has_d)


def test_errors_name_the_real_terms(tmp_path):
    rules = tmp_path / "spin.rules"
    rules.write_text("ruleset spin\nrule flip: trace(?A) => trace(?A^t) when not scalar(?A)\n"
                     "rule unflip: ?A^t^t => ?A\n")
    fd = tmp_path / "spin.fd"
    fd.write_text('rules "spin.rules"\ndim n = 3\nconst Alpha : n x n\nweight Beta : n x n\n'
                  "show spin(trace(Alpha Beta))\n")
    r = subprocess.run([sys.executable, "-m", "fdsl", "run", str(fd)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "spin loops: trace(Alpha Beta) rewrote back to itself" in r.stderr, r.stderr
    assert "#" not in r.stderr.splitlines()[0]


def test_trace_shows_every_rewrite_with_real_names():
    out = []

    class Sink:
        def write(self, s):
            out.append(s)

    p = fdsl.parse(ENCODER + "N(0) = X\nN(L) := layer(L-1, N(L-1))\nE := Y - N(3)\n")
    p.options["trace"] = True
    p.trace_out = Sink()
    p.apply_rules("backprop", form(p["E"]))
    fired = "".join(out)
    assert "#" not in fired
    for i in range(3):  # every layer is rewritten, none renamed
        assert "dK_%d" % i in fired
