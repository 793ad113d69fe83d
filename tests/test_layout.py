"""Long terms printed on several lines: a normal form one weight per line (``dW_0: G``), long
coefficients, forms and definitions broken at their sums, LaTeX long forms as ``aligned``."""

from __future__ import annotations

import re

import pytest
from conftest import EXAMPLES

import fdsl
from fdsl.calculus import forms
from fdsl.core import normal, printers
from fdsl.core import terms as T
from fdsl.core.functions import render
from fdsl.core.layout import WIDTH


@pytest.fixture(scope="module")
def enc():
    p = fdsl.load(EXAMPLES / "encoder2.fd")
    # the error written out (encoder2.fd names it E := ..., which would add a binding to print)
    p.feed("wn = normal(form(Y - encoder(2)))\nwe = expanded(form(Y - encoder(2)))\nz = forms(Y - encoder(2))")
    return p


def joined(lines):
    """Continuation lines put back: the text of one weight's coefficient."""
    out = []
    for line in lines:
        if line.startswith(" "):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out


def test_the_encoder2_normal_form_prints_one_weight_per_line(enc):
    w = enc["wn"]
    shown = render(w)
    # the shared normal form: one line per weight, then the bindings (encoder_1, its adjoint, S_1, ...)
    lines = joined(shown.split("\nwhere\n")[0].splitlines())
    weights = forms.weights(w)
    assert len(lines) == len(weights) == 12
    shared = dict(normal.pairs(printers.shown(w).term))  # the coefficients as the bindings name them
    for line, weight in zip(lines, weights):
        head, _, body = line.partition(": ")
        assert head == "d" + weight.data[0].printed()
        # what is printed is the coefficient, its repeats by the names the where block binds
        assert body == printers.Printer(printers.Style())(shared[weight])
        assert unfolded(shared[weight]) is unfolded(forms.coeff(w, weight))
    assert str(w) == shown  # print(w) in Python reads the same


def unfolded(t):
    """``t`` with every named intermediate replaced by its body: its value, however it is named."""
    out = {}
    for node in T.postorder(t):
        out[node] = out[node.args[0]] if node.op == "let" else T.rebuild(node, [out[c] for c in node.args])
    return out[t]


def test_long_coefficients_break_at_their_sums(enc):
    lines = render(enc["we"]).splitlines()  # the expanded normal form: long sums
    starts = [m for m in lines if m.startswith("dK_0: ")]
    assert starts
    i = lines.index(starts[0])
    more = []
    for line in lines[i + 1:]:
        if not line.startswith(" "):
            break
        more.append(line)
    assert more and all(re.match(r"^ {6}[+-] ", line) for line in more)  # under the coefficient's start


def test_a_long_form_breaks_between_summands_and_a_matrix_does_not(enc):
    z = enc["z"]  # forms(E): 24 summands of the same weights, not collected
    lines = render(z).split("\nwhere\n")[0].splitlines()  # then the bindings of its repeats
    assert len(lines) > 1 and all(line.startswith(("+ ", "- ")) for line in lines[1:])
    one_line = printers.Printer(printers.Style())(printers.shown(z).term)
    assert " ".join(lines) == one_line  # nothing lost or added, only line breaks
    for line in lines:  # a line longer than WIDTH is one summand that does not fit alone
        assert len(line) <= WIDTH or line.count(" + ") + line.count(" - ") <= line.count("(")
    M = enc.expr("m(a(s X Q[0] K[0]^t X^t) X V[0] + C b[0]) W[0] + m(a(s X Q[1] K[1]^t X^t) X V[1] + C b[1]) W[1]"
                 " + C f[0] + C f[1]")  # a long matrix, with no repeat to name
    assert len(render(M)) > WIDTH and render(M) == printers.text(M) and "\n" not in render(M)


def test_definitions_break_at_their_sums():
    terms = " + ".join("A%d W" % i for i in range(30))
    p = fdsl.parse("dim n\nconst %s : n x n\nweight W : n x n\nG := %s\n"
                   % (", ".join("A%d" % i for i in range(30)), terms))
    lines = render(p.expr("G W")).splitlines()
    assert lines[:2] == ["G W", "where"] and lines[2].startswith("  G := A0 W + A1 W")
    assert len(lines) > 3 and all(line.startswith("       + ") for line in lines[3:])


def test_latex_of_a_normal_form_is_aligned_one_row_per_weight(enc):
    w = enc["wn"]
    tex, _, where = printers.latex(w).partition(r" \quad\text{where}\quad ")
    assert tex.startswith("\\begin{aligned}\n") and tex.endswith("\n\\end{aligned}")
    assert r"\mathrm{encoder}_{1} &:= " in where  # the bindings the coefficients refer to
    rows = tex.split(" \\\\\n")
    heads = [r for r in rows if r.lstrip("\\begin{aligned}\n").startswith("\\mathrm{d}") or "&\\colon" in r]
    assert len(heads) == 12
    assert "\\mathrm{d}K_{0} &\\colon\\ " in tex
    assert w._repr_latex_().startswith("$") and "aligned" in w._repr_latex_()
    # the adjoint G_encoder_1: its "_" is a letter of the name, not TeX's subscript (G, sub e, ncoder)
    assert r"\mathrm{G\_encoder}_{1} &:= " in where
    assert not re.search(r"\\math(rm|it)\{[^}]*(?<!\\)_[^}]*\}", printers.latex(w))


def test_latex_names_with_underscores():
    p = fdsl.parse("dim n\nconst A : n x n\nweight my_w : n x n\nmy_x := my_w A")
    assert printers.latex(p.expr("my_x A")) == (r"\mathrm{my\_x} \, A \quad\text{where}\quad "
                                                r"\begin{aligned}\mathrm{my\_x} &:= \mathit{my\_w} \, A\end{aligned}")


def test_latex_of_a_short_term_is_one_formula(enc):
    # the bindings of repeats (encoder_1, used three times) are an aligned list after "where"
    formula = lambda t: printers.latex(t).split(r"\quad\text{where}")[0]
    assert "aligned" not in formula(enc["E"])
    assert "aligned" not in formula(enc.expr("forms(Y - encoder(2), 4)"))
    assert "aligned" in formula(enc["z"])


def test_str_of_a_deep_coefficient_carries_its_bindings_each_once_in_order():
    deep = fdsl.load(EXAMPLES / "deep.fd")
    lines = str(deep.expr("coeff(w, K[5])")).splitlines()
    assert lines[1] == "where"
    names = [line.split(" := ")[0].strip() for line in lines[2:] if " := " in line]
    assert len(names) == len(set(names))  # each binding once
    assert {"X_5", "G_6", "G_7", "E", "X_8"} <= set(names)
    for later, earlier in (("X_5", "X_4"), ("G_6", "G_7"), ("G_7", "E"), ("E", "X_8")):
        assert names.index(earlier) < names.index(later)  # a binding comes after what it uses
