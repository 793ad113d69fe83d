"""Diagrams drawn by Graphviz: term graphs and dependency views as SVG, PNG or PDF, in files and
inline in notebooks, through the ``graphviz`` Python package.

Vocabulary
----------
model        the networkx graph of what is drawn (``fdsl.pictures.termgraph`` for terms,
             ``fdsl.pictures.depsview`` for the dependency views); this module lays it out.
digraph      the ``graphviz.Digraph`` made from a model (``to_digraph``): the package writes the
             DOT text (quoting, escaping, HTML-like legend tables) and runs ``dot``.
size check   before any layout, a model's nodes and edges are counted against ``max_nodes`` and
             ``max_edges`` (``check_size``): ``dot`` takes minutes on a few hundred densely
             connected nodes, and such a picture is unreadable anyway, so it is refused at once,
             with advice, instead of after a long silence. Layouts that still take more than a few
             seconds say so on stderr (``fdsl.base.progress``).
Diagram      what ``fdsl.diagram(E)`` and ``Term.diagram()`` return: the laid-out picture, shown
             inline by Jupyter (``_repr_svg_``/``_repr_mimebundle_``) and saved with ``save``.
fallback     without Graphviz's ``dot`` program, a requested .svg/.png/.pdf is written as the .dot
             text beside it, with a note saying how to install Graphviz.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Optional

from ..base.errors import FdslError
from ..base.files import Write, target_of
from ..base.limits import DEFAULT_MAX_EDGES, DEFAULT_MAX_NODES
from ..base.progress import slow
from ..calculus.forms import coeff, normal_terms
from ..core.functions import as_term, describe, function
from ..core.terms import Term
from .depsview import path_view
from .termgraph import term_graph

FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".dot": None}  # extension -> dot -T format
INSTALL_HINT = ("install Graphviz to render it: apt-get install graphviz (Debian/Ubuntu) "
                "or brew install graphviz (macOS)")
REPL_DIAGRAM = "fdsl-diagram.svg"

_FONT = "Helvetica"


# ---- the size check --------------------------------------------------------------------------------


def check_size(graph, max_nodes: Optional[int] = DEFAULT_MAX_NODES,
               max_edges: Optional[int] = DEFAULT_MAX_EDGES) -> None:
    """Refuse a model too big to lay out, before ``dot`` is started."""
    nodes, edges = graph.number_of_nodes(), graph.number_of_edges()
    if max_nodes is not None and nodes > max_nodes:
        from .termgraph import too_big

        raise too_big(max_nodes, any(d.get("op") == "let" for _, d in graph.nodes(data=True)))
    if max_edges is not None and edges > max_edges:
        raise FdslError("this picture would have %d edges between %d boxes, more than %d: Graphviz would take "
                        "minutes and the lines would cross into a tangle; draw a part of it (one coefficient "
                        "coeff(w, W), or fdsl deps --weight V --coeff W for one question), or raise the limit "
                        "(--max-edges)" % (edges, nodes, max_edges))


# ---- the digraph -------------------------------------------------------------------------------------


def _plain(text) -> str:
    """A label the package passes to dot as plain text: backslashes and <...> lose their meaning."""
    import graphviz

    return graphviz.escape(str(text)).replace("\n", "\\n")


def _id(v) -> str:
    # the package reads "a:b" in an edge as node a, port b; model ids are only names
    return str(v).replace(":", "%3A")


def _attrs(attrs: dict) -> dict:
    return {k: (_plain(v) if k in ("label", "xlabel", "tooltip") else str(v)) for k, v in attrs.items()}


def _table(lines, title: Optional[str] = None) -> str:
    """An HTML-like label: the title in bold, then the legend lines with their colour swatches."""
    rows = []
    if title:
        rows.append('<TR><TD COLSPAN="2" ALIGN="LEFT"><B>%s</B></TD></TR>' % html.escape(title, quote=True))
    for text, colour in lines:
        swatch = ('<TD BGCOLOR="%s" WIDTH="16" HEIGHT="12" FIXEDSIZE="TRUE" BORDER="1"></TD>' % colour
                  if colour else "<TD></TD>")
        rows.append('<TR>%s<TD ALIGN="LEFT">%s</TD></TR>' % (swatch, html.escape(text, quote=True)))
    return '<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="2">%s</TABLE>>' % "".join(rows)


def to_digraph(graph, name: str = "fdsl", split_leaves: bool = False, title: Optional[str] = None):
    """The ``graphviz.Digraph`` of a model (see ``fdsl.pictures.termgraph`` for what it reads).

    ``split_leaves``: draw the shared nodes marked ``leafy`` (symbols, numbers, transposes of those)
    once per use, inside the user's cluster: a normal form's hundreds of edges to ``X`` and ``s``
    otherwise cross the whole picture. The model itself is not changed."""
    import graphviz

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
    title = title or graph.graph.get("title")
    dot = graphviz.Digraph(name, graph_attr=_attrs(attrs),
                           node_attr={"fontname": _FONT, "fontsize": "11", "height": "0.3"},
                           edge_attr={"fontname": _FONT, "fontsize": "9", "arrowsize": "0.6"})
    if legend or title:
        # the title on top, the legend below: two labels would need two graphs, so the title
        # leads the legend's table when both are there, and the table goes on top
        dot.attr(label=_table(legend, title), labelloc="t" if title else "b", labeljust="l")

    def add_node(where, v, data):
        node_attrs = {"label": data.get("label", v)}
        node_attrs.update(data.get("dot", {}))
        where.node(_id(v), **_attrs(node_attrs))

    clusters = graph.graph.get("clusters", {})
    members: dict = {cid: [] for cid in clusters}
    for v, data, cid in nodes:
        if cid in members:
            members[cid].append((v, data))
        else:
            add_node(dot, v, data)
    for cid, spec in clusters.items():
        if not members[cid]:
            continue
        with dot.subgraph(name=cid) as sub:
            cluster_attrs = {"label": spec["label"]}
            cluster_attrs.update(spec.get("dot", {}))
            sub.attr(**_attrs(cluster_attrs))
            for v, data in members[cid]:
                add_node(sub, v, data)
    for u, v, data in edges:
        dot.edge(_id(u), _id(v), **_attrs(data.get("dot", {})))
    return dot


def to_dot(graph, name: str = "fdsl", split_leaves: bool = False, title: Optional[str] = None) -> str:
    """The DOT text of a model."""
    return to_digraph(graph, name, split_leaves, title).source


# ---- rendering -----------------------------------------------------------------------------------


def output_format(path) -> Optional[str]:
    """The ``dot -T`` format for a file name (None for .dot); an error for other extensions."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise FdslError("cannot draw to this file: the extension chooses the format, one of %s"
                        % " ".join(FORMATS), file=str(path))
    return FORMATS[suffix]


class NoDot(Exception):
    """Graphviz's dot program is not installed."""


def layout(digraph, fmt: str, what: str = "the picture") -> bytes:
    """Run dot on a digraph: the bytes of the picture in ``fmt`` (svg, png, pdf)."""
    import graphviz

    try:
        with slow("Graphviz is laying out %s" % what):
            return digraph.pipe(format=fmt, quiet=True)
    except graphviz.ExecutableNotFound:
        raise NoDot() from None
    except graphviz.CalledProcessError as e:
        message = ((e.stderr or b"").decode("utf-8", "replace").strip() if isinstance(e.stderr, bytes)
                   else str(e.stderr or ""))
        raise FdslError("Graphviz's dot could not draw %s: %s"
                        % (what, message or "exit code %d" % e.returncode)) from None


class Diagram:
    """A picture of a model, laid out by Graphviz when first shown or saved.

    In a notebook it displays inline as SVG; ``save("e.png")`` writes a file (the extension picks
    the format); ``source`` is the DOT text; ``nodes`` and ``edges`` count what is drawn."""

    def __init__(self, graph, split_leaves: bool = False, title: Optional[str] = None,
                 max_nodes: Optional[int] = DEFAULT_MAX_NODES, max_edges: Optional[int] = DEFAULT_MAX_EDGES):
        check_size(graph, max_nodes, max_edges)
        self.graph = graph
        self.nodes, self.edges = graph.number_of_nodes(), graph.number_of_edges()
        self.digraph = to_digraph(graph, split_leaves=split_leaves, title=title)
        self._svg: Optional[str] = None

    @property
    def source(self) -> str:
        return self.digraph.source

    def what(self) -> str:
        return "%d boxes and %d edges" % (self.nodes, self.edges)

    def svg(self) -> str:
        """The picture as SVG text (laid out once)."""
        if self._svg is None:
            try:
                self._svg = layout(self.digraph, "svg", self.what()).decode("utf-8")
            except NoDot:
                raise FdslError("Graphviz's dot program is not installed; %s" % INSTALL_HINT) from None
        return self._svg

    def _repr_svg_(self):
        return self.svg()

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"image/svg+xml": self.svg(), "text/plain": repr(self)}
        return {k: v for k, v in bundle.items() if (not include or k in include) and (not exclude or k not in exclude)}

    def __repr__(self):
        return "<fdsl diagram: %s>" % self.what()

    def plan(self, path) -> tuple:
        """The Write that puts this picture in ``path`` atomically, and whether dot was missing (then
        the .dot text is written beside ``path`` instead)."""
        path = Path(path)
        fmt = output_format(path)
        source = self.source
        if fmt is None:
            return Write(path, lambda tmp: tmp.write_text(source, encoding="utf-8")), False
        import shutil

        if shutil.which("dot") is None:
            return Write(path.with_suffix(".dot"), lambda tmp: tmp.write_text(source, encoding="utf-8")), True

        def draw(tmp: Path):
            try:
                data = self.svg().encode("utf-8") if fmt == "svg" else layout(self.digraph, fmt, self.what())
            except NoDot:  # removed between the check and the run
                raise FdslError("Graphviz's dot program is not installed; %s" % INSTALL_HINT) from None
            tmp.write_bytes(data)

        return Write(path, draw), False

    def save(self, path) -> "Rendered":
        """Write the picture to ``path`` (.svg .png .pdf through dot; .dot as is)."""
        write, fallback = self.plan(path)
        write.perform(None, None)
        return Rendered(write.path, fallback)


class Rendered:
    def __init__(self, path: Path, fallback: bool):
        self.path = path  # the file written
        self.fallback = fallback  # dot was missing: path is the .dot file beside the requested one


def diagram(value, expand="auto", split_leaves: bool = False, title: Optional[str] = None,
            max_nodes: Optional[int] = DEFAULT_MAX_NODES, max_edges: Optional[int] = DEFAULT_MAX_EDGES) -> Diagram:
    """The picture of a term (or a list of terms); ``expand``: "auto", "all", or names to draw the
    definitions of (``["X_5", "G_6"]``); other named intermediates are boxes."""
    if isinstance(expand, str) and expand not in ("auto", "all"):
        expand = [expand]
    graph = term_graph(value, expand=expand, max_nodes=max_nodes)
    return Diagram(graph, split_leaves=split_leaves, title=title, max_nodes=max_nodes, max_edges=max_edges)


def render(dot_text: str, path) -> Rendered:
    """Write DOT text as the file ``path`` (.svg .png .pdf through dot; .dot as is)."""
    import graphviz

    source = graphviz.Source(dot_text)
    fmt = output_format(path)
    path = Path(path)

    def write_text(tmp):
        tmp.write_text(dot_text, encoding="utf-8")

    if fmt is None:
        Write(path, write_text).perform(None, None)
        return Rendered(path, False)
    try:
        data = layout(source, fmt, str(path))
    except NoDot:
        Write(path.with_suffix(".dot"), write_text).perform(None, None)
        return Rendered(path.with_suffix(".dot"), True)
    Write(path, lambda tmp: tmp.write_bytes(data)).perform(None, None)
    return Rendered(path, False)


def note(shown_path, nodes: int, fallback: bool) -> str:
    """'wrote e.svg (41 nodes)', or what was written instead and how to install Graphviz."""
    shown = Path(shown_path)
    if not fallback:
        return "wrote %s (%d nodes)" % (shown, nodes)
    return ("wrote %s (%d nodes) instead of %s: Graphviz's dot program is not installed; %s"
            % (shown.with_suffix(".dot"), nodes, shown, INSTALL_HINT))


# ---- the notebook: fdsl.diagram and fdsl.deps, Term.diagram, Program.diagram and Program.deps ------


def notebook_diagram(value, expand="auto", split_leaves: bool = False, title=None, max_nodes=None,
                     max_edges=None) -> Diagram:
    """``diagram`` with the default limits where ``max_nodes`` or ``max_edges`` is None."""
    return diagram(value, expand=expand, split_leaves=split_leaves, title=title,
                   max_nodes=DEFAULT_MAX_NODES if max_nodes is None else max_nodes,
                   max_edges=DEFAULT_MAX_EDGES if max_edges is None else max_edges)


def notebook_deps(w, weight, of) -> Diagram:
    """The picture of "does the coefficient of d(of) in the normal form w involve weight?"."""
    w = as_term(w, "w")
    normal_terms(w)  # an error unless w is a normal form
    if not (isinstance(of, Term) and of.op == "sym" and of.data[0].kind == "weight"):
        raise FdslError("the coefficient is named by its weight, like K[5], not %s" % of)
    return Diagram(path_view(coeff(w, of), weight, of))


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
    output_format(path)
    picture = diagram(value)
    target = program.output_path(path)
    target_of(target)  # checked now, so the message points at the call
    write, fallback = picture.plan(target)
    program.effects.append(write)  # performed by Program.run, so a failing program writes nothing
    return DiagramNote(note(path, picture.nodes, fallback))


def diagram_command(program, expr_text: str, path=None) -> str:
    """The repl's ``:diagram EXPR``: draw the expression, return a note with the file's path."""
    picture = diagram(program.expr(expr_text), title=expr_text)
    target = Path(path) if path is not None else Path.cwd() / REPL_DIAGRAM
    done = picture.save(target)
    return note(target, picture.nodes, done.fallback)
