"""The scatter of the numpy target's ids (``X^t G``, the embedding's gradient): np.add.at against
the sort and reduceat of ``numpy_helpers._add_rows``, at nanoGPT's and GPT-2's sizes.

    python bench/scatter.py

Prints the median of 5 runs of each, in ms, and their largest difference (float32).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fdsl.codegen.numpy_helpers import _add_rows  # noqa: E402


def add_at(ids, G, size):
    out = np.zeros((size, G.shape[-1]), dtype=G.dtype)
    np.add.at(out, ids, G)
    return out


def median_ms(f, *args, runs=5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        f(*args)
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    rng = np.random.default_rng(0)
    print("%-34s %10s %10s %8s %s" % ("rows x vocab x cols", "add.at", "reduceat", "ratio", "max diff"))
    for rows, vocab, cols in [(256, 65, 384), (4 * 256, 65, 384), (1024, 50257, 768), (8 * 1024, 50257, 768)]:
        ids = rng.integers(0, vocab, rows)
        G = rng.standard_normal((rows, cols)).astype(np.float32)
        a, b = median_ms(add_at, ids, G, vocab), median_ms(_add_rows, ids, G, vocab)
        diff = float(np.abs(add_at(ids, G, vocab) - _add_rows(ids, G, vocab)).max())
        print("%-34s %8.1f ms %8.1f ms %7.1fx %.1g" % ("%d x %d x %d" % (rows, vocab, cols), a, b, a / b, diff))


if __name__ == "__main__":
    main()
