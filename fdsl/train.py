"""Training with the symbolic gradients: plain gradient descent along the dual of a 1-form.

Vocabulary
----------
flow     ``W <- W + lr grad(w, W)`` for every weight W of the 1-form w (``grad`` as in
         ``fdsl.backends.numpy_grad``: the dual of w under the Euclidean metric). For
         ``w = form(E) = -dL``, ``L = 1/2 ||E||^2``, ``grad(w, W) = -dL/dW``: the flow is gradient
         descent on L, the manual's negative Euler flow pulled back to the weights.
loss     ``L = 1/2 ||E||^2`` when w is ``form(E)`` (recognised as the term ``-trace(E^t d(E))``); for
         any other 1-form the size of its gradient, ``|grad| = sqrt(sum_W ||grad(w, W)||^2)``.
step     one call of the generated code of the normal form (computed and lowered once, before
         the first step; the same code as ``grad(w)`` and ``fdsl grad``) and one evaluation of E
         for the loss, then the update of every weight.

Two surfaces: ``train(w, steps, lr, every?)`` in a program (``fdsl run examples/train.fd``), which
trains the program's own values, so later ``eval``/``save``/``grad`` see the trained weights; and
``fdsl train FILE --form NAME --steps N --lr LR (--random SEED | --values F.npz)``, under which
``train(...)`` calls inside the file are skipped (the command line decides the training).
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Optional

import numpy as np

from . import forms
from . import terms as T
from .cli import FILE_HELP, subcommand
from .errors import FdslError
from .functions import as_int, describe, function
from .statements import Write, target_of
from .terms import Term


def error_of(w) -> Optional[Term]:
    """E if ``w`` is ``form(E)``, else None."""
    if not isinstance(w, Term):
        return None
    c, rest = T.coefficient(w)
    if c != -1 or rest.op != "trace":
        return None
    last = T.factors(rest.args[0])[-1]
    if last.op != "d":
        return None
    e = last.args[0]
    return e if forms.form(e) is w else None


class Trainer:
    """Gradient descent on the weights of a 1-form, from a program's values."""

    def __init__(self, program, w, what: str = "the form"):
        from .backends.numpy_eval import program_evaluator
        from .backends.numpy_grad import coefficients, normal_form, symbol_leaves

        self.program = program
        self.what = what
        self.normal = normal_form(program, w, what)  # once: every step reuses it
        self.error = error_of(w)
        self.coefficients = coefficients(program, self.normal, what)
        if not self.coefficients:
            raise FdslError("%s involves no weight: there is nothing to train" % what)
        self.terms = list(self.coefficients.values()) + ([self.error] if self.error is not None else [])
        ev = program_evaluator(program)  # draws random values on demand; checks given ones
        self.values: dict = {}
        for name, leaf in symbol_leaves(self.terms).items():
            self.values[name] = np.array(ev.value(leaf), dtype=np.float64)
        for x in self.coefficients:
            name = x.data[0].printed()
            if name not in self.values:  # a weight only its differential mentions
                self.values[name] = np.array(ev.value(x), dtype=np.float64)
        self.dims, self.origin = ev.dims, ev.origin
        self.weights = [x.data[0].printed() for x in self.coefficients]
        self.label = "loss" if self.error is not None else "|grad|"

    def measure(self):
        """(loss, gradients) at the current values, from one evaluator."""
        from .backends.numpy_eval import Evaluator
        from .backends.numpy_grad import gradients

        # the generated code, as for grad(w) and fdsl grad: one lowering for every gradient
        grads = gradients(self.program, self.normal, self.values, what=self.what)
        if self.error is not None:
            loss = 0.5 * float(np.sum(Evaluator(self.values, self.dims, self.origin).value(self.error) ** 2))
        else:
            loss = math.sqrt(sum(float(np.sum(g ** 2)) for g in grads.values()))
        return loss, grads

    def run(self, steps: int, lr: float, every: int, report=None) -> list:
        """Take ``steps`` steps; returns [(step, loss)] every ``every`` steps and at the end;
        ``report(step, loss)`` is called as they come."""
        curve = []
        for step in range(steps + 1):
            with np.errstate(over="ignore", invalid="ignore"):  # a diverging run is caught just below
                loss, grads = self.measure()
            if not math.isfinite(loss):
                raise FdslError("the %s became %s at step %d: lower the learning rate (it is %g)"
                                % (self.label, loss, step, lr))
            if step % every == 0 or step == steps:
                curve.append((step, loss))
                if report is not None:
                    report(step, loss)
            if step == steps:
                break
            for name, g in grads.items():
                self.values[name] = self.values[name] + lr * g
        return curve

    def line(self, step: int, loss: float) -> str:
        return "step %5d  %s %.6e" % (step, self.label, loss)


def _check_schedule(steps: int, lr: float, every: Optional[int]) -> int:
    if steps < 1:
        raise FdslError("the number of steps must be at least 1, not %d" % steps, file="--steps")
    if not (lr > 0 and math.isfinite(lr)):
        raise FdslError("the learning rate must be a positive number, not %g" % lr, file="--lr")
    if every is None:
        every = max(1, steps // 10)
    if every < 1:
        raise FdslError("the loss is shown every K >= 1 steps, not every %d" % every, file="--every")
    return every


# ---- the language: train(w, steps, lr, every?) ------------------------------------------------------


class Training:
    """The loss curve of a training run; ``show`` prints it."""

    def __init__(self, lines, summary):
        self.lines, self.summary = lines, summary

    def show(self) -> str:
        return "\n".join(self.lines + [self.summary])


@function("train(w, steps, lr, every?)", "gradient descent on the program's weights along grad(w, W) "
          "(w = form(E): descent on 1/2 ||E||^2); shows the loss every `every` steps")
def _train(program, w, steps, lr, every=None):
    if program.options.get("train") is False:
        return Training([], "train(...) skipped: the fdsl command decides the training")
    steps = as_int(steps, "the number of steps")
    if not isinstance(lr, Fraction):
        raise FdslError("the learning rate must be a number, not %s" % describe(lr))
    lr = float(lr)
    every = _check_schedule(steps, lr, None if every is None else as_int(every, "every"))
    trainer = Trainer(program, w, "the first argument of train")
    curve = trainer.run(steps, lr, every)
    from .backends.numpy_eval import program_values

    store = program_values(program)
    for name in trainer.weights:  # later eval/save/grad see the trained weights
        store[name] = trainer.values[name]
    first, last = curve[0][1], curve[-1][1]
    summary = "%s %.6g -> %.6g in %d steps (lr %g)" % (trainer.label, first, last, steps, lr)
    return Training([trainer.line(s, l) for s, l in curve], summary)


# ---- fdsl train FILE --form NAME --steps N --lr LR ... ----------------------------------------------


def _cmd_train(args) -> int:
    if args.out is not None:
        target_of(args.out)  # a path that cannot be written fails before the work
    from .backends.numpy_grad import check_given, form_named, load_with_values

    every = _check_schedule(args.steps, args.lr, args.every)
    program = load_with_values(args)
    w = form_named(program, args.form)
    trainer = Trainer(program, w, args.form)
    check_given(program, trainer.terms, args.values)

    def report(step, loss):
        print(trainer.line(step, loss), flush=True)

    try:
        curve = trainer.run(args.steps, args.lr, every, report)
    except FdslError as e:
        e.file = e.file or args.file
        raise
    print("%s %.6g -> %.6g in %d steps (lr %g)" % (trainer.label, curve[0][1], curve[-1][1], args.steps, args.lr))
    if args.out:
        out = Path(args.out)
        values = dict(trainer.values)

        def write(tmp: Path):
            with open(tmp, "wb") as f:
                np.savez(f, **values)

        Write(out, write).perform(None, program)
        print("wrote %s: %d arrays (the trained weights %s and the constants)" % (out, len(values), ", ".join(trainer.weights)))
    return 0


@subcommand
def _register(sub):
    from .backends.numpy_grad import add_value_options

    p = sub.add_parser("train", help="gradient descent on the weights of a 1-form with its symbolic gradients")
    p.add_argument("file", help=FILE_HELP)
    p.add_argument("--form", required=True, metavar="NAME", help="the 1-form, e.g. a definition w = form(E): "
                   "each step moves W by lr grad(w, W), which for form(E) descends 1/2 ||E||^2")
    p.add_argument("--steps", type=int, required=True, metavar="N", help="number of steps")
    p.add_argument("--lr", type=float, required=True, metavar="LR", help="learning rate")
    p.add_argument("--every", type=int, metavar="K", help="print the loss every K steps (default steps/10)")
    p.add_argument("--out", metavar="FINAL.npz", help="write the trained values (usable as --values)")
    add_value_options(p)
    p.set_defaults(func=_cmd_train)
