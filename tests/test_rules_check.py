"""fdsl rules --check: every stdlib rule is sound on random instances, and wrong rules are caught.

The checker's oracle (fdsl.verify.check) evaluates both sides of a rule on random terms of consistent
shapes, with d(T) evaluated by finite differences along a random tangent (evaluation only, never
the rules). These tests hold it to both halves of its job: the stdlib and examples/softplus.rules come
out sound, and planted unsound rules, including near misses of real stdlib rules (the manual's
flip without the transpose, a cycle in the wrong order), come out UNSOUND with exit code 1.
"""

import io
import re
import textwrap

import numpy as np
import pytest

import fdsl
from fdsl.verify import check as C

LINE = re.compile(r"^(sound|UNSOUND|skipped)\s+(\S+)\s+(\S+:\d+)\s+(.*)$")


def verdicts(text):
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            out[m.group(2)] = (m.group(1), m.group(4))
    return out


def test_every_stdlib_rule_is_sound():
    out = io.StringIO()
    code = C.check(trials=20, seed=0, out=out)
    found = verdicts(out.getvalue())
    stdlib = {r.name for r in fdsl.parse("").rulebook.rule_names.values()}
    assert set(found) == stdlib  # every rule reported, none silently left out
    for name, (status, detail) in found.items():
        assert status == "sound", (name, detail)
        assert detail.startswith("20 trials"), (name, detail)
    assert code == 0
    assert "%d rules: %d sound, 0 UNSOUND, 0 skipped" % (len(stdlib), len(stdlib)) in out.getvalue()


def stdlib_rule(name):
    return next(r for r in fdsl.parse("").rulebook.rule_names.values() if r.name == name)


def test_the_checker_is_exercised_not_vacuous():
    """Most trials of a rule about differentials evaluate to something nonzero: the oracle sees the
    derivative, not 0 = 0."""
    for name in ("leibniz", "d-relu", "d-softmax", "flip-mm", "flip-aa", "cycle", "collect"):
        rule = stdlib_rule(name)
        rng = np.random.default_rng(1)
        needs, compound = C._needs(rule), C._compound_guards(rule)
        nonzero = 0
        for _ in range(20):
            try:
                inst = C.Instance(rule, needs, compound, rng)
            except C.Reject:
                continue
            lhs = fdsl.rewrite.patterns.build(C._named(rule.lhs), inst.bindings)
            ev = fdsl.numbers.numpy_eval.Evaluator(inst.values, {}, tangent=inst.tangent())
            try:
                nonzero += bool(np.linalg.norm(ev.value(lhs)) > 1e-6)
            except fdsl.numbers.numpy_eval.NotDifferentiable:
                pass
        assert nonzero >= 8, name


PLANTED = textwrap.dedent("""\
    # rules that are wrong, some of them near misses of stdlib rules
    ruleset expandAll
    rule bad-relu:     d(m(?A)) => m(d(?A))
    rule bad-trace:    trace(?A ?B) => trace(?A) trace(?B)
    rule bad-leibniz:  d(?A ?B...) => d(?A) ?B... + d(?B...) ?A
    ruleset shiftmm
    rule bad-flip-mm:  trace(?P... mm(?X, ?B) ?S...) => trace(mm(?X, ?S... ?P...) ?B) when has_d(?B)
    rule bad-flip-aa:  trace(?P... aa(?X, ?B) ?S...) => trace(aa(?X, (?S... ?P...)^t) ?B) when has_d(?B)
    rule bad-cycle:    trace(?P... d(?W) ?S...) => trace(?P... ?S... d(?W))
    rule bad-had:      trace(?P... (?A... * ?B) ?S...) => trace(((?S... ?P...) * (?A...)) ?B) when has_d(?B)
    rule bad-t:        (?A ?B...)^t => ?A^t (?B...)^t when has_d(?A ?B...)
    rule bad-scalar:   trace(?c ?A ?B...) => trace(?A ?B...) when scalar(?c)
    rule bad-collect:  trace(?A... d(?W)) + trace(?B... d(?W)) + ?R... => trace((?A... + ?B...) d(?W))
    # the stdlib's collect before the fuzzer found it: trace(c d(W)) binds ?A... to the number c,
    # which stands for c I there, and c + B adds c to every entry of B
    rule bad-collect-unit: trace(?A... d(?W)) + trace(?B... d(?W)) + ?R... => trace((?A... + ?B...) d(?W)) + ?R...
    """)


def test_planted_unsound_rules_are_caught(run_fdsl, tmp_path):
    path = tmp_path / "bad.rules"
    path.write_text(PLANTED)
    r = run_fdsl("rules", "--check", path)
    assert r.returncode == 1, r.stdout + r.stderr
    found = verdicts(r.stdout)
    names = re.findall(r"^rule (\S+):", PLANTED, re.M)
    assert set(found) == set(names)  # only the file's rules, not the stdlib's
    for name in names:
        assert found[name][0] == "UNSOUND", (name, found[name])
    # each is explained: the instance, and both values
    assert re.search(r"UNSOUND bad-relu \(.*bad.rules:3\).*\n  for \?A = .*left side d\(m\(", r.stdout)
    assert "0 sound, %d UNSOUND" % len(names) in r.stdout
    assert "Traceback" not in r.stderr


def test_one_bad_rule_among_good_ones(run_fdsl, tmp_path):
    path = tmp_path / "mixed.rules"
    path.write_text("ruleset mine\nrule good: trace(?A + ?B) => trace(?A) + trace(?B)\n"
                    "rule bad: trace(?A ?B) => trace(?A) trace(?B)\n")
    r = run_fdsl("rules", "--check", path)
    assert r.returncode == 1
    found = verdicts(r.stdout)
    assert found["good"][0] == "sound" and found["bad"][0] == "UNSOUND"


def test_the_softplus_example_is_sound(run_fdsl, examples):
    # in a subprocess: the file declares operators, which live in the process-wide table
    r = run_fdsl("rules", "--check", examples / "softplus.rules")
    assert r.returncode == 0, r.stdout + r.stderr
    found = verdicts(r.stdout)
    assert set(found) == {"d-softplus", "softplusd-sum", "softplusd-scalar", "t-softplusd", "flip-softplusd"}
    assert all(status == "sound" for status, _ in found.values())


@pytest.mark.parametrize("name", ["elementwise", "layers"])
def test_a_stdlib_file_named_on_the_command_line_is_checked_not_skipped(run_fdsl, repo, name):
    # the stdlib loads the file before the command line does: its rules are still the ones checked
    r = run_fdsl("rules", "--check", repo / "stdlib" / ("%s.rules" % name))
    assert r.returncode == 0, r.stdout + r.stderr
    found = verdicts(r.stdout)
    text = (repo / "stdlib" / ("%s.rules" % name)).read_text()
    assert set(found) == set(re.findall(r"^rule ([\w-]+):", text, re.M)) and len(found) > 20
    assert all(status == "sound" for status, _ in found.values())


def test_rules_that_cannot_be_instantiated_are_skipped_with_a_reason(tmp_path):
    path = tmp_path / "odd.rules"
    path.write_text("ruleset mine\n"
                    "rule contradiction: d(?A) => 0 when has_d(?A), not has_d(?A)\n"
                    "rule log-of-form: trace(log(?A)) => trace(log(?A)^t) when has_d(?A)\n")
    out = io.StringIO()
    assert C.check([path], trials=5, out=out) == 0  # skipped is not unsound
    found = verdicts(out.getvalue())
    assert found["contradiction"][0] == "skipped"
    assert "both has_d(?A) and not has_d(?A)" in found["contradiction"][1]
    assert found["log-of-form"][0] == "skipped"
    assert "?A must be positive, and a form is not" in found["log-of-form"][1]
    assert "0 sound, 0 UNSOUND, 2 skipped" in out.getvalue()


def test_the_engine_application_is_checked_too():
    """Besides build(lhs) == build(rhs), the engine's own rewrite of the left side is evaluated."""
    v = C.check_rule(stdlib_rule("flip-mm"), trials=5, seed=3)
    assert v.status == "sound" and v.trials == 5


@pytest.mark.parametrize("args, code, message", [
    (["--check", "tests/bad_rules/arity.rules"], 2, "arity.rules:3:26: mm takes 2 arguments, not 1"),
    (["--check", "no/such.rules"], 2, "cannot read this rule file"),
    (["--check", "--trials", "0"], 2, "--trials must be at least 1"),
])
def test_errors(run_fdsl, args, code, message):
    r = run_fdsl("rules", *args)
    assert r.returncode == code
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_listing_without_check(run_fdsl):
    r = run_fdsl("rules")
    assert r.returncode == 0
    assert "rule leibniz: d(?A ?B...) => d(?A) ?B... + ?A d(?B...)" in r.stdout
