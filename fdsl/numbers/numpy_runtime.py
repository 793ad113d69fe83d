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
- ``_sigmoid``, ``_gelu`` and the derivative operators ``_dtanh``, ``_dsigmoid``, ``_dgelu``,
  ``_ddgelu`` (``f'(A) o B``, ``f''(A) o B``): GELU is the exact erf form of torch.nn.GELU(),
  with Phi the standard normal CDF (``_erfc_nonneg``: numpy only, accurate in both tails)
  and phi its density.
- ``_layernorm``, ``_dlayernorm``, ``_ddlayernorm``: layer norm (eps 1e-5, biased variance, no affine
  part), its Jacobian and second derivative, row by row; ``_logsoftmax``, ``_dlogsoftmax``: the
  stable log-softmax and its Jacobian; ``_causal(n)``: the causal mask.

This module imports nothing but numpy so that its source can be copied verbatim into generated
code (``fdsl codegen``): keep it that way.
"""

import numpy as np


def _floats(A):
    """A as an array of floats: its own dtype when it has one (float32 stays float32: every helper
    computes in the dtype of its arguments, as the generated code promises), else float64."""
    A = np.asarray(A)
    return A if A.dtype.kind == "f" else A.astype(np.float64)


def _softmax(A):
    """Row-wise softmax, stable: the row maximum is subtracted before exponentiating."""
    A = _floats(A)
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
            # a Python number: numpy's weak scalar, so that it scales a float32 product in float32
            coeff = coeff * float(np.asarray(x).reshape(()))
        elif product is None:
            product = x
        else:
            product = product @ x
    if product is None:
        return np.full((1, 1), coeff, dtype=np.result_type(*(_floats(x) for x in factors)))
    # a coefficient of exactly 1 (no scalars, or a product of ones) costs nothing
    return product if coeff == 1.0 else coeff * product


def _erfc_nonneg(z):
    """erfc(z) for z >= 0 to a few ulps, in numpy alone: below 1 as 1 - erf(z) from the series
    erf(z) = 2/sqrt(pi) exp(-z^2) sum_n (2 z^2)^n z / (1 3 5 ... (2n+1)) (positive terms, no
    cancellation), from 1 on by the continued fraction exp(-z^2)/sqrt(pi) / (z + (1/2)/(z + 1/(z +
    (3/2)/(z + ...)))), which keeps its relative accuracy however small erfc(z) is."""
    z = _floats(z)
    out = np.empty_like(z)
    small = z < 1.0
    zs = z[small]
    z2 = zs * zs
    term, total = zs.copy(), zs.copy()
    for n in range(1, 40):
        term = term * (2.0 * z2 / (2 * n + 1))
        total += term
    out[small] = 1.0 - 1.1283791670955126 * np.exp(-z2) * total
    zl = z[~small]
    f = np.zeros_like(zl)
    for k in range(160, 0, -1):
        f = (0.5 * k) / (zl + f)
    out[~small] = 0.5641895835477563 * np.exp(-zl * zl) / (zl + f)
    return out


def _Phi(A):
    """The standard normal CDF, componentwise: erfc(-A / sqrt 2) / 2, accurate in both tails."""
    z = _floats(A) * 0.7071067811865476
    tail = 0.5 * _erfc_nonneg(np.abs(z))
    return np.where(z < 0, tail, 1.0 - tail)


def _phi(A):
    """The standard normal density, componentwise."""
    return np.exp(-0.5 * A * A) * 0.3989422804014327


def _gelu(A):
    """GELU, exact: A o Phi(A)."""
    return A * _Phi(A)


def _dgelu(A, B):
    """gelu'(A) o B = (Phi(A) + A o phi(A)) o B."""
    return (_Phi(A) + A * _phi(A)) * B


def _ddgelu(A, B):
    """gelu''(A) o B = phi(A) o (2 - A o A) o B."""
    return _phi(A) * (2.0 - A * A) * B


def _sigmoid(A):
    """1 / (1 + exp(-A)), without overflow for entries of either sign."""
    e = np.exp(-np.abs(A))
    return np.where(np.asarray(A) >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _dsigmoid(A, B):
    """sigmoid'(A) o B = S o (1 - S) o B, S = sigmoid(A)."""
    S = _sigmoid(A)
    return S * (1.0 - S) * B


def _dtanh(A, B):
    """tanh'(A) o B = (1 - tanh(A)^2) o B."""
    T = np.tanh(A)
    return (1.0 - T * T) * B


def _layer_parts(A):
    """(Xhat, 1/sigma) of layer norm: Xhat = (A - rowmean(A)) / sigma, sigma = sqrt(rowvar(A) + 1e-5)."""
    A = _floats(A)
    c = A - A.mean(axis=-1, keepdims=True)
    inv = 1.0 / np.sqrt((c * c).mean(axis=-1, keepdims=True) + 1e-5)
    return c * inv, inv


def _layernorm(A):
    """Row-wise (A - mean) / sqrt(var + 1e-5), var biased: torch.nn.LayerNorm without its affine part."""
    return _layer_parts(A)[0]


def _dlayernorm_given(Xhat, inv, B):
    return inv * (B - B.mean(axis=-1, keepdims=True) - Xhat * (Xhat * B).mean(axis=-1, keepdims=True))


def _dlayernorm(A, B):
    """layernorm's Jacobian at A on B, row by row: (B - mean(B) - Xhat mean(Xhat o B)) / sigma."""
    Xhat, inv = _layer_parts(A)
    return _dlayernorm_given(Xhat, inv, B)


def _ddlayernorm(A, U, B):
    """layernorm's second derivative at A on (U, B), row by row:
    -(mean(Xhat o U) J B + mean(Xhat o B) J U + Xhat mean(J U o B)) / sigma, J = dlayernorm(A, .)."""
    Xhat, inv = _layer_parts(A)
    JU, JB = _dlayernorm_given(Xhat, inv, U), _dlayernorm_given(Xhat, inv, B)
    mU, mB = (Xhat * U).mean(axis=-1, keepdims=True), (Xhat * B).mean(axis=-1, keepdims=True)
    return -inv * (mU * JB + mB * JU + Xhat * (JU * B).mean(axis=-1, keepdims=True))


def _logsoftmax(A):
    """Row-wise log(softmax(A)) = (A - max) - log(rowsum(exp(A - max))): exact for large entries."""
    A = _floats(A)
    shifted = A - A.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _dlogsoftmax(A, B):
    """dlogsoftmax(A, B) = B - rowsum(softmax(A) o B) 1^t."""
    return B - (_softmax(A) * B).sum(axis=-1, keepdims=True)


def _causal(n):
    """The causal mask: 0 on and below the diagonal, -inf above."""
    return np.triu(np.full((n, n), -np.inf), 1)
