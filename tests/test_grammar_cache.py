"""The parser's tables (issues 13 and 23): made ahead of time and shipped as plain JSON data beside
the grammar; no pickle is loaded, ever (Lark's ``cache=True`` and ``Lark.save`` are pickles, and a
program that could write one where fdsl looks for it would run code)."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

tables = importlib.import_module("fdsl.lang.tables")
parse = importlib.import_module("fdsl.lang.parse")  # the module; fdsl.parse is also a function

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("grammar", tables.GRAMMARS)
def test_the_tables_file_is_current(grammar):
    # fails after an edit of grammar/*.lark (or with another Lark) until `python -m fdsl.lang.tables`
    # writes the tables again; the key is what decides whether the file is used at all
    doc = json.loads(tables.tables_file(grammar).read_text())
    assert doc["key"] == tables.grammar_key(grammar, "start"), "grammar changed: run python -m fdsl.lang.tables"


@pytest.mark.parametrize("grammar", tables.GRAMMARS)
def test_the_tables_are_loaded_and_parse_as_the_grammar_does(grammar):
    options = dict(postlex=parse._NewlinesInBrackets(), propagate_positions=True)
    loaded = tables._from_tables(grammar, "start", options)
    assert loaded is not None
    built = tables.build(grammar, "start", **options)
    sources = (sorted((REPO / "examples").glob("*.fd")) if grammar == "fdsl.lark"
               else sorted((REPO / "stdlib").glob("*.rules")))
    assert sources
    for path in sources:
        text = path.read_text()
        text += "" if text.endswith("\n") else "\n"
        assert loaded.parse(text) == built.parse(text), path


def test_stale_or_malformed_tables_are_not_used(tmp_path, monkeypatch):
    file = tmp_path / "fdsl.tables.json"
    monkeypatch.setattr(tables, "tables_file", lambda grammar: file)
    good = json.loads(tables.tables_text("fdsl.lark"))
    for doc in ({**good, "key": "0" * 64},  # tables of another grammar or another Lark
                {**good, "extra": 1},
                {"key": good["key"], "data": [], "memo": {}},
                {**good, "memo": {"#int": [["not a number", 1]]}}):
        file.write_text(json.dumps(doc))
        assert tables._from_tables("fdsl.lark", "start", {}) is None
    for junk in (b"\x80\x04\x95 not json", b"{", b""):
        file.write_bytes(junk)
        assert tables._from_tables("fdsl.lark", "start", {}) is None
    # and the parser is then built from the grammar: still correct
    assert tables.load("fdsl.lark", "start").parse("show 1\n")


def test_no_pickle_is_loaded_to_parse_and_run(tmp_path):
    """A fresh process whose pickle module refuses to load anything parses a program and a rule
    file and runs them; and no module of fdsl mentions pickle or Lark's cache."""
    program = tmp_path / "p.fd"
    program.write_text('rules "r.rules"\ndim n = 2\nconst X : n x n\nshow twice(X)\n')
    (tmp_path / "r.rules").write_text("operator twice(A) = 2 A\n")
    code = ("import pickle\n"
            "def refuse(*a, **k):\n    raise SystemExit('a pickle was loaded')\n"
            "pickle.load = pickle.loads = pickle.Unpickler = refuse\n"
            "import sys; from fdsl.cli.main import main\n"
            "sys.exit(main(['run', sys.argv[1]]))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", code, str(program)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "twice(X)" in proc.stdout, proc.stdout
    assert not (tmp_path / "cache").exists()  # nothing is cached any more
    assert "cache=" not in inspect.getsource(tables.build) + inspect.getsource(parse._parser)
    for path in (REPO / "fdsl").rglob("*.py"):
        text = path.read_text()
        assert "import pickle" not in text and "Lark.load" not in text and ".lark-cache" not in text, path
        assert "allow_pickle=True" not in text, path


def test_a_planted_pickle_where_the_old_cache_was_is_never_run(tmp_path):
    """The old cache file name (~/.cache/fdsl/grammar-<key>.lark-cache) holding a payload: the next
    command runs as usual and the payload does not run."""
    cache = tmp_path / "cache" / "fdsl"
    cache.mkdir(parents=True, mode=0o700)
    marker = tmp_path / "ran"
    import pickle

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    for name in ("grammar-%s.lark-cache" % ("0" * 32), ".lark_cache_fdsl.tmp"):
        (cache / name).write_bytes(pickle.dumps(Payload()))
    program = tmp_path / "p.fd"
    program.write_text("show 1 + 1\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "fdsl.cli", "run", str(program)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "2", proc.stderr
    assert not marker.exists()
