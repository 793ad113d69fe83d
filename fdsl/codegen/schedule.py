"""When the statements of a sweep run: each result as soon as what it reads is known.

Vocabulary
----------
result      a statement whose targets nothing in the body reads: a weight's gradient (or a group
            of them), handed out by the return.
early       a result moved up to just after the last statement that assigns (or updates in
            place) any variable it reads, keeping the order of the results among themselves.

A weight's gradient reads the activations of its layer and the layer's adjoint; computed at the
end of the sweep, as the lowering's order leaves it, it keeps those alive to the end, so the
sweep's memory is freed all at once, at the top of the heap, where the C allocator hands it back
to the system and the next call takes it again, page by page (thousands of page faults a training
step of the GPT). Computed as soon as the adjoint is known, as autograd does, its operands go
back to the allocator within the sweep and the next layer's arrays of the same size reuse them.
"""

from __future__ import annotations

from .fusion import index, targets


def early_results(body: list, kept: set) -> list:
    """``body`` with every result (see the module doc) moved early; ``kept``: the variables the
    return reads (results are among them; a variable read after the body by anything else is
    never moved past)."""
    defs, reads = index(body)
    after: dict = {}  # index -> the results placed right after the statement at that index
    moved = set()
    for j, st in enumerate(body):
        outs = targets(st)
        if any(t in reads or t not in kept or len(defs.get(t, ())) != 1 for t in outs):
            continue
        if not st.code.startswith(", ".join(outs) + " = "):
            continue  # an update in place stays where it is
        anchor = max((i for u in st.uses for i in defs.get(u, ()) if i < j), default=-1)
        if anchor < j - 1:
            after.setdefault(anchor, []).append(st)
            moved.add(j)
    if not moved:
        return body
    out = list(after.get(-1, ()))
    for i, st in enumerate(body):
        if i not in moved:
            out.append(st)
        out.extend(after.get(i, ()))
    return out
