"""What the commands share: the options that say how a program is read, run and limited, and
loading a program with the values of its symbols.

A run option is a flag of ``fdsl run`` and ``fdsl repl`` (``--rules``, ``--trace``, the limits,
``--values``, ``--random``); a value option is a flag of the commands that need numbers
(``grad``, ``flow``, ``train``). Libraries are imported when a command runs, not when the
parser is built: ``fdsl --help`` imports only the command line.
"""

from __future__ import annotations

import argparse
import math
import sys

from ..base.errors import FdslError
from ..base.limits import DEFAULT_SIZE_LIMIT, DEFAULT_STEP_LIMIT, DEFAULT_TIME_LIMIT

FILE_HELP = "the .fd program to read ('-' reads it from standard input)"
RULES_HELP = "load a rule file before the program (repeatable)"
UNCHECKED_HELP = ("load rule files (--rules and the program's rules statements) without checking their rules "
                  "numerically; by default an unsound rule is refused at its line")


def add_rules_options(p, help=RULES_HELP) -> None:
    """--rules FILE and --unchecked: every command that loads rule files takes both."""
    p.add_argument("--rules", action="append", metavar="FILE", help=help)
    p.add_argument("--unchecked", action="store_true", help=UNCHECKED_HELP)


def add_run_options(p) -> None:
    """The options that say how a program is read and run: fdsl run and fdsl repl share them."""
    add_rules_options(p)
    p.add_argument("--trace", action="store_true", help="print every rewrite step to stderr")
    add_limit_options(p)
    p.add_argument("--values", metavar="FILE.npz", help="numeric values of symbols, for eval/grad")
    p.add_argument("--random", type=int, metavar="SEED", help="random values for symbols without one")


def run_setup(args):
    """``setup(program)`` applying the run options, called before the program is read (its
    statements run as it is read); also returns a check for after it was read."""
    numeric = args.values or args.random is not None
    if numeric:
        from ..numbers import values

    def setup(program):
        program.options["trace"] = args.trace
        set_limits(program, args)
        program.options["progress"] = _progress_wanted(args)
        if args.values:
            values.load_values(program, args.values)
        if args.random is not None:
            values.random_values(program, args.random)

    def after(program):
        if numeric:
            values.check_values(program)  # names in --values that the program never declared

    return setup, after


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (0 and negative limits mean nothing)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a whole number" % text) from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1, not %d" % value)
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number of seconds" % text) from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError("must be a positive number of seconds, not %s" % text)
    return value


def add_limit_options(p, time: bool = True) -> None:
    """--step-limit, --size-limit and --time-limit: where a rewrite stops with a reason instead of
    running on, and how long a training run or a solve may be estimated to take (``time``: fdsl
    serve has a --time-limit of its own, the seconds one command may run, which it passes on)."""
    p.add_argument("--step-limit", type=positive_int, metavar="N", help="rewrite steps before a ruleset "
                   "is declared non-terminating (default %d)" % DEFAULT_STEP_LIMIT)
    p.add_argument("--size-limit", type=positive_int, metavar="N", help="term cells (each new node with its "
                   "operands) one rewrite may build before it is declared growing without end; one step alone may "
                   "build a fiftieth of it (default %d)" % DEFAULT_SIZE_LIMIT)
    if not time:
        return
    p.add_argument("--time-limit", type=positive_seconds, metavar="SECONDS", help="a training run (steps) or a "
                   "conjugate-gradient solve (gaussnewton's iterations) estimated to take longer, from the cost of "
                   "its first steps, is refused before it runs on, and one that runs longer is stopped "
                   "(default %d)" % DEFAULT_TIME_LIMIT)


def set_limits(program, args) -> None:
    program.options["step_limit"] = getattr(args, "step_limit", None)
    program.options["size_limit"] = getattr(args, "size_limit", None)  # the widest flat term follows it
    program.options["time_limit"] = getattr(args, "time_limit", None)


def _progress_wanted(args) -> bool:
    """Progress on stderr for long work: only on a terminal, and not over a --trace."""
    from ..base.progress import wanted

    return wanted(sys.stderr) and not getattr(args, "trace", False)


def add_value_options(p) -> None:
    # at least one of the two (load_with_values says so); together, the file's arrays are used and
    # the rest is drawn: data from a file, weights at random (issue 31)
    p.add_argument("--values", metavar="IN.npz", help="the values of the symbols (arrays keyed X, Q_0, ...)")
    p.add_argument("--random", type=int, metavar="SEED",
                   help="random values for the symbols --values does not give (all of them without --values)")
    add_rules_options(p, "load a rule file first (repeatable)")
    add_limit_options(p)


def load_with_values(args):
    """Load ``args.file`` with ``--values``/``--random`` (and ``--rules``) applied first, as ``fdsl run``
    does; an error if neither gives values."""
    from ..lang.program import load
    from ..numbers import values

    if args.values is None and args.random is None:
        raise FdslError("give the values of the symbols: --values IN.npz or --random SEED")

    def setup(program):
        set_limits(program, args)
        program.options["train"] = False  # train(...) calls in the file wait: this command decides
        if args.values:
            values.load_values(program, args.values)
        if args.random is not None:
            values.random_values(program, args.random)

    program = load(args.file, rules=args.rules or (), setup=setup, unchecked=args.unchecked)
    values.check_values(program)
    return program
