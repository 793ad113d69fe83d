"""Progress on stderr for long work, so a minute of rewriting is not a minute of silence.

Vocabulary
----------
progress   a line on stderr (tqdm) naming what runs and how many rewrite steps it has taken,
           shown only on a terminal and only once the work has passed ``DELAY`` seconds; it is
           erased when the work ends, so output and error messages read as without it.

The engine (``fdsl.rewrite``) counts steps; it calls ``start(name)`` when the CLI or the repl asked
for progress (``program.options["progress"]``). Nothing here is needed for fdsl to work: without
tqdm, or without a terminal, there is simply no progress line.
"""

from __future__ import annotations

import os
import sys

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
