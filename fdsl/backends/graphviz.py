"""Diagrams: terms drawn as pictures, through networkx and Graphviz's ``dot`` program.

Vocabulary
----------
term graph   the networkx ``DiGraph`` of a term (``term_graph``): one node per distinct subterm of
             the shared term graph of ``fdsl.terms`` (never its tree expansion), an edge from each
             operator to each of its arguments. A subterm used in several places is one node with
             several incoming edges; ``encoder(2)``'s 37 nodes stand for a tree of 89, and
             ``encoder(64)``'s 1091 for a tree of about 4e31.
position     the 1-based place of an argument, written on the edge for operators whose argument
             order matters (products, ``mm``, ``aa``): a product's factors read left to right.
layer        the first index of a weight (``Q_3`` is in layer 3). Weights and their differentials
             are filled with the layer's colour; the palette repeats every ``len(PALETTE)`` layers.
cluster      a box around the summands ``c trace(G d(W))`` of a normal form that share the weight
             ``W`` (label ``dW_0``), found from the shape of the sum alone (``weight_clusters``).
             A subterm used by the summands of several weights stays outside every box.
legend       lines (with an optional colour swatch) saying how to read the picture; ``to_dot``
             draws them as the graph's label, so they add no node to the picture.
deps graph   the manual's opening question as a picture (``deps_graph``): weights on the left,
             the coefficients of their differentials on the right, an edge ``V -> dW`` where the
             weight V appears in the coefficient of dW.
DOT          Graphviz's text format, written by ``to_dot`` (no pydot/pygraphviz); ``render`` runs
             ``dot`` to make SVG, PNG or PDF, and writes the DOT text itself when ``dot`` is
             missing, with a note saying how to install Graphviz.

Node data of the networkx graphs: ``label`` (the text drawn), ``op``, ``term`` (the Term, for term
graphs), ``cluster`` (a cluster id or None) and ``dot`` (further DOT attributes). Edge data:
``positions`` and ``dot``. Graph data: ``legend``, ``clusters`` (id -> label and DOT attributes),
``dot`` (graph attributes). ``to_dot`` reads only these, so it draws any graph built this way.

``let`` nodes (named intermediates, ``E := ...``) are drawn as a node ``E :=`` with an edge to their
body; ``collapse_lets=True`` draws them as leaves instead, for pictures of a normal form whose
intermediates would otherwise fill the page.
"""

from __future__ import annotations

import html
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import networkx as nx

from .. import forms
from ..cli import FILE_HELP, subcommand
from ..errors import FdslError
from ..functions import as_term, describe, function
from ..ops import OPS
from ..printers import Style
from ..statements import Write, target_of
from ..terms import Term, factors, postorder, tree_size

# Light fills (ColorBrewer Set3 without its grey, which marks constants): black text stays legible.
PALETTE = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
           "#bc80bd", "#ccebc5")
NO_LAYER = "#ffed6f"  # a weight declared without an index
CONST_GREY = "#d9d9d9"
LET_FILL = "#eef3fb"

FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".dot": None}  # extension -> dot -T format
INSTALL_HINT = ("install Graphviz to render it: apt-get install graphviz (Debian/Ubuntu) "
                "or brew install graphviz (macOS)")
DEFAULT_MAX_NODES = 5000  # dot takes minutes beyond this; a picture this big is unreadable anyway
REPL_DIAGRAM = "fdsl-diagram.svg"

_FONT = "Helvetica"
_TEXT = Style()  # the text printer's spelling of numbers, powers, eye and let names


class Html(str):
    """A DOT value written as an HTML-like label ``<...>`` instead of a quoted string."""


# ---- term graphs ---------------------------------------------------------------------------------


def _networkx():
    # imported when a diagram is drawn, not when fdsl starts: it is a third of every start-up
    import networkx

    return networkx


def term_graph(value, collapse_lets: bool = False, max_nodes: Optional[int] = None) -> nx.DiGraph:
    """The diagram of a term (or a list of terms): one node per distinct subterm."""
    roots = _roots(value)
    descend = (lambda n: n.op != "let") if collapse_lets else None
    graph = _networkx().DiGraph()
    ids: dict = {}
    for root in roots:
        for node in postorder(root, descend):
            if node in ids:
                continue
            ids[node] = "n%d" % len(ids)
            if max_nodes is not None and len(ids) > max_nodes:
                raise FdslError("this expression has more than %d distinct subterms, too many to draw; draw a "
                                "part of it (a summand x[j], a definition's body) or raise the limit "
                                "(--max-nodes)" % max_nodes)
            graph.add_node(ids[node], **_node_data(node, collapse_lets))
            if descend is not None and not descend(node):
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
    graph.graph["collapse_lets"] = collapse_lets
    _mark_clusters(graph, roots, ids)
    graph.graph["legend"] = _legend(graph, roots)
    return graph


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


_LEAVES = ("sym", "num", "eye", "zero")


def _node_data(node: Term, collapse_lets: bool) -> dict:
    op = node.op
    # leafy nodes may be drawn once per use (to_dot's split_leaves); named intermediates never are
    leafy = op in _LEAVES or (op == "t" and node.args[0].op in _LEAVES)
    data = {"op": op, "term": node, "cluster": None, "leafy": leafy}
    if op == "sym":
        symbol = node.data[0]
        data["label"] = symbol.printed()
        style = {"shape": "box", "style": "rounded"}
        if symbol.kind == "weight":
            style.update(style="rounded,filled", fillcolor=layer_colour(symbol))
        elif symbol.kind == "const":
            style.update(style="rounded,filled", fillcolor=CONST_GREY)
        data["dot"] = style
    elif op in ("num", "zero", "eye"):
        if op == "num":
            data["label"] = _TEXT.number(node.data)
        elif op == "eye":
            data["label"] = _TEXT.eye(node.data)
        else:
            data["label"] = "0 (%s x %s)" % node.data
        data["dot"] = {"shape": "box", "style": "rounded"}
    elif op == "let":
        name = _TEXT.let(*node.data)
        data["label"] = name if collapse_lets else name + " :="
        data["dot"] = {"shape": "box", "style": "filled,dashed" if collapse_lets else "filled",
                       "fillcolor": LET_FILL}
    elif op == "d":
        # differentials stand out: a double bold border, and the colour of the weight they take
        style = {"peripheries": "2", "penwidth": "1.5", "fontname": _FONT + " Bold", "style": "filled",
                 "fillcolor": "white"}
        weight = _weight_of(node.args[0])
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
    if op == "add":
        return "+"
    if op == "mul":
        return "×"
    if op == "had":
        return "∘"
    if op == "t":
        return "^t"
    if op == "pow":
        return _TEXT.power("", node.data)
    return op


def layer_colour(symbol) -> str:
    """The fill of a weight: its layer's colour (the palette repeats), or one colour if unindexed."""
    if not symbol.index:
        return NO_LAYER
    return PALETTE[symbol.index[0] % len(PALETTE)]


def _weight_of(t: Term) -> Optional[Term]:
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
            weight = _weight_of(inner.args[0]) if inner.op == "d" else None
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
    # node ids follow postorder, so reversed they list every parent before its children
    for parent in reversed(list(graph.nodes)):
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
    lines = [("%d distinct subterms (written out as a tree: %s nodes)" % (n, _count(tree)), None)]
    if len(roots) > 1:
        lines.append(("%d expressions of a list, drawn together" % len(roots), None))
    shared = sum(1 for v in graph if graph.in_degree(v) > 1)
    if shared:
        lines.append(("%d subterms occur more than once: drawn once, with an incoming edge from each use" % shared, None))
    if any(d["positions"] for _, _, d in graph.edges(data=True)):
        lines.append(("edge numbers: argument positions (a product's factors, left to right)", None))
    kinds = {}
    for _, data in graph.nodes(data=True):
        if data["op"] == "sym":
            symbol = data["term"].data[0]
            if symbol.kind == "weight":
                key = symbol.index[0] if symbol.index else -1
                kinds.setdefault(("weight", key), layer_colour(symbol))
            else:
                kinds.setdefault((symbol.kind, 0), CONST_GREY if symbol.kind == "const" else None)
        elif data["op"] in ("d", "let"):
            kinds.setdefault((data["op"], 0), None)
    layers = sorted(k for kind, k in kinds if kind == "weight" and k >= 0)
    for layer in layers[:len(PALETTE)]:
        lines.append(("weight, layer %d%s" % (layer, _repeats(layer, layers)), PALETTE[layer % len(PALETTE)]))
    if ("weight", -1) in kinds:
        lines.append(("weight without a layer index", NO_LAYER))
    if ("const", 0) in kinds:
        lines.append(("constant", CONST_GREY))
    if ("d", 0) in kinds:
        lines.append(("d: a differential (double border), filled like the weight it takes", None))
    if ("let", 0) in kinds:
        lines.append(("E: a named intermediate, its body not drawn" if graph.graph["collapse_lets"] else
                      "E := a named intermediate, with an edge to its body", LET_FILL))
    if graph.graph["clusters"]:
        lines.append(("box dW: the summands c trace(G dW) of a normal form and what only they use", None))
    return lines


def _repeats(layer, layers) -> str:
    others = [k for k in layers if k != layer and k % len(PALETTE) == layer % len(PALETTE)]
    return "" if not others else " (and %s)" % ", ".join(map(str, others[:4])) + (" ..." if len(others) > 4 else "")


def _plural(n: int, what: str, lead: str = "") -> str:
    return "%s%d %s%s" % (lead, n, what, "" if n == 1 else "s")


def _count(n: int) -> str:
    """A node count for the legend; trees can be too large for a float or for str()."""
    if n < 10 ** 9:
        return str(n)
    exponent = (n.bit_length() - 1) * 30103 // 100000  # a lower bound of log10(n)
    lead = n // 10 ** (exponent - 2)
    while lead >= 1000:
        lead //= 10
        exponent += 1
    return "%d.%02de%d" % (lead // 100, lead % 100, exponent)


# ---- deps: which weights appear in which coefficient -------------------------------------------------


def deps_graph(pairs) -> nx.DiGraph:
    """The picture of ``pairs``: a mapping from each weight W to the set of weights that appear in
    the coefficient of dW (named intermediates, ``let`` terms, may be among them). Weights on the
    left, coefficients on the right."""
    graph = _networkx().DiGraph()
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
        graph.add_node("c:" + name, label="coeff of d" + name, op="coeff", term=w, cluster="cluster_coefficients",
                       dot={"shape": "box", "style": "filled", "peripheries": "2",
                            "fillcolor": layer_colour(_weight_symbol(w))})
    for w, used in pairs.items():
        for v in sorted(used, key=_input_key):
            graph.add_edge(_input_id(v), "c:" + _weight_symbol(w).printed(), positions=[], dot={})
    layers = sorted({v.data[0].index[0] for v in order if v.op == "sym" and v.data[0].index})
    lets = sum(1 for v in order if v.op == "let")
    graph.graph["legend"] = [
        ("%d weights%s, %d coefficients, %d edges" % (len(order) - lets, _plural(lets, "named intermediate", ", ") if lets else "",
                                                       len(pairs), graph.number_of_edges()), None),
        ("an edge V -> coeff of dW: the weight V appears in the coefficient G of dW", None),
        ("(the form is the sum of trace(G dW), one summand per weight W)", None),
    ] + [("layer %d%s" % (k, _repeats(k, layers)), PALETTE[k % len(PALETTE)]) for k in layers[:len(PALETTE)]]
    if lets:
        graph.graph["legend"].append(("E: a named intermediate, taken as a known matrix", LET_FILL))
    return graph


def _input_id(v) -> str:
    return "w:" + _input_name(v)


def _input_name(v) -> str:
    if isinstance(v, Term) and v.op == "let":
        return _TEXT.let(*v.data)
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
    # the shared normal form: the same coefficients as `normal`, linear in depth (encoder(8) in
    # a fraction of a second, where the expanded form has tens of thousands of summands)
    normal = program.apply_rules("backprop", as_term(form, "the form"))
    descend = (lambda n: n.op != "let") if keep_lets else None
    pairs = {}
    for w in forms.weights(normal):
        g = forms.coeff(normal, w)
        pairs[w] = {v for v in postorder(g, descend)
                    if (v.op == "sym" and v.data[0].kind == "weight") or (keep_lets and v.op == "let")}
    return pairs


# ---- DOT -----------------------------------------------------------------------------------------


def quote(value) -> str:
    """A DOT string: in double quotes, with backslashes, quotes and newlines escaped."""
    if isinstance(value, Html):
        return "<%s>" % value
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\\n")
    return '"%s"' % text


def _attrs(attrs: dict) -> str:
    return ", ".join("%s=%s" % (key, quote(value)) for key, value in attrs.items())


def _legend_label(lines) -> Html:
    rows = []
    for text, colour in lines:
        swatch = ('<TD BGCOLOR="%s" WIDTH="16" HEIGHT="12" FIXEDSIZE="TRUE" BORDER="1"></TD>' % colour
                  if colour else "<TD></TD>")
        rows.append('<TR>%s<TD ALIGN="LEFT">%s</TD></TR>' % (swatch, html.escape(text, quote=True)))
    return Html('<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="2">%s</TABLE>' % "".join(rows))


def to_dot(graph: nx.DiGraph, name: str = "fdsl", split_leaves: bool = False) -> str:
    """The DOT text of a diagram graph (see the module docstring for the attributes it reads).

    ``split_leaves``: draw the shared nodes marked ``leafy`` (symbols, numbers, transposes of those)
    once per use, inside the user's cluster: a normal form's hundreds of edges to ``X`` and ``s``
    otherwise cross the whole picture. The graph itself is not changed."""
    split = {v for v, data in graph.nodes(data=True) if data.get("leafy") and graph.in_degree(v) > 1} \
        if split_leaves else set()
    nodes, edges = [], []  # (id, data, cluster), (tail, head, data)

    def target(v, parent_id, cluster):
        if v not in split:
            return v
        copy = "%s@%s" % (v, parent_id)  # one more drawing of v, for this use
        nodes.append((copy, graph.nodes[v], cluster))
        for c in graph.successors(v):
            edges.append((copy, target(c, copy, cluster), graph.edges[v, c]))
        return copy

    for v, data in graph.nodes(data=True):
        if v not in split:
            nodes.append((v, data, data.get("cluster")))
    for u, v, data in graph.edges(data=True):
        if u not in split:
            edges.append((u, target(v, u, graph.nodes[u].get("cluster")), data))

    attrs = {"fontname": _FONT, "fontsize": "10"}
    if len(nodes) > 150:  # bound dot's network simplex and crossing passes: minutes become seconds
        attrs.update(nslimit="2", nslimit1="2", mclimit="0.5")
    attrs.update(graph.graph.get("dot", {}))
    legend = list(graph.graph.get("legend", ()))
    if split:
        legend.append(("symbols, numbers and their transposes are drawn again at each use", None))
    if legend:
        attrs.update(label=_legend_label(legend), labelloc="b", labeljust="l")
    out = ["digraph %s {" % quote(name),
           "  graph [%s];" % _attrs(attrs),
           "  node [%s];" % _attrs({"fontname": _FONT, "fontsize": "11", "height": "0.3"}),
           "  edge [%s];" % _attrs({"fontname": _FONT, "fontsize": "9", "arrowsize": "0.6"})]

    def node_line(v, data, indent):
        node_attrs = {"label": data.get("label", v)}
        node_attrs.update(data.get("dot", {}))
        return "%s%s [%s];" % (indent, quote(v), _attrs(node_attrs))

    clusters = graph.graph.get("clusters", {})
    members: dict = {cid: [] for cid in clusters}
    for v, data, cid in nodes:
        if cid in members:
            members[cid].append((v, data))
        else:
            out.append(node_line(v, data, "  "))
    for cid, spec in clusters.items():
        if not members[cid]:
            continue
        cluster_attrs = {"label": spec["label"]}
        cluster_attrs.update(spec.get("dot", {}))
        out.append("  subgraph %s {" % quote(cid))
        out.append("    graph [%s];" % _attrs(cluster_attrs))
        out.extend(node_line(v, data, "    ") for v, data in members[cid])
        out.append("  }")
    for u, v, data in edges:
        edge_attrs = data.get("dot", {})
        out.append("  %s -> %s%s;" % (quote(u), quote(v), " [%s]" % _attrs(edge_attrs) if edge_attrs else ""))
    out.append("}")
    return "\n".join(out) + "\n"


# ---- rendering -----------------------------------------------------------------------------------




@dataclass
class Plan:
    """How a diagram will be written: the Write effect, and whether ``dot`` was missing."""

    write: Write
    fallback: bool  # dot is not installed: the effect writes the .dot text beside the requested file


def note(shown_path, nodes: int, fallback: bool) -> str:
    """'wrote e.svg (41 nodes)', or what was written instead and how to install Graphviz."""
    shown = Path(shown_path)
    if not fallback:
        return "wrote %s (%d nodes)" % (shown, nodes)
    return ("wrote %s (%d nodes) instead of %s: Graphviz's dot program is not installed; %s"
            % (shown.with_suffix(".dot"), nodes, shown, INSTALL_HINT))


def output_format(path) -> Optional[str]:
    """The ``dot -T`` format for a file name (None for .dot); an error for other extensions."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise FdslError("cannot draw to this file: the extension chooses the format, one of %s"
                        % " ".join(FORMATS), file=str(path))
    return FORMATS[suffix]


def plan(dot_text: str, path) -> Plan:
    """The effect that renders ``dot_text`` to ``path`` atomically (without ``dot``: its .dot)."""
    path = Path(path)
    fmt = output_format(path)
    if fmt is None:
        return Plan(Write(path, lambda tmp: tmp.write_text(dot_text, encoding="utf-8")), False)
    exe = shutil.which("dot")
    if exe is None:
        target = path.with_suffix(".dot")
        return Plan(Write(target, lambda tmp: tmp.write_text(dot_text, encoding="utf-8")), True)

    def run_dot(tmp: Path):
        try:
            done = subprocess.run([exe, "-T" + fmt, "-o", str(tmp)], input=dot_text.encode("utf-8"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as e:
            raise FdslError("cannot run %s: %s" % (exe, e.strerror or e)) from None
        if done.returncode != 0:
            message = done.stderr.decode("utf-8", "replace").strip()
            raise FdslError("Graphviz's dot could not draw %s: %s" % (path, message or "exit code %d" % done.returncode))

    return Plan(Write(path, run_dot), False)


@dataclass
class Rendered:
    path: Path  # the file written
    fallback: bool  # dot was missing: path is the .dot file beside the requested one


def render(dot_text: str, path) -> Rendered:
    """Write ``dot_text`` as the file ``path`` (.svg .png .pdf through ``dot``; .dot as is)."""
    p = plan(dot_text, path)
    p.write.perform(None, None)
    return Rendered(p.write.path, p.fallback)


# ---- the language, the repl and the command line ---------------------------------------------------


class DiagramNote(str):
    """What ``diagram(E, "e.svg")`` evaluates to: the note ``show`` prints."""

    def show(self) -> str:
        return str(self)


@function('diagram(E, "file.svg")', "draw E's term graph to a file (.svg .png .pdf via Graphviz, or .dot), "
          "written once the program has run without error")
def _diagram(program, value, path):
    if not isinstance(path, str):
        raise FdslError('the file of a diagram must be a string in quotes, like "e.svg", not %s' % describe(path))
    graph = term_graph(value, max_nodes=DEFAULT_MAX_NODES)
    p = plan(to_dot(graph), program.resolve_path(path))
    program.effects.append(p.write)  # performed by Program.run, so a failing program writes nothing
    return DiagramNote(note(path, graph.number_of_nodes(), p.fallback))


def diagram_command(program, expr_text: str, path=None) -> str:
    """The repl's ``:diagram EXPR``: draw the expression, return a note with the file's path."""
    value = program.expr(expr_text)
    graph = term_graph(value, max_nodes=DEFAULT_MAX_NODES)
    target = Path(path) if path is not None else Path.cwd() / REPL_DIAGRAM
    done = render(to_dot(graph), target)
    return note(target, graph.number_of_nodes(), done.fallback)


def _load(args):
    from ..program import load

    output_format(args.output)  # a bad extension or target fails before the program is elaborated
    target_of(args.output)
    return load(args.file, rules=args.rules or ())


def _report(done: Rendered, requested, nodes: int) -> int:
    import sys

    print("wrote %s (%d nodes)" % (done.path, nodes))
    if done.fallback:  # still a success: the .dot file is the diagram, waiting for Graphviz
        print("note: %s was not rendered: Graphviz's dot program is not installed; %s"
              % (requested, INSTALL_HINT), file=sys.stderr)
    return 0


def _cmd_diagram(args) -> int:
    program = _load(args)
    value = program.expr(args.expr)
    try:
        graph = term_graph(value, collapse_lets=args.collapse_lets, max_nodes=args.max_nodes)
    except FdslError as e:
        e.file = e.file or "--expr %s" % args.expr
        raise
    return _report(render(to_dot(graph, split_leaves=args.split_leaves), args.output), args.output,
                   graph.number_of_nodes())


def _cmd_deps(args) -> int:
    program = _load(args)
    graph = deps_graph(deps_pairs(program, program.expr(args.form), keep_lets=args.keep_lets))
    return _report(render(to_dot(graph), args.output), args.output, graph.number_of_nodes())


@subcommand
def _register(sub):
    p = sub.add_parser("diagram", help="draw a term graph with Graphviz (.svg .png .pdf, or .dot)")
    p.add_argument("file", help=FILE_HELP)
    p.add_argument("--expr", required=True, metavar="NAME",
                   help="a definition's name or any expression, e.g. E or 'form(encoder(2))'")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="out.svg, out.png, out.pdf or out.dot")
    p.add_argument("--rules", action="append", metavar="FILE", help="load a rule file first (repeatable)")
    p.add_argument("--collapse-lets", action="store_true", help="draw named intermediates (E := ...) as leaves")
    p.add_argument("--split-leaves", action="store_true",
                   help="draw symbols and numbers again at each use (big normal forms read better)")
    p.add_argument("--max-nodes", type=int, default=DEFAULT_MAX_NODES, metavar="N",
                   help="refuse to draw more distinct subterms than this (default %d)" % DEFAULT_MAX_NODES)
    p.set_defaults(func=_cmd_diagram)

    q = sub.add_parser("deps", help="draw which weights appear in the coefficient of each dW of a form")
    q.add_argument("file", help=FILE_HELP)
    q.add_argument("--form", required=True, metavar="NAME",
                   help="a 1-form: a definition's name or an expression, e.g. 'form(encoder(8))'")
    q.add_argument("-o", "--output", required=True, metavar="OUT", help="deps.svg, .png, .pdf or .dot")
    q.add_argument("--rules", action="append", metavar="FILE", help="load a rule file first (repeatable)")
    q.add_argument("--keep-lets", action="store_true",
                   help="take named intermediates (E := ...) as known matrices instead of looking inside them")
    q.set_defaults(func=_cmd_deps)
