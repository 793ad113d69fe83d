"""Issue 28, item 6: a scalar given as a number takes the module's working dtype, in both runtimes.
A float64 module given its declared scalar and its scalar weight as Python numbers computes
bitwise what it computes given them as float64 0-d tensors (torch) or arrays (numpy): the number
is not rounded on the way (the torch runtime used to make it a tensor of torch's default dtype,
float32, and read it back: gradients 5e-8 relative off, no error)."""

from __future__ import annotations

import numpy as np
import pytest

import fdsl
from fdsl.calculus.gradients import loss_of
from fdsl.codegen import generated as codegen

PROGRAM = """\
dim n = 5, d = 3
const X : n x d, Y : n x d
scalar s
weight W : d x d, V : d x d, tau : scalar
E := Y - a(tau s X W X^t) X V
L = 1/2 trace(E^t E)
w = -d(L)
"""
NUMBERS = {"s": 0.1, "tau": 1 / 3}  # neither is a float32


def _source(target: str, dtype):
    p = fdsl.parse(PROGRAM)
    w = p["w"]
    return codegen.gradients_source(p.normal_form(w), p.dims, target=target, dtype=dtype, loss=loss_of(w))


def _arrays() -> dict:
    rng = np.random.default_rng(0)
    return {"X": rng.standard_normal((5, 3)), "Y": rng.standard_normal((5, 3)), "W": rng.standard_normal((3, 3)),
            "V": rng.standard_normal((3, 3))}


@pytest.mark.parametrize("dtype", [None, "float64"], ids=["inputs' dtype", "--dtype float64"])
@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_a_scalar_given_as_a_number_is_computed_as_the_same_float64_tensor(target, dtype):
    if target == "torch":
        torch = pytest.importorskip("torch")
        as_input, as_0d = torch.tensor, lambda x: torch.tensor(x, dtype=torch.float64)
    else:
        as_input, as_0d = np.asarray, lambda x: np.asarray(x, dtype=np.float64)
    grads_and_loss = codegen.compile_namespace(_source(target, dtype))["grads_and_loss"]
    arrays = {k: as_input(v) for k, v in _arrays().items()}
    g_num, loss_num = grads_and_loss(dict(arrays, **NUMBERS))
    g_0d, loss_0d = grads_and_loss(dict(arrays, **{k: as_0d(v) for k, v in NUMBERS.items()}))
    assert set(g_num) == set(g_0d) == {"W", "V", "tau"}
    for name in g_num:
        a, b = np.asarray(g_num[name]), np.asarray(g_0d[name])
        assert a.dtype == b.dtype == np.float64, (name, a.dtype, b.dtype)
        assert np.array_equal(a, b), (name, np.max(np.abs(a - b)) / np.max(np.abs(b)))
    assert float(loss_num) == float(loss_0d)
