"""Hints and refusals that stop silent wrong answers, through the Python API (the CLI cases are
the bad programs in tests/bad and tests/bad_rules)."""

from __future__ import annotations

import pytest

import fdsl
from fdsl.lang.hints import keyword_hint, one_edit_apart, syntax_hint

DECLS = "dim n, k\nconst X : n x k, Y : n x n\nweight W : k x n\n"


def error_of(text):
    with pytest.raises(fdsl.FdslError) as e:
        fdsl.parse(DECLS + text)
    return e.value


def test_hadamard_on_shapes_that_multiply_notes_the_matrix_product():
    e = error_of("E = X * W\n")
    assert e.col == 9 and e.message == "X * W: (n x k) * (k x n): shapes differ"
    assert e.notes == ["note: * is the componentwise (Hadamard) product; the matrix product is written by "
                       "juxtaposition: A B"]
    assert error_of("E = X * Y\n").notes == []  # X Y does not multiply either: no note


def test_the_caret_is_on_the_factor_or_summand_that_does_not_fit():
    assert error_of("E = Y Y X Y\n").col == 11  # Y Y X fits; the last Y does not
    assert error_of("E = Y + Y + X W + X\n").col == 19  # X W fits; X does not
    e = error_of("E = Y + Y + X W + X\n")
    assert e.message == "Y + Y + X W + X: (n x n) + (n x k): shapes differ"


@pytest.mark.parametrize("word, keyword", [("weigth", "weight"), ("Weight", "weight"), ("cosnt", "const"),
                                           ("sohw", "show"), ("dmi", "dim"), ("scalr", "scalar")])
def test_misspelt_keywords(word, keyword):
    assert keyword_hint(word) == keyword


@pytest.mark.parametrize("word", ["weight", "encoder", "X", "layer", "E"])
def test_names_that_are_not_misspellings(word):
    assert keyword_hint(word) is None


def test_no_hint_for_ordinary_syntax_errors():
    assert syntax_hint("E = A + + A\n", 1, 9) is None
    assert syntax_hint("E = A $ A\n", 1, 7) is None


@pytest.mark.parametrize("a, b, near", [("expandAll", "expandall", True), ("cycle", "cycles", True),
                                        ("cycle", "cyle", True), ("normal", "formal", True),
                                        ("shiftmm", "shift", False), ("abc", "cab", False),
                                        ("cycle", "cycle", False), ("linear", "layer", False)])
def testone_edit_apart(a, b, near):
    assert one_edit_apart(a, b) is near and one_edit_apart(b, a) is near


def test_the_stdlib_has_no_two_names_one_letter_apart():
    book = fdsl.parse("dim n").rulebook
    names = list(book.rulesets) + list(book.strategies)
    assert not [(a, b) for a in names for b in names if a < b and (one_edit_apart(a, b) or a.lower() == b.lower())]


def test_a_ruleset_that_applies_somewhere_is_no_error():
    p = fdsl.parse(DECLS)
    assert str(p.expr("transpose((X W)^t^t)")) == "X W"
    assert p.expr("cycle(trace(d(W) X))") is p.expr("trace(X d(W))")


def test_forms_of_a_number_is_forms_of_the_encoder():
    p = fdsl.load("examples/encoder2.fd")
    assert p.expr("forms(2, 4)") is p.expr("forms(encoder(2), 4)")
    assert p.expr("form(2)") is p.expr("form(encoder(2))")
    assert p.expr("len(forms(1))") == len(fdsl.core.terms.summands(p.expr("forms(encoder(1))")))


def test_weights_of_a_form_not_yet_normal_are_those_of_its_normal_form():
    # read off form(E) as written, the only differential is dE, no weight's: weights would be empty
    p = fdsl.load("examples/encoder2.fd")
    assert p.expr("weights(w)") == p.expr("weights(N)") == fdsl.calculus.forms.weights(p["N"])
    assert len(p.expr("weights(w)")) == 12


@pytest.mark.parametrize("manual, meant", [("forms(2)", "forms(encoder(2))"), ("forms(2, 4)", "forms(encoder(2), 4)"),
                                           ("form(2)", "form(encoder(2))")])
def test_the_manuals_verbs_of_a_number_through_the_cli(run_fdsl, examples, manual, meant):
    # once printed 0, -trace(2 d(2)), and a complaint about an E nobody wrote; now the manual's meaning
    said, means = (run_fdsl("run", examples / "encoder2.fd", "-e", "string(%s)" % x) for x in (manual, meant))
    assert said.returncode == 0 and means.returncode == 0, said.stderr + means.stderr
    assert said.stdout == means.stdout and "Q[1]" in said.stdout.splitlines()[-1]


@pytest.mark.parametrize("typed, known, meant", [
    ("nromal", ["normal", "norm"], "normal"),  # two letters swapped
    ("Eq", ["E", "Q"], "E"),  # one letter too many
    ("trace", ["trace"], None),  # itself
    ("TRACE", ["trace"], "trace"),  # only case
    ("norm", ["normal"], None),  # the start of a longer word is another word (issue 31)
    ("diag", ["diagram"], None),
    ("X", ["Y"], None),  # two one-letter names are no slip
])
def test_close_name_offers_only_slips_of_the_keys(typed, known, meant):
    from fdsl.lang.hints import close_name

    assert close_name(typed, known) == meant
