"""Benchmark of the rewrite engine (issue 16): ``backprop`` of the named encoder at depth, against
the engine of an older commit, in one run.

    python bench/engine.py                       # depths 32 and 128, against BASELINE, 5 rounds
    python bench/engine.py --baseline REV --depths 16,64 --rounds 3
    python bench/engine.py --quick               # one round at depth 16; writes nothing

The workload is the one of bench/deep.py's table 1: ``examples/deep.fd`` with L layers
(``E := Y - X(L)``, ``w = form(E)``), normalised by the strategy ``backprop``. Each measurement
runs in a fresh interpreter (terms are interned process-wide: a second run would find its
subterms built), and the one-time start-up (imports, grammar, stdlib rules, a warm-up rewrite) is
excluded. The clock is the CPU time of that process. ``steps`` counts rule applications (each call
of the engine's ``Stepper.fire``), so ``rewrites/s`` is steps over the CPU seconds of ``backprop``.

The baseline is the source tree of an older commit (``git archive``, unpacked into a temporary
folder), run by the same interpreter on the same program: the engines alternate round by round,
so load on this shared machine hits all alike, and the ratio is of medians from the same run.
This tree is also run with renaming (``fdsl.core.alpha``) turned off, so that every layer is
rewritten: that shows what the engine's own speed and what rewriting a layer once contribute, and
the two runs must give the same normal form to the letter. All must produce normal forms of the
same size (a different result stops the benchmark).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the last commit before the engine work of issue 16 (quick tests, compiled matchers and builders)
BASELINE = "ccf8ae5"
MARK_BEGIN, MARK_END = "<!-- bench/engine.py: begin -->", "<!-- bench/engine.py: end -->"


def workload_once(L: int) -> dict:
    """One measurement in this (fresh) process, with the fdsl found first on sys.path."""
    import fdsl
    from fdsl.calculus.forms import form
    from fdsl.core import terms as T
    from fdsl.rewrite import engine as rewrite

    if os.environ.get("FDSL_BENCH_NO_RENAMING"):  # every layer rewritten (this tree only)
        from fdsl.core import alpha

        alpha.canonical = lambda root, lets: (root, {})

    steps = [0]
    fire = rewrite.Stepper.fire

    def counting_fire(self, *args):
        steps[0] += 1
        return fire(self, *args)

    rewrite.Stepper.fire = counting_fire
    warm = fdsl.parse("dim m = 2\nweight Z : m x m\nz = Z\n")  # grammar and stdlib rules, once
    warm.apply_rules("backprop", form(warm["z"]))
    steps[0] = 0
    text = (ROOT / "examples" / "deep.fd").read_text().split("\nE := ")[0]
    p = fdsl.parse(text + "\nE := Y - X(%d)\nw = form(E)\n" % L)
    f = form(p["E"])
    t0 = time.process_time()
    w = p.apply_rules("backprop", f)
    seconds = time.process_time() - t0
    from fdsl.core.printers import string

    digest = hashlib.sha256(string(w).encode()).hexdigest() if hasattr(fdsl, "alpha") else ""
    return {"seconds": seconds, "steps": steps[0], "size": T.dag_size(w), "digest": digest}


def measure(source: Path, L: int, renaming=True) -> dict:
    """``workload_once`` in a fresh interpreter importing fdsl from ``source``."""
    env = dict(os.environ, PYTHONPATH=str(source))
    env.pop("FDSL_BENCH_NO_RENAMING", None)
    if not renaming:
        env["FDSL_BENCH_NO_RENAMING"] = "1"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--once", str(L)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(source))
    if r.returncode != 0:
        raise SystemExit("the workload failed with the fdsl of %s:\n%s" % (source, r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])


def unpack(rev: str, into: Path) -> Path:
    """The source tree of commit ``rev`` (its fdsl/, grammar/, stdlib/, examples/) under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "fdsl", "grammar", "stdlib", "examples"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def run(depths, rounds: int, baseline: str, log) -> list:
    rows = []
    with tempfile.TemporaryDirectory(prefix="fdsl-baseline-") as tmp:
        old_tree = unpack(baseline, Path(tmp))
        for L in depths:
            new, plain, old = [], [], []
            for i in range(rounds):
                new.append(measure(ROOT, L))
                plain.append(measure(ROOT, L, renaming=False))
                old.append(measure(old_tree, L))
                log("L=%d round %d: now %.3f s, without renaming %.3f s, %s %.3f s" % (
                    L, i + 1, new[-1]["seconds"], plain[-1]["seconds"], baseline, old[-1]["seconds"]))
            if not new[0]["size"] == plain[0]["size"] == old[0]["size"]:
                raise SystemExit("L=%d: the normal forms differ in size (%d now, %d without renaming, %d at %s)"
                                 % (L, new[0]["size"], plain[0]["size"], old[0]["size"], baseline))
            if new[0]["digest"] != plain[0]["digest"]:
                raise SystemExit("L=%d: renaming changed the normal form" % L)
            rows.append({"L": L, "now": _median(new), "plain": _median(plain), "old": _median(old)})
    return rows


def _median(runs) -> dict:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0] if key != "digest"}


def report(rows, rounds: int, baseline: str, command: str) -> str:
    lines = ["Machine: %s; Python %s. Date: %s. Command: `%s`." % (
        _cpu(), platform.python_version(), datetime.date.today().isoformat(), command), "",
        "CPU seconds of `backprop` (medians of %d fresh processes each, alternating): this tree, this tree "
        "with renaming turned off (every layer rewritten), and commit %s (`old`); rule applications "
        "(steps) of each. Rewrites per second are the old engine's steps over each one's seconds: the "
        "work done, whether by rewriting or by renaming a layer rewritten before. The three normal "
        "forms have the same size, and this tree's is the same term with and without renaming."
        % (rounds, baseline), "",
        "| L | nodes | steps now | steps without renaming | steps old | now (s) | without renaming (s) "
        "| old (s) | rewrites/s now | rewrites/s old | speed-up (old / now) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        now, plain, old = r["now"], r["plain"], r["old"]
        lines.append("| %d | %d | %d | %d | %d | %.3f | %.3f | %.3f | %.0f | %.0f | %.2f |" % (
            r["L"], now["size"], now["steps"], plain["steps"], old["steps"], now["seconds"], plain["seconds"],
            old["seconds"], old["steps"] / now["seconds"], old["steps"] / old["seconds"],
            old["seconds"] / now["seconds"]))
    return "\n".join(lines) + "\n"


def _cpu() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return "%s, %s cores" % (line.split(":", 1)[1].strip(), os.cpu_count())
    except OSError:
        pass
    return "%s cores" % os.cpu_count()


def write_report(path: Path, text: str):
    """Replace the results between this script's markers in BENCHMARKS.md (atomically)."""
    old = path.read_text()
    if MARK_BEGIN not in old:
        old = old.rstrip() + "\n\n%s\n%s\n" % (MARK_BEGIN, MARK_END)
    head, rest = old.split(MARK_BEGIN, 1)
    tail = rest.split(MARK_END, 1)[1]
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(head + MARK_BEGIN + "\n" + text.rstrip() + "\n" + MARK_END + tail)
    os.replace(tmp, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", default="32,128", help="encoder depths (default 32,128)")
    parser.add_argument("--rounds", type=int, default=5, help="fresh processes per engine and depth (default 5)")
    parser.add_argument("--baseline", default=BASELINE, help="the commit to compare with (default %s)" % BASELINE)
    parser.add_argument("--quick", action="store_true", help="one round at depth 16, nothing written")
    parser.add_argument("--no-write", action="store_true", help="print the results only")
    parser.add_argument("--once", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.once is not None:
        print(json.dumps(workload_once(args.once)))
        return 0
    depths = [16] if args.quick else [int(x) for x in args.depths.split(",")]
    rounds = 1 if args.quick else args.rounds
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    rows = run(depths, rounds, args.baseline, log)
    command = "python bench/engine.py" + ("".join(" " + a for a in (argv if argv is not None else sys.argv[1:])))
    text = report(rows, rounds, args.baseline, command)
    print(text)
    if not (args.quick or args.no_write):
        write_report(ROOT / "BENCHMARKS.md", text)
        log("wrote BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
