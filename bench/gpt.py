"""GPT blocks in depth: front end + shared normal form, and the gradients, for L = 3, 6, 12 blocks.

The model is examples/gpt.fd with gpt(L) in the loss, written two ways: with named layers
(``gpt(L) := ...``, as in the file) and naturally (``gpt(L) = ...``: the shared normal form finds
the intermediates itself). For each L, in one process: the time to read the program and bring
w = -d(L) to its shared normal form, the time of the gradients (generated code: compile and one
call), the distinct nodes of the normal form, and the ratios time(2L) / time(L) (linear in depth:
about 2). CPU time (time.process_time), median of REPEATS runs.

    python bench/gpt.py            # prints the table
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fdsl  # noqa: E402
from fdsl.codegen import generated as codegen  # noqa: E402
from fdsl.codegen import grads as numpy_grad  # noqa: E402

DEPTHS = (3, 6, 12)
REPEATS = 3
SOURCE = (ROOT / "examples" / "gpt.fd").read_text().split("L = -trace")[0]
SOURCES = {"named": SOURCE, "natural": SOURCE.replace("gpt(L) := mlp", "gpt(L) = mlp")}


def run(depth: int, source: str):
    t0 = time.process_time()
    p = fdsl.parse(source + "L = -trace(Y^t logsoftmax(ln(gpt(%d), gf, bf) U))\nw = -d(L)\nrandom 0\n" % depth,
                   base_dir=ROOT / "examples")
    g = numpy_grad.normal_form(p, p["w"])
    t1 = time.process_time()
    codegen._COMPILED.clear()  # compile afresh: the time includes generating the code
    grads = numpy_grad.gradients(p, g)
    t2 = time.process_time()
    return t1 - t0, t2 - t1, fdsl.core.terms.dag_size(g), len(grads)


def main(argv=None):
    global REPEATS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=REPEATS, help="runs per cell, the median is shown "
                        "(default %d)" % REPEATS)
    REPEATS = parser.parse_args(argv).repeats
    print("Machine: %s, Python %s. Command: python bench/gpt.py. CPU time, median of %d runs."
          % (platform.processor() or platform.machine(), platform.python_version(), REPEATS))
    print("| written | blocks | normal form (s) | gradients (s) | nodes | weights |")
    print("|---|---|---|---|---|---|")
    rows = {}
    for how, source in SOURCES.items():
        for depth in DEPTHS:
            runs = [run(depth, source) for _ in range(REPEATS)]
            normal = statistics.median(r[0] for r in runs)
            grad = statistics.median(r[1] for r in runs)
            rows[how, depth] = (normal, grad, runs[0][2])
            print("| %s | %d | %.2f | %.2f | %d | %d |" % (how, depth, normal, grad, runs[0][2], runs[0][3]))
    for how in SOURCES:
        for a, b in zip(DEPTHS, DEPTHS[1:]):
            x, y = rows[how, a], rows[how, b]
            print("%s, ratios %d/%d blocks: normal form %.2f, gradients %.2f, nodes %.2f"
                  % (how, b, a, y[0] / x[0], y[1] / x[1], y[2] / x[2]))


if __name__ == "__main__":
    main()
