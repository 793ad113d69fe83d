"""nanoGPT's model, written as its ``model.py`` writes it, for the programs shaped as examples/nanogpt.fd.

The reference of bench/training.py (``--size shakespeare_char``, ``--size gpt2``) and of
tests/test_train_nanogpt.py: ``nn.Embedding`` for tokens and positions, per block a layer norm,
the fused query/key/value ``nn.Linear`` (``c_attn``, with its bias), causal attention by
``F.scaled_dot_product_attention(is_causal=True)`` as nanoGPT's flash path (or the explicit masked
softmax of its slow path), the output projection ``c_proj``, a layer norm and the GELU MLP
(``c_fc``, ``c_proj``), then a final layer norm and the unembedding tied to the token embedding,
under ``F.cross_entropy`` (nanoGPT's mean; ``reduction="sum"`` for fdsl's summed loss). No
dropout (fdsl's terms are deterministic).

Vocabulary
----------
config      (blocks, heads, width, head width, context, vocabulary, MLP width), read off a
            generated module's ``SHAPES`` by ``config_of``: E is vocabulary x width, P context x
            width, Q_i_j width x head width (or head width x width, nn.Linear's layout: ``linear``),
            W1_i width x MLP width; ``bias``: whether it has biases.
views       ``views(ref, config)``: the reference's weights as fdsl's printed names see them, each a
            view into a parameter of the reference (nn.Linear holds W^t; the heads of block i side
            by side in c_attn's rows, queries, then keys, then values), so weights copy both ways
            and compare by name.
"""

from __future__ import annotations

from collections import namedtuple

import torch
import torch.nn.functional as F
from torch import nn

Config = namedtuple("Config", "blocks heads width head context vocab mlp bias linear", defaults=(True, False))


def config_of(shapes: dict) -> Config:
    """The configuration of a program shaped as examples/nanogpt.fd, from its module's SHAPES (bias:
    whether it has nanoGPT's biases, ``bias=True``, or none, as nanoGPT's train.py trains)."""
    vocab, width = shapes["E"]
    blocks = sum(1 for name in shapes if name.startswith("W1_"))
    heads = sum(1 for name in shapes if name.startswith("Q_0_"))
    q = shapes["Q_0_0"]
    linear = q[1] == width and q[0] != width  # Q_i_j : k x d, as nn.Linear holds its weight
    return Config(blocks, heads, width, q[0] if linear else q[1], shapes["P"][0], vocab, shapes["W1_0"][1],
                  "bq_0_0" in shapes, linear)


class CausalSelfAttention(nn.Module):
    def __init__(self, c: Config, flash: bool = True):
        super().__init__()
        self.c, self.flash = c, flash
        self.c_attn = nn.Linear(c.width, 3 * c.heads * c.head, bias=c.bias)
        self.c_proj = nn.Linear(c.heads * c.head, c.width, bias=c.bias)
        self.register_buffer("mask", torch.triu(torch.ones(c.context, c.context, dtype=torch.bool), 1))

    def forward(self, x):
        b, t, _ = x.shape
        c = self.c
        q, k, v = self.c_attn(x).split(c.heads * c.head, dim=2)
        q, k, v = (z.view(b, t, c.heads, c.head).transpose(1, 2) for z in (q, k, v))
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * c.head ** -0.5
            y = att.masked_fill(self.mask[:t, :t], float("-inf")).softmax(dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c.heads * c.head))


class MLP(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c_fc = nn.Linear(c.width, c.mlp, bias=c.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(c.mlp, c.width, bias=c.bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c: Config, flash: bool = True):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.width, bias=c.bias)
        self.attn = CausalSelfAttention(c, flash)
        self.ln_2 = nn.LayerNorm(c.width, bias=c.bias)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT (dropout 0; its biases as ``c.bias``), ``forward(idx, targets)`` the loss."""

    def __init__(self, c: Config, flash: bool = True, reduction: str = "mean"):
        super().__init__()
        self.c, self.reduction = c, reduction
        self.wte = nn.Embedding(c.vocab, c.width)
        self.wpe = nn.Embedding(c.context, c.width)
        self.h = nn.ModuleList(Block(c, flash) for _ in range(c.blocks))
        self.ln_f = nn.LayerNorm(c.width, bias=c.bias)
        self.lm_head = nn.Linear(c.width, c.vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as nanoGPT's

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), reduction=self.reduction)


def configure_optimizer(model: nn.Module, weight_decay=0.1, lr=1e-3, betas=(0.9, 0.99), **kw):
    """nanoGPT's configure_optimizers: AdamW, decay on the parameters of two or more dimensions."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, **kw)


def views(ref: GPT, c: Config) -> dict:
    """fdsl's weights by printed name, each a view into the reference's parameters (see the module
    doc); a row weight (bias, gain) 1-D, as the generated Model holds it."""
    out = {"E": ref.wte.weight, "P": ref.wpe.weight, "gf": ref.ln_f.weight, "bf": ref.ln_f.bias}
    hk, inner = c.head, c.heads * c.head
    for i, block in enumerate(ref.h):
        w, b = block.attn.c_attn.weight, block.attn.c_attn.bias
        for j in range(c.heads):
            for part, (m, bias) in enumerate((("Q", "bq"), ("K", "bk"), ("V", "bv"))):
                rows = slice(part * inner + j * hk, part * inner + (j + 1) * hk)
                out["%s_%d_%d" % (m, i, j)] = w[rows] if c.linear else w[rows].T
                out["%s_%d_%d" % (bias, i, j)] = None if b is None else b[rows]
            out["O_%d_%d" % (i, j)] = block.attn.c_proj.weight[:, j * hk:(j + 1) * hk].T
        out["bo_%d" % i] = block.attn.c_proj.bias
        out["g1_%d" % i], out["b1_%d" % i] = block.ln_1.weight, block.ln_1.bias
        out["g2_%d" % i], out["b2_%d" % i] = block.ln_2.weight, block.ln_2.bias
        out["W1_%d" % i], out["c1_%d" % i] = block.mlp.c_fc.weight.T, block.mlp.c_fc.bias
        out["W2_%d" % i], out["c2_%d" % i] = block.mlp.c_proj.weight.T, block.mlp.c_proj.bias
    return {name: v for name, v in out.items() if v is not None}  # (bias=False: no biases)


def reference_of(model, flash: bool = True, reduction: str = "mean", dtype=None) -> GPT:
    """The reference with the weights of fdsl's generated ``Model`` (by printed name)."""
    shapes = {name: tuple(p.shape) for name, p in model.named_weights()}
    shapes = {name: (1,) + s if len(s) == 1 else s for name, s in shapes.items()}  # rows as 1 x d
    c = config_of(shapes)
    first = next(model.parameters())
    ref = GPT(c, flash, reduction).to(dtype=dtype or first.dtype, device=first.device)
    target = views(ref, c)
    with torch.no_grad():
        for name, p in model.named_weights():
            target[name].copy_(p.reshape(target[name].shape))
    return ref


def main(argv=None) -> int:
    """Print the parameters of nanoGPT's model at a configuration (default: shakespeare_char's)."""
    import argparse

    ap = argparse.ArgumentParser(description="nanoGPT's model as its model.py writes it (the reference of "
                                 "bench/training.py and tests/test_train_nanogpt.py): its parameters by name")
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--head", type=int, default=64, help="head width")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=65)
    args = ap.parse_args(argv)
    width = args.heads * args.head
    ref = GPT(Config(args.blocks, args.heads, width, args.head, args.context, args.vocab, 4 * width))
    for name, p in ref.named_parameters():
        print("%-28s %s" % (name, tuple(p.shape)))
    print("%d parameters" % sum(p.numel() for p in ref.parameters()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
