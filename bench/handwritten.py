"""The reference for the benchmark: the deep encoder and its backprop, written by hand in numpy.

The encoder of examples/deep.fd (DESIGN.md, manual eq. 1): ``X_{i+1} = F_i(X_i)`` with

    F_i(Z) = m(a(s Z Q_i K_i^t Z^t) Z V_i + C b_i) W_i + C f_i,   s = k^(-1/2),

m = relu, a = row-wise softmax, C a column of ones (so ``C b`` adds the row b to every row), and
the loss ``L = 1/2 ||E||^2`` with ``E = Y - X_L``. ``backward`` returns dL/dW for every weight,
keyed by printed name (``Q_0``, ..., ``f_{L-1}``): the negative of fdsl's ``grad(form(E), W)``.

Written as a competent engineer would, without fdsl: the forward pass keeps what the backward pass
needs (X Q, X K, the softmax S, X V, the relu input U and output M), the backward pass is the
chain rule layer by layer, every product bracketed the cheap way, no gradient for the input X_0.
"""

from __future__ import annotations

import numpy as np


def softmax(A):
    """Row-wise softmax, the row maximum subtracted first."""
    e = np.exp(A - A.max(axis=1, keepdims=True))
    e /= e.sum(axis=1, keepdims=True)
    return e


def forward(X, weights, L):
    """X_L of the encoder (no cache): what the forward-only column of the benchmark times."""
    k = weights["Q_0"].shape[1]
    s = k ** -0.5
    for i in range(L):
        Q, K, V, W = weights["Q_%d" % i], weights["K_%d" % i], weights["V_%d" % i], weights["W_%d" % i]
        S = softmax((s * (X @ Q)) @ (X @ K).T)
        M = np.maximum(S @ (X @ V) + weights["b_%d" % i], 0.0)
        X = M @ W + weights["f_%d" % i]
    return X


def backward(X, Y, weights, L):
    """dL/dW for every weight, for L = 1/2 ||Y - X_L||^2: one forward pass with a cache, then the
    chain rule from the last layer down."""
    k = weights["Q_0"].shape[1]
    s = k ** -0.5
    cache = []
    for i in range(L):
        Q, K, V, W = weights["Q_%d" % i], weights["K_%d" % i], weights["V_%d" % i], weights["W_%d" % i]
        XQ, XK, XV = X @ Q, X @ K, X @ V
        S = softmax((s * XQ) @ XK.T)
        U = S @ XV + weights["b_%d" % i]
        M = np.maximum(U, 0.0)
        cache.append((X, XQ, XK, XV, S, U, M))
        X = M @ W + weights["f_%d" % i]

    grads = {}
    dX = X - Y  # dL/dX_L
    for i in reversed(range(L)):
        Q, K, V, W = weights["Q_%d" % i], weights["K_%d" % i], weights["V_%d" % i], weights["W_%d" % i]
        X, XQ, XK, XV, S, U, M = cache[i]
        grads["W_%d" % i] = M.T @ dX
        grads["f_%d" % i] = dX.sum(axis=0, keepdims=True)
        dU = (dX @ W.T) * (U > 0)  # relu
        grads["b_%d" % i] = dU.sum(axis=0, keepdims=True)
        dS = dU @ XV.T
        dXV = S.T @ dU
        grads["V_%d" % i] = X.T @ dXV
        dA = S * (dS - (S * dS).sum(axis=1, keepdims=True))  # softmax, row by row
        dA *= s
        dXQ = dA @ XK
        dXK = dA.T @ XQ
        grads["Q_%d" % i] = X.T @ dXQ
        grads["K_%d" % i] = X.T @ dXK
        if i > 0:  # no gradient for the input X_0
            dX = dXQ @ Q.T + dXK @ K.T + dXV @ V.T
    return grads


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="A module, not a benchmark of its own: "
                            "bench/deep.py imports it (python bench/deep.py --help).").parse_args()
    print("bench/handwritten.py is the reference that bench/deep.py times; run python bench/deep.py")
