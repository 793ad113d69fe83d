"""Time estimates: long work refused before it starts, with the estimate and the flag that allows it.

Vocabulary
----------
estimate     a count (training steps, conjugate-gradient iterations) times the measured time of one
             (the first steps or applications, which the work does anyway): what the whole would
             take if it ran to its count.
time limit   the most seconds an estimate may reach (``DEFAULT_TIME_LIMIT``; ``--time-limit
             SECONDS`` on the command line, ``time_limit=`` in ``fdsl.load``/``fdsl.parse``). A
             fixed cap on a count cannot tell a small model's ten million cheap steps from a large
             one's; an estimate can.
clock        the seconds a run (a training run, a flow, a solve) has taken so far, looked at every
             step and every conjugate-gradient iteration: a run whose steps grow dearer as it goes
             (conjugate gradients take 5 iterations at the first step, hundreds later) passes its
             estimate and is still stopped when it reaches the limit.
"""

from __future__ import annotations

import math
import time

from .errors import FdslError
from .limits import DEFAULT_TIME_LIMIT


def duration(seconds: float) -> str:
    """``2.5 hours``, ``40 minutes``, ``12 s``, ``3.1 ms``: for messages."""
    if not math.isfinite(seconds):
        return "forever"
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return "%.3g %s" % (seconds / size, unit)
    if seconds >= 1:
        return "%.3g s" % seconds
    return "%.3g ms" % (seconds * 1e3)


def check_estimate(what: str, count: int, unit: str, each: float, limit=None, file=None) -> None:
    """Refuse ``what`` (``train(...)``, ``gaussnewton(...)``) whose ``count`` ``unit``s of ``each``
    seconds would take more than ``limit`` seconds (None: the default): an FdslError naming the
    estimate and the flag that raises the limit; ``file``: the flag that gave the count, if any."""
    limit = limit or DEFAULT_TIME_LIMIT
    estimate = count * each
    if estimate > limit:
        raise FdslError("%s would take about %s: %d %s of about %s each (measured), more than the "
                        "time limit of %s (--time-limit SECONDS raises it; or ask for fewer %s)"
                        % (what, duration(estimate), count, unit, duration(each), duration(limit), unit), file=file)


class Clock:
    """The time a run has taken, against the time limit (None: the default): ``check`` stops the
    run with an FdslError once it is past. ``now``: the clock read (a test may give its own)."""

    def __init__(self, what: str, limit=None, now=time.perf_counter):
        self.what, self.limit, self.now = what, limit or DEFAULT_TIME_LIMIT, now
        self.start = now()

    def check(self, where: str = "") -> None:
        """Stop the run if it is past the limit; ``where``: how far it got (``at step 37``)."""
        spent = self.now() - self.start
        if spent > self.limit:
            raise FdslError("%s stopped%s after %s, past the time limit of %s (--time-limit SECONDS raises it)"
                            % (self.what, " " + where if where else "", duration(spent), duration(self.limit)))
