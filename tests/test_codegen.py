"""Generated code (fdsl.codegen.generated, ``fdsl codegen``): the generated module is imported as a
user would import it and held against two independent oracles: the interpreter's evaluation of the
coefficients (numpy_eval's Evaluator of coeff(w, W)^t) and central finite differences of the loss
L = 1/2 ||E||^2 (grad(form(E), W) = -dL/dW), for deep encoders up to 8 layers; the expanded and the
shared normal forms give the same numbers; the lowering's promises (each subterm once, softmax
and relu masks shared, chain order, constants baked in) are checked on the source it writes.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from oracle import central_difference, weight_values

import fdsl
from fdsl.base.errors import FdslError
from fdsl.calculus.forms import coeff, form, weights
from fdsl.codegen import generated as codegen
from fdsl.numbers.numpy_eval import Evaluator

ROOT = Path(__file__).resolve().parent.parent
HEADER = (ROOT / "examples" / "deep.fd").read_text().split("\nE := ")[0]
EXACT = 1e-12  # generated code against the interpreter: the same math, other bracketings
FD_TOL = 1e-6  # against central finite differences of the loss
# The encoder has no residual connections, so its attention rows collapse with depth and the
# gradients of early queries and keys shrink to rounding noise (1e-15 against 1e2 for others).
# A weight's error is measured against its own gradient, or against FLOOR times the largest one
# when its own is smaller: relative errors of rounding noise mean nothing.
FLOOR = 1e-3


def program(L, header=HEADER):
    return fdsl.parse(header + "\nE := Y - X(%d)\nw = form(E)\n" % L)


def shared(p):
    return p.apply_rules("backprop", form(p["E"]))


def errors(got: dict, want: dict) -> dict:
    """Per weight: ||got - want|| / max(||want||, FLOOR * largest ||want||)."""
    assert set(got) == set(want)
    floor = FLOOR * max(np.linalg.norm(v) for v in want.values())
    return {k: float(np.linalg.norm(np.asarray(got[k]) - want[k]) / max(np.linalg.norm(want[k]), floor))
            for k in want}


def import_module(path: Path, name: str = "generated_grads"):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def interpreted(p, w, vals) -> dict:
    ev = Evaluator(vals, p.dims)
    return {W.data[0].printed(): ev.value(coeff(w, W)).T for W in weights(w)}


# ---- the generated module against the interpreter and finite differences -------------------------


@pytest.mark.parametrize("L", [1, 2, 4, 8])
def test_generated_module_matches_the_interpreter(L, tmp_path):
    p = program(L)
    w = shared(p)
    path = tmp_path / ("grads_%d.py" % L)
    path.write_text(codegen.gradients_source(w, p.dims, "encoder(%d)" % L))
    module = import_module(path)
    vals = weight_values(p, weights(w), seed=L)
    got = module.grads(vals)
    assert list(got) == [W.data[0].printed() for W in weights(w)]  # every weight, in weight order
    want = interpreted(p, w, vals)
    for name in got:
        assert got[name].shape == want[name].shape  # G_W^t is shaped like W
    assert max(errors(got, want).values()) <= EXACT


@pytest.mark.parametrize("L", [1, 2, 4, 8])
def test_generated_gradients_are_the_derivative_of_the_loss(L):
    p = program(L)
    w = shared(p)
    ws = [W.data[0].printed() for W in weights(w)]
    vals = weight_values(p, weights(w), seed=10 + L)
    grads = codegen.compile_gradients(w, p.dims)(vals)
    E = p["E"]

    def loss(v):
        e = Evaluator(v, p.dims).value(E.args[0])  # evaluation only: no rules, no generated code
        return 0.5 * float(np.sum(e * e))

    rng = np.random.default_rng(L)
    directions = {name: rng.standard_normal(vals[name].shape) for name in ws}
    # every weight at once, and each weight alone: form(E)(D) = -dL(D) = sum_W <G_W^t, D_W>
    total = central_difference(loss, vals, directions, h=1e-5)
    symbolic = sum(float(np.sum(grads[n] * directions[n])) for n in ws)
    assert abs(-symbolic - total) <= FD_TOL * abs(total)
    each = {n: float(central_difference(loss, vals, {n: directions[n]}, h=1e-5)) for n in ws}
    floor = FLOOR * max(abs(x) for x in each.values())
    for n in ws:
        assert abs(-float(np.sum(grads[n] * directions[n])) - each[n]) <= FD_TOL * max(abs(each[n]), floor), n


@pytest.mark.parametrize("L", [1, 2, 3])
def test_expanded_and_shared_forms_generate_the_same_numbers(L):
    p = program(L)
    expanded = p.apply_rules("expanded", form(p["E"]))
    w = shared(p)
    vals = weight_values(p, weights(w), seed=20 + L)
    a = codegen.compile_gradients(expanded, p.dims)(vals)
    b = codegen.compile_gradients(w, p.dims)(vals)
    assert max(errors(a, b).values()) <= EXACT
    assert max(errors(a, interpreted(p, expanded, vals)).values()) <= EXACT


def test_shared_code_does_less_work_than_expanded_code():
    p = program(3)
    lowered = {name: codegen.Lowering(codegen.gradient_terms(x), p.dims)
               for name, x in (("expanded", p.apply_rules("expanded", form(p["E"]))), ("shared", shared(p)))}
    for lowering in lowered.values():
        lowering.lower()
    assert lowered["shared"].flops < lowered["expanded"].flops / 2


# ---- what the lowering promises ---------------------------------------------------------------------


def test_each_layer_is_computed_once_and_derivatives_reuse_the_forward_sweep():
    L = 4
    p = program(L)
    source = codegen.gradients_source(shared(p), p.dims)
    body = source.split("def grads(")[1]
    assert body.count("_softmax(") == L  # a(A) of the forward sweep, reused by aa(A, B)
    assert body.count("_aa_given(") == L
    assert body.count(" > 0") == L  # one relu mask per layer, for every mm of it
    assert "_mm(" not in body and "_aa(" not in body and "_mul(" not in body
    for i in range(1, L + 1):
        assert body.count("\n    X_%d = " % i) == 1  # the intermediates, named after their bindings
    for i in range(1, L):
        assert body.count("\n    G_%d = " % i) == 1  # the adjoints
    assert "0.5 *" in body  # s = k^(-1/2) with k = 4, baked in


def test_the_generated_module_imports_only_numpy_and_says_what_it_is(tmp_path):
    p = program(2)
    source = codegen.gradients_source(shared(p), p.dims, "form w of encoder(2)")
    tree = ast.parse(source)
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [(a.name, a.asname) for n in imports for a in n.names] == [("numpy", "np")]
    doc = ast.get_docstring(tree)
    assert "form w of encoder(2)" in doc and "G_W^t" in doc and "n = 8" in doc
    assert [f.name for f in tree.body if isinstance(f, ast.FunctionDef)][-1] == "grads"


def test_products_are_bracketed_the_cheap_way():
    # A B v with A, B n x n and v a column: A (B v) costs 2 n^2, (A B) v costs n^3 + n^2
    p = fdsl.parse("dim n = 50\nconst A : n x n, B : n x n\nweight v : n x 1\nE = A B v\n")
    term = p["E"]
    lowering = codegen.Lowering({"E": term}, p.dims)
    lowering.lower()
    assert lowering.flops == 2 * 50 * 50
    rng = np.random.default_rng(0)
    vals = {"A": rng.standard_normal((50, 50)), "B": rng.standard_normal((50, 50)),
            "v": rng.standard_normal((50, 1))}
    fn = codegen.compile_source(lowering.source("test"))
    assert np.allclose(fn(vals)["E"], vals["A"] @ (vals["B"] @ vals["v"]), rtol=1e-12)


def test_sub_words_are_shared_up_to_transposition():
    # X Q and Q^t X^t = (X Q)^t: one product, read once as it is and once as a view
    p = fdsl.parse("dim n = 6, d = 4\nconst X : n x d\nweight Q : d x d\n"
                   "P = X Q\nR = Q^t X^t X\n")
    lowering = codegen.Lowering({"P": p["P"], "R": p["R"]}, p.dims)
    fn = codegen.compile_source(lowering.source("test"))
    body = lowering.source("test").split("def grads(")[1]
    assert body.count("@") + body.count("_matmul_total(") == 2  # X Q once, then (X Q)^t X
    rng = np.random.default_rng(1)
    vals = {"X": rng.standard_normal((6, 4)), "Q": rng.standard_normal((4, 4))}
    out = fn(vals)
    assert np.allclose(out["P"], vals["X"] @ vals["Q"])
    assert np.allclose(out["R"], vals["Q"].T @ vals["X"].T @ vals["X"])


def test_dims_without_a_size_are_read_from_the_inputs():
    text = HEADER.replace("dim n = 8, d = 6, k = 4, h = 5", "dim n, d = 6, k = 4, h = 5")
    p = fdsl.parse(text + "\nE := Y - X(2)\n")
    w = shared(p)
    fn = codegen.compile_gradients(w, p.dims)
    for n in (3, 7):
        rng = np.random.default_rng(n)
        vals = {"X0": rng.standard_normal((n, 6)), "Y": rng.standard_normal((n, 6))}
        for W in weights(w):
            r, c = (p.dims[x] if isinstance(x, str) else x for x in W.shape)
            vals[W.data[0].printed()] = rng.standard_normal((r, c)) / np.sqrt(r)
        dims = dict(p.dims, n=n)
        ev = Evaluator(vals, dims)
        want = {W.data[0].printed(): ev.value(coeff(w, W)).T for W in weights(w)}
        assert max(errors(fn(vals), want).values()) <= EXACT


def test_inputs_are_conformed_or_refused():
    p = program(1)
    fn = codegen.compile_gradients(shared(p), p.dims)
    vals = weight_values(p, weights(shared(p)), seed=3)
    flat = dict(vals, b_0=vals["b_0"].ravel().tolist())  # a row given as a flat list
    assert max(errors(fn(flat), fn(vals)).values()) == 0.0
    with pytest.raises(FdslError, match="X0 has shape"):
        fn(dict(vals, X0=np.zeros((3, 3))))
    with pytest.raises(FdslError, match="Y has no value"):
        fn({k: v for k, v in vals.items() if k != "Y"})
    with pytest.raises(ValueError, match="X0 has shape"):  # the module itself, without fdsl around it
        fn.generated(dict(vals, X0=np.zeros((3, 3))))


def test_without_dims_every_size_comes_from_the_values():
    p = program(2)
    w = shared(p)
    vals = weight_values(p, weights(w), seed=4)
    got = codegen.compile_gradients(w)(vals)
    assert "n_n = " in codegen.compile_gradients(w).source
    assert max(errors(got, interpreted(p, w, vals)).values()) <= EXACT


def test_operators_from_rule_files_lower_through_their_templates(tmp_path):
    p = fdsl.load(ROOT / "examples" / "softplus.fd")
    w = p["w"]
    assert fdsl.core.normal.is_normal_form(w)
    rng = np.random.default_rng(5)
    vals = {"X": rng.standard_normal((5, 4)), "Y": rng.standard_normal((5, 4)),
            "U": rng.standard_normal((4, 3)), "V": rng.standard_normal((3, 4))}
    got = codegen.compile_gradients(w, p.dims)(vals)
    assert "np.logaddexp(" in codegen.gradients_source(w, p.dims)
    assert max(errors(got, interpreted(p, w, vals)).values()) <= EXACT


def test_compile_gradients_is_cached_per_form_and_dims():
    p = program(2)
    w = shared(p)
    assert codegen.compile_gradients(w, p.dims) is codegen.compile_gradients(w, p.dims)


# ---- the command line ----------------------------------------------------------------------------


def fdsl_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "fdsl.cli", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_fdsl_codegen_writes_a_module_that_runs(tmp_path):
    out = tmp_path / "out.py"
    r = fdsl_cli("codegen", "examples/deep.fd", "--form", "w", "-o", out)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and "48 weights" in r.stdout
    module = import_module(out, "deep_grads")
    assert "examples/deep.fd" in module.__doc__ and "form w" in module.__doc__
    p = fdsl.load(ROOT / "examples" / "deep.fd")
    w = p["w"]
    vals = weight_values(p, weights(w), seed=8)
    assert max(errors(module.grads(vals), interpreted(p, w, vals)).values()) <= EXACT
    assert not list(tmp_path.glob(".out.py*"))  # the temporary file was renamed into place


def test_fdsl_codegen_normalises_a_form_that_is_not_normal(tmp_path):
    src = tmp_path / "two.fd"
    src.write_text(HEADER + "\nE := Y - X(2)\nv = form(E)\n")
    out = tmp_path / "two.py"
    r = fdsl_cli("codegen", src, "--form", "v", "-o", out)
    assert r.returncode == 0, r.stderr
    p = fdsl.load(src)
    w = shared(p)
    vals = weight_values(p, weights(w), seed=2)
    assert max(errors(import_module(out, "two_grads").grads(vals), interpreted(p, w, vals)).values()) <= EXACT


@pytest.mark.parametrize("form_name, message", [
    ("nosuch", "nosuch"),
    ("E", "not a scalar 1-form"),
    ("X", "parameterised definition"),
])
def test_fdsl_codegen_errors_exit_2_without_a_traceback(form_name, message, tmp_path):
    out = tmp_path / "out.py"
    out.write_text("# an earlier file\n")
    r = fdsl_cli("codegen", "examples/deep.fd", "--form", form_name, "-o", out)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and message in r.stderr
    assert out.read_text() == "# an earlier file\n"  # nothing written on failure


def test_fdsl_codegen_reports_an_unwritable_output(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = fdsl_cli("codegen", "examples/deep.fd", "--form", "w", "-o", blocker / "out.py")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "cannot write" in r.stderr
