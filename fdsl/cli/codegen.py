"""``fdsl codegen FILE --form w -o grads.py``: a standalone numpy or torch module computing every
gradient of a 1-form."""

from __future__ import annotations

import sys
from pathlib import Path

from ..base.errors import FdslError, say
from .common import FILE_HELP, add_limit_options, add_rules_options, set_limits

# the names of fdsl.codegen.targets.TARGETS and DTYPES, written out so that building the parser
# imports no numpy (tests/test_architecture.py holds them equal)
TARGETS = ("numpy", "torch")
DTYPES = ("float32", "float64")


def _cmd_codegen(args) -> int:
    from ..base.files import Write, perform_all, target_of
    from ..calculus import forms
    from ..calculus.gradients import loss_of, no_loss_note
    from ..codegen.generated import gradient_terms, gradients_source
    from ..codegen.grads import form_named, no_weight
    from ..lang.program import load

    target_of(args.output)  # a path that cannot be written fails before the work
    program = load(args.file, rules=args.rules or (), setup=lambda p: set_limits(p, args), unchecked=args.unchecked)
    name = args.form
    w = normal_form_of(program, form_named(program, name), name)
    if not forms.normal_terms(w):
        raise no_weight(program, name)
    origin = "form %s of %s" % (name, args.file)
    loss = loss_of(form_named(program, name))  # form(E): 1/2 ||E||^2; -d(L): L
    source = gradients_source(w, program.dims, origin, args.target, args.dtype, loss)
    count = len(gradient_terms(w))
    made = "grads(values)" + (", grads_and_loss(values)" if loss is not None else "")
    if args.target == "torch" and loss is not None:
        made += ", loss(values), FdslLoss and Model"
    note = "wrote %s: %s for %d weight%s" % (args.output, made, count, "" if count == 1 else "s")
    perform_all([Write(Path(args.output), lambda tmp: tmp.write_text(source), note)], sys.stdout, program)
    if loss is None:
        say("note: %s; the module has grads(values) only%s" % (
            no_loss_note(name), ", no loss, FdslLoss or Model" if args.target == "torch" else ""))
    return 0


def normal_form_of(program, value, name: str):
    """The value of ``--form NAME`` as a normal form: as it is when it already is one, else through
    the strategy ``backprop`` (the shared normal form: generated code stays linear in depth)."""
    from ..core.terms import Term

    if not isinstance(value, Term) or not value.scalar or not value.has_d:
        raise FdslError("%s is not a scalar 1-form (write e.g. w = form(E) in the file)" % name, file="--form")
    return program.normal_form(value)


def register(sub):
    p = sub.add_parser("codegen", help="write a standalone numpy (or torch) module computing every gradient "
                                       "of a 1-form")
    p.add_argument("file", help=FILE_HELP)
    p.add_argument("--form", required=True, metavar="NAME", help="the 1-form: a definition (w = form(E)) or an "
                   "expression; normalised with backprop unless it already is a normal form")
    p.add_argument("-o", "--output", required=True, metavar="grads.py", help="where to write the module")
    add_rules_options(p, "load a rule file first (repeatable)")
    p.add_argument("--target", choices=TARGETS, default="numpy", help="the library the module computes "
                   "with (default numpy; torch: plain torch functions, an autograd Function and a Module)")
    p.add_argument("--dtype", choices=DTYPES, help="compute in this dtype whatever the inputs' (default: the "
                   "inputs' dtype: numpy float32 when every input is float32, else float64; torch the dtype its "
                   "tensors share, bfloat16 too, else their promotion; under torch.autocast the products in "
                   "autocast's dtype, the rest float32)")
    add_limit_options(p)
    p.set_defaults(func=_cmd_codegen)
