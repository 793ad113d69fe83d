"""Diagram benchmark: the pictures of the manual's question at depth, from program to PNG.

    python bench/diagrams.py [--repeats N] [--write]

For each depth L, the encoder of ``examples/deep.fd`` with L layers (named intermediates
``X(L) := ...``): the shared normal form ``w = backprop(form(E))``, then the two pictures of the
question "does the coefficient of dK_j involve Q_i?" with j = L-3 and i = L-5 (K_5 and Q_3 at
depth 8): the coefficient ``coeff(w, K[j])`` (``fdsl diagram``) and the dependency view
(``fdsl deps --weight Q[i] --coeff K[j]``). Timed: building the model (networkx) and the digraph
(the graphviz package), and Graphviz's layout to PNG (``dot`` is a separate process, so these are
wall-clock seconds: medians of N runs, on a shared and noisy machine). The reference in the same
process is the layout of the forward term ``E`` of ``examples/encoder2.fd`` (41 boxes); ratios are
against it. Also printed: boxes, edges, and the PNG's size in pixels (the longer side must stay
under 3,000 px). ``--write`` puts the table in BENCHMARKS.md between its markers.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import struct
import sys
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import fdsl  # noqa: E402
from fdsl.calculus.forms import coeff  # noqa: E402
from fdsl.pictures import graphviz as gv  # noqa: E402
from fdsl.pictures.depsview import path_view  # noqa: E402

DEPTHS = [6, 8, 12, 16]


def program(L: int) -> fdsl.Program:
    text = (REPO / "examples" / "deep.fd").read_text()
    text = text.replace("E := Y - X(8)", "E := Y - X(%d)" % L)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("show"))
    return fdsl.parse(text, "deep%d.fd" % L)


def timed(f, repeats):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = f()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def png_size(data: bytes):
    return struct.unpack(">II", data[16:24])


def row(label, build, repeats, reference):
    t_model, picture = timed(build, repeats)
    t_dot, png = timed(lambda: gv.layout(picture.digraph, "png"), repeats)
    w, h = png_size(png)
    return "| %s | %d | %d | %.3f | %.2f | %.1f | %d x %d |" % (
        label, picture.nodes, picture.edges, t_model, t_dot, t_dot / reference, w, h)


def end_to_end(repeats):
    """Wall seconds of the two fdsl commands at depth 8, as a person runs them (start-up included)."""
    import subprocess
    import tempfile

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for args in (["diagram", "examples/deep.fd", "--expr", "coeff(w, K[5])", "-o", tmp + "/c.png"],
                     ["deps", "examples/deep.fd", "--form", "w", "--weight", "Q[3]", "--coeff", "K[5]",
                      "-o", tmp + "/d.png"]):
            t, _ = timed(lambda: subprocess.run([sys.executable, "-m", "fdsl.cli", *args], cwd=REPO, check=True,
                                                capture_output=True), repeats)
            out.append("`fdsl %s` %.2f s" % (" ".join(a if " " not in a else repr(a) for a in args[:-2]), t))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    enc = fdsl.load(REPO / "examples" / "encoder2.fd")
    reference_picture = gv.diagram(enc["E"])
    reference, _ = timed(lambda: gv.layout(reference_picture.digraph, "png"), args.repeats)
    lines = ["Machine: %s, Python %s, graphviz package %s. Date: %s. Command: `python bench/diagrams.py`."
             % (platform.machine(), platform.python_version(), __import__("graphviz").__version__, date.today()),
             "",
             "Reference: the layout of `E` of examples/encoder2.fd (41 boxes) to PNG, median %.2f s." % reference,
             "",
             "| picture | boxes | edges | model + digraph s | dot to PNG s | dot / reference | PNG px |",
             "|---|---|---|---|---|---|---|"]
    for L in DEPTHS:
        p = program(L)
        w = p["w"]
        j, i = L - 3, L - 5
        K, Q = p.expr("K[%d]" % j), p.expr("Q[%d]" % i)
        g = coeff(w, K)
        lines.append(row("L=%d coeff(w, K[%d])" % (L, j), lambda: gv.diagram(g, title="coeff(w, K[%d])" % j),
                         args.repeats, reference))
        lines.append(row("L=%d deps Q[%d] -> K[%d]" % (L, i, j), lambda: gv.Diagram(path_view(g, Q, K)),
                         args.repeats, reference))
    lines += ["", "End to end at depth 8 (start-up, elaboration, normal form, layout, PNG written; medians): "
              + "; ".join(end_to_end(args.repeats)) + "."]
    table = "\n".join(lines)
    print(table)
    if args.write:
        path = REPO / "BENCHMARKS.md"
        text = path.read_text()
        begin, end = "<!-- bench/diagrams.py: begin -->", "<!-- bench/diagrams.py: end -->"
        block = begin + "\n" + table + "\n" + end
        if begin in text:
            text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
        else:
            text = text.rstrip() + "\n\n## Diagrams: the manual's question as pictures, at depth (issue 14)\n\n" + \
                (__doc__.split("\n\n", 2)[2].strip()) + "\n\n" + block + "\n"
        path.write_text(text)


if __name__ == "__main__":
    main()
