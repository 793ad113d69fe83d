"""Start-up benchmark: what the shipped parser tables buy (issues 13 and 23).

    python bench/startup.py [--repeats N]

Each measurement is a fresh Python process, timed by wall clock from outside, median of N runs
interleaved round by round, so the variants share the machine's noise. Variants:

- ``pickle cache``: the old way (issue 13's), ``Lark(..., cache=...)``: the LALR tables pickled in a
  per-user cache folder, warm. Loading a pickle runs it; issue 23 planted one through ``save``.
- ``tables``: fdsl now: the tables made ahead of time as JSON data (``grammar/*.tables.json``,
  ``fdsl.lang.tables``), checked and loaded.
- ``built``: ``FDSL_BUILD_PARSER=1``: the tables built from the grammar on every start.

Two things are timed per variant: building both parsers (``fdsl.lark`` and ``rules.lark``) after
``import fdsl.lang.parse``, and a whole ``fdsl run`` of a one-line program (imports, grammar,
stdlib rules). Ratios are against ``built`` in the same rounds.
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

PICKLE = """
import sys
from lark import Lark
from fdsl.lang.parse import _NewlinesInBrackets
from fdsl.base.resources import grammar_path
for g in ("fdsl.lark", "rules.lark"):
    p = grammar_path(g)
    Lark(p.read_text(), parser="lalr", propagate_positions=True, import_paths=[str(p.parent)],
         postlex=_NewlinesInBrackets(), start="start", maybe_placeholders=False,
         cache=sys.argv[1] + "/" + g + ".cache")
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
    built = dict(base, FDSL_BUILD_PARSER="1")
    with tempfile.TemporaryDirectory() as tmp:
        prog = Path(tmp) / "tiny.fd"
        prog.write_text("dim n = 2\nconst X : n x n\nshow X^t\n")
        run = [sys.executable, "-m", "fdsl.cli", "run", str(prog)]
        variants = {
            ("grammar", "pickle cache"): ([sys.executable, "-c", PICKLE, tmp], base),
            ("grammar", "tables"): ([sys.executable, "-c", NOW], base),
            ("grammar", "built"): ([sys.executable, "-c", NOW], built),
            ("fdsl run", "tables"): (run, base),
            ("fdsl run", "built"): (run, built),
        }
        for argv, env in variants.values():  # warm the pickle cache and the OS's file cache
            _time(argv, env)
        times = {k: [] for k in variants}
        for _ in range(args.repeats):
            for k, (argv, env) in variants.items():
                times[k].append(_time(argv, env))
    med = {k: statistics.median(v) for k, v in times.items()}
    print("Machine: %s, %d cores; Python %s. Date: %s. Command: `python bench/startup.py --repeats %d`."
          % (platform.machine(), os.cpu_count(), platform.python_version(), time.strftime("%Y-%m-%d"), args.repeats))
    print()
    print("| what | variant | median wall s | ratio to built |")
    print("|---|---|---:|---:|")
    for (what, variant), m in med.items():
        print("| %s | %s | %.3f | %.2f |" % (what, variant, m, m / med[(what, "built")]))


if __name__ == "__main__":
    main()
