"""Progress notes: work that takes more than a few seconds says so on stderr.

Vocabulary
----------
slow step   a piece of work that may take long (normalising a deep form, Graphviz laying out a
            picture). ``slow(what)`` wraps it: if it is still running after ``NOTE_AFTER``
            seconds, one line ``fdsl: WHAT (still working after 3 s)`` goes to stderr, and when it
            ends, how long it took. Quick steps print nothing, so normal output stays clean.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager

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
        out.write(line + "\n")
        out.flush()
    except (OSError, ValueError):  # a closed or broken stderr must not break the work itself
        pass
