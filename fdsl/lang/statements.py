"""Statements: one table entry per command keyword (``show``, ``rules``, ``values``, ...).

Vocabulary
----------
Statement  a command keyword, its one-line doc and ``run(program, stmt)``, which evaluates the
           arguments and appends effects to the program (or changes its state: rules, values).
Effect     something a statement does to the world, performed by ``Program.run`` only once the
           whole program has elaborated: ``Print`` a text, ``Write`` a file (``fdsl.base.files``:
           all or nothing).

The grammar's ``COMMAND`` terminal lists the same keywords; a test holds the two together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..base.errors import FdslError
from ..base.files import Print
from ..core import printers
from ..core.functions import describe, render
from ..core.terms import Term


@dataclass(frozen=True)
class Statement:
    keyword: str
    usage: str
    doc: str
    run: Callable


STATEMENTS: dict[str, Statement] = {}


def statement(keyword: str, usage: str, doc: str):
    def register(run):
        STATEMENTS[keyword] = Statement(keyword, usage, doc, run)
        return run

    return register


def _args(program, st, lo, hi, usage):
    if not lo <= len(st.items) <= hi:
        raise FdslError("usage: %s" % usage, line=st.line, col=st.col)
    return [program.evaluate(a, {}) for a in st.items]


def _string_arg(value, what):
    if not isinstance(value, str):
        raise FdslError("%s must be a string in quotes, not %s" % (what, describe(value)))
    return value


@dataclass
class Shown(Print):
    """The output of ``show``: the text printed, and the value and expression it shows, for a face
    that shows values its own way (``fdsl serve`` typesets a term, draws a ``depends`` path)."""

    value: object = None
    node: object = None


@statement("show", "show EXPR[, EXPR...]", "print the value of each expression (an expression alone does the same)")
def _show(program, st):
    for node in st.items:
        value = program.evaluate(node, {})
        program.last_shown = value  # the repl's _
        program.effects.append(Shown(render(value, program.bound_shown), value, node))
        if isinstance(value, Term):
            lets = printers.bindings(value) + ([value] if value.op == "let" else [])
            program.bound_shown.update(set(lets) & program.named_terms())


@statement("rules", 'rules "FILE.rules"',
           "load a rule file (path relative to this program); its rulesets become functions")
def _rules(program, st):
    (path,) = _args(program, st, 1, 1, 'rules "FILE.rules"')
    program.load_rules(program.resolve_path(_string_arg(path, "a rule file")))


def _leftmost(node):
    while node.kind == "mul":
        node = node.args[0]
    return node


def _split_leading_string(node):
    """``"f" a b`` parsed as ((("f" a) b)): return ["f", (a b)]."""
    if node.args[0].kind == "string":
        return [node.args[0], node.args[1]]
    head, rest = _split_leading_string(node.args[0])
    return [head, type(node)("mul", (rest, node.args[1]), None, rest.line, rest.col)]
