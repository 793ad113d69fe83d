"""Dependency views: the manual's opening question ("does the coefficient of dK_5 involve Q_3, and
through what?") as a picture.

Vocabulary
----------
normal form  the 1-form ``sum_W trace(G_W dW)`` the views read, taken as given when it already is
             one over weights, else reached with the stdlib strategy ``backprop`` (the shared
             normal form: linear in depth, with named intermediates X_i and adjoints G_i).
named graph  the graph of a coefficient at the level of names (``named_graph``): the coefficient,
             the named intermediates (``let`` terms) and the weights are its nodes, and an edge
             ``A -> B`` says that B occurs in the definition of A without another name in between;
             the edge's ``via`` is the list of operators between them, as ``depends`` prints them.
path view    for a weight V and the coefficient of dW (``path_view``): the part of the named graph
             on some path from the coefficient to V (networkx ``descendants``/``ancestors``), with
             the path ``depends`` reports drawn in red and every other way in grey.
overview     which weights appear in which coefficient (``deps_graph``): weights on the left,
             coefficients on the right, an edge ``V -> coeff of dW`` where V appears in G_W.

The graphs are networkx graphs with the node, edge and graph data of ``fdsl.pictures.termgraph``,
so ``fdsl.pictures.graphviz`` draws them like term graphs.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import networkx as nx

from ..base.errors import FdslError
from ..calculus import forms
from ..core.functions import as_term, describe
from ..core.printers import text
from ..core.terms import Term, postorder
from .termgraph import LET_FILL, PALETTE, TEXT, layer_colour, let_name, networkx, plural, repeats

PATH_RED = "#c0392b"
OTHER_GREY = "#9a9a9a"
DEFINITION_CHARS = 44  # how much of a named intermediate's definition its box shows


# ---- the named graph and the path view ----------------------------------------------------------


def _stop(t: Term) -> bool:
    return t.op == "let" or (t.op == "sym" and t.data[0].kind == "weight")


def named_graph(coefficient: Term) -> nx.DiGraph:
    """The names under a coefficient and which name's definition uses which (see the module doc).
    Each definition is searched once, breadth first, without entering other definitions."""
    graph = networkx().DiGraph()
    graph.add_node(coefficient)
    owners = deque([coefficient])
    while owners:
        owner = owners.popleft()
        start = owner.args[0] if owner.op == "let" and owner is not coefficient else owner
        parent = {start: None}
        queue = deque([start])
        while queue:
            t = queue.popleft()
            if _stop(t) and t is not owner:
                chain = [owner] + _chain(parent, t)
                if t not in graph:
                    graph.add_node(t)
                    if t.op == "let":
                        owners.append(t)
                graph.add_edge(owner, t, via=_via(chain))
                continue
            for c in t.args:
                if c not in parent:
                    parent[c] = t
                    queue.append(c)
    return graph


def _chain(parent, t) -> list:
    chain = []
    while t is not None:
        chain.append(t)
        t = parent[t]
    return chain[::-1]


def _via(chain) -> list:
    """The operators strictly between the first and the last term of a chain, as depends prints
    them: ``["m(...)", "a(...)"]``."""
    return [label for label in forms.path_labels(chain[:-1]) if label.endswith("(...)")]


def path_view(coefficient: Term, weight: Term, of: Term) -> nx.DiGraph:
    """The picture of "does the coefficient of d``of`` involve ``weight``?": every path from the
    coefficient to the weight through named intermediates, the one ``depends`` reports in red."""
    for what, t in (("the weight asked about", weight), ("the weight of the coefficient", of)):
        if not (isinstance(t, Term) and t.op == "sym" and t.data[0].kind == "weight"):
            raise FdslError("%s must be a weight, not %s" % (what, describe(t)))
    answer = forms.depends(coefficient, weight)
    named = named_graph(coefficient)
    nx = networkx()
    keep = {coefficient, weight}
    if weight in named:
        keep |= nx.descendants(named, coefficient) & nx.ancestors(named, weight)
    graph = nx.DiGraph()
    ids = {coefficient: "coeff"}
    of_name = of.data[0].printed()
    graph.add_node("coeff", label="coefficient of d%s" % of_name, op="coeff", term=coefficient, cluster=None,
                   dot={"shape": "box", "style": "filled,bold", "fillcolor": layer_colour(of.data[0]),
                        "penwidth": "2", "fontsize": "13"})
    for t in nx.topological_sort(named.subgraph(keep)) if weight in named else [coefficient, weight]:
        if t is coefficient:
            continue
        ids[t] = _node_id(t)
        graph.add_node(ids[t], **_named_node(t))
    red = _reported_edges(answer, coefficient, weight)
    for u, v, data in named.subgraph(keep).edges(data=True):
        on_path = (u, v) in red
        via = red[(u, v)] if on_path else data["via"]
        style = {"color": PATH_RED if on_path else OTHER_GREY, "fontcolor": PATH_RED if on_path else "grey35",
                 "penwidth": "2.5" if on_path else "1"}
        if via:
            style["label"] = " > ".join(via)
        graph.add_edge(ids[u], ids[v], positions=[], dot=style)
    graph.graph.update(roots=["coeff"], clusters={}, dot={"rankdir": "TB", "ranksep": "0.45", "nodesep": "0.35"})
    weight_name = weight.data[0].printed()
    question = "does the coefficient of d%s involve %s?  %s" % (of_name, weight_name, answer.show())
    graph.graph["title"] = question
    lets = sum(1 for t in keep if t.op == "let")
    if answer:
        legend = [("an edge A -> B: B occurs in the definition of A; its label: the operators in between", None),
                  ("red: the path depends reports (a shortest one); grey: every other way %s reaches the "
                   "coefficient" % weight_name, PATH_RED),
                  ("%s on these paths, each shown with the start of its definition"
                   % plural(lets, "named intermediate"), LET_FILL)]
    else:
        legend = [("%s does not occur in the coefficient of d%s, nor in any definition it uses"
                   % (weight_name, of_name), None)]
    graph.graph["legend"] = legend
    return graph


def _node_id(t: Term) -> str:
    return ("let_" + let_name(t)) if t.op == "let" else "w_" + t.data[0].printed()


def _named_node(t: Term) -> dict:
    if t.op == "let":
        body = text(t.args[0])
        if len(body) > DEFINITION_CHARS:
            body = body[:DEFINITION_CHARS - 3].rstrip() + " ..."
        return {"label": "%s := %s" % (let_name(t), body), "op": "let", "term": t, "cluster": None,
                "dot": {"shape": "box", "style": "filled", "fillcolor": LET_FILL, "peripheries": "2"}}
    return {"label": t.data[0].printed(), "op": "sym", "term": t, "cluster": None,
            "dot": {"shape": "box", "style": "rounded,filled,bold", "fillcolor": layer_colour(t.data[0]),
                    "penwidth": "2", "fontsize": "13"}}


def _reported_edges(answer, coefficient, weight) -> dict:
    """The edges (u, v) of the path depends reports, each with the operators between u and v."""
    if not answer:
        return {}
    edges, start = {}, 0
    chain = answer.nodes
    for i in range(1, len(chain)):
        if _stop(chain[i]):
            edges[(chain[start], chain[i])] = _via(chain[start:i + 1])
            start = i
    return edges


# ---- the overview: which weights appear in which coefficient -----------------------------------------


def deps_graph(pairs) -> nx.DiGraph:
    """The picture of ``pairs``: a mapping from each weight W to the set of weights that appear in
    the coefficient of dW (named intermediates, ``let`` terms, may be among them). Weights on the
    left, coefficients on the right."""
    graph = networkx().DiGraph()
    order = list(pairs)
    for used in pairs.values():
        for v in sorted(used, key=_input_key):
            if v not in order:
                order.append(v)
    graph.graph["clusters"] = {
        "cluster_weights": {"label": "weights", "dot": {"style": "rounded", "color": "grey60", "labelloc": "t"}},
        "cluster_coefficients": {"label": "coefficients", "dot": {"style": "rounded", "color": "grey60",
                                                                  "labelloc": "t"}},
    }
    graph.graph["dot"] = {"rankdir": "LR", "ranksep": "2"}
    for v in order:
        graph.add_node(_input_id(v), label=_input_name(v), op=v.op, term=v, cluster="cluster_weights",
                       dot=_input_style(v))
    for w in pairs:
        name = _weight_symbol(w).printed()
        graph.add_node("c_" + name, label="coeff of d" + name, op="coeff", term=w, cluster="cluster_coefficients",
                       dot={"shape": "box", "style": "filled", "peripheries": "2",
                            "fillcolor": layer_colour(_weight_symbol(w))})
    for w, used in pairs.items():
        for v in sorted(used, key=_input_key):
            graph.add_edge(_input_id(v), "c_" + _weight_symbol(w).printed(), positions=[], dot={})
    layers = sorted({v.data[0].index[0] for v in order if v.op == "sym" and v.data[0].index})
    lets = sum(1 for v in order if v.op == "let")
    graph.graph["legend"] = [
        ("%d weights%s, %d coefficients, %d edges" % (len(order) - lets,
                                                       plural(lets, "named intermediate", ", ") if lets else "",
                                                       len(pairs), graph.number_of_edges()), None),
        ("an edge V -> coeff of dW: the weight V appears in the coefficient G of dW", None),
        ("(the form is the sum of trace(G dW), one summand per weight W)", None),
    ] + [("layer %d%s" % (k, repeats(k, layers)), PALETTE[k % len(PALETTE)]) for k in layers[:len(PALETTE)]]
    if lets:
        graph.graph["legend"].append(("E: a named intermediate, taken as a known matrix", LET_FILL))
    graph.graph["legend"].append(("for how one weight reaches one coefficient: fdsl deps --weight V --coeff W", None))
    return graph


def _input_id(v) -> str:
    return "w_" + _input_name(v)


def _input_name(v) -> str:
    if isinstance(v, Term) and v.op == "let":
        return TEXT.let(*v.data)
    return _weight_symbol(v).printed()


def _input_style(v) -> dict:
    if v.op == "let":
        return {"shape": "box", "style": "filled,dashed", "fillcolor": LET_FILL}
    return {"shape": "box", "style": "rounded,filled", "fillcolor": layer_colour(_weight_symbol(v))}


def _weight_symbol(w):
    if not (isinstance(w, Term) and w.op == "sym" and w.data[0].kind == "weight"):
        raise FdslError("deps draws weights, not %s" % describe(w))
    return w.data[0]


def _input_key(v):
    """Weights by layer, then name; named intermediates after them."""
    if v.op == "let":
        return (1, v.data[1], v.data[0])
    symbol = _weight_symbol(v)
    return (0, symbol.index, symbol.name)


def deps_pairs(program, form, keep_lets: bool = False) -> dict:
    """For a 1-form: each weight W whose differential it has -> the weights in the coefficient of
    dW. Named intermediates are looked through, as ``depends`` does, unless ``keep_lets``: then they
    count as known matrices, like the manual's error E, and are themselves among the inputs."""
    normal = program.normal_form(as_term(form, "the form"))
    descend = (lambda n: n.op != "let") if keep_lets else None
    pairs = {}
    for w in forms.weights(normal):
        g = forms.coeff(normal, w)
        pairs[w] = {v for v in postorder(g, descend)
                    if (v.op == "sym" and v.data[0].kind == "weight") or (keep_lets and v.op == "let")}
    return pairs
