"""Long inputs (issue 23): parsing a program of many ';', and expandAll of a long sum.

``python bench/long_inputs.py [--tree PATH]`` times, each in a fresh process (CPU seconds of the
work alone, start-up and grammar excluded), ``fdsl.lang.program.parse`` of N bytes of ``;`` and
``expandAll`` of ``d((C_0 + ... + C_n-1) W)`` (the rules d-sum and distribute) and of the form of
``C_0 - (C_0 + ... + C_n-1) W``. ``--tree`` runs another checkout of fdsl (the one before the
change) for the before column.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

CODE = """
import sys, time
from fdsl.lang import program
kind, n = sys.argv[1], int(sys.argv[2])
program.parse("dim n = 2")  # the grammar and the standard library, outside the timing
if kind == "semicolons":
    text = ";" * n
    start = time.process_time()
    program.parse(text)
else:
    summands = " + ".join("C[%d]" % i for i in range(n))
    body = "d((%s) W)" % summands if kind == "d" else "form(C[0] - (%s) W)" % summands
    p = program.parse("dim n = 2\\nconst C[i] : n x n\\nweight W : n x n\\nx = " + body + "\\n")
    x = p["x"]
    start = time.process_time()
    p.rulebook.apply("expandAll", x, {})
print(time.process_time() - start)
"""


def timed(tree: Path, kind: str, n: int, limit: float) -> str:
    try:
        out = subprocess.run([sys.executable, "-c", CODE, kind, str(n)], capture_output=True, text=True,
                             env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, cwd=str(tree),
                             timeout=limit, check=True)
    except subprocess.TimeoutExpired:
        return "> %d" % limit
    except subprocess.CalledProcessError as e:  # a limit of fdsl's: its message, shortened
        return "stopped: " + e.stderr.strip().splitlines()[-1][:100]
    return "%.2f" % float(out.stdout.split()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--limit", type=float, default=120)
    parser.add_argument("cases", nargs="*", default=["semicolons:131072", "semicolons:1048576",
                                                     "semicolons:16777216", "d:1000", "d:2000", "d:4000",
                                                     "d:8000", "form:1000", "form:2000", "form:4000", "form:8000"])
    args = parser.parse_args()
    for case in args.cases:
        kind, n = case.split(":")
        print("%s %s %s" % (kind, n, timed(Path(args.tree), kind, int(n), args.limit)), flush=True)


if __name__ == "__main__":
    main()
