"""examples/gpt2.fd, GPT-2 small's shape (issue 28's code generation benchmark, bench/codegen.py):
it parses at full size, and a shrunk copy (2 blocks of 2 heads, width 8, context 4, vocabulary
11; tokens as ids) has the gradients of the same model written in torch (tests/test_transformer.py's torch_gpt),
through the numpy and the torch generated code. Float64; relative error at most 1e-8 of the
largest gradient."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from oracle import symbol_values
from test_transformer import _close, _grads, _tensors, _weights, torch_gpt

import fdsl
from fdsl.calculus.gradients import loss_of
from fdsl.codegen import generated as codegen
from fdsl.codegen import grads as numpy_grad

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent
SOURCE = (ROOT / "examples" / "gpt2.fd").read_text()
TOL = 1e-8


def shrunk(blocks: int, heads: int, n: int, v: int, d: int, k: int, f: int) -> str:
    """examples/gpt2.fd with ``blocks`` blocks of ``heads`` heads and the dims given."""
    text = re.sub(r"^dim n = 1024, v = 50257, d = 768, k = 64, f = 3072", "dim n = %d, v = %d, d = %d, k = %d, f = %d"
                  % (n, v, d, k, f), SOURCE, flags=re.M)
    text = text.replace("heads(i, 11, ", "heads(i, %d, " % (heads - 1)).replace("gpt(12)", "gpt(%d)" % blocks)
    assert text.count("dim n = %d," % n) == 1 and "heads(i, 11," not in text and "gpt(12)" not in text
    return text


def test_gpt2_parses_at_full_size():
    p = fdsl.parse(SOURCE, base_dir=ROOT / "examples")
    assert {x: p.dims[x] for x in "nvdkf"} == {"n": 1024, "v": 50257, "d": 768, "k": 64, "f": 3072}
    assert SOURCE.count("gpt(12)") == 1 and SOURCE.count("heads(i, 11, ") == 1  # what bench/codegen.py rewrites


def test_a_shrunk_gpt2_has_the_gradients_of_torch_autograd():
    blocks, heads, n, v, d, k, f = 2, 2, 4, 11, 8, 4, 16
    p = fdsl.parse(shrunk(blocks, heads, n, v, d, k, f) + "random 0\n", base_dir=ROOT / "examples")
    w = p["w"]
    names = _weights(p, w)
    # E P gf bf; per block g1 b1 g2 b2 c1 c2 W1 W2 bo, and per head Q K V O bq bk bv; no U (tied to E)
    assert len(names) == 4 + blocks * (9 + 7 * heads) and "U" not in names and "bv_1_1" in names, names
    values = symbol_values(p, p["L"])
    rng = np.random.default_rng(3)  # tokens: ids for fdsl (X, Y are declared onehot), one-hot rows for torch
    ids = {name: rng.integers(0, v, n) for name in ("X", "Y")}
    t = _tensors(dict(values, **{name: np.eye(v)[i] for name, i in ids.items()}))
    loss = torch_gpt(t, blocks, heads, k)  # gpt2.fd's, given its weights
    want = {name: -g for name, g in _grads(loss, t, names).items()}  # w = -d(L): -dL/dW
    values.update(ids)
    assert _close(numpy_grad.gradients(p, w, values), want) <= TOL
    nf = numpy_grad.normal_form(p, w)
    ns = codegen.compile_namespace(codegen.gradients_source(nf, p.dims, target="torch", loss=loss_of(w)))
    got, value = ns["grads_and_loss"]({name: torch.tensor(x) for name, x in values.items()})
    assert abs(float(value) - loss.item()) <= 1e-12 * abs(loss.item())
    assert _close({name: g.numpy() for name, g in got.items()}, want) <= TOL
