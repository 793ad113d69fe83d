"""Train the character-level GPT of examples/chargpt.fd on the repository's README, with PyTorch on
fdsl's closed-form gradients, and print a sample of what it writes.

    fdsl codegen examples/chargpt.fd --form w --target torch -o chargpt_torch.py
    python examples/train_chargpt.py chargpt_torch.py --steps 2000           # CPU, a few minutes
    python examples/train_chargpt.py chargpt_torch.py --device cuda --batch 64

``w = -d(L)`` with L the next-character cross-entropy, so the generated module's ``Model`` is the
loss summed over the positions and the batch, and its backward is fdsl's gradient (``FdslLoss``).
Characters are printable ASCII and newline (96 of them; anything else reads as ``?``), one-hot.
The sample is drawn one character at a time from the softmax of the logits, which the script
computes from the trained weights with plain torch (the module computes the loss, not logits).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VOCAB, CONTEXT = 96, 32


def load(path: str):
    spec = importlib.util.spec_from_file_location("fdsl_chargpt_torch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def encode(text: str) -> list:
    return [95 if ch == "\n" else (ord(ch) - 32 if 32 <= ord(ch) < 127 else ord("?") - 32) for ch in text]


def decode(ids) -> str:
    return "".join("\n" if i == 95 else chr(int(i) + 32) for i in ids)


def logits(W: dict, x, torch):
    """The logits of examples/chargpt.fd at the weights W for one window of one-hot characters x."""
    F = torch.nn.functional
    n = x.shape[0]
    mask = torch.triu(torch.full((n, n), float("-inf"), dtype=x.dtype, device=x.device), 1)

    def ln(z, g, b):
        return F.layer_norm(z, z.shape[-1:], eps=1e-5) * g + b

    z = x @ W["E"] + W["P"][:n]
    blocks = sum(1 for name in W if name.startswith("W1_"))
    heads = sum(1 for name in W if name.startswith("Q_0_"))
    for i in range(blocks):
        h = ln(z, W["g1_%d" % i], W["b1_%d" % i])
        for j in range(heads):
            q, k, v = (h @ W["%s_%d_%d" % (m, i, j)] for m in "QKV")
            att = torch.softmax(q @ k.T * k.shape[1] ** -0.5 + mask, dim=-1)
            z = z + att @ v @ W["O_%d_%d" % (i, j)]
        h = ln(z, W["g2_%d" % i], W["b2_%d" % i])
        z = z + F.gelu(h @ W["W1_%d" % i] + W["c1_%d" % i]) @ W["W2_%d" % i] + W["c2_%d" % i]
    return ln(z, W["gf"], W["bf"]) @ W["U"]


def main(argv=None) -> int:
    import torch
    from tqdm import tqdm

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", help="the module 'fdsl codegen examples/chargpt.fd --form w --target torch' wrote")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch", type=int, default=32, help="windows of 32 characters per step")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--text", default=str(ROOT / "README.md"), help="what to train on (default: the README)")
    parser.add_argument("--sample", type=int, default=300, help="characters to generate at the end")
    parser.add_argument("--weight-decay", type=float, default=0.0,
                        help="AdamW's decay, on the matrices only (biases and gains are 1-D), as nanoGPT's")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    m = load(args.module)
    dtype, device = getattr(torch, args.dtype), torch.device(args.device)
    g = torch.Generator().manual_seed(args.seed)
    model = m.Model(dtype=dtype, generator=g).to(device)  # gains 1 and biases 0, as chargpt.fd declares them
    ids = torch.tensor(encode(Path(args.text).read_text(encoding="utf-8")), device=device)
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr)
    bar = tqdm(range(args.steps), desc="training", unit="step")
    for step in bar:
        starts = torch.randint(0, len(ids) - CONTEXT - 1, (args.batch,), generator=g).to(device)
        window = torch.stack([ids[s:s + CONTEXT + 1] for s in starts.tolist()])
        X = torch.nn.functional.one_hot(window[:, :-1], VOCAB).to(dtype)
        Y = torch.nn.functional.one_hot(window[:, 1:], VOCAB).to(dtype)
        opt.zero_grad(set_to_none=True)
        loss = model(X=X, Y=Y)
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            bar.set_postfix(loss="%.3f" % (float(loss.detach()) / (args.batch * CONTEXT)))  # per character
    W = dict(model.named_weights())
    with torch.no_grad():  # the logits written here are the model's: its loss from them, on the last window
        want = torch.nn.functional.cross_entropy(logits(W, X[0], torch), window[0, 1:], reduction="sum")
        got = model(X=X[:1], Y=Y[:1])
        assert abs(float(got) - float(want)) <= 1e-3 * abs(float(want)), (float(got), float(want))
    out = encode("## ")
    with torch.no_grad():
        for _ in range(args.sample):
            x = torch.nn.functional.one_hot(torch.tensor(out[-CONTEXT:], device=device), VOCAB).to(dtype)
            p = torch.softmax(logits(W, x, torch)[-1].double(), dim=-1)
            out.append(int(torch.multinomial(p.cpu(), 1, generator=g)))
    print(decode(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
