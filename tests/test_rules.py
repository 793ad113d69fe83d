"""The rule language and the engine: rule files, their load-time checks, rulesets as functions,
user operators, the step limit and --trace."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import _run_fdsl

import fdsl
from fdsl.core import terms as T
from fdsl.lang.rules import RuleBook
from fdsl.rewrite.patterns import Bag, Op, Seq, Var, Word, match

ROOT = Path(__file__).resolve().parent.parent
BAD_RULES = sorted((ROOT / "tests" / "bad_rules").glob("*.rules"))


def fdsl_cli(*args, cwd=ROOT):
    # conftest's runner: the package of this checkout, whatever the working folder
    return _run_fdsl(*args, cwd=cwd)


# ---- rule-file errors: file:line:col, exit 2, no traceback ------------------------------------------


@pytest.mark.parametrize("path", BAD_RULES, ids=lambda p: p.name)
def test_bad_rule_file_is_rejected_with_its_position(path, tmp_path):
    expected = path.read_text().splitlines()[0].removeprefix("# expect: ")
    program = tmp_path / "empty.fd"
    program.write_text("dim n\n")
    r = fdsl_cli("run", "--rules", path.name, program, cwd=path.parent)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert r.stderr.splitlines()[0] == expected
    assert r.stdout == ""


def test_bad_rules_cover_every_load_check():
    names = {p.stem for p in BAD_RULES}
    assert {"unknown_op", "arity", "unbound", "duplicate", "renaming", "bare", "syntax"} <= names


def test_a_rule_file_that_fails_to_load_leaves_the_book_as_it_was(tmp_path):
    book = RuleBook()
    before = (set(book.rulesets), len(book.rule_names))
    bad = tmp_path / "half.rules"
    bad.write_text("ruleset mine\nrule ok: d(m(?A)) => mm(?A, d(?A))\nrule bad: d(?A) => d(?Z)\n")
    with pytest.raises(fdsl.FdslError, match="half.rules:3:1: in bad, \\?Z on the right"):
        book.load(bad)
    assert (set(book.rulesets), len(book.rule_names)) == before


# ---- the matcher ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def syms():
    p = fdsl.parse("dim n\nconst A : n x n, B : n x n, C : n x n\nscalar s\nweight W : n x n")
    return p, {k: p[k] for k in "ABCsW"}


def test_sequence_variables_see_a_product_as_one_flat_word(syms):
    _, s = syms
    A, B, C, W = s["A"], s["B"], s["C"], s["W"]
    word = T.mul(A, T.mul(B, T.d(W)), C)  # ((A (B dW)) C) is the flat word A B dW C
    pat = Word((Seq("P"), Op("d", (Var("X"),)), Seq("S")))
    (b,) = list(match(pat, word, {}))
    assert b["P"].items == (A, B) and b["S"].items == (C,) and b["X"] is W


def test_empty_run_stands_for_the_identity_of_its_boundary(syms):
    _, s = syms
    dW = T.d(s["W"])
    pat = Word((Seq("P"), Op("d", (Var("X"),)), Seq("S")))
    (b,) = list(match(pat, dW, {}))  # a one-letter word: both runs empty
    assert b["P"].items == () and b["P"].term().op == "eye"


def test_sums_match_in_any_order(syms):
    _, s = syms
    A, B, C = s["A"], s["B"], s["C"]
    pat = Bag("add", (Op("t", (Var("X"),)), Seq("R")))
    (b,) = list(match(pat, T.add(A, T.transpose(B), C), {}))
    assert b["X"] is B and b["R"].items == (A, C)


def test_a_bare_variable_word_needs_a_real_product(syms):
    # d(?A ?B...) must not see d(X) as the product X (nothing): it would rewrite forever
    _, s = syms
    pat = Word((Var("A"), Seq("B")))
    assert list(match(pat, s["A"], {})) == []


# ---- rulesets are functions; user rule files ---------------------------------------------------------


def test_a_user_ruleset_is_callable_by_name(tmp_path):
    (tmp_path / "tr.rules").write_text(
        "# trace(A^t) = trace(A), as a user would write it\nruleset untrace\nrule trace-t: trace(?A^t) => trace(?A)\n")
    (tmp_path / "p.fd").write_text('rules "tr.rules"\ndim n\nconst A : n x n, B : n x n\n'
                                   'show untrace(trace((A B)^t) + trace(B^t))\n')
    r = fdsl_cli("run", tmp_path / "p.fd")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "trace(A B) + trace(B)"


def test_fdsl_run_rules_option_loads_a_rule_file(tmp_path):
    (tmp_path / "mine.rules").write_text("ruleset untranspose\nrule tt: ?A^t^t => ?A\n")
    (tmp_path / "p.fd").write_text("dim n\nconst A : n x n\nshow untranspose(A^t^t)\n")
    r = fdsl_cli("run", "--rules", tmp_path / "mine.rules", tmp_path / "p.fd")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "A"


def test_softplus_example_adds_an_operator_and_fdsl_run_uses_it():
    r = fdsl_cli("run", "examples/softplus.fd")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()  # the normal form, one weight per line, then coeff(w, U)
    assert lines[0].startswith("dU: ") and "softplusd(" in lines[0] and lines[1].startswith("dV: ")


def test_looping_rules_stop_with_the_rules_that_fired_last():
    r = fdsl_cli("run", "examples/failing/loop.fd")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    first = r.stderr.splitlines()[0]
    assert "spin loops" in first and "the rules that fired last: flip (" in first and "unflip (" in first


def test_growing_rules_stop_at_the_step_limit(tmp_path):
    (tmp_path / "p.fd").write_text('rules "%s"\ndim n\nconst A : n x n\nshow grow(trace(A))\n'
                                   % (ROOT / "examples" / "failing" / "loop.rules"))
    r = fdsl_cli("run", "--step-limit", "500", tmp_path / "p.fd")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    first = r.stderr.splitlines()[0]
    assert "grow did not reach a normal form within 500 steps (the step limit, --step-limit N)" in first
    assert "pile (" in first


def test_trace_prints_every_step_with_its_rule_and_place(tmp_path):
    (tmp_path / "p.fd").write_text("dim n\nconst A : n x n\nweight W : n x n\nshow expandAll(d(A W))\n")
    r = fdsl_cli("run", "--trace", tmp_path / "p.fd")
    assert r.returncode == 0
    assert r.stdout.strip() == "A dW"
    steps = r.stderr.splitlines()
    assert steps[0].startswith("[leibniz stdlib/d.rules:") and steps[0].endswith("d(A W)  =>  dA W + A dW")
    assert any(line.startswith("[d-const stdlib/d.rules:") and line.endswith("dA  =>  0") for line in steps)


def _leibniz_steps(p, text):
    import io

    p.rulebook.engine.reset()  # forget earlier normal forms: count this run's steps
    p.trace_out = io.StringIO()
    p.options["trace"] = True
    p.expr(text)
    return p.trace_out.getvalue().count("[leibniz ")


def test_a_shared_subterm_is_rewritten_once():
    # d(Z) occurs three times; memoised rewriting expands it once, so Leibniz fires as often as
    # for a single d(Z)
    p = fdsl.load(ROOT / "examples" / "encoder2.fd")
    once = _leibniz_steps(p, "expandAll(d(encoder(1)))")
    thrice = _leibniz_steps(p, "expandAll(d(encoder(1)) + X X^t d(encoder(1)) + d(encoder(1)) X^t X)")
    assert once > 5
    assert thrice == once


def test_strategies_compose_rulesets_top_down_once_and_to_a_fixpoint(tmp_path):
    (tmp_path / "s.rules").write_text(
        "ruleset tt\nrule tt: ?A^t^t => ?A\n"
        "ruleset expandt\nrule t-product: (?A ?B...)^t => (?B...)^t ?A^t\n"
        "strategy top = topdown(tt)\nstrategy one = once(expandt)\nstrategy fix = fixpoint(one)\n"
        "strategy both = expandt; tt\n")
    (tmp_path / "p.fd").write_text(
        'rules "s.rules"\ndim n\nconst A : n x n, B : n x n, C : n x n\n'
        "show top((A B C)^t^t)\nshow one((A (B C)^t)^t)\nshow fix((A (B C)^t)^t)\nshow both((A B)^t^t^t)\n")
    r = fdsl_cli("run", tmp_path / "p.fd")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "A B C",  # top-down: the outer ^t^t goes first
        "(B C)^t^t A^t",  # once: one step, at the outermost redex
        "B^t^t C^t^t A^t",  # fixpoint of once: as far as expandt goes
        "B^t A^t",  # in order: expandt, then tt
    ]
