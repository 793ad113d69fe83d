"""Parser tables: the grammar's LALR tables made ahead of time, shipped as plain data.

Vocabulary
----------
tables      what Lark builds from a grammar before it can parse (the LALR states, the terminals and
            the rules): about 0.15 s of work on every start if built there.
tables file ``grammar/<grammar>.tables.json`` (``fdsl.lark`` -> ``fdsl.tables.json``), written by
            ``python -m fdsl.lang.tables`` from the grammar and committed beside it. JSON, read with
            ``json.loads``: data, never code. Lark's own cache (``cache=True``) and ``Lark.save``
            are pickles, which loading would run, so fdsl never uses them (issue 23: a program that
            could write a file anywhere could plant one).
key         a hash of the Lark version, the grammar's name and start symbol, and the text of every
            grammar file: a tables file is used only if its key is the key of the grammar fdsl
            has now, so an edited grammar (or another Lark) never loads stale tables; it builds
            them from the grammar instead (correct, only slower), and tests/test_grammar_cache.py
            fails until the file is written again.
checked     the file is a JSON object of exactly the expected shape (a key, the tables' ``data``
            and ``memo``); Lark's deserialiser then makes only its own classes (``Rule``,
            ``TerminalDef``, ``ParserConf``, ...), named from a fixed table. Anything else, or any
            error while loading, means the tables are built from the grammar. So does a tables
            file that is not a regular file (a FIFO would block the open, a device the read): it is
            opened without blocking and looked at before a byte is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from lark import Lark

from ..base.resources import grammar_path

# JSON has only string keys; Lark's tables use whole numbers as keys (states, token ids), so a dict
# with any other key is written as {"#int": [[key, value], ...]} and read back by the hook below
_INT_KEYS = "#int"
_SKIPPED_OPTIONS = ("postlex", "transformer", "lexer_callbacks", "use_bytes", "debug", "g_regex_flags", "regex",
                    "propagate_positions", "tree_class", "_plugins", "import_paths", "source_path")


class NewlinesInBrackets:
    """Postlexer: a newline inside (...) or [...] is whitespace, so long expressions can wrap."""

    always_accept = ("_NL",)
    _open = {"LPAR", "CALL", "LSQB"}
    _close = {"RPAR", "RSQB"}

    def process(self, stream):
        depth = 0
        for tok in stream:
            if tok.type in self._open:
                depth += 1
            elif tok.type in self._close:
                depth = max(0, depth - 1)
            elif tok.type == "_NL" and depth:
                continue
            yield tok


def tables_file(grammar: str) -> Path:
    return grammar_path(grammar).with_suffix(".tables.json")


def grammar_key(grammar: str, start: str) -> str:
    import lark

    folder = grammar_path(grammar).parent
    read = ((p.name, _read_regular(p, 1 << 20)) for p in sorted(folder.glob("*.lark")))
    texts = "".join("%s\0%s\0" % (name, raw.decode()) for name, raw in read if raw is not None)
    return hashlib.sha256(("%s|%s|%s|%s" % (lark.__version__, grammar, start, texts)).encode()).hexdigest()


def build(grammar: str, start: str, **options) -> Lark:
    """The parser built from the grammar itself (no tables file)."""
    path = grammar_path(grammar)
    return Lark(path.read_text(), parser="lalr", import_paths=[str(path.parent)], start=start,
                maybe_placeholders=False, **options)


def load(grammar: str, start: str, **options) -> Lark:
    """The parser for ``grammar``: from its tables file when that is current and well formed,
    else built from the grammar. ``options`` are the ones Lark allows on loaded tables (postlex,
    propagate_positions)."""
    parser = _from_tables(grammar, start, options)
    return parser if parser is not None else build(grammar, start, **options)


def _from_tables(grammar: str, start: str, options: dict):
    if os.environ.get("FDSL_BUILD_PARSER"):  # build from the grammar (to time it, or to rule out the tables)
        return None
    try:
        raw = _read_regular(tables_file(grammar), 16 * 1024 * 1024)
        if raw is None:
            return None
        doc = json.loads(raw, object_hook=_decode)
        if not (isinstance(doc, dict) and set(doc) == {"key", "data", "memo"}
                and isinstance(doc["data"], dict) and isinstance(doc["memo"], dict)):
            return None
        if doc["key"] != grammar_key(grammar, start):
            return None
        return Lark._load_from_dict(doc["data"], doc["memo"], **options)
    except Exception:  # noqa: BLE001 - any doubt about the file means building from the grammar
        return None


def _read_regular(path: Path, limit: int):
    """At most ``limit`` bytes of ``path`` if it is a regular file, else None (a missing file too).
    Opened with O_NONBLOCK, so a FIFO in its place does not wait for a writer, and checked on the
    open descriptor, so nothing can be swapped in between the look and the read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit)
    finally:
        os.close(fd)


def _decode(obj: dict):
    if _INT_KEYS in obj:
        pairs = obj[_INT_KEYS]
        if len(obj) != 1 or not isinstance(pairs, list) or not all(
                isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) for p in pairs):
            raise ValueError("malformed tables")
        return {k: v for k, v in pairs}
    return obj


def _encode(x):
    if isinstance(x, dict):
        if all(isinstance(k, str) for k in x):
            return {str(k): _encode(v) for k, v in x.items()}
        return {_INT_KEYS: [[k, _encode(v)] for k, v in x.items()]}
    if isinstance(x, (list, tuple)):
        return [_encode(v) for v in x]
    if isinstance(x, str):
        return str(x)  # a lark Token is a str
    if x is None or isinstance(x, (bool, int, float)):
        return x
    raise TypeError("the tables hold a %s, which is not data" % type(x).__name__)


def tables_text(grammar: str, start: str = "start") -> str:
    """The tables file's text for ``grammar``, built from the grammar now (with the postlexer the
    parser runs with, which decides which terminals the lexer keeps)."""
    from lark.grammar import Rule
    from lark.lexer import TerminalDef

    parser = build(grammar, start, postlex=NewlinesInBrackets(), propagate_positions=True)
    data, memo = parser.memo_serialize([TerminalDef, Rule])
    data["options"] = {k: v for k, v in data["options"].items() if k not in _SKIPPED_OPTIONS}
    doc = {"key": grammar_key(grammar, start), "data": _encode(data), "memo": _encode(memo)}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n"


GRAMMARS = ("fdsl.lark", "rules.lark")


def main() -> None:
    for grammar in GRAMMARS:
        tables_file(grammar).write_text(tables_text(grammar))
        print("wrote %s" % tables_file(grammar))


if __name__ == "__main__":
    main()
