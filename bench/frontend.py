"""Front-end benchmark: parse, elaborate and shape-check encoder(L), the layer of examples/encoder2.fd.

    python bench/frontend.py [--repeats N]

For each L, ``fdsl.parse`` of a program that declares the encoder2 symbols, defines ``layer``
and ``encoder`` and sets ``E = encoder(L)``: reading the text, elaborating the definitions
(recursion on L), building the shared terms and checking every shape; N runs, median. The
grammar is built once before timing (it is cached for the process). Terms are interned for the
life of the process, so after the first run the nodes already exist; the first (cold) run is
reported separately.

Printed per L: the node count (distinct nodes of the shared graph, ``dag_size``), the size the term
would have written out as a tree (``tree_size``, about 3^L: each layer uses its input three times),
the time of the first (cold) run, the median time of the whole program, and the median and
minimum time of ``E = encoder(L)`` alone, fed to a fresh program that has read the declarations
and definitions (the whole program also pays a fixed cost: reading the declarations and making a
Program with its rule book). The front end must be linear in L: time(40)/time(20) near 2.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import fdsl  # noqa: E402
from fdsl.core.terms import dag_size, tree_size  # noqa: E402
from fdsl.lang.parse import parse_program  # noqa: E402

LAYERS = [1, 2, 4, 8, 16, 20, 32, 40]


def declarations() -> str:
    """encoder2.fd's declarations and definitions, without its E and its output."""
    source = (REPO / "examples" / "encoder2.fd").read_text()
    return source[: re.search(r"^E :?= ", source, re.M).start()]  # E := (named) or E = (transparent)


def measure(L: int, repeats: int):
    """(nodes, tree size, cold ms, median ms of the whole program, median and min ms of E = encoder(L))."""
    head = declarations()
    whole = head + "E = encoder(%d)\n" % L
    start = time.perf_counter()
    program = fdsl.parse(whole, "encoder.fd")
    cold = time.perf_counter() - start
    full, layers = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        fdsl.parse(whole, "encoder.fd")
        full.append(time.perf_counter() - start)
        base = fdsl.parse(head, "encoder.fd")  # a fresh program: nothing memoised yet
        start = time.perf_counter()
        base.feed("E = encoder(%d)\n" % L)
        layers.append(time.perf_counter() - start)
    E = program["E"]
    ms = lambda x: x * 1e3
    return (dag_size(E), tree_size(E), ms(cold), ms(statistics.median(full)), ms(statistics.median(layers)),
            ms(min(layers)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args(argv)
    parse_program("dim n\n")  # build the grammar outside the timings
    fdsl.parse("dim n\n")  # and load the function modules and the rule book

    print("%4s %6s %22s %9s %9s %12s %9s" % ("L", "nodes", "tree size", "cold ms", "whole ms",
                                              "encoder ms", "min ms"))
    median, best = {}, {}
    for L in LAYERS:
        nodes, tree, cold, whole, median[L], best[L] = measure(L, args.repeats)
        print("%4d %6d %22d %9.2f %9.2f %12.2f %9.2f" % (L, nodes, tree, cold, whole, median[L], best[L]))
    # on a busy machine the minimum is the steadier measure of the work itself
    for what, t in (("median", median), ("min", best)):
        print("encoder(L) alone, %s: time(40)/time(20) = %.2f, time(40)/time(1) = %.1f (linear: 2 and 40)"
              % (what, t[40] / t[20], t[40] / t[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
