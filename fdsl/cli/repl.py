"""``fdsl repl [FILE]``: an interactive session on one program (or a script of inputs on stdin)."""

from __future__ import annotations

import sys

from .common import add_run_options, run_setup


def _cmd_repl(args) -> int:
    from ..repl import Session, _isatty, interactive, script

    session = Session()
    setup, after = run_setup(args)
    session.program.options["unchecked"] = args.unchecked  # (:reset keeps the options)
    for r in args.rules or ():
        session.program.load_rules(r)
        session.rule_files.append(r)
    setup(session.program)
    use_terminal = _isatty(sys.stdin) and _isatty(sys.stdout)
    if args.file:
        session.run(":load " + args.file)
    after(session.program)
    if use_terminal:
        interactive(session)
        return 0
    try:  # bytes that are not UTF-8 are a character of their own (U+FFFD), then a syntax error
        sys.stdin.reconfigure(errors="replace")
    except (AttributeError, ValueError):
        pass
    script(session, sys.stdin)
    return 2 if session.failed else 0


def register(sub):
    p = sub.add_parser("repl", help="an interactive session: type fdsl, see the results",
                       description="An interactive session on one program: an expression alone is shown, "
                       ":help lists what you can type, Ctrl-D quits. Without a terminal it reads its inputs "
                       "from stdin and exits with status 2 if any failed. It takes the options of fdsl run.")
    p.add_argument("file", nargs="?", help="a .fd file to load first")
    add_run_options(p)
    p.set_defaults(func=_cmd_repl)
