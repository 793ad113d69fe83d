"""One browser session's program, in a process of its own: ``python -m fdsl.serve.worker``.

Vocabulary
----------
worker     the process that holds one page load's program (a ``WebSession``, the repl's session
           with the browser's output). A process per session keeps tabs apart, lets a command that
           runs too long be interrupted (SIGINT) or, if it will not stop, killed without touching
           the server or the other tabs, and gives each session its own memory limit.
request    one JSON line on stdin: ``{"op": "run", "input": TEXT}``, ``{"op": "help"}``,
           ``{"op": "reset"}``; the reply is one JSON line on the protocol channel (the original
           stdout; the worker's own stdout goes to stderr, so nothing stray can corrupt it).
item       one piece of a reply, shown in order by the page: ``text`` (preformatted), ``math``
           (LaTeX to typeset, with the text it stands for), ``svg`` and ``png`` (a picture, base64),
           ``file`` (a file the command wrote in the session's folder: its path there, which the
           page offers for download), ``error`` (the message with its line and caret, kept under
           its command) and, for the grey box, ``log`` (traces, notes).
home       the folder of the FILE given to ``fdsl serve`` (None without one): ``:load NAME``
           reads NAME there, as ``fdsl repl FILE`` run in that folder would.

The worker evaluates in a thread with a big stack, as the command line does; SIGINT raises
KeyboardInterrupt in that thread while it works (the repl's session reports "interrupted" and goes
on), and is ignored while it waits for a request.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

from ..base.errors import FdslError, printable
from ..base.files import Print, Write, perform_all
from ..base.inputs import admit
from ..repl.session import Command, Session, find_command, help_text

# Elaboration recurses once per nested call (encoder(64) nests 64 deep): as fdsl.cli.main
_STACK_BYTES = 512 * 1024 * 1024
_RECURSION_LIMIT = 200_000

WEB_HELP = """\
Type fdsl in the command window: Enter runs it, Shift+Enter starts a new line, Up and Down bring
back earlier commands (kept in this browser). An expression alone is shown, typeset; _ is the
last value shown; NAME? says what a name is. :diagram EXPR draws EXPR here; depends(coeff(N, K[5]),
Q[3]) shows its path and its picture. An error stands under its command; logs (traces) go to the
grey box. Stop interrupts a command that runs long; Reset starts the program afresh (FILE loaded
again). Files a program writes (save, plot, diagram) go to this session's own folder, each with a
link to download it; a plot is shown here. :load NAME reads NAME from the served file's folder."""

# a picture larger than this is offered for download but not shown inline (the reply is one JSON line)
INLINE_BYTES = 8 * 1024 * 1024



def _readable(path: Path) -> bool:
    """Whether the confinement lets the page read ``path`` (asked before any look at it)."""
    try:
        admit(str(path), "program")
    except FdslError:
        return False
    return True

class WebSession(Session):
    """The repl's session with the browser's output: every output becomes an item of the reply."""

    def __init__(self, own: Path, home: Optional[Path] = None):
        super().__init__(out=io.StringIO(), err=io.StringIO(), pager="off")
        self.own = own
        self.home = home
        self.items: list = []
        self.program.base_dir = own

    def reset(self) -> None:
        super().reset()
        self.program.base_dir = self.own
        self.program.trace_out = self.err

    def take(self) -> list:
        """The items of the last request, logs (traces) after the outputs."""
        items, self.items = self.items, []
        log = self.err.getvalue()
        self.err.seek(0)
        self.err.truncate()
        if log.strip():
            items.append({"kind": "log", "text": printable(log.rstrip("\n"))})
        return items

    # ---- the outputs of Session: every text through printable, as on a terminal (a name typed
    # with a control character or a lone surrogate in it is shown escaped, and the reply stays JSON
    # that any client decodes)
    def say(self, text: str) -> None:
        if text.strip():
            self.items.append({"kind": "text", "text": printable(text)})

    def show(self, text: str, hint: Optional[str] = None) -> None:
        self.say(text.rstrip("\n"))

    def _error(self, text: str) -> None:
        self.items.append({"kind": "error", "text": printable(text)})

    def load(self, path: str) -> None:
        """``:load NAME``: a relative NAME is the served file's neighbour (the page's own folder
        holds only what the session wrote, so it is tried only when the served folder has no NAME)."""
        p = Path(path).expanduser()
        if self.home is not None and not p.is_absolute():
            beside, own = self.home / p, self.own / p
            # the confinement judges a path before anything looks at it (a refused one may not say
            # whether it exists): the page's folder is tried only where both are readable
            if not (_readable(beside) and _readable(own)) or beside.exists() or not own.exists():
                p = beside
        super().load(str(p))

    def perform(self, effects, hint: Optional[str] = None) -> None:
        perform_all(effects, None, self.program)  # files first, all or nothing
        for effect in effects:
            if isinstance(effect, Print):
                self.items.extend(self.shown(effect))
            elif isinstance(effect, Write):
                if effect.note:
                    self.say(effect.note)
                self.items.extend(self.written(effect.path))

    def written(self, path: Path) -> list:
        """The items of a file a command wrote: its picture (an SVG or a PNG: diagram, plot), and
        its path in the session's folder, for the page's download link."""
        try:
            real = path.resolve()
            name = real.relative_to(self.own).as_posix()
            size = real.stat().st_size
        except (OSError, ValueError):  # not in the session's folder: nothing to offer
            return []
        items = []
        shown = printable(name)
        if real.suffix in (".svg", ".png") and real.is_file() and size <= INLINE_BYTES:
            if real.suffix == ".svg":  # diagram(E, "e.svg")
                items.append(svg_item(real.read_text(encoding="utf-8"), shown))
            else:  # plot "loss.png" e
                items.append({"kind": "png", "png": base64.b64encode(real.read_bytes()).decode("ascii"),
                              "caption": shown})
        if shown == name:  # a name that is not text (a byte that is not UTF-8) has no link: it is only said
            items.append({"kind": "file", "path": name, "bytes": size})
        return items

    def shown(self, effect) -> list:
        """The items of one output: a term (or a printer's text of one) typeset, a depends answer
        with its picture, anything else as text."""
        from ..core.functions import Printed
        from ..core.printers import latex
        from ..core.terms import Term

        value = getattr(effect, "value", None)
        term = value if isinstance(value, Term) else value.term if isinstance(value, Printed) else None
        if term is not None:
            return [{"kind": "math", "latex": latex(term), "text": printable(effect.text)}]
        items = [{"kind": "text", "text": printable(effect.text)}]
        picture = self.depends_picture(value, getattr(effect, "node", None))
        if picture is not None:
            items.append(picture)
        return items

    def depends_picture(self, value, node) -> Optional[dict]:
        """``depends(coeff(N, W), V)`` that holds: the dependency view of the path (fdsl deps)."""
        from ..calculus.forms import Dependence

        if not (isinstance(value, Dependence) and value.holds and node is not None and node.kind == "call"
                and node.value == "depends" and len(node.args) == 2):
            return None
        inner = node.args[0]
        if not (inner.kind == "call" and inner.value == "coeff" and len(inner.args) == 2):
            return None
        from ..pictures import graphviz as gv
        from ..pictures.depsview import path_view

        try:
            of = self.program.evaluate(inner.args[1], {})
            diagram = gv.Diagram(path_view(value.nodes[0], value.nodes[-1], of))
            return svg_item(diagram.svg(), "does the coefficient of d%s involve %s?"
                            % (of.data[0].printed(), value.path[-1] if value.path else "it"))
        except FdslError as e:
            self._error("no picture: %s" % e.message)
            return None

    # ---- the commands: :diagram draws here, :quit and :pager mean nothing in a browser
    def find_command(self, word: str) -> Command:
        found = find_command(word)
        if found.name == "diagram":
            return Command("diagram", ":diagram EXPR", "draw EXPR here", _diagram_here)
        if found.name in ("quit", "pager"):
            return Command(found.name, found.usage, found.doc,
                           lambda s, arg: s.say("in the browser, close the tab to leave; output is never paged"))
        return found


def _diagram_here(session: WebSession, arg: str) -> None:
    from ..pictures import graphviz as gv

    if not arg:
        raise FdslError("usage: :diagram EXPR")
    picture = gv.diagram(session.program.expr(arg), title=arg)
    session.items.append(svg_item(picture.svg(), arg))


def svg_item(svg: str, caption: str) -> dict:
    # base64, shown as an <img>: a picture's text never becomes markup or script on the page
    return {"kind": "svg", "svg": base64.b64encode(svg.encode("utf-8")).decode("ascii"), "caption": printable(caption)}


# ---- the process ----------------------------------------------------------------------------------


class Worker:
    def __init__(self, args):
        self.args = args
        self.own = Path(args.own).resolve()
        self.session = WebSession(self.own, Path(args.file).parent if args.file else None)
        self.busy = False

    def options(self, program) -> None:
        program.options["step_limit"] = self.args.step_limit
        program.options["size_limit"] = self.args.size_limit
        program.options["time_limit"] = getattr(self.args, "time_limit", None)
        program.options["progress"] = False

    def start(self) -> list:
        self.options(self.session.program)
        if self.args.file:
            self.session.run(":load " + self.args.file)
        return self.session.take()

    def handle(self, request: dict) -> dict:
        op = request.get("op")
        started = time.perf_counter()
        self.busy = True
        try:
            if op == "run":
                ok = self.session.run(str(request.get("input", "")), filename="<input>")
                items = self.session.take()
            elif op == "reset":
                self.session.reset()
                self.options(self.session.program)
                items = self.start()
                ok = True
            elif op == "help":
                return {"text": WEB_HELP + "\n\n" + help_text(self.session.program)}
            else:
                return {"items": [{"kind": "error", "text": "unknown request %r" % op}], "ok": False}
        except KeyboardInterrupt:  # arrived between the session's own handlers
            ok, items = False, self.session.take() + [{"kind": "error", "text": "interrupted"}]
        finally:
            self.busy = False
        return {"items": items, "ok": ok, "seconds": round(time.perf_counter() - started, 3)}


def prepare(own: Path, file: Optional[str], quota: Optional[int] = None) -> None:
    """Import what a session may need before the confinement begins, and confine."""
    from .. import compose  # noqa: F401  (the language's functions and statements)
    from ..lang.program import Program
    from ..pictures import depsview, graphviz  # noqa: F401
    from . import confine

    Program("<warm>", own)  # reads the grammar and the stdlib once
    from ..base.resources import grammar_path, stdlib_dir

    readable = [str(Path(compose.__file__).resolve().parent), str(grammar_path("fdsl.lark").parent)] \
        + confine.python_roots()
    served = str(Path(file).expanduser().resolve()) if file else None
    confine.install(str(own), readable, quota, served=served, stdlib=[str(stdlib_dir())])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fdsl.serve.worker")
    p.add_argument("--own", required=True)
    p.add_argument("--file")
    p.add_argument("--step-limit", type=int)
    p.add_argument("--size-limit", type=int)
    p.add_argument("--time-limit", type=float, help="seconds one command may run: also what a training run "
                   "or a solve may be estimated to take")
    p.add_argument("--memory-limit", type=int, help="MiB of address space")
    p.add_argument("--disk-limit", type=int, help="MiB the session's folder may hold (and each file in it)")
    args = p.parse_args(argv)

    # the protocol channel is the original stdout; print() and libraries write to stderr
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    own = Path(args.own).resolve()
    if args.file:
        args.file = str(Path(args.file).expanduser().resolve())  # before the session's folder is the cwd
    os.chdir(own)
    os.environ["TMPDIR"] = str(own)
    tempfile.tempdir = str(own)
    if args.memory_limit:
        import resource

        limit = args.memory_limit * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    quota = args.disk_limit * 1024 * 1024 if args.disk_limit else None
    if quota:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails (EFBIG), not the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (quota, quota))
    sys.setrecursionlimit(_RECURSION_LIMIT)
    threading.stack_size(_STACK_BYTES)

    worker_box: list = []
    finished = threading.Event()

    def reply(obj) -> None:
        channel.write(json.dumps(obj) + "\n")
        channel.flush()

    def serve():
        try:
            prepare(own, args.file, quota)
            worker = Worker(args)
            worker_box.append(worker)
            reply({"items": worker.start(), "ok": True})
            for line in sys.stdin:
                try:
                    request = json.loads(line)
                except ValueError:
                    reply({"items": [{"kind": "error", "text": "not a request"}], "ok": False})
                    continue
                reply(worker.handle(request))
        finally:
            finished.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    signal.signal(signal.SIGINT, lambda *a: _interrupt(worker_box, thread))
    while not finished.is_set():
        finished.wait(0.5)
    shutil.rmtree(own, ignore_errors=True)
    return 0


def _interrupt(worker_box, thread) -> None:
    """SIGINT: stop the command being evaluated, if there is one."""
    if worker_box and worker_box[0].busy:
        import ctypes

        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt))


if __name__ == "__main__":
    sys.exit(main())
