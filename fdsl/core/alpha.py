"""Renaming: terms that are the same up to the names of their leaves, so that a rewrite done once
serves them all.

Vocabulary
----------
atom         a leaf that rules cannot see into: a declared symbol (``Q_3``, ``X``, ``s``), and a
             named intermediate (``let``) whose body no rule of the ruleset reads. Rules cannot
             name a symbol (a name in a rule is refused), so they see an atom only through its
             properties: its shape, whether it is a scalar, holds a weight or a differential, is a
             symbol or a let, and a symbol's kind and value.
placeholder  an atom with the same properties as another and a name of its own: the k-th atom met
             (pre-order, left to right) becomes ``#k``. A placeholder let's body is a placeholder
             symbol with the let's properties.
canonical    a term with each atom replaced by its placeholder. Two terms with the same canonical
             form differ only by a renaming of atoms, and rewriting commutes with renaming: the
             constructors and the matcher read operators, shapes, numbers and the properties
             above, never a name (only the strategy ``order`` sorts by name, and it is not a
             ruleset). So the normal form of one is the normal form of the other, renamed back.

The layers of a deep encoder or the blocks of a GPT are such terms: ``trace(G_6 d(F(X_5)))`` and
``trace(G_5 d(F(X_4)))`` have one canonical form, so ``backprop`` rewrites a layer once and renames
the result for the others (``fdsl.rewrite.engine.normalize``). Each function here is one pass over the
shared graph, not descending into let bodies, without recursion.
"""

from __future__ import annotations

from . import terms as T
from .terms import Symbol, Term


def _props(t: Term) -> tuple:
    return (t.op, t.shape, t.scalar, t.has_d, t.has_weight)


def _placeholder(t: Term, k: int, lets: bool):
    """The placeholder of atom ``t``, or None where ``t`` stays as it is."""
    if t.op == "sym":
        s, shape = t.data
        p = T.sym(Symbol("#%d" % k, (), s.kind, s.value, s.scalar, s.onehot), shape)
    elif t.op == "let" and lets and not t.has_d:
        body = t.args[0]
        inner = T.sym(Symbol("#%d" % k, (), "weight" if t.has_weight else "const", None, body.scalar),
                      body.shape)
        p = T.let("#", (k,), inner)
    else:
        return None
    # the renaming is sound only if no rule can tell the two apart
    return p if _props(p) == _props(t) else None


def canonical(root: Term, lets: bool) -> tuple:
    """(the canonical form of ``root``, {placeholder: atom}): the renaming back. ``lets``: whether
    lets are atoms (no rule of the ruleset reads a let's body)."""
    forward: dict = {}
    seen = set()
    stack = [root]
    while stack:  # pre-order, left to right: the k-th atom met is #k in every term of this shape
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if t.op == "sym" or t.op == "let":
            p = _placeholder(t, len(forward) + 1, lets)
            if p is not None:
                forward[t] = p
            continue
        stack.extend(reversed(t.args))
    if not forward:
        return root, {}
    return rename(root, forward), {p: a for a, p in forward.items()}


def rename(root: Term, mapping: dict) -> Term:
    """``root`` with each atom that is a key of ``mapping`` replaced by its value (let bodies are
    not entered: an atom is replaced whole). Unlike ``rewrite.substitute`` it does not rebuild
    through the constructors: a renamed node is interned as it is (``T.renamed``)."""
    out: dict = {}
    stack = [root]
    while stack:
        t = stack[-1]
        if t in out:
            stack.pop()
            continue
        m = mapping.get(t)
        if m is not None or not t.args or t.op == "let":
            out[t] = t if m is None else m
            stack.pop()
            continue
        pending = [c for c in t.args if c not in out]
        if pending:
            stack.extend(pending)
            continue
        args = tuple([out[c] for c in t.args])
        out[t] = t if args == t.args else T.renamed(t, args)
        stack.pop()
    return out[root]
