"""Benchmark of issue 6: the shared normal form of deep encoders, and the code generated from it.

    python bench/deep.py            # both tables, written into BENCHMARKS.md
    python bench/deep.py --quick    # a smoke run: fewer depths, sizes and repeats; writes nothing

Table 1, front end and normalisation: for the encoder of examples/deep.fd with L layers, the time
to parse and elaborate the program and build form(E) ("front end"), the time of the strategy
(``backprop``: the shared normal form; ``normal``: the manual's fully expanded one) and the size
of the result in distinct nodes (``fdsl.core.terms.dag_size``). Each measurement runs in a fresh
process (terms are interned process-wide, so a second run would find its subterms already built);
the one-time start-up (imports, grammar, stdlib rules) is excluded and reported separately. Times
are CPU seconds of that process (the work is single-threaded). The expanded form stops growing L once one L takes
more than 60 s or the one before took more than 20 s.

Table 2, gradient evaluation: all weights, float64, one thread (the thread variables below are
set before numpy is imported), for four (L, n, d, k, h). Columns: fdsl's generated code
(``fdsl.codegen.generated``, the same source ``fdsl codegen`` writes), the hand-written numpy
backprop of bench/handwritten.py, torch autograd on CPU (when torch is importable), and the forward
pass alone (numpy). Before any timing, the answers are checked: fdsl's gradients are minus the hand
backprop's (grad(form(E), W) = -dL/dW) to 1e-9 relative on every weight, and torch's agree too;
a mismatch stops the benchmark. Times are medians over interleaved repeats, each repeat timing a
batch of calls (timeit-style); ratios are of medians measured in the same process.
"""

from __future__ import annotations

import os

# one thread, before numpy (or torch) is imported anywhere
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import handwritten  # noqa: E402

DEPTHS = [1, 2, 4, 8, 16, 32, 64]
EXPANDED_DEPTHS = [1, 2, 3, 4, 5, 6, 7, 8]
SIZES = [(2, 8, 6, 4, 5), (4, 64, 64, 16, 64), (8, 128, 64, 32, 128), (16, 64, 32, 8, 32)]
CHECK_TOL = 1e-9
# a weight whose gradient is below this fraction of the largest one is compared against that floor:
# without residual connections the attention rows of a deep encoder collapse, and the gradients
# of its first layers' queries and keys are rounding noise (1e-17), equal in no two implementations
FLOOR = 1e-6
MARK_BEGIN, MARK_END = "<!-- bench/deep.py: begin -->", "<!-- bench/deep.py: end -->"


# ---- the program ----------------------------------------------------------------------------------


def program_text(L: int, dims=None) -> str:
    """examples/deep.fd with L layers (and other dim sizes): ``E := Y - X(L)``, ``w = form(E)``."""
    text = (ROOT / "examples" / "deep.fd").read_text().split("\nE := ")[0]
    if dims is not None:
        n, d, k, h = dims
        text = re.sub(r"(?m)^dim .*$", "dim n = %d, d = %d, k = %d, h = %d" % (n, d, k, h), text)
    return text + "\nE := Y - X(%d)\nw = form(E)\n" % L


# ---- table 1 ----------------------------------------------------------------------------------------


def normalise_once(L: int, strategy: str) -> dict:
    """One measurement, in this (fresh) process: start-up, front end, normalisation (CPU seconds of
    this single-threaded process, so that other load on a shared machine does not count), size."""
    t0 = time.process_time()
    import fdsl
    from fdsl.calculus.forms import form
    from fdsl.core import terms as T

    warm = fdsl.parse("dim m = 2\nweight Z : m x m\nz = Z\n")  # grammar and stdlib rules, once
    warm.apply_rules(strategy, form(warm["z"]))
    t1 = time.process_time()
    p = fdsl.parse(program_text(L))
    f = form(p["E"])
    t2 = time.process_time()
    w = p.apply_rules(strategy, f)
    t3 = time.process_time()
    return {"startup": t1 - t0, "front": t2 - t1, "normalise": t3 - t2, "size": T.dag_size(w)}


def measure_normalise(L: int, strategy: str, limit: float) -> dict:
    """``normalise_once`` in a fresh interpreter; {"timeout": True} past ``limit`` CPU seconds."""
    import resource
    import signal

    def cap():  # the limit is on CPU time, as the measurement is: load elsewhere does not count
        resource.setrlimit(resource.RLIMIT_CPU, (int(limit), int(limit) + 1))

    cmd = [sys.executable, str(Path(__file__).resolve()), "--normalise-once", str(L), strategy]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10 * limit, preexec_fn=cap)
    except subprocess.TimeoutExpired:
        return {"timeout": True}
    if r.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return {"timeout": True}
    if r.returncode != 0:
        raise SystemExit("normalising encoder(%d) with %s failed:\n%s" % (L, strategy, r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])


def table1(depths, expanded_depths, repeats: int, log) -> dict:
    rows = {}
    for L in depths:
        runs = [measure_normalise(L, "backprop", 600) for _ in range(repeats)]
        rows.setdefault(L, {})["shared"] = _median_run(runs)
        log("table 1: backprop L=%d  normalise %.3f s  size %d" % (L, rows[L]["shared"]["normalise"],
                                                                    rows[L]["shared"]["size"]))
    previous = 0.0
    for L in expanded_depths:
        if previous > 20.0:
            rows.setdefault(L, {})["expanded"] = {"skipped": True}
            break
        r = measure_normalise(L, "normal", 60.0)
        if r.get("timeout"):
            rows.setdefault(L, {})["expanded"] = {"timeout": True}
            log("table 1: normal L=%d  > 60 s, stopped" % L)
            break
        if r["normalise"] < 5.0 and repeats > 1:  # cheap enough to repeat
            r = _median_run([r] + [measure_normalise(L, "normal", 60.0) for _ in range(repeats - 1)])
        rows.setdefault(L, {})["expanded"] = r
        previous = r["front"] + r["normalise"]
        log("table 1: normal L=%d  normalise %.3f s  size %d" % (L, r["normalise"], r["size"]))
    return rows


def _median_run(runs) -> dict:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


# ---- table 2 ----------------------------------------------------------------------------------------


def make_values(L, n, d, k, h, seed=0) -> dict:
    """Random values: X0, Y standard normal; every weight normal / sqrt(rows), as ``random`` does."""
    rng = np.random.default_rng(seed)
    values = {"X0": rng.standard_normal((n, d)), "Y": rng.standard_normal((n, d))}
    shapes = {"Q": (d, k), "K": (d, k), "V": (d, h), "W": (h, d), "b": (1, h), "f": (1, d)}
    for i in range(L):
        for name, shape in shapes.items():
            values["%s_%d" % (name, i)] = rng.standard_normal(shape) / np.sqrt(shape[0])
    return values


def fdsl_gradients(L, n, d, k, h):
    """(grads function, seconds to build it, matrix-product multiply-adds of the generated code)."""
    import fdsl
    from fdsl.calculus.forms import form
    from fdsl.codegen import generated as codegen

    t0 = time.perf_counter()
    p = fdsl.parse(program_text(L, (n, d, k, h)))
    w = p.apply_rules("backprop", form(p["E"]))
    outputs = codegen.gradient_terms(w)
    lowering = codegen.Lowering(outputs, p.dims)
    source = lowering.source("fdsl benchmark: encoder(%d), n=%d d=%d k=%d h=%d" % (L, n, d, k, h))
    grads = codegen.compile_source(source)
    return grads, time.perf_counter() - t0, lowering.flops


def hand_flops(L, n, d, k, h) -> int:
    """Multiply-adds of the matrix products of bench/handwritten.backward."""
    forward = 2 * n * d * k + n * n * k + n * d * h + n * n * h + n * h * d
    backward = (2 * n * h * d + 2 * n * n * h + n * d * h + 2 * n * n * k + 2 * n * d * k)
    input_grad = 2 * n * k * d + n * h * d
    return L * (forward + backward) + (L - 1) * input_grad


def torch_gradients(values, L):
    """A torch autograd function of the same encoder (float64, CPU, one thread), or None."""
    try:
        import torch
    except ImportError:
        return None, None
    torch.set_num_threads(1)
    tensors = {name: torch.from_numpy(v.copy()) for name, v in values.items()}
    names = [name for name in values if name not in ("X0", "Y")]
    params = [tensors[name].requires_grad_(True) for name in names]
    k = values["Q_0"].shape[1]
    s = k ** -0.5

    def run():
        X = tensors["X0"]
        for i in range(L):
            Q, K, V, W = (tensors["%s_%d" % (c, i)] for c in "QKVW")
            S = torch.softmax((s * (X @ Q)) @ (X @ K).T, dim=1)
            M = torch.relu(S @ (X @ V) + tensors["b_%d" % i])
            X = M @ W + tensors["f_%d" % i]
        loss = 0.5 * ((tensors["Y"] - X) ** 2).sum()
        return torch.autograd.grad(loss, params)

    def grads():
        return dict(zip(names, (g.numpy() for g in run())))

    return run, grads


def relative_errors(got: dict, want: dict) -> dict:
    """Per weight ||got - want|| / max(||want||, FLOOR * largest ||want||) (see FLOOR)."""
    assert set(got) == set(want), "different weights: %s" % sorted(set(got) ^ set(want))
    floor = FLOOR * max(np.linalg.norm(v) for v in want.values())
    return {name: float(np.linalg.norm(got[name] - want[name]) / max(np.linalg.norm(want[name]), floor, 1e-300))
            for name in want}


def check(name: str, got: dict, want: dict, tol: float = CHECK_TOL) -> float:
    errors = relative_errors(got, want)
    worst = max(errors, key=errors.get)
    if errors[worst] > tol:
        raise SystemExit("CHECK FAILED: %s differs from the hand-written backprop on %s by %.3g (relative; "
                         "tolerance %g)" % (name, worst, errors[worst], tol))
    return errors[worst]


def timed(fns: dict, repeats: int, target: float = 0.05) -> dict:
    """Median seconds per call of each function: ``repeats`` rounds, each timing a batch of calls
    of every function in turn (interleaved, so load on a shared machine hits them alike). The time
    is the CPU time of this process (one thread does the work): time spent descheduled by other
    processes on a shared machine does not count."""
    numbers = {}
    for name, fn in fns.items():
        fn()  # warm
        number, elapsed = 1, 0.0
        while True:
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            elapsed = time.perf_counter() - t0
            if elapsed >= target / 4:
                break
            number *= 4
        numbers[name] = max(1, int(number * target / max(elapsed, 1e-9)))
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            number = numbers[name]
            t0 = time.process_time()
            for _ in range(number):
                fn()
            samples[name].append((time.process_time() - t0) / number)
    return {name: statistics.median(s) for name, s in samples.items()}


def table2(sizes, repeats: int, log) -> list:
    rows = []
    for L, n, d, k, h in sizes:
        values = make_values(L, n, d, k, h)
        weights = {name: v for name, v in values.items() if name not in ("X0", "Y")}
        X0, Y = values["X0"], values["Y"]
        grads, build, flops = fdsl_gradients(L, n, d, k, h)
        ours = grads(values)
        hand = handwritten.backward(X0, Y, weights, L)
        err = check("fdsl", ours, {name: -g for name, g in hand.items()})
        torch_run, torch_grads = torch_gradients(values, L)
        fns = {
            "fdsl": lambda: grads(values),
            "hand": lambda: handwritten.backward(X0, Y, weights, L),
            "forward": lambda: handwritten.forward(X0, weights, L),
        }
        torch_err = None
        if torch_run is not None:
            torch_err = check("torch", torch_grads(), hand)
            fns["torch"] = torch_run
        times = timed(fns, repeats)
        row = {"size": (L, n, d, k, h), "times": times, "check": err, "torch_check": torch_err,
               "build": build, "flops": flops, "hand_flops": hand_flops(L, n, d, k, h)}
        rows.append(row)
        log("table 2: %s  fdsl %.1f us  hand %.1f us  forward %.1f us%s  (fdsl/hand %.2f)" % (
            (L, n, d, k, h), times["fdsl"] * 1e6, times["hand"] * 1e6, times["forward"] * 1e6,
            "  torch %.1f us" % (times["torch"] * 1e6) if "torch" in times else "", times["fdsl"] / times["hand"]))
    return rows


# ---- the report -------------------------------------------------------------------------------------


def machine() -> str:
    model, cores = "unknown", os.cpu_count()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    blas = ""
    try:
        config = np.show_config(mode="dicts")
        info = config["Build Dependencies"]["blas"]
        blas = "%s %s" % (info.get("name", ""), info.get("version", ""))
    except Exception:
        pass
    parts = ["%s, %s cores" % (model, cores), "Python %s" % platform.python_version(),
             "numpy %s%s" % (np.__version__, " (%s)" % blas.strip() if blas.strip() else "")]
    try:
        import torch

        parts.append("torch %s" % torch.__version__)
    except ImportError:
        parts.append("torch not installed")
    return "; ".join(parts)


def _us(seconds: float) -> str:
    return "%.1f" % (seconds * 1e6) if seconds < 0.01 else "%.0f" % (seconds * 1e6)


def report(t1: dict, t2: list, command: str) -> str:
    lines = ["Machine: %s. Single thread (OMP/OPENBLAS/MKL_NUM_THREADS=1, torch.set_num_threads(1))."
             % machine(), "Date: %s. Command: `%s`." % (datetime.date.today().isoformat(), command), ""]
    if t1:
        startup = statistics.median(r["startup"] for row in t1.values() for r in row.values() if "startup" in r)
        lines += ["### Table 1: front end + normalisation, and normal-form size", "",
                  "CPU seconds (median of fresh processes; their start-up of %.2f s for imports, grammar "
                  "and stdlib rules excluded) and distinct nodes (`dag_size`)." % startup, "",
                  "| L | shared: front end (s) | shared: `backprop` (s) | shared: nodes | expanded: front end (s) "
                  "| expanded: `normal` (s) | expanded: nodes |", "|---:|---:|---:|---:|---:|---:|---:|"]
        for L in sorted(t1):
            row = t1[L]
            cells = [str(L)]
            for kind in ("shared", "expanded"):
                r = row.get(kind)
                if r is None:
                    cells += ["", "", ""]
                elif r.get("timeout"):
                    cells += ["", "> 60 (stopped)", ""]
                elif r.get("skipped"):
                    cells += ["", "not run (previous > 20 s)", ""]
                else:
                    cells += ["%.3f" % r["front"], "%.3f" % r["normalise"], str(r["size"])]
            lines.append("| " + " | ".join(cells) + " |")
        shared = {L: r["shared"] for L, r in t1.items() if "shared" in r}
        if 32 in shared and 64 in shared:
            lines += ["", "size(64)/size(32) = %.3f (target <= 2.2); encoder(64) front end + normalisation "
                      "%.2f s (target < 2 s)." % (shared[64]["size"] / shared[32]["size"],
                                                  shared[64]["front"] + shared[64]["normalise"])]
        lines.append("")
    if t2:
        has_torch = any("torch" in r["times"] for r in t2)
        lines += ["### Table 2: gradient evaluation, all weights, float64, one thread", "",
                  "Microseconds per call, medians of interleaved repeats; ratios of medians from the same "
                  "process. `check`: the largest relative difference of fdsl's gradients from the hand "
                  "backprop's, over all weights (verified <= 1e-9 before timing).", "",
                  "| (L, n, d, k, h) | fdsl (us) | hand (us) | %sforward (us) | fdsl/hand | fdsl/forward | %s"
                  "check | products fdsl/hand |" % ("torch (us) | " if has_torch else "",
                                                     "fdsl/torch | " if has_torch else ""),
                  "|---|---:|---:|%s---:|---:|---:|%s---:|---:|" % ("---:|" if has_torch else "",
                                                                  "---:|" if has_torch else "")]
        for r in t2:
            t = r["times"]
            cells = ["(%d, %d, %d, %d, %d)" % r["size"], _us(t["fdsl"]), _us(t["hand"])]
            if has_torch:
                cells.append(_us(t["torch"]) if "torch" in t else "n/a")
            cells += [_us(t["forward"]), "%.2f" % (t["fdsl"] / t["hand"]), "%.2f" % (t["fdsl"] / t["forward"])]
            if has_torch:
                cells.append("%.2f" % (t["fdsl"] / t["torch"]) if "torch" in t else "n/a")
            cells += ["%.1e" % r["check"], "%.2f" % (r["flops"] / r["hand_flops"])]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "Targets: fdsl/hand <= 1.2, fdsl/forward <= 4, fdsl/torch < 1 at every size. "
                  "`products fdsl/hand`: multiply-adds of the matrix products of the generated code over "
                  "those of the hand backprop."]
        if not has_torch:
            lines.append("torch is not installed here: its column is left out (`pip install torch`).")
        lines.append("")
    return "\n".join(lines)


def write_report(path: Path, text: str):
    """Replace the results between the markers of BENCHMARKS.md (the prose around them stays)."""
    old = path.read_text() if path.exists() else "# Benchmarks\n\n%s\n%s\n" % (MARK_BEGIN, MARK_END)
    if MARK_BEGIN not in old:
        old = old.rstrip() + "\n\n%s\n%s\n" % (MARK_BEGIN, MARK_END)
    head, rest = old.split(MARK_BEGIN, 1)
    tail = rest.split(MARK_END, 1)[1] if MARK_END in rest else "\n"
    new = head + MARK_BEGIN + "\n" + text.rstrip() + "\n" + MARK_END + tail
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(new)
    os.replace(tmp, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: small depths and sizes, few "
                        "repeats; writes nothing unless --write is given")
    parser.add_argument("--tables", default="1,2", help="which tables to run (default 1,2)")
    parser.add_argument("--repeats", type=int, help="timing rounds for table 2 (default 21; 5 with --quick)")
    parser.add_argument("--write", metavar="FILE", help="write the results into FILE (default BENCHMARKS.md "
                        "for a full run)")
    parser.add_argument("--no-write", action="store_true", help="print the results only")
    parser.add_argument("--normalise-once", nargs=2, metavar=("L", "STRATEGY"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.normalise_once:
        print(json.dumps(normalise_once(int(args.normalise_once[0]), args.normalise_once[1])))
        return 0
    tables = {t.strip() for t in args.tables.split(",")}
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if args.quick:
        depths, expanded, sizes, repeats, t1_repeats = [1, 2, 4, 8, 16], [1, 2, 3], SIZES[:2], 5, 1
    else:
        depths, expanded, sizes, repeats, t1_repeats = DEPTHS, EXPANDED_DEPTHS, SIZES, 21, 3
    repeats = args.repeats or repeats
    t1 = table1(depths, expanded, t1_repeats, log) if "1" in tables else {}
    t2 = table2(sizes, repeats, log) if "2" in tables else []
    command = "python bench/deep.py" + ("" if argv is None and len(sys.argv) == 1 else
                                        " " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])))
    text = report(t1, t2, command)
    print(text)
    target = args.write or (None if args.quick or args.no_write else str(ROOT / "BENCHMARKS.md"))
    if target:
        write_report(Path(target), text)
        log("wrote %s" % target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
