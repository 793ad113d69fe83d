"""Parse: program text to a small AST, with syntax errors a person can act on.

Vocabulary
----------
Node   one expression of the AST: ``kind`` (name, number, string, call, add, sub, neg, mul, div,
       hadamard, transpose, power, index), its child Nodes or payload, and where it starts.
Stmt   one statement: a declaration (``dim``, ``const``/``scalar``/``weight``), a definition
       (``name = e``, ``name := e``, ``f(params) = e``) or a command (``show e``, ``rules "f"``...).

The grammar is ``grammar/fdsl.lark`` (LALR); the rule language's grammar is ``grammar/rules.lark``
and shares the expression part through ``parse_expression_tree``-style reuse of this Transformer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Optional

from lark import Lark, Token, Transformer_NonRecursive, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from ..base.errors import FdslError
from ..base.numbers import OUT_OF_RANGE, number_problem
from . import tables
from .hints import syntax_hint


@dataclass(frozen=True, eq=False)
class Node:
    """An expression of the AST."""

    kind: str
    args: tuple = ()
    value: object = None
    line: int = 0
    col: int = 0


@dataclass(eq=False)
class Stmt:
    """A statement of the AST."""

    kind: str  # dim | sym | define | command
    line: int
    col: int
    name: Optional[str] = None  # definitions; the keyword of a command; the kind of a sym_decl
    params: Optional[tuple] = None  # parameterised definitions: names (str) and literals (int)
    named: bool = False  # := definitions
    body: Optional[Node] = None
    items: list = field(default_factory=list)  # declarations' items; a command's argument Nodes
    end_line: int = 0
    end_col: int = 0  # definitions: where the statement's text ends (Program's display quotes it)


# Friendly names for the grammar's terminals, used in "expected ..." messages.
_TERMINALS = {
    "NAME": "a name", "INT": "a number", "NUMBER": "a number", "RATIONAL": "a number", "STRING": 'a string in "quotes"',
    "CALL": "a function call", "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'",
    "COMMA": "','", "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'", "SLASH": "'/'",
    "CIRCUMFLEX": "'^'", "_TRANSPOSE": "'^'", "EQUAL": "'='", "COLON": "':'", "SEMICOLON": "';'", "_NL": "end of line",
    "$END": "end of input", "KIND": "a declaration", "COMMAND": "a command", "METRIC": "'metric'", "DIM": "'dim'",
    "X": "'x'", "T": "'t'", "ARROW": "'=>'", "VAR": "a ?variable",
    "SEQVAR": "a ?variable...",
}


def describe_terminal(name: str, literals=None) -> str:
    if name.startswith("fdsl__"):  # a rule file's grammar imports fdsl.lark's terminals under this prefix
        name = name[len("fdsl__"):]
    elif name.startswith("_fdsl__"):  # (a filtered one, _TRANSPOSE, keeps its underscore in front)
        name = "_" + name[len("_fdsl__"):]
    if name in _TERMINALS:
        return _TERMINALS[name]
    if literals and name in literals:  # an anonymous literal such as "=>": show it as written
        return "'%s'" % literals[name]
    return "'%s'" % name.lower() if name.isalpha() else name


def _literals(parser) -> dict:
    """Terminal name -> the literal it stands for, for the terminals that are plain strings."""
    return {t.name: t.pattern.value for t in parser.terminals if t.pattern.type == "str"}


def _expected(names, literals=None) -> str:
    items = sorted({describe_terminal(n, literals) for n in names
                    if not n.startswith("__") or (literals and n in literals)})
    if not items:
        return "something else"
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " or " + items[-1]


_NewlinesInBrackets = tables.NewlinesInBrackets


@lru_cache(maxsize=None)
def _parser(grammar: str, start: str = "start") -> Lark:
    # the tables come from grammar/<grammar>.tables.json (plain data, made ahead of time) or are
    # built from the grammar; never from a pickle (fdsl/lang/tables.py says why)
    return tables.load(grammar, start, postlex=_NewlinesInBrackets(), propagate_positions=True)


def _pos(x):
    if isinstance(x, Token):
        return x.line, x.column
    if isinstance(x, Node):
        return x.line, x.col
    return 0, 0


_LITERAL = re.compile(r"(\d+)(?:\.(\d*))?(?:[eE]([-+]?\d+))?")


def literal_value(text: str) -> Fraction:
    """The exact value of a number as written (``12``, ``0.5``, ``1e308``); an FdslError if it is
    beyond float64's range, decided from the exponent before the digits are expanded."""
    m = _LITERAL.fullmatch(text)
    if len(text) > 400:  # more digits than any float64 has: out of range, or a typo
        raise FdslError("the number %s... (%d digits) is %s" % (text[:20], len(text), OUT_OF_RANGE))
    exponent = int(m.group(3)) if m and m.group(3) and len(m.group(3)) < 8 else None
    if m and m.group(3) and (exponent is None or abs(exponent) > 400):
        raise FdslError("the number %s is %s" % (text, OUT_OF_RANGE))
    value = Fraction(text)
    problem = number_problem(value) if value else None
    if problem:
        raise FdslError("the number %s is %s" % (text, problem))
    return value


def _whole(tok) -> int:
    """A size or an index as written; at most 18 digits (no matrix has 10^18 rows)."""
    if len(tok) > 18:
        raise FdslError("%s... is too large for a size or an index (%d digits)" % (tok[:18], len(tok)),
                        line=tok.line, col=tok.column)
    return int(tok)


def _size(tok) -> int:
    """A size as written (``dim n = 8``, ``const X : 3 x n``): a whole number of at least 1, since
    numpy reduces an empty matrix (a max, a softmax) to no value at all."""
    value = _whole(tok)
    if value < 1:
        raise FdslError("a size is at least 1, not %d" % value, line=tok.line, col=tok.column)
    return value


@v_args(meta=True)
class ToAst(Transformer_NonRecursive):
    """Parse tree to Nodes and Stmts; mostly one line per grammar alias. Not recursive: a sum
    of thousands of summands is a parse tree thousands deep."""

    def _node(self, kind, meta, args=(), value=None):
        return Node(kind, tuple(args), value, getattr(meta, "line", 0), getattr(meta, "column", 0))

    # ---- expressions
    def number(self, meta, children):
        (tok,) = children
        try:
            value = literal_value(str(tok))
        except FdslError as e:
            raise FdslError(e.message, line=meta.line, col=meta.column) from None
        return self._node("number", meta, value=value)

    def name(self, meta, children):
        return self._node("name", meta, value=str(children[0]))

    def string(self, meta, children):
        return self._node("string", meta, value=str(children[0])[1:-1])

    def binding(self, meta, children, named=True):
        name, *index, body = children
        return self._node("binding", meta, (body,), (str(name), tuple(_whole(i) for i in index), named))

    def plain_binding(self, meta, children):
        return self.binding(meta, children, named=False)

    def call(self, meta, children):
        head, *args = children
        return self._node("call", meta, args, str(head)[:-1])

    def __init__(self, text: str = ""):
        super().__init__()
        self.text = text  # the source, to quote an expression as written

    def _offset(self, line: int, col: int) -> int:
        starts = getattr(self, "_starts", None)
        if starts is None:
            starts = self._starts = [0] + [i + 1 for i, ch in enumerate(self.text) if ch == "\n"]
        return starts[line - 1] + col - 1

    def _follows_slash(self, node) -> bool:
        """Whether ``node`` is written right after a ``/`` (not inside parentheses: 1 / (2 A))."""
        if not self.text or not node.line:
            return False
        i = self._offset(node.line, node.col) - 1
        while i >= 0 and self.text[i] in " \t\f":
            i -= 1
        return i >= 0 and self.text[i] == "/"

    def div(self, meta, children):
        # `1 / 2 trace(E)` reads to a person as half the trace (Mathematica reads 1/2 x so), to the
        # grammar as 1 / (2 trace(E)): a number leading a product right of `/` is refused with both
        # spellings, never read silently one way (X U / Z V, with no number, stays (X U) / (Z V))
        right = children[1]
        lead = right
        while lead.kind == "mul":
            lead = lead.args[0]
        if right.kind == "mul" and lead.kind == "number" and self._follows_slash(lead):
            written = " ".join(self.text[meta.start_pos:meta.end_pos].split())
            start = self._offset(lead.line, lead.col)
            top = " ".join(self.text[meta.start_pos:start].split())[:-1].strip()  # up to the /
            below = " ".join(self.text[start:meta.end_pos].split())
            number, _, rest = below.partition(" ")
            raise FdslError("%s is ambiguous: write (%s / %s) %s to multiply by %s / %s, or %s / (%s) to "
                            "divide by the whole product" % (written, top, number, rest, top, number, top, below),
                            line=meta.line, col=meta.column)
        return self._node("div", meta, children)

    def __default__(self, data, children, meta):
        return self._node(str(data), meta, children)

    # ---- declarations
    def dim_item(self, meta, children):
        return (str(children[0]), _size(children[1]) if len(children) > 1 else None, meta.line, meta.column)

    def indices(self, meta, children):
        return ("indices", tuple(str(c) for c in children))

    def shape(self, meta, children):
        if len(children) == 3:  # n x v onehot
            return ("shape", (children[0], children[1], "onehot"))
        return ("shape", tuple(children))

    def shape_word(self, meta, children):
        # weight g : scalar (the lexer reads the word as a declaration keyword)
        if str(children[0]) != "scalar":
            raise FdslError("a shape is rows x cols or scalar, not %r" % str(children[0]),
                            line=meta.line, col=meta.column)
        return ("shape", "scalar")

    def dim_ref(self, meta, children):
        tok = children[0]
        return _size(tok) if tok.type == "INT" else str(tok)

    def sym_item(self, meta, children):
        item = {"name": str(children[0]), "indices": (), "shape": None, "value": None,
                "line": meta.line, "col": meta.column}
        for part in children[1:]:
            if isinstance(part, Node):
                item["value"] = part
            else:
                key, value = part
                item[key] = value
        return item

    def dim_decl(self, meta, children):
        return Stmt("dim", meta.line, meta.column, items=list(children), end_line=meta.end_line)

    def sym_decl(self, meta, children):
        kind, *items = children
        return Stmt("sym", meta.line, meta.column, name=str(kind), items=items, end_line=meta.end_line)

    # ---- definitions
    def _define(self, meta, head, body, named, fn):
        if not fn:
            return Stmt("define", meta.line, meta.column, name=str(head), body=body, named=named,
                        end_line=meta.end_line, end_col=meta.end_column)
        params = []
        for p in head.args:
            if p.kind == "name":
                params.append(p.value)
            elif p.kind == "number" and p.value.denominator == 1 and p.value >= 0:
                params.append(int(p.value))
            else:
                raise FdslError("a parameter is a name or a whole number (a base case), not an expression",
                                line=p.line, col=p.col)
        return Stmt("define", meta.line, meta.column, name=head.value, params=tuple(params), body=body,
                    named=named, end_line=meta.end_line, end_col=meta.end_column)

    def define(self, meta, c):
        return self._define(meta, c[0], c[1], False, False)

    def define_named(self, meta, c):
        return self._define(meta, c[0], c[1], True, False)

    def define_fn(self, meta, c):
        return self._define(meta, c[0], c[1], False, True)

    def define_fn_named(self, meta, c):
        return self._define(meta, c[0], c[1], True, True)

    # ---- commands
    def command(self, meta, children):
        keyword, *args = children
        return Stmt("command", meta.line, meta.column, name=str(keyword), items=args, end_line=meta.end_line)

    def metric_index(self, meta, children):
        name, *index = children  # metric K[i] = ...: the target as the expression K[i]
        return self._node("index", meta, [self._node("name", meta, value=str(name))] + index)

    def assign_command(self, meta, children):
        keyword, *args, body = children
        return Stmt("command", meta.line, meta.column, name=str(keyword), items=args, body=body,
                    end_line=meta.end_line)

    def bare(self, meta, children):
        (expr,) = children
        # show(E) is the manual's spelling of the command show E
        if expr.kind == "call" and expr.value in _COMMANDS:
            return Stmt("command", meta.line, meta.column, name=expr.value, items=list(expr.args),
                        end_line=meta.end_line)
        return Stmt("command", meta.line, meta.column, name="show", items=[expr], end_line=meta.end_line)

    def start(self, meta, children):
        return list(children)


_COMMANDS = ("show", "rules", "values", "random", "save", "metric", "plot")


def syntax_error(e: UnexpectedInput, text: str, filename: str, grammar: str = "fdsl.lark") -> FdslError:
    """A Lark error as ``file:line:col: unexpected X; expected Y`` with the line and a caret."""
    literals = _literals(_parser(grammar))
    if isinstance(e, UnexpectedToken):
        tok = e.token
        if tok.type == "$END":
            what = "unexpected end of input"
        elif tok.type == "_NL":
            what = "unexpected end of line"
        else:
            what = "unexpected %r" % str(tok)
        expected = e.accepts or e.expected
        msg = "%s; expected %s" % (what, _expected(expected, literals))
        line, col = e.line, e.column
        if tok.type == "$END":
            lines = text.splitlines() or [""]
            line, col = len(lines), len(lines[-1]) + 1
            opener = _unclosed_bracket(text) if {"RPAR", "RSQB"} & set(expected) else None
            if opener is not None:
                # newlines inside brackets are whitespace, so the end of the file can be far from the
                # mistake: point at the bracket that was never closed instead
                line, col, char = opener
                msg = "%r is never closed: %s" % (char, msg)
    elif isinstance(e, UnexpectedCharacters):
        msg = "unexpected character %r; expected %s" % (text[e.pos_in_stream], _expected(e.allowed or (), literals))
        line, col = e.line, e.column
    elif isinstance(e, UnexpectedEOF):
        lines = text.splitlines() or [""]
        msg = "unexpected end of input; expected %s" % _expected(e.expected, literals)
        line, col = len(lines), len(lines[-1]) + 1
    else:  # pragma: no cover - Lark has no other kinds
        msg, line, col = str(e), getattr(e, "line", None), getattr(e, "column", None)
    hint = syntax_hint(text, line or 0, col or 0, keywords=grammar == "fdsl.lark")
    if hint is not None:  # a habit from elsewhere: say what to write instead of what could follow
        text_, col, whole = hint
        msg = text_ if whole else "%s; %s" % (msg.split("; expected ")[0], text_)
    return FdslError(msg, filename, line if line and line > 0 else None, col if col and col > 0 else None, text)


def _unclosed_bracket(text: str):
    """(line, col, char) of the innermost '(' or '[' still open at the end of ``text``, or None."""
    stack = []
    line, col = 1, 1
    comment = string = False
    for ch in text:
        if comment:
            comment = ch != "\n"
        elif string:
            string = ch not in '"\n'
        elif ch == "#":
            comment = True
        elif ch == '"':
            string = True
        elif ch in "([":
            stack.append((line, col, ch))
        elif ch in ")]" and stack:
            stack.pop()
        line, col = (line + 1, 1) if ch == "\n" else (line, col + 1)
    return stack[-1] if stack else None


# A run of separators: ';' then more ';', blanks and newlines. Strings and comments are matched
# too, to be skipped: a ';' inside them is not a separator.
_SEPARATOR_RUN = re.compile(r'"[^"\n]*"?|#[^\n]*|;[; \t\f\r\n]*;')


def _one_separator(match) -> str:
    """A run of separators as its first ';' and the rest blanked (newlines kept), so every position
    after it keeps its line and column. Lark spends tens of microseconds on each token; a program of
    16 MB of ';' was 16 million of them (160 s); blanks are skipped by one regular expression."""
    run = match.group()
    if run[0] != ";":
        return run
    return ";" + re.sub(r"[^\n]", " ", run[1:])


def parse_program(text: str, filename: str = "<string>") -> list:
    """The statements of a program, or an FdslError with file:line:col."""
    text = text.removeprefix("\ufeff")  # a byte-order mark, as some editors write at the start
    if not text.endswith("\n"):
        text += "\n"
    try:
        tree = _parser("fdsl.lark").parse(_SEPARATOR_RUN.sub(_one_separator, text) if ";" in text else text)
        return ToAst(text).transform(tree)
    except UnexpectedInput as e:
        raise syntax_error(e, text, filename) from None
    except VisitError as e:
        if isinstance(e.orig_exc, FdslError):
            raise e.orig_exc.located(filename, e.orig_exc.line, e.orig_exc.col, text) from None
        raise
