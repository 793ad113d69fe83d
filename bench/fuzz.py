"""The differential fuzzer from the command line (fdsl.verify.fuzz): random programs, every gradient path.

    python bench/fuzz.py --cases 10000            # check 10,000 distinct random programs
    python bench/fuzz.py --cases 500 --seed 3     # another stream of programs
    python bench/fuzz.py --cases 200 --break scalar   # a deliberately broken lowering: it is caught
    python bench/fuzz.py --cases 200 --no-ids         # without onehot constants given as ids

Each program (fdsl source text, through the real front end) is checked by fdsl.verify.differential: the
numpy evaluation and the generated code of its shared and expanded normal forms, grad(w), torch
autograd (when torch is installed) and central finite differences of the loss. Every disagreement
beyond 1e-8 of the largest gradient (finite differences: 1e-6), and every exception, is shrunk by
Hypothesis to a small program and printed. Exit code 1 if any case failed.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fdsl.codegen import generated as codegen  # noqa: E402
from fdsl.verify import differential, fuzz, torch_eval  # noqa: E402


def breakage(kind: str) -> None:
    """Break the lowering on purpose, to see the fuzzer catch it (``--break``)."""
    codegen._COMPILED.clear()
    if kind == "scalar":  # products forget their constant scalar
        word = codegen.Lowering._word
        codegen.Lowering._word = lambda self, b: (1.0,) + tuple(word(self, b)[1:])
    elif kind == "sign":  # sums add what they should subtract
        summand = codegen.Lowering._summand
        codegen.Lowering._summand = lambda self, s: (1,) + tuple(summand(self, s)[1:])
    elif kind == "ids":  # 1 added at the ids is taken instead (the cross-entropy's derivative)
        summand = codegen.Lowering._onehot_summand
        codegen.Lowering._onehot_summand = lambda self, *a: None if (got := summand(self, *a)) is None else (
            got[:2] + ((-got[2][0],) + got[2][1:],))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=1000, help="distinct programs to check (default 1000)")
    ap.add_argument("--seed", type=int, default=0, help="the stream of programs (default 0)")
    ap.add_argument("--batch", type=int, default=500, help="programs per Hypothesis run (default 500)")
    ap.add_argument("--shrink", type=int, default=5, metavar="K", help="shrink the first K failures (default "
                    "5); later ones are printed as found")
    ap.add_argument("--no-weight-traces", dest="weight_traces", action="store_false",
                    help="keep weights out of S in trace(S) A (the programs of the runs before 2026-11-25)")
    ap.add_argument("--no-ids", dest="ids", action="store_false",
                    help="no onehot constants given as ids (the programs of the runs before 2027-01)")
    ap.add_argument("--break", dest="broken", choices=["scalar", "sign", "ids"],
                    help="break the lowering on purpose: the fuzzer must catch it")
    args = ap.parse_args(argv)
    fuzz.WEIGHT_TRACES = args.weight_traces
    fuzz.IDS = args.ids
    if args.broken:
        breakage(args.broken)
    print("fdsl fuzz: %d cases, seed %d, torch %s, python %s, %s" % (
        args.cases, args.seed, "yes" if torch_eval.available() else "no (not installed)",
        platform.python_version(), platform.machine()), flush=True)
    print("operators: %s; not generated: %s" % (", ".join(sorted(fuzz.operators())),
                                                "; ".join("%s (%s)" % kv for kv in sorted(fuzz.uncovered().items()))))
    start = time.perf_counter()

    def progress(summary, failure):
        if failure is not None:
            print("\n---- failure %d (after %d cases)%s:\n%s\n" % (len(summary.failures), summary.cases,
                  ", shrunk" if len(summary.failures) <= args.shrink else "", failure),
                  flush=True)
        else:
            print("%d cases, %d failures, %.0f s" % (summary.cases, len(summary.failures),
                                                     time.perf_counter() - start), flush=True)

    summary = fuzz.run(args.cases, seed=args.seed, batch=args.batch, shrink=args.shrink, progress=progress)
    skipped = ", ".join("%s: %d" % kv for kv in sorted(summary.skipped.items())) or "none"
    print("\n%d cases in %.0f s: %d failures; finite differences checked %d weights (%d with a step finer "
          "than %g); largest disagreement of a passing case %.2g of the largest gradient; skipped: %s"
          % (summary.cases, summary.seconds, len(summary.failures), summary.fd_checked, summary.fd_refined,
             differential.FD_STEPS[0], summary.worst, skipped))
    return 1 if summary.failures else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
