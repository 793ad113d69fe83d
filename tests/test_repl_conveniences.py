"""The repl's IPython-style conveniences through the command line (inputs piped to ``fdsl repl``)
and the lexer (the prompt's highlighting is in test_repl.py, in a pseudo-terminal): ``_``, ``NAME?``, ``:help NAME``,
``:who``, ``:reset``,
``:time``, ``:diagram EXPR [-o FILE]``, and errors at the real line of piped input."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO

DECLS = "dim n = 3\nconst A : n x n\nweight W[i] : n x n\nf(i) = A W[i]\nx := A A^t\n"


def repl(text, *args, cwd=REPO):
    env = dict(os.environ, PYTHONPATH=str(REPO), FDSL_PROGRESS="0")
    return subprocess.run([sys.executable, "-m", "fdsl", "repl", *map(str, args)], input=text, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_underscore_is_the_last_value_shown():
    r = repl(DECLS + "A A^t\n_ + A\nshape(_)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["A A^t", "A A^t + A", "(n x n)"]


def test_underscore_before_any_value_is_an_unknown_name():
    r = repl("_\n")
    assert r.returncode == 2 and "<stdin>:1:1: unknown name '_'" in r.stderr


def test_name_question_mark_and_help_describe_any_name():
    r = repl(DECLS + "x?\nf?\nW?\nn?\n:help A\nform?\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "x := A A^t", "    shape (n x n)",
        "f(i) = A W[i]  (<stdin>:4)",
        "weight W[i] : n x n  (weight at <stdin>:3)",
        "dim n = 3  (dim at <stdin>:1)",
        "const A : (n x n)  (const at <stdin>:2)",
        "form(E)", "    the pulled-back Euler form -trace(E^t d(E)); form(i) is form(encoder(i))"]
    r = repl("nothing?\n")
    assert r.returncode == 2 and "no help for 'nothing'" in r.stderr and ":who" in r.stderr


def test_who_lists_the_session_by_kind():
    r = repl(DECLS + ":who\n")
    assert r.stdout.splitlines() == ["dims:        n", "weights:     W[i]", "consts:      A",
                                     "definitions: x", "functions:   f(i)"]


def test_reset_forgets_everything_so_a_file_loads_again():
    r = repl(":load examples/one_layer.fd\n:load examples/one_layer.fd\n:reset\n:load examples/one_layer.fd\n"
             ":who\n")
    assert "n is already declared" in r.stderr  # the second :load: the session still holds the first
    assert ":reset forgets the session" in r.stderr  # and the message says what to do
    assert "the session is empty" in r.stdout
    after = r.stdout.split("the session is empty", 1)[1]
    assert "\ndims:        n, d, k, h\n" in after  # the third :load worked: :who lists it


def test_reset_keeps_the_rules_given_on_the_command_line():
    r = repl(":reset\ndim n = 2; const X : n x n; shape(softplus(X))\n", "--rules", "examples/softplus.rules")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "(n x n)"


def test_time_shows_the_value_and_how_long():
    r = repl(DECLS + ":time normal(form(A - W[0] A))\n")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "dW_0: A (A - W_0 A)^t"
    assert lines[1].startswith("time: ") and " s (cpu " in lines[1]


def test_diagram_goes_to_a_temporary_file_unless_told(tmp_path):
    r = repl(DECLS + ":diagram x\n:diagram x -o %s\n" % (tmp_path / "x.dot"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.glob("fdsl-diagram*"))  # nothing in the current folder unless asked
    assert (tmp_path / "x.dot").exists()
    first = r.stdout.splitlines()[0]
    assert "diagram-" in first and str(tmp_path) not in first


def test_diagram_draws_in_a_private_folder_that_cannot_be_planted(tmp_path):
    """Another user of the temp folder made ``fdsl-UID`` first (as a link to their folder, or a
    folder anyone may write): the repl does not use it, and draws in a folder of its own, of a name
    no one can guess, mode 0700 (issue 30, item 9: before, :diagram refused to draw)."""
    import stat

    shared = tmp_path / "tmp"
    shared.mkdir()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (shared / ("fdsl-%d" % os.getuid())).symlink_to(theirs)
    (shared / "fdsl").mkdir(mode=0o777)
    env = dict(os.environ, PYTHONPATH=str(REPO), FDSL_PROGRESS="0", TMPDIR=str(shared))
    r = subprocess.run([sys.executable, "-m", "fdsl", "repl"], input=DECLS + ":diagram x\n:diagram x\n", cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    written = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("wrote ")]
    assert len(written) == 2 and all(os.path.isfile(w) for w in written), r.stdout
    folder = os.path.dirname(written[0])
    assert os.path.dirname(written[1]) == folder and os.path.dirname(folder) == str(shared), written
    assert os.path.basename(folder).startswith("fdsl-diagrams-") and not os.path.islink(folder)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert not list(theirs.iterdir()) and not list((shared / "fdsl").iterdir())  # nothing in the planted ones


def test_piped_errors_name_their_real_line():
    r = repl("dim n\nconst A : n x n\n\nshow A\nshow B\ny = (A +\n  C)\n")
    assert r.returncode == 2
    assert "<stdin>:5:6: unknown name 'B'" in r.stderr
    assert "<stdin>:7:3: unknown name 'C'" in r.stderr


def test_the_lexer_is_registered_with_pygments():
    from pygments.token import Keyword, Name

    from fdsl.lang.highlight import FdslLexer

    tokens = list(FdslLexer().get_tokens("weight W : n x n\nshow normal(form(E))  # c\n"))
    assert (Keyword, "weight") in tokens and (Keyword, "show") in tokens
    assert (Name.Builtin, "normal") in tokens and (Name.Builtin, "form") in tokens
