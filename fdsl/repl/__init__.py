"""The repl: ``fdsl repl [FILE]``, the manual's console in a terminal.

``session`` holds one program and the repl's commands, apart from the terminal; ``terminal`` reads
input, from a prompt (completion, history, highlighting) or a script on stdin.
"""

from . import session as _session
from .session import (
                      COMMANDS,
                      Command,
                      Session,
                      _isatty,
                      _shown_expression,
                      history_path,
                      joined,
                      needs_more,
                      shutil,
                      summand_hints,
)
from .terminal import _make_completer, interactive, script

__all__ = ["COMMANDS", "Command", "Session", "history_path", "interactive", "joined", "needs_more", "script",
           "summand_hints", "_isatty", "_make_completer", "_shown_expression", "shutil", "_session"]
