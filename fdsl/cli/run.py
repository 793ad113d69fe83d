"""``fdsl run FILE``: read a program, elaborate it and print what it shows."""

from __future__ import annotations

import sys

from .common import FILE_HELP, add_run_options, run_setup


def _cmd_run(args) -> int:
    from ..lang.program import Program, load

    if args.file is None and not args.expr:
        args.parser.error("give a program: fdsl run FILE, fdsl run - (standard input) or fdsl run -e 'TEXT'")
    setup, after = run_setup(args)
    if args.file is not None:
        program = load(args.file, rules=args.rules or (), setup=setup, unchecked=args.unchecked)
    else:
        program = Program("-e")
        program.options["unchecked"] = args.unchecked
        for r in args.rules or ():
            program.load_rules(r)
        setup(program)
    for text in args.expr or ():
        program.feed(text, "-e")
    after(program)
    program.run(sys.stdout)
    return 0


def register(sub):
    run = sub.add_parser("run", help="run a .fd program and print what it shows",
                         description="Read a program (a file, '-' for standard input, or -e TEXT), elaborate "
                         "it and print what it shows. Errors go to stderr as file:line:col with exit code 2.")
    run.add_argument("file", nargs="?", help=FILE_HELP + "; optional with -e")
    run.add_argument("-e", "--expr", action="append", metavar="TEXT",
                     help="program text, e.g. 'dim n; const A : n x n; weight W : n x n; normal(form(A W))': "
                     "statements separated by ';', an expression alone is shown (repeatable; after FILE)")
    add_run_options(run)
    run.set_defaults(func=_cmd_run, parser=run)
