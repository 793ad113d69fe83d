"""The numpy runtime: helper functions that the operator table's numpy templates call.

Vocabulary
----------
scalar   a 1 x 1 array or a plain number; in a product it multiplies every entry (a 1 x 1 factor
         of a well-shaped product always stands between a column and a row of size 1, so scaling
         and matrix multiplication agree there).
S        ``a(A)``, the row-wise softmax of A.

The definitions are exact and are the ones the whole project uses (DESIGN.md):

- ``_softmax(A)``: each row exponentiated and normalised, with the row maximum subtracted first so
  that large entries cannot overflow.
- ``_mm(A, B) = [A > 0] o B``: the entries of B where A is positive, zero elsewhere; it is linear in
  B and ``d(m(A)) = mm(A, d(A))``.
- ``_aa(A, B) = S o (B - rowsum(S o B) 1^t)``: the softmax Jacobian at A applied to B; it is linear
  in B and ``d(a(A)) = aa(A, d(A))``.
- ``_mul(*factors)``: an n-ary matrix product, scalars multiplied in, folded left to right.

This module imports nothing but numpy so that its source can be copied verbatim into generated
code (``fdsl codegen``): keep it that way.
"""

import numpy as np


def _softmax(A):
    """Row-wise softmax, stable: the row maximum is subtracted before exponentiating."""
    A = np.asarray(A)
    if A.dtype.kind != "f":  # computed in the dtype of its argument (float32 stays float32)
        A = A.astype(np.float64)
    e = A - A.max(axis=-1, keepdims=True)  # rows are the last axis: a batch of matrices works too
    np.exp(e, out=e)  # in place: one n x n array instead of three
    e /= e.sum(axis=-1, keepdims=True)
    return e


def _mm(A, B):
    """mm(A, B) = [A > 0] o B, the derivative of relu at A applied to B."""
    return (np.asarray(A) > 0) * B


def _aa(A, B):
    """aa(A, B) = S o (B - rowsum(S o B) 1^t) with S = softmax(A): the softmax Jacobian at A on B."""
    return _aa_given(_softmax(A), B)


def _aa_given(S, B):
    """aa(A, B) from S = softmax(A) (generated code computes S once per A, or reuses a(A))."""
    out = S * B  # as large as the larger of S and B: either may have a batch axis the other lacks
    out -= S * out.sum(axis=-1, keepdims=True)
    return out


def _is_scalar(x):
    return np.ndim(x) == 0 or np.shape(x) == (1, 1)


def _mul(*factors):
    """The product of the factors: scalars multiply, matrices are folded left to right with @."""
    coeff = 1.0
    product = None
    for x in factors:
        if _is_scalar(x):
            coeff = coeff * np.asarray(x, dtype=np.float64).reshape(())
        elif product is None:
            product = x
        else:
            product = product @ x
    if product is None:
        return np.full((1, 1), coeff)
    # a coefficient of exactly 1 (no scalars, or a product of ones) costs nothing
    return product if coeff == 1.0 else coeff * product
