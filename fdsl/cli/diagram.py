"""``fdsl diagram FILE --expr E -o OUT`` and ``fdsl deps FILE --form w -o OUT``: pictures of terms
and of which weights reach which coefficient, drawn with Graphviz."""

from __future__ import annotations

import sys

from ..base.errors import FdslError, say
from ..base.limits import DEFAULT_MAX_EDGES, DEFAULT_MAX_NODES
from ..base.progress import slow
from .common import FILE_HELP, add_rules_options


def _load(args):
    from ..base.files import target_of
    from ..lang.program import load
    from ..pictures.graphviz import output_format

    output_format(args.output)  # a bad extension or target fails before the program is elaborated
    target_of(args.output)
    with slow("reading %s (its definitions are worked out as they are read)" % args.file):
        return load(args.file, rules=args.rules or (), unchecked=args.unchecked)


def _report(done, requested, nodes: int) -> int:
    from ..pictures.graphviz import INSTALL_HINT

    say("wrote %s (%d nodes)" % (done.path, nodes))
    if done.fallback:  # still a success: the .dot file is the diagram, waiting for Graphviz
        say("note: %s was not rendered: Graphviz's dot program is not installed; %s" % (requested, INSTALL_HINT),
            sys.stderr)
    return 0


def _expr(program, text: str, flag: str):
    try:
        with slow("evaluating %s %s" % (flag, text)):
            return program.expr(text)
    except FdslError as e:
        e.file = e.file or "%s %s" % (flag, text)
        raise


def _cmd_diagram(args) -> int:
    from ..pictures.graphviz import diagram

    program = _load(args)
    value = _expr(program, args.expr, "--expr")
    expand = "all" if "all" in (args.expand or ()) else (args.expand or "auto")
    try:
        picture = diagram(value, expand=expand, split_leaves=args.split_leaves, title=args.expr,
                          max_nodes=args.max_nodes, max_edges=args.max_edges)
    except FdslError as e:
        e.file = e.file or "--expr %s" % args.expr
        raise
    return _report(picture.save(args.output), args.output, picture.nodes)


def _cmd_deps(args) -> int:
    from ..core.functions import as_term, describe
    from ..pictures import depsview
    from ..pictures.graphviz import Diagram

    program = _load(args)
    form = _expr(program, args.form, "--form")
    if (args.weight is None) != (args.coeff is None):
        raise FdslError("--weight and --coeff go together: fdsl deps FILE --form w --weight 'Q[3]' --coeff 'K[5]' "
                        "asks whether Q_3 occurs in the coefficient of dK_5")
    with slow("finding the normal form of --form %s" % args.form):
        normal = program.normal_form(as_term(form, "the form"))
    if args.weight is not None:
        from ..calculus import forms

        weight, of = _expr(program, args.weight, "--weight"), _expr(program, args.coeff, "--coeff")
        if not (hasattr(of, "op") and of.op == "sym" and of.data[0].kind == "weight"):
            raise FdslError("--coeff %s: expected a weight, like 'K[5]', not %s" % (args.coeff, describe(of)))
        graph = depsview.path_view(forms.coeff(normal, of), weight, of)
    else:
        graph = depsview.deps_graph(depsview.deps_pairs(program, normal, keep_lets=args.keep_lets))
    try:
        picture = Diagram(graph, max_nodes=args.max_nodes, max_edges=args.max_edges)
    except FdslError as e:  # too big: say which picture, as fdsl diagram names its --expr
        e.file = e.file or "--form %s" % args.form
        raise
    return _report(picture.save(args.output), args.output, picture.nodes)


def _limits(p):
    p.add_argument("--max-nodes", type=int, default=DEFAULT_MAX_NODES, metavar="N",
                   help="refuse, before any layout, a picture of more boxes than this (default %d)" % DEFAULT_MAX_NODES)
    p.add_argument("--max-edges", type=int, default=DEFAULT_MAX_EDGES, metavar="N",
                   help="refuse, before any layout, a picture of more edges than this (default %d)" % DEFAULT_MAX_EDGES)


def register(sub):
    p = sub.add_parser("diagram", help="draw a term graph with Graphviz (.svg .png .pdf, or .dot)")
    p.add_argument("file", help=FILE_HELP)
    p.add_argument("--expr", required=True, metavar="NAME",
                   help="a definition's name or any expression, e.g. E or 'coeff(w, K[5])'")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="out.svg, out.png, out.pdf or out.dot")
    add_rules_options(p, "load a rule file first (repeatable)")
    p.add_argument("--expand", action="append", metavar="NAME",
                   help="draw the definition of this named intermediate (X_5, G_6; repeatable; 'all' for every "
                        "one); by default all are drawn when the picture is small, else they are boxes")
    p.add_argument("--split-leaves", action="store_true",
                   help="draw symbols and numbers again at each use (big normal forms read better)")
    _limits(p)
    p.set_defaults(func=_cmd_diagram)

    q = sub.add_parser("deps", help="draw which weights reach which coefficient, or how one weight reaches one")
    q.add_argument("file", help=FILE_HELP)
    q.add_argument("--form", required=True, metavar="NAME",
                   help="a 1-form: a definition's name or an expression, e.g. w or 'form(E)'")
    q.add_argument("-o", "--output", required=True, metavar="OUT", help="deps.svg, .png, .pdf or .dot")
    q.add_argument("--weight", metavar="V", help="with --coeff: draw every way the weight V (e.g. 'Q[3]') reaches ...")
    q.add_argument("--coeff", metavar="W", help="... the coefficient of dW (e.g. 'K[5]'), through named intermediates")
    add_rules_options(q, "load a rule file first (repeatable)")
    q.add_argument("--keep-lets", action="store_true",
                   help="take named intermediates (E := ...) as known matrices instead of looking inside them")
    _limits(q)
    q.set_defaults(func=_cmd_deps)
