"""The Python side for notebooks: terms composed with Python operators (checked against the
language's own parse of the same expression), the program's display, inline diagrams, and
examples/tour.ipynb executed on a real Jupyter kernel with nbclient."""

from __future__ import annotations

import os
import shutil
from fractions import Fraction

import pytest
from conftest import EXAMPLES, REPO

import fdsl
from fdsl.core import terms as T

HAVE_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAVE_DOT, reason="Graphviz's dot is not installed")


@pytest.fixture(scope="module")
def p():
    return fdsl.load(EXAMPLES / "encoder2.fd")


# Each Python expression and the language expression it must build (the same interned term).
COMPOSED = [
    ("E + E", "E + E"),
    ("E - X", "E - X"),
    ("-E", "-E"),
    ("X @ Q0 @ K0.T @ X.T", "X Q[0] K[0]^t X^t"),
    ("E * E", "E * E"),
    ("2 * E", "2 * E"),
    ("E * 2", "E * 2"),
    ("0.5 * E", "1/2 * E"),
    ("E / 2", "E / 2"),
    ("s * E", "s * E"),
    ("E / s", "E / s"),
    ("s ** 2", "s^2"),
    ("E + 0", "E + 0"),
    ("0 - E", "0 - E"),
    ("1 / s", "1 / s"),
    ("X / X", "X / X"),
    ("1 / X", "1 / X"),
    ("fdsl.trace(E.T @ fdsl.d(E))", "trace(E^t d(E))"),
    ("fdsl.form(E)", "form(E)"),
    ("fdsl.m(X @ Q0)", "m(X Q[0])"),
    ("fdsl.mm(X @ Q0, X @ K0)", "mm(X Q[0], X K[0])"),
    ("fdsl.aa(X, fdsl.d(X @ Q0 @ K0.T))", "aa(X, d(X Q[0] K[0]^t))"),
    ("fdsl.a(X).T", "a(X)^t"),
]


def names(p):
    return {"E": p["E"], "X": p["X"], "s": p["s"], "Q0": p.expr("Q[0]"), "K0": p.expr("K[0]"), "fdsl": fdsl}


@pytest.mark.parametrize("python, language", COMPOSED)
def test_python_operators_build_what_the_language_builds(p, python, language):
    assert eval(python, names(p)) is p.expr(language)


# Each ill-shaped Python expression and the language's spelling: the messages agree.
MISMATCHED = [
    ("X @ X", "X X"),
    ("X + Q0", "X + Q[0]"),
    ("X - Q0", "X - Q[0]"),
    ("X * Q0", "X * Q[0]"),
    ("X / Q0", "X / Q[0]"),
    ("X ** 2", "X^2"),
    ("fdsl.trace(X)", "trace(X)"),
    ("fdsl.mm(X, Q0)", "mm(X, Q[0])"),
    ("E / 0", "E / 0"),
]


@pytest.mark.parametrize("python, language", MISMATCHED)
def test_shape_errors_have_the_languages_messages(p, python, language):
    with pytest.raises(fdsl.FdslError) as from_python:
        eval(python, names(p))
    with pytest.raises(fdsl.FdslError) as from_language:
        p.expr(language)
    assert from_python.value.message.replace("Q_0", "Q[0]") == from_language.value.message.replace("Q_0", "Q[0]") \
        or from_python.value.message == from_language.value.message


def test_python_numbers_and_other_objects(p):
    E = p["E"]
    assert (Fraction(1, 3) * E) is p.expr("1/3 * E")
    with pytest.raises(TypeError):
        E + "E"
    with pytest.raises(TypeError):
        E @ [1]
    with pytest.raises(fdsl.FdslError, match="not a number fdsl can use"):
        float("nan") * E
    with pytest.raises(TypeError):
        True * E  # a truth value is not a scalar


def test_program_displays_declarations_and_definitions(p):
    text = str(p)
    for line in ("dim n = 8, d = 6, k = 4, h = 5", "const X, Y : n x d", "const C : n x 1 = ones",
                 "scalar s = k^(-1/2)", "weight Q[i], K[i] : d x k", "weight f[i] : 1 x d",
                 "layer(i, Z) = m(a(s Z Q[i] K[i]^t Z^t) Z V[i] + C b[i]) W[i] + C f[i]",
                 "encoder(0) = X", "encoder(L) = layer(L-1, encoder(L-1))", "E := Y - encoder(2)", "w = form(E)"):
        assert line in text.splitlines(), line
    assert "# comment" not in text and "sizes; a dim" not in text  # comments are not part of it
    html = p._repr_html_()
    assert "<pre>" in html and "encoder(L) = layer(L-1, encoder(L-1))" in html
    # a program shown after a redefinition (in a later text, as a notebook cell: within one text
    # it is an error) lists what is in force, each once
    q = fdsl.parse("dim n = 2\nconst A : n x n\nB = A\n")
    q.feed("B = A A; C := B^t")
    assert str(q).splitlines()[-2:] == ["B = A A", "C := B^t"]
    assert q.notes == ["B redefined (it was defined at <string>:3)"]
    # the display reads back as the same program
    again = fdsl.parse(str(p))
    assert again["E"] is p["E"]


@needs_dot
def test_diagrams_display_inline(p):
    picture = p.diagram("forms(E, 4)")
    bundle = picture._repr_mimebundle_()
    assert bundle["image/svg+xml"].lstrip().startswith("<?xml") and "<svg" in bundle["image/svg+xml"]
    assert picture._repr_svg_() == bundle["image/svg+xml"]
    assert "forms(E, 4)" in bundle["image/svg+xml"]  # the title
    assert repr(picture).startswith("<fdsl diagram:")
    assert set(picture._repr_mimebundle_(include=["image/svg+xml"])) == {"image/svg+xml"}
    assert p["E"].diagram().nodes == T.dag_size(p["E"])


def test_a_diagram_saves_where_asked(p, tmp_path):
    picture = fdsl.diagram(p["E"])
    done = picture.save(tmp_path / "e.dot")
    assert done.path.read_text() == picture.source


def test_a_program_draws_its_dependency_view(p):
    w = p.normal_form(p.expr("form(E)"))
    picture = p.deps("form(E)", "Q[0]", "K[1]")
    assert picture.source == fdsl.deps(w, p.expr("Q[0]"), p.expr("K[1]")).source
    assert "does the coefficient of dK_1 involve Q_0?" in picture.graph.graph["title"]


def test_without_pictures_the_conveniences_say_so(p, monkeypatch):
    """Term.diagram, Program.diagram and Program.deps sit below the pictures' floor and reach them
    through what the composition root hands down (fdsl.base.assembly); with nothing handed down,
    an FdslError says so."""
    from fdsl.base import assembly

    monkeypatch.setattr(assembly, "_pictures", {})
    for draw, name in ((lambda: p["E"].diagram(), "diagram"), (lambda: p.diagram("E"), "diagram"),
                       (lambda: p.deps("form(E)", "Q[0]", "K[1]"), "deps")):
        with pytest.raises(fdsl.FdslError, match=r"%s\(\) is unavailable: this fdsl has no pictures" % name):
            draw()


# ---- the tour notebook, on a real kernel ------------------------------------------------------------


def test_tour_notebook_runs_and_shows_pictures_and_latex(monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    if not HAVE_DOT:
        pytest.skip("Graphviz's dot is not installed")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO)] + [x for x in [os.environ.get("PYTHONPATH")] if x]))
    nb = nbformat.read(EXAMPLES / "tour.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []  # what is checked is what this run makes, not what was saved
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    data = [o.get("data", {}) for o in outputs]
    svgs = [d["image/svg+xml"] for d in data if "image/svg+xml" in d]
    assert len(svgs) == 3 and all("<svg" in s for s in svgs)
    assert any("does the coefficient of dK_5 involve Q_3?" in s for s in svgs)
    latex = [d["text/latex"] for d in data if "text/latex" in d]
    assert any(r"\mathrm{d}" in x for x in latex) and all(x.startswith("$") for x in latex)
    htmls = " ".join(d.get("text/html", "") for d in data)
    assert "weight Q[i], K[i] : d x k" in htmls  # the program's display
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "true, via X_5 > m(...) > X_4 > m(...) > a(...) > Q_3" in " ".join(
        d.get("text/plain", "") for d in data)
    assert "inner sizes" in text  # the shape error, caught and printed
    assert "\nwhere\n  X_1 := " in text  # the deep coefficient carries its bindings
    assert "\ndK_1: " in text and "\ndQ_0: " in text  # the normal form: one weight per line
