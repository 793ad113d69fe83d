"""When the ops of a sweep run: each result as soon as what it reads is known.

Vocabulary
----------
result      an op whose values nothing in the sweep reads and the return does (``kept``): a
            weight's gradient (or a group of them), the loss.
early       a result moved up to just after the last op that makes any value it reads (through
            its reads, their scales, its scalar operands), keeping the order of the results among
            themselves. An op that updates a value in place (``add_into``) stays where it is: moved
            up, it could pass a read of the value it updates. The prologue (inputs, dims,
            constants) at the head of the sweep stays whole: a result goes after it.

A weight's gradient reads the activations of its layer and the layer's adjoint; computed at the
end of the sweep, as the lowering's order leaves it, it keeps those alive to the end, so the
sweep's memory is freed all at once, at the top of the heap, where the C allocator hands it back
to the system and the next call takes it again, page by page (thousands of page faults a training
step of the GPT). Computed as soon as the adjoint is known, as autograd does, its operands go
back to the allocator within the sweep and the next layer's arrays of the same size reuse them.

Both targets. One walk over the sweep and one reorder: linear in the sweep.
"""

from __future__ import annotations

from .ir import PROLOGUE, Sweep


def early_results(sweep: Sweep, kept: set) -> None:
    """``sweep`` with every result (see the module doc) moved early; ``kept``: the values the
    return reads (results are among them; a value read after the sweep by anything else is never
    moved past)."""
    pos = sweep.positions()
    start = -1  # the last op of the prologue at the head of the sweep
    while start + 1 < len(sweep.ops) and sweep.ops[start + 1].kind in PROLOGUE:
        start += 1
    after: dict = {}  # position -> the results placed right after the op there
    moved = set()
    for j, op in enumerate(sweep.ops):
        if op.kind in PROLOGUE or op.inplace() is not None:
            continue
        if any(sweep.readers.get(v) or v not in kept for v in op.outs):
            continue
        anchor = max((pos[m] for v in op.values_read() if (m := sweep.maker.get(v)) is not None), default=-1)
        anchor = max(anchor, start)
        if anchor < j - 1:
            after.setdefault(anchor, []).append(op)
            moved.add(op)
    if not moved:
        return
    out = list(after.get(-1, ()))
    for i, op in enumerate(sweep.ops):
        if op not in moved:
            out.append(op)
        out.extend(after.get(i, ()))
    sweep.reorder(out)
