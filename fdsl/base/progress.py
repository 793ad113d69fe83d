"""Progress on stderr for long work, so a minute of work is not a minute of silence.

Vocabulary
----------
slow step   a piece of work that may take long (normalising a deep form, Graphviz laying out a
            picture). ``slow(what)`` wraps it: if it is still running after ``NOTE_AFTER``
            seconds, one line ``fdsl: WHAT (still working after 3 s)`` goes to stderr, and when it
            ends, how long it took. Quick steps print nothing, so normal output stays clean.
progress    a live line on stderr (tqdm) naming the ruleset that runs and how many rewrite steps
            it has taken, shown only on a terminal and only once the work has passed ``DELAY``
            seconds; it is erased when the work ends. The engine (``fdsl.rewrite.engine``) calls
            ``start(name)`` when the CLI or the repl asked for it (``program.options["progress"]``).
            Without tqdm, or without a terminal, there is simply no progress line.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

from .errors import say

NOTE_AFTER = 3.0  # seconds of silence a person accepts before wondering whether fdsl hangs


@contextmanager
def slow(what: str, after: float = NOTE_AFTER, out=None):
    """Run the body; if it takes longer than ``after`` seconds, say what it is doing on ``out``
    (stderr by default) while it runs, and how long it took once it is done."""
    out = out if out is not None else sys.stderr
    noted = threading.Event()
    lock = threading.Lock()
    start = time.monotonic()

    def note():
        with lock:
            if not finished:
                noted.set()
                _say(out, "fdsl: %s (still working after %.0f s)" % (what, after))

    finished = False
    timer = threading.Timer(after, note)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            finished = True
        timer.cancel()
        if noted.is_set():
            _say(out, "fdsl: %s: done in %.1f s" % (what, time.monotonic() - start))


def _say(out, line: str) -> None:
    try:
        say(line, out)
        out.flush()
    except (OSError, ValueError):  # a closed or broken stderr must not break the work itself
        pass


DELAY = 2.0  # seconds of work before a progress line appears (FDSL_PROGRESS_DELAY changes it)



def wanted(stream) -> bool:
    """Progress is for people: a terminal, and not turned off with FDSL_PROGRESS=0."""
    if os.environ.get("FDSL_PROGRESS", "").strip() == "0":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _Quiet:
    def update(self, n):
        pass

    def close(self):
        pass


def start(name: str, stream=None):
    """A progress counter for the ruleset or strategy ``name``: ``update(n)`` steps, ``close()``."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _Quiet()
    try:
        delay = float(os.environ.get("FDSL_PROGRESS_DELAY", DELAY))
    except ValueError:
        delay = DELAY
    return tqdm(desc=name, unit=" steps", unit_scale=True, delay=delay, leave=False, mininterval=0.5,
                file=stream or sys.stderr, dynamic_ncols=True)
