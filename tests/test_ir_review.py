"""Reproducers from a review of the statement IR (issue 28): each test fails on the code it was
written against (ir-lowering at fc48359). Each program is checked by fdsl.verify.differential
(numpy and torch generated code, one example and a batch of two, against torch autograd); an
exception in the generated code fails the test as a disagreement does."""

from __future__ import annotations

import pytest

from fdsl.verify.differential import check

pytest.importorskip("torch")
pytest.importorskip("fdsl.verify.torch_eval")


def _ok(source: str, sign: int = -1):
    report = check(source, sign=sign)
    assert report.ok, report.describe()


# ---- 1. a product scaled after it is made reads its scale through attrs, which no index sees ------

OUT_SCALE_BEFORE_ITS_SCALAR = """\
dim n = 4, d = 6, k = 2
weight B : n x d, A : d x n, P : d x k, Q : k x k, R : k x d
L = trace(B A) trace(P Q R)
w = -d(L)
"""


def test_a_product_scaled_after_by_a_computed_scalar_is_not_moved_before_that_scalar():
    # dL/dQ = trace(B A) (R P)^t: the product is smaller than its sides, so it is scaled after
    # (out_scale, an attribute: not in Op.values_read, so not in Sweep.readers nor seen by
    # ir.check); early_results moves it to just after P and R, before trace(B A) is computed:
    # `t7 = P.mT @ R.mT; t7 *= -1.0 * t5` then `t5 = ...`: UnboundLocalError in numpy and
    # torch, no data, no batch (107ac8d: correct)
    _ok(OUT_SCALE_BEFORE_ITS_SCALAR)


# ---- 2, 3. kernels made from an op of a stacked chain drop its head axis for shared batched reads --

HEADS_WITH_A_MASK_OF_THE_DATA = """\
dim n = 4, d = 3, k = 2
const X : n x d, Y : n x d, M : n x n
weight Q[j], K[j], V[j] : d x k, O[j] : k x d
head(j) = a(X Q[j] K[j]^t X^t + M) X V[j] O[j]
E := Y - (head(0) + head(1))
L = trace(E^t E) / 2
w = form(E)
"""


def test_a_mask_given_with_the_data_is_added_into_stacked_scores_per_example_not_per_head():
    # t4_h = _add_into(t3_h, M): the stacked sum read M as M.unsqueeze(-3); the add_into that
    # replaces it has no unsqueeze, so a batch of 2 against 2 heads adds example i's mask to head
    # i: silently wrong gradients (107ac8d: correct)
    _ok(HEADS_WITH_A_MASK_OF_THE_DATA)


HEADS_ADDMM_WITH_A_SHARED_BATCH = """\
dim n = 4, d = 3, k = 2
const X : n x d, Y : n x d, M : n x n
weight A[j], C[j] : d x k, B[j] : k x n
h(j) = a(((X A[j]) * (X C[j])) B[j] + M) X
E := Y - (h(0) + h(1))
L = trace(E^t E) / 2
w = form(E)
"""


def test_a_stacked_product_added_to_a_shared_batched_matrix_keeps_the_head_axis_in_addmm():
    # t5_h = _addmm(M, t3_h, B_0_h): the same with addmm (M read without its head axis; _addmm
    # falls back to M + A @ B, broadcasting the batch against the heads): silently wrong
    # (107ac8d: correct)
    _ok(HEADS_ADDMM_WITH_A_SHARED_BATCH)


# ---- 4. a per-example number read by a stacked op has no head axis -------------------------------

HEADS_READ_A_MATRIX_SCALED_PER_EXAMPLE = """\
dim n = 3, d = 4, k = 2
const X : n x d, Y : n x d
weight Z0 : n x d, A : d x n
weight Q[j], K[j], V[j] : d x k, O[j] : k x d
Z = trace(X A) Z0
head(j) = a(Z Q[j] K[j]^t Z^t) Z V[j] O[j]
E := Y - (head(0) + head(1))
L = trace(E^t E) / 2
w = form(E)
"""


def test_a_weight_scaled_by_a_per_example_trace_is_read_by_stacked_heads_with_a_head_axis():
    # t5_h = t4_h @ t2.unsqueeze(-3).mT; t5_h *= t1: the stacked scores (batch, h, n, n) are
    # scaled after by t1 = trace(X A), a (batch, 1, 1) number of each example, which the stacked
    # op reads without a head axis (heads.stacked_heads unsqueezes only matrices, never a scale or
    # an out_scale), so a batch of 2 meets 2 heads: example i's number scales head i, silently
    # wrong (also wrong at 107ac8d; before f76b725 Z itself was not unsqueezed either)
    _ok(HEADS_READ_A_MATRIX_SCALED_PER_EXAMPLE)


# ---- 5, 6. stacks against shared values without a batch, torch ----------------------------------

STACK_TIMES_SHARED_DATA = """\
dim n = 3, d = 2
const X : n x d, Y : n x d
weight A[j] : d x d
h(j) = a(X A[j] X^t) X
E := Y - (h(0) + h(1))
L = trace(E^t E) / 2
w = form(E)
"""


def test_a_bmm_of_a_stack_and_an_unsqueezed_shared_value_runs_on_one_example():
    # t2_h = _bmm(X.unsqueeze(-3), t1_h.mT): without a batch both are 3-d, (1, n, d) and
    # (h, d, n), and _bmm calls torch.bmm, which does not broadcast: RuntimeError (also at 107ac8d)
    _ok(STACK_TIMES_SHARED_DATA)


STACK_ADDED_INTO_SHARED = """\
dim n = 3
const X : n x n, Z : n x n, Y : n x n
weight A[j] : n x n, B[j] : n x n
h(j) = a(X + Z + A[j] B[j])
E := Y - (h(0) + h(1))
L = trace(E^t E) / 2
w = form(E)
"""


def test_a_stacked_term_is_not_added_in_place_into_a_sum_of_shared_terms():
    # t2_h = X.unsqueeze(-3) + Z.unsqueeze(-3); t2_h += t1_h: (1, n, n) += (h, n, n) cannot be
    # done in place (Writer._sum checks the batch axis, not the head axis): RuntimeError on one
    # example and on a batch (also at 107ac8d)
    _ok(STACK_ADDED_INTO_SHARED)
