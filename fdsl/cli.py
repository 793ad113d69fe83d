"""The command line: ``fdsl run | grad | rules | diagram | deps | codegen | repl``.

A thin layer over the Python API (``fdsl.load``, ``Program.run``): parse arguments, call the API,
print errors as ``file:line:col: message`` and exit 2 on bad input. A traceback here is a bug.
"""

from __future__ import annotations

import argparse
import sys
import threading

from .errors import FdslError
from .rewrite import DEFAULT_SIZE_LIMIT, DEFAULT_STEP_LIMIT

# Elaboration recurses once per nested call of a user definition (encoder(64) nests 64 deep);
# a big thread stack lets the depth limit in fdsl.program, not the interpreter, decide.
_STACK_BYTES = 512 * 1024 * 1024
_RECURSION_LIMIT = 200_000


FILE_HELP = "the .fd program to read ('-' reads it from standard input)"
RULES_HELP = "load a rule file before the program (repeatable)"


def add_run_options(p) -> None:
    """The options that say how a program is read and run: fdsl run and fdsl repl share them."""
    p.add_argument("--rules", action="append", metavar="FILE", help=RULES_HELP)
    p.add_argument("--trace", action="store_true", help="print every rewrite step to stderr")
    add_limit_options(p)
    p.add_argument("--values", metavar="FILE.npz", help="numeric values of symbols, for eval/grad")
    p.add_argument("--random", type=int, metavar="SEED", help="random values for symbols without one")


def run_setup(args):
    """``setup(program)`` applying the run options, called before the program is read (its
    statements run as it is read); also returns a check for after it was read."""
    numeric = args.values or args.random is not None
    if numeric:
        from .backends import numpy_eval

    def setup(program):
        program.options["trace"] = args.trace
        set_limits(program, args)
        program.options["progress"] = _progress_wanted(args)
        if args.values:
            numpy_eval.load_values(program, args.values)
        if args.random is not None:
            numpy_eval.random_values(program, args.random)

    def after(program):
        if numeric:
            numpy_eval.check_values(program)  # names in --values that the program never declared

    return setup, after


def _progress_wanted(args) -> bool:
    """Progress on stderr for long work: only on a terminal, and not over a --trace."""
    from .progress import wanted

    return wanted(sys.stderr) and not getattr(args, "trace", False)


def _cmd_run(args) -> int:
    from .program import Program, load

    if args.file is None and not args.expr:
        args.parser.error("give a program: fdsl run FILE, fdsl run - (standard input) or fdsl run -e 'TEXT'")
    setup, after = run_setup(args)
    if args.file is not None:
        program = load(args.file, rules=args.rules or (), setup=setup)
    else:
        program = Program("-e")
        for r in args.rules or ():
            program.load_rules(r)
        setup(program)
    for text in args.expr or ():
        program.feed(text, "-e")
    after(program)
    program.run(sys.stdout)
    return 0


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (0 and negative limits mean nothing)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a whole number" % text) from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1, not %d" % value)
    return value


def add_limit_options(p) -> None:
    """--step-limit and --size-limit: where a rewrite stops with a reason instead of running on."""
    p.add_argument("--step-limit", type=positive_int, metavar="N", help="rewrite steps before a ruleset "
                   "is declared non-terminating (default %d)" % DEFAULT_STEP_LIMIT)
    p.add_argument("--size-limit", type=positive_int, metavar="N", help="new term nodes one rewrite may "
                   "build before it is declared growing without end (default %d)" % DEFAULT_SIZE_LIMIT)


def set_limits(program, args) -> None:
    program.options["step_limit"] = getattr(args, "step_limit", None)
    program.options["size_limit"] = getattr(args, "size_limit", None)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="fdsl", description="Matrices of differential forms: "
                                     "closed-form gradients of transformer weights by rewriting.")
    parser.add_argument("--version", action="version", version="fdsl %s" % __version__,
                        help="print the version of fdsl and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    run = sub.add_parser("run", help="run a .fd program and print what it shows",
                         description="Read a program (a file, '-' for standard input, or -e TEXT), elaborate "
                         "it and print what it shows. Errors go to stderr as file:line:col with exit code 2.")
    run.add_argument("file", nargs="?", help=FILE_HELP + "; optional with -e")
    run.add_argument("-e", "--expr", action="append", metavar="TEXT",
                     help="program text, e.g. 'dim n; const A : n x n; weight W : n x n; normal(form(A W))': "
                     "statements separated by ';', an expression alone is shown (repeatable; after FILE)")
    add_run_options(run)
    run.set_defaults(func=_cmd_run, parser=run)

    import importlib

    for module in SUBCOMMAND_MODULES:
        importlib.import_module(module)
    for register in _SUBCOMMANDS:
        register(sub)
    _completion(parser, sub)
    return parser


def _completion(parser, sub) -> None:
    """``fdsl --print-completion bash|zsh|tcsh``: a shell completion script (shtab), with files
    completed where a subcommand takes one."""
    try:
        import shtab
    except ImportError:  # completion is a convenience: fdsl works without it
        return
    for p in sub.choices.values():
        for action in p._actions:
            if action.dest in ("file", "files") or (action.metavar or "").lower().startswith(("file", "out", "in.")):
                action.complete = shtab.FILE
    shtab.add_argument_to(parser, "--print-completion", help="print a shell completion script "
                          "(bash, zsh, tcsh, fish or powershell): eval \"$(fdsl --print-completion bash)\"")


_SUBCOMMANDS: list = []

# Modules that add subcommands with @subcommand; imported when the parser is built.
SUBCOMMAND_MODULES: list[str] = ["fdsl.repl", "fdsl.backends.graphviz", "fdsl.backends.numpy_grad",
                                 "fdsl.check", "fdsl.train", "fdsl.backends.codegen", "fdsl.flow"]


def subcommand(register):
    """Modules add their subcommands here: ``register(subparsers)``."""
    _SUBCOMMANDS.append(register)
    return register


def _main(argv, result):
    args = None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        result.append(args.func(args))
    except FdslError as e:
        if e.file is None and isinstance(getattr(args, "file", None), str):
            e.file = args.file  # an error of the command's work on a program is an error of its file
        print(str(e), file=sys.stderr)
        result.append(2)
    except SystemExit as e:  # argparse: usage errors exit 2 after printing usage
        result.append(e.code if isinstance(e.code, int) else 2)
    except KeyboardInterrupt:
        result.append(130)
    except BrokenPipeError:
        result.append(0)


def main(argv=None) -> int:
    """Entry point of the ``fdsl`` command."""
    argv = sys.argv[1:] if argv is None else argv
    # both are process-wide: set for the worker thread, restored for a caller that goes on
    limit, stack = sys.getrecursionlimit(), threading.stack_size()
    sys.setrecursionlimit(_RECURSION_LIMIT)
    threading.stack_size(_STACK_BYTES)
    try:
        return _run_worker(argv)
    finally:
        sys.setrecursionlimit(limit)
        threading.stack_size(stack)


def _run_worker(argv) -> int:
    result: list = []
    finished = threading.Event()

    def work():
        try:
            _main(argv, result)
        finally:
            finished.set()

    worker = threading.Thread(target=work)
    worker.start()
    # Signals reach only the main thread: hand Ctrl-C to the worker, where the work is (the repl
    # cancels the input being evaluated; fdsl run exits 130). Wait on an Event, not join():
    # a join() interrupted by Ctrl-C marks the thread finished while it still runs (bpo-45274).
    while not finished.is_set():
        try:
            finished.wait()
        except KeyboardInterrupt:
            if not finished.is_set():
                import ctypes

                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident),
                                                           ctypes.py_object(KeyboardInterrupt))
    worker.join()
    code = result[0] if result else 1
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    # python -m fdsl.cli: subcommand modules register with the imported fdsl.cli, not this __main__ copy
    from fdsl.cli import main as _main_of_module

    sys.exit(_main_of_module())
