"""The command line keeps the conventions people expect: --version, '-' for standard input, a
one-line mode (-e), python -m fdsl, help text for every argument, shell completion, repl taking
run's options, progress for long work on a terminal, and file errors reported at the file.

Every test runs the real command in a subprocess (or a pseudo-terminal for the progress line).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from conftest import REPO

import fdsl
from fdsl.cli.main import build_parser

ONE_LINER = "dim n; const A : n x n; weight W : n x n; show normal(form(A - W A))"


def _shown(text):
    """What the program ``text`` prints, through the Python API."""
    out = io.StringIO()
    fdsl.parse(text).run(out)
    return out.getvalue()


EXPECTED = _shown(ONE_LINER.replace("; ", "\n"))  # the normal form of the one-liner, as show prints it


def fdsl_run(*args, input=None, module="fdsl.cli", cwd=REPO, **env):
    environ = dict(os.environ, PYTHONPATH=str(REPO), FDSL_PROGRESS="0", **env)
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd, env=environ, input=input,
                          capture_output=True, text=True, timeout=120,
                          stdin=None if input is not None else subprocess.DEVNULL)


def test_version():
    r = fdsl_run("--version")
    assert r.returncode == 0 and r.stdout == "fdsl %s\n" % fdsl.__version__


def test_python_dash_m_fdsl_is_the_command():
    r = fdsl_run("--help", module="fdsl")
    assert r.returncode == 0 and r.stdout.startswith("usage: fdsl ")
    r = fdsl_run("run", "-e", ONE_LINER, module="fdsl")
    assert r.returncode == 0 and r.stdout == EXPECTED


def test_dash_reads_the_program_from_standard_input():
    r = fdsl_run("run", "-", input=ONE_LINER + "\n")
    assert (r.returncode, r.stdout, r.stderr) == (0, EXPECTED, "")


def test_errors_in_standard_input_are_located_there():
    r = fdsl_run("run", "-", input="dim n\nshow B\n")
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == "<stdin>:2:6: unknown name 'B'"


def test_one_line_programs_with_declarations_inline():
    r = fdsl_run("run", "-e", ONE_LINER.replace("show ", ""))
    assert (r.returncode, r.stdout) == (0, EXPECTED)
    # several -e are one program, read in order
    r = fdsl_run("run", "-e", "dim n; const A : n x n", "-e", "weight W : n x n; W A; shape(W A)")
    assert (r.returncode, r.stdout) == (0, "W A\n(n x n)\n")


def test_one_line_after_a_file_sees_its_definitions():
    r = fdsl_run("run", "examples/encoder2.fd", "-e", "coeff(N, f[1]); len(N)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2:] == ["E^t C", "12"]  # E was bound by the file's first show


def test_one_line_errors_point_into_the_text():
    r = fdsl_run("run", "-e", "dim n; const A : n x n; A B")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == ["-e:1:27: unknown name 'B'", "    dim n; const A : n x n; A B",
                                     "                              ^"]


def test_run_without_a_program_says_how_to_give_one():
    r = fdsl_run("run")
    assert r.returncode == 2 and "fdsl run -e" in r.stderr and "Traceback" not in r.stderr


def test_a_missing_rule_file_is_reported_at_the_file():
    r = fdsl_run("run", "--rules", "nothere.rules", "examples/one_layer.fd")
    assert r.returncode == 2
    assert r.stderr == "nothere.rules: cannot read this rule file: no such file\n"


def test_a_missing_rule_file_named_in_a_program_is_reported_at_the_statement(tmp_path):
    (tmp_path / "p.fd").write_text('dim n\nrules "nothere.rules"\n')
    r = fdsl_run("run", "p.fd", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == "p.fd:2:1: cannot read this rule file: no such file"


def test_every_argument_of_every_command_has_help_text():
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    missing = [(name, a.dest) for name, p in [("fdsl", parser)] + sorted(commands.items())
               for a in p._actions if not a.help and a.dest != "command"]
    assert missing == []


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_shell_completion_script(shell):
    r = fdsl_run("--print-completion", shell)
    assert r.returncode == 0
    for word in ("run", "repl", "grad", "--step-limit", "--print-completion"):
        assert word in r.stdout
    if shell == "bash":  # the script is valid bash
        check = subprocess.run(["bash", "-n"], input=r.stdout, text=True, capture_output=True)
        assert check.returncode == 0, check.stderr


def test_repl_takes_the_options_of_run(tmp_path):
    """--random gives values (eval works), --rules loads a file, --step-limit applies."""
    r = fdsl_run("repl", "--random", "0", "--step-limit", "5",
                 input="dim n = 3; const X : n x n; weight W : n x n\neval(trace(X^t X))\nnormal(form(X W X W))\n")
    assert r.returncode == 2  # the last input fails: the step limit is 5
    assert float(r.stdout.splitlines()[0]) > 0
    assert "did not reach a normal form within 5 steps" in r.stderr
    (tmp_path / "p.fd").write_text("dim n = 3\nconst X : n x n\nweight U : n x n\n")
    r = fdsl_run("repl", "p.fd", "--rules", REPO / "examples" / "softplus.rules", "--random", "1",
                 input="shape(softplus(X U))\n", cwd=tmp_path)
    assert (r.returncode, r.stdout) == (0, "(n x n)\n"), r.stderr


def test_progress_on_a_terminal(tmp_path):
    """On a terminal, long rewriting shows a progress line on stderr (made immediate here by
    FDSL_PROGRESS_DELAY=0); it is erased at the end, and the output is the same."""
    pexpect = pytest.importorskip("pexpect")
    env = dict(os.environ, PYTHONPATH=str(REPO), FDSL_PROGRESS_DELAY="0", TERM="xterm")
    env.pop("FDSL_PROGRESS", None)
    child = pexpect.spawn(sys.executable, ["-m", "fdsl", "run", "-e",
                                           "dim n; const A : n x n; weight W : n x n; "
                                           "x = W A W A W A W A W; len(forms(x A - A x))"],
                          cwd=str(REPO), env=env, encoding="utf-8", timeout=120, dimensions=(24, 100))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    assert "expandforms: " in child.before and " steps" in child.before
    assert child.before.rstrip().splitlines()[-1].strip() == "10"


def test_no_progress_without_a_terminal():
    r = fdsl_run("run", "-e", "dim n; const A : n x n; weight W : n x n; len(forms(W A W A - A))",
                 FDSL_PROGRESS_DELAY="0")
    assert r.stderr == "" and r.returncode == 0
