"""Printed ``where`` blocks read as a person writes them (issue 22, item 7).

Two properties, in every printer that prints bindings (text, string, LaTeX, HTML):

- a binding uses the names bound beside it: encoder2's ``E := Y - ...`` was built before
  ``normal`` named ``encoder_1``, and its body says ``encoder_1``, not layer 0 three times;
- a repeated subterm is named at every depth, by the rule that names ``S_i`` at depth 8: the
  two-layer encoder's ``s encoder_1 Q_1 K_1^t encoder_1^t`` is bound once as at depth 8
  ``s encoder_5 Q_5 K_5^t encoder_5^t`` is.

``string()`` still reads back to the very term (``tests/test_roundtrip.py`` for every example).
"""

from __future__ import annotations

import pytest
from conftest import EXAMPLES
from test_roundtrip import assert_roundtrip

import fdsl
from fdsl.core import printers
from fdsl.core import terms as T
from fdsl.core.functions import render
from fdsl.core.share import SMALL

LAYER0 = "Q_0 K_0^t"  # layer 0's attention scores, as text prints them


@pytest.fixture(scope="module")
def enc():
    return fdsl.load(EXAMPLES / "encoder2.fd")


def binding(shown: str, name: str) -> str:
    """The line ``  name := ...`` (or ``=``) of a printed where block, its continuations joined."""
    lines = shown.split("\nwhere\n", 1)[1].splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("  %s :" % name) or line.startswith("  %s =" % name))
    out = lines[i]
    for line in lines[i + 1:]:
        if not line.startswith("    "):
            break
        out += " " + line.strip()
    return out


def test_the_encoders_error_is_bound_with_the_name_of_its_first_layer(enc):
    # the whole normal form, E not shown before: E is bound beside encoder_1 and uses it
    shown = render(enc["N"])
    assert "  encoder_1 := " in shown
    assert binding(shown, "E") == "  E := Y - (S_8 W_1 + C f_1)"  # S_8 = m(S_7), dW_1's E^t S_8
    assert shown.count(LAYER0) == 1  # layer 0 is written out once, in the whole block
    # the form itself (no normal form yet): encoder(1), used three times by E, is bound once
    shown = render(enc["w"])
    assert shown.splitlines()[2:] == [
        "  encoder_1 = m(a(s X Q_0 K_0^t X^t) X V_0 + C b_0) W_0 + C f_0",
        "  E := Y - (m(a(s encoder_1 Q_1 K_1^t encoder_1^t) encoder_1 V_1 + C b_1) W_1 + C f_1)"]


def test_latex_html_and_string_use_the_names_they_bind(enc):
    N = enc["N"]
    assert printers.latex(N).count(r"Q_{0} \, {K_{0}}^{t}") == 1
    assert printers.html(N).count("<i>Q</i><sub>0</sub> <i>K</i><sub>0</sub><sup>t</sup>") == 1
    s = printers.string(N)
    assert s.count("Q[0] K[0]^t") == 1
    # E's body holds encoder(1) written out, the form's encoder_1 is a let over it: both read back
    # as they are through one transparent name
    assert ", encoder[1] := H[1]," in s and "E := Y - (m(a(s H[1] Q[1] K[1]^t H[1]^t) H[1] V[1]" in s
    assert_roundtrip(enc, N)


def test_a_repeat_is_named_at_depth_2_as_at_depth_8(enc):
    shown = render(enc.expr("coeff(N, W[0])"), {enc["E"]})  # as fdsl run prints it, E bound before
    assert "  S_2 = s encoder_1 Q_1 K_1^t encoder_1^t" in shown.splitlines()
    assert shown.count("s encoder_1 Q_1 K_1^t encoder_1^t") == 1  # was written out four times
    assert binding(shown, "G_encoder_1") == (
        "  G_encoder_1 := s Q_1 K_1^t encoder_1^t S_5^t + s K_1 Q_1^t encoder_1^t S_5 + V_1 S_4 S_3")
    # E, bound by an earlier show, is not printed: what only its body repeats is not named
    assert render(enc.expr("coeff(N, W[1])"), {enc["E"]}).splitlines() == [
        "E^t m(a(s encoder_1 Q_1 K_1^t encoder_1^t) encoder_1 V_1 + C b_1)", "where",
        "  encoder_1 := m(a(s X Q_0 K_0^t X^t) X V_0 + C b_0) W_0 + C f_0"]
    natural = fdsl.load(EXAMPLES / "natural.fd")
    deep = render(natural.expr("coeff(N, K[5])"))
    assert "  S_1 = s encoder_5 Q_5 K_5^t encoder_5^t" in deep.splitlines()


def test_a_repeat_seen_through_its_transpose_is_named(enc):
    # (X - F)^t twice: X - F is used once, by its transpose, which is used twice
    shown = render(enc.expr("(X - encoder(1))^t encoder(1) + (X - encoder(1))^t Y"))
    assert shown.splitlines()[0] == "S_1^t encoder_1 + S_1^t Y"
    assert "  S_1 = X - encoder_1" in shown.splitlines()


def test_a_users_name_is_used_where_its_body_is_written_out():
    p = fdsl.parse("dim n\nconst A : n x n, B : n x n\nweight W : n x n\nN := A B\n")
    t = p.expr("N W + A B")
    assert render(t) == "N W + N\nwhere\n  N := A B"
    assert printers.latex(t).startswith(r"N \, W + N ")
    assert printers.html(t).startswith('<span class="fdsl"><i>N</i> <i>W</i> + <i>N</i></span>')
    # A B written out reads back as A B, N as the let: one transparent name serves both
    assert printers.string(t) == "(N W + S[1] where S[1] = A B, N := S[1])"
    assert_roundtrip(p, t)
    assert printers.text(t) == "N W + N"


def test_what_only_a_binding_shown_before_refers_to_is_not_bound_again(enc):
    # E was bound by an earlier show: encoder_1, which only E's body uses, is not printed either
    assert render(enc.expr("coeff(N, f[1])"), {enc["E"]}) == "E^t C"


def _sizes(s):
    """The nodes of a shared term written out, capped as the finder caps them (a let counts as its
    body, as the finder counts it)."""
    size: dict = {}
    for node in s.postorder():
        size[node] = min(SMALL + 1, 1 + sum(size[c] for c in s.children(node)))
    return size


@pytest.mark.parametrize("name", ["encoder2.fd", "one_layer.fd", "elementwise.fd", "deep.fd", "natural.fd"])
def test_no_repeat_is_written_out_twice(name):
    """Of every term an example defines, as show prints it: a subterm written out in two places
    (the head and the bodies of the where block) is a leaf, a transpose, a form, or small."""
    program = fdsl.load(EXAMPLES / name)
    for value in program.definitions.values():
        if not isinstance(value, T.Term):
            continue
        s = printers.shown(value)
        uses: dict = {}
        for node in s.postorder():
            for c in s.children(node):
                uses[c] = uses.get(c, 0) + 1
        for node, k in list(uses.items()):
            if node.op == "t":
                uses[node.args[0]] = uses.get(node.args[0], 0) + k - 1
        size = _sizes(s)
        for node, k in uses.items():
            if k > 1 and node.args and node.op not in ("let", "t") and not node.has_d:
                assert size[node] <= SMALL, (name, printers.text(node))


def test_string_of_a_deep_form_with_a_named_error_stays_linear():
    """E := Y - encoder(L) holds every layer written out, the form names them: string() writes each
    once (by aliases), so its length grows with L, not 3^L, and it reads back."""
    from oracle import ENCODER

    lengths = []
    for L in (8, 16):
        p = fdsl.parse(ENCODER + "E := Y - encoder(%d)\nw = form(E)\n" % L)
        N = p.expr("normal(w)")
        lengths.append(len(printers.string(N)))
        assert_roundtrip(p, N)
    assert lengths[1] < 2.5 * lengths[0]
