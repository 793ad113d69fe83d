"""Hints for the notations people bring from elsewhere: what to write in fdsl instead.

Vocabulary
----------
hint      a short sentence added to an error message when the mistake looks like a habit from
          numpy, MATLAB, PyTorch or LaTeX (``X^T``, ``X'``, ``X.T``, ``X @ Q``, ``softmax(X)``)
          or a misspelt keyword (``weigth``): it says what fdsl spells that way. A hint never
          changes what a program means; it only makes an error say what to write.

The parser (``fdsl.lang.parse``) asks ``syntax_hint`` about each syntax error, and the elaborator
(``fdsl.lang.elaborate``) asks ``function_hint`` and ``keyword_hint`` about unknown names.
"""

from __future__ import annotations

import difflib
import re
from typing import Optional

# Functions under the names other tools give them -> what fdsl writes.
FUNCTION_ALIASES = {
    "softmax": "a(X) is the row-wise softmax",
    "relu": "m(X) is relu",
    "ReLU": "m(X) is relu",
    "tr": "trace(A) is the trace",
    "Tr": "trace(A) is the trace",
    "transpose": "X^t is the transpose of X",
    "matmul": "a product is written by juxtaposition: A B",
    "dot": "a product is written by juxtaposition: A B",
    "mul": "a product is written by juxtaposition: A B (A * B is the componentwise product)",
    "hadamard": "A * B is the componentwise (Hadamard) product",
    "multiply": "A * B is the componentwise (Hadamard) product",
    "diff": "d(X) is the differential",
    "identity": "eye(n) is the identity of dim n",
    "sum": "a sum is written with +",
    "T": "X^t is the transpose of X",
    # names that are a few letters from an fdsl name of another meaning (norm, normal; diag,
    # diagram): said here, so that no spelling hint offers the other
    "norm": "the squared Frobenius norm of A is trace(A^t A) (there is no norm function)",
    "diag": "the diagonal of a square A, as a matrix, is eye(n) * A (there is no diag function)",
    "mean": "rowmean(X) is the mean of each row (a column)",
    "var": "rowvar(X) is the variance of each row (a column)",
    "log_softmax": "logsoftmax(X) is the row-wise log-softmax",
    "layer_norm": "layernorm(X) normalises each row",
    "LayerNorm": "layernorm(X) normalises each row",
}

# The words that start a statement: declarations and commands.
KEYWORDS = ("dim", "const", "scalar", "weight", "show", "rules", "values", "random", "save")

_TRANSPOSE = "transpose is written ^t (a lower-case t): X^t"


def function_hint(name: str) -> Optional[str]:
    """What to write for a function known under another name (``softmax`` -> ``a``)."""
    return FUNCTION_ALIASES.get(name)


def close_name(name: str, known) -> Optional[str]:
    """The name of ``known`` that ``name`` is a slip of the keys for, or None: the same but for case,
    or one letter added, dropped, changed, or two neighbours swapped (``Eq`` -> ``E``, ``nromal`` ->
    ``normal``). Closeness of spelling alone is not closeness of meaning: a name that is only the
    start of a longer one (``norm``, ``normal``; ``diag``, ``diagram``) is another word, not a slip."""
    lower = name.lower()
    slips = [other for other in known if other != name and (other.lower() == lower or (
        max(len(name), len(other)) > 1 and one_edit_apart(lower, other.lower(), swaps=True)))]
    # (two one-letter names are one letter apart, and no slip: X for Y)
    return min(slips, key=lambda other: other.lower() != lower) if slips else None


def one_edit_apart(a: str, b: str, swaps: bool = False) -> bool:
    """One letter inserted, deleted or changed (with ``swaps``, or two neighbouring letters
    swapped) turns ``a`` into ``b``; never for ``a == b``."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    swapped = swaps and len(a) == len(b) and i + 1 < len(a) and a[i] == b[i + 1] and a[i + 1] == b[i] \
        and a[i + 2:] == b[i + 2:]
    # the first difference: skip one letter of the longer name, or one of each if equally long
    return swapped or a[i + (len(a) == len(b)):] == b[i + 1:]


def keyword_hint(word: str) -> Optional[str]:
    """The keyword that ``word`` is a misspelling of (``weigth`` -> ``weight``), or None."""
    if word in KEYWORDS:
        return None
    close = difflib.get_close_matches(word.lower(), KEYWORDS, n=1, cutoff=0.6)
    return close[0] if close else None


def syntax_hint(text: str, line: int, col: int, keywords: bool = True):
    """``(hint, column, whole)`` for the syntax error at ``line``:``col`` (1-based) of ``text``:
    the column is where the caret belongs (a misspelt keyword, not the token after it), and
    ``whole`` says the hint is the whole message rather than an addition to it; or None.
    ``keywords``: look for a misspelt statement keyword (programs; rule files have their own)."""
    lines = text.splitlines()
    if not 0 < line <= len(lines):
        return None
    hint = _hint_at(lines[line - 1], col)
    if hint is None:
        return _keyword_at(lines[line - 1], col) if keywords else None
    return hint, col, False


def _hint_at(src: str, col: int) -> Optional[str]:
    at = src[col - 1:] if col > 0 else ""
    before = src[:col - 1].rstrip() if col > 0 else ""
    if at.startswith("@"):
        return "a matrix product is written by juxtaposition: A B, not A @ B"
    if at.startswith("'") and before and (before[-1].isalnum() or before[-1] in ")]_"):
        return "X' is not fdsl: " + _TRANSPOSE
    if re.match(r"\.[Tt]\b", at) and before and (before[-1].isalnum() or before[-1] in ")]_"):
        return "X.T is not fdsl: " + _TRANSPOSE
    if re.match(r"T\b", at) and before.endswith("^"):
        return _TRANSPOSE
    if at.startswith("*") and before.endswith("*"):
        return "a power is written ^: s^2, k^(-1/2)"
    if at.startswith("//") or (at.startswith("/") and before.endswith("/")):
        return "a comment starts with #, not //: # the rest of the line"
    return None


def _keyword_at(src: str, col: int):
    """A statement that starts with a misspelt keyword (``weigth U : d x d``) fails later on
    the line; the hint names the keyword and the caret goes to the misspelling."""
    first = re.match(r"(\s*)([A-Za-z][A-Za-z0-9_]*)\s+[A-Za-z]", src)
    if first and first.end(2) < col:
        keyword = keyword_hint(first.group(2))
        if keyword is not None:
            return ("%r is not a keyword; did you mean %r?" % (first.group(2), keyword),
                    first.start(2) + 1, True)
    return None
