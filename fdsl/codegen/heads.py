"""The heads of an attention side by side: stacks of heads read as one matrix, without unstacking.

Vocabulary
----------
stack        a variable holding h heads' matrices along a head axis before the last two, shape
             ``(..., h, rows, cols)``: what ``fusion.stacked_heads`` makes of h alike chains.
element      a variable that is one head of a stack (``a, b, c, d = X_h.unbind(-3)``), or such a
             head times a number (``a_s = 0.288 * a``): (stack, head, scale).
side by side the heads of one or more stacks as the columns of one matrix, ``(..., rows, h cols)``
             per stack and the stacks one after the other (``_side_by_side``): the one copy that
             autograd's multi-head attention makes too (its ``transpose(1, 2).reshape``).
kinds        the products of the forward's grouped Q, K, V product (``_grouped``) that are
             stacked head by head: read as views of the one product (``_grouped_heads``).

After ``stacked_heads`` the heads are computed on stacks, but the statements around them still
read them one by one: the grouped product of Q, K and V is split into 3 h matrices and stacked
again (3 copies), and the weights' gradients and the adjoint of the attention's input concatenate
the 3 h heads (``_grouped_total``, ``_sum_of_products``: a copy each), scaled one by one. Here the
first becomes one product whose kinds are views, and the others read one side-by-side matrix of
the (scaled) stacks, made once and shared: as the per-head operands commute in a sum of products,
its pairs are reordered to the matrix's columns, and the results of a grouped product are its
targets in that order. Torch target only (stacks are made only there).
"""

from __future__ import annotations

import re
from typing import Optional

from .fusion import Stmt, index, targets

_UNBIND = re.compile(r"(\w+(?:, \w+)+) = (\w+)\.unbind\(-3\)\Z")
_SCALE = re.compile(r"(\w+) = (-?[\d.]+(?:e-?\d+)?) \* (\w+)\Z")
_STACK = re.compile(r"(\w+) = torch\.stack\(\(([\w, ]+),?\), -3\)\Z")
_GROUPED = re.compile(r"([\w, ]+) = _grouped\((\S+), \(([\w., ]+),?\)\)\Z")
_TOTAL = re.compile(r"([\w, ]+) = _grouped_total\((\S+), \(([\w, ]+),?\), _nb\)\Z")
_TOTAL_ROWS = re.compile(r"([\w, ]+) = _grouped_total_rows\(\(([\w., ]+),?\), (\S+), _nb\)\Z")
_SUM = re.compile(r"(\w+) = _sum_of_products\(\(([\w., ]+),?\), \(([\w., ]+),?\)\)\Z")


def _list(text: str) -> list:
    return [x.strip() for x in text.split(",") if x.strip()]


def _width(shapes: dict, x: str):
    """The number of columns of the matrix ``x`` (a variable or its ``.mT``), or None if unknown."""
    flip = x.endswith(".mT")
    shape = shapes.get(x[:-3] if flip else x)
    return None if shape is None else shape[0 if flip else 1]


def _alike(widths) -> bool:
    """All known and the same (the same dim, or the same number): the pieces split evenly."""
    return None not in widths and len(set(widths)) == 1


def grouped_kinds(body: list, shapes: dict) -> list:
    """``a_1, ..., a_3h = _grouped(A, (B_1, ..., B_3h))`` whose results are read only by stacks
    of h heads, ``q_h = torch.stack((a_1, a_4, ...), -3)``, becomes ``q_h, k_h, v_h =
    _grouped_heads(A, (the B of q_h's heads, then k_h's, v_h's), h)``: the stacks are views of the
    one product, not copies of its slices. ``shapes``: variable -> (rows, cols); operands of
    widths not known to be equal are left as they are (the views cut the product evenly)."""
    _, reads = index(body)
    stacks = {}
    for i, st in enumerate(body):
        m = _STACK.match(st.code)
        if m:
            stacks[i] = (m.group(1), _list(m.group(2)))
    drop, replace = set(), {}
    for i, st in enumerate(body):
        m = _GROUPED.match(st.code)
        if not m:
            continue
        outs, operand, bs = _list(m.group(1)), m.group(2), _list(m.group(3))
        readers = {j for v in outs for j in reads.get(v, ())}
        if not readers or not all(j in stacks for j in readers) or len(outs) != len(bs):
            continue
        kinds = [stacks[j] for j in sorted(readers)]
        h = len(kinds[0][1])
        members = [v for _, heads in kinds for v in heads]
        if any(len(heads) != h for _, heads in kinds) or sorted(members) != sorted(outs) or len(set(outs)) != len(outs):
            continue
        if any(reads.get(v) != [j] for j in readers for v in stacks[j][1]) or not _alike(
                [_width(shapes, b) for b in bs]):
            continue
        where = {v: k for k, v in enumerate(outs)}
        order = [bs[where[v]] for v in members]
        names = [name for name, _ in kinds]
        code = "%s = _grouped_heads(%s, (%s,), %d)%s" % (", ".join(names), operand, ", ".join(order), h,
                                                          "" if len(names) > 1 else "[0]")
        replace[i] = Stmt(names[0], code, st.uses)
        drop |= readers
    if not replace:
        return body
    return [replace.get(i, st) for i, st in enumerate(body) if i not in drop]


def side_by_side(body: list, kept: set, shapes: dict) -> list:
    """Grouped products and sums of products over the heads of stacks (see the module doc) read one
    side-by-side matrix of the stacks instead of their heads one by one. ``kept``: variables read
    after the body (never removed); ``shapes``: variable -> (rows, cols): only heads of widths
    known to be equal are put side by side (the matrix is cut evenly again)."""
    heads: dict = {}  # element -> (stack, head index, number of heads)
    for st in body:
        m = _UNBIND.match(st.code)
        if m:
            names = _list(m.group(1))
            if not _alike([_width(shapes, v) for v in names]):
                continue
            for k, v in enumerate(names):
                heads[v] = (m.group(2), k, len(names))
    if not heads:
        return body
    scaled: dict = {}  # element -> (stack, head, h, scale)
    for st in body:
        m = _SCALE.match(st.code)
        if m and m.group(3) in heads:
            scaled[m.group(1)] = heads[m.group(3)] + (m.group(2),)
    widths = {s: _width(shapes, v) for v, (s, _, _) in heads.items()}  # stack -> its heads' width
    elements = {v: (s, k, h, None) for v, (s, k, h) in heads.items()}
    elements.update(scaled)

    def columns(operands, transposed=False) -> Optional[list]:
        """The (stack, scale) groups of ``operands`` in a canonical order, each complete, and the
        operands' positions in that order; None unless every operand is an element."""
        found = []
        for x in operands:
            if transposed:
                if not x.endswith(".mT"):
                    return None
                x = x[:-3]
            if x not in elements:
                return None
            found.append(elements[x])
        groups = sorted({(s, h, c or "") for s, _, h, c in found})
        slots = {}
        offset = 0
        for s, h, c in groups:
            for k in range(h):
                slots[(s, k, c)] = offset + k
            offset += h
        where = [slots[(s, k, c or "")] for s, k, h, c in found]
        if sorted(where) != list(range(offset)) or not _alike([widths[s] for s, _, _ in groups]):
            return None
        return [groups, where]

    made: dict = {}  # groups -> the variable of their side-by-side matrix
    scaled_stacks: dict = {}
    taken = {t for st in body for t in targets(st)} | {u for st in body for u in st.uses}

    def fresh(base: str) -> str:
        name = base
        while name in taken:
            name += "_"
        taken.add(name)
        return name

    out: list = []

    def wide(groups) -> str:
        key = tuple(groups)
        if key in made:
            return made[key]
        parts = []
        for s, h, c in groups:
            if c:
                if (s, c) not in scaled_stacks:
                    v = scaled_stacks[(s, c)] = fresh(s + "s")
                    out.append(Stmt(v, "%s = %s * %s" % (v, c, s), (s,)))
                parts.append(scaled_stacks[(s, c)])
            else:
                parts.append(s)
        v = made[key] = fresh(parts[0] + "_w")
        out.append(Stmt(v, "%s = _side_by_side((%s,))" % (v, ", ".join(parts)), tuple(parts)))
        return v

    def in_order(items, where) -> list:
        ordered = [None] * len(items)
        for x, k in zip(items, where):
            ordered[k] = x
        return ordered

    for st in body:
        new = None
        total, rows, summed = _TOTAL.match(st.code), _TOTAL_ROWS.match(st.code), _SUM.match(st.code)
        if total or rows:  # a weight's gradients: the matrix's columns (rows: its transpose's rows)
            outs, operand, xs = ((_list(total.group(1)), total.group(2), _list(total.group(3))) if total else
                                 (_list(rows.group(1)), rows.group(3), _list(rows.group(2))))
            found = columns(xs, transposed=bool(rows)) if len(outs) == len(xs) else None
            if found:
                ordered, w = in_order(outs, found[1]), wide(found[0])
                args = (operand, w, -1) if total else (w + ".mT", operand, -2)
                new = Stmt(ordered[0], "%s = _split_total(%s, %s, _nb, %d, %d)"
                           % (", ".join(ordered), args[0], args[1], len(outs), args[2]), (w, operand.split(".")[0]))
        elif summed:  # an adjoint: the pairs, which commute, in the matrix's order
            xs, ys = _list(summed.group(2)), _list(summed.group(3))
            found = columns(xs) if len(xs) == len(ys) else None
            if found:
                ordered, w = in_order(ys, found[1]), wide(found[0])
                new = Stmt(st.target, "%s = %s @ _cat((%s,), -2)" % (st.target, w, ", ".join(ordered)),
                           (w,) + tuple(dict.fromkeys(y.split(".")[0] for y in ordered)))
        out.append(new or st)
    # heads and scaled heads that nothing reads now are not made
    while True:
        read = {u for st in out for u in st.uses} | set(kept)
        dead = [k for k, st in enumerate(out) if (_UNBIND.match(st.code) or (_SCALE.match(st.code)
                and st.target in scaled)) and not read & set(targets(st))]
        if not dead:
            return out
        out = [st for k, st in enumerate(out) if k not in set(dead)]

