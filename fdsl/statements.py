"""Statements: one table entry per command keyword (``show``, ``rules``, ``values``, ...).

Vocabulary
----------
Statement  a command keyword, its one-line doc and ``run(program, stmt)``, which evaluates the
           arguments and appends effects to the program (or changes its state: rules, values).
Effect     something a statement does to the world, performed by ``Program.run`` only once the
           whole program has elaborated: ``Print`` a text, ``Write`` a file. Files are written
           all or nothing (``perform_all``): each to a temporary file beside its target, then
           renamed over it once every one is written; through symlinks, keeping the existing
           file's mode, and only to regular files or new ones.

The grammar's ``COMMAND`` terminal lists the same keywords; a test holds the two together.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import printers
from .errors import FdslError
from .functions import describe, render
from .inputs import kind_of
from .terms import Term


@dataclass
class Print:
    text: str

    def perform(self, out, program):
        perform_all([self], out, program)


@dataclass
class Write:
    path: Path
    write: Callable  # write(path_of_temporary_file)
    note: str = ""

    def perform(self, out, program):
        perform_all([self], out, program)


def perform_all(effects, out, program) -> None:
    """Perform effects all or nothing: every file is first written beside its target, then, once
    all of them are written, each is renamed over its target and the texts are printed. A write
    that fails removes the temporary files and changes nothing."""
    staged = []
    try:
        for effect in effects:
            if isinstance(effect, Write):
                staged.append(stage(effect.path, effect.write))
    except BaseException:
        for s in staged:
            s.discard()
        raise
    for s in staged:
        s.commit()
    for effect in effects:
        text = effect.text if isinstance(effect, Print) else effect.note
        if text and out is not None:
            out.write(text + "\n")


def _cannot(path, why) -> FdslError:
    return FdslError("cannot write this file: %s" % why, file=str(path) or "<output>")


def target_of(path):
    """Where writing ``path`` lands, and its status (None for a new file): symlinks are followed,
    so writing a link writes the file it points to; anything but a regular file is refused."""
    if str(path) in ("", "."):
        raise FdslError("an output file needs a name, not an empty path", file="<output>")
    real = Path(os.path.realpath(path))
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise _cannot(path, e.strerror or e) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise _cannot(path, "it is %s; fdsl writes only regular files (or new ones)" % kind_of(st.st_mode))
    if st is None:  # a new file: missing folders are made, but only under a folder
        folder = real.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            raise _cannot(path, "%s is not a folder" % folder)
    return real, st


@dataclass
class Staged:
    """A file written completely beside its target, waiting to be renamed over it."""

    target: Path
    tmp: Path

    def commit(self) -> None:
        os.replace(self.tmp, self.target)

    def discard(self) -> None:
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


def stage(path, write: Callable) -> Staged:
    """``write(tmp)`` fills a new temporary file in the target's folder, given the target's mode
    (a new file: the usual mode under the umask); errors are FdslErrors and leave nothing behind."""
    real, st = target_of(path)
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=real.parent, prefix="." + real.name + ".", suffix=".tmp")
    except OSError as e:
        raise _cannot(path, e.strerror or e) from None
    os.close(fd)
    staged = Staged(real, Path(tmp))
    try:
        write(staged.tmp)
        if st is not None:
            mode = stat.S_IMODE(st.st_mode)
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)  # mkstemp makes 0600
    except OSError as e:
        staged.discard()
        raise _cannot(path, e.strerror or e) from None
    except BaseException:
        staged.discard()
        raise
    return staged


def atomic_write(path, write: Callable) -> None:
    """Write one file all at once (see ``stage``): the old file or the new one, never half."""
    stage(path, write).commit()


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
        value = program.evaluate(node, {})
        program.last_shown = value  # the repl's _
        program.effects.append(Print(render(value, program.bound_shown)))
        if isinstance(value, Term):
            lets = printers.bindings(value) + ([value] if value.op == "let" else [])
            program.bound_shown.update(set(lets) & program.named_terms())


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


@statement("save", 'save "FILE.npz" EXPR  or  save "FILE.csv" RUN[, RUN...]', "write the value of EXPR (an array, "
           "or gradients by name) to an .npz file; the logs of training runs (e = train(...)) to a CSV file")
def _save(program, st):
    items = list(st.items)
    if items and items[0].kind == "mul" and _leftmost(items[0]).kind == "string":
        # save "g.npz" grad(w) parses as a product of the string and the value: split it
        items = _split_leading_string(items[0]) + items[1:]
    csv = len(items) > 1 and items[0].kind == "string" and items[0].value.endswith(".csv")
    st = type(st)(st.kind, st.line, st.col, st.name, items=items)
    path, *values = _args(program, st, 2, len(items) if csv else 2, STATEMENTS["save"].usage)
    from .backends import numpy_eval

    path = program.resolve_path(_string_arg(path, "a file name"))
    try:
        target_of(path)  # checked now, so the message points at the statement
    except FdslError as e:
        raise FdslError(e.message, line=st.line, col=st.col) from None
    if csv:
        from .watch import csv_write, runs_of

        if program.options.get("train") is not False:  # under fdsl train the runs were skipped
            program.effects.append(Write(path, csv_write(runs_of(program, items[1:], values))))
        return
    program.effects.append(numpy_eval.save_effect(program, path, values[0]))


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
