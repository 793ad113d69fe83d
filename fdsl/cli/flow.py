"""``fdsl flow FILE --form w (--values IN.npz | --random SEED) --out OUT.npz``: the flow of a
1-form (its dual under the program's metric) for every weight."""

from __future__ import annotations

import sys
from pathlib import Path

from ..base.errors import FdslError, say
from .common import FILE_HELP, add_value_options, load_with_values


def _cmd_flow(args) -> int:

    from ..base.files import Write, perform_all
    from ..codegen.grads import check_given, coefficients, form_named, no_weight
    from ..learn.flow import _gauss_newton_specs, flows_of
    from ..numbers.values import npz_writer

    program = load_with_values(args)
    w = form_named(program, args.form)
    coeffs = coefficients(program, w, args.form)
    if not coeffs:
        raise no_weight(program, args.form)
    dual_terms = list(coeffs.values()) + [spec.error for spec in _gauss_newton_specs(program, coeffs)]
    check_given(program, dual_terms, args.values, drawn=args.random is not None)
    flows = flows_of(program, w, what=args.form)
    out = Path(args.out)
    note = "wrote %s: %d flow%s (%s)" % (args.out, len(flows), "" if len(flows) == 1 else "s", ", ".join(flows))
    try:
        perform_all([Write(out, npz_writer(dict(flows)), note)], sys.stdout, program)
    except OSError as e:
        raise FdslError("cannot write the flows: %s" % (e.strerror or e), file=str(out)) from None
    for line in flows.notes():
        say(line)
    return 0


def register(sub):
    p = sub.add_parser("flow", help="write the flow of a 1-form (its dual under the program's metric) for every "
                       "weight to an .npz file")
    p.add_argument("file", help=FILE_HELP)
    p.add_argument("--form", required=True, metavar="NAME", help="the 1-form: a definition (w = form(E)) or an "
                   "expression; its flow under the metric statements of the file (Euclidean: grad)")
    p.add_argument("--out", required=True, metavar="OUT.npz", help="where to write one array per weight")
    add_value_options(p)
    p.set_defaults(func=_cmd_flow)
