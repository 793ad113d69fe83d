"""Training with the symbolic gradients: plain gradient descent along the dual of a 1-form.

Vocabulary
----------
flow     ``W <- W + lr grad(w, W)`` for every weight W of the 1-form w (``grad`` as in
         ``fdsl.codegen.grads``: the dual of w under the Euclidean metric). For
         ``w = form(E) = -dL``, ``L = 1/2 ||E||^2``, ``grad(w, W) = -dL/dW``: the flow is gradient
         descent on L, the manual's negative Euler flow pulled back to the weights.
loss     ``L = 1/2 ||E||^2`` when w is ``form(E)`` (recognised as the term ``-trace(E^t d(E))``); for
         any other 1-form the size of its gradient, ``|grad| = sqrt(sum_W ||grad(w, W)||^2)``.
step     one call of the generated code of the normal form (computed and lowered once, before
         the first step; the same code as ``grad(w)`` and ``fdsl grad``), which also computes the
         loss (of a batch of examples too), then the update of every weight.

Two surfaces: ``train(w, steps, lr, every?)`` in a program (``fdsl run examples/train.fd``), which
trains the program's own values, so later ``eval``/``save``/``grad`` see the trained weights; and
``fdsl train FILE --form NAME --steps N --lr LR (--random SEED | --values F.npz)``, under which
``train(...)`` calls inside the file are skipped (the command line decides the training).
"""

from __future__ import annotations

import math
import time
from fractions import Fraction
from typing import Optional

import numpy as np

from ..base.errors import FdslError
from ..base.estimate import Clock, check_estimate
from ..base.files import Note, Write, target_of
from ..calculus.gradients import error_of, objective_of
from ..core import terms as T
from ..core.functions import as_int, describe, function
from ..core.terms import Term
from ..lang.statements import _leftmost, _split_leading_string, statement
from ..numbers.values import SAVERS
from .watch import Log, csv_write, measure, plot_write, watch_terms


def check_not_ascent(w, what: str) -> None:
    """Refuse a 1-form that is the ascent direction of its own loss: ``d(L)`` (or
    ``trace(E^t d(E))``, which is ``+d(1/2 ||E||^2)``). Training along it climbs L, silently."""
    if not isinstance(w, Term):
        return
    c, rest = T.coefficient(w)
    if c > 0 and rest.op == "d" and rest.args[0].scalar:
        raise FdslError("%s is d(L), the direction in which L grows: training along it climbs L; "
                        "write -d(L) (w = -d(L)), its descent direction" % what)
    if c > 0 and error_of(T.neg(w)) is not None:
        raise FdslError("%s is trace(E^t d(E)) = d(1/2 ||E||^2), the direction in which the loss grows: "
                        "training along it climbs; write form(E) = -trace(E^t d(E)), its descent direction"
                        % what)


# a loss that grows by this factor over its first value has diverged
DIVERGED = 1e4


def cross_entropy_targets(loss: Term) -> list:
    """The targets T of the cross-entropy summands ``-c trace(T^t logsoftmax(Z))`` of a loss (also
    ``log(a(Z))``, and the trace's factors in any cyclic order), c > 0, that involve no weight."""
    out = []
    for summand in T.summands(loss):
        c, rest = T.coefficient(summand)
        if c >= 0 or rest.op != "trace":
            continue
        factors = T.factors(rest.args[0])
        for i, f in enumerate(factors):
            if f.op == "logsoftmax" or (f.op == "log" and f.args[0].op == "a"):
                others = factors[i + 1:] + factors[:i]  # trace(A f B) = trace(B A f): T = (B A)^t
                if others:
                    product = T.mul(*others)
                    target = product.args[0] if product.op == "t" else T.transpose(product)
                    if not target.has_weight:
                        out.append(target)
    return out


def check_distribution(name: str, y) -> None:
    """An FdslError unless every row of ``y`` (last axis) is a probability distribution: a
    cross-entropy against anything else has no minimum, and training it runs off to -infinity."""
    y = np.asarray(y, dtype=np.float64)
    sums = y.sum(axis=-1)
    worst_sum = np.unravel_index(np.argmax(np.abs(sums - 1)), sums.shape)
    why = None
    if y.size and y.min() < -1e-12:
        at = np.unravel_index(np.argmin(y), y.shape)
        why = "entry %s is %.4g, below 0" % (tuple(int(i) for i in at), y[at])
    elif sums.size and abs(sums[worst_sum] - 1) > 1e-6:
        why = "row %s sums to %.6g, not 1" % (tuple(int(i) for i in worst_sum), sums[worst_sum])
    if why is not None:
        raise FdslError("the targets %s of the cross-entropy are not rows of a probability distribution (%s): "
                        "a cross-entropy against them has no minimum; give one-hot rows or probabilities "
                        "(with --values FILE.npz or values \"FILE.npz\")" % (name, why))


class Trainer:
    """Steps along the flow of a 1-form under the program's metric, from the program's values,
    recording the loss and the watched quantities at every step."""

    def __init__(self, program, w, what: str = "the form", watches=()):
        from ..codegen.grads import coefficients, no_weight, normal_form, symbol_leaves
        from ..numbers.values import program_evaluator
        from .flow import Dualizer

        self.program = program
        self.what = what
        check_not_ascent(w, what)
        self.normal = normal_form(program, w, what)  # once: every step reuses it
        self.error = error_of(w)
        self.objective = objective_of(w) if self.error is None else None  # w = -d(L): L is the loss
        self.coefficients = coefficients(program, self.normal, what)
        if not self.coefficients:
            raise no_weight(program, what, ", so there is nothing to train")
        self.dual = Dualizer(program, list(self.coefficients), what)  # the metric, prepared once
        self._clock = ()  # (the run's Clock, at which step) while run() runs: the solves look at it
        self.watches = _distinct_labels(list(watches))  # [(label, term)]
        self.scalars = {label for label, t in self.watches if t.scalar}  # recorded as values, not norms
        self.terms = list(self.coefficients.values()) + [t for t in (self.error, self.objective) if t is not None]
        self.terms += self.dual.terms() + [t for _, t in self.watches]
        ev = program_evaluator(program)  # draws random values on demand; checks given ones
        given = program.values if program.values is not None else {}
        self.values: dict = {}
        for name, leaf in symbol_leaves(self.terms).items():
            if leaf.data[0].onehot:  # ids (checked, or drawn now): the generated code reads them as they are
                if name not in given:
                    ev.value(leaf)
                self.values[name] = np.asarray(program.values[name])
            elif name in given and np.ndim(given[name]) == 3:  # a batch of examples, as given (checked)
                self.values[name] = np.array(given[name], dtype=np.float64)
            else:
                self.values[name] = np.array(ev.value(leaf), dtype=np.float64)
        for x in self.coefficients:
            name = x.data[0].printed()
            if name not in self.values:  # a weight only its differential mentions
                self.values[name] = np.array(ev.value(x), dtype=np.float64)
        self.dims, self.origin = ev.dims, ev.origin
        self._check_data(program)
        self.weights = list(self.dual.weights)
        self.label = "loss" if self.error is not None or self.objective is not None else "|grad|"
        columns = ["step", self.label] + [label for label, _ in self.watches]
        if self.dual.blocks:
            columns += ["cg_iterations", "cg_residual"]
        self.log = Log(columns, metric=self.dual.describe())

    def _check_data(self, program) -> None:
        """Say once (on stderr) which data of the loss --random drew, and hold the targets of a
        cross-entropy to be distributions: a loss of data that are not what it expects trains
        without error to a meaningless number."""
        from ..codegen.grads import symbol_leaves
        from ..core.printers import short
        from ..numbers.numpy_eval import Evaluator

        self.drawn = None  # said once, after the run (or in the message that stops it)
        loss = self.error if self.error is not None else self.objective
        if loss is None:
            return
        store = program.values
        drawn = [name for name, leaf in symbol_leaves([loss]).items()
                 if leaf.data[0].kind != "weight" and store is not None and name in store.generated]
        if drawn and store is not None and getattr(store, "drawn_said", None) != drawn:
            store.drawn_said = drawn
            self.drawn = ("the data %s of the loss %s drawn at random (random SEED / --random): give them with "
                          "--values FILE.npz to train on real data" % (", ".join(drawn), "is" if len(drawn) == 1
                                                                        else "are"))
        if self.objective is None:
            return
        ev = Evaluator(self.values, self.dims, self.origin)
        for target in cross_entropy_targets(self.objective):
            if target.op == "sym" and target.data[0].onehot:
                continue  # ids: every row is one-hot, a distribution
            try:
                name = target.data[0].printed() if target.op == "sym" else None
                if name is not None and name in self.values:  # the array itself: a batch of examples too
                    y = self.values[name]
                elif getattr(self.values, "batched", False):
                    continue  # eval takes one example; the check holds on the symbols of a batch
                else:
                    y = ev.value(target)
                check_distribution(short(target), y)
            except FdslError as e:
                if self.drawn:
                    e.message += "; note: " + self.drawn
                raise

    def measure(self):
        """(loss, flows, the record's numbers) at the current values: the loss and the gradients
        from one sweep of the generated code (for a batch of examples, summed over it)."""
        from ..codegen.generated import compile_gradients
        from ..numbers.numpy_eval import Evaluator

        named = self.error if self.error is not None else self.objective  # the loss, as loss_of gives it
        fn = compile_gradients(self.normal, self.dims, named)
        ev = Evaluator(self.values, self.dims, self.origin)  # metric factors and watches share it
        if named is not None:  # L from the sweep of the gradients (summed over a batch)
            grads, loss = fn.with_loss(self.values)
        else:
            grads = fn(self.values)
            loss = math.sqrt(sum(float(np.sum(g ** 2)) for g in grads.values()))
        flows, solves = self.dual(grads, self.values, ev, *self._clock)
        record = [loss] + [measure(ev.value(t)) for _, t in self.watches]
        if self.dual.blocks:
            record += [sum(s.iterations for s in solves), max(s.residual for s in solves)]
        return loss, flows, record

    def run(self, steps: int, lr: float, every: int, report=None) -> list:
        """Take ``steps`` steps; returns [(step, loss)] every ``every`` steps and at the end;
        ``report(step, loss)`` is called as they come. Every step is recorded in ``self.log``."""
        from ..numbers.numpy_eval import NonFinite

        def stop(step, what):
            return FdslError("training stopped at step %d: %s; lower the learning rate (it is %g)%s"
                             % (step, what, lr, "; note: " + self.drawn if self.drawn else ""))

        curve = []
        first = None
        clock = Clock("training %d steps" % steps, self.program.options.get("time_limit"))
        for step in range(steps + 1):
            started = time.perf_counter()
            if step >= 2:  # the time so far, before each step after the two the estimate measures
                clock.check("at step %d" % step)
            self._clock = (clock, "at step %d" % step)
            try:
                with np.errstate(all="ignore"):  # a diverging run is caught just below
                    loss, flows, record = self.measure()
            except NonFinite as e:
                raise stop(step, e.message) from None
            if not (math.isfinite(loss) and all(np.isfinite(v).all() for v in flows.values())):
                raise stop(step, self._first_non_finite() or "the %s is %s" % (self.label, loss))
            self.log.rows.append([step] + record)
            first = loss if first is None else first
            if self.label == "loss" and loss > DIVERGED * max(first, 1e-8):
                raise stop(step, "the loss grew from %.6g to %.6g: it diverges" % (first, loss))
            if step % every == 0 or step == steps:
                curve.append((step, loss))
                if report is not None:
                    report(step, loss)
            if step == steps:
                break
            with np.errstate(over="ignore", invalid="ignore"):  # a step to inf is caught at the next measure
                for name, v in flows.items():
                    self.values[name] = self.values[name] + lr * v
            if step == 1:  # the second step's cost (the first compiles the code) times the steps
                check_estimate("training %d steps" % steps, steps, "steps", time.perf_counter() - started,
                               self.program.options.get("time_limit"),
                               "--steps" if self.program.options.get("train") is False else None)
        if self.drawn:
            if self.program.options.get("train") is False:  # fdsl train: its own run, said now
                self.program.trace_out.write("note: %s\n" % self.drawn)
            else:  # a train(...) of a program: said after the program's work, not before its errors
                self.program.effects.append(Note("note: %s" % self.drawn))
        return curve

    def _first_non_finite(self):
        """The first non-finite value of the error and the coefficients at the current values, with
        the term that made it (the interpreter stops there; the generated code cannot say)."""
        from ..numbers.numpy_eval import Evaluator, NonFinite

        ev = Evaluator(self.values, self.dims, self.origin)
        try:
            for t in ([self.error] if self.error is not None else []) + list(self.coefficients.values()):
                ev.value(t)
        except NonFinite as e:
            return e.message
        return None

    def line(self, step: int, loss: float) -> str:
        """A report line: the loss, the watched quantities and the solver's effort at that step."""
        row = self.log.rows[step] if step < len(self.log.rows) else None
        out = "step %5d  %s %.6e" % (step, self.label, loss)
        if row is None:
            return out
        watched = len(self.watches)
        for k, (label, x) in enumerate(zip(self.log.columns[2:], row[2:])):
            if k == watched:  # the solver's columns follow the watches (a watch may be named cg_...)
                out += "  cg %d it" % x
            elif k == watched + 1:
                out += " (residual %.1e)" % x
            else:
                out += ("  %s %.4e" if label in self.scalars else "  |%s| %.4e") % (label, x)
        return out


MAX_STEPS = 10_000_000


def _check_schedule(steps: int, lr: float, every: Optional[int]) -> int:
    if steps < 1:
        raise FdslError("the number of steps must be at least 1, not %d" % steps, file="--steps")
    if steps > MAX_STEPS:  # 10^15 steps would run for ages with nothing to show for it
        raise FdslError("the number of steps must be at most %d, not %d" % (MAX_STEPS, steps), file="--steps")
    if not (lr > 0 and math.isfinite(lr)):
        raise FdslError("the learning rate must be a positive number, not %g" % lr, file="--lr")
    if every is None:
        every = max(1, steps // 10)
    if every < 1:
        raise FdslError("the loss is shown every K >= 1 steps, not every %d" % every, file="--every")
    return every


# ---- the language: train(w, steps, lr, every?, "watch", ...) ---------------------------------------


class Training:
    """A training run: its report lines, its summary and its per-step log; ``show`` prints the
    lines, ``plot "f.png" RUN`` and ``save "f.csv" RUN`` draw and write the log."""

    def __init__(self, lines, summary, log: Optional[Log] = None):
        self.lines, self.summary, self.log = lines, summary, log

    def show(self) -> str:
        return "\n".join(self.lines + [self.summary])


def _summary(trainer, curve, steps, lr) -> str:
    out = "%s %.6g -> %.6g in %d steps (lr %g)" % (trainer.label, curve[0][1], curve[-1][1], steps, lr)
    if not trainer.dual.euclidean:
        out += ", metric %s" % trainer.dual.describe()
    return out


@function("train(w, steps, lr, every?, watch...)", "steps along the flow of w under the program's metric "
          "(Euclidean: gradient descent; w = form(E) descends 1/2 ||E||^2), showing the loss every `every` "
          "steps; each string argument, e.g. \"coeff(w, K[1])\", is watched (its norm recorded every step)",
          min_args=3, max_args=None)
def _train(program, w, steps, lr, *rest):
    if program.options.get("train") is False:
        return Training([], "train(...) skipped: the fdsl command decides the training")
    steps = as_int(steps, "the number of steps")
    if not isinstance(lr, Fraction):
        raise FdslError("the learning rate must be a number, not %s" % describe(lr))
    lr = float(lr)
    every = None
    if rest and not isinstance(rest[0], str):
        every, rest = as_int(rest[0], "every"), rest[1:]
    for r in rest:
        if not isinstance(r, str):
            raise FdslError("after train(w, steps, lr, every?) come watched expressions in quotes, "
                            "\"coeff(w, K[1])\", not %s" % describe(r))
    every = _check_schedule(steps, lr, every)
    trainer = Trainer(program, w, "the first argument of train", watch_terms(program, rest, "watch"))
    curve = trainer.run(steps, lr, every)
    from ..numbers.values import program_values

    store = program_values(program)
    for name in trainer.weights:  # later eval/save/grad see the trained weights
        store[name] = trainer.values[name]
    return Training([trainer.line(s, l) for s, l in curve], _summary(trainer, curve, steps, lr), trainer.log)


# ---- the language: plot "FILE.png" RUN, ... ------------------------------------------------------------


def runs_of(program, nodes, values) -> list:
    """The logs of training runs given to plot or save, named by the definitions that hold them."""
    logs = []
    for k, (node, value) in enumerate(zip(nodes, values)):
        if not isinstance(value, Training):
            raise program.error("expected a training run, e = train(w, steps, lr), not %s" % describe(value), node)
        if value.log is None:
            raise program.error("this train(...) was skipped (the fdsl command decides the training): "
                                "it has no log", node)
        name = node.value if node.kind == "name" else "run %d" % (k + 1)
        logs.append(Log(value.log.columns, value.log.rows, name, value.log.metric))
    return logs


@statement("plot", 'plot "FILE.png" RUN[, RUN...]', "draw the loss and watched quantities of training runs "
           "(e = train(w, steps, lr, every, \"coeff(w, K[1])\")) to a PNG, one line per run")
def _plot(program, st):
    items = list(st.items)
    if items and items[0].kind == "mul" and _leftmost(items[0]).kind == "string":
        items = _split_leading_string(items[0]) + items[1:]  # plot "f.png" e, k parses as ("f.png" e), k
    if len(items) < 2 or items[0].kind != "string":
        raise FdslError('usage: plot "FILE.png" RUN[, RUN...]', line=st.line, col=st.col)
    values = [program.evaluate(node, {}) for node in items[1:]]
    if program.options.get("train") is False:
        return  # the fdsl command decides the training; the runs have no logs
    path = program.output_path(items[0].value, st.line, st.col)
    try:
        target_of(path)
    except FdslError as e:
        raise FdslError(e.message, line=st.line, col=st.col) from None
    logs = runs_of(program, items[1:], values)
    program.effects.append(Write(path, plot_write(logs)))


# the log's own columns: a watch labelled as one of them (a weight named loss, cg_iterations) is
# given a column of its own name instead of being read as the loss or the solver's effort
_LOG_COLUMNS = ("step", "run", "loss", "|grad|", "cg_iterations", "cg_residual")


def _distinct_labels(watches: list) -> list:
    out, seen = [], set(_LOG_COLUMNS)
    for label, term in watches:
        column = label
        while column in seen:
            column = "watch %s" % column
        seen.add(column)
        out.append((column, term))
    return out


def _save_runs(program, path, nodes, values) -> Write:
    """``save "FILE.csv" RUN[, RUN...]``: the logs of training runs, one CSV."""
    return Write(path, csv_write(runs_of(program, nodes, values)))


SAVERS[".csv"] = _save_runs
