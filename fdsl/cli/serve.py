"""``fdsl serve [FILE]``: the manual's console in the browser (see ``fdsl.serve``)."""

from __future__ import annotations

import argparse
import errno
import socket

from ..base.errors import FdslError
from .common import add_limit_options, positive_int, positive_seconds

# a session's process needs about 800 MiB of address space to start (Python, numpy, OpenBLAS and
# the deep stack of its evaluating thread); less and every session would fail to start
MIN_MEMORY_MIB = 1024


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a port number" % text) from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("a port is 0 to 65535 (0 picks a free one), not %d" % value)
    return value


def _memory_mib(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a whole number of MiB" % text) from None
    if value < MIN_MEMORY_MIB:
        raise argparse.ArgumentTypeError("must be at least %d MiB (a session's process needs about 800 MiB to "
                                         "start), not %d" % (MIN_MEMORY_MIB, value))
    return value


def _cmd_serve(args) -> int:
    from ..base.inputs import read_source
    from ..serve import Options, serve

    if args.file:
        read_source(args.file, "file")  # a missing or unreadable FILE is an error here, not in the page
    options = Options(args.file, step_limit=args.step_limit, size_limit=args.size_limit,
                      time_limit=args.time_limit, memory_limit=args.memory_limit,
                      request_timeout=args.request_timeout, disk_limit=args.disk_limit)
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
    p.add_argument("--port", type=_port, default=8765, metavar="N", help="the port (default 8765; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                   help="the address to listen on (default 127.0.0.1, this machine only; others get a warning)")
    p.add_argument("--open", action="store_true", help="open the page in a web browser (through a file readable "
                   "by you alone, so that the token is not on the browser's command line)")
    add_limit_options(p, time=False)
    p.add_argument("--time-limit", type=positive_seconds, default=60.0, metavar="SECONDS",
                   help="seconds one command may run before it is stopped (default 60)")
    p.add_argument("--memory-limit", type=_memory_mib, metavar="MiB",
                   help="address space of each session's process, in MiB, at least %d (default: the memory "
                   "budget of fdsl run)" % MIN_MEMORY_MIB)
    p.add_argument("--disk-limit", type=positive_int, default=1024, metavar="MiB",
                   help="MiB a session's folder may hold (default 1024): no file is opened for writing past it, "
                   "and no file grows past it")
    p.add_argument("--request-timeout", type=positive_seconds, default=10.0, metavar="SECONDS",
                   help="seconds a client has to send one whole request (default 10); a slower one is cut off")
    p.set_defaults(func=_cmd_serve)
