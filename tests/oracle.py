"""Numerical oracles for the tests: finite differences in float64, independent of the rewrite engine.

Vocabulary
----------
values      a dict of arrays by name (printed symbol names: ``X``, ``Q_0``).
direction   a dict of arrays for some of the names: the tangent along which values move.
stencil     central differences: ``order=2`` uses f(x ± h v); ``order=4`` (the default) also
            f(x ± 2h v) and cancels the h^2 error term, leaving O(h^4) truncation error.
margin      how far the arguments of relu (``m``, ``mm``) stay from 0 at the evaluation point: a
            finite difference is only trustworthy if every stencil point stays on one side of
            every kink, i.e. 2 h |direction of the argument| < margin.

Typical use (a directional derivative of a program's term against its symbolic differential):

    numeric = directional_derivative(program, term, values, {"Q_0": dQ})
    assert rel_error(numeric, symbolic) < 1e-6
"""

from __future__ import annotations

import numpy as np

from fdsl.core.terms import symbols
from fdsl.numbers.numpy_eval import Evaluator, evaluate


def rel_error(a, b) -> float:
    """||a - b|| / max(||a||, ||b||): 0 for equal arrays, about 1 for unrelated ones."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    scale = max(np.linalg.norm(a), np.linalg.norm(b))
    if scale == 0.0:
        return 0.0
    return float(np.linalg.norm(a - b) / scale)


def max_rel_error(a: dict, b: dict) -> float:
    """The largest ``rel_error`` over the names of two dicts of arrays (which must agree)."""
    assert set(a) == set(b), "different names: %s vs %s" % (sorted(a), sorted(b))
    return max((rel_error(a[k], b[k]) for k in a), default=0.0)


def moved(values: dict, direction: dict, t: float) -> dict:
    """``values + t * direction``, name by name (names not in ``direction`` stay as they are)."""
    out = dict(values)
    for name, v in direction.items():
        out[name] = np.asarray(values[name], dtype=np.float64) + t * np.asarray(v, dtype=np.float64)
    return out


def central_difference(f, values: dict, direction: dict, h: float = 1e-4, order: int = 4):
    """The derivative of ``f(values)`` (a number or an array) along ``direction``."""
    def at(t):
        return np.asarray(f(moved(values, direction, t)), dtype=np.float64)

    if order == 2:
        return (at(h) - at(-h)) / (2 * h)
    if order == 4:
        return (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h)
    raise ValueError("order is 2 or 4")


def random_direction(values: dict, names, rng) -> dict:
    """A direction with standard normal entries for each of ``names``, shaped like its value."""
    return {name: rng.standard_normal(np.shape(values[name])) for name in names}


def gradient(f, values: dict, names, h: float = 1e-4, order: int = 4) -> dict:
    """The gradient of a scalar ``f(values)`` with respect to each of ``names``, entry by entry."""
    grads = {}
    for name in names:
        base = np.asarray(values[name], dtype=np.float64)
        g = np.zeros_like(base)
        for index in np.ndindex(base.shape):
            e = np.zeros_like(base)
            e[index] = 1.0
            g[index] = float(np.asarray(central_difference(f, values, {name: e}, h, order)).reshape(()))
        grads[name] = g
    return grads


def term_function(program, term):
    """``values -> eval(term)`` over the program's dims: the function the oracles differentiate."""
    return lambda values: evaluate(term, values, program.dims)


def directional_derivative(program, term, values: dict, direction: dict, h: float = 1e-4, order: int = 4):
    """The derivative of ``eval(term)`` along ``direction`` (a dict of arrays by symbol name)."""
    return central_difference(term_function(program, term), values, direction, h, order)


def kink_margin(program, term, values: dict) -> float:
    """The smallest |entry| of the first argument of any ``m`` or ``mm`` in ``term`` at ``values``
    (infinity when there is none): finite differences need steps well below it."""
    ev = Evaluator(values, program.dims)
    ev.value(term)
    margins = [np.min(np.abs(ev.memo[node.args[0]])) for node in ev.memo if node.op in ("m", "mm")]
    return float(min(margins, default=np.inf))


def symbol_values(program, term) -> dict:
    """The arrays of every symbol under ``term`` that needs one, from ``program.values`` (which
    draws them on demand after ``random SEED``), as a plain dict by printed name."""
    out = {}
    for leaf in symbols(term):
        symbol = leaf.data[0]
        if symbol.kind != "dim" and symbol.value is None:
            out[symbol.printed()] = np.array(program.values[symbol.printed()])
    return out


# ---- the encoder the tests share --------------------------------------------------------------------

# examples/encoder2.fd's declarations and layer, without its statements
ENCODER = """\
dim n = 8, d = 6, k = 4, h = 5
const X : n x d, Y : n x d
const C : n x 1 = ones
scalar s = k^(-1/2)
weight Q[i], K[i] : d x k
weight V[i] : d x h, W[i] : h x d, b[i] : 1 x h, f[i] : 1 x d
layer(i, Z) = m(a(s Z Q[i] K[i]^t Z^t) Z V[i] + C b[i]) W[i] + C f[i]
encoder(0) = X
encoder(L) = layer(L-1, encoder(L-1))
"""


def weight_values(program, weights, seed: int, inputs=("X0", "Y")) -> dict:
    """Normal inputs (8 x 6) and weights scaled by 1/sqrt(rows), for the encoders of the tests."""
    rng = np.random.default_rng(seed)
    vals = {name: rng.standard_normal((8, 6)) for name in inputs}
    for w in weights:
        r, c = (program.dims[x] if isinstance(x, str) else x for x in w.shape)
        vals[w.data[0].printed()] = rng.standard_normal((r, c)) / np.sqrt(r)
    return vals
