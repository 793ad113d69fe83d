"""Every operator of the table computes in the dtype it promises (issue 31, item 4): a model made
of that one operator goes through the generated numpy and torch modules in float32 (inputs all
float32, and ``--dtype float32`` with float64 inputs), and every gradient and the loss come back
float32, close to the float64 answer of the same inputs.

The cases below name the operators they use; ``test_the_cases_cover_every_operator`` walks the
terms (the model and its normal form) and fails when an operator of the table is in none of
them, so a new operator needs a case here.
"""

from __future__ import annotations

import numpy as np
import pytest

import fdsl
from fdsl.calculus.gradients import loss_of
from fdsl.codegen import generated as codegen
from fdsl.core.ops import OPS
from fdsl.core.terms import postorder

torch = pytest.importorskip("torch")

HEAD = """dim n = 5, d = 4
const X : n x d
weight W : d x d, V : d x d
A := X W
B := X V
"""

# name -> (F, its shape): the model is L = 1/2 ||Y - F||^2 (w = form(Y - F)); A and B are n x d
CASES = {
    "product": ("A B^t A", "n x d"),
    "relu": ("m(A) + mm(A, B)", "n x d"),
    "softmax": ("a(A) + aa(A, B)", "n x d"),
    "exp": ("exp(A) + dexp(A, B)", "n x d"),
    "log": ("log(A * A + 1) + dlog(A * A + 1, B)", "n x d"),
    "sqrt": ("sqrt(A * A + 1) + dsqrt(A * A + 1, B)", "n x d"),
    "tanh": ("tanh(A) + dtanh(A, B)", "n x d"),
    "sigmoid": ("sigmoid(A) + dsigmoid(A, B)", "n x d"),
    "gelu": ("gelu(A)", "n x d"),
    "dgelu": ("dgelu(A, B)", "n x d"),
    "layernorm": ("layernorm(A)", "n x d"),
    "dlayernorm": ("dlayernorm(A, B)", "n x d"),
    "logsoftmax": ("logsoftmax(A)", "n x d"),
    "dlogsoftmax": ("dlogsoftmax(A, B)", "n x d"),
    "rows": ("rowsum(A) + rowmean(B) + rowvar(A)", "n x 1"),
    "shape constants": ("A onescol(A) + cols(A) rowsum(B) + eyerows(A) rowmean(A) onesrow(A) onescol(A)", "n x 1"),
    "division": ("A / (B * B + 1)", "n x d"),
    "power": ("trace(A^t A)^(-1/2) B + (A A^t + eye(n)) A", "n x d"),
    "scalar weight": ("g A + g^2 B", "n x d"),
    "constants": ("a(A A^t + M) C ones(1, d) + A + 2", "n x d"),
}
# operators that never reach the numbers: terms rewrite them when they are built
NOT_COMPUTED = {
    "zero": "a zero summand or factor is dropped",
    "onescol": "ones(cols(A), 1), made from A's shape alone",
    "onesrow": "ones(1, cols(A)), made from A's shape alone",
    "cols": "the number of columns of A, a number",
    "eyerows": "eye(rows(A)), made from A's shape alone",
}
EXTRA = "weight g : scalar\nconst M : n x n = causal, C : n x 1 = ones\n"


def case_program(name):
    F, shape = CASES[name]
    return fdsl.parse(HEAD + EXTRA + "const Y : %s\nF = %s\nw = form(Y - F)\n" % (shape, F))


def case_values(name, seed=0):
    """float64 values of X, Y (the shape of the case's F) and the weights (the scalar g 0-d)."""
    rng = np.random.default_rng(seed)
    return {"X": rng.standard_normal((5, 4)), "W": rng.standard_normal((4, 4)) / 2,
            "V": rng.standard_normal((4, 4)) / 2, "g": np.asarray(0.7),
            "Y": rng.standard_normal((5, 1) if CASES[name][1] == "n x 1" else (5, 4))}


def module(p, target, dtype=None):
    w = p.normal_form(p["w"])
    return codegen.compile_namespace(codegen.gradients_source(w, p.dims, "test", target, dtype, loss_of(p["w"])))


def close(got, want) -> float:
    num = sum(float(np.sum((np.asarray(got[k], dtype=np.float64) - want[k]) ** 2)) for k in want)
    return (num / sum(float(np.sum(np.asarray(v) ** 2)) for v in want.values())) ** 0.5


def test_the_cases_cover_every_operator():
    seen = set()
    for name in CASES:
        p = case_program(name)
        for term in (p["F"], p.normal_form(p["w"])):
            seen.update(node.op for node in postorder(term))
    builtin = {op for op, spec in OPS.items() if not spec.user}
    assert builtin - seen - set(NOT_COMPUTED) == set(), sorted(builtin - seen)


@pytest.mark.parametrize("name", sorted(CASES))
def test_numpy_float32_in_float32_out(name):
    p = case_program(name)
    vals = case_values(name)
    vals32 = {k: np.asarray(v, dtype=np.float32) for k, v in vals.items()}
    exact_grads, exact_loss = module(p, "numpy")["grads_and_loss"](
        {k: v.astype(np.float64) for k, v in vals32.items()})
    assert {g.dtype for g in exact_grads.values()} == {np.dtype(np.float64)}
    for forced, given in ((None, vals32), ("float32", vals)):
        grads, loss = module(p, "numpy", forced)["grads_and_loss"](given)
        assert {k: g.dtype for k, g in grads.items()} == {k: np.dtype(np.float32) for k in grads}, (name, forced)
        assert close(grads, exact_grads) <= 1e-4, (name, forced)
        assert abs(loss - exact_loss) <= 1e-4 * (1 + abs(exact_loss))


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_float32_in_float32_out(name):
    p = case_program(name)
    vals = case_values(name)
    vals32 = {k: torch.tensor(v, dtype=torch.float32) for k, v in vals.items()}
    exact_grads, exact_loss = module(p, "torch")["grads_and_loss"]({k: v.double() for k, v in vals32.items()})
    assert {g.dtype for g in exact_grads.values()} == {torch.float64}
    exact = {k: g.numpy() for k, g in exact_grads.items()}
    for forced, given in ((None, vals32), ("float32", {k: torch.tensor(v) for k, v in vals.items()})):
        grads, loss = module(p, "torch", forced)["grads_and_loss"](given)
        assert {k: g.dtype for k, g in grads.items()} == {k: torch.float32 for k in grads}, (name, forced)
        assert torch.as_tensor(loss).dtype == torch.float32, (name, forced)
        assert close({k: g.numpy() for k, g in grads.items()}, exact) <= 1e-4, (name, forced)
        assert abs(float(loss) - float(exact_loss)) <= 1e-4 * (1 + abs(float(exact_loss)))


ONEHOT = """dim n = 5, v = 7, d = 4
const X, Y : n x v onehot
weight E : v x d, U : d x v, g : 1 x d
L = -trace(Y^t logsoftmax((layernorm(gelu(X E)) * (ones(n, 1) g)) U))
w = -d(L)
"""


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_tokens_as_ids_keep_float32(target):
    """Ids are integers: the dtype is the float inputs' (the lookup, scatter and pick keep it)."""
    p = fdsl.parse(ONEHOT)
    rng = np.random.default_rng(1)
    vals = {"X": rng.integers(0, 7, 5), "Y": rng.integers(0, 7, 5), "E": rng.standard_normal((7, 4)),
            "U": rng.standard_normal((4, 7)) / 2, "g": rng.standard_normal((1, 4))}
    lib = torch.tensor if target == "torch" else np.asarray
    f32 = torch.float32 if target == "torch" else np.dtype(np.float32)

    def given(dtype):
        return {k: lib(v) if k in "XY" else lib(v.astype(dtype)) for k, v in vals.items()}

    exact, _ = module(p, target)["grads_and_loss"](given(np.float64))
    exact = {k: np.asarray(g) for k, g in exact.items()}
    for forced, inputs in ((None, given(np.float32)), ("float32", given(np.float64))):
        grads, _ = module(p, target, forced)["grads_and_loss"](inputs)
        assert {g.dtype for g in grads.values()} == {f32}, forced
        assert close({k: np.asarray(g) for k, g in grads.items()}, exact) <= 1e-4
