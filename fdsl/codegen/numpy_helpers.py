"""The numpy target's helpers for generated code: inputs and dtypes, batches and their sums, the
grouped products, traces, results. Copied into every numpy module that ``fdsl codegen`` writes
(after ``fdsl.numbers.numpy_runtime``, the operators' numpy functions), and imported by the tests.

Vocabulary
----------
nb      the batch size of a call: 0 for one example, else the length of the leading axis that the
        inputs which vary per example carry (``_batch``).
total   a gradient summed over the batch (``_total``, ``_matmul_total``, ``_sum_total``): the
        gradient of the loss summed over the examples.
piece   a few examples of a large batch at a time (``_piece``, ``_in_pieces``; see targets).
ids     the value of a onehot constant: one integer a row, (rows,) or (batch, rows) (``_ids``);
        ``_lookup``, ``_scatter``, ``_pick_sum`` and ``_add_ids`` compute what the one-hot matrix
        would, without it (``fdsl.codegen.onehot``).
"""

import numpy as np


def _trace(A):
    """The trace: a number for one matrix, a (batch, 1, 1) array for a batch of them."""
    t = np.trace(A, axis1=-2, axis2=-1)
    return float(t) if A.ndim == 2 else t[..., None, None]


def _trace_product(A, B):
    """trace(A @ B) without the product, as the sum of A^t o B (as _trace: a number, or a
    (batch, 1, 1) array)."""
    t = (A.mT * B).sum(axis=(-2, -1))
    return float(t) if np.ndim(t) == 0 else t[..., None, None]


def _inner(A, B):
    """trace(A^t @ B), the sum of A o B (as _trace: a number, or a (batch, 1, 1) array)."""
    t = (A * B).sum(axis=(-2, -1))
    return float(t) if np.ndim(t) == 0 else t[..., None, None]


def _as_float(x):
    return float(np.asarray(x).reshape(()))


def _scalar_matrix(x, dtype):
    """A scalar as a 1 x 1 array (a per-example scalar, (batch, 1, 1), as it is)."""
    x = np.asarray(x, dtype=dtype)
    return x if x.ndim == 3 else x.reshape(1, 1)


def _dtype(values, names, forced):
    """The dtype to compute in: the forced one, else float32 when every array input is float32,
    else float64."""
    if forced is not None:
        return forced
    for name in names:  # the first input that is not float32 decides: float64
        if getattr(values[name], "dtype", None) != np.float32:
            return np.float64
    return np.float32 if names else np.float64


def _input(values, name, shape, batched, dtype):
    """values[name] as an array of the dtype and the declared shape (as given when it already is
    one), with a leading batch axis allowed when ``batched`` (a constant that varies per example)."""
    x = values[name]
    if type(x) is not np.ndarray or x.dtype != dtype:
        x = np.asarray(x, dtype=dtype)
    if x.ndim == 2 and (shape is None or x.shape == shape):
        return x
    if batched and x.ndim == 3 and (shape is None or x.shape[1:] == shape):
        return x
    if shape is not None and x.size == shape[0] * shape[1] and not (batched and x.ndim == 3):
        return x.reshape(shape)
    what = "(batch, %d, %d) or %s" % (shape + (shape,)) if batched and shape else str(shape or "a matrix")
    raise ValueError("%s has shape %s, not %s" % (name, x.shape, what))


def _scalar(values, name):
    return float(np.asarray(values[name]).reshape(()))


def _batch(*xs):
    """The batch size of the inputs that have one (they must agree), or 0 when none has."""
    sizes = {x.shape[0] for x in xs if x.ndim == 3}
    if len(sizes) > 1:
        raise ValueError("the inputs have different batch sizes: %s" % sorted(sizes))
    return sizes.pop() if sizes else 0


def _total(x, nb):
    """A gradient summed over the batch: the sum of its examples' (a term that no example changes
    counts once per example)."""
    if not nb:
        return x
    return x.sum(axis=0) if x.ndim == 3 else x * nb


def _sum_total(x, axis, nb):
    """x.sum(axis, keepdims=True) summed over the batch too (a gradient), as one reduction."""
    if x.ndim == 3:
        return x.sum(axis=(0, axis), keepdims=True)[0]
    s = x.sum(axis=axis, keepdims=True)
    return s * nb if nb else s


def _matmul_total(A, B, nb):
    """A @ B summed over the batch (a gradient): for two batches sum_b A_b B_b as one product, the
    examples side by side along the inner axis; a product that no example changes counts nb times."""
    if A.ndim == 3 and B.ndim == 3:
        return np.swapaxes(A, -1, -2).reshape(-1, A.shape[-2]).T @ B.reshape(-1, B.shape[-1])
    if A.ndim == 3:
        return A.sum(axis=0) @ B
    if B.ndim == 3:
        return A @ B.sum(axis=0)
    return (A @ B) * nb if nb else A @ B


def _cat(xs, axis):
    """The matrices side by side along ``axis`` (-1: columns, -2: rows); a matrix beside a batch
    is repeated for every example."""
    if len({x.ndim for x in xs}) > 1:
        nb = next(x.shape[0] for x in xs if x.ndim == 3)
        xs = [x if x.ndim == 3 else np.broadcast_to(x, (nb,) + x.shape) for x in xs]
    return np.concatenate(xs, axis)


def _split(x, sizes, axis):
    return np.split(x, np.cumsum(sizes)[:-1], axis)


def _grouped(A, Bs):
    """(A @ B for B in Bs), as the one product A [B_1 ... B_k], split back into views."""
    return _split(A @ _cat(Bs, -1), [B.shape[-1] for B in Bs], -1)


def _grouped_rows(As, B):
    """(A @ B for A in As), as the one product [A_1; ...; A_k] B, split back into views."""
    return _split(_cat(As, -2) @ B, [A.shape[-2] for A in As], -2)


def _grouped_total(A, Bs, nb):
    """(_matmul_total(A, B, nb) for B in Bs), as one product."""
    return _split(_matmul_total(A, _cat(Bs, -1), nb), [B.shape[-1] for B in Bs], -1)


def _grouped_total_rows(As, B, nb):
    """(_matmul_total(A, B, nb) for A in As), as one product."""
    return _split(_matmul_total(_cat(As, -2), B, nb), [A.shape[-2] for A in As], -2)


def _sum_of_products(As, Bs):
    """A_1 @ B_1 + ... + A_k @ B_k as the one product [A_1 ... A_k] [B_1; ...; B_k]."""
    return _cat(As, -1) @ _cat(Bs, -2)

def _full(shape, value, nb, dtype):
    if isinstance(value, np.ndarray):  # a per-example scalar: (batch, 1, 1)
        return np.full(shape, value.sum(), dtype=dtype)
    return np.full(shape, value * (nb or 1), dtype=dtype)


def _copy(x):
    return x.copy()


_PIECE_BYTES = 96 * 1024  # below glibc's threshold for fresh pages (128 KiB), and in the L2 cache


def _piece(nb, example_size, dtype):
    """How many examples of a batch of nb to compute at a time (0: all of them at once)."""
    per = max(1, _PIECE_BYTES // (example_size * np.dtype(dtype).itemsize))
    return per if nb > per else 0


def _in_pieces(sweep, values, names, n):
    """sweep(values) a piece of n examples at a time, the results summed (gradients, and a loss)."""
    batch = np.shape(values[next(name for name in names if np.ndim(values[name]) == 3)])[0]
    total = None
    for start in range(0, batch, n):
        piece = dict(values)
        for name in names:
            if np.ndim(values[name]) == 3:
                piece[name] = np.asarray(values[name])[start:start + n]
        got = sweep(piece)
        if total is None:
            total = got
        elif isinstance(total, tuple):  # (gradients, loss)
            for key in total[0]:
                total[0][key] += got[0][key]
            total = (total[0], total[1] + got[1])
        else:
            for key in total:
                total[key] += got[key]
    return total


def _half_sq(E, nb):
    """1/2 ||E||^2, summed over the batch."""
    s = 0.5 * float(np.vdot(E, E))
    return s * nb if nb and E.ndim == 2 else s


def _loss_total(L, nb):
    """A scalar loss L summed over the batch: per example it is a (batch, 1, 1) array; a loss that
    no example changes counts once per example."""
    if isinstance(L, np.ndarray) and L.ndim == 3:
        return float(L.sum())
    return float(np.asarray(L).reshape(())) * (nb or 1)


# ---- ids: copied only into the modules of programs with onehot constants (targets.runtime) ----


def _ids(values, name, rows, vocab):
    """values[name] as ids: integers in [0, vocab), shape (rows,) or (batch, rows) (rows None: any)."""
    x = np.asarray(values[name])
    declared = "%s is declared onehot: its value is its ids, integers in [0, %d), shape (rows,) or (batch, rows)" % (
        name, vocab)
    if x.ndim >= 2 and x.shape[-1] == vocab and x.dtype.kind not in "iu":
        raise ValueError("%s is a matrix of shape %s, where ids are declared (%s)" % (name, x.shape, declared))
    if x.dtype.kind not in "iu":
        raise ValueError("%s holds %s, not integer ids (%s)" % (name, x.dtype, declared))
    if x.ndim not in (1, 2) or (rows is not None and x.shape[-1] != rows):
        raise ValueError("%s has shape %s, not (%s,) or (batch, %s) (%s)" % (name, x.shape, rows, rows, declared))
    bad = np.flatnonzero((x < 0) | (x >= vocab))
    if bad.size:
        at = tuple(int(i) for i in np.unravel_index(bad[0], x.shape))
        raise ValueError("%s has the id %d at %s, outside [0, %d)" % (name, x.flat[bad[0]], at, vocab))
    return x


def _lookup(ids, A):
    """onehot(ids) @ A: the rows of A at the ids (an embedding lookup), per example for a batch."""
    if A.ndim == 2:
        return A[ids]
    if ids.ndim == 1:
        return A[:, ids]
    return A[np.arange(A.shape[0])[:, None], ids]


def _onehot(ids, vocab, dtype):
    """The one-hot matrix of the ids, (n, vocab) or (batch, n, vocab) in ``dtype``: for a use of a
    onehot constant that none of the helpers of ids computes (fdsl.codegen.onehot)."""
    out = np.zeros(ids.shape + (vocab,), dtype=dtype)
    np.put_along_axis(out, ids[..., None], 1, -1)
    return out


def _add_rows(ids, G, size):
    """The rows of G (m, cols) added at the rows ``ids`` (m,) of a (size, cols) array of zeros: the
    ids sorted, each run of equal ids summed by one reduceat (np.add.at, its plain spelling, took
    1.1 to 24 times as long at nanoGPT's and GPT-2's sizes: bench/scatter.py)."""
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1])))
    out = np.zeros((size, G.shape[-1]), dtype=G.dtype)
    out[s[starts]] = np.add.reduceat(G[order], starts, axis=0)
    return out


def _scatter(ids, G, vocab):
    """onehot(ids)^t @ G: the rows of G added at the ids into zeros (vocab, cols), per example for
    a batch (example b's ids offset by b vocab: one scatter)."""
    if ids.ndim == 1 and G.ndim == 2:
        return _add_rows(ids, G, vocab)
    nb = ids.shape[0] if ids.ndim == 2 else G.shape[0]
    ids = np.broadcast_to(ids, (nb, ids.shape[-1])) + vocab * np.arange(nb)[:, None]
    G = np.broadcast_to(G, (nb,) + G.shape[-2:])
    return _add_rows(ids.reshape(-1), G.reshape(-1, G.shape[-1]), nb * vocab).reshape(nb, vocab, G.shape[-1])


def _scatter_total(ids, G, vocab, nb):
    """_scatter summed over the batch (a gradient): every example's rows added into one (vocab,
    cols) array."""
    if not nb:
        return _scatter(ids, G, vocab)
    ids = np.broadcast_to(ids, (nb, ids.shape[-1])).reshape(-1)
    G = np.broadcast_to(G, (nb,) + G.shape[-2:]).reshape(-1, G.shape[-1])
    return _add_rows(ids, G, vocab)


def _pick_sum(ids, A):
    """trace(onehot(ids)^t A): the sum of A's entries at the ids, row by row (as _trace: a number,
    or a (batch, 1, 1) array)."""
    n = ids.shape[-1]
    if ids.ndim == 1 and A.ndim == 2:
        return float(A[np.arange(n), ids].sum())
    nb = ids.shape[0] if ids.ndim == 2 else A.shape[0]
    A = np.broadcast_to(A, (nb,) + A.shape[-2:])
    ids = np.broadcast_to(ids, (nb, n))
    return A[np.arange(nb)[:, None], np.arange(n), ids].sum(axis=-1)[:, None, None]


def _aa_ids(S, ids):
    """aa(A, onehot(ids)) from S = a(A): S o (onehot(ids) - p 1^t), p the entries of S at the ids
    (-p S, with p (1 - p) at the ids), per example for a batch."""
    if ids.ndim == 2 and S.ndim == 2:
        S = np.broadcast_to(S, (ids.shape[0],) + S.shape)
    index = np.broadcast_to(ids[..., None], S.shape[:-1] + (1,))
    p = np.take_along_axis(S, index, -1)
    out = -p * S
    np.put_along_axis(out, index, p * (1 - p), -1)
    return out


def _add_ids(P, ids, sign):
    """P + sign onehot(ids), written into P (an array of the sum's own; one without the batch
    axis of the ids, or of the sign, a number of each example (batch, 1, 1), is copied per
    example first)."""
    n = ids.shape[-1]
    if np.ndim(sign) == 3:  # (batch, 1, 1): one number an example, against its (batch, n) entries
        sign = np.reshape(sign, (-1, 1))
        nb = sign.shape[0]
    else:  # one number (a float, or a 1 x 1 array)
        sign = float(np.reshape(sign, ()))
        nb = ids.shape[0] if ids.ndim == 2 else None
    if nb is not None and P.ndim == 2:
        P = np.repeat(P[None], nb, axis=0)
    if P.ndim == 2:
        P[np.arange(n), ids] += sign
    elif ids.ndim == 1:
        P[:, np.arange(n), ids] += sign
    else:
        P[np.arange(P.shape[0])[:, None], np.arange(n), ids] += sign
    return P


def _in_pieces_ids(sweep, values, names, n, ids):
    """_in_pieces where the inputs ``ids`` carry their batch as the first of two axes: cut as
    (batch, rows, 1), handed to the sweep as (batch, rows) again."""
    def sweep_ids(piece):
        return sweep({k: v[..., 0] if k in ids and np.ndim(v) == 3 else v for k, v in piece.items()})

    return _in_pieces(sweep_ids, {k: np.asarray(v)[..., None] if k in ids and np.ndim(v) == 2 else v
                                  for k, v in values.items()}, names, n)
