"""The numpy target's helpers (fdsl.codegen.numpy_helpers), a real module that generated numpy code
copies: each against the plain numpy it stands for, on one example and on a batch."""

from __future__ import annotations

import numpy as np
import pytest

from fdsl.codegen import numpy_helpers as h
from fdsl.codegen.targets import TARGETS

rng = np.random.default_rng(0)


def test_the_numpy_target_copies_this_module():
    runtime = TARGETS["numpy"].runtime()
    for name in ("_matmul_total", "_grouped_total_rows", "_in_pieces", "_half_sq", "_scalar"):
        assert "def %s(" % name in runtime


@pytest.mark.parametrize("a_batched, b_batched", [(True, True), (True, False), (False, True), (False, False)])
def test_a_product_summed_over_the_batch(a_batched, b_batched):
    nb = 3
    A = rng.standard_normal((nb, 4, 5) if a_batched else (4, 5))
    B = rng.standard_normal((nb, 5, 2) if b_batched else (5, 2))
    want = sum((A[i] if a_batched else A) @ (B[i] if b_batched else B) for i in range(nb))
    assert np.allclose(h._matmul_total(A, B, nb), want, atol=1e-12)
    assert np.allclose(h._matmul_total(A[0] if a_batched else A, B[0] if b_batched else B, 0),
                       (A[0] if a_batched else A) @ (B[0] if b_batched else B), atol=1e-12)


def test_grouped_products_are_the_products_one_by_one():
    A = rng.standard_normal((3, 4, 5))
    Bs = [rng.standard_normal((5, k)) for k in (2, 3, 1)]
    for got, B in zip(h._grouped(A, Bs), Bs):
        assert np.allclose(got, A @ B, atol=1e-12)
    for got, B in zip(h._grouped_total(A, Bs, 3), Bs):
        assert np.allclose(got, (A @ B).sum(axis=0), atol=1e-12)
    As = [rng.standard_normal((k, 4)) for k in (2, 3)]
    C = rng.standard_normal((4, 6))
    for got, A2 in zip(h._grouped_rows(As, C), As):
        assert np.allclose(got, A2 @ C, atol=1e-12)
    sp = h._sum_of_products([As[0].T, As[1].T], [As[0], As[1]])
    assert np.allclose(sp, As[0].T @ As[0] + As[1].T @ As[1], atol=1e-12)


def test_sums_and_traces_over_a_batch():
    x = rng.standard_normal((3, 4, 5))
    assert np.allclose(h._sum_total(x, -1, 3), x.sum(axis=(0, 2))[:, None], atol=1e-12)
    assert np.allclose(h._sum_total(x[0], -2, 3), 3 * x[0].sum(axis=0, keepdims=True), atol=1e-12)
    A, B = rng.standard_normal((4, 5)), rng.standard_normal((5, 4))
    assert abs(h._trace_product(A, B) - np.trace(A @ B)) < 1e-12
    assert h._half_sq(A, 0) == pytest.approx(0.5 * float((A ** 2).sum()))
