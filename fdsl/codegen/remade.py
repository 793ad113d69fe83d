"""Values a traced graph makes again where the backward reads them, rather than keeping them.

Vocabulary
----------
forward    the ops of the sweep up to the one that makes the loss; the backward is the ops after it.
remade     a value V = f(U...) that the forward reads and the backward reads again, where its
           operands U are still read, f either an elementwise operator of one operand (``gelu``,
           ``m``, ``exp``, ``tanh``, a rule file's elementwise operator: a ``template`` whose
           operator the table marks ``elementwise``) or a causal attention's softmax
           (``causal_softmax`` of its query and key stacks; the mask is a constant). The
           backward's reads of V become reads of ``remade(V, U...)`` (attr ``of``: f's op kind),
           made just before the first of them: under ``torch.compile`` that is f(U...) made again
           (inductor fuses an elementwise f into the kernel that reads it), so the traced graph
           frees V after the forward's last read of it; run eagerly it is V itself (a name for the
           same array: nothing is computed twice, and the memory is as before).

Why: between the forward's read of V and the backward's, every layer above keeps its own V. In
GPT's MLP, V is gelu(U) of (batch, context, 4 width): 36 MiB of nanoGPT's shakespeare_char at
batch 4 kept to the backward, where U is kept anyway (gelu's derivative reads it). Autograd's
traced graph does the same (AOTAutograd's partitioner recomputes the pointwise ops of the backward
rather than saving them); run eagerly, autograd keeps both, and so does fdsl. An attention's
probabilities P = softmax(s Q K^t + M) are as large (another 36 MiB there), and the backward
reads Q and K anyway (their weights' gradients): remade, P costs the scores' product and a
softmax a layer, as flash attention's backward makes P again from Q and K.

Torch only (the numpy target is not traced). One walk over the sweep and one rewrite: linear in it.
"""

from __future__ import annotations

from ..core.ops import OPS
from .ir import Op, Read, Sweep, Value, reread


def _operands(op: Op) -> list:
    """The values U... that ``op`` makes its value of, where it may be remade (module doc); else []."""
    if not op.args or not all(isinstance(a, Read) for a in op.args):
        return []
    if op.kind == "template" and len(op.args) == 1:
        spec = OPS.get(op.attrs.get("op"))
        return [op.args[0].value] if spec is not None and spec.elementwise else []
    if op.kind == "causal_softmax":  # (its third operand, the mask, is a constant: always kept)
        return [r.value for r in op.args[:2]]
    return []


def remade_in_backward(sweep: Sweep, loss: set, kept: set) -> None:
    """``sweep`` with the backward's reads of each remade value (module doc) made of ``remade``
    ops; ``loss``: the loss's values (none: no backward to tell, nothing changes); ``kept``: the
    values the return reads (never remade: the caller holds them)."""
    pos = sweep.positions()
    made = [pos[sweep.maker[v]] for v in loss if v in sweep.maker]
    if not made:
        return
    boundary = max(made)
    swaps: dict = {}  # V -> its remade value
    before: dict = {}  # the first backward reader -> the remade ops put before it
    for op in sweep.ops[:boundary]:
        us = _operands(op)
        if not us:
            continue
        v = op.out
        if v in kept or sweep.updater(v) is not None or any(sweep.updater(u) is not None for u in us):
            continue
        readers = sweep.users(v)
        late = sorted((r for r in readers if pos[r] > boundary), key=pos.get)
        if not late or len(late) == len(readers):  # (read by the backward alone: made where it is read)
            continue
        first = pos[late[0]]
        # each U must be read at or after the first backward read of V anyway (by the backward:
        # its derivative, its weight's gradient), or remaking V would keep U alive longer than V was
        if not all(u in kept or any(pos[r] >= first for r in sweep.users(u)) for u in us):
            continue
        w = Value(shape=v.shape, batched=v.batched, heads=v.heads, hint=v, suffix="_")
        swaps[v] = w
        before.setdefault(late[0], []).append(Op("remade", [w], [Read(v), *op.args], of=op.kind, **op.attrs))
    if not swaps:
        return
    rewritten = {}
    for v in swaps:
        for r in sweep.users(v):
            if pos[r] > boundary and r not in rewritten:
                rewritten[r] = [reread(r, swaps)]
    for first, ops in before.items():  # (a first backward reader reads its value: it is rewritten)
        rewritten[first] = ops + rewritten[first]
    sweep.rewrite(rewritten)

