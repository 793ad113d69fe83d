"""The manual's natural program against the same program with := (issue 10).

    python bench/natural.py [--depths 1,2,4,...] [--runs 3]

The encoder of examples/deep.fd written two ways: ``encoder(L) = layer(L-1, encoder(L-1))``, the
manual's spelling, whose intermediates fdsl finds in the shared graph, and ``encoder(L) := ...``,
which names them. For each depth and spelling, a fresh Python process (terms are interned
process-wide, so a second run in one process would find its terms built) parses the program and
takes ``normal(form(E))``; it reports the CPU seconds of that step (the median of ``--runs``
processes), the distinct nodes of the result and the process's peak memory. The ratio column is
natural / named at the same depth, measured in the same run of this script. The last line runs
``fdsl grad --random 0`` on the natural program at depth 64 and reports its peak memory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from oracle import ENCODER  # noqa: E402  (the tests' encoder: examples/encoder2.fd's layer)

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


def grad_peak(L: int) -> tuple:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "natural.fd"
        src.write_text(program(L, named=False))
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        code = ("import resource, sys, time; sys.argv = ['fdsl', 'grad', %r, '--form', 'w', '--random', '0', "
                "'--out', %r]; from fdsl.cli import main; t = time.process_time(); rc = main(sys.argv[1:]); "
                "print(time.process_time() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, rc)"
                % (str(src), str(Path(tmp) / "g.npz")))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        seconds, peak, rc = out.stdout.split()[-3:]
        return float(seconds), float(peak), int(rc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    depths = [int(x) for x in args.depths.split(",")]
    print("machine: %s, %s, Python %s" % (platform.machine(), platform.processor() or "cpu", platform.python_version()))
    print("command: python bench/natural.py --depths %s --runs %d" % (args.depths, args.runs))
    print()
    print("| L | natural s | named s | natural / named | nodes (natural, named) | peak MB (natural, named) |")
    print("|---|---|---|---|---|---|")
    for L in depths:
        rows = {}
        for named in (False, True):
            runs = [measure(L, named) for _ in range(args.runs)]
            rows[named] = {"seconds": statistics.median(r["seconds"] for r in runs), "nodes": runs[0]["nodes"],
                           "peak_mb": max(r["peak_mb"] for r in runs)}
        a, b = rows[False], rows[True]
        print("| %d | %.3f | %.3f | %.2f | %d, %d | %.0f, %.0f |" % (
            L, a["seconds"], b["seconds"], a["seconds"] / b["seconds"], a["nodes"], b["nodes"], a["peak_mb"],
            b["peak_mb"]),
            flush=True)
    seconds, peak, rc = grad_peak(64)
    print()
    print("fdsl grad --random 0, natural encoder(64): %.1f s CPU, peak %.0f MB, exit %d" % (seconds, peak, rc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
