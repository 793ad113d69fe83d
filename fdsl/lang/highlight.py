"""Syntax highlighting of fdsl text: a Pygments lexer, used by the repl's prompt.

Vocabulary
----------
token   what Pygments colours: statement keywords (``dim``, ``weight``, ``show``...), the built-in
        operators and functions (``d``, ``m``, ``trace``, ``form``, ``normal``...), names,
        numbers, strings, comments, ``:=`` and the operators ``+ - * / ^``, ``^t``.

``pygmentize -l fdsl`` finds it too: pyproject.toml registers it under ``pygments.lexers``.
"""

from __future__ import annotations

from pygments.lexer import RegexLexer, words
from pygments.token import Comment, Keyword, Name, Number, Operator, Punctuation, String, Text

from .hints import KEYWORDS

# Built-in names highlighted as such; the operator table and the function registry hold more,
# but a lexer is static text: these are the manual's own.
BUILTINS = ("d", "m", "a", "mm", "aa", "trace", "form", "forms", "normal", "backprop", "expanded", "expandAll",
            "expandmm", "flatten", "shiftmm", "cycle", "collect", "coeff", "weights", "depends", "len", "eval",
            "grad", "train", "string", "html", "latex", "text", "shape", "nodes", "treesize", "eye", "zeros",
            "diagram", "transpose")


class FdslLexer(RegexLexer):
    """fdsl programs (.fd) and repl input."""

    name = "fdsl"
    aliases = ["fdsl"]
    filenames = ["*.fd"]

    tokens = {
        "root": [
            (r"#.*?$", Comment.Single),
            (r"^\s*:[A-Za-z]+", Keyword.Pseudo),  # a repl :command
            (r'"[^"\n]*"', String.Double),
            (words(KEYWORDS, suffix=r"\b"), Keyword),
            (words(("where", "ones", "identity"), prefix=r"\b", suffix=r"\b"), Keyword.Reserved),
            (words(BUILTINS, suffix=r"(?=\()"), Name.Builtin),
            (r"\^t\b", Operator),
            (r"[0-9]+\.[0-9]+([eE][-+]?[0-9]+)?", Number.Float),
            (r"[0-9]+", Number.Integer),
            (r"[A-Za-z][A-Za-z0-9_]*(?=\()", Name.Function),
            (r"[A-Za-z][A-Za-z0-9_]*|_\b", Name),
            (r":=|[-+*/^=]", Operator),
            (r"[()\[\],;:?]", Punctuation),
            (r"\s+", Text),
            (r".", Text),
        ],
    }
