"""The repl as a person uses it: a real pseudo-terminal, prompt_toolkit's own prompt, keys sent
as a terminal sends them (Tab, the up-arrow's escape sequence, Ctrl-C, Ctrl-D).

Synchronisation: prompt_toolkit turns bracketed paste on (ESC[?2004h) each time it starts reading
an input and off (ESC[?2004l) once the input is accepted, so what the repl prints for an input is
exactly the text between the two. No sleeps decide anything; every wait has a generous timeout.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")

ROOT = Path(__file__).resolve().parents[1]
ROWS, COLS = 40, 120
ACCEPTED = r"\x1b\[\?2004l"
READING = r"\x1b\[\?2004h"
TIMEOUT = 30

# What show prints for encoder(1) in examples/encoder2.fd.
ENCODER1 = "m(a(s X Q_0 K_0^t X^t) X V_0 + C b_0) W_0 + C f_0"


def coloured(text: str) -> str:
    """A pattern for ``text`` as the prompt draws it: highlighted, with colour escapes between tokens."""
    return r"(\x1b\[[0-9;]*m)*".join(re.escape(c) for c in text)


class Terminal:
    """``fdsl repl ARGS`` in a pseudo-terminal of ROWS x COLS."""

    def __init__(self, *args, history: Path, pager="off", **env):
        environ = dict(os.environ, TERM="xterm", FDSL_HISTORY=str(history), FDSL_PAGER=pager,
                       PROMPT_TOOLKIT_NO_CPR="1",  # pexpect does not answer cursor-position requests
                       PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **env)
        if "PAGER" not in env:
            environ.pop("PAGER", None)  # the user's pager setting must not leak into the test
        self.child = pexpect.spawn(sys.executable, ["-m", "fdsl.cli", "repl", *args], cwd=str(ROOT), env=environ,
                                   encoding="utf-8", timeout=TIMEOUT, dimensions=(ROWS, COLS))
        self.startup = self._until_reading()

    def _until_reading(self) -> str:
        self.child.expect(READING)
        text = self.child.before
        self.child.expect("fdsl>")
        return _clean(text)

    def run(self, line: str) -> str:
        """Type ``line`` and Enter; return what the repl printed before its next prompt."""
        self.child.send(line + "\r")
        self.child.expect(ACCEPTED)
        return self._until_reading()

    def keys(self, keys: str) -> None:
        self.child.send(keys)

    def quit_with(self, keys: str) -> int:
        self.child.send(keys)
        self.child.expect(pexpect.EOF)
        self.child.close()
        return self.child.exitstatus

    def close(self):
        if self.child.isalive():
            self.child.close(force=True)


def _clean(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "")


@pytest.fixture
def terminal(tmp_path):
    """Start terminals that share one history file; close them all at the end."""
    opened = []

    def start(*args, **kw):
        kw.setdefault("history", tmp_path / "history")
        t = Terminal(*args, **kw)
        opened.append(t)
        return t

    yield start
    for t in opened:
        t.close()


def test_start_with_a_file_then_type_expressions(terminal):
    t = terminal("examples/encoder2.fd")
    assert "fdsl repl" in t.startup and t.startup.count("-trace(E^t dE)") == 1  # show w
    assert t.run("6*7") == "42\n"
    assert t.run("shape(E)") == "(n x d)\n"
    assert t.run("encoder(1)") == ENCODER1 + "\n"
    assert t.run("show string(encoder(1))") == "m(a(s X Q[0] K[0]^t X^t) X V[0] + C b[0]) W[0] + C f[0]\n"
    assert t.quit_with(":quit\r") == 0


def test_load_a_file_into_the_session(terminal):
    t = terminal()
    assert "unknown name 'E'" in t.run("E")
    out = t.run(":load examples/encoder2.fd")
    assert out.startswith("-trace(E^t dE)\n")
    assert t.run("shape(E)") == "(n x d)\n"
    assert "nowhere.fd: cannot read this file" in t.run(":load nowhere.fd")
    assert t.quit_with("\x04") == 0  # Ctrl-D


def test_syntax_error_shows_the_caret_and_the_session_goes_on(terminal):
    t = terminal("examples/encoder2.fd")
    out = t.run("show 1 +* 2").splitlines()
    assert out[0].startswith("<repl>:1:9: unexpected '*'")
    assert out[1] == "    show 1 +* 2"
    assert out[2] == " " * out[1].index("*") + "^"
    assert t.run("6*7") == "42\n"
    assert t.run("nodes(encoder(1))") != ""  # definitions survive errors


def test_definitions_accumulate_and_inputs_continue_over_lines(terminal):
    t = terminal("examples/encoder2.fd")
    t.keys("x = (X\r")  # open bracket: the input continues
    t.child.expect(r"\.\.\.")
    assert t.run("+ Y)") == ""
    assert t.run("x") == "X + Y\n"
    t.keys("y = x -\r")  # trailing operator: the input continues
    t.child.expect(r"\.\.\.")
    assert t.run("X") == ""
    assert t.run("y") == "X + Y - X\n"
    t.keys("show (1 +\r")  # an empty continuation line gives up and shows the error
    t.child.expect(r"\.\.\.")
    assert "expected" in t.run("")
    assert t.run("6*7") == "42\n"


def test_up_arrow_recalls_and_reruns_the_previous_input(terminal):
    t = terminal("examples/encoder2.fd")
    assert t.run("6*7") == "42\n"
    assert t.run("shape(X)") == "(n x d)\n"
    t.keys("\x1b[A")  # up: shape(X)
    t.keys("\x1b[A")  # up again: 6*7
    t.child.expect(r"\*7")  # on the screen (prompt_toolkit redraws only what changed), then Enter
    assert t.run("") == "42\n"


def test_tab_completes_declared_names_and_commands(terminal):
    t = terminal("examples/encoder2.fd")
    # completion is asynchronous in prompt_toolkit: wait for what it adds to appear on the screen
    # (prompt_toolkit redraws only what changed) before typing on
    t.keys("enco\t")
    t.child.expect(r"der(\x1b\[[0-9;]*m)*\(")  # the input is highlighted: colours between the letters
    assert t.run("1)") == ENCODER1 + "\n"
    t.keys("layern\t")  # (lay is layer or layernorm)
    t.child.expect(r"orm(\x1b\[[0-9;]*m)*\(")
    assert t.run("X)") == "layernorm(X)\n"
    t.keys(":he\t")
    t.child.expect("lp")
    assert t.run("string").startswith("string(E)\n")


def test_help_lists_commands_statements_and_functions(terminal):
    t = terminal()
    out = t.run(":help")
    for expected in (":load FILE", ":rules [RULESET]", ":trace on|off", ":quit", ":diagram EXPR",
                     "show EXPR", 'rules "FILE.rules"'):
        assert expected in out
    assert t.run(":help html") == "html(E)\n    E as an HTML fragment, in the manual's style\n"
    assert "mm(A, B) = [A > 0] o B" in t.run(":help mm")


def test_commands_trace_rules_diagram(terminal):
    t = terminal()
    assert t.run(":trace on") == "trace is on\n"
    assert t.run(":trace off") == "trace is off\n"
    assert t.run(":rules").strip() != ""  # the rulesets, or 'no rules loaded'
    assert "usage: :diagram EXPR" in t.run(":diagram")
    assert "unknown command :frobnicate" in t.run(":frobnicate")


def test_history_is_kept_across_sessions(terminal, tmp_path):
    first = terminal()
    assert first.run("show 1234 + 1") == "1235\n"
    assert first.quit_with("\x04") == 0  # Ctrl-D: a :quit would be the newest history entry
    assert "show 1234 + 1" in (tmp_path / "history").read_text()
    second = terminal()
    for _ in range(TIMEOUT):  # prompt_toolkit loads the history file in the background: press up until it is there
        second.keys("\x1b[A")
        if second.child.expect([coloured("show 1234 + 1"), pexpect.TIMEOUT], timeout=1) == 0:
            break
    else:
        pytest.fail("the up-arrow did not recall the previous session's input")
    assert second.run("") == "1235\n"
    assert second.run("6*7") == "42\n"
    second.keys("\x12" + "1234")  # Ctrl-R: search back for 1234
    second.child.expect(coloured("+ 1"))  # the line found is on the screen
    second.keys("\r")  # Enter ends the search with the line found; the next Enter runs it
    assert second.run("") == "1235\n"


def test_ctrl_c_cancels_the_input_being_typed(terminal):
    t = terminal()
    t.keys("show unknown_thing")
    t.keys("\x03")
    t.child.expect(ACCEPTED)
    assert "unknown" not in t._until_reading()
    assert t.run("6*7") == "42\n"


def test_ctrl_c_interrupts_a_long_evaluation(terminal):
    t = terminal()
    t.run("dim n = 2; const X : n x n")
    # 2^30 distinct calls (each has its own Z): far longer than this test waits
    t.run("g(0, Z) = Z; g(L, Z) = g(L-1, Z + X) + g(L-1, Z - X)")
    t.keys("nodes(g(30, X))\r")
    t.child.expect(ACCEPTED)
    for _ in range(TIMEOUT):  # Ctrl-C until the evaluation has started and takes it
        t.keys("\x03")
        if t.child.expect(["interrupted", pexpect.TIMEOUT], timeout=1) == 0:
            break
    else:
        pytest.fail("Ctrl-C did not interrupt the evaluation")
    t.child.expect("fdsl>")
    assert t.run("6*7").endswith("42\n")


def test_long_output_is_cut_with_a_note(terminal):
    t = terminal("examples/encoder2.fd")
    # the 55 summands of the manual's form on one line (string() would name what they repeat)
    out = t.run("text(forms(E))").splitlines()
    assert all(len(row) == COLS for row in out[:-1])  # one long line, cut into screen rows
    note_rows = -(-len(out[-1]) // COLS)
    assert len(out) - 1 + note_rows == ROWS - 3  # the screen less the prompt and a line of context
    assert re.fullmatch(r"\.\.\. \(cut: \d+ more rows; see one summand with text\(forms\(E, j\)\).*"
                        r":pager on shows everything\)", out[-1])


def test_pager_on_pages_long_output(terminal):
    t = terminal("examples/encoder2.fd", PAGER="cat")
    assert t.run(":pager on") == "pager is on\n"
    out = t.run("text(forms(E))")
    assert "cut:" not in out
    assert len(out.replace("\n", "")) > (ROWS * COLS)


def test_manual_session(terminal):
    """The manual's console: z = flatten(expandmm(expandAll(form(encoder(2))))), len(z), one summand."""
    from fdsl.core.functions import FUNCTIONS
    from fdsl.lang.program import Program

    book = Program().rulebook  # making a Program registers the built-in functions
    if "expandAll" not in FUNCTIONS and not (book is not None and book.has_ruleset("expandAll")):
        pytest.skip("the rewrite engine (expandAll, expandmm, flatten, shiftmm, cycle) is not there yet")
    t = terminal("examples/encoder2.fd")
    assert t.run("z = flatten(expandmm(expandAll(form(encoder(2)))))") == ""
    count = t.run("len(z)")
    assert re.fullmatch(r"\d+\n", count) and int(count) > 13
    word = t.run("cycle(shiftmm(z[13]))").strip().split("\nwhere\n")[0]  # then what it repeats, named
    # cycle brings a differential of a weight to the end of the word
    assert re.search(r"d[A-Za-z]\w*(\^t)?\)*$", word), word


def test_piped_input_runs_without_a_terminal():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    ok = subprocess.run([sys.executable, "-m", "fdsl.cli", "repl", "examples/encoder2.fd"], cwd=ROOT, env=env,
                        input="x = (X +\n  Y)\nshow x\nshape(E)\ntext(forms(E))\n", capture_output=True,
                        text=True, timeout=TIMEOUT)
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert lines[-3:-1] == ["X + Y", "(n x d)"]  # after what the file shows
    assert len(lines[-1]) > 20000 and "cut:" not in ok.stdout  # not a terminal: nothing is cut
    bad = subprocess.run([sys.executable, "-m", "fdsl.cli", "repl"], cwd=ROOT, env=env,
                         input="show 1\nshow foo\nshow 2\n", capture_output=True, text=True, timeout=TIMEOUT)
    assert bad.stdout == "1\n2\n"
    assert "<stdin>:2:6: unknown name 'foo'" in bad.stderr  # the line of the input that failed
    assert bad.returncode == 2


def test_the_prompt_highlights_what_is_typed(terminal):
    t = terminal()
    t.keys("dim n")
    # the keyword is drawn with a colour: an SGR escape (ESC [ ... m) right before it
    t.child.expect(r"\x1b\[[0-9;]*m\s*dim")
    assert t.run("") == ""
    assert t.run("n?") == "dim n  (dim at <repl>:1)\n"
    assert t.run("6*7") == "42\n" and t.run("_ + 1") == "43\n"  # _ is the last value shown
    assert t.quit_with(":quit\r") == 0
