"""The command line: ``fdsl run | grad | flow | train | rules | diagram | deps | codegen | repl | serve``.

A thin layer over the library: parse arguments, call it, print errors as
``file:line:col: message`` and exit 2 on bad input. A traceback here is a bug. One module per
command (``fdsl/cli/run.py``, ``grad.py``, ...), each with ``register(subparsers)`` and the
function that runs it; a command imports the library when it runs, so building the parser
(``fdsl --help``, ``fdsl --version``) imports only the command line.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from .. import __version__
from ..base.errors import FdslError, say
from . import codegen, diagram, flow, grad, repl, rules, run, serve, train

# in the order --help lists them
COMMANDS = (run, repl, serve, diagram, grad, rules, train, codegen, flow)

# Elaboration recurses once per nested call of a user definition (encoder(64) nests 64 deep);
# a big thread stack lets the depth limit in fdsl.lang.elaborate, not the interpreter, decide.
_STACK_BYTES = 512 * 1024 * 1024
_RECURSION_LIMIT = 200_000


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fdsl", description="Matrices of differential forms: "
                                     "closed-form gradients of transformer weights by rewriting.")
    parser.add_argument("--version", action="version", version="fdsl %s" % __version__,
                        help="print the version of fdsl and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    for command in COMMANDS:
        command.register(sub)
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


def _inputs_of(args) -> None:
    """Mark the files the command line names as inputs (the program, rule files, a values file)
    before anything is checked: no output may replace one of them (``fdsl.base.files``)."""
    from ..base.inputs import remember

    for name in ("file", "files", "rules", "values"):
        value = getattr(args, name, None)
        for path in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(path, str):
                remember(path)


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # a kill (SIGTERM) ends the work as Ctrl-C does: temporary files removed


def _check_command(parser, argv) -> None:
    """A misspelt command (``fdsl rnu``) gets the one it is closest to, not only the list."""
    import difflib

    if not argv or argv[0].startswith("-"):
        return
    choices = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    if argv[0] not in choices:
        close = difflib.get_close_matches(argv[0], list(choices), n=1, cutoff=0.5)
        parser.error("no command %r%s (the commands: %s)" % (argv[0], "; did you mean %r?" % close[0] if close else "",
                                                             ", ".join(choices)))


def _main(argv, result):
    args = None
    try:
        parser = build_parser()
        _check_command(parser, argv)
        args = parser.parse_args(argv)
        _inputs_of(args)
        result.append(args.func(args))
    except FdslError as e:
        if e.file is None and isinstance(getattr(args, "file", None), str):
            e.file = args.file  # an error of the command's work on a program is an error of its file
        say(str(e), sys.stderr)
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
        term = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread: leave the signals alone
        term = None
    try:
        return _run_worker(argv)
    finally:
        sys.setrecursionlimit(limit)
        threading.stack_size(stack)
        if term is not None:
            signal.signal(signal.SIGTERM, term)


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
    # only the worker walks deep terms: threads it starts (a progress timer) take the usual stack,
    # not another 512 MiB of address space (under a 2 GB limit one could not start at all)
    threading.stack_size(0)
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
