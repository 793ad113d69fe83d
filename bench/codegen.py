"""Generating the torch module of GPT-2 small's shape, by number of blocks (issue 28).

    python bench/codegen.py [--blocks 1,2,3,4,6,8,12] [--runs 3] [--timeout 600]

The program is examples/gpt2.fd (12 heads of width 64, width 768, context 1024, vocabulary 50257,
query/key/value biases, tied embeddings) with the number of blocks in its loss line, gpt(12),
rewritten to B. For each B, ``--runs`` fresh Python processes (terms are interned process-wide,
so a second run in one process would find its terms built) each do what ``fdsl codegen FILE
--form w --target torch`` does: parse the program, bring w = -d(L) to its shared normal form
(``Program.normal_form``), and write the torch module's source
(``fdsl.codegen.generated.gradients_source(w, dims, target="torch", loss=L)``). Each step is
timed in CPU seconds of that process (``time.process_time``; the work is single-threaded); the
table gives the medians, the generated module's lines, and codegen seconds per block, which is
constant when code generation is linear in depth. A process that runs past ``--timeout``
seconds of wall-clock time is killed and its B reported as "over N s"; the larger B are then not
run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "examples" / "gpt2.fd"
BLOCKS_IN_FILE = "gpt(12)"  # the loss line's depth, the one thing rewritten

CHILD = r"""
import json, sys, time
sys.setrecursionlimit(100000)
import fdsl
from fdsl.calculus.gradients import loss_of
from fdsl.codegen.generated import gradients_source
from fdsl.core.terms import dag_size
text = sys.stdin.read()
t0 = time.process_time()
p = fdsl.parse(text, base_dir=sys.argv[1])
w = p["w"]
t1 = time.process_time()
nf = p.normal_form(w)
t2 = time.process_time()
source = gradients_source(nf, p.dims, "form w of examples/gpt2.fd", "torch", loss=loss_of(w))
t3 = time.process_time()
print(json.dumps({"parse": t1 - t0, "normal": t2 - t1, "codegen": t3 - t2, "nodes": dag_size(nf),
                  "lines": source.count("\n")}))
"""


def program(blocks: int) -> str:
    text = PROGRAM.read_text()
    assert text.count(BLOCKS_IN_FILE) == 1, "examples/gpt2.fd should name its depth once, as %s" % BLOCKS_IN_FILE
    return text.replace(BLOCKS_IN_FILE, "gpt(%d)" % blocks)


def measure(blocks: int, timeout: float):
    """One fresh process's seconds, or None when it ran past ``timeout``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]]
                                                                     if os.environ.get("PYTHONPATH") else [])))
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / "examples")], input=program(blocks),
                             capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        raise SystemExit("blocks %d failed:\n%s" % (blocks, out.stderr))
    return json.loads(out.stdout)


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "%s, %d cores; Python %s" % (model, os.cpu_count() or 0, platform.python_version())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", default="1,2,3,4,6,8,12", help="numbers of blocks (default 1,2,3,4,6,8,12)")
    ap.add_argument("--runs", type=int, default=3, help="fresh processes per number of blocks, the median "
                    "is shown (default 3)")
    ap.add_argument("--timeout", type=float, default=600, help="wall-clock seconds one process may take "
                    "(default 600)")
    args = ap.parse_args(argv)
    blocks = [int(x) for x in args.blocks.split(",")]
    print("Machine: %s." % machine())
    print("Date: %s. Command: `python bench/codegen.py --blocks %s --runs %d --timeout %g`."
          % (datetime.date.today().isoformat(), args.blocks, args.runs, args.timeout))
    print()
    print("| blocks | parse (s) | normal form (s) | codegen (s) | codegen s / block | nodes | module lines |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    over = False
    for b in blocks:
        if over:
            print("| %d | | | not run (a smaller depth ran over %g s) | | | |" % (b, args.timeout), flush=True)
            continue
        runs = []
        for _ in range(args.runs):
            r = measure(b, args.timeout)
            if r is None:
                over = True
                break
            runs.append(r)
        if over:
            print("| %d | | | over %g s | | | |" % (b, args.timeout), flush=True)
            continue
        med = {k: statistics.median(r[k] for r in runs) for k in ("parse", "normal", "codegen")}
        print("| %d | %.3f | %.3f | %.2f | %.2f | %d | %d |" % (b, med["parse"], med["normal"], med["codegen"],
                                                              med["codegen"] / b, runs[0]["nodes"], runs[0]["lines"]),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
