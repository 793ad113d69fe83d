"""Layout: long terms printed the way the manual typesets them, on several lines.

Vocabulary
----------
weight line   one line of a normal form ``sum_W trace(G_W dW)`` in text: ``dW_0: G_W``, in the
              form's order (weights by name, then index). A form whose summands each pair one
              differential with its coefficient, each differential once, reads this way.
break         a long form, coefficient or definition (a sum longer than ``WIDTH`` characters) is
              cut between summands: each line
              holds as many summands as fit, and the next starts with ``+`` or ``-`` under the
              first, the way the manual's ``forms(2)`` is laid out. Only sums at the top of a
              coefficient are cut; what is inside parentheses stays on its line.
aligned       LaTeX's ``aligned`` environment: a long form becomes rows joined by ``\\\\``, a normal
              form one row per weight, ``\\mathrm{d}W_{0}`` and its coefficient aligned at ``&``.

The pieces are the printers' own (``fdsl.core.printers``): every summand is printed once, through their
memo, so laying out is linear in the shared graph like printing.
"""

from __future__ import annotations

from . import normal
from . import terms as T
from .terms import Term

WIDTH = 100  # characters of text per line before a sum is broken
LATEX_WIDTH = 90  # characters of text (a proxy for typeset width) per row of an aligned formula


def weight_lines(t: Term):
    """The (X, G) pairs of a normal form, each differential once; None if ``t`` is not one."""
    if t.op not in ("add", "mul", "trace") or not t.has_d:
        return None
    pairs = normal.pairs(t)
    if pairs is None:
        return None
    xs = [x for x, _ in pairs]
    # over weights only: -trace(E^t dE), the form of a named E, is not yet a normal form
    if len(set(xs)) != len(xs) or any(not x.has_weight or x.op != "sym" for x in xs):
        return None
    return pairs


def signed(parts):
    """Summands as (sign, unsigned term): ``-2 A`` is ("-", 2 A)."""
    out = []
    for s in parts:
        c, rest = T.coefficient(s)
        out.append(("-", T.mul(T.num(-c), rest)) if c < 0 else ("+", s))
    return out


def _pack(pieces, width: int) -> list:
    """Greedy lines from (sign, text) pieces: the first without its "+", each line at most
    ``width`` characters unless one piece alone is longer."""
    lines: list = []
    for i, (sign, text) in enumerate(pieces):
        if i == 0:
            lines.append(text if sign == "+" else "-" + text)
            continue
        piece = "%s %s" % (sign, text)
        if len(lines[-1]) + 1 + len(piece) <= width:
            lines[-1] += " " + piece
        else:
            lines.append(piece)
    return lines


def broken(t: Term, text, width: int = WIDTH) -> list:
    """``t`` as lines: one line unless it is a sum longer than ``width``, then cut at its summands."""
    whole = text(t)
    if t.op != "add" or len(whole) <= width:
        return [whole]
    return _pack([(sign, text(s)) for sign, s in signed(t.args)], width)


def text_lines(t: Term, text, width: int = WIDTH) -> list:
    """The text of ``t`` laid out: a normal form one weight per line (``dW_0: G``, long
    coefficients broken at their sums), a long form (a sum with differentials) broken at its
    summands, else one line. A matrix such as ``E = Y - F`` stays on its line."""
    pairs = weight_lines(t)
    if pairs is None:
        return broken(t, text, width) if t.has_d else [text(t)]
    lines = []
    for x, g in pairs:
        head = "d%s: " % text(x)
        body = broken(g, text, max(width - len(head), 40))
        lines.append(head + body[0])
        lines.extend(" " * len(head) + line for line in body[1:])
    return lines


def latex_rows(t: Term, latex, text, width: int = LATEX_WIDTH):
    """``t`` in LaTeX as an ``aligned`` environment when it is long, else None: a normal form one
    row per weight, a long sum as rows of summands (lengths measured on the text printer)."""
    pairs = weight_lines(t)
    rows = []
    if pairs is not None and len(pairs) > 1:
        for x, g in pairs:
            body = _latex_pack(g, latex, text, width)
            rows.append(r"\mathrm{d}%s &\colon\ %s" % (latex(x), body[0]))
            rows.extend(r"&\qquad %s" % row for row in body[1:])
    elif t.op == "add" and t.has_d and len(text(t)) > width:
        body = _latex_pack(t, latex, text, width)
        rows = ["&" + body[0]] + [r"&\quad %s" % row for row in body[1:]]
    else:
        return None
    return "\\begin{aligned}\n%s\n\\end{aligned}" % " \\\\\n".join(rows)


def _latex_pack(t: Term, latex, text, width: int) -> list:
    if t.op != "add" or len(text(t)) <= width:
        return [latex(t)]
    rows: list = []  # (latex, text length)
    for i, (sign, s) in enumerate(signed(t.args)):
        size = len(text(s))
        piece = latex(s) if i == 0 and sign == "+" else ("-" if i == 0 else sign + " ") + latex(s)
        if rows and rows[-1][1] + size <= width:
            rows[-1] = (rows[-1][0] + " " + piece, rows[-1][1] + size + 3)
        else:
            rows.append((piece, size))
    return [r for r, _ in rows]
