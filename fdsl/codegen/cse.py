"""Ops the sweep makes twice, made once: common subexpressions of the IR, found by value.

Vocabulary
----------
same op    two ops of one kind with the same operands (the same reads: value, transpose, scale; the
           same scalars) and the same attributes: they make the same values. The lowering shares
           the terms that are equal as terms; two terms that differ only in how they were spelled
           can still lower to one computation: ``a(Z Q (Z K)^t)`` and ``a(Z Q K^t Z^t)`` multiply
           the same product (``Products._word`` writes the transpose out), whose softmax the
           lowering then makes twice, once for each term.
shared     the later of two same ops is dropped, and what read its values reads the earlier's.

Left alone: an op that updates a value in place, or whose value something updates in place (the
earlier value may be gone where the later is read), an op whose value the return reads (each result
is an array of its own), and an op of several values (views of one array). Ops are compared after
their operands are shared, so that a chain of same ops is shared whole in one walk.

One walk over the sweep with a dictionary of the ops seen, and one rewrite: linear in the sweep.
"""

from __future__ import annotations

from typing import Optional

from .ir import KINDS, PROLOGUE, Op, Sweep, reread


def _key(op: Op) -> Optional[tuple]:
    """The op as a dictionary key (kind, operands, attributes), or None where an attribute is not
    hashable (compared as different)."""
    try:
        attrs = tuple(sorted(op.attrs.items()))
        key = (op.kind, op.args, attrs)
        hash(key)
    except TypeError:
        return None
    return key


def shared_ops(sweep: Sweep, kept: set) -> None:
    """``sweep`` with each op that repeats an earlier same op (module doc) dropped, its readers
    reading the earlier op's value; ``kept``: the values the return reads."""
    seen: dict = {}
    to: dict = {}  # a dropped op's value -> the earlier op's value
    mapping: dict = {}
    for op in sweep.ops:
        new = reread(op, to)
        if new is not op:
            mapping[op] = [new]
        if op.kind in PROLOGUE or KINDS[op.kind].multi or op.inplace() is not None or len(op.outs) != 1:
            continue
        v = op.out
        if v in kept or sweep.updater(v) is not None:
            continue
        key = _key(new)
        if key is None:
            continue
        first = seen.get(key)
        if first is None:
            seen[key] = v
        else:
            to[v] = first
            mapping[op] = []
    if to:
        sweep.rewrite(mapping)

