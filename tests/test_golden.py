"""The generated code of every example, pinned: numpy and torch, float32 and float64.

The modules ``fdsl codegen`` writes for the examples are kept in ``tests/golden/`` (one file per
example, form, target and dtype). A change to the lowering, a pass or a writer that changes any of
them fails here; when the change is meant, regenerate them with ``FDSL_GOLDEN=update pytest
tests/test_golden.py`` and say in the commit what changed in the code and why.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fdsl.calculus.gradients import loss_of
from fdsl.cli.codegen import normal_form_of

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "golden"

# (example, its 1-form, rule files)
CASES = [
    ("encoder2.fd", "w", ()),
    ("one_layer.fd", "w", ()),
    ("elementwise.fd", "w", ()),
    ("softplus.fd", "w", ("softplus.rules",)),
    ("natural.fd", "w", ()),
    ("deep.fd", "w", ()),
    ("train.fd", "w", ()),
    ("gpt.fd", "w", ()),
    ("chargpt.fd", "w", ()),
]
PARAMS = [(ex, form, rules, target, dtype) for ex, form, rules in CASES
          for target in ("numpy", "torch") for dtype in ("float32", "float64")]


def generated(example: str, form: str, rules, target: str, dtype: str) -> str:
    from fdsl.codegen.generated import gradients_source
    from fdsl.codegen.grads import form_named
    from fdsl.lang.program import load

    path = ROOT / "examples" / example
    program = load(str(path), rules=[str(ROOT / "examples" / r) for r in rules])
    w = normal_form_of(program, form_named(program, form), form)
    loss = loss_of(form_named(program, form))
    return gradients_source(w, program.dims, "form %s of examples/%s" % (form, example), target, dtype, loss)


@pytest.mark.parametrize("example, form, rules, target, dtype", PARAMS,
                         ids=["%s-%s-%s" % (p[0][:-3], p[3], p[4]) for p in PARAMS])
def test_generated_code_is_pinned(example, form, rules, target, dtype):
    got = generated(example, form, rules, target, dtype)
    path = GOLDEN / ("%s.%s.%s.%s.py.txt" % (example[:-3], form, target, dtype))
    if os.environ.get("FDSL_GOLDEN") == "update":
        path.write_text(got)
    assert path.exists(), "no golden file %s: run FDSL_GOLDEN=update pytest tests/test_golden.py" % path.name
    assert got == path.read_text(), "the generated code of %s changed (see the module doc)" % path.name
