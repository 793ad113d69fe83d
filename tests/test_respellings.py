"""Issue 28's respellings: the same program makes the same aten calls per training step whatever
spells its attention scale, up to the ops that a learned temperature itself needs.

examples/gpt.fd and examples/chargpt.fd, each brought to one model (the scale s = k^(-1/2), no
temperature) and spelled four ways by editing its text:

    literal      the number in the head:          a(0.5 Z Q[i, j] K[i, j]^t Z^t + M) ...
    dims         an expression of dims:           scalar s = k^(-1/2)        (chargpt.fd as written)
    data         a scalar given with the data:    scalar s, and s = k ** -0.5 passed to the Model
    temperature  times a learned per-block scalar weight: weight tau[i] : scalar and a(tau[i] s Z ...)
                                                                             (gpt.fd as written)

For each, the torch module of ``fdsl codegen --target torch`` is generated and its Model takes one
training step, forward and backward, on a batch of two examples of random one-hot tokens in
float32 (the step a training loop repeats; the optimiser's step is left out: it sees one flat
parameter whichever the spelling). The aten calls of that step are counted below autograd with a
TorchDispatchMode (tests/test_training_loss.py's counter). The literal is the reference.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from test_training_loss import _Count

import fdsl
from fdsl.calculus.gradients import loss_of
from fdsl.codegen import generated as codegen

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("gpt.fd", "chargpt.fd")
SPELLINGS = ("literal", "dims", "data", "temperature")
BATCH = 2

# What a learned temperature may add, per block, counted from what it has to compute, not from
# what today's code does. Block i's scores are tau_i s q k^t + M for each head (q = Z Q, k = Z K),
# and
#     dL/dtau_i = s sum_heads <G, q k^t> = s sum_heads <G k, q>
# where G is the adjoint of the scores: the gradients of Q and K need G (the flipped aa of the
# scores' backward) anyway, and q k^t is the forward's product before its scale, so the
# temperature needs no matrix product of its own. With the heads of a block stacked, as the other
# spellings have them, its ops are these, whatever the number of heads (the runtime keeps a scalar
# of a batch as a (batch, 1, 1) array, and hands a gradient out shaped like its weight):
TEMPERATURE_OPS = {
    "read tau_i, a 0-d parameter of the Model, as a number (tau_i s is then a Python product)": 1,
    "multiply G by q k^t entry by entry (every head and example at once)": 1,
    "sum that product over the heads and the entries": 1,
    "keep each example's sum as a (batch, 1, 1) array, as every scalar of a batch is": 2,
    "scale it by s": 1,
    "the weight's 1 x 1 gradient: the sum over the batch, expanded to the weight's shape, copied": 3,
    "that gradient as the 0-d parameter's (a view)": 1,
    "autograd's AccumulateGrad gives it to the parameter (a detach, as for every parameter)": 1,
}
TEMPERATURE_PRODUCTS = 0  # matrix products: none (above)


def spelled(example: str, how: str) -> tuple:
    """(program text, blocks, k) of ``example`` spelled ``how``."""
    text = (ROOT / "examples" / example).read_text().split("g = backprop")[0]  # up to w = -d(L)

    def sub(pattern, repl):
        nonlocal text
        text, count = re.subn(pattern, repl, text, flags=re.M)
        assert count == 1, (example, how, pattern)

    k = int(re.search(r"^dim .*\bk = (\d+)", text, flags=re.M).group(1))
    blocks = int(re.search(r"ln\(gpt\((\d+)\), gf, bf\)", text).group(1))
    if "tau[i]" in text:  # one model: no temperature
        sub(r"^weight tau\[i\] : scalar.*\n", "")
        sub(r"a\(tau\[i\] s Z", "a(s Z")
    if how == "literal":
        sub(r"^scalar s = k\^\(-1/2\)\n", "")
        sub(r"a\(s Z", "a(%r Z" % k ** -0.5)
    elif how == "data":
        sub(r"^scalar s = k\^\(-1/2\)", "scalar s")
    elif how == "temperature":
        sub(r"^(weight gf)", r"weight tau[i] : scalar\n\1")
        sub(r"a\(s Z", "a(tau[i] s Z")
    return text, blocks, k


def count(example: str, how: str) -> tuple:
    """(the aten calls, the loss) of one warm forward and backward of the Model of ``example``
    spelled ``how``."""
    text, _, k = spelled(example, how)
    p = fdsl.parse(text, base_dir=ROOT / "examples")
    w = p["w"]
    ns = codegen.compile_namespace(codegen.gradients_source(p.normal_form(w), p.dims, target="torch",
                                                            loss=loss_of(w)))
    model = ns["Model"](dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    rng = np.random.default_rng(0)
    n, v = p.dims["n"], p.dims["v"]
    data = {name: torch.tensor(np.eye(v, dtype=np.float32)[rng.integers(0, v, (BATCH, n))]) for name in "XY"}
    if how == "data":
        data["s"] = k ** -0.5  # a number, as the generated docstring asks

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(**data)
        loss.backward()
        return float(loss.detach())

    step()  # warm
    with _Count() as c:
        loss = step()
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    return c, loss


@pytest.fixture(scope="module")
def counted() -> dict:
    return {(ex, how): count(ex, how) for ex in EXAMPLES for how in SPELLINGS}


@pytest.fixture(scope="module")
def counts(counted) -> dict:
    return {key: c for key, (c, _) in counted.items()}


def _table(counts: dict, example: str) -> str:
    return "; ".join("%s %d calls, %d products" % (how, sum(counts[example, how].counts.values()),
                                                   counts[example, how].products()) for how in SPELLINGS)


def test_the_spellings_are_the_programs_they_say():
    for example in EXAMPLES:
        written = (ROOT / "examples" / example).read_text()
        for how in SPELLINGS:
            text, blocks, _ = spelled(example, how)
            assert blocks == 2 and text.count("tau[i]") == (2 if how == "temperature" else 0)
            assert ("scalar s = k^(-1/2)" in text) == (how in ("dims", "temperature"))
            assert ("scalar s\n" in text) == (how == "data")
            p = fdsl.parse(text, base_dir=ROOT / "examples")
            assert "tau_1" in str(p.expr("L")) if how == "temperature" else "tau" not in str(p.expr("L"))
        assert ("tau[i] s Z" in written) == (example == "gpt.fd")  # gpt.fd has the temperature, chargpt.fd not


def test_the_spellings_without_a_temperature_compute_the_same_loss(counted):
    for example in EXAMPLES:  # the same weights (the Model's draw from one seed), the same tokens
        ref = counted[example, "literal"][1]
        for how in ("dims", "data"):
            assert abs(counted[example, how][1] - ref) <= 1e-5 * abs(ref), (example, how)


@pytest.mark.parametrize("how", ["dims", "data", "temperature"])
@pytest.mark.parametrize("example", EXAMPLES)
def test_a_respelled_scale_makes_the_same_aten_calls(counts, example, how):
    ref, got = counts[example, "literal"], counts[example, how]
    blocks = spelled(example, how)[1]
    allowed = blocks * sum(TEMPERATURE_OPS.values()) if how == "temperature" else 0
    allowed_products = blocks * TEMPERATURE_PRODUCTS if how == "temperature" else 0
    extra = sum(got.counts.values()) - sum(ref.counts.values())
    ops = {op: got.counts[op] - ref.counts[op] for op in sorted(set(got.counts) | set(ref.counts))
           if got.counts[op] != ref.counts[op]}
    why = "%s: %s; %s against the literal, by op: %s" % (example, _table(counts, example), how, ops)
    assert got.products() - ref.products() == allowed_products, why
    assert 0 <= extra <= allowed, why
