"""Benchmark of issue 16: gradients at training scale, in one run.

    python bench/scale.py            # the tables below, written into BENCHMARKS.md
    python bench/scale.py --quick    # small sizes, few repeats; writes nothing

For the encoder of examples/deep.fd (as bench/deep.py: ``E := Y - X(L)``, ``w = form(E)``), on one
thread (set before numpy and torch are imported), with the clock the CPU time of this process:

- Table A, dtypes: the generated numpy code (``fdsl.codegen.generated``, what ``fdsl codegen``
  writes) in float32 and in float64 against the hand-written numpy backprop (bench/handwritten.py)
  and torch autograd on CPU, each in the same dtype, at (L, n, d, k, h) = (4, 512, 256, 64, 256)
  and (12, 256, 768, 64, 768).
- Table B, batches: a batch of 16 sequences in one call of the generated code against one
  sequence, at (4, 64, 64, 16, 64); its gradients against the sum of the 16 single ones.
- Table D, float64 as before: the generated code of this tree against the code that commit
  BASELINE's fdsl generates for the same program, at bench/deep.py's sizes, timed side by side.
- Table C, the torch target (``fdsl codegen --target torch``): one training step, the loss and
  the gradients of every weight (``torch.autograd.grad`` through the generated autograd Function),
  against torch autograd of the same encoder written in torch, float32 and float64, at the sizes
  of table A; and, with ``--compile``, ``torch.compile`` of the generated ``grads`` function.

Before timing, every answer is checked and a mismatch stops the benchmark: fdsl's gradients are
minus the hand backprop's (float64: 1e-9 relative on every weight, against the floor of
bench/deep.py; float32: 1e-3 of the whole gradient against the float64 one), torch's agree with
the hand backprop's (1e-7 per weight: at these sizes two float64 implementations round apart), the torch target
agrees with torch autograd to 1e-10 in float64 (the whole
gradient), and the batch's gradients equal the sum of the single ones to 1e-12. Times are medians
of interleaved repeats (bench/deep.py's ``timed``); ratios are of medians from this process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import argparse  # noqa: E402
import datetime  # noqa: E402
import time  # noqa: E402

import deep  # noqa: E402  (first: it sets the thread variables before numpy is imported)
import handwritten  # noqa: E402
import numpy as np  # noqa: E402

ROOT = deep.ROOT
SIZES = [(4, 512, 256, 64, 256), (12, 256, 768, 64, 768)]
BATCH_SIZE, BATCH = (4, 64, 64, 16, 64), 16
TORCH_TOL = 1e-7  # torch autograd against the hand backprop, per weight (fdsl's: bench/deep.py's 1e-9)
MARK_BEGIN, MARK_END = "<!-- bench/scale.py: begin -->", "<!-- bench/scale.py: end -->"
BASELINE = "ccf8ae5"  # the last commit before issue 16: table D's float64 reference


def build(L, n, d, k, h, target="numpy"):
    """The generated module's namespace for encoder(L) at these sizes (with the loss)."""
    import fdsl
    from fdsl.calculus.forms import form
    from fdsl.codegen import generated as codegen
    from fdsl.learn.train import error_of

    p = fdsl.parse(deep.program_text(L, (n, d, k, h)))
    w = p.apply_rules("backprop", form(p["E"]))
    source = codegen.gradients_source(w, p.dims, "bench/scale.py", target, None, error_of(p["w"]))
    if target == "numpy":
        return codegen.compile_namespace(source)
    path = Path(os.environ.get("TMPDIR", "/tmp")) / ("fdsl_scale_%d_%d_%d_%d_%d.py" % (L, n, d, k, h))
    path.write_text(source)  # a file, so that torch.compile can read the source of what it compiles
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


def whole_error(got: dict, want: dict) -> float:
    num = sum(float(np.sum((np.asarray(got[k], dtype=np.float64) - np.asarray(want[k], dtype=np.float64)) ** 2))
              for k in want)
    return (num / sum(float(np.sum(np.asarray(v, dtype=np.float64) ** 2)) for v in want.values())) ** 0.5


def torch_autograd(values: dict, L: int, dtype):
    """One training step of torch autograd on the same encoder: (step function, gradients)."""
    import torch

    tensors = {name: torch.from_numpy(v).to(dtype) for name, v in values.items()}
    names = [name for name in values if name not in ("X0", "Y")]
    params = [tensors[name].requires_grad_(True) for name in names]
    s = values["Q_0"].shape[1] ** -0.5

    def step():
        X = tensors["X0"]
        for i in range(L):
            Q, K, V, W = (tensors["%s_%d" % (c, i)] for c in "QKVW")
            S = torch.softmax((s * (X @ Q)) @ (X @ K).mT, dim=-1)
            X = torch.relu(S @ (X @ V) + tensors["b_%d" % i]) @ W + tensors["f_%d" % i]
        loss = 0.5 * ((tensors["Y"] - X) ** 2).sum()
        return torch.autograd.grad(loss, params)

    return step, lambda: dict(zip(names, (g.double().numpy() for g in step())))


def torch_target(module: dict, values: dict, dtype):
    """One training step through the generated autograd Function: (step function, gradients)."""
    import torch

    tensors = {name: torch.from_numpy(v).to(dtype) for name, v in values.items()}
    names = [name for name in values if name not in ("X0", "Y")]
    params = [tensors[name].requires_grad_(True) for name in names]
    loss = module["loss"]

    def step():
        return torch.autograd.grad(loss(tensors), params)

    return step, lambda: dict(zip(names, (g.double().numpy() for g in step())))


def table_a(sizes, repeats, log) -> list:
    rows = []
    for size in sizes:
        L, n, d, k, h = size
        values = deep.make_values(*size)
        ns = build(*size)
        grads = ns["grads"]
        hand64 = handwritten.backward(values["X0"], values["Y"], _weights(values), L)
        deep.check("fdsl float64", grads(values), {k_: -g for k_, g in hand64.items()})
        fns, checks = {}, {}
        for dt in (np.float32, np.float64):
            tag = "32" if dt is np.float32 else "64"
            v = {name: a.astype(dt) for name, a in values.items()}
            w = _weights(v)
            ours = grads(v)
            assert all(g.dtype == dt for g in ours.values()), "fdsl did not compute in %s" % dt.__name__
            hand = handwritten.backward(v["X0"], v["Y"], w, L)
            if dt is np.float32:
                checks["fdsl32"] = whole_error({k_: -g for k_, g in ours.items()}, hand64)
                checks["hand32"] = whole_error(hand, hand64)
                if checks["fdsl32"] > 1e-3:
                    raise SystemExit("CHECK FAILED: float32 gradients differ from float64 by %.3g" % checks["fdsl32"])
            fns["fdsl" + tag] = (lambda g=grads, v=v: g(v))
            fns["hand" + tag] = (lambda v=v, w=w: handwritten.backward(v["X0"], v["Y"], w, L))
            try:
                import torch
            except ImportError:
                continue
            torch.set_num_threads(1)
            step, tgrads = torch_autograd(values, L, torch.float32 if dt is np.float32 else torch.float64)
            if dt is np.float64:  # two other float64 implementations: rounding differs more at size
                deep.check("torch", tgrads(), hand64, TORCH_TOL)
            fns["torch" + tag] = step
        times = deep.timed(fns, repeats)
        rows.append({"size": size, "times": times, "checks": checks})
        log("table A %s: %s" % (size, ", ".join("%s %.1f ms" % (k_, t * 1e3) for k_, t in times.items())))
    return rows


def table_b(repeats, log) -> dict:
    values = deep.make_values(*BATCH_SIZE)
    rng = np.random.default_rng(1)
    n, d = BATCH_SIZE[1], BATCH_SIZE[2]
    batch = dict(values, X0=rng.standard_normal((BATCH, n, d)), Y=rng.standard_normal((BATCH, n, d)))
    grads = build(*BATCH_SIZE)["grads"]
    singles = [grads(dict(values, X0=batch["X0"][i], Y=batch["Y"][i])) for i in range(BATCH)]
    total = {k: sum(s[k] for s in singles) for k in singles[0]}
    err = whole_error(grads(batch), total)
    if err > 1e-12:
        raise SystemExit("CHECK FAILED: the batch's gradients differ from the sum of the single ones by %.3g" % err)
    one = dict(values, X0=batch["X0"][0], Y=batch["Y"][0])
    times = deep.timed({"batch": lambda: grads(batch), "one": lambda: grads(one)}, repeats)
    log("table B: batch of %d %.2f ms, one %.3f ms" % (BATCH, times["batch"] * 1e3, times["one"] * 1e3))
    return {"times": times, "check": err}


def table_c(sizes, repeats, compile_, log) -> list:
    import torch

    torch.set_num_threads(1)
    rows = []
    for size in sizes:
        L = size[0]
        values = deep.make_values(*size)
        module = build(*size, target="torch")
        fns, checks = {}, {}
        for dt in (torch.float32, torch.float64):
            tag = "32" if dt is torch.float32 else "64"
            ours_step, ours = torch_target(module, values, dt)
            theirs_step, theirs = torch_autograd(values, L, dt)
            if dt is torch.float64:
                checks["target64"] = whole_error(ours(), theirs())
                if checks["target64"] > 1e-10:
                    raise SystemExit("CHECK FAILED: the torch target differs from torch autograd by %.3g"
                                     % checks["target64"])
            fns["target" + tag] = ours_step
            fns["autograd" + tag] = theirs_step
        if compile_ and size == sizes[0]:  # one size: the compilation takes a minute or more
            tensors = {name: torch.from_numpy(v).float() for name, v in values.items()}
            compiled = torch.compile(module["grads"])
            t0 = time.perf_counter()
            got = compiled(tensors)
            checks["compile_seconds"] = time.perf_counter() - t0
            plain = module["grads"](tensors)
            checks["compiled32"] = whole_error({k: g.double().numpy() for k, g in got.items()},
                                               {k: g.double().numpy() for k, g in plain.items()})
            fns["compiled32"] = lambda: compiled(tensors)
            fns["grads32"] = lambda: module["grads"](tensors)
        times = deep.timed(fns, repeats)
        rows.append({"size": size, "times": times, "checks": checks})
        log("table C %s: %s" % (size, ", ".join("%s %.1f ms" % (k, t * 1e3) for k, t in times.items())))
    return rows


_GENERATE = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[2])
import deep, fdsl
from fdsl.codegen import generated as codegen
from fdsl.calculus.forms import form
L, n, d, k, h = map(int, sys.argv[3:8])
p = fdsl.parse(deep.program_text(L, (n, d, k, h)))
w = p.apply_rules("backprop", form(p["E"]))
print(json.dumps(codegen.gradients_source(w, p.dims)))
'''


def table_d(repeats, baseline, log) -> list:
    """float64 as before: the generated code of this tree against that of ``baseline``, both
    generated in fresh processes and timed here, at bench/deep.py's sizes."""
    import json
    import subprocess
    import tempfile

    import engine

    rows = []
    with tempfile.TemporaryDirectory(prefix="fdsl-baseline-") as tmp:
        old = engine.unpack(baseline, Path(tmp))
        for size in deep.SIZES:
            values = deep.make_values(*size)
            fns = {}
            for tag, root in (("now", ROOT), ("old", old)):
                r = subprocess.run([sys.executable, "-c", _GENERATE, str(root), str(ROOT / "bench")] +
                                   [str(x) for x in size], capture_output=True, text=True,
                                   env=dict(os.environ, PYTHONPATH=str(root)))
                if r.returncode != 0:
                    raise SystemExit("generating code with %s failed:\n%s" % (root, r.stderr))
                ns: dict = {"__name__": "fdsl_generated_" + tag}
                exec(compile(json.loads(r.stdout.strip().splitlines()[-1]), tag, "exec"), ns)
                got = ns["grads"](values)
                hand = handwritten.backward(values["X0"], values["Y"], _weights(values), size[0])
                deep.check("fdsl (%s)" % tag, got, {k: -g for k, g in hand.items()})
                fns[tag] = (lambda g=ns["grads"]: g(values))
            times = deep.timed(fns, repeats)
            rows.append({"size": size, "times": times})
            log("table D %s: now %.1f us, %s %.1f us" % (size, times["now"] * 1e6, baseline, times["old"] * 1e6))
    return rows


def _weights(values):
    return {name: v for name, v in values.items() if name not in ("X0", "Y")}


def _ms(seconds):
    return "%.2f" % (seconds * 1e3) if seconds < 0.1 else "%.1f" % (seconds * 1e3)


def report(a, b, c, d, command) -> str:
    lines = ["Machine: %s. Single thread (OMP/OPENBLAS/MKL_NUM_THREADS=1, torch.set_num_threads(1))."
             % deep.machine(), "Date: %s. Command: `%s`." % (datetime.date.today().isoformat(), command), ""]
    if a:
        has_torch = "torch32" in a[0]["times"]
        lines += ["### Table A: generated numpy code in float32 and float64", "",
                  "Milliseconds per call (all weights' gradients), medians of interleaved repeats. "
                  "`err32`: the whole float32 gradient against the float64 hand backprop's (relative).", "",
                  "| (L, n, d, k, h) | dtype | fdsl (ms) | hand (ms) |%s fdsl/hand |%s err32 |"
                  % (" torch (ms) |" if has_torch else "", " fdsl/torch |" if has_torch else ""),
                  "|---|---|---:|---:|%s---:|%s---:|" % ("---:|" if has_torch else "", "---:|" if has_torch else "")]
        for r in a:
            t = r["times"]
            for tag, dt in (("32", "float32"), ("64", "float64")):
                cells = ["(%d, %d, %d, %d, %d)" % r["size"], dt, _ms(t["fdsl" + tag]), _ms(t["hand" + tag])]
                if has_torch:
                    cells.append(_ms(t["torch" + tag]))
                cells.append("%.2f" % (t["fdsl" + tag] / t["hand" + tag]))
                if has_torch:
                    cells.append("%.2f" % (t["fdsl" + tag] / t["torch" + tag]))
                cells.append("%.1e" % r["checks"]["fdsl32"] if tag == "32" else "")
                lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "Targets: float32 fdsl/hand <= 1.1 and fdsl/torch < 1; float64 as bench/deep.py's "
                  "table 2 (fdsl/hand <= 1.2).", ""]
    if b:
        t = b["times"]
        lines += ["### Table B: a batch of %d sequences in one call" % BATCH, "",
                  "| (L, n, d, k, h) | batch of %d (ms) | one (ms) | batch / one | target | batch vs sum of singles |"
                  % BATCH, "|---|---:|---:|---:|---:|---:|",
                  "| (%d, %d, %d, %d, %d) | %s | %s | %.2f | <= %d | %.1e |" % (
                      BATCH_SIZE + (_ms(t["batch"]), _ms(t["one"]), t["batch"] / t["one"], BATCH, b["check"])), ""]
    if c:
        lines += ["### Table C: the torch target against torch autograd, one training step", "",
                  "Milliseconds per step: the loss and every weight's gradient (`torch.autograd.grad`), "
                  "through the generated `FdslLoss` (target) or torch's own autograd of the same encoder. "
                  "`err64`: the whole float64 gradient of the target against autograd's (relative).", "",
                  "| (L, n, d, k, h) | dtype | target (ms) | autograd (ms) | target/autograd | err64 |",
                  "|---|---|---:|---:|---:|---:|"]
        for r in c:
            t = r["times"]
            for tag, dt in (("32", "float32"), ("64", "float64")):
                lines.append("| (%d, %d, %d, %d, %d) | %s | %s | %s | %.2f | %s |" % (
                    r["size"] + (dt, _ms(t["target" + tag]), _ms(t["autograd" + tag]),
                                 t["target" + tag] / t["autograd" + tag],
                                 "%.1e" % r["checks"]["target64"] if tag == "64" else "")))
        compiled = [r for r in c if "compiled32" in r["times"]]
        if compiled:
            lines += ["", "torch.compile of the generated `grads` (float32): " + "; ".join(
                "%s: compiled %s ms vs plain %s ms (%.2fx), first call (compilation) %.0f s, agreement %.1e" % (
                    r["size"], _ms(r["times"]["compiled32"]), _ms(r["times"]["grads32"]),
                    r["times"]["grads32"] / r["times"]["compiled32"], r["checks"]["compile_seconds"],
                    r["checks"]["compiled32"]) for r in compiled) + "."]
        lines += ["", "Target: target/autograd <= 1.2.", ""]
    if d:
        lines += ["### Table D: float64 generated code, this tree against commit %s" % BASELINE, "",
                  "The same program and values; the module generated by each tree's fdsl (in fresh "
                  "processes), timed here in interleaved repeats. Microseconds per call.", "",
                  "| (L, n, d, k, h) | now (us) | %s (us) | now / %s |" % (BASELINE, BASELINE), "|---|---:|---:|---:|"]
        for r in d:
            t = r["times"]
            lines.append("| (%d, %d, %d, %d, %d) | %.1f | %.1f | %.3f |" % (r["size"] + (t["now"] * 1e6, t["old"] * 1e6,
                                                                          t["now"] / t["old"])))
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 repeats, nothing written")
    parser.add_argument("--tables", default="A,B,C,D", help="which tables (default A,B,C,D)")
    parser.add_argument("--repeats", type=int, help="timing rounds (default 7; 3 with --quick)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile of the torch target")
    parser.add_argument("--no-write", action="store_true", help="print the results only")
    args = parser.parse_args(argv)
    tables = {t.strip().upper() for t in args.tables.split(",")}
    sizes = [(2, 64, 32, 8, 32)] if args.quick else SIZES
    repeats = args.repeats or (3 if args.quick else 7)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    a = table_a(sizes, repeats, log) if "A" in tables else []
    b = table_b(repeats, log) if "B" in tables else {}
    try:
        import torch  # noqa: F401
        has_torch = True
    except ImportError:
        has_torch = False
    c = table_c(sizes, repeats, args.compile, log) if "C" in tables and has_torch else []
    command = "python bench/scale.py" + "".join(" " + x for x in (argv if argv is not None else sys.argv[1:]))
    d = table_d(repeats * 2, BASELINE, log) if "D" in tables else []
    text = report(a, b, c, d, command)
    print(text)
    if not (args.quick or args.no_write):
        deep.MARK_BEGIN, deep.MARK_END = MARK_BEGIN, MARK_END
        deep.write_report(ROOT / "BENCHMARKS.md", text)
        log("wrote BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
