"""Families: weights the sweep concatenates, held by a generated Model as blocks of one tensor.

Vocabulary
----------
family    weights that an op of the sweep reads side by side, one concatenation of them: the
          heads' Q, K and V of a block in its grouped product (``grouped_heads``), their bias rows,
          the blocks of an output projection that a ``cat_matmul`` (``cat_addmm``) reads, the
          weights of any grouped product or sum of products. ``cols``: concatenated along the
          columns (each ``rows x c_i``, the same rows), ``rows``: along the rows. A weight read
          transposed in a concatenation along the columns is one along the rows of the weights
          themselves (and the other way round).
storage   how a Model holds a family: one tensor, each weight a parameter that is a view of its
          block. A ``rows`` family is ``(sum r_i, c)``, each weight rows of it (contiguous); a
          ``cols`` family is ``(sum c_i, rows)``, each weight the transpose of a block of rows
          (``storage[o:o + c_i].t()``: dense, strides ``(1, rows)``), as ``nn.Linear`` holds its
          weight; a weight of one row held 1-D (a bias) is a slice of a 1-D storage. The
          concatenation is then a view of the storage (torch_runtime's ``_cat``), in the forward
          and, transposed, in the adjoint, where each step would otherwise copy every weight;
          the weights' gradients come out of their grouped product in the same layout, and go to
          ``.grad`` without a copy.

Each weight is in one family at most: the first concatenation of the sweep that reads it (the
forward's) decides; a later one that reads a member otherwise (another order, another grouping)
copies, as it did. The families are found on the IR after the passes, so they are the
concatenations the writer spells.
"""

from __future__ import annotations

from .ir import Read, Sweep


def concatenated(op) -> list:
    """The (reads, axis) that ``op`` concatenates: axis -1 along the columns, -2 along the rows."""
    a, kind = op.args, op.kind
    if kind == "grouped_heads":
        if op.attrs.get("biased"):
            half = 1 + (len(a) - 1) // 2
            return [(a[1:half], -1), (a[half:], -1)]
        return [(a[1:], -1)]
    if kind == "grouped":
        return [(a[1:], -1)] if op.attrs["side"] == "cols" else [(a[:-1], -2)]
    if kind == "cat_matmul":
        return [(a[1:], -2)]
    if kind == "cat_addmm":
        return [(a[2:], -2)]
    if kind == "sum_of_products":
        n = op.attrs["n"]
        return [(a[:n], -1), (a[n:], -2)]
    return []


def families(sweep: Sweep, weights: dict) -> list:
    """The families of the sweep: ``(names, "cols" | "rows")`` in the order found, each of two
    weights or more. ``weights``: the input values of the weights -> their printed names."""
    found, taken = [], set()
    for op in sweep.ops:
        for reads, axis in concatenated(op):
            if len(reads) < 2 or not all(isinstance(r, Read) and not r.scale and r.value in weights for r in reads):
                continue
            flips = {r.t for r in reads}
            names = tuple(weights[r.value] for r in reads)
            if len(flips) != 1 or len(set(names)) != len(names) or taken.intersection(names):
                continue
            along_cols = (axis == -1) != flips.pop()
            found.append((names, "cols" if along_cols else "rows"))
            taken.update(names)
    return found
