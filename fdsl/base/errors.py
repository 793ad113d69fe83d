"""Errors a user can act on: ``file:line:col: message``, the offending line and a caret.

Every error that reaches the command line is an ``FdslError``; the CLI prints it and exits 2.
Anything else escaping is a bug in fdsl, not in the user's input.
"""

from __future__ import annotations

import re
import sys
from typing import Optional

# control characters (C0, DEL, C1) and the invisible bidirectional controls: echoed raw they would
# drive the terminal (clear the screen, set its title, OSC 52 writes the clipboard) or reorder what
# it shows; everything fdsl prints that came from a user's file passes through ``printable``
ECHO_WIDTH = 160  # the most characters of a source line a message echoes (a window around the column)

# lone surrogates too: a file name that is not UTF-8 reaches Python as one (os.fsdecode's
# surrogateescape), and no stream can encode it
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: str, newlines: bool = True) -> str:
    """``text`` with its control characters written as escapes (``\\x1b``, ``\\u202e``): safe for a
    terminal; tabs and (when ``newlines``) line ends are kept, since they only move the cursor. A
    byte of a file name that is not UTF-8 (a lone surrogate U+DC80-U+DCFF) is written as the byte,
    ``\\xff``, as a shell's ``$'...'`` would name it."""
    def escape(m):
        c = ord(m.group())
        if 0xdc80 <= c <= 0xdcff:
            c -= 0xdc00
        return "\\x%02x" % c if c < 0x100 else "\\u%04x" % c
    text = _CONTROL.sub(escape, text)
    return text if newlines else text.replace("\n", "\\n")


def say(text: str, out=None) -> None:
    """Print a line that may hold a name the user gave (a file name, a flag's value) on ``out``
    (standard output by default): its control characters escaped (``printable``), and whatever the
    stream's encoding cannot write escaped too, rather than failing once the work is done."""
    out = sys.stdout if out is None else out
    text = printable(text)
    encoding = getattr(out, "encoding", None)
    if encoding:
        try:
            text.encode(encoding)
        except UnicodeEncodeError:
            text = text.encode(encoding, "backslashreplace").decode(encoding)
        except LookupError:
            pass
    out.write(text + "\n")


class FdslError(Exception):
    """An error in the user's input, with where it is when that is known."""

    def __init__(self, message: str, file: Optional[str] = None, line: Optional[int] = None,
                 col: Optional[int] = None, source: Optional[str] = None, notes=()):
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.col = col
        self.source = source  # the whole text the position refers to
        self.notes = list(notes)

    def located(self, file, line, col, source) -> "FdslError":
        """Fill in a position if the error does not carry one yet."""
        if self.line is None:
            self.file, self.line, self.col, self.source = file, line, col, source
        elif self.file is None:
            # a position without a file is a position in the text being located: show its line
            self.file = file
            if self.source is None:
                self.source = source
        return self

    def where(self) -> str:
        parts = [self.file or "<input>"]
        if self.line is not None:
            parts.append(str(self.line))
            if self.col is not None:
                parts.append(str(self.col))
        return ":".join(parts)

    def __str__(self) -> str:
        # an error of no file and no position (a command-line flag's, --coeff X0) is its message
        # alone: "<input>:" would send the reader looking for an input that was never read
        located = self.file is not None or self.line is not None
        lines = ["%s: %s" % (printable(self.where(), False), printable(self.message)) if located
                 else printable(self.message)]
        if self.source is not None and self.line is not None:
            src_lines = self.source.split("\n")  # only newlines end a line, as in the parser
            if 0 < self.line <= len(src_lines):
                text = src_lines[self.line - 1].removesuffix("\r").expandtabs(1)
                col = self.col
                if len(text) > ECHO_WIDTH:  # a window around the column: a 400 KB line is not echoed whole
                    start = max(0, min((col or 1) - 1 - ECHO_WIDTH // 2, len(text) - ECHO_WIDTH))
                    end = start + ECHO_WIDTH
                    head, tail = ("..." if start else ""), ("..." if end < len(text) else "")
                    text, col = head + text[start:end] + tail, (col - start + len(head) if col else col)
                lines.append("    " + printable(text, False))
                if col is not None:  # the caret under the character, after its escaped prefix
                    lines.append("    " + " " * len(printable(text[:col - 1], False)) + "^")
        lines.extend(printable(n) for n in self.notes)
        return "\n".join(lines)


class Redeclared(FdslError):
    """A name declared a second time: in the repl, usually a file loaded again."""


class StepLimit(FdslError):
    """A rule set that did not reach a normal form within the step limit."""


class TooWide(StepLimit):
    """One flat sum or product of more operands than a term may hold (``width`` of them): a rule's
    step that builds it is said as the engine's size limit says a step that built too much."""

    width = 0


class Loop(StepLimit):
    """A rewrite that came back to a term still being rewritten (the message shows the term)."""
