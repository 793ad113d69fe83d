"""Statements: one table entry per command keyword (``show``, ``rules``, ``values``, ...).

Vocabulary
----------
Statement  a command keyword, its one-line doc and ``run(program, stmt)``, which evaluates the
           arguments and appends effects to the program (or changes its state: rules, values).
Effect     something a statement does to the world, performed by ``Program.run`` only once the
           whole program has elaborated: ``Print`` a text, ``Write`` a file (atomically: a
           temporary file renamed into place, so a failed run leaves nothing half-written).

The grammar's ``COMMAND`` terminal lists the same keywords; a test holds the two together.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import FdslError
from .functions import describe, render


@dataclass
class Print:
    text: str

    def perform(self, out, program):
        out.write(self.text + "\n")


@dataclass
class Write:
    path: Path
    write: Callable  # write(path_of_temporary_file)
    note: str = ""

    def perform(self, out, program):
        atomic_write(self.path, self.write)
        if self.note:
            out.write(self.note + "\n")


def atomic_write(path: Path, write: Callable) -> None:
    """Write a file all at once: ``write(tmp)`` fills a temporary file beside ``path``, which is
    then renamed over it, so a failure leaves the old file (or none), never half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name + ".", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a written file gets the usual mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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


@statement("show", "show EXPR[, EXPR...]", "print the value of each expression (an expression alone does the same)")
def _show(program, st):
    for node in st.items:
        program.effects.append(Print(render(program.evaluate(node, {}), program.named_terms())))


@statement("rules", 'rules "FILE.rules"', "load a rule file (path relative to this program); its rulesets become functions")
def _rules(program, st):
    (path,) = _args(program, st, 1, 1, 'rules "FILE.rules"')
    program.load_rules(program.resolve_path(_string_arg(path, "a rule file")))


@statement("values", 'values "FILE.npz"', "take the numeric values of symbols from an .npz file (keys: X, Q_0, ...)")
def _values(program, st):
    (path,) = _args(program, st, 1, 1, 'values "FILE.npz"')
    from .backends import numpy_eval

    numpy_eval.load_values(program, program.resolve_path(_string_arg(path, "a values file")))


@statement("random", "random SEED", "give every symbol without a value random entries (weights scaled by 1/sqrt(rows))")
def _random(program, st):
    (seed,) = _args(program, st, 1, 1, "random SEED")
    from .backends import numpy_eval
    from .functions import as_int

    numpy_eval.random_values(program, as_int(seed, "a seed"))


@statement("save", 'save "FILE.npz" EXPR', "write the value of EXPR (an array, or gradients by name) to an .npz file")
def _save(program, st):
    items = st.items
    if len(items) == 1 and items[0].kind == "mul" and _leftmost(items[0]).kind == "string":
        # save "g.npz" grad(w) parses as a product of the string and the value: split it
        items = _split_leading_string(items[0])
    st = type(st)(st.kind, st.line, st.col, st.name, items=items)
    path, value = _args(program, st, 2, 2, 'save "FILE.npz" EXPR')
    from .backends import numpy_eval

    program.effects.append(numpy_eval.save_effect(program, program.resolve_path(_string_arg(path, "a file name")), value))


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
