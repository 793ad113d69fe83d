"""Start-up benchmark: what the grammar cache buys, and what it costs to keep it safe (issue 13).

    python bench/startup.py [--repeats N]

Each measurement is a fresh Python process (the grammar tables are cached for the life of a
process), timed by wall clock from outside, median of N runs interleaved round by round, so the
variants share the machine's noise. Variants:

- ``before``: the old way, ``Lark(..., cache=True)``: a pickle of the LALR tables in the shared
  temp folder at a predictable path (another local user could plant one there; loading a pickle
  runs it).
- ``user cache``: fdsl now: the tables pickled in a per-user folder (``~/.cache/fdsl``, 0700,
  checked to be this user's before every use; ``fdsl.lang.parse._cache_file``), warm.
- ``no cache``: ``FDSL_NO_CACHE=1``: the tables built from the grammar on every start.

Two things are timed per variant: building both parsers (``fdsl.lark`` and ``rules.lark``) after
``import fdsl.parse``, and a whole ``fdsl run`` of a one-line program (imports, grammar, stdlib
rules). Ratios are against ``no cache`` in the same rounds.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

BEFORE = """
from lark import Lark
from fdsl.lang.parse import _NewlinesInBrackets
from fdsl.base.resources import grammar_path
for g in ("fdsl.lark", "rules.lark"):
    p = grammar_path(g)
    Lark(p.read_text(), parser="lalr", propagate_positions=True, import_paths=[str(p.parent)],
         postlex=_NewlinesInBrackets(), start="start", maybe_placeholders=False, cache=True)
"""
NOW = """
from fdsl.lang.parse import _parser
_parser("fdsl.lark"); _parser("rules.lark")
"""


def _time(argv, env) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    base = dict(os.environ, PYTHONPATH=str(REPO))
    nocache = dict(base, FDSL_NO_CACHE="1")
    with tempfile.TemporaryDirectory() as tmp:
        prog = Path(tmp) / "tiny.fd"
        prog.write_text("dim n = 2\nconst X : n x n\nshow X^t\n")
        run = [sys.executable, "-m", "fdsl.cli", "run", str(prog)]
        variants = {
            ("grammar", "before"): ([sys.executable, "-c", BEFORE], base),
            ("grammar", "user cache"): ([sys.executable, "-c", NOW], base),
            ("grammar", "no cache"): ([sys.executable, "-c", NOW], nocache),
            ("fdsl run", "user cache"): (run, base),
            ("fdsl run", "no cache"): (run, nocache),
        }
        for argv, env in variants.values():  # warm the caches and the OS's file cache
            _time(argv, env)
        times = {k: [] for k in variants}
        for _ in range(args.repeats):
            for k, (argv, env) in variants.items():
                times[k].append(_time(argv, env))
    med = {k: statistics.median(v) for k, v in times.items()}
    print("Machine: %s, %d cores; Python %s. Date: %s. Command: `python bench/startup.py --repeats %d`."
          % (platform.machine(), os.cpu_count(), platform.python_version(), time.strftime("%Y-%m-%d"), args.repeats))
    print()
    print("| what | variant | median wall s | ratio to no cache |")
    print("|---|---|---:|---:|")
    for (what, variant), m in med.items():
        print("| %s | %s | %.3f | %.2f |" % (what, variant, m, m / med[(what, "no cache")]))


if __name__ == "__main__":
    main()
