"""The repl's session: one program fed input after input, and the repl's own commands (``:load``,
``:diagram``, ``:help``, ...), apart from any terminal (``fdsl.repl.terminal`` reads the input).

Vocabulary
----------
session      one Program that every input is fed to, as if the inputs were one ``.fd`` file
             read a piece at a time: definitions accumulate, an expression alone is shown, and
             the effects of each input (printing, files) are performed as soon as it succeeds.
input        the text one Enter submits, once it is complete: brackets balanced and not ending
             in an operator (``E = Y -`` continues on the next line). An empty continuation line
             submits anyway, so a stray ``(`` gets its syntax error, not an endless prompt.
command      an input starting with ``:`` (``:load``, ``:rules``, ``:trace``, ``:help``...), see
             ``COMMANDS``; a unique prefix is enough (``:l file.fd``).
long output  more rows than the terminal shows. It goes through a pager (``$PAGER``, else
             ``less``) when there is one and a capable terminal, otherwise it is cut with a note
             saying how to see the rest. ``:pager on|off|auto`` or ``FDSL_PAGER`` choose: ``off``
             always cuts, ``on`` pages or, without a pager, prints everything.

With a terminal the prompt is prompt_toolkit's: history kept across sessions in a file
(``FDSL_HISTORY``, else ``$XDG_DATA_HOME/fdsl/history``, else ``~/.local/share/fdsl/history``),
up-arrow recall, Ctrl-R search, Tab completion of every name the session knows. Without one
(``echo 'show 1' | fdsl repl``) inputs are read line by line with no prompt, and the exit status
is 2 if any input failed, so scripts and CI can use it.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ..base.errors import FdslError, Redeclared, printable
from ..core.terms import Term

PROMPT = "fdsl> "
CONTINUATION = "  ... "
BANNER = "fdsl repl: an expression alone is shown; :help lists what you can type, Ctrl-D quits"

# Characters that cannot end a complete input: an operator still waiting for its right operand.
# (':=' ends in '='; ':' is the shape in 'weight Q : d x k'.)
_DANGLING = set("+-*/^=,:\\")


def _line_ends(text: str):
    """For each line: the bracket depth at its end and its last significant character."""
    depth = 0
    ends = []
    for line in text.split("\n"):
        last = ""
        in_string = False  # strings do not span lines (the grammar's STRING excludes newlines)
        for ch in line:
            if in_string:
                in_string = ch != '"'
            elif ch == "#":
                break
            elif ch == '"':
                in_string = True
            elif ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            if not ch.isspace():
                last = ch
        ends.append((depth, last))
    return ends


def needs_more(text: str) -> bool:
    """True while ``text`` cannot be a whole input yet: open brackets or a trailing operator."""
    if text.lstrip().startswith(":"):
        return False
    depth, last = _line_ends(text.rstrip())[-1]
    return depth > 0 or last in _DANGLING


def joined(text: str) -> str:
    """The input as the grammar reads it: a line that ends in an operator outside brackets gets
    the grammar's line continuation (a backslash), so ``E = Y -`` and ``X`` on the next line are
    one statement. Line numbers stay those the person typed."""
    lines = text.split("\n")
    ends = _line_ends(text)
    for i, (depth, last) in enumerate(ends[:-1]):
        if depth <= 0 and last in _DANGLING and last != "\\":
            lines[i] += "\\"
    return "\n".join(lines)


def private_folder(folder: Path) -> Path:
    """``folder``, made 0700 if missing, once it is checked to be this user's own: a real folder
    (not a link), owned by this user and closed to everyone else. In a shared place (the temp
    folder) another user could have made it first, to swap what fdsl writes there."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(folder)
    except OSError as e:
        raise FdslError("cannot use the folder %s: %s" % (folder, e.strerror or e)) from None
    if not stat.S_ISDIR(st.st_mode):
        raise FdslError("not using %s: it is not a folder (a link?); remove it, or use :diagram EXPR -o FILE" % folder)
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise FdslError("not using %s: it belongs to another user; remove it, or use :diagram EXPR -o FILE" % folder)
    if st.st_mode & 0o077:
        raise FdslError("not using %s: others may open it (mode %o); chmod 700 it, or use :diagram EXPR -o FILE"
                        % (folder, stat.S_IMODE(st.st_mode)))
    return folder


def history_path() -> Path:
    """Where the history lives: ``FDSL_HISTORY``, else under the XDG data directory."""
    if os.environ.get("FDSL_HISTORY"):
        return Path(os.environ["FDSL_HISTORY"]).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "fdsl" / "history"


# ---- commands ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    name: str
    usage: str
    doc: str
    run: Callable  # run(session, argument_text)


COMMANDS: dict[str, Command] = {}


def command(usage: str, doc: str):
    name = usage.split()[0][1:]

    def register(run):
        COMMANDS[name] = Command(name, usage, doc, run)
        return run

    return register


def find_command(word: str) -> Command:
    """The command named ``word`` or uniquely abbreviated by it."""
    if word in COMMANDS:
        return COMMANDS[word]
    matches = [c for name, c in COMMANDS.items() if name.startswith(word)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise FdslError(":%s is ambiguous: %s" % (word, ", ".join(":" + c.name for c in matches)))
    raise FdslError("unknown command :%s; the commands are %s" % (word, ", ".join(":" + n for n in COMMANDS)))


@command(":load FILE", "load a .fd file into the session (its relative paths are relative to it)")
def _load(session, arg):
    if not arg:
        raise FdslError("usage: :load FILE")
    session.load(arg)


@command(":rules [RULESET]", "list the rulesets, or show the rules of one")
def _rules(session, arg):
    book = session.program.rulebook
    if book is None:
        session.say("no rules loaded")
        return
    names = list(book.ruleset_names()) if hasattr(book, "ruleset_names") else []
    if not arg:
        session.show("\n".join(names) if names else "no rulesets")
        return
    if names and arg not in names:
        raise FdslError("no ruleset %r; the rulesets are %s" % (arg, ", ".join(names)))
    if not hasattr(book, "describe"):
        raise FdslError("this rule book cannot describe its rulesets")
    session.show(book.describe(arg))


@command(":trace on|off", "print every rewrite step (to stderr) while evaluating")
def _trace(session, arg):
    session.program.options["trace"] = _switch(arg, session.program.options.get("trace"), "trace", ("on", "off"))
    session.say("trace is %s" % ("on" if session.program.options["trace"] else "off"))


@command(":check on|off", "check a rule file's rules numerically as it is loaded (on), or not (off: --unchecked)")
def _check(session, arg):
    unchecked = session.program.options.get("unchecked")
    on = _switch(arg, not unchecked, "check", ("on", "off"))
    session.program.options["unchecked"] = not on
    session.say("check is %s" % ("on" if on else "off: rule files load without the numerical check of their rules"))


@command(":pager on|off|auto", "long output: page it (on), cut it with a note (off), page when possible (auto)")
def _pager(session, arg):
    if arg:
        _switch(arg, None, "pager", ("on", "off", "auto"))
        session.pager = arg
    session.say("pager is %s" % session.pager)


@command(":who", "the names this session has declared and defined, by kind")
def _who(session, arg):
    session.show(who(session.program) or "nothing declared or defined yet")


@command(":reset", "start afresh: forget every declaration and definition (options and --rules stay)")
def _reset(session, arg):
    session.reset()
    session.say("the session is empty")


@command(":time EXPR", "evaluate EXPR (or any input), show it, and say how long it took")
def _time(session, arg):
    if not arg:
        raise FdslError("usage: :time EXPR")
    session.paging = 0.0  # the time spent in the pager is the reader's, not the work's
    wall, cpu = time.perf_counter(), time.process_time()
    ok = session.run(arg)
    wall = time.perf_counter() - wall - session.paging
    session.say("time: %.3f s (cpu %.3f s)%s" % (wall, time.process_time() - cpu, "" if ok else ", failed"))


@command(":diagram EXPR [-o FILE]", "draw the term graph of EXPR with Graphviz, to FILE or a temporary file")
def _diagram(session, arg):
    m = re.fullmatch(r"(.*?)\s+(?:-o|--output)\s+(\S+)", arg)
    expr, path = (m.group(1), m.group(2)) if m else (arg, None)
    if not expr:
        raise FdslError("usage: :diagram EXPR [-o FILE]")
    if path is None:  # not into the current folder unless asked: a file of its own in the temp folder
        fd, path = tempfile.mkstemp(prefix="diagram-", suffix=".svg", dir=session.drawings())
        os.close(fd)
    else:  # only inside the session's folder, as a program's own outputs
        from ..base.files import confine, target_of

        path = confine(session.program.base_dir, path, "the repl", absolute=True)
        target_of(path)
    arg = expr
    try:
        from ..pictures import graphviz as backend
    except ImportError:
        backend = None
    draw = getattr(backend, "diagram_command", None)
    if draw is None:
        session.say("diagrams are unavailable: this fdsl has no Graphviz backend (fdsl.pictures.graphviz)")
        return
    result = draw(session.program, arg, path)
    if result:
        session.show(str(result))


@command(":help [NAME]", "what you can type; with a NAME, the doc of that function, statement or command")
def _help(session, arg):
    session.show(help_text(session.program, arg.strip()), ":help NAME shows one entry")


@command(":quit", "leave the repl (so does Ctrl-D)")
def _quit(session, arg):
    session.done = True


def _switch(arg, current, what, choices):
    arg = arg.strip()
    if not arg and current is not None:
        return current
    if arg not in choices:
        raise FdslError("usage: :%s %s" % (what, "|".join(choices)))
    return arg == "on" if choices == ("on", "off") else arg


def _operators(program) -> dict:
    """Name -> Op of the function-style operators of the session's program: the built-in ones and
    those its rule files declared (another program's are not this one's)."""
    from ..core.ops import OPS

    book = getattr(program, "rulebook", None)
    if book is not None and hasattr(book, "operator_names"):
        return {n: book.operator(n) for n in book.operator_names()}
    return {n: op for n, op in OPS.items() if op.kind == "function" and not op.user}


def help_text(program, name: str = "") -> str:
    """The ``:help`` page: commands, statements, functions (signature and doc), operators."""
    from ..core.functions import FUNCTIONS
    from ..lang.statements import STATEMENTS

    operators = _operators(program)
    if name:
        name = name.lstrip(":")
        own = describe_name(program, name)
        if own is not None:
            return own
        if name in FUNCTIONS:
            return "%s\n    %s" % (FUNCTIONS[name].signature, FUNCTIONS[name].doc)
        if name in operators:
            return "%s\n    %s" % (_op_signature(operators[name]), operators[name].doc)
        if name in STATEMENTS:
            return "%s\n    %s" % (STATEMENTS[name].usage, STATEMENTS[name].doc)
        if name in COMMANDS:
            return "%s\n    %s" % (COMMANDS[name].usage, COMMANDS[name].doc)
        if program.rulebook is not None and hasattr(program.rulebook, "ruleset_names") \
                and name in program.rulebook.ruleset_names():
            return "%s(E)\n    a ruleset: :rules %s shows its rules" % (name, name)
        raise FdslError("no help for %r: it is not a name of this session, a function, operator, statement or "
                        "command (:who lists the session's names)" % name)

    def table(rows, columns=80):
        # an 80-column terminal: the first column is as wide as its usual entries (a longer one
        # stands on a line of its own) and the descriptions wrap beside it
        rows = list(rows)
        width = min(max((len(a) for a, _ in rows), default=0), 22)
        out = []
        for a, b in rows:
            wrapped = textwrap.wrap(b, columns - width - 4, break_long_words=False, break_on_hyphens=False) or [""]
            if len(a) > width:
                out += textwrap.wrap(a, columns, initial_indent="  ", subsequent_indent="      ",
                                     break_long_words=False)
                out += ["  %-*s  %s" % (width, "", line) for line in wrapped]
            else:
                out.append("  %-*s  %s" % (width, a, wrapped[0]))
                out += ["  %-*s  %s" % (width, "", line) for line in wrapped[1:]]
        return out

    lines = ["Type fdsl: declarations (dim, const, scalar, weight), definitions (name = expr,",
             "f(i, Z) = expr, name := expr), statements, or an expression alone to show it.",
             "A line with open brackets or ending in an operator continues on the next.",
             "Up-arrow recalls, Ctrl-R searches the history, Tab completes names, Ctrl-C",
             "cancels.",
             "", "Commands:"]
    lines += table((c.usage, c.doc) for c in COMMANDS.values())
    lines += ["", "Statements:"]
    lines += table((s.usage, s.doc) for s in STATEMENTS.values())
    lines += ["", "Functions:"]
    lines += table((f.signature, f.doc) for _, f in sorted(FUNCTIONS.items()))
    lines += ["", "Operators:"]
    lines += table((_op_signature(op), op.doc) for _, op in sorted(operators.items()))
    if program.rulebook is not None and hasattr(program.rulebook, "ruleset_names"):
        lines += ["", "Rulesets (call as NAME(E); :rules NAME shows the rules):",
                  *textwrap.wrap(", ".join(program.rulebook.ruleset_names()), 78, initial_indent="  ",
                                 subsequent_indent="  ")]
    return "\n".join(lines)


def describe_name(program, name: str) -> Optional[str]:
    """What a name of the session is: a dim, a symbol or family (kind, shape, where declared), a
    definition (its value and shape) or a function's clauses; None if it is none of these."""
    from ..core.functions import render

    where = program.declared_at.get(name)
    where = "  (%s)" % where if where else ""
    if name in program.dims:
        size = program.dims[name]
        return "dim %s%s%s" % (name, "" if size is None else " = %d" % size, where)
    if name in program.symbols:
        t = program.symbols[name]
        return "%s %s : %s%s" % (t.data[0].kind, name, _shape_text(t), where)
    if name in program.families:
        fam = program.families[name]
        return "%s %s[%s] : %s x %s%s" % ((fam.kind, name, ", ".join(fam.indices)) + tuple(fam.shape) + (where,))
    if name in program.definitions:
        value = program.definitions[name]
        shown = render(value.args[0] if isinstance(value, Term) and value.op == "let" else value)
        sign = ":=" if isinstance(value, Term) and value.op == "let" else "="
        if "\n" in shown:  # a normal form, a term with bindings: laid out as show lays it out, indented
            lines = ["%s %s" % (name, sign)] + ["    " + line for line in shown.splitlines()]
        else:
            lines = ["%s %s %s" % (name, sign, shown)]
        if isinstance(value, Term):
            lines.append("    shape %s" % _shape_text(value))
        return "\n".join(lines)
    if name in program.clauses:
        lines = []
        for c in program.clauses[name]:
            text = c.source[1].splitlines()[c.line - 1].split("#")[0].strip() if c.source[1] else name
            lines.append("%s  (%s:%d)" % (text, c.source[0], c.line))
        return "\n".join(lines)
    return None


def _shape_text(t) -> str:
    return "scalar" if t.scalar else "(%s x %s)" % t.shape


def who(program) -> str:
    """``:who``: the session's names, one line per kind."""
    kinds = [("dims", list(program.dims)), ("weights", []), ("consts", []), ("scalars", []),
             ("definitions", [n for n in program.definitions if n != "_"]),
             ("functions", ["%s(%s)" % (n, ", ".join(map(str, cs[-1].params))) for n, cs in program.clauses.items()])]
    table = dict(kinds)
    for name, t in program.symbols.items():
        table.setdefault(t.data[0].kind + "s", []).append(name)
    for name, fam in program.families.items():
        table.setdefault(fam.kind + "s", []).append("%s[%s]" % (name, ", ".join(fam.indices)))
    return "\n".join("%-12s %s" % (kind + ":", ", ".join(names)) for kind, names in table.items() if names)


def _op_signature(op) -> str:
    params = op.params or tuple("ABCDEFGH"[: op.arity or 2])
    return "%s(%s)" % (op.shown, ", ".join(params))


# ---- the session ---------------------------------------------------------------------------------


class Session:
    """One Program fed input after input; knows how to show output on this terminal."""

    def __init__(self, out=None, err=None, pager: Optional[str] = None):
        from ..lang.program import Program

        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.program = Program("<repl>", Path.cwd())
        self.program.trace_out = self.err
        self.pager = pager or os.environ.get("FDSL_PAGER", "auto").strip().lower() or "auto"
        self.paging = 0.0  # seconds spent in the pager, which :time leaves out
        if self.pager not in ("on", "off", "auto"):
            self.pager = "auto"
        self.rule_files: list = []  # --rules given on the command line: :reset keeps them
        self.done = False
        self.failed = False  # some input failed: the exit status of a script run is 2
        self._drawings: Optional[Path] = None

    def drawings(self) -> Path:
        """The session's folder for ``:diagram``'s pictures: made on first use by mkdtemp (mode 0700,
        a name no one can guess), so no folder another user made first in the shared temp folder
        (a planted ``fdsl-UID``) can refuse or receive them. Kept after the session: a viewer may
        still be opening its pictures."""
        if self._drawings is None or not self._drawings.is_dir():
            try:
                self._drawings = Path(tempfile.mkdtemp(prefix="fdsl-diagrams-"))
            except OSError as e:
                raise FdslError("cannot make a folder for the diagram in %s: %s; use :diagram EXPR -o FILE"
                                % (tempfile.gettempdir(), e.strerror or e)) from None
        return self._drawings

    def reset(self) -> None:
        """A fresh program with this session's options and rule files (``:reset``)."""
        from ..lang.program import Program

        old = self.program
        self.program = Program("<repl>", Path.cwd())
        self.program.trace_out = self.err
        self.program.options.update(old.options)
        for path in self.rule_files:
            self.program.load_rules(path)

    # ---- doing one input
    def run(self, text: str, line: int = 1, filename: str = "<repl>") -> bool:
        """Do one input (fdsl or a :command); report errors and go on. False if it failed.
        ``line``: where the input starts in ``filename`` (piped input counts its lines)."""
        if not text.strip():
            return True
        try:
            stripped = text.strip()
            asked = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*\?", stripped)  # NAME? as in IPython
            if asked:
                _help(self, asked.group(1))
            elif stripped.startswith(":"):
                word, _, arg = stripped[1:].partition(" ")
                self.find_command(word).run(self, arg.strip())
            else:
                # blank lines in front keep the line numbers of errors those of the whole input
                self._feed("\n" * (line - 1) + joined(text), filename, hint=_shown_expression(text))
            return True
        except FdslError as e:
            # a position only means something for fdsl text; a :command's error is its message
            self._error(str(e) if e.file or e.line is not None else "\n".join([e.message] + e.notes))
        except KeyboardInterrupt:
            self._error("interrupted")
        except OSError as e:  # writing a file an effect asked for
            self._error("%s: %s" % (getattr(e, "filename", None) or "error", e.strerror or e))
        except RecursionError:
            self._error("too deeply nested to evaluate here")
        except Exception as e:  # a bug in fdsl: say so, and keep the session alive
            import traceback

            detail = traceback.format_exc() if os.environ.get("FDSL_DEBUG") else \
                "%s: %s (set FDSL_DEBUG=1 to see the traceback)" % (type(e).__name__, e)
            self._error("internal error, a bug in fdsl: " + detail.rstrip())
        self.failed = True
        return False

    def load(self, path: str) -> None:
        """Feed a .fd file; its relative paths (rules, values, save) are relative to the file."""
        from ..base.inputs import read_source

        p = Path(path).expanduser()
        text = read_source(p, "file")
        saved = self.program.base_dir
        self.program.base_dir = p.resolve().parent
        try:
            self._feed(text, str(p))
        except Redeclared as e:  # the file, or one declaring the same names, was loaded before
            e.notes.append("note: the session already holds what this file declares; :reset forgets the "
                           "session (options and --rules stay), then :load it again")
            raise
        finally:
            self.program.base_dir = saved

    def _feed(self, text: str, filename: str, hint: Optional[str] = None) -> None:
        program = self.program
        program.last_shown = None
        try:
            program.feed(text, filename)
        except BaseException:
            # an input that fails does nothing, as a file that fails prints nothing
            program.effects.clear()
            raise
        if program.last_shown is not None:
            program.definitions["_"] = program.last_shown  # _ is the last value shown
        for note in program.notes:  # E redefined (it was defined at <repl>:1)
            self.say(note)
        program.notes.clear()
        try:
            self.perform(program.effects, hint)
        finally:
            program.effects.clear()

    def perform(self, effects, hint: Optional[str] = None) -> None:
        """Perform the effects of an input that succeeded: write its files, show its output (a
        face other than the terminal, ``fdsl serve``, shows them its own way)."""
        from ..base.files import perform_all

        buf = io.StringIO()
        try:
            perform_all(effects, buf, self.program)
        finally:
            self.show(buf.getvalue(), hint)

    def find_command(self, word: str) -> "Command":
        """The :command that ``word`` names (a face may put its own in place of one)."""
        return find_command(word)

    # ---- output
    def say(self, text: str) -> None:
        self.out.write(printable(text) + "\n")  # a string or a file name typed with \x1b in it stays text
        self.out.flush()

    def _error(self, text: str) -> None:
        self.out.flush()
        self.err.write(printable(text) + "\n")
        self.err.flush()

    def show(self, text: str, hint: Optional[str] = None) -> None:
        """Print output; if it is longer than the terminal, page it or cut it with a note."""
        text = printable(text.rstrip("\n"))
        if not text:
            return
        if not _isatty(self.out):
            self.say(text)
            return
        size = shutil.get_terminal_size()
        cols, limit = max(size.columns, 20), max(size.lines - 3, 8)
        rows = _screen_rows(text, cols)
        if len(rows) <= limit:
            self.say(text)
            return
        if self.pager != "off":
            pager = _pager_command(self.pager == "on")
            if pager is None and self.pager == "on":
                self.say(text)
                return
            start = time.perf_counter()
            paged = pager is not None and _page(pager, text + "\n")
            self.paging += time.perf_counter() - start
            if paged:
                return
        # the note takes rows too when it wraps; this one is at least as long as the final one
        shown = max(limit - len(_screen_rows(cut_note(len(rows), hint), cols)), 1)
        self.say("\n".join(rows[:shown]))
        self.say(cut_note(len(rows) - shown, hint))


def cut_note(more: int, hint: Optional[str]) -> str:
    """The line that replaces cut output: how much is missing and how to see the rest. ``hint``
    is the expression shown, or another way to see part of the output, starting with ':'."""
    from ..core.functions import FUNCTIONS

    ways = []
    if hint and hint.startswith(":"):
        ways.append(hint)
    elif hint:
        one, count = summand_hints(hint)
        ways.append("see one summand with " + one)
        if "len" in FUNCTIONS:
            ways.append("count them with " + count)
    ways.append(":pager on shows everything")
    return "... (cut: %d more row%s; %s)" % (more, "" if more == 1 else "s", ", ".join(ways))


# Functions that only print their argument: a summand of html(x) is html(x[j]).
_PRINTERS = ("html", "string", "latex", "text")


def summand_hints(expr: str) -> tuple[str, str]:
    """How to see one summand of ``expr``, and how to count them: ``forms(2)`` gives
    ``forms(2, j)`` and ``len(forms(2))``; ``html(z)`` gives ``html(z[j])`` and ``len(z)``."""
    name, inner = _call_parts(expr)
    if name in _PRINTERS and _top_level_commas(inner) == 0:
        one, count = summand_hints(inner)
        return "%s(%s)" % (name, one), count
    if name == "forms" and _top_level_commas(inner) == 0:
        return "forms(%s, j)" % inner, "len(%s)" % expr
    return "%s[j]" % (expr if name is not None or re.fullmatch(r"[A-Za-z]\w*", expr) else "(%s)" % expr), \
        "len(%s)" % expr


def _call_parts(expr: str):
    """(name, argument text) if ``expr`` is one call ``name(...)``, else (None, None)."""
    m = re.match(r"([A-Za-z][A-Za-z0-9_]*)\(", expr)
    if not m or not expr.endswith(")"):
        return None, None
    depth = 0
    for i in range(m.end() - 1, len(expr)):
        if expr[i] in "([":
            depth += 1
        elif expr[i] in ")]":
            depth -= 1
            if depth == 0:
                return (m.group(1), expr[m.end():-1]) if i == len(expr) - 1 else (None, None)
    return None, None


def _shown_expression(text: str) -> Optional[str]:
    """The expression an input shows, if it is one expression alone or ``show EXPR``."""
    one = text.strip()
    if "\n" in one or ";" in one:
        return None
    one = re.sub(r"^show\s+", "", one)
    one = re.sub(r"\s*#.*$", "", one) if '"' not in one else one
    if not one or re.match(r"^(dim|const|scalar|weight|rules|values|random|save)\b", one) \
            or _top_level_commas(one) or re.search(r"(?<![:<>=!])=", one):
        return None
    return one


def _top_level_commas(text: str) -> int:
    depth = commas = 0
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            commas += 1
    return commas


def _screen_rows(text: str, cols: int) -> list[str]:
    rows = []
    for line in text.split("\n"):
        line = line.expandtabs()
        rows.extend(line[i:i + cols] for i in range(0, max(len(line), 1), cols))
    return rows


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _pager_command(forced: bool) -> Optional[str]:
    """``$PAGER`` if it runs, else ``less``; None without one, or on a dumb terminal (unless forced)."""
    if not forced and os.environ.get("TERM", "dumb") in ("dumb", "emacs", ""):
        return None
    for cmd in (os.environ.get("PAGER", ""), "less"):
        try:
            words = shlex.split(cmd)
        except ValueError:
            continue
        if words and shutil.which(words[0]):
            return cmd
    return None


def _page(cmd: str, text: str) -> bool:
    """Show text through the pager; False if it could not be started."""
    env = dict(os.environ)
    env.setdefault("LESS", "-R")
    try:
        proc = subprocess.Popen(cmd, shell=True, stdin=subprocess.PIPE, env=env,
                                encoding="utf-8", errors="backslashreplace")
    except OSError:
        return False
    try:
        proc.stdin.write(text)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # the reader quit before reading everything: that is what 'q' does
    while True:
        try:
            proc.wait()
            return True
        except KeyboardInterrupt:
            continue  # Ctrl-C belongs to the pager while it runs
