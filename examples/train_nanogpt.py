"""Train examples/nanogpt.fd (nanoGPT's shakespeare_char model) on a text, as nanoGPT's train.py does.

    python examples/train_nanogpt.py --data input.txt              # nanoGPT's settings: batch 64, 5000 steps
    python examples/train_nanogpt.py --data input.txt --device cuda --dtype bfloat16
    python examples/train_nanogpt.py --data input.txt --out out-nanogpt --resume --steps 6000

The program (``--program``, default examples/nanogpt.fd) declares ``const X, Y : n x v onehot``
and ``w = -d(L)`` with L the next-character cross-entropy summed over the n positions. Its torch
module is generated once through fdsl's API (as ``fdsl codegen PROGRAM --form w --target torch``
writes it) and cached in the output folder under a hash of the program and of fdsl's code
generator; n and v are read off the program's declaration of X.

What it does, step for step as nanoGPT's data/shakespeare_char/prepare.py and train.py:

- the vocabulary is the sorted distinct characters of the text (a text with more than v of them
  is refused, exit 2); the first 90% of the text trains, the rest validates;
- a batch is ``--batch`` random windows of n characters (X) and the characters after them (Y),
  as ids; the loss is the Model's summed loss divided by batch x n, nanoGPT's mean;
- weights start as nanoGPT's ``_init_weights`` starts them, by printed name: matrices normal with
  std 0.02, the output projections of the attention and the MLP (O, W2) 0.02/sqrt(2 x blocks),
  biases 0, layer norm gains (g1, g2, gf) 1;
- AdamW with decay groups (weight decay 0.1 on the parameters of two or more dimensions only,
  betas (0.9, 0.99)), a learning rate warmed up linearly then decayed on a cosine from 1e-3 to
  1e-4, gradients clipped to norm 1.0;
- every ``--eval-interval`` steps and at the end, the mean loss of ``--eval-iters`` batches of
  each split under ``torch.no_grad()`` (the generated sweep forward alone), and a checkpoint
  (``ckpt.pt`` in ``--out``: the Model's ``state_dict()`` by printed name, the optimiser's, the
  step, the vocabulary), written to a temporary file and moved into place; ``--resume`` goes on
  from it;
- ``--dtype bfloat16`` runs the Model's steps under ``torch.autocast(device_type,
  dtype=torch.bfloat16)`` with float32 weights, as nanoGPT's ``ctx``;
- a loss that is not finite stops the run (exit 1).

The sample at the end. The Model computes the loss, not logits, so the script generates a second,
forward-only module from the same program: the argument Z of ``logsoftmax`` in L (the logits,
``ln(gpt(6), gf, bf) E^t`` here), lowered by fdsl's code generator to torch (the same lowering as
the gradients: an embedding lookup for ``X E``, the heads stacked). It is called with the
Model's parameters and one window of n ids, and gives the n x v logits of it. Characters are drawn
one at a time as nanoGPT's sample.py draws them (temperature 0.8, top-k 200): the window is the
last n characters, or the characters so far padded on the right when fewer (the attention is
causal, so row t of the logits sees positions up to t alone, as nanoGPT's shorter input), and the
next character comes from row t. One forward of one window (batch 1) a character, with no
gradient: the sweep's forward alone.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if (ROOT / "fdsl" / "__init__.py").exists():
    sys.path.insert(0, str(ROOT))  # run from a checkout: its fdsl

GAINS = ("g1", "g2", "gf")  # layer norm gains: start at 1
PROJECTIONS = ("O", "W2")  # the residual projections (nanoGPT's c_proj): std 0.02/sqrt(2 x blocks)


class Stop(Exception):
    """A reason to stop: its message is printed, its code is the exit status."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


# ---- the program and its modules -------------------------------------------------------------


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # torch.compile looks its globals up by the module's name
    spec.loader.exec_module(module)
    return module


def _generator_hash() -> str:
    """A hash of fdsl's code generator, so that a cached module is remade when the generator changes."""
    import fdsl.codegen

    h = hashlib.sha256()
    for path in sorted(Path(fdsl.codegen.__file__).parent.glob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def modules(program_path: str, form: str, out: Path):
    """(the training module, the logits module or None, n, v), generated into ``out`` once."""
    from fdsl.base.errors import FdslError
    from fdsl.calculus.gradients import loss_of
    from fdsl.codegen.generated import gradients_source
    from fdsl.codegen.lowering import Lowering
    from fdsl.core.terms import postorder
    from fdsl.lang.program import load

    try:
        text = Path(program_path).read_bytes()
    except OSError as e:
        raise Stop("%s: cannot read: %s" % (program_path, e.strerror or e))
    key = hashlib.sha256(text + form.encode() + _generator_hash().encode()).hexdigest()[:16]
    main_path, logits_path = out / ("model-%s.py" % key), out / ("logits-%s.py" % key)
    try:
        program = load(program_path)
        if form not in program.definitions:
            raise Stop("%s has no definition of %s (--form)" % (program_path, form))
        w = program[form]
        loss = loss_of(w)
        if loss is None or not loss.scalar:
            raise Stop("%s: %s is not -d(L) for a loss L" % (program_path, form))
        data = {}
        for t in postorder(loss):
            if t.op == "sym" and t.data[0].kind == "const" and t.data[0].value is None:
                data[t.data[0].printed()] = t
        if sorted(data) != ["X", "Y"] or not all(t.data[0].onehot for t in data.values()):
            raise Stop("%s: the loss must read the characters as 'const X, Y : n x v onehot' (it reads %s)"
                       % (program_path, ", ".join(sorted(data)) or "no data"))
        n, v = (program.dims.get(side, side) for side in data["X"].shape)
        logits = next((t.args[0] for t in postorder(loss) if t.op == "logsoftmax"), None)
        if not main_path.exists():
            source = gradients_source(program.normal_form(w), program.dims, "form %s of %s" % (form, program_path),
                                      "torch", loss=loss)
            _write(main_path, source)
        if logits is not None and not logits_path.exists():
            source = Lowering({"logits": logits}, program.dims, "torch").source(
                "The logits of %s (the argument of logsoftmax in its loss), for sampling.\n" % program_path)
            _write(logits_path, source)
    except FdslError as e:
        raise Stop(str(e))
    module = _import(main_path, "fdsl_nanogpt_" + key)
    sampler = _import(logits_path, "fdsl_nanogpt_logits_" + key) if logits is not None else None
    return module, sampler, int(n), int(v)


def _write(path: Path, text) -> None:
    """Write ``text`` (or bytes) to ``path`` through a temporary file, moved into place at once."""
    tmp = path.with_name(path.name + ".tmp%d" % os.getpid())
    if isinstance(text, str):
        tmp.write_text(text)
    else:
        tmp.write_bytes(text)
    os.replace(tmp, path)


# ---- the text ---------------------------------------------------------------------------------


def prepare(text: str, v: int):
    """(characters, train ids, val ids) as nanoGPT's prepare.py: the sorted distinct characters,
    the first 90% of the text for training."""
    import torch

    chars = sorted(set(text))
    if len(chars) > v:
        raise Stop("the text has %d distinct characters, more than the program's vocabulary v = %d: give a "
                   "program with a larger v, or a text with fewer characters" % (len(chars), v))
    stoi = {ch: i for i, ch in enumerate(chars)}
    ids = torch.tensor([stoi[ch] for ch in text], dtype=torch.long)
    cut = int(0.9 * len(ids))
    return chars, ids[:cut], ids[cut:]


def get_batch(data, n: int, batch: int, generator, device):
    """``batch`` random windows of n ids and the ids after them, (batch, n) each, as nanoGPT's."""
    import torch

    ix = torch.randint(len(data) - n, (batch,), generator=generator)
    x = torch.stack([data[i:i + n] for i in ix.tolist()])
    y = torch.stack([data[i + 1:i + 1 + n] for i in ix.tolist()])
    return x.to(device), y.to(device)


# ---- the model and its optimiser ---------------------------------------------------------------


def base_name(name: str) -> str:
    """A printed weight name without its indices: ``W2_3`` -> ``W2``, ``bq_0_1`` -> ``bq``."""
    parts = name.split("_")
    while len(parts) > 1 and parts[-1].isdigit():
        parts.pop()
    return "_".join(parts)


def init_weights(model) -> None:
    """nanoGPT's initialisation, by printed name (see the module doc)."""
    import torch

    blocks = len({name for name, _ in model.named_weights() if base_name(name) == "W1"}) or 1
    with torch.no_grad():
        for name, p in model.named_weights():
            base = base_name(name)
            if base in GAINS:
                p.fill_(1.0)
            elif p.dim() < 2:
                p.zero_()
            elif base in PROJECTIONS:
                p.normal_(0.0, 0.02 / math.sqrt(2 * blocks))
            else:
                p.normal_(0.0, 0.02)


def configure_optimizer(model, weight_decay: float, lr: float, betas, device_type: str):
    """nanoGPT's configure_optimizers: AdamW, weight decay on parameters of two or more dimensions
    only; fused on a GPU."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    extra = {"fused": True} if device_type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=lr, betas=betas, **extra)


def get_lr(it: int, lr: float, min_lr: float, warmup: int, decay: int) -> float:
    """nanoGPT's get_lr: linear warmup, then cosine decay to min_lr, then min_lr."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay:
        return min_lr
    ratio = (it - warmup) / max(1, decay - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def _context(device_type: str, dtype_name: str):
    import contextlib

    import torch

    if dtype_name == "bfloat16":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def mean_loss(model, x, y):
    """nanoGPT's loss, the mean over the tokens: the Model's summed loss over batch x n."""
    return model(X=x, Y=y) / x.numel()


def train_step(model, opt, x, y, lr: float, grad_clip: float, ctx) -> float:
    """One step of nanoGPT's loop: the learning rate set, the mean loss and its gradient (under
    ``ctx``), the gradient clipped to norm ``grad_clip`` (0: not), AdamW's step; the loss. A
    loss that is not finite is returned before the step, the weights untouched."""
    import torch

    for group in opt.param_groups:
        group["lr"] = lr
    with ctx():
        loss = mean_loss(model, x, y)
    value = float(loss.detach())
    if not math.isfinite(value):
        return value
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return value


def estimate_loss(model, splits: dict, n, batch, iters, generator, device, ctx):
    """The mean loss of ``iters`` batches of each split, under torch.no_grad (estimate_loss)."""
    import torch

    out = {}
    with torch.no_grad():
        for split, data in splits.items():
            total = 0.0
            for _ in range(iters):
                x, y = get_batch(data, n, batch, generator, device)
                with ctx():
                    total += float(mean_loss(model, x, y))
            out[split] = total / iters
    return out


# ---- the sample ---------------------------------------------------------------------------------


def sample(sampler, module, model, start, count: int, n: int, vocab: int, generator, temperature=0.8, top_k=200):
    """``count`` ids after ``start`` (a list of ids), drawn from the logits module (module doc);
    only the first ``vocab`` ids are drawn (the text's characters, when it has fewer than v)."""
    import torch

    weights = {name: module._declared(name, p.detach()) for name, p in model.named_weights()}
    device = next(model.parameters()).device
    out = list(start)
    with torch.no_grad():
        for _ in range(count):
            window = out[-n:]
            t = len(window)
            ids = torch.tensor(window + [0] * (n - t), dtype=torch.long, device=device)
            logits = sampler.grads(dict(weights, X=ids))["logits"][t - 1, :vocab].double() / temperature
            if top_k is not None and top_k < logits.numel():
                kth = torch.topk(logits, top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            p = torch.softmax(logits, dim=-1).cpu()
            out.append(int(torch.multinomial(p, 1, generator=generator)))
    return out[len(start):]


# ---- progress ------------------------------------------------------------------------------------


class Bar:
    """A progress bar on stderr: redrawn in place on a terminal, a line every ``every`` steps and at
    the end otherwise (a log keeps its lines)."""

    def __init__(self, first: int, last: int, every: int = 10, stream=None):
        self.first, self.last, self.every = first, last, max(1, every)
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.time()

    def update(self, it: int, loss: float, lr: float) -> None:
        done = it + 1
        if not self.tty and done % self.every and done != self.last:
            return
        frac = (done - self.first) / max(1, self.last - self.first)
        bar = "#" * int(20 * frac) + "." * (20 - int(20 * frac))
        per = (time.time() - self.t0) / max(1, done - self.first)
        line = "[%s] %d/%d loss %.4f lr %.2e %.0f ms/step" % (bar, done, self.last, loss, lr, per * 1e3)
        self.stream.write(("\r" + line) if self.tty else (line + "\n"))
        if self.tty and done == self.last:
            self.stream.write("\n")
        self.stream.flush()


# ---- the run ---------------------------------------------------------------------------------------


def _shown(path: str) -> str:
    """A path as printed: relative to the working folder when it is below it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--program", default=str(ROOT / "examples" / "nanogpt.fd"), help="the .fd program")
    ap.add_argument("--form", default="w", help="its form w = -d(L)")
    ap.add_argument("--data", default=str(ROOT / "examples" / "shakespeare.txt"),
                    help="the text to train on (at most v distinct characters)")
    ap.add_argument("--out", default="out-nanogpt", help="the folder of the checkpoint and the generated modules")
    ap.add_argument("--resume", action="store_true", help="go on from OUT/ckpt.pt")
    ap.add_argument("--steps", type=int, default=5000, help="train up to this step (nanoGPT's max_iters)")
    ap.add_argument("--batch", type=int, default=64, help="windows a step")
    ap.add_argument("--lr", type=float, default=1e-3, help="the peak learning rate")
    ap.add_argument("--min-lr", type=float, default=1e-4, help="the learning rate at the end of the decay")
    ap.add_argument("--warmup", type=int, default=None, help="warmup steps (default 100, or a tenth of --steps "
                    "when that is less)")
    ap.add_argument("--decay-steps", type=int, default=None, help="the cosine's length (default --steps)")
    ap.add_argument("--weight-decay", type=float, default=0.1, help="AdamW's decay, on matrices only")
    ap.add_argument("--beta2", type=float, default=0.99)
    ap.add_argument("--grad-clip", type=float, default=1.0, help="clip the gradient's norm to this (0: no clipping)")
    ap.add_argument("--eval-interval", type=int, default=250, help="estimate the losses and save every N steps")
    ap.add_argument("--eval-iters", type=int, default=200, help="batches of each split per estimate")
    ap.add_argument("--log-interval", type=int, default=10, help="a progress line every N steps off a terminal")
    ap.add_argument("--sample", type=int, default=500, help="characters to generate at the end (0: none)")
    ap.add_argument("--start", default="\n", help="the text the sample starts from")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=200)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float64"), default="float32",
                    help="bfloat16: the steps under torch.autocast, the weights float32")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's choice)")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except Stop as e:
        print("train_nanogpt: %s" % e, file=sys.stderr)
        return e.code


def run(args) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise Stop("--device cuda: no GPU here (torch.cuda.is_available() is False)")
    for flag in ("steps", "batch", "eval_iters", "eval_interval"):
        if getattr(args, flag) < 1:
            raise Stop("--%s must be at least 1" % flag.replace("_", "-"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    module, sampler, n, v = modules(args.program, args.form, out)
    try:
        text = Path(args.data).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise Stop("%s: cannot read as UTF-8 text: %s" % (args.data, e))
    chars, train, val = prepare(text, v)
    if len(val) <= n or len(train) <= n:
        raise Stop("%s is too short: %d characters, and each tenth must hold more than a window of n = %d"
                   % (args.data, len(text), n))
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    device_type = args.device
    ctx = (lambda: _context(device_type, args.dtype))
    dtype = torch.float64 if args.dtype == "float64" else torch.float32  # the weights' (master) dtype
    model = module.Model(dtype=dtype, generator=generator)  # drawn on the CPU, then moved
    init_weights(model)
    model.to(args.device)
    opt = configure_optimizer(model, args.weight_decay, args.lr, (0.9, args.beta2), device_type)
    warmup = args.warmup if args.warmup is not None else min(100, args.steps // 10)
    decay = args.decay_steps if args.decay_steps is not None else args.steps
    ckpt = out / "ckpt.pt"
    first, best = 0, float("inf")
    if args.resume:
        if not ckpt.exists():
            raise Stop("--resume: %s does not exist" % ckpt)
        state = torch.load(ckpt, map_location=args.device, weights_only=True)
        if state["chars"] != chars:
            raise Stop("--resume: %s was trained on another vocabulary than %s's" % (ckpt, args.data))
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as e:
            raise Stop("--resume: %s does not fit %s: %s" % (ckpt, args.program, str(e).splitlines()[0]))
        opt.load_state_dict(state["optimizer"])
        first, best = state["iter_num"], state["best_val_loss"]
        generator.set_state(state["rng"])
        print("resuming from step %d of %s" % (first, ckpt))
    params = sum(p.numel() for p in model.parameters())
    print("%s: %d parameters, context %d, vocabulary %d (%d characters used); %s: %d characters"
          % (_shown(args.program), params, n, v, len(chars), _shown(args.data), len(text)), flush=True)
    print("ready in %.1f s" % (time.time() - t0), file=sys.stderr)

    def evaluate_and_save(it):
        nonlocal best
        losses = estimate_loss(model, {"train": train, "val": val}, n, args.batch, args.eval_iters, generator,
                               args.device, ctx)
        print("step %d: train loss %.4f, val loss %.4f" % (it, losses["train"], losses["val"]), flush=True)
        best = min(best, losses["val"])
        if it == 0:
            return
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": it, "best_val_loss": best,
                 "chars": chars, "rng": generator.get_state(), "program": str(args.program)}
        tmp = ckpt.with_name("ckpt.pt.tmp%d" % os.getpid())
        torch.save(state, tmp)
        os.replace(tmp, ckpt)  # a crash leaves the last checkpoint whole

    if first >= args.steps:
        print("nothing to do: the checkpoint is at step %d, --steps is %d" % (first, args.steps))
    else:
        if first == 0:
            evaluate_and_save(0)  # as nanoGPT: the losses at the start (no checkpoint of them)
        bar = Bar(first, args.steps, args.log_interval)
        for it in range(first, args.steps):
            lr = get_lr(it, args.lr, args.min_lr, warmup, decay)
            x, y = get_batch(train, n, args.batch, generator, args.device)
            try:
                value = train_step(model, opt, x, y, lr, args.grad_clip, ctx)
            except RuntimeError as e:
                if args.dtype != "bfloat16" or it > first:
                    raise
                raise Stop("the generated module does not run under torch.autocast here (%s): train in float32"
                           % str(e).splitlines()[0], 1)
            if not math.isfinite(value):
                print("%strain_nanogpt: the loss is %s at step %d: stopping (lower --lr, or check the data)"
                      % ("\n" if bar.tty else "", value, it), file=sys.stderr)
                return 1
            bar.update(it, value, lr)
            if (it + 1) % args.eval_interval == 0 or it + 1 == args.steps:
                evaluate_and_save(it + 1)
    if args.sample > 0:
        if sampler is None:
            print("(no sample: the loss of %s has no logsoftmax to read logits from)" % args.program)
            return 0
        stoi = {ch: i for i, ch in enumerate(chars)}
        missing = sorted(set(args.start) - set(stoi))
        if missing:
            raise Stop("--start has characters the text does not: %s" % ", ".join(repr(c) for c in missing))
        start = [stoi[ch] for ch in args.start]
        ids = sample(sampler, module, model, start, args.sample, n, len(chars), generator, args.temperature, args.top_k)
        print("sample:")
        print(args.start + "".join(chars[i] for i in ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
