"""Bad input gets a clear message and exit code 2, never a traceback.

The table is the folder ``tests/bad``: one bad program per kind of mistake, whose first line
``# expect: FILE:LINE:COL: message`` is the first line ``fdsl run`` must print on stderr. Each
is run through the command line, from inside ``tests/bad`` so the file name in the message is
the bare name. Where the message has a line and column, the next two lines of stderr must be
that source line and a caret under the column.

To add a case: write ``tests/bad/NAME.fd`` with a ``# expect:`` first line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fdsl

BAD = Path(__file__).resolve().parent / "bad"
CASES = sorted(BAD.glob("*.fd"))
EXPECT = "# expect: "
POSITION = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+):(?P<col>\d+): ")

# The kinds of mistake the language issue asks for; each must keep at least one bad program.
REQUIRED = {
    "syntax_token", "syntax_character", "syntax_unclosed_paren", "unknown_name", "unknown_function",
    "args_definition", "args_builtin", "args_operator", "recursion", "shape_product", "shape_sum",
    "shape_trace", "shape_mm", "unknown_dim", "redeclared",
}


def expected_first_line(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith(EXPECT), "%s must start with a '%s...' line" % (path.name, EXPECT)
    return first[len(EXPECT):]


def check_caret(path: Path, stderr_lines: list, first: str):
    """A located message is followed by the offending line and a caret under the column."""
    m = POSITION.match(first)
    if m is None:
        return
    line, col = int(m["line"]), int(m["col"])
    source = path.read_text().splitlines()[line - 1].expandtabs(1)
    assert stderr_lines[1] == "    " + source, "the offending line should follow the message"
    assert stderr_lines[2] == "    " + " " * (col - 1) + "^", "a caret should point at column %d" % col


def test_every_kind_of_mistake_has_a_bad_program():
    assert REQUIRED <= {p.stem for p in CASES}, sorted(REQUIRED - {p.stem for p in CASES})


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_bad_program_through_the_cli(path, run_fdsl):
    """Each bad program in a process of its own, under a CPU-time cap (conftest's run_fdsl): a
    slow run on a busy machine fails only its own case (they ran together from one fixture, and
    one run past a wall-clock timeout errored them all)."""
    expected = expected_first_line(path)
    proc = run_fdsl("run", path.name, cwd=BAD)
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output
    assert proc.returncode == 2, output
    assert proc.stdout == "", "an error anywhere means nothing is printed"
    lines = proc.stderr.splitlines()
    assert lines and lines[0] == expected
    check_caret(path, lines, lines[0])


# The command line raises Python's recursion limit so that the depth limit of fdsl.lang.elaborate decides;
# a library caller keeps the interpreter's limit, and gets a message naming the definition too.
_API_DIFFERS = {"recursion"}


@pytest.mark.parametrize("path", [p for p in CASES if p.stem not in _API_DIFFERS], ids=lambda p: p.stem)
def test_bad_program_through_the_api(path, monkeypatch):
    """fdsl.load raises FdslError with the same text the command line prints."""
    monkeypatch.chdir(BAD)
    with pytest.raises(fdsl.FdslError) as info:
        fdsl.load(path.name)
    lines = str(info.value).splitlines()
    assert lines[0] == expected_first_line(path)
    check_caret(path, lines, lines[0])


def test_runaway_recursion_through_the_api_names_the_definition():
    with pytest.raises(fdsl.FdslError) as info:
        fdsl.parse("dim n\nconst A : n x n\nf(0) = A\nf(L) = f(L+1)\ng(x) = f(x)\nE = g(1)\n", "r.fd")
    first = str(info.value).splitlines()[0]
    assert first.startswith("r.fd:6:5: f(")
    assert "did not reach a base case" in first and "clause of f" in first


def test_missing_file(run_fdsl, tmp_path):
    proc = run_fdsl("run", "no_such_program.fd", cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[0] == "no_such_program.fd: cannot read this file: no such file"


def test_directory_instead_of_file(run_fdsl, tmp_path):
    (tmp_path / "dir.fd").mkdir()
    proc = run_fdsl("run", "dir.fd", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == "dir.fd: cannot read this file: it is a folder, not a file"


def test_binary_file(run_fdsl, tmp_path):
    (tmp_path / "bin.fd").write_bytes(b"\xff\xfe\x00dim n\n")
    proc = run_fdsl("run", "bin.fd", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == "bin.fd: this file is not UTF-8 text (byte 0)"


def test_usage_error_exits_2_without_traceback(run_fdsl):
    proc = run_fdsl("run")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "usage:" in proc.stderr


@pytest.mark.parametrize("text, first", [
    # a tab before the mistake: the caret line expands tabs to one space, as columns count them
    ("dim n\nconst A : n x n\nE =\tA ++ A\n", "t.fd:3:8: unexpected '+'"),
    # newlines inside brackets are whitespace; a mistake on a continuation line is located there
    ("dim n\nconst A : n x n\nE = m(A +\n      A A\n      + )\n", "t.fd:5:9: unexpected ')'"),
    ("dim n\nconst A : n x n\nE == A\n", "t.fd:3:4: unexpected '='"),
    ("dim n\nconst A : n x n\nE = A)\n", "t.fd:3:6: unexpected ')'"),
    ("dim n\nconst A : n x n\nE = m(A + \"(\"\n", "t.fd:3:6: '(' is never closed"),  # not fooled by strings
    ("dim n # (\nconst A : n x n\nE = (A\n", "t.fd:3:5: '(' is never closed"),  # nor by comments
    ("dim n\nconst A : n x n\nrules \"a\", \"b\"\n", "t.fd:3:1: usage: rules"),
])
def test_located_messages(text, first):
    with pytest.raises(fdsl.FdslError) as info:
        fdsl.parse(text, "t.fd")
    lines = str(info.value).splitlines()
    assert lines[0].startswith(first), lines[0]
    m = POSITION.match(lines[0])
    line, col = int(m["line"]), int(m["col"])
    assert lines[1] == "    " + text.splitlines()[line - 1].expandtabs(1)
    assert lines[2] == "    " + " " * (col - 1) + "^"


def test_error_inside_a_definition_says_where_it_was_called():
    with pytest.raises(fdsl.FdslError) as info:
        fdsl.load(BAD / "shape_in_definition.fd")
    notes = str(info.value).splitlines()[3:]
    assert [n.split(", called at ")[0] for n in notes] == ["  in layer(1, X Q_0)", "  in enc(2)"]
    assert notes[0].endswith("shape_in_definition.fd:8:10") and notes[1].endswith("shape_in_definition.fd:9:5")
