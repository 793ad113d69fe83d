"""The differential fuzzer (fdsl.verify.fuzz): a fixed-seed slice of random programs agrees every way, and
the fuzzer can fail: a deliberately broken lowering (a dropped scalar, a dropped sign) is caught
and shrunk to a small program. ``python bench/fuzz.py --cases 10000`` runs the long version.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("hypothesis")

from fdsl.codegen import generated as codegen  # noqa: E402
from fdsl.core.ops import OPS  # noqa: E402
from fdsl.verify import fuzz  # noqa: E402


def test_a_fixed_slice_of_random_programs_agrees_every_way():
    summary = fuzz.run(60, seed=2024, batch=60)
    assert summary.cases == 60
    assert not summary.failures, "\n\n".join(map(str, summary.failures))
    assert summary.fd_checked > 30  # finite differences checked weights of most programs
    assert summary.worst <= 1e-8


@pytest.fixture
def broken(monkeypatch):
    """Break the lowering: ``broken("scalar")`` drops the constant scalars of products,
    ``broken("sign")`` adds what sums should subtract, ``broken("ids")`` takes the 1 at the ids
    that a sum with a onehot summand adds."""

    def apply(kind):
        monkeypatch.setattr(codegen, "_COMPILED", {})  # nothing compiled by the sound lowering
        if kind == "scalar":
            word = codegen.Lowering._word
            monkeypatch.setattr(codegen.Lowering, "_word", lambda self, b: (1.0,) + tuple(word(self, b)[1:]))
        elif kind == "sign":
            summand = codegen.Lowering._summand
            monkeypatch.setattr(codegen.Lowering, "_summand", lambda self, s: (1,) + tuple(summand(self, s)[1:]))
        else:  # ids: 1 taken at the ids where it should be added (the cross-entropy's derivative)
            summand = codegen.Lowering._onehot_summand

            def flipped(self, *args):
                got = summand(self, *args)
                return None if got is None else got[:2] + ((-got[2][0],) + got[2][1:],)

            monkeypatch.setattr(codegen.Lowering, "_onehot_summand", flipped)

    return apply


@pytest.mark.parametrize("kind", ["scalar", "sign"])
def test_a_broken_lowering_is_caught_and_shrunk(broken, kind):
    broken(kind)
    summary = fuzz.run(40, seed=1, batch=40, shrink=1)
    assert summary.failures
    shrunk = summary.failures[0]
    assert isinstance(shrunk.error, fuzz.Disagreement)
    assert "code[shared] disagrees" in str(shrunk.error)  # the generated code, not the oracles
    model = [line for line in shrunk.case.source.splitlines() if line.startswith("F = ")][0]
    assert len(model) <= 20, shrunk.case.source  # shrunk: F = 2 Unn, F = Unn, ...
    assert not [line for line in shrunk.case.source.splitlines() if line.startswith(("H", "f("))]


def test_the_fuzzer_generates_every_operator_of_the_table():
    """A new operator whose shape rule the generator does not know shows up here."""
    ops = fuzz.operators()
    assert {"m", "a", "mm", "aa"} <= set(ops)
    assert set(fuzz.uncovered()) <= set(fuzz.EXCLUDED), fuzz.uncovered()
    # the built-in operators, and those the example rule files declare (other programs of this process
    # may declare operators of their own: they are theirs, not the fuzzer's)
    functions = {op for op, spec in OPS.items() if spec.kind == "function" and not spec.user}
    assert functions <= set(ops) | set(fuzz.EXCLUDED)
    assert "softplus" in {info.name for info in ops.values()}
    assert ops["m"].differentiable and ops["a"].differentiable


def test_generated_programs_are_what_a_user_writes():
    import hypothesis
    from hypothesis import HealthCheck, given, settings

    seen = set()

    @hypothesis.seed(5)
    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(fuzz.programs())
    def collect(case):
        seen.update(word for word in (":=", " = ", "[0]", "[i]", "^t", " * ", "J", "f(", "form(E)", "d(L)")
                    if word in case.source)
        fuzz.parse(case.source, "<case>", fuzz.EXAMPLES)  # the real front end accepts it

    collect()
    assert seen == {":=", " = ", "[0]", "[i]", "^t", " * ", "J", "f(", "form(E)", "d(L)"}


def test_a_broken_onehot_rule_is_caught_against_the_one_hot_matrices(broken):
    broken("ids")
    summary = fuzz.run(40, seed=1, batch=40, shrink=0)  # (10 of the seeds 1-11 catch it)
    assert summary.failures
    error = str(summary.failures[0].error)
    assert "onehot" in summary.failures[0].case.source
    assert "code[shared] disagrees" in error and "dense[" not in error  # the one-hot matrices' path holds


def test_the_fuzzer_generates_every_use_of_ids():
    import hypothesis
    from hypothesis import HealthCheck, given, settings

    uses = {"onehot": " onehot", "lookup": r"Y\w+ [(\w]", "scatter": r"Y\w+\^t [(\w]", "right": r" Y\w+\^t",
            "add": r"[+-] Y\w+", "trace": r"trace\(Y\w+\^t", "rowsum": r"rowsum\(Y",
            "cross-entropy": r"L = -trace\(Y\w+\^t logsoftmax\(F\)\)", "hadamard": r"\* Y\w+\)|\(Y\w+ \*"}
    seen = set()

    @hypothesis.seed(7)
    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(fuzz.programs())
    def collect(case):
        seen.update(use for use, pattern in uses.items() if re.search(pattern, case.source))
        fuzz.parse(case.source, "<case>", fuzz.EXAMPLES)

    collect()
    assert seen == set(uses)
