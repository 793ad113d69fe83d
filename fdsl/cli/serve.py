"""``fdsl serve [FILE]``: the manual's console in the browser (see ``fdsl.serve``)."""

from __future__ import annotations

import argparse
import errno
import socket

from ..base.errors import FdslError
from .common import add_limit_options


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number of seconds" % text) from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return value


def _cmd_serve(args) -> int:
    from ..base.inputs import read_source
    from ..serve import Options, serve

    if args.file:
        read_source(args.file, "file")  # a missing or unreadable FILE is an error here, not in the page
    options = Options(args.file, step_limit=args.step_limit, size_limit=args.size_limit,
                      time_limit=args.time_limit, memory_limit=args.memory_limit)
    try:
        serve(options, host=args.host, port=args.port, open_browser=args.open)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise FdslError("port %d is in use; --port 0 picks a free one" % args.port) from None
        if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) or isinstance(e, socket.gaierror):
            raise FdslError("cannot listen on %s: %s" % (args.host, e.strerror or e)) from None
        raise
    except KeyboardInterrupt:
        return 0
    return 0


def register(sub):
    p = sub.add_parser("serve", help="the manual's console in the browser: type fdsl, see it typeset",
                       description="A local web console: the page at the printed URL (which carries a random "
                       "token: requests without it get 403) runs fdsl as fdsl repl does, one session per page "
                       "load, forms typeset, diagrams inline. It listens on 127.0.0.1 unless --host says "
                       "otherwise. Programs run from the page write only in a folder of their own.")
    p.add_argument("file", nargs="?", help="a .fd file to load first in every session")
    p.add_argument("--port", type=int, default=8765, metavar="N", help="the port (default 8765; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                   help="the address to listen on (default 127.0.0.1, this machine only; others get a warning)")
    p.add_argument("--open", action="store_true", help="open the page in a web browser")
    add_limit_options(p, time=False)
    p.add_argument("--time-limit", type=_positive_seconds, default=60.0, metavar="SECONDS",
                   help="seconds one command may run before it is stopped (default 60)")
    p.add_argument("--memory-limit", type=int, metavar="MiB",
                   help="address space of each session's process, in MiB (default: the memory budget of fdsl run)")
    p.set_defaults(func=_cmd_serve)
