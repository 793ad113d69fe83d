"""``fdsl train FILE --form w --steps N --lr LR``: follow the flow of a 1-form with its symbolic
gradients, watching what is asked for; the trained values, a log and a plot written all or nothing."""

from __future__ import annotations

import sys
from pathlib import Path

from ..base.errors import FdslError, say
from .common import FILE_HELP, add_value_options, load_with_values


def _cmd_train(args) -> int:

    from ..base.files import Write, perform_all, target_of
    from ..learn.train import Trainer, _check_schedule, _summary
    from ..learn.watch import csv_write, plot_write, require_matplotlib, watch_terms
    from ..numbers.values import npz_writer

    for path in (args.out, args.log, args.plot):
        if path is not None:
            target_of(path)  # a path that cannot be written fails before the work
    if args.plot is not None:
        require_matplotlib()
    from ..codegen.grads import check_given, form_named

    every = _check_schedule(args.steps, args.lr, args.every)
    program = load_with_values(args)
    w = form_named(program, args.form)
    trainer = Trainer(program, w, args.form, watch_terms(program, args.watch or ()))
    check_given(program, trainer.terms, args.values, drawn=args.random is not None)
    if not trainer.dual.euclidean:
        say("metric: %s" % trainer.dual.describe())

    def report(step, loss):
        say(trainer.line(step, loss))
        sys.stdout.flush()

    try:
        curve = trainer.run(args.steps, args.lr, every, report)
    except FdslError as e:
        e.file = e.file or args.file
        raise
    say(_summary(trainer, curve, args.steps, args.lr))
    effects = []
    if args.out:
        values = dict(trainer.values)
        effects.append(Write(Path(args.out), npz_writer(values),
                             "wrote %s: %d arrays (the trained weights %s and the constants)"
                             % (args.out, len(values), ", ".join(trainer.weights))))
    if args.log:
        effects.append(Write(Path(args.log), csv_write([trainer.log]), "wrote %s: %d steps of %s"
                             % (args.log, len(trainer.log.rows), ", ".join(trainer.log.columns[1:]))))
    if args.plot:
        title = "%s of %s, lr %g" % (args.form, Path(args.file).name, args.lr)
        effects.append(Write(Path(args.plot), plot_write([trainer.log], title), "wrote %s" % args.plot))
    perform_all(effects, sys.stdout, program)  # all the files or none
    return 0


def register(sub):
    p = sub.add_parser("train", help="follow the flow of a 1-form (under the file's metric; Euclidean: gradient "
                       "descent) with its symbolic gradients, watching what you ask for")
    p.add_argument("file", help=FILE_HELP)
    p.add_argument("--form", required=True, metavar="NAME", help="the 1-form, e.g. a definition w = form(E): "
                   "each step moves W by lr flow(w, W), which for form(E) descends 1/2 ||E||^2")
    p.add_argument("--steps", type=int, required=True, metavar="N", help="number of steps")
    p.add_argument("--lr", type=float, required=True, metavar="LR", help="learning rate")
    p.add_argument("--every", type=int, metavar="K", help="print the loss every K steps (default steps/10)")
    p.add_argument("--watch", action="append", metavar="EXPR", help="record the Frobenius norm (a scalar: "
                   "its value) of EXPR at every step, e.g. 'coeff(w, K[1])' or a weight (repeatable)")
    p.add_argument("--log", metavar="FILE.csv", help="write the loss and every watched quantity, per step")
    p.add_argument("--plot", metavar="FILE.png", help="draw the loss and the watched quantities (needs "
                   "matplotlib: pip install 'fdsl[plot]')")
    p.add_argument("--out", metavar="FINAL.npz", help="write the trained values (usable as --values)")
    add_value_options(p)
    p.set_defaults(func=_cmd_train)
