"""Passes over the lowering's statements that do several of them as one, as autograd's kernels do.

Vocabulary
----------
statement   ``Stmt(target, code, uses)``: one line of the generated function, the variable it
            assigns (a group assigns several: ``a, b = ...``) and the variables it reads.
product     a statement that is one matrix product, ``v = L @ R``, or one summed over the batch
            of the data, ``v = _matmul_total(L, R, _nb)`` (a weight's gradient); L and R are a
            variable, its transpose ``x.mT``, or a scaled one in brackets.
group       products that share an operand, done as one product: ``Z Q_0, ..., Z V_3`` as
            ``Z [Q_0 ... V_3]`` (``_grouped``: the other operands side by side, the result split
            back into views), ``A_1 G, A_2 G`` as ``[A_1; A_2] G`` (``_grouped_rows``), and the same
            for products summed over the batch (``_grouped_total``, ``_grouped_total_rows``).
sum of      an adjoint accumulated from products, ``G = A_1 R_1 + A_2 R_2 + ...`` (the heads'
products    ``G_0 Q_0^t + G_1 Q_1^t + ...``), as the one product ``[A_1 ... A_k] [R_1; ...; R_k]``
            (``_sum_of_products``).

Each pass keeps the meaning of the function: a statement moves only to where every variable it
reads has its value and before anything reads what it assigns; a variable updated in place
(``G += ...``) between the two places keeps the statement where it was. The helpers named here
are in the runtimes (``targets._NUMPY_HELPERS``, ``torch_runtime``).
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional

from ..core import terms as T


class Stmt(NamedTuple):
    target: Optional[str]
    code: str
    uses: tuple  # the variables read, for deleting them after their last use


_OPERAND = r"(\([^()]*\)(?:\.mT)?|[\w.]+)"  # a variable (a view of one), a scaled one in brackets (or its view)
_PRODUCT = re.compile(r"(\w+) = %s @ %s\Z" % (_OPERAND, _OPERAND))
_TOTAL = re.compile(r"(\w+) = _matmul_total\(%s, %s, _nb\)\Z" % (_OPERAND, _OPERAND))
_SUM_HEAD = re.compile(r"(\w+) = ([\w.]+) ([+-]) ([\w.]+)\Z")
_SUM_MORE = re.compile(r"(\w+) ([+-])= ([\w.]+)\Z")


def transposed(expr: str) -> str:
    """The code of the transpose of the matrix ``expr`` (a variable, its ``.mT`` view, or a
    bracketed expression)."""
    if expr.endswith(".mT") and (expr[:-3].isidentifier() or re.fullmatch(r"\([^()]*\)", expr[:-3])):
        return expr[:-3]
    return expr + ".mT" if expr.isidentifier() or expr.startswith("(") and expr.endswith(")") else "(%s).mT" % expr


def unlet(order: list) -> dict:
    """Node -> the same node with every ``let`` replaced by its body, for ``order`` (children
    first, as ``lowering.nodes`` gives them). Rebuilt as they are (``T.renamed``: no law of the
    constructors applies again), so a subterm that appears both named and inline becomes one."""
    plain: dict = {}
    for n in order:
        if n.op == "let":
            plain[n] = plain[n.args[0]]
        elif n.op == "add" and any(a.op == "let" and plain[a].op == "add" for a in n.args):
            # a residual stream: the run net_{L-1} of a flat sum was named; spliced back, the sum
            # is the flat one the forward computes (X E + P + heads, not (X E + P) + heads)
            args: list = []
            for a in n.args:
                args.extend(plain[a].args if a.op == "let" and plain[a].op == "add" else (plain[a],))
            plain[n] = T.renamed(n, tuple(args))
        elif n.args:
            plain[n] = T.renamed(n, tuple(plain[a] for a in n.args))
        else:
            plain[n] = n
    return plain


def _bag(terms) -> frozenset:
    """The multiset of ``terms`` (a sum's summands in any order)."""
    counts: dict = {}
    for t in terms:
        counts[t] = counts.get(t, 0) + 1
    return frozenset(counts.items())


def factored(order: list) -> dict:
    """Node -> the same node with every sum of products that share an end factor F, ``F R_1 + ...
    + F R_k``, written ``F (R_1 + ... + R_k)`` where that sum of the rests is itself a node of
    ``order`` (children first), so computed anyway: the gradient of W1 in an MLP after a layer
    norm, ``S^t A + S^t C b``, is ``S^t (A + C b)`` with ``A + C b`` the forward's layer norm. One
    product instead of k (summed over a batch: one product with the examples side by side), and
    no sum of products. A sum whose products share nothing such stays as it is."""
    sums = {_bag(n.args): n for n in order if n.op == "add" and not n.scalar}
    products = {n.args: n for n in order if n.op == "mul" and not n.scalar}
    out: dict = {}
    for n in order:
        args = tuple(out[a] for a in n.args)
        new = T.renamed(n, args) if args != n.args else n
        if new.op == "add" and not new.scalar and len(new.args) > 1:
            new = _factor_sum(new, sums, products)
        out[n] = new
    return out


def _factor_sum(s, sums: dict, products: dict):
    for end in (0, -1):  # a shared left factor, then a shared right one
        groups: dict = {}
        for x in s.args:
            if x.op == "mul" and not any(f.scalar for f in x.args):
                groups.setdefault(x.args[end], []).append(x)
        for shared, members in groups.items():
            if len(members) < 2:
                continue
            rests = []
            for m in members:
                rest = m.args[1:] if end == 0 else m.args[:-1]
                rests.append(rest[0] if len(rest) == 1 else products.get(rest))
            whole = sums.get(_bag(rests)) if None not in rests else None
            if whole is None:
                continue
            product = T.mul(shared, whole) if end == 0 else T.mul(whole, shared)
            kept = [x for x in s.args if not any(x is m for m in members)]
            return T.add(*kept, product) if kept else product
    return s


def targets(st) -> tuple:
    """The variables a statement assigns: its target, or every one of a group's (``a, b = ...``)."""
    head = st.code.split(" = ", 1)[0]
    if ", " in head and re.fullmatch(r"\w+(, \w+)+", head):
        return tuple(head.split(", "))
    return (st.target,)


def product_parts(code: str):
    """(target, "mm" or "total", left, right) of a statement that is one matrix product (summed
    over the batch: "total"), else None."""
    m = _PRODUCT.match(code)
    if m is not None:
        return m.group(1), "mm", m.group(2), m.group(3)
    m = _TOTAL.match(code)
    if m is not None:
        return m.group(1), "total", m.group(2), m.group(3)
    return None


def index(body):
    """(variable -> the statements that assign it, variable -> the statements that read it)."""
    writes: dict = {}
    reads: dict = {}
    for i, st in enumerate(body):
        for target in targets(st):
            writes.setdefault(target, []).append(i)
        for u in st.uses:
            reads.setdefault(u, []).append(i)
    return writes, reads


def _unchanged(writes, names, lo, hi, own=()) -> bool:
    """No statement in [lo, hi) but those of ``own`` assigns any of ``names``."""
    return not any(lo <= w < hi and w not in own for u in names for w in writes.get(u, ()))


# ---- a gradient summed over the batch inside its product ------------------------------------------


def summed_product(body: list, var: str) -> bool:
    """Sum a gradient over the batch inside its last product: ``G = A @ B``, read by nothing but
    the return, becomes ``_matmul_total(A, B, _nb)``, which for a batch is the one product
    ``[A_1 ... A_b] [B_1; ...; B_b]`` (the examples side by side along the inner axis, as
    autograd's weight gradients are) instead of b products and a sum. False: left as it is."""
    defining = [i for i, st in enumerate(body) if st.target == var]
    if len(defining) != 1 or any(var in st.uses for st in body if st.target != var):
        return False
    i = defining[0]
    parts = product_parts(body[i].code)
    if parts is None or parts[1] != "mm":
        return False
    body[i] = body[i]._replace(code="%s = _matmul_total(%s, %s, _nb)" % (var, parts[2], parts[3]))
    return True


_REDUCTION = re.compile(r"(\w+) = ([\w.]+)\.sum\((dim|axis)=(-[12]), (keepdims?)=True\)((?:\.mT)?)\Z")


def summed_reduction(body: list, var: str) -> bool:
    """Sum a gradient that is a sum along an axis (a bias's, a gain's: ``G = A.sum(dim=-1,
    keepdim=True)``), read by nothing but the return, over the batch in the same reduction:
    ``_sum_total(A, -1, _nb)``, one reduction over the batch and the axis instead of two. False:
    left as it is."""
    defining = [i for i, st in enumerate(body) if var in targets(st)]
    if len(defining) != 1 or any(var in st.uses for st in body if var not in targets(st)):
        return False
    i = defining[0]
    m = _REDUCTION.match(body[i].code)
    if m is None or m.group(1) != var:
        return False
    body[i] = body[i]._replace(code="%s = _sum_total(%s, %s, _nb)%s" % (var, m.group(2), m.group(4), m.group(6)))
    return True


# ---- products that share an operand ---------------------------------------------------------------


def group_products(body: list) -> list:
    """Products that share an operand done as one (see the module doc), largest groups first, one
    at a time, until no two can be."""
    while True:
        found: dict = {}
        for i, st in enumerate(body):
            got = product_parts(st.code)
            if got is not None and got[0] == st.target:
                _, kind, lhs, rhs = got
                found.setdefault((kind, "cols", lhs), []).append(i)
                found.setdefault((kind, "rows", rhs), []).append(i)
        for (kind, side, shared), members in sorted(found.items(), key=lambda kv: -len(kv[1])):
            if len(members) < 2:
                return body
            grouped = _place_group(body, kind, side, shared, members)
            if grouped is not None:
                body = grouped
                break
        else:
            return body


def _place_group(body, kind, side, shared, members) -> Optional[list]:
    writes, reads = index(body)
    uses = {i: [u for u in body[i].uses if u not in targets(body[i])] for i in members}
    if {body[i].target for i in members} & {u for i in members for u in uses[i]}:
        return None  # one member reads another's result: X (X W)^t beside X W
    ready = max((w for i in members for u in uses[i] for w in writes.get(u, ()) if w < i), default=-1) + 1
    for i in members:
        var = body[i].target
        if len(writes[var]) != 1:
            return None
        first_read = min((r for r in reads.get(var, ()) if r > i), default=len(body))
        if first_read < ready:
            return None
        if not _unchanged(writes, uses[i], min(i, ready), max(i, ready), (i,)):
            return None  # an operand is updated in place between the two places
    parts = [product_parts(body[i].code) for i in members]
    others = [p[3] if side == "cols" else p[2] for p in parts]
    names = [p[0] for p in parts]
    helper = {("mm", "cols"): "_grouped", ("mm", "rows"): "_grouped_rows",
              ("total", "cols"): "_grouped_total", ("total", "rows"): "_grouped_total_rows"}[kind, side]
    listed = "(%s,)" % ", ".join(others)
    args = (shared, listed) if side == "cols" else (listed, shared)
    code = "%s = %s(%s, %s%s)" % (", ".join(names), helper, args[0], args[1], ", _nb" if kind == "total" else "")
    group = Stmt(names[0], code, tuple(dict.fromkeys(u for i in members for u in uses[i])))
    keep = [st for i, st in enumerate(body) if i not in set(members)]
    at = ready - sum(1 for i in members if i < ready)
    return keep[:at] + [group] + keep[at:]


# ---- sums of products ------------------------------------------------------------------------------


def group_sums(body: list, batched: Optional[set] = None) -> list:
    """Every sum accumulated from two or more products, ``G = a + b; G += c; ...`` whose summands
    are variables that products made for it alone, with those products as one (see the module
    doc). The sum's other summands stay as they were. ``batched``: the variables that may carry a
    batch axis, for a target that folds a batch on the left of a product into one (torch)."""
    i = 0
    while i < len(body):
        grouped = _sum_at(body, i, batched)
        if grouped is not None:
            body = grouped
        i += 1
    return body


def _sum_at(body, head, batched=None) -> Optional[list]:
    m = _SUM_HEAD.match(body[head].code)
    if m is None or m.group(1) != body[head].target:
        return None
    var = m.group(1)
    terms = [("+", m.group(2)), (m.group(3), m.group(4))]
    end = head + 1
    while end < len(body):
        more = _SUM_MORE.match(body[end].code)
        if more is None or more.group(1) != var:
            break
        terms.append((more.group(2), more.group(3)))
        end += 1
    writes, reads = index(body)
    members = []  # (position in terms, the statement of its product, left, right)
    for k, (sign, expr) in enumerate(terms):
        name = expr[:-3] if expr.endswith(".mT") else expr
        if not name.isidentifier() or len(writes.get(name, ())) != 1:
            continue
        i = writes[name][0]
        parts = product_parts(body[i].code)
        if parts is None or parts[1] != "mm" or i >= head or any(not head <= r < end for r in reads.get(name, ())):
            continue
        if terms.count((sign, expr)) > 1:
            continue
        lhs, rhs = parts[2], parts[3]
        operands = [u for u in body[i].uses if u != name]
        if not _unchanged(writes, operands, i, head, (i,)):
            continue
        if sign == "-":  # a subtracted product, - L R = (-L) R: one negation, not a product and a sum
            lhs = "(-%s)" % lhs
        members.append((k, i, lhs, rhs, expr.endswith(".mT")))
    if len(members) < 2:
        return None
    # the products as they were computed (the orientation most of them are read in), the others
    # transposed, (L R)^t = R^t L^t: a product the lowering computed transposed stays so
    flip = sum(m[4] for m in members) * 2 > len(members)
    members = [(k, i, lhs, rhs) if f == flip else (k, i, transposed(rhs), transposed(lhs))
               for k, i, lhs, rhs, f in members]
    # or all of them transposed, read without a view, where that needs fewer transposed views:
    # sum_i (A_i^t B_i^t)^t as sum_i B_i A_i (each .mT is a dispatched call, and cat copies it)
    # (a batch stays on the left, where torch folds it into one product: (B n, k) @ (k, d))
    turned = [(k, i, transposed(rhs), transposed(lhs)) for k, i, lhs, rhs in members]
    if _views(turned) + flip < _views(members) + (not flip) and not (
            batched is not None and _reads(members, 2, batched) and not _reads(turned, 2, batched)):
        members, flip = turned, not flip
    first = members[0][0]
    s, taken = var + "_sp", {t for st in body for t in targets(st)} | {u for st in body for u in st.uses}
    while s in taken:
        s += "_"
    product = Stmt(s, "%s = _sum_of_products((%s,), (%s,))" % (s, ", ".join(m[2] for m in members),
                                                                  ", ".join(m[3] for m in members)),
                   tuple(dict.fromkeys(u for m in members for u in body[m[1]].uses if u != body[m[1]].target)))
    dropped = {m[0] for m in members[1:]}
    kept = [("+", s + ".mT" if flip else s) if k == first else (sign, expr) for k, (sign, expr) in enumerate(terms)
            if k not in dropped]
    chain = []
    if len(kept) == 1:
        chain.append(Stmt(var, "%s = %s" % (var, kept[0][1]), (s,)))
    else:
        (_, a), (sign_b, b) = kept[0], kept[1]
        chain.append(Stmt(var, "%s = %s %s %s" % (var, a, sign_b, b), _names(a, b)))
        chain += [Stmt(var, "%s %s= %s" % (var, sign, x), (var,) + _names(x)) for sign, x in kept[2:]]
    gone = {m[1] for m in members}
    before = [st for i, st in enumerate(body[:head]) if i not in gone]
    return before + [product] + chain + body[end:]


def _reads(members, side: int, variables: set) -> bool:
    """Whether an operand on ``side`` (2: left, 3: right) of a member reads one of ``variables``."""
    return any(set(re.findall(r"[A-Za-z_]\w*", m[side])) & variables for m in members)


def _views(members) -> int:
    """The transposed views that the operands of a sum of products read."""
    return sum(side.count(".mT") for m in members for side in m[2:])


def _names(*exprs) -> tuple:
    return tuple(e[:-3] if e.endswith(".mT") else e for e in exprs)


# ---- products read transposed --------------------------------------------------------------------


def transposed_reads(body: list, kept: set, batched: Optional[set] = None) -> list:
    """A product every reader of which is a product that reads it transposed (``v.mT``,
    ``(c * v).mT``) computed transposed, ``v = L @ R`` as ``v = R^t @ L^t``, where that takes
    fewer transposed views: the attention's score adjoints, which the weights' gradients and the
    adjoint below both read as their transposes. Not where an elementwise operator reads it (its
    operands keep one layout: a kernel on a transposed and a plain operand is many times slower),
    nor where a batch would leave the left side (``batched``: the variables that may carry one,
    for a target that folds a batch on the left into one product). ``kept``: variables read
    outside the body (the results), left as they are."""
    writes, reads = index(body)
    out = list(body)
    for i in range(len(out)):
        st = out[i]  # as an earlier turn left it
        parts = product_parts(st.code)
        if parts is None or parts[1] != "mm" or parts[0] != st.target:
            continue
        v = st.target
        if v in kept or len(writes.get(v, ())) != 1:
            continue
        word = re.compile(r"(?<![\w.])%s(?!\w)" % re.escape(v))
        flipped = re.compile(r"(?<![\w.])%s\.mT|\((\d[\w.+-]*) \* %s\)\.mT" % (re.escape(v), re.escape(v)))
        readers = [j for j in reads.get(v, ()) if j != i]
        if not readers or any(product_parts(out[j].code) is None or len(word.findall(out[j].code))
                              != len(flipped.findall(out[j].code)) for j in readers):
            continue
        left, right = transposed(parts[3]), transposed(parts[2])
        if batched is not None and _reads([parts], 2, batched) and not _reads([(0, 0, left, right)], 2, batched):
            continue
        saved = sum(len(flipped.findall(out[j].code)) for j in readers)
        if (left + right).count(".mT") - (parts[2] + parts[3]).count(".mT") >= saved:
            continue
        out[i] = st._replace(code="%s = %s @ %s" % (v, left, right))
        for j in readers:
            out[j] = out[j]._replace(code=flipped.sub(lambda m: v if m.group(1) is None else "(%s * %s)"
                                                     % (m.group(1), v), out[j].code))
    return out


# ---- a variable scaled by a number in several statements ------------------------------------------


_SCALED = re.compile(r"\((\d[\w.+-]*) \* (\w+)(\.mT)?\)(\.mT)?")


def shared_scalings(body: list) -> list:
    """A variable scaled by the same number in two or more statements, ``(c * v)`` (or a view of
    it, ``(c * v.mT)``, ``(c * v).mT``), scaled once: ``v_s = c * v`` before the first of them,
    which read ``v_s`` (or ``v_s.mT``). The products of an attention's backward read the scaled
    scores both in a weight's gradient and in the adjoint of the layer below."""
    writes, _ = index(body)
    seen: dict = {}  # (number, variable) -> the statements that scale it
    for i, st in enumerate(body):
        for m in _SCALED.finditer(st.code):
            seen.setdefault((m.group(1), m.group(2)), []).append(i)
    shared = {key: at for key, at in seen.items() if len(at) >= 2 and len(writes.get(key[1], ())) == 1
              and writes[key[1]][0] < at[0]}
    if not shared:
        return body
    taken = {t for st in body for t in targets(st)} | {u for st in body for u in st.uses}
    names: dict = {}
    for c, v in shared:
        name = v + "_s"
        while name in taken:
            name += "_"
        taken.add(name)
        names[(c, v)] = name

    def replace(m):
        name = names.get((m.group(1), m.group(2)))
        if name is None:
            return m.group(0)
        return name + (".mT" if bool(m.group(3)) != bool(m.group(4)) else "")

    out = []
    for i, st in enumerate(body):
        for key in [k for k, at in shared.items() if min(at) == i]:
            out.append(Stmt(names[key], "%s = %s * %s" % (names[key], key[0], key[1]), (key[1],)))
        code = _SCALED.sub(replace, st.code)
        if code != st.code:
            st = st._replace(code=code, uses=tuple(dict.fromkeys(st.uses + tuple(
                names[(m.group(1), m.group(2))] for m in _SCALED.finditer(st.code)
                if (m.group(1), m.group(2)) in names))))
        out.append(st)
    return out


# ---- products of two batches -----------------------------------------------------------------------


def batched_products(body: list, batched: set) -> list:
    """``v = L @ R`` with both sides computed from the data (``batched``: their variables) as
    ``_bmm(L, R)``: torch's ``bmm`` when both are batches at run time (``@`` on two batches
    expands, reshapes and views around its bmm, five dispatched calls for one), else ``@``."""
    out = []
    for st in body:
        parts = product_parts(st.code)
        if parts is not None and parts[1] == "mm" and all(
                set(re.findall(r"[A-Za-z_]\w*", side)) - {"mT"} <= batched for side in parts[2:]):
            st = st._replace(code="%s = _bmm(%s, %s)" % (parts[0], parts[2], parts[3]))
        out.append(st)
    return out


# ---- the heads of an attention as one stacked computation ------------------------------------------

# what a statement of a stacked chain may call besides its variables: operators on the last two
# axes, which act on each matrix of a stack (a head axis before them) alike
_STACKABLE = {"_bmm", "_softmax", "_aa_given", "mT"}
_WORD = re.compile(r"(?<![\w.])[A-Za-z_]\w*")


def _template(st) -> Optional[tuple]:
    """(the code with its variables as {0}, {1}, ... in order of appearance, those variables), or
    None for a statement that is not one of a chain that can be stacked."""
    if len(targets(st)) != 1 or st.target is None:
        return None
    names = set(st.uses) | {st.target}
    order: list = []
    parts, at = [], 0
    for m in _WORD.finditer(st.code):
        word = m.group(0)
        if word not in names:
            if word not in _STACKABLE:
                return None
            continue
        if word not in order:
            order.append(word)
        parts += [st.code[at:m.start()].replace("{", "{{").replace("}", "}}"), "{%d}" % order.index(word)]
        at = m.end()
    parts.append(st.code[at:].replace("{", "{{").replace("}", "}}"))
    return "".join(parts), tuple(order)


def stacked_heads(body: list, batched: set, shapes: dict, kept: set) -> list:
    """Runs of h alike chains of statements, one after the other (the heads of an attention, each
    ``scores = _bmm((s * q), k.mT); ... ; out = _bmm(p, v)`` on its own slices of the grouped
    Q, K, V product), done as one chain on stacks of h matrices: the per-head operands stacked
    along a head axis before the last two (``torch.stack(..., -3)``, or a stack made before: the
    forward's probabilities, read again by the backward), one statement for each statement of a
    chain, and the results read after it as views of the stack (``unbind(-3)``). So the 4 heads'
    products are one batched product each, as autograd's multi-head attention does them.
    ``batched``: the variables that may carry a batch axis; ``shapes``: variable -> its shape
    (stacked operands must agree in shape and batch); ``kept``: variables read after the body."""
    temps = [_template(st) for st in body]
    writes, reads = index(body)
    stacks: dict = {}  # tuple of variables -> (the stack of them, as a variable), for reuse
    taken = {t for st in body for t in targets(st)} | {u for st in body for u in st.uses}
    out: list = []
    i = 0
    while i < len(body):
        best = None
        for length in range(1, 13):
            if i + 2 * length > len(body) or any(t is None for t in temps[i:i + length]):
                break
            h = 1
            while i + (h + 1) * length <= len(body) and all(
                    temps[i + h * length + p] is not None and temps[i + h * length + p][0] == temps[i + p][0]
                    for p in range(length)):
                h += 1
            if h >= 2 and (best is None or h * length > best[0] * best[1]) and any(
                    "_bmm(" in t[0] or " @ " in t[0] for t in temps[i:i + length]):  # a product to batch
                plan = _stack_plan(body, temps, i, length, h, writes, reads, batched, shapes, kept, stacks)
                if plan is not None:
                    best = (h, length, plan)
        if best is None:
            out.append(body[i])
            i += 1
            continue
        h, length, (order, slots, results) = best
        names: dict = {}  # tuple of variables -> the variable of their stack

        def fresh(base):
            name = base + "_h"
            while name in taken:
                name += "_"
            taken.add(name)
            return name

        for kind, tup in (slot for stmt_slots in slots for slot in stmt_slots):
            if kind == "shared" or tup in names:
                continue
            if kind == "outer":
                if tup in stacks:
                    names[tup] = stacks[tup]
                    continue
                names[tup] = fresh(tup[0])
                out.append(Stmt(names[tup], "%s = torch.stack((%s,), -3)" % (names[tup], ", ".join(tup)), tup))
                if all(len(writes.get(v, ())) == 1 for v in tup):
                    stacks[tup] = names[tup]
            else:
                names[tup] = fresh(tup[0])
        for p in range(length):
            template, _ = temps[i + order[0] * length + p]
            # a shared operand with a batch axis gets a head axis of 1 before its matrices, so that
            # it broadcasts against the stacks (batch, heads, rows, cols), not the batch against the heads
            args = [(tup[0] + ".unsqueeze(-3)" if tup[0] in batched else tup[0]) if kind == "shared" else names[tup]
                    for kind, tup in slots[p]]
            target = body[i + order[0] * length + p].target
            at = temps[i + order[0] * length + p][1].index(target)
            out.append(Stmt(args[at], template.format(*args),
                            tuple(dict.fromkeys(a.split(".")[0] for a in args))))
        for tup in results:
            out.append(Stmt(tup[0], "%s = %s.unbind(-3)" % (", ".join(tup), names[tup]), (names[tup],)))
            stacks[tup] = names[tup]
        i += h * length
    # views of a stack that nothing reads now (a later run read the stack itself) are not made
    read = {u for st in out for u in st.uses} | set(kept)
    return [st for st in out if not (st.code.endswith(".unbind(-3)") and not read & set(targets(st)))]


def _stack_plan(body, temps, i, length, h, writes, reads, batched, shapes, kept, stacks) -> Optional[tuple]:
    """(the order of the heads, each statement's slots as ("shared", (v,)), ("outer", one variable
    per head: stacked before), ("inner", one per head: made in the chains), the inner tuples read
    after the run) for the run of ``h`` chains of ``length`` statements from ``i``; None where the
    chains are not alike (a variable of one head read by another, a per-head operand made or
    updated within the run, operands of different shapes or batching)."""
    end = i + h * length
    inner: list = []  # per head: variable -> position of the statement that first assigns it
    for j in range(h):
        defs: dict = {}
        for p in range(length):
            st = body[i + j * length + p]
            if st.target not in defs and not st.code.startswith(st.target + " = "):
                return None  # updates in place a value made before the run
            defs.setdefault(st.target, p)
        inner.append(defs)
    slots = []
    for p in range(length):
        per = [temps[i + j * length + p][1] for j in range(h)]
        if len({len(vs) for vs in per}) != 1:
            return None
        row = []
        for s in range(len(per[0])):
            tup = tuple(per[j][s] for j in range(h))
            where = [inner[j].get(v) for j, v in enumerate(tup)]
            if all(w is not None for w in where):
                if len(set(where)) != 1 or where[0] > p or len(set(tup)) != h:
                    return None
                row.append(("inner", tup))
            elif any(w is not None for w in where):
                return None
            elif len(set(tup)) == 1:
                if any(i <= w < end for w in writes.get(tup[0], ())):
                    return None
                row.append(("shared", tup[:1]))
            else:
                if len(set(tup)) != h or any(i <= w < end for v in tup for w in writes.get(v, ())):
                    return None
                if len({v in batched for v in tup}) != 1 or len({shapes.get(v) for v in tup}) != 1 \
                        or shapes.get(tup[0]) is None:
                    return None
                row.append(("outer", tup))
        slots.append(row)
    # the heads in the order of a stack made before, where one of the operands has one
    order = list(range(h))
    for row in slots:
        for kind, tup in row:
            if kind == "outer" and tup not in stacks:
                for made in stacks:
                    if set(made) == set(tup):
                        order = [tup.index(v) for v in made]
                        break
                else:
                    continue
                break
        else:
            continue
        break
    slots = [[(kind, tup if kind == "shared" else tuple(tup[j] for j in order)) for kind, tup in row] for row in slots]
    results = []
    for row in slots:
        for kind, tup in row:
            if kind == "inner" and tup not in results and any(
                    v in kept or any(r >= end for r in reads.get(v, ())) for v in tup):
                results.append(tup)
    return order, slots, results
