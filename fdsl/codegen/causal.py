"""Causal attention's triangular products: the blocks a causal mask makes zero are not multiplied.

Vocabulary
----------
causal mask  a constant declared ``= causal`` (0 on and below the diagonal, -inf above: the
             ``const`` op of make ``causal``).
masked       ``S + M`` (``add_into(S, M)``, or a ``sum`` of the two), the scores with a causal mask
             added: -inf above the diagonal.
lower        a value zero above its diagonal: the softmax of masked scores (the probabilities P,
             exactly 0 there), and ``aa_given(P, G)`` of a lower P (their adjoint dS, P o (...)).
kinds        how a stacked product (``matmul``, ``bmm``) reads the structure (``attrs causal``):
             ``L``: its left operand is lower (P V, dS K); ``U``: its left operand is the
             transpose of a lower one (P^t dO, dS^t Q); ``out``: only its blocks on and below the
             diagonal are read, by the mask added to it (the scores q k^t) or by ``aa_given`` of a
             lower P (dP = dO V^t, read where P is not zero), and the others are made zeros, not
             products (finite: the mask's -inf, and P's 0, then give what they gave).

The runtime's ``_bmm_causal`` multiplies in blocks of rows (torch_runtime), which for a context of
n = 4 blocks does 5/8 of the work of the whole product: the six products of an attention's
forward and backward, a quarter to a third of their time, as flash attention skips the masked
blocks.

causal softmax  ``softmax(s q k^t + M)`` as one op (``causal_softmax``), the scores' product, the
             mask and the softmax fused: the runtime's ``_causal_softmax`` makes each block of
             rows up to its diagonal, scaled as multiplied (the product's alpha), masked and
             normalised while it is in cache, and writes the zeros after it, where the whole
             spelling wrote the scores, zeros, the scores plus the mask and their softmax, each
             over the whole n x n stack (within the noise of a shakespeare_char step once the
             heap is kept: the fill, the mask's add and 3/8 of the softmax are small there).

Torch target only (the stacks of heads are made only there); run after the kernels' passes, which
make the mask's ``add_into``.
"""

from __future__ import annotations

from .ir import Op, Read, Sweep


def _bare(r) -> bool:
    return isinstance(r, Read) and not r.t and not r.scale


def _square(v) -> bool:
    return v.shape is not None and len(v.shape) == 2 and v.shape[0] == v.shape[1]


def _masking(op: Op, masks: set):
    """The scores S where ``op`` is S + M, M a causal mask (``add_into(S, M)``, or a sum of the
    two, either first), both read as they are; else None."""
    if op.kind == "add_into" or (op.kind == "sum" and tuple(op.attrs.get("signs", ())) == (1, 1)
                                 and op.attrs.get("head", 2) == 2):
        if len(op.args) == 2 and all(_bare(a) for a in op.args):
            a, b = op.args
            if b.value in masks and a.value not in masks:
                return a.value
            if op.kind == "sum" and a.value in masks and b.value not in masks:
                return b.value
    return None


def causal_products(sweep: Sweep, kept: set, masks: set) -> None:
    """Mark the stacked products that a causal mask (``masks``: the causal constants' values)
    makes triangular (module doc), for the writer to spell ``_bmm_causal``. One walk over the
    sweep; an attribute changes, the indexes hold."""
    masked, lower = set(), set()
    for op in sweep.ops:
        if _masking(op, masks) is not None:
            masked.add(op.out)
        elif op.kind == "softmax" and _bare(op.args[0]) and op.args[0].value in masked and _square(op.out):
            lower.add(op.out)
        elif op.kind == "aa_given" and _bare(op.args[0]) and op.args[0].value in lower and _square(op.out):
            lower.add(op.out)
    if not lower:
        return
    for op in sweep.ops:
        if op.kind != "matmul" or not op.attrs.get("bmm") or op.attrs.get("total") or len(op.args) != 2:
            continue
        left = op.args[0]
        if isinstance(left, Read) and left.value in lower:
            op.attrs["causal"] = "U" if left.t else "L"
        elif _only_lower_read(sweep, op, kept, masks, lower):
            op.attrs["causal"] = "out"
    _fused_softmaxes(sweep, kept, masks)


def _fused_softmaxes(sweep: Sweep, kept: set, masks: set) -> None:
    """Each chain ``S = q k^t`` (marked "out"), ``S + M``, ``softmax`` whose two intermediate
    values nothing else reads, as one ``causal_softmax`` where the product was (its operands
    are read there already; the probabilities are then made there)."""
    mapping = {}
    for op in list(sweep.ops):
        if op.kind != "matmul" or op.attrs.get("causal") != "out" or op.attrs.get("unsqueeze"):
            continue  # (unsqueeze: reads the product's op spells with a head axis, kept as they are)
        users = sweep.users(op.out)
        if len(users) != 1 or _masking(users[0], masks) is not op.out:
            continue
        masking = users[0]
        readers = sweep.users(masking.out)
        if masking.out in kept or len(readers) != 1 or readers[0].kind != "softmax" \
                or readers[0].args[0] != Read(masking.out):
            continue
        soft = readers[0]
        mask = next(a for a in masking.args if a.value is not op.out)
        mapping[op] = [Op("causal_softmax", [soft.out], [op.args[0], op.args[1], mask])]
        mapping[masking] = []
        mapping[soft] = []
    if mapping:
        sweep.rewrite(mapping)


def _only_lower_read(sweep: Sweep, op: Op, kept: set, masks: set, lower: set) -> bool:
    """Whether only the blocks on and below the diagonal of ``op``'s product are read: its one
    reader adds a causal mask to it, or is ``aa_given`` of a lower value with it."""
    v = op.out
    users = list(sweep.readers.get(v, ()))
    if v in kept or len(users) != 1 or not _square(v) or op.attrs.get("out_scale"):
        return False
    user = users[0]
    if user.kind in ("add_into", "sum"):
        return _masking(user, masks) is v
    if user.kind == "aa_given":
        return _bare(user.args[0]) and user.args[0].value in lower and _bare(user.args[1]) \
            and user.args[1].value is v
    return False
