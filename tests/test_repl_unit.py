"""The repl's parts without a terminal: when an input is complete, commands, long output, completion,
script mode. tests/test_repl.py drives the whole thing through a pseudo-terminal."""

from __future__ import annotations

import io
import os
import sys
import types
from pathlib import Path

import pytest

import fdsl.pictures
from fdsl import repl
from fdsl.core.functions import FUNCTIONS, Function

ROOT = Path(__file__).resolve().parents[1]
ENCODER2 = str(ROOT / "examples" / "encoder2.fd")


class Tty(io.StringIO):
    def isatty(self):
        return True


def session(out=None, pager="off"):
    return repl.Session(out=out or io.StringIO(), err=io.StringIO(), pager=pager)


def output(s):
    return s.out.getvalue()


def errors(s):
    return s.err.getvalue()


@pytest.fixture
def encoder2():
    s = session()
    assert s.run(":load " + ENCODER2)
    s.out.seek(0)
    s.out.truncate()
    return s


# ---- when is an input complete ---------------------------------------------------------------------


@pytest.mark.parametrize("text, more", [
    ("show 1", False),
    ("x = (X", True),
    ("x = (X\n+ Y)", False),
    ("f(", True),
    ("Q[0", True),
    ("y = x -", True),
    ("y = x -\nX", False),
    ("E = Y - encoder(2) *", True),
    ("e :=", True),
    ("weight Q :", True),
    ("show x # a comment (", False),
    ('show "a (string"', False),
    ("show x^t", False),
    ("show (1))", False),  # too many closing brackets: complete, the parser says what is wrong
    (":load odd(name", False),  # commands are one line
])
def test_needs_more(text, more):
    assert repl.needs_more(text) is more


def test_joined_continues_lines_that_end_in_an_operator():
    assert repl.joined("y = x -\nX") == "y = x -\\\nX"
    assert repl.joined("x = (X +\nY)") == "x = (X +\nY)"  # inside brackets newlines are already spaces
    assert repl.joined("a = (b +\nc) *\nd") == "a = (b +\nc) *\\\nd"


def test_a_continued_definition_is_one_statement(encoder2):
    assert encoder2.run("y = X -\nY")
    assert encoder2.run("y")
    assert output(encoder2) == "X - Y\n"


# ---- doing inputs -----------------------------------------------------------------------------------


def test_expressions_definitions_and_errors(encoder2):
    s = encoder2
    assert s.run("6*7") and s.run("z = X + Y") and s.run("show z, shape(z)")
    assert output(s) == "42\nX + Y\n(n x d)\n"
    assert not s.run("show 1; show foo")  # an input that fails does nothing at all
    assert output(s) == "42\nX + Y\n(n x d)\n"
    assert errors(s).startswith("<repl>:1:14: unknown name 'foo'")
    assert s.program.effects == []
    assert s.failed


def test_a_command_error_is_its_message_without_a_position():
    s = session()
    assert not s.run(":frobnicate")
    assert errors(s).startswith("unknown command :frobnicate; the commands are :load, ")
    assert not s.run(":tr maybe")  # :trace and nothing else starts with tr
    assert "usage: :trace on|off" in errors(s)


def test_commands_can_be_abbreviated():
    s = session()
    assert s.run(":tr on")
    assert s.program.options["trace"] is True
    assert s.run(":tr off") and s.program.options["trace"] is False
    assert output(s) == "trace is on\ntrace is off\n"


def test_ambiguous_abbreviation():
    s = session()
    repl.COMMANDS["lint"] = repl.Command("lint", ":lint", "test only", lambda session, arg: None)
    try:
        assert not s.run(":l x")
        assert ":l is ambiguous: :load, :lint" in errors(s)
    finally:
        del repl.COMMANDS["lint"]


def test_load_resolves_paths_relative_to_the_file(tmp_path):
    (tmp_path / "mine.rules").write_text("ruleset mine\nrule mine-relu: m(m(?A)) => m(?A)\n")
    (tmp_path / "prog.fd").write_text('rules "mine.rules"\ndim n = 2\nconst A : n x n\nshow mine(m(m(A)))\n')
    s = session()
    before = s.program.base_dir
    assert s.run(":load %s" % (tmp_path / "prog.fd")), errors(s)
    assert output(s) == "m(A)\n"
    assert s.program.base_dir == before  # at the prompt, relative paths are relative to where you are
    assert s.run(":rules mine")
    assert "rule mine-relu" in output(s)


def test_load_of_a_missing_file():
    s = session()
    assert not s.run(":load /nonexistent/x.fd")
    assert errors(s).startswith("/nonexistent/x.fd: cannot read this file")


def test_rules_without_a_rule_book():
    s = session()
    s.program.rulebook = None
    assert s.run(":rules") and s.run(":rules cycle")
    assert output(s) == "no rules loaded\nno rules loaded\n"


def test_rules_lists_and_describes():
    class Book:
        def ruleset_names(self):
            return ["expandAll", "cycle"]

        def describe(self, name):
            return "ruleset %s\n  rule one: ..." % name

    s = session()
    s.program.rulebook = Book()
    assert s.run(":rules") and s.run(":rules cycle")
    assert output(s) == "expandAll\ncycle\nruleset cycle\n  rule one: ...\n"
    assert not s.run(":rules nothing")
    assert "no ruleset 'nothing'; the rulesets are expandAll, cycle" in errors(s)


def test_diagram_through_the_graphviz_backend(monkeypatch):
    calls = []
    backend = types.ModuleType("fdsl.pictures.graphviz")
    backend.diagram_command = lambda program, text, path=None: calls.append(text) or "wrote diagram.svg"
    s = session()  # the language loads the real backend first; the repl must call the one there now
    monkeypatch.setitem(sys.modules, "fdsl.pictures.graphviz", backend)
    monkeypatch.setattr(fdsl.pictures, "graphviz", backend)
    assert s.run(":diagram form(E)")
    assert calls == ["form(E)"]
    assert output(s) == "wrote diagram.svg\n"


def test_diagram_without_the_backend(monkeypatch):
    s = session()
    monkeypatch.setitem(sys.modules, "fdsl.pictures.graphviz", None)  # import raises ImportError
    monkeypatch.delattr(fdsl.pictures, "graphviz")
    assert s.run(":diagram X")
    assert output(s).startswith("diagrams are unavailable")


def test_help_lists_every_function_and_command():
    s = session()
    assert s.run(":help")
    text = " ".join(output(s).split())  # the descriptions wrap to fit 80 columns
    for f in FUNCTIONS.values():
        assert " ".join(f.signature.split()) in text and " ".join(f.doc.split()) in text
    for c in repl.COMMANDS.values():
        assert c.usage in text
    assert s.run(":help len") and s.run(":help :load") and s.run(":help show")
    assert "\n:load FILE\n    load a .fd file" in output(s)
    assert not s.run(":help nosuchthing")


def test_quit_stops_a_script():
    s = session()
    repl.script(s, io.StringIO("show 1\n:quit\nshow 2\n"))
    assert output(s) == "1\n"
    assert s.done


def test_script_joins_lines_and_gives_up_on_an_empty_line():
    s = session()
    repl.script(s, io.StringIO("x = (1 +\n 2)\nshow x\nshow (1 +\n\nshow 5\nshow (6"))
    assert output(s) == "3\n5\n"
    # the abandoned input and the one cut off by the end, each at its line of the stream
    assert "<stdin>:4:10: " in errors(s) and "<stdin>:7:6: " in errors(s)


def test_an_interrupt_cancels_the_input(monkeypatch):
    def interrupted(program, *args):
        raise KeyboardInterrupt

    monkeypatch.setitem(FUNCTIONS, "slow", Function("slow", interrupted, 0, 0, "test only", "slow()"))
    s = session()
    assert not s.run("show 1; show slow()")
    assert errors(s) == "interrupted\n" and output(s) == ""
    assert s.run("show 2") and output(s) == "2\n"


def test_a_bug_in_fdsl_does_not_end_the_session(monkeypatch):
    def broken(program, *args):
        raise ZeroDivisionError("oops")

    monkeypatch.setitem(FUNCTIONS, "broken", Function("broken", broken, 0, 0, "test only", "broken()"))
    monkeypatch.delenv("FDSL_DEBUG", raising=False)
    s = session()
    assert not s.run("broken()")
    assert errors(s).startswith("internal error, a bug in fdsl: ZeroDivisionError: oops")
    assert s.run("show 2") and output(s) == "2\n"


# ---- long output ----------------------------------------------------------------------------------


@pytest.fixture
def screen(monkeypatch):
    """A 20 x 40 terminal."""
    monkeypatch.setattr(repl.shutil, "get_terminal_size", lambda *a: os.terminal_size((40, 20)))


LONG = "\n".join("line %d" % i for i in range(100))


def test_long_output_is_cut_on_a_terminal(screen):
    s = session(out=Tty(), pager="off")
    s.show(LONG, "forms(2)")
    lines = output(s).splitlines()
    assert lines[:3] == ["line 0", "line 1", "line 2"]
    note = lines[-1]
    assert note.startswith("... (cut: ") and "see one summand with forms(2, j)" in note
    assert "count them with len(forms(2))" in note and ":pager on shows everything" in note
    note_rows = -(-len(note) // 40)
    assert len(lines) - 1 + note_rows == 20 - 3
    assert note.startswith("... (cut: %d more rows" % (100 - (len(lines) - 1)))


def test_the_note_for_output_that_is_not_an_expression(screen):
    s = session(out=Tty(), pager="off")
    s.show(LONG)
    assert output(s).splitlines()[-1].endswith("more rows; :pager on shows everything)")
    s = session(out=Tty(), pager="off")
    s.run(":help")
    assert output(s).splitlines()[-1].endswith("more rows; :help NAME shows one entry, :pager on shows everything)")


def test_short_output_and_output_that_is_not_a_terminal_are_not_cut(screen):
    s = session(out=Tty(), pager="off")
    s.show("one\ntwo")
    assert output(s) == "one\ntwo\n"
    s = session(out=io.StringIO(), pager="off")
    s.show(LONG)
    assert output(s) == LONG + "\n"


def test_a_long_line_counts_as_the_rows_it_wraps_to(screen):
    s = session(out=Tty(), pager="off")
    s.show("x" * 40 * 30)
    rows = output(s).splitlines()
    assert rows[0] == "x" * 40 and "cut:" in rows[-1]


def test_pager_on_without_a_pager_prints_everything(screen, monkeypatch):
    monkeypatch.delenv("PAGER", raising=False)
    monkeypatch.setattr(repl.shutil, "which", lambda name: None)
    s = session(out=Tty(), pager="on")
    s.show(LONG)
    assert output(s) == LONG + "\n"


def test_pager_auto_on_a_dumb_terminal_cuts(screen, monkeypatch):
    monkeypatch.setenv("TERM", "dumb")
    monkeypatch.setenv("PAGER", "cat")
    s = session(out=Tty(), pager="auto")
    s.show(LONG)
    assert "cut:" in output(s)


def test_pager_setting():
    s = session(pager="auto")
    assert s.run(":pager off") and s.pager == "off"
    assert s.run(":pager") and output(s) == "pager is off\npager is off\n"
    assert not s.run(":pager sometimes")


def test_fdsl_pager_environment(monkeypatch):
    monkeypatch.setenv("FDSL_PAGER", "off")
    assert repl.Session(out=io.StringIO(), err=io.StringIO()).pager == "off"
    monkeypatch.setenv("FDSL_PAGER", "nonsense")
    assert repl.Session(out=io.StringIO(), err=io.StringIO()).pager == "auto"


@pytest.mark.parametrize("expr, one, count", [
    ("forms(2)", "forms(2, j)", "len(forms(2))"),
    ("html(forms(2))", "html(forms(2, j))", "len(forms(2))"),
    ("html(z)", "html(z[j])", "len(z)"),
    ("z", "z[j]", "len(z)"),
    ("E + X", "(E + X)[j]", "len(E + X)"),
    ("forms(x) + forms(y)", "(forms(x) + forms(y))[j]", "len(forms(x) + forms(y))"),
    ("forms(2, 3)", "forms(2, 3)[j]", "len(forms(2, 3))"),
])
def test_summand_hints(expr, one, count):
    assert repl.summand_hints(expr) == (one, count)


@pytest.mark.parametrize("text, shown", [
    ("forms(2)", "forms(2)"),
    ("show html(z)", "html(z)"),
    ("show a, b", None),
    ("z = forms(2)", None),
    ("show 1; show 2", None),
    ("dim n = 2", None),
])
def test_shown_expression(text, shown):
    assert repl._shown_expression(text) == shown


# ---- completion -----------------------------------------------------------------------------------


def completions(s, text):
    from prompt_toolkit.completion import CompleteEvent
    from prompt_toolkit.document import Document

    completer = repl._make_completer(s)
    event = CompleteEvent(completion_requested=True)
    return [c.text for c in completer.get_completions(Document(text, len(text)), event)]


def test_completion_of_declared_names(encoder2):
    assert completions(encoder2, "enco") == ["encoder("]
    assert completions(encoder2, "show lay") == ["layer(", "layernorm("]  # a definition, an operator
    assert completions(encoder2, "show Q") == ["Q["]
    assert "E" in completions(encoder2, "show E")
    assert "d" in completions(encoder2, "show d")  # the dim d; d( the operator also completes
    assert "d(" in completions(encoder2, "show d")
    assert completions(encoder2, "show string(en") == ["encoder("]
    assert completions(encoder2, 'show "enco') == []  # inside a string


def test_completion_of_functions_operators_rulesets_and_keywords(encoder2):
    assert {"expandAll(", "expandmm("} <= set(completions(encoder2, "show expand"))  # rulesets
    assert "mm(" in completions(encoder2, "show m")
    assert "html(" in completions(encoder2, "show ht")
    assert "show " in completions(encoder2, "sh")
    assert "show " not in completions(encoder2, "x = sh")  # keywords only start a statement


def test_completion_of_commands_and_their_arguments(encoder2, tmp_path, monkeypatch):
    assert completions(encoder2, ":he") == [":help "]
    assert completions(encoder2, ":trace o") == ["on", "off"]
    assert completions(encoder2, ":help enc") == ["encoder"]
    (tmp_path / "prog.fd").write_text("")
    monkeypatch.chdir(tmp_path)
    assert completions(encoder2, ":load pr") == ["og.fd"]


# ---- where the history lives ----------------------------------------------------------------------


def test_history_path(monkeypatch, tmp_path):
    monkeypatch.setenv("FDSL_HISTORY", str(tmp_path / "h"))
    assert repl.history_path() == tmp_path / "h"
    monkeypatch.delenv("FDSL_HISTORY")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert repl.history_path() == tmp_path / "data" / "fdsl" / "history"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert repl.history_path() == tmp_path / ".local" / "share" / "fdsl" / "history"
