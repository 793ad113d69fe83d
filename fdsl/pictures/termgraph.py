"""Term graphs: what a diagram of a term draws, as a networkx graph, before any layout.

Vocabulary
----------
term graph   the networkx ``DiGraph`` of a term (``term_graph``): one node per distinct subterm of
             the shared term graph of ``fdsl.core.terms`` (never its tree expansion), an edge from each
             operator to each of its arguments. A subterm used in several places is one node with
             several incoming edges; ``encoder(2)``'s 37 nodes stand for a tree of 89.
box          a named intermediate (a ``let``: ``X_5``, ``G_6``, ``E``) drawn as one node, its
             definition not drawn. A picture of one coefficient of a deep normal form is a few dozen
             nodes this way, where drawing every definition would be the whole network.
expand       draw a named intermediate's definition too: the node ``X_5 :=`` with an edge to its
             body. ``expand`` is "auto" (everything when the whole graph is small, else only the
             terms asked for), "all", or a set of printed names (``{"X_5", "G_6"}``).
position     the 1-based place of an argument, written on the edge for operators whose argument
             order matters (products, ``mm``, ``aa``): a product's factors read left to right.
layer        the first index of a weight (``Q_3`` is in layer 3). Weights and their differentials
             are filled with the layer's colour; the palette repeats every ``len(PALETTE)`` layers.
cluster      a box around the summands ``c trace(G d(W))`` of a normal form that share the weight
             ``W`` (label ``dW_0``), found from the shape of the sum alone (``weight_clusters``).
             A subterm used by the summands of several weights stays outside every box.
legend       lines (with an optional colour swatch) saying how to read the picture.

Node data: ``label`` (the text drawn), ``op``, ``term``, ``cluster`` (a cluster id or None),
``leafy`` (may be drawn once per use) and ``dot`` (Graphviz attributes). Edge data: ``positions``
and ``dot``. Graph data: ``roots``, ``legend``, ``clusters`` (id -> label and attributes), ``dot``
(graph attributes), ``title``. ``fdsl.pictures.graphviz`` reads only these, so it draws any graph
built this way (the dependency views of ``fdsl.pictures.depsview`` too).
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import networkx as nx

from ..base.errors import FdslError
from ..core.functions import as_term, describe
from ..core.ops import OPS
from ..core.printers import Style
from ..core.terms import Term, factors, postorder, tree_size

# Light fills (ColorBrewer Set3 without its grey, which marks constants): black text stays legible.
PALETTE = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
           "#bc80bd", "#ccebc5")
NO_LAYER = "#ffed6f"  # a weight declared without an index
CONST_GREY = "#d9d9d9"
LET_FILL = "#eef3fb"
AUTO_EXPAND = 120  # "auto" draws every definition when the whole graph has at most this many nodes

TEXT = Style()  # the text printer's spelling of numbers, powers, eye and let names


def networkx():
    # imported when a diagram is drawn, not when fdsl starts: it is a third of every start-up
    import networkx

    return networkx


def let_name(t: Term) -> str:
    """The printed name of a named intermediate: ``X_5``, ``G_6``, ``encoder_3``."""
    return TEXT.let(*t.data)


def term_graph(value, expand="auto", max_nodes: Optional[int] = None) -> nx.DiGraph:
    """The diagram of a term (or a list of terms): one node per distinct subterm, named
    intermediates drawn as boxes unless ``expand`` asks for their definitions."""
    roots = _roots(value)
    expanded = _expanded(roots, expand)
    descend = lambda n: n.op != "let" or n in expanded
    graph = networkx().DiGraph()
    ids: dict = {}
    for root in roots:
        for node in postorder(root, descend):
            if node in ids:
                continue
            ids[node] = "n%d" % len(ids)
            if max_nodes is not None and len(ids) > max_nodes:
                raise too_big(max_nodes, boxes_help=any(n.op == "let" for n in ids))
            graph.add_node(ids[node], **_node_data(node, node.op == "let" and node not in expanded))
            if not descend(node):
                continue
            ordered = len(node.args) > 1 and not OPS[node.op].commutative
            for position, child in enumerate(node.args, 1):
                u, v = ids[node], ids[child]
                if graph.has_edge(u, v):  # the same factor twice in one product: one edge, "1,3"
                    graph.edges[u, v]["positions"].append(position)
                else:
                    graph.add_edge(u, v, positions=[position] if ordered else [], dot={})
    for u, v, data in graph.edges(data=True):
        if data["positions"]:
            data["dot"]["label"] = ",".join(map(str, data["positions"]))
    graph.graph["roots"] = [ids[r] for r in roots]
    graph.graph["dot"] = {"ordering": "out"}  # arguments left to right, in the order they are drawn
    graph.graph["clusters"] = {}
    _mark_clusters(graph, roots, ids)
    graph.graph["legend"] = _legend(graph, roots)
    return graph


def too_big(limit: int, boxes_help: bool) -> FdslError:
    """The refusal of a picture with more than ``limit`` nodes, with what to do instead."""
    advice = ["draw a part of it: one coefficient coeff(w, W), a summand x[j], a definition's body"]
    if boxes_help:
        advice.insert(0, "expand fewer named intermediates (leave out --expand, or name only the ones you need)")
    return FdslError("this picture would have more than %d boxes, too many for Graphviz to lay out in "
                     "reasonable time or for a person to read; %s; or raise the limit (--max-nodes)"
                     % (limit, "; ".join(advice)))


def _roots(value) -> list:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise FdslError("nothing to draw: the list is empty")
    roots = []
    for item in items:
        if not isinstance(item, (Term, Fraction, int)) or isinstance(item, bool):
            raise FdslError("a diagram draws a matrix expression, not %s" % describe(item))
        roots.append(as_term(item))
    return roots


def _expanded(roots, expand) -> set:
    """The named intermediates whose definitions are drawn: the roots themselves (what was asked
    for is shown), and those ``expand`` names."""
    lets_seen = set()
    if expand == "all":
        return {n for r in roots for n in postorder(r) if n.op == "let"}
    if expand == "auto":
        total = set()
        for r in roots:
            total.update(postorder(r))
        if len(total) <= AUTO_EXPAND:
            return {n for n in total if n.op == "let"}
        expand = ()
    wanted = set(expand)
    chosen = {r for r in roots if r.op == "let"}
    # walk down through what is drawn: a name can only be expanded where it is visible
    frontier = list(chosen) + [r for r in roots if r.op != "let"]
    seen = set()
    while frontier:
        top = frontier.pop()
        for node in postorder(top.args[0] if top.op == "let" else top, lambda n: n.op != "let"):
            if node.op != "let" or node in seen:
                continue
            seen.add(node)
            lets_seen.add(let_name(node))
            if let_name(node) in wanted:
                chosen.add(node)
                frontier.append(node)
    unknown = sorted(wanted - lets_seen - {let_name(r) for r in roots if r.op == "let"})
    if unknown:
        known = sorted(lets_seen, key=_name_key)
        raise FdslError("no named intermediate %s in this picture; %s" % (
            ", ".join(unknown), "it shows %s" % ", ".join(known[:20]) + (" ..." if len(known) > 20 else "")
            if known else "it has none"))
    return chosen


def _name_key(name: str):
    base, _, index = name.partition("_")
    return (base, int(index) if index.isdigit() else -1, name)


_LEAVES = ("sym", "num", "eye", "zero", "ones")


def _node_data(node: Term, boxed: bool) -> dict:
    op = node.op
    # leafy nodes may be drawn once per use (split_leaves); named intermediates never are
    leafy = op in _LEAVES or (op == "t" and node.args[0].op in _LEAVES)
    data = {"op": op, "term": node, "cluster": None, "leafy": leafy, "boxed": boxed}
    if op == "sym":
        symbol = node.data[0]
        data["label"] = symbol.printed()
        style = {"shape": "box", "style": "rounded"}
        if symbol.kind == "weight":
            style.update(style="rounded,filled", fillcolor=layer_colour(symbol))
        elif symbol.kind == "const":
            style.update(style="rounded,filled", fillcolor=CONST_GREY)
        data["dot"] = style
    elif op in ("num", "zero", "eye", "ones"):
        if op == "num":
            data["label"] = TEXT.number(node.data)
        elif op == "eye":
            data["label"] = TEXT.eye(node.data)
        elif op == "ones":
            data["label"] = TEXT.ones(node.data)
        else:
            data["label"] = "0 (%s x %s)" % node.data
        data["dot"] = {"shape": "box", "style": "rounded"}
    elif op == "let":
        name = let_name(node)
        data["label"] = name if boxed else name + " :="
        # a box: a thick double border says "a whole matrix, defined elsewhere"
        data["dot"] = ({"shape": "box", "style": "filled", "fillcolor": LET_FILL, "peripheries": "2",
                        "penwidth": "1.5"} if boxed else {"shape": "box", "style": "filled", "fillcolor": LET_FILL})
    elif op == "d":
        # differentials stand out: a double bold border, and the colour of the weight they take
        style = {"peripheries": "2", "penwidth": "1.5", "fontname": "Helvetica Bold", "style": "filled",
                 "fillcolor": "white"}
        weight = weight_of(node.args[0])
        if weight is not None:
            style["fillcolor"] = layer_colour(weight.data[0])
        data["label"] = "d"
        data["dot"] = style
    else:
        data["label"] = _operator_label(node)
        data["dot"] = {}
    return data


def _operator_label(node: Term) -> str:
    op = node.op
    if op == "pow":
        return TEXT.power("", node.data)
    return {"add": "+", "mul": "×", "had": "∘", "t": "^t"}.get(op, op)


def layer_colour(symbol) -> str:
    """The fill of a weight: its layer's colour (the palette repeats), or one colour if unindexed."""
    if not symbol.index:
        return NO_LAYER
    return PALETTE[symbol.index[0] % len(PALETTE)]


def weight_of(t: Term) -> Optional[Term]:
    """The weight symbol ``t`` is, or None."""
    if t.op == "sym" and t.data[0].kind == "weight":
        return t
    return None


# ---- normal forms: one cluster per weight ----------------------------------------------------------


def differentiated_weight(summand: Term) -> Optional[Term]:
    """W when ``summand`` is ``c trace(G d(W))``: scalars c (traces without differentials among
    them), d(W) anywhere in the trace's word, possibly transposed, and no other differential."""
    found = None
    for f in factors(summand):
        if not f.has_d:
            continue  # part of the scalar coefficient c
        if f.op != "trace" or found is not None:
            return None
        for g in factors(f.args[0]):
            if not g.has_d:
                continue  # part of G
            inner = g.args[0] if g.op == "t" else g
            weight = weight_of(inner.args[0]) if inner.op == "d" else None
            if weight is None or found is not None:
                return None  # a differential inside a coefficient, or a second one
            found = weight
    return found


def weight_clusters(term: Term) -> dict:
    """For a sum of summands ``c trace(G d(W))``: each weight W -> its summands, in order of first
    appearance. Summands of any other shape are left out; an empty dict if none qualifies."""
    clusters: dict = {}
    summands = term.args if term.op == "add" else (term,)
    for s in summands:
        w = differentiated_weight(s)
        if w is not None:
            clusters.setdefault(w, []).append(s)
    return clusters


_OUTSIDE = object()  # a node used by more than one cluster, or by the top of the sum


def _mark_clusters(graph: nx.DiGraph, roots, ids) -> None:
    """Put each node used only by the summands of one weight in that weight's cluster."""
    clusters = graph.graph["clusters"]
    cluster_of: dict = {}  # weight -> cluster id
    entry: dict = {}  # (parent id or None for a root, node id) -> the cluster that edge brings
    for root in roots:
        for w, summands in weight_clusters(root).items():
            if w not in cluster_of:
                cid = cluster_of[w] = "cluster_%d" % len(clusters)
                clusters[cid] = {"label": "d" + w.data[0].printed(),
                                 "dot": {"style": "rounded", "color": layer_colour(w.data[0]), "penwidth": "2",
                                         "labelloc": "t", "labeljust": "l"}}
            for s in summands:
                entry[(ids[root], ids[s]) if s is not root else (None, ids[root])] = cluster_of[w]
    if not entry:
        return
    owner = {r: entry.get((None, r), _OUTSIDE) for r in graph.graph["roots"]}
    # topological order lists every parent before its children
    for parent in networkx().topological_sort(graph):
        mine = owner.get(parent, _OUTSIDE)
        for child in graph.successors(parent):
            given = entry.get((parent, child), mine)
            owner[child] = given if owner.get(child, given) == given else _OUTSIDE
    for node, cid in owner.items():
        if cid is not _OUTSIDE:
            graph.nodes[node]["cluster"] = cid


# ---- legend --------------------------------------------------------------------------------------


def _legend(graph: nx.DiGraph, roots) -> list:
    """How to read the picture: (text, swatch colour or None) lines, only for what is drawn."""
    n = graph.number_of_nodes()
    tree = sum(tree_size(r) for r in roots)
    lines = [("%d distinct subterms (written out as a tree: %s nodes)" % (n, count(tree)), None)]
    if len(roots) > 1:
        lines.append(("%d expressions of a list, drawn together" % len(roots), None))
    shared = sum(1 for v in graph if graph.in_degree(v) > 1)
    if shared:
        lines.append(("%d subterms occur more than once: drawn once, "
                      "with an incoming edge from each use" % shared, None))
    if any(d["positions"] for _, _, d in graph.edges(data=True)):
        lines.append(("edge numbers: argument positions (a product's factors, left to right)", None))
    kinds = {}
    boxes, defined = [], []
    for _, data in graph.nodes(data=True):
        if data["op"] == "sym":
            symbol = data["term"].data[0]
            if symbol.kind == "weight":
                key = symbol.index[0] if symbol.index else -1
                kinds.setdefault(("weight", key), layer_colour(symbol))
            else:
                kinds.setdefault((symbol.kind, 0), CONST_GREY if symbol.kind == "const" else None)
        elif data["op"] == "d":
            kinds.setdefault(("d", 0), None)
        elif data["op"] == "let":
            (boxes if data["boxed"] else defined).append(data["label"])
    layers = sorted(k for kind, k in kinds if kind == "weight" and k >= 0)
    for layer in layers[:len(PALETTE)]:
        lines.append(("weight, layer %d%s" % (layer, repeats(layer, layers)), PALETTE[layer % len(PALETTE)]))
    if ("weight", -1) in kinds:
        lines.append(("weight without a layer index", NO_LAYER))
    if ("const", 0) in kinds:
        lines.append(("constant", CONST_GREY))
    if ("d", 0) in kinds:
        lines.append(("d: a differential (double border), filled like the weight it takes", None))
    if defined:
        lines.append(("N := a named intermediate, with an edge to its definition", LET_FILL))
    if boxes:
        names = sorted(boxes, key=_name_key)
        shown = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")
        lines.append(("double box: a named intermediate, its definition not drawn (%s); "
                      "draw one with --expand NAME, or expand=[...]" % shown, LET_FILL))
    if graph.graph["clusters"]:
        lines.append(("box dW: the summands c trace(G dW) of a normal form and what only they use", None))
    return lines


def repeats(layer, layers) -> str:
    others = [k for k in layers if k != layer and k % len(PALETTE) == layer % len(PALETTE)]
    return "" if not others else " (and %s)" % ", ".join(map(str, others[:4])) + (" ..." if len(others) > 4 else "")


def plural(n: int, what: str, lead: str = "") -> str:
    return "%s%d %s%s" % (lead, n, what, "" if n == 1 else "s")


def count(n: int) -> str:
    """A node count for the legend; trees can be too large for a float or for str()."""
    if n < 10 ** 9:
        return str(n)
    exponent = (n.bit_length() - 1) * 30103 // 100000  # a lower bound of log10(n)
    lead = n // 10 ** (exponent - 2)
    while lead >= 1000:
        lead //= 10
        exponent += 1
    return "%d.%02de%d" % (lead // 100, lead % 100, exponent)
