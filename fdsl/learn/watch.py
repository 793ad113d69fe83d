"""Eyes on training: watched quantities, the per-step log, and its CSV and plot.

Vocabulary
----------
watch    an expression followed during training (``--watch EXPR``, or a string argument of
         ``train(...)``): a coefficient such as ``coeff(w, K[1])``, a weight, any scalar or matrix
         term. At every step it is evaluated at the current weights and recorded as its
         Frobenius norm, or as its value when it is a scalar. The manual: once the matrices are
         connected to numbers, "we can examine individual matrix coefficients during training".
log      one row per step: the step, the loss, every watched quantity and, under a Gauss-Newton
         metric, the conjugate-gradient iterations and relative residual of that step's flow.
run      a named log (the definition a ``train(...)`` was bound to, ``e = train(...)``): several
         runs go in one CSV (a ``run`` column first) and one plot.
CSV      ``--log FILE.csv`` or ``save "FILE.csv" RUN, ...``: a header of column names, then one
         line per step, numbers with 17 significant digits.
plot     ``--plot FILE.png`` or ``plot "FILE.png" RUN, ...``: one panel for the loss (log scale)
         and one per watched quantity, step on the x axis, one line per run. It needs matplotlib,
         an optional extra: ``pip install 'fdsl[plot]'``.

Files are written through the project's staged writer (``fdsl.lang.statements``): all or nothing.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..base.errors import FdslError, printable
from ..core import terms as T
from ..core.functions import describe
from ..core.terms import Term


@dataclass
class Log:
    """The per-step record of one training run."""

    columns: list  # "step", the loss label, watch labels, maybe "cg_iterations", "cg_residual"
    rows: list = field(default_factory=list)
    name: str = ""
    metric: str = ""

    def column(self, label: str) -> list:
        i = self.columns.index(label)
        return [row[i] for row in self.rows]


# ---- watched expressions ----------------------------------------------------------------------------


def watch_terms(program, texts, where: str = "--watch") -> list:
    """[(label, term)] for watch expressions given as text (parsed as fdsl expressions in the
    program, never as Python)."""
    out = []
    for text in texts:
        saved = program._src  # program.expr names its own source; the statement's stays ours
        try:
            value = program.expr(text)
        except FdslError as e:
            if e.file == "<expr>":
                e.file = "%s %s" % (where, text)
            raise
        finally:
            program._src = saved
        out.append((text.strip(), watch_term(value, "%s %s" % (where, text))))
    return out


def watch_term(value, what: str) -> Term:
    """A watched value as a term of numbers, or an error saying why it cannot be watched."""
    from fractions import Fraction

    if isinstance(value, Fraction):
        return T.num(value)
    if not isinstance(value, Term):
        raise FdslError("%s: a watch is a term evaluated at every step (a coefficient, a weight, any "
                        "matrix or scalar expression), not %s" % (what, describe(value)))
    if value.has_d:
        raise FdslError("%s is a matrix of 1-forms, which has no numbers: watch a coefficient, "
                        "coeff(w, W)" % what)
    return value


def measure(array) -> float:
    """A watched array as one number: its value for a scalar, else its Frobenius norm."""
    import numpy as np

    array = np.asarray(array, dtype=np.float64)
    if array.size == 1:
        return float(array.reshape(()))
    return float(np.linalg.norm(array))


# ---- CSV ---------------------------------------------------------------------------------------------


def csv_text(logs: list) -> str:
    """One CSV for one run (its columns) or several (a ``run`` column first, and the union of
    their columns, empty where a run lacks one)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if len(logs) == 1:
        writer.writerow([_text_cell(c) for c in logs[0].columns])
        for row in logs[0].rows:
            writer.writerow([_cell(x) for x in row])
        return out.getvalue()
    columns = list(dict.fromkeys(c for log in logs for c in log.columns))
    writer.writerow(["run"] + [_text_cell(c) for c in columns])
    for log in logs:
        where = {c: i for i, c in enumerate(log.columns)}
        for row in log.rows:
            writer.writerow([_text_cell(log.name)] + [_cell(row[where[c]]) if c in where else "" for c in columns])
    return out.getvalue()


def _text_cell(text: str) -> str:
    """A text cell (a column label, a run's name) a spreadsheet will not run: one that begins with
    = + - @ or a tab or carriage return is a formula to Excel and LibreOffice (``-1+HYPERLINK(...)``,
    ``=cmd|...``), so it gets a leading apostrophe, as OWASP advises; control characters are escaped."""
    text = printable(str(text), False)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _cell(x) -> str:
    if isinstance(x, int):
        return str(x)
    return "%.17g" % x


def csv_write(logs: list):
    text = csv_text(logs)
    return lambda tmp: Path(tmp).write_text(text)


# ---- plots -------------------------------------------------------------------------------------------


def require_matplotlib():
    """matplotlib's Figure and Agg canvas, or an error saying how to install it."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise FdslError("plots need matplotlib, an optional extra: pip install 'fdsl[plot]' (or pip "
                        "install matplotlib); --log FILE.csv writes the same numbers without it") from None
    return Figure, FigureCanvasAgg


def plot_write(logs: list, title: str = ""):
    """``write(tmp)`` drawing the logs into a PNG: the loss, then each watched quantity."""
    Figure, FigureCanvasAgg = require_matplotlib()
    first = logs[0]
    loss = first.columns[1]
    panels = [loss] + list(dict.fromkeys(c for log in logs for c in log.columns[2:] if not c.startswith("cg_")))
    cols = 1 if len(panels) == 1 else 2
    rows = (len(panels) + cols - 1) // cols
    fig = Figure(figsize=(6.0 * cols, 4.0 * rows), dpi=100)
    FigureCanvasAgg(fig)
    for k, label in enumerate(panels):
        ax = fig.add_subplot(rows, cols, k + 1)
        positive = True
        for log in logs:
            if label not in log.columns:
                continue
            ys = log.column(label)
            positive = positive and all(y > 0 for y in ys if math.isfinite(y))
            ax.plot(log.column("step"), ys, label=_plain(log.name or log.metric) or None, linewidth=1.6)
        if positive:
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(_panel_title(label, k == 0), fontsize=10, parse_math=False)  # text, not mathtext
        ax.grid(True, which="both", alpha=0.3)
        if len(logs) > 1 or logs[0].name:
            ax.legend(fontsize=9)
    if title:
        fig.suptitle(title, fontsize=11, parse_math=False)
    fig.tight_layout()

    def write(tmp):
        fig.savefig(str(tmp), format="png")

    return write


def _plain(text: str) -> str:
    """A legend label shown as written: matplotlib reads $...$ in it as mathtext (a bad command is
    an exception while drawing), and a leading underscore hides it."""
    return text.replace("$", "\\$").lstrip("_") if text else text


def _panel_title(label: str, is_loss: bool) -> str:
    if is_loss:
        return label
    return "|%s|" % (label if len(label) <= 48 else label[:45] + "...")
