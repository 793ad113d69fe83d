"""The manual's natural program against the same program with := (issue 10), and fdsl grad of it in depth (issue 28).

    python bench/natural.py [--depths 1,2,4,...] [--runs 3] [--grad-depths 64] [--timeout 1200]

The encoder of examples/deep.fd written two ways: ``encoder(L) = layer(L-1, encoder(L-1))``, the
manual's spelling, whose intermediates fdsl finds in the shared graph, and ``encoder(L) := ...``,
which names them. For each depth and spelling, a fresh Python process (terms are interned
process-wide, so a second run in one process would find its terms built) parses the program and
takes ``normal(form(E))``; it reports the CPU seconds of that step (the median of ``--runs``
processes), the distinct nodes of the result and the process's peak memory. The ratio column is
natural / named at the same depth, measured in the same run of this script (``--depths ""``
skips this table).

The second table runs ``fdsl grad --form w --random 0`` of the natural program at each of
``--grad-depths`` (default 64; issue 28's target is depth 600, ``--grad-depths 150,300,600``), once
each, in a fresh process: the CPU seconds of the command (parsing, the shared normal form, code
generation, compiling and one call of the generated gradients; the process's start-up and imports
excluded), those seconds per layer (constant when ``fdsl grad`` is linear in depth) and the
process's peak memory. A process that runs past ``--timeout`` seconds of wall-clock time is killed
and reported as "over N s"; the larger depths are then not run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from oracle import ENCODER  # noqa: E402  (the tests' encoder: examples/encoder2.fd's layer)

sys.path.insert(0, str(ROOT / "bench"))
from codegen import machine  # noqa: E402  (bench/codegen.py's: the CPU model, cores, Python)

CHILD = r"""
import json, resource, sys, time
sys.setrecursionlimit(100000)
import fdsl
from fdsl.core.terms import dag_size
p = fdsl.parse(sys.stdin.read())
t0 = time.process_time()
w = p.expr("normal(form(E))")
t1 = time.process_time()
print(json.dumps({"seconds": t1 - t0, "nodes": dag_size(w),
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def program(L: int, named: bool) -> str:
    text = ENCODER + "E = Y - encoder(%d)\nw = form(E)\n" % L
    return text.replace("encoder(L) =", "encoder(L) :=") if named else text


def measure(L: int, named: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", CHILD], input=program(L, named), capture_output=True, text=True,
                         env=env, check=True)
    return json.loads(out.stdout)


def grad_peak(L: int, timeout: float = None):
    """(CPU seconds, peak MB, exit code) of ``fdsl grad`` of the natural program at depth L, or None
    when it ran past ``timeout`` seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "natural.fd"
        src.write_text(program(L, named=False))
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        code = ("import resource, sys, time; sys.argv = ['fdsl', 'grad', %r, '--form', 'w', '--random', '0', "
                "'--out', %r]; from fdsl.cli import main; t = time.process_time(); rc = main(sys.argv[1:]); "
                "print(time.process_time() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, rc)"
                % (str(src), str(Path(tmp) / "g.npz")))
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                                 timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        seconds, peak, rc = out.stdout.split()[-3:]
        return float(seconds), float(peak), int(rc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--grad-depths", default="64", help="depths of the fdsl grad table (default 64)")
    ap.add_argument("--timeout", type=float, default=1200, help="wall-clock seconds one fdsl grad may take "
                    "(default 1200)")
    args = ap.parse_args()
    depths = [int(x) for x in args.depths.split(",") if x]
    print("machine: %s; date %s" % (machine(), datetime.date.today().isoformat()))
    print("command: python bench/natural.py --depths %s --runs %d --grad-depths %s --timeout %g"
          % (args.depths or '""', args.runs, args.grad_depths, args.timeout))
    if depths:
        table(depths, args.runs)
    grad_table([int(x) for x in args.grad_depths.split(",") if x], args.timeout)
    return 0


def table(depths, runs_per_depth: int) -> None:
    print()
    print("| L | natural s | named s | natural / named | nodes (natural, named) | peak MB (natural, named) |")
    print("|---|---|---|---|---|---|")
    for L in depths:
        rows = {}
        for named in (False, True):
            runs = [measure(L, named) for _ in range(runs_per_depth)]
            rows[named] = {"seconds": statistics.median(r["seconds"] for r in runs), "nodes": runs[0]["nodes"],
                           "peak_mb": max(r["peak_mb"] for r in runs)}
        a, b = rows[False], rows[True]
        print("| %d | %.3f | %.3f | %.2f | %d, %d | %.0f, %.0f |" % (
            L, a["seconds"], b["seconds"], a["seconds"] / b["seconds"], a["nodes"], b["nodes"], a["peak_mb"],
            b["peak_mb"]),
            flush=True)


def grad_table(depths, timeout: float) -> None:
    print()
    print("| L | fdsl grad --random 0, natural (CPU s) | s / layer | peak MB | exit |")
    print("|---|---|---|---|---|")
    over = False
    for L in depths:
        r = None if over else grad_peak(L, timeout)
        if r is None:
            print("| %d | %s | | | |" % (L, "not run (a smaller depth ran over %g s)" % timeout if over
                                        else "over %g s" % timeout), flush=True)
            over = True
            continue
        seconds, peak, rc = r
        print("| %d | %.1f | %.3f | %.0f | %d |" % (L, seconds, seconds / L, peak, rc), flush=True)


if __name__ == "__main__":
    sys.exit(main())
