"""``fdsl grad FILE --form w (--values IN.npz | --random SEED) --out OUT.npz``: the gradient of a
1-form for every weight, written to an .npz file."""

from __future__ import annotations

import sys
from pathlib import Path

from .common import FILE_HELP, add_value_options, load_with_values


def _cmd_grad(args) -> int:
    import numpy as np

    from ..base.files import Write, perform_all, target_of
    from ..codegen.grads import (
        SIGN_KEY,
        check_given,
        coefficients,
        form_named,
        gradients,
        no_weight,
        normal_form,
        sign_of,
    )
    from ..numbers.values import npz_writer

    target_of(args.out)  # a path that cannot be written fails before the work
    program = load_with_values(args)
    w = form_named(program, args.form)
    coeffs = coefficients(program, w, args.form)
    if not coeffs:
        raise no_weight(program, args.form)
    check_given(program, coeffs.values(), args.values, drawn=args.random is not None)
    grads = gradients(program, normal_form(program, w, args.form), what=args.form)
    if args.dl_dw:
        grads = {name: -g for name, g in grads.items()}
    sign = sign_of(w, args.dl_dw)
    note = ("wrote %s: %d gradient%s (%s), each %s (the file's %s says so too)"
            % (args.out, len(grads), "" if len(grads) == 1 else "s", ", ".join(grads), sign, SIGN_KEY))
    perform_all([Write(Path(args.out), npz_writer({**grads, SIGN_KEY: np.array(sign)}), note)], sys.stdout, program)
    return 0


def register(sub):
    p = sub.add_parser("grad", help="write the gradient of a 1-form for every weight to an .npz file")
    p.add_argument("file", help=FILE_HELP)
    p.add_argument("--form", required=True, metavar="NAME", help="the 1-form: a definition (w = form(E)) "
                   "or an expression; grad(form(E), W) = -dL/dW for L = 1/2 ||E||^2")
    p.add_argument("--out", required=True, metavar="OUT.npz", help="where to write one array per weight (and "
                   "_sign, a string saying which sign they hold)")
    p.add_argument("--dl-dw", action="store_true", help="write +dL/dW, PyTorch's convention (W -= lr g descends), "
                   "instead of -dL/dW, the descent direction (W += lr g descends)")
    add_value_options(p)
    p.set_defaults(func=_cmd_grad)
