"""Benchmark of issue 21: training a character-level GPT on fdsl's gradients against PyTorch autograd.

    python bench/training.py                     # the full run, written into BENCHMARKS.md
    python bench/training.py --steps 50 --rounds 5 --no-write    # a quick look (about a minute)
    python bench/training.py --compile           # also torch.compile on both sides (minutes)

The model is examples/chargpt.fd (2 pre-LN blocks, 4 causal heads of width 12, width 48, context
32, GELU MLP of width 192, vocabulary 96, next-character cross-entropy summed over positions and
the batch, ``w = -d(L)``; 67k parameters), trained on the characters of the repository's README
(printable ASCII and newline; anything else reads as ``?``). Two implementations, in one process:

- fdsl: the module ``fdsl codegen examples/chargpt.fd --form w --target torch`` writes, its
  ``Model`` (the weights as parameters, ``forward(X=, Y=)`` the loss through ``FdslLoss``, whose
  backward hands out the closed-form gradients of the generated sweep). Data are one-hot.
- autograd: the same model as a PyTorch user writes it (``Reference`` below: ``nn.Embedding``,
  a fused QKV ``nn.Linear``, ``nn.LayerNorm``, ``F.gelu``, ``F.cross_entropy(reduction="sum")``),
  with fdsl's weights copied in, so both compute the same function.

It reports (1) the per-step loss of 500 Adam steps in float64 from the same weights on the same
batches, the largest relative difference of the two losses over every step; (2) the same in
float32; (3) the time of one float32 training step (zero_grad, forward, backward, Adam step),
best of ``--rounds`` rounds of ``--inner`` steps, at batch 8 and 64, on one thread, eager (and
under ``torch.compile`` with ``--compile``), as the ratio fdsl / autograd; (4) the aten calls
and matrix products (``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``matmul``) of one float32 step of
each at batch 64, counted with a ``TorchDispatchMode``.

At the sizes people train (issue 29): ``--size shakespeare_char`` is examples/nanogpt.fd (nanoGPT's
shakespeare_char: 6 blocks of 6 heads of 64, width 384, context 256, vocabulary 65, biases, tied
embedding) and ``--size gpt2`` GPT-2 small's shape (examples/gpt2.fd: 12 x 12 heads of 64, width
768, vocabulary 50257), rewritten here to take its tokens as ids (``const X, Y : n x v onehot``)
at context 128 (``--context``; 1024 on a GPU). The reference is nanoGPT's model as its model.py
writes it (bench/nanogpt_ref.py: ``F.scaled_dot_product_attention(is_causal=True)``, fused
``c_attn``, ``F.cross_entropy``), fdsl's weights copied in by name. Both sides take ids and the
mean loss, and train with the same AdamW (decay 0.1 on the parameters of two or more dimensions,
betas (0.9, 0.99), lr 1e-3). It reports the float32 losses of ``--steps`` steps from the same
weights on the same batches (the largest relative difference), then at batch 1 and 4, eager (and
under ``torch.compile`` with ``--compile``): the time of a step (zero_grad, forward, backward,
AdamW) in ``--rounds`` interleaved rounds of ``--inner`` steps, as the median of the per-round
ratios fdsl / autograd with their least and greatest (where fdsl's generated module runs its float32
products on oneDNN, ``_GEMM``, also a second fdsl Model on torch's own products in the same rounds:
the ratio with the same kernels on both sides); and the peak memory of a step, each side
measured in fresh processes of its own (``--memory-of``, the median of ``--memory-runs``): on the
CPU the process's peak resident set (``VmHWM`` of ``/proc/self/status``) over 3 steps after 3 of
warm-up (``memory_of``; the mark reset just before them through ``/proc/self/clear_refs``; not
``ru_maxrss``, which keeps the parent's across exec), and its rise over the resident set just
before them (the steps' own: activations, gradients); on a GPU ``torch.cuda.max_memory_allocated``.
``--device cuda`` runs it on a GPU (at context 1024 for gpt2 unless ``--context`` says); without
one it says so and records "no GPU here". Each size is written into BENCHMARKS.md between markers
of its own.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread, set before torch is imported
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import importlib.util  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

torch.set_num_threads(1)

PROGRAM = ROOT / "examples" / "chargpt.fd"
BLOCKS, HEADS, WIDTH, HEAD, MLP, CONTEXT = 2, 4, 48, 12, 192, 32
VOCAB = 96  # printable ASCII (32..126), then newline; '?' for anything else
MARK_BEGIN, MARK_END = "<!-- bench/training.py: begin -->", "<!-- bench/training.py: end -->"
MATMULS = ("mm", "bmm", "addmm", "baddbmm", "matmul", "addbmm", "dot", "mv")


# ---- the text --------------------------------------------------------------------------------


def encode(text: str) -> np.ndarray:
    """Characters to ids 0..95: printable ASCII at ord - 32, newline at 95, anything else '?'."""
    out = np.empty(len(text), dtype=np.int64)
    for i, ch in enumerate(text):
        o = ord(ch)
        out[i] = 95 if ch == "\n" else (o - 32 if 32 <= o < 127 else ord("?") - 32)
    return out


def decode(ids) -> str:
    return "".join("\n" if i == 95 else chr(int(i) + 32) for i in ids)


def corpus() -> np.ndarray:
    return encode((ROOT / "README.md").read_text(encoding="utf-8"))


def batches(ids: np.ndarray, batch: int, steps: int, seed: int):
    """``steps`` batches of (inputs, next characters) windows, ids (batch, CONTEXT), seeded."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        starts = rng.integers(0, len(ids) - CONTEXT - 1, size=batch)
        x = np.stack([ids[s:s + CONTEXT] for s in starts])
        y = np.stack([ids[s + 1:s + CONTEXT + 1] for s in starts])
        yield torch.from_numpy(x), torch.from_numpy(y)


def one_hot(ids, dtype):
    """The one-hot rows of ``ids`` in ``dtype``, written in place (``F.one_hot`` makes an int64
    tensor 2x the size first, and a copy)."""
    return torch.zeros(*ids.shape, VOCAB, dtype=dtype, device=ids.device).scatter_(-1, ids[..., None], 1.0)


# ---- fdsl's module ---------------------------------------------------------------------------


def fdsl_module(path: Path = None):
    """The module ``fdsl codegen examples/chargpt.fd --form w --target torch`` writes, imported."""
    from fdsl.calculus.gradients import loss_of
    from fdsl.codegen.generated import gradients_source
    from fdsl.lang.program import load

    program = load(str(PROGRAM))
    w = program["w"]
    source = gradients_source(program.normal_form(w), program.dims, "form w of examples/chargpt.fd", "torch",
                              loss=loss_of(w))
    if path is None:
        path = Path(tempfile.mkdtemp()) / "chargpt_torch.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("chargpt_torch", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # torch.compile looks its globals up by the module's name
    spec.loader.exec_module(module)
    return module


class FdslStep(nn.Module):
    """fdsl's Model, called with ids as the reference is: the data one-hot."""

    def __init__(self, model, dtype):
        super().__init__()
        self.model, self.dtype = model, dtype

    def forward(self, x, y):
        return self.model(X=one_hot(x, self.dtype), Y=one_hot(y, self.dtype))


# ---- the same model, as a PyTorch user writes it ---------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.fc1 = nn.Linear(WIDTH, MLP)
        self.fc2 = nn.Linear(MLP, WIDTH)
        self.register_buffer("mask", torch.triu(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool), 1))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(WIDTH, dim=2)
        q, k, v = (z.view(b, t, HEADS, HEAD).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * HEAD ** -0.5
        att = att.masked_fill(self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, WIDTH))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Reference(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, x, y):
        h = self.tok(x) + self.pos[:x.shape[1]]
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.ln_f(h))
        return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1), reduction="sum")


def copy_weights(model, ref: Reference):
    """fdsl's weights into the reference (nn.Linear holds W^t; heads side by side in the fused QKV;
    a row weight, 1 x d, is a 1-D parameter of the Model, as torch's biases and gains are)."""
    W = dict(model.named_weights())
    with torch.no_grad():
        ref.tok.weight.copy_(W["E"])
        ref.pos.copy_(W["P"])
        for i, block in enumerate(ref.blocks):
            q = torch.cat([W["Q_%d_%d" % (i, j)] for j in range(HEADS)], 1)
            k = torch.cat([W["K_%d_%d" % (i, j)] for j in range(HEADS)], 1)
            v = torch.cat([W["V_%d_%d" % (i, j)] for j in range(HEADS)], 1)
            block.qkv.weight.copy_(torch.cat([q, k, v], 1).T)
            block.proj.weight.copy_(torch.cat([W["O_%d_%d" % (i, j)] for j in range(HEADS)], 0).T)
            block.ln1.weight.copy_(W["g1_%d" % i].reshape(-1))
            block.ln1.bias.copy_(W["b1_%d" % i].reshape(-1))
            block.ln2.weight.copy_(W["g2_%d" % i].reshape(-1))
            block.ln2.bias.copy_(W["b2_%d" % i].reshape(-1))
            block.fc1.weight.copy_(W["W1_%d" % i].T)
            block.fc1.bias.copy_(W["c1_%d" % i].reshape(-1))
            block.fc2.weight.copy_(W["W2_%d" % i].T)
            block.fc2.bias.copy_(W["c2_%d" % i].reshape(-1))
        ref.ln_f.weight.copy_(W["gf"].reshape(-1))
        ref.ln_f.bias.copy_(W["bf"].reshape(-1))
        ref.head.weight.copy_(W["U"].T)


def pair(module, dtype, seed=0):
    """(fdsl's step module, the reference) with the same weights, in ``dtype``."""
    # layer norms start as torch initialises them, gain 1 and bias 0, as chargpt.fd declares them
    model = module.Model(dtype=dtype, generator=torch.Generator().manual_seed(seed))
    ref = Reference().to(dtype)
    copy_weights(model, ref)
    return FdslStep(model, dtype), ref


# ---- (1), (2): agreement ---------------------------------------------------------------------


def agreement(module, ids, dtype, steps, batch, lr=1e-3):
    """The two losses at every one of ``steps`` Adam steps from the same weights and batches."""
    ours, ref = pair(module, dtype)
    opts = [torch.optim.Adam(m.parameters(), lr=lr) for m in (ours, ref)]
    losses = [[], []]
    for x, y in batches(ids, batch, steps, seed=1):
        for k, (m, opt) in enumerate(zip((ours, ref), opts)):
            opt.zero_grad(set_to_none=True)
            loss = m(x, y)
            loss.backward()
            opt.step()
            losses[k].append(float(loss.detach()))
    a, b = np.array(losses[0]), np.array(losses[1])
    return a, b, float(np.max(np.abs(a - b) / np.abs(b)))


# ---- (3), (4): time and counts ---------------------------------------------------------------


def step_fn(m, opt):
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = m(x, y)
        loss.backward()
        opt.step()
        return loss

    return step


def best_times(steps: dict, x, y, rounds, inner):
    """(median, best) of ``rounds`` rounds (interleaved) of ``inner`` steps, per step, for each step
    function."""
    for s in steps.values():  # warm up (and compile)
        for _ in range(3):
            s(x, y)
    times: dict = {k: [] for k in steps}
    for _ in range(rounds):
        for k, s in steps.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                s(x, y)
            times[k].append((time.perf_counter() - t0) / inner)
    return {k: (float(np.median(v)), min(v)) for k, v in times.items()}


def counts(step, x, y):
    """(aten calls, matrix products, page faults) of one step, the calls counted below autograd
    (both directions), the faults (minor: memory the C allocator took back from the system) over
    10 steps."""
    import resource

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = self.products = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls += 1
            if func.overloadpacket.__name__ in MATMULS:
                self.products += 1
            return func(*args, **(kwargs or {}))

    step(x, y)
    with Count() as c:
        step(x, y)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        step(x, y)
    return c.calls, c.products, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10


def timing(module, ids, batch, rounds, inner, compiled, foreach=None, fused=None):
    def adam(m):
        return torch.optim.Adam(m.parameters(), lr=1e-3, foreach=foreach, fused=fused)

    ours, ref = pair(module, torch.float32)
    steps = {"fdsl": step_fn(ours, adam(ours)), "autograd": step_fn(ref, adam(ref))}
    if compiled:
        c_ours, c_ref = pair(module, torch.float32)
        steps["fdsl compiled"] = step_fn(torch.compile(c_ours), adam(c_ours))
        steps["autograd compiled"] = step_fn(torch.compile(c_ref), adam(c_ref))
    x, y = next(batches(ids, batch, 1, seed=2))
    return best_times(steps, x, y, rounds, inner), {k: counts(steps[k], x, y) for k in ("fdsl", "autograd")}


# ---- issue 29: the sizes people train ---------------------------------------------------------

def _ref():
    """bench/nanogpt_ref.py, nanoGPT's model (imported by path: bench is not a package)."""
    if "nanogpt_ref" not in sys.modules:
        import_module(ROOT / "bench" / "nanogpt_ref.py")
    return sys.modules["nanogpt_ref"]


LARGE = {  # size: (program, what it is)
    "shakespeare_char": ("examples/nanogpt.fd", "nanoGPT's shakespeare_char"),
    "gpt2": ("examples/gpt2.fd", "GPT-2 small's shape"),
}


def large_source(size: str, context) -> str:
    """The program of ``size`` (both declare their tokens ``onehot``: ids), with the context
    ``context`` (None: the file's; 128 for gpt2, whose 1024 does not fit here) by rewriting the
    dims line."""
    text = (ROOT / LARGE[size][0]).read_text()
    if size == "gpt2":
        context = context or 128
    if context:
        old = re.search(r"^dim n = (\d+)", text, re.M)
        assert old, "bench/training.py: the program's dims line is not 'dim n = ...'"
        text = text[:old.start(1)] + str(int(context)) + text[old.end(1):]
    return text


def large_module(size: str, context, folder: Path):
    """(the generated torch module of ``size``, its path, seconds to generate it)."""
    from fdsl.calculus.gradients import loss_of
    from fdsl.codegen.generated import gradients_source
    from fdsl.lang.program import Program

    t0 = time.process_time()
    program = Program(LARGE[size][0])
    program.feed(large_source(size, context), LARGE[size][0])
    w = program["w"]
    source = gradients_source(program.normal_form(w), program.dims, "form w of %s" % LARGE[size][0], "torch",
                              loss=loss_of(w))
    seconds = time.process_time() - t0
    path = folder / ("%s_torch.py" % size)
    path.write_text(source)
    return import_module(path), path, seconds


def import_module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # torch.compile looks its globals up by the module's name
    spec.loader.exec_module(module)
    return module


class FdslMean(nn.Module):
    """fdsl's Model called as nanoGPT's model is: ids in, the mean loss out (the summed loss over
    the tokens)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        return self.model(X=x, Y=y) / x.numel()


def large_pair(module, dtype, device, seed=0, **adamw):
    """(fdsl's Model as FdslMean, the nanoGPT reference) with the same weights, each with its AdamW
    (``adamw``: its options, as ``fused=True``)."""
    nanogpt_ref = _ref()
    model = _initialised(module, dtype, device, seed)
    ref = nanogpt_ref.reference_of(model)
    return (FdslMean(model), ref, nanogpt_ref.configure_optimizer(model, **adamw),
            nanogpt_ref.configure_optimizer(ref, **adamw))


def large_side(module, dtype, device, side, seed=0, **adamw):
    """One side of ``large_pair`` alone, with its AdamW (the memory measurement holds nothing else)."""
    nanogpt_ref = _ref()
    model = _initialised(module, dtype, device, seed)
    if side == "fdsl":
        return FdslMean(model), nanogpt_ref.configure_optimizer(model, **adamw)
    ref = nanogpt_ref.reference_of(model)
    del model
    return ref, nanogpt_ref.configure_optimizer(ref, **adamw)


LIBRARIES = {
    "onednn": "oneDNN's matmul (the generated module's FDSL_MATMUL=auto measured it the faster here; on this AMD "
              "CPU MKL's sgemm, which torch's own products and so autograd's call, takes its generic code path)",
    "blas": "torch's own (its BLAS; the generated module's FDSL_MATMUL=auto found oneDNN's no faster, or none)",
}


def on_library(module, library, step):
    """``step`` with the generated module's float32 products on ``library`` while it runs."""
    def run(x, y):
        saved, module._GEMM[0] = module._GEMM[0], library
        try:
            return step(x, y)
        finally:
            module._GEMM[0] = saved

    return run


def _spread(ratios) -> tuple:
    """(median, least, greatest) of per-round ratios."""
    return float(np.median(ratios)), min(ratios), max(ratios)


def _adamw(args) -> dict:
    """The AdamW options both sides take (nanoGPT's on the CPU: none)."""
    return {"fused": True} if args.fused else {"foreach": True} if args.foreach else {}


def _initialised(module, dtype, device, seed):
    """fdsl's Model of ``module``, its weights drawn as nanoGPT's roughly are, on ``device``."""
    model = module.Model(dtype=dtype, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # nanoGPT's start, roughly: small weights, layer norms at gain 1, bias 0
        for name, p in model.named_weights():
            if name[:2] in ("g1", "g2") or name == "gf":
                p.fill_(1.0)
            elif p.dim() < 2:
                p.zero_()
            else:
                p.normal_(0.0, 0.02, generator=g)
    return model.to(device)


def id_batch(vocab, context, batch, device, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, vocab, (batch, context), generator=g).to(device),
            torch.randint(0, vocab, (batch, context), generator=g).to(device))


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def ratio_rounds(steps: dict, x, y, rounds, inner, device):
    """Per-round times (seconds a step) of two step functions, interleaved after 3 warm steps each.
    On the CPU the time is the calling thread's CPU time (torch computes on that one thread here):
    on a shared machine, time another process takes from this one is not counted to either side;
    on a GPU, wall time between synchronisations."""
    clock = time.perf_counter if device == "cuda" else time.thread_time
    for s in steps.values():
        for _ in range(3):
            s(x, y)
    times = {k: [] for k in steps}
    for _ in range(rounds):
        for k, s in steps.items():
            _sync(device)
            t0 = clock()
            for _ in range(inner):
                s(x, y)
            _sync(device)
            times[k].append((clock() - t0) / inner)
    return times


def memory_of(args) -> int:
    """The child of a memory measurement: one side's model and optimiser in this fresh process, 3
    steps to warm up (torch.compile's tracing and compiling, the optimiser's state), then 3 steps
    measured; prints ``peak_mb rise_mb``: the peak of the measured steps, and its rise over what
    was resident before them (the model, the optimiser's state, a compiled graph's code).

    Not the first steps: compiling is a one-time cost whose transient memory moves by 30-50 MiB
    from run to run of the same process (where the compiler's threads leave the allocator's
    arenas), the size of the difference measured; a step of a training loop runs compiled.
    Between the warm-up and the measured steps the C allocator hands back what is free
    (``malloc_trim``, glibc; both sides alike), so the peak is the steps' own, not the warm-up's
    left in the heap."""
    import gc

    module = import_module(Path(args.module))
    if args.device == "cpu":  # both sides with the allocator as the generated Model sets it (_keep_heap),
        module._keep_heap()  # as they run in the timing's one process
    m, opt = large_side(module, torch.float32, args.device, args.memory_of, **_adamw(args))
    gc.collect()
    m_run = torch.compile(m) if args.compile else m
    c = nanogpt_config(module)
    x, y = id_batch(c.vocab, c.context, args.batch, args.device, 2)
    step = step_fn(m_run, opt)
    for _ in range(3):
        step(x, y)
    gc.collect()
    if args.device == "cpu" and platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _resident()
        # the high-water mark of this process's memory from here (VmHWM: Linux resets it on writing
        # 5 to clear_refs). Not ru_maxrss: it keeps the parent's across exec (the benchmark's own
        # process, holding both models, is larger), and clear_refs does not reset that
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    for _ in range(3):
        step(x, y)
    if args.device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = _high_water()
    print("%.1f %.1f" % (peak / 2**20, (peak - base) / 2**20))
    return 0


def _high_water() -> int:
    """The process's peak resident set since clear_refs was last reset, in bytes (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no VmHWM in /proc/self/status: the memory measurement needs Linux")


def _resident() -> int:
    """The process's resident set now, in bytes (Linux's /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def nanogpt_config(module):
    return _ref().config_of(module.SHAPES)


def measure_memory(size, path, batch, compiled, device, side, adamw=(), runs=3):
    """(peak MiB, rise MiB) of ``side``, each the median of ``runs`` fresh processes (``adamw``: the
    optimiser's flags). On the CPU one process's peak moves by 10-30 MiB from run to run at
    shakespeare_char's size (where the C allocator's heap happens to lay the arrays out): one run
    would be noise at the scale of the ratio."""
    import subprocess

    cmd = [sys.executable, str(Path(__file__).resolve()), "--size", size, "--memory-of", side, "--module", str(path),
           "--batch", str(batch), "--device", device] + (["--compile"] if compiled else []) + list(adamw)
    peaks, rises = [], []
    for _ in range(runs):
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"))
        if r.returncode != 0:
            raise SystemExit("the memory measurement failed:\n" + r.stderr[-3000:])
        peak, rise = r.stdout.split()[-2:]
        peaks.append(float(peak))
        rises.append(float(rise))
    return float(np.median(peaks)), float(np.median(rises))


def large(args) -> int:
    """The report of ``--size shakespeare_char`` or ``--size gpt2``."""
    t0 = time.time()
    lines = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    device = args.device
    say("Run of %s UTC, torch %s, %s, %s (`python bench/training.py %s`)."
        % (datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"), torch.__version__,
           platform.processor() or platform.machine(),
           "one thread" if device == "cpu" else device, " ".join(args.argv)))
    say()
    if device == "cuda" and not torch.cuda.is_available():
        say("`--device cuda`: no GPU here (torch.cuda.is_available() is False); nothing measured.")
        if not args.no_write:
            write(lines, args.size)
        return 0
    if device == "cuda":
        say("GPU: %s." % torch.cuda.get_device_name())
        say()
    context = args.context or (1024 if device == "cuda" and args.size == "gpt2" else None)
    folder = Path(tempfile.mkdtemp())
    module, path, codegen = large_module(args.size, context, folder)
    c = nanogpt_config(module)
    params = sum(int(np.prod(shape)) for shape in module.SHAPES.values())
    say("%s (%s%s): %d blocks of %d heads of %d, width %d, context %d, vocabulary %d, MLP width %d; %.1fM "
        "parameters; its torch module generated in %.1f s of CPU. Tokens as ids on both sides; AdamW (decay 0.1 on "
        "the parameters of two or more dimensions, betas (0.9, 0.99), lr 1e-3) on both."
        % (LARGE[args.size][0], LARGE[args.size][1], ", rewritten: ids, context %d" % c.context
           if args.size == "gpt2" else "", c.blocks, c.heads, c.head, c.width, c.context, c.vocab, c.mlp,
           params / 1e6, codegen))
    say()
    ours, ref, o_ours, o_ref = large_pair(module, torch.float32, device)
    diffs, first = [], None
    for k in range(args.steps):
        x, y = id_batch(c.vocab, c.context, 1, device, 100 + k)
        la, lb = step_fn(ours, o_ours)(x, y), step_fn(ref, o_ref)(x, y)
        la, lb = float(la.detach()), float(lb.detach())
        first = first or (la, lb)
        diffs.append(abs(la - lb) / abs(lb))
    say("float32, %d AdamW steps at batch 1 from the same weights on the same batches: first loss %.6f / %.6f "
        "(fdsl / autograd), largest relative difference of the loss at any step %.2e."
        % (args.steps, first[0], first[1], max(diffs)))
    del ours, ref, o_ours, o_ref
    say()
    library = module._GEMM[0] if device == "cpu" else "cuBLAS"
    say("fdsl's float32 products: %s. %s" % (
        LIBRARIES.get(library, library), "" if library != "onednn" else
        "The column \"on BLAS\" is fdsl's Model on torch's own products (FDSL_MATMUL=blas, the library nanoGPT's "
        "Linear layers run on), in the same interleaved rounds: fdsl's sweep against autograd with the same kernels."))
    say()
    say("One float32 training step (zero_grad, forward, backward, AdamW%s), %d interleaved rounds of %d step%s: "
        "milliseconds a step (median round, %s), fdsl / autograd as the median of the per-round ratios (least - "
        "greatest); peak memory of a step, each side in fresh processes (%s over 3 steps after 3 of warm-up, the "
        "median of %d processes), MiB: the peak, and in brackets its rise over what was resident before those steps."
        % (" fused" if args.fused else " foreach" if args.foreach else "", args.rounds, args.inner,
           "" if args.inner == 1 else "s", "wall time" if device == "cuda" else "the thread's CPU time",
           "torch.cuda.max_memory_allocated" if device == "cuda" else "VmHWM", args.memory_runs))
    say()
    blas = library == "onednn"
    say("| batch | mode | fdsl ms | autograd ms | fdsl / autograd, median (least - greatest) | %s"
        "peak MiB fdsl / autograd (rise) |" % ("on BLAS: fdsl / autograd | " if blas else ""))
    say("|---|---|---|---|---|---|%s" % ("---|" if blas else ""))
    modes = [False, True] if args.compile else [False]
    for batch in (1, 4):
        for compiled in modes:
            ours, ref, o_ours, o_ref = large_pair(module, torch.float32, device, **_adamw(args))
            a, b = (torch.compile(ours), torch.compile(ref)) if compiled else (ours, ref)
            x, y = id_batch(c.vocab, c.context, batch, device, 2)
            steps = {"fdsl": step_fn(a, o_ours), "autograd": step_fn(b, o_ref)}
            if blas:
                on_blas, _, o_blas, _ = large_pair(module, torch.float32, device, **_adamw(args))
                steps["blas"] = on_library(module, "blas", step_fn(torch.compile(on_blas) if compiled else on_blas,
                                                                   o_blas))
                del on_blas, o_blas
            t = ratio_rounds(steps, x, y, args.rounds, args.inner, device)
            del ours, ref, o_ours, o_ref, a, b, steps
            ratios = [p / q for p, q in zip(t["fdsl"], t["autograd"])]
            same_kernels = ("%.2f (%.2f - %.2f) | " % _spread([p / q for p, q in zip(t["blas"], t["autograd"])])
                            if blas else "")
            flags = ["--fused"] if args.fused else ["--foreach"] if args.foreach else []
            (pf, rf), (pa, ra) = (measure_memory(args.size, path, batch, compiled, device, side, flags,
                                                 args.memory_runs) for side in ("fdsl", "autograd"))
            say("| %d | %s | %.1f | %.1f | **%.2f** (%.2f - %.2f) | %s%.0f / %.0f (%.0f / %.0f) |" % (
                batch, "torch.compile" if compiled else "eager", np.median(t["fdsl"]) * 1e3,
                np.median(t["autograd"]) * 1e3, *_spread(ratios), same_kernels, pf, pa, rf, ra))
    print("%.0f s in all" % (time.time() - t0))
    if not args.no_write:
        write(lines, args.size)
    return 0


# ---- the report ------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=("chargpt", "shakespeare_char", "gpt2"), default="chargpt",
                    help="the model: examples/chargpt.fd (issue 21), examples/nanogpt.fd, or GPT-2 small's shape "
                    "(issue 29)")
    ap.add_argument("--steps", type=int, default=None, help="Adam steps of the agreement runs (default 500; 10 "
                    "for shakespeare_char and gpt2)")
    ap.add_argument("--batch", type=int, default=8, help="batch of the agreement runs (default 8)")
    ap.add_argument("--rounds", type=int, default=None, help="timing rounds (default 30; 10 for shakespeare_char "
                    "and gpt2)")
    ap.add_argument("--inner", type=int, default=None, help="steps per timing round (default 3; 1 for "
                    "shakespeare_char and gpt2)")
    ap.add_argument("--context", type=int, default=None, help="shakespeare_char, gpt2: the context n (default: "
                    "the program's; 128 for gpt2, 1024 on a GPU)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="shakespeare_char, gpt2: where to run")
    ap.add_argument("--memory-of", choices=("fdsl", "autograd"), help=argparse.SUPPRESS)  # a measuring child
    ap.add_argument("--module", help=argparse.SUPPRESS)  # the child's generated module
    ap.add_argument("--compile", action="store_true", help="also time torch.compile of both models")
    ap.add_argument("--foreach", action="store_true", help="Adam(foreach=True) on both sides (the default on "
                    "CPU is one parameter at a time)")
    ap.add_argument("--fused", action="store_true", help="Adam(fused=True) on both sides (one kernel for every "
                    "parameter)")
    ap.add_argument("--memory-runs", type=int, default=3, help="shakespeare_char, gpt2: fresh processes per "
                    "side whose median peak is reported (default 3)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md as it is")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    big = args.size != "chargpt"
    args.steps = args.steps if args.steps is not None else (10 if big else 500)
    args.rounds = args.rounds if args.rounds is not None else (10 if big else 30)
    args.inner = args.inner if args.inner is not None else (1 if big else 3)
    if args.memory_of:
        return memory_of(args)
    if big:
        return large(args)

    t0 = time.time()
    module = fdsl_module()
    ids = corpus()
    params = sum(p.numel() for p in Reference().parameters())
    print("examples/chargpt.fd: %d parameters, %d characters of README.md; codegen %.1f s"
          % (params, len(ids), time.time() - t0), flush=True)
    lines = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    say("Run of %s UTC, torch %s, %s, one thread (`python bench/training.py%s`)."
        % (datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"), torch.__version__,
           platform.processor() or platform.machine(), " " + " ".join(argv or sys.argv[1:]) if (argv or sys.argv[1:])
           else ""))
    say()
    say("| dtype | Adam steps | batch | first loss | last loss | largest relative difference of the loss, any step |")
    say("|---|---|---|---|---|---|")
    for dtype, name in ((torch.float64, "float64"), (torch.float32, "float32")):
        a, b, diff = agreement(module, ids, dtype, args.steps, args.batch)
        say("| %s | %d | %d | %.6f / %.6f | %.6f / %.6f | %.2e |" % (name, args.steps, args.batch, a[0], b[0], a[-1],
                                                                     b[-1], diff))
    say()
    say("(fdsl / autograd for the losses.) One float32 training step (zero_grad, forward, backward, Adam%s), "
        "%d rounds of %d steps, interleaved; milliseconds a step, the median round (the best one in brackets):"
        % (" with foreach=True" if args.foreach else " with fused=True" if args.fused else "", args.rounds,
           args.inner))
    say()
    say("| batch | mode | fdsl ms | autograd ms | fdsl / autograd, median (best) | aten calls fdsl / autograd | "
        "matrix products fdsl / autograd | page faults a step fdsl / autograd |")
    say("|---|---|---|---|---|---|---|---|")
    for batch in (8, 64):
        t, counted = timing(module, ids, batch, args.rounds, args.inner, args.compile, args.foreach or None,
                            args.fused or None)
        (cf, pf, ff), (ca, pa, fa) = counted["fdsl"], counted["autograd"]

        def row(mode, ours, theirs, rest):
            say("| %d | %s | %.2f (%.2f) | %.2f (%.2f) | **%.2f** (%.2f) | %s |" % (
                batch, mode, t[ours][0] * 1e3, t[ours][1] * 1e3, t[theirs][0] * 1e3, t[theirs][1] * 1e3,
                t[ours][0] / t[theirs][0], t[ours][1] / t[theirs][1], rest))

        row("eager", "fdsl", "autograd", "%d / %d | %d / %d | %.0f / %.0f" % (cf, ca, pf, pa, ff, fa))
        if args.compile:
            row("torch.compile", "fdsl compiled", "autograd compiled", " | |")
    print("%.0f s in all" % (time.time() - t0))
    if not args.no_write:
        write(lines)
    return 0


def write(lines, size="chargpt"):
    """The lines into BENCHMARKS.md between the markers of ``size`` (a section of its own when new)."""
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text()
    begin, end = MARK_BEGIN, MARK_END
    title = "Training a character-level GPT (issue 21)"
    if size != "chargpt":
        begin, end = (m.replace("bench/training.py:", "bench/training.py --size %s:" % size) for m in (begin, end))
        title = "Training %s (issue 29)" % LARGE[size][1]
    block = begin + "\n" + "\n".join(lines) + "\n" + end
    if begin in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n## %s\n\n" % title + block + "\n"
    path.write_text(text)
    print("wrote %s" % path.relative_to(ROOT))


if __name__ == "__main__":
    sys.exit(main())
