"""Issue 29 item 4: the generated torch module under ``torch.autocast`` (mixed precision).

Under autocast (CPU bfloat16 here; the code reads the state of the inputs' device type, so CUDA's
bfloat16 and float16 take the same path) the sweep's matrix products run in the autocast dtype and
everything else (softmax, log-softmax, layer norm and the loss with their statistics, the sums of
gradients over the batch) in float32, the weights and their gradients float32: the loss and the
gradients agree with autograd's under the same autocast to bfloat16's precision, on the character
GPT of examples/chargpt.fd (bench/training.py's reference, one-hot data) and on a shrunk
examples/nanogpt.fd (ids, layer norms with gains alone, a tied embedding) against the same model
written the nanoGPT way. Outside autocast nothing changes (float64 under autocast is float64, as torch's autocast
leaves it), and the dtype rules of the module doc hold: a bfloat16 input computes in bfloat16,
never in float64.
"""

from __future__ import annotations

import functools
import re
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import fdsl  # noqa: E402
from fdsl.calculus.gradients import loss_of  # noqa: E402
from fdsl.codegen import generated as codegen  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BF16 = torch.bfloat16
PRODUCTS = {"mm", "bmm", "addmm", "baddbmm", "matmul", "addbmm", "dot", "mv"}
# the calls that move or cast a product's operands or its result (or allocate it), computing nothing
LAYOUT = {"new_empty", "empty", "_to_copy", "view", "_unsafe_view", "expand", "clone", "t", "transpose",
          "reshape", "_reshape_alias", "as_strided", "permute", "unsqueeze", "squeeze", "detach", "alias",
          "copy_", "split", "split_with_sizes", "select", "slice", "unflatten"}
LOSS_TOL = 3e-2  # relative, bfloat16 has 8 bits of mantissa (unit roundoff 4e-3)
COSINE = 0.999  # of all the gradients, side by side


@pytest.fixture(scope="module")
def bench():
    """bench/training.py (chargpt's reference written the nanoGPT way) and chargpt's torch module
    (as tests/test_model_params.py's fixture)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import training
    finally:
        sys.path.pop(0)
    return training, training.fdsl_module(None)


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten calls under it, each as (name, the dtypes of its floating tensor arguments)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = torch.utils._pytree.tree_leaves((args, kwargs))
        dtypes = {x.dtype for x in flat if torch.is_tensor(x) and x.is_floating_point()}
        self.calls.append((func._schema.name.split("::")[-1], dtypes))
        return func(*args, **kwargs)


def _flat(grads) -> torch.Tensor:
    return torch.cat([g.reshape(-1).double() for g in grads])


def _agree(loss, grads, want_loss, want_grads):
    """The loss to LOSS_TOL, the gradients side by side to COSINE and their norm to LOSS_TOL."""
    assert abs(float(loss) - float(want_loss)) <= LOSS_TOL * abs(float(want_loss)), (float(loss), float(want_loss))
    got, want = _flat(grads), _flat(want_grads)
    cosine = float(F.cosine_similarity(got, want, 0))
    assert cosine >= COSINE, cosine
    assert abs(float(got.norm()) / float(want.norm()) - 1) <= LOSS_TOL


def _step(module, x, y, autocast=True):
    """(loss, the gradients in the reference's layout) of one forward and backward of ``module``
    (bench's FdslStep or Reference) under CPU bfloat16 autocast."""
    for p in module.parameters():
        p.grad = None
    with torch.autocast("cpu", dtype=BF16, enabled=autocast):
        loss = module(x, y)
    loss.backward()
    return loss.detach(), [p.grad for p in module.parameters()]


def _reference_layout(training, model):
    """fdsl's gradients laid out as the reference's parameters (the weights' copy, of the grads)."""
    ref = training.Reference()
    grads = type("Grads", (), {"named_weights": lambda self: [(n, p.grad) for n, p in model.named_weights()]})()
    training.copy_weights(grads, ref)
    return [p.detach() for p in ref.parameters()]


def test_chargpt_under_autocast_agrees_with_autograd_to_bfloat16(bench):
    training, m = bench
    ours, ref = training.pair(m, torch.float32)
    x, y = next(training.batches(training.corpus(), 4, 1, seed=0))
    want_loss, want = _step(ref, x, y)
    loss, _ = _step(ours, x, y)
    assert loss.dtype == torch.float32 == want_loss.dtype
    assert {p.dtype for p in ours.parameters()} == {torch.float32}  # float32 master weights
    assert {p.grad.dtype for p in ours.parameters()} == {torch.float32}
    got = _reference_layout(training, ours.model)
    _agree(loss, got, want_loss, want)
    # in bfloat16, not float32: the gradients differ from the float32 step's by more than float32's
    # roundoff (the loss at the start, gains 1 and biases 0, is near log(v) per position whatever
    # the products' precision: it need not)
    exact_loss, exact = _step(ours, x, y, autocast=False)
    assert float((_flat(got) - _flat(_reference_layout(training, ours.model))).norm()) > 1e-4 * float(
        _flat(exact).norm())


def _float32_step(bench, autocast):
    """(the model, its data, the aten calls of one forward and backward) of chargpt in float32,
    under CPU bfloat16 autocast or not."""
    training, m = bench
    ours, _ = training.pair(m, torch.float32)
    x, y = next(training.batches(training.corpus(), 2, 1, seed=3))
    X, Y = training.one_hot(x, torch.float32), training.one_hot(y, torch.float32)
    ops = _Ops()
    with ops:
        with torch.autocast("cpu", dtype=BF16, enabled=autocast):
            loss = ours.model(X=X, Y=Y)
        loss.backward()
    return ours, (X, Y), ops


def test_products_run_in_bfloat16_and_the_rest_in_float32(bench):
    _, _, ops = _float32_step(bench, True)
    products = [dtypes for name, dtypes in ops.calls if name in PRODUCTS]
    assert len(products) >= 20 and all(dtypes == {BF16} for dtypes in products), products
    others = [(name, dtypes) for name, dtypes in ops.calls if name not in PRODUCTS | LAYOUT]
    assert all(dtypes <= {torch.float32} for _, dtypes in others), [c for c in others if c[1] - {torch.float32}]
    names = {name for name, _ in others}
    assert {"_log_softmax", "native_layer_norm", "native_layer_norm_backward", "_softmax", "gelu"} <= names


def test_outside_autocast_the_products_stay_in_float32(bench):
    ours, (X, Y), ops = _float32_step(bench, False)
    assert {d for name, dtypes in ops.calls for d in dtypes} == {torch.float32}
    plain = [p.grad.clone() for p in ours.parameters()]
    ours.zero_grad()
    ours.model(X=X, Y=Y).backward()  # outside autocast altogether: the same numbers
    assert all(torch.equal(p.grad, g) for p, g in zip(ours.parameters(), plain))


def test_float64_under_autocast_is_float64_as_torch_leaves_it(bench):
    training, m = bench
    ours, _ = training.pair(m, torch.float64)
    x, y = next(training.batches(training.corpus(), 2, 1, seed=4))
    X, Y = training.one_hot(x, torch.float64), training.one_hot(y, torch.float64)
    plain = ours.model(X=X, Y=Y)
    plain.backward()
    plain = plain.detach()
    want = [p.grad.clone() for p in ours.parameters()]
    ours.zero_grad()
    with torch.autocast("cpu", dtype=BF16):
        loss = ours.model(X=X, Y=Y)
    loss.backward()
    assert loss.dtype == torch.float64 and float(loss.detach()) == float(plain)
    assert all(torch.equal(p.grad, g) for p, g in zip(ours.parameters(), want))


# ---- examples/nanogpt.fd shrunk: ids, no biases (nanoGPT's bias=False), the tied embedding -------

BLOCKS, HEADS, N, V, D, K, FF = 2, 2, 8, 11, 16, 8, 32


@functools.lru_cache(maxsize=None)
def _nanogpt_module():
    """The torch module of examples/nanogpt.fd shrunk to BLOCKS blocks of HEADS heads and the dims above."""
    text = (ROOT / "examples" / "nanogpt.fd").read_text()
    text = re.sub(r"^dim n = 256, v = 65, d = 384, k = 64, f = 1536",
                  "dim n = %d, v = %d, d = %d, k = %d, f = %d" % (N, V, D, K, FF), text, flags=re.M)
    text = text.replace("heads(i, 5, ", "heads(i, %d, " % (HEADS - 1)).replace("gpt(6)", "gpt(%d)" % BLOCKS)
    assert "heads(i, 5," not in text and "gpt(6)" not in text and "dim n = %d," % N in text
    p = fdsl.parse(text)
    w = p["w"]
    return types.SimpleNamespace(**codegen.compile_namespace(codegen.gradients_source(
        p.normal_form(w), p.dims, "test", "torch", loss=loss_of(w))))


def _nanogpt(W, x, y):
    """examples/nanogpt.fd written as nanoGPT's model.py writes it with bias=False (c_attn's rows the
    heads' Q, K, V, one nn.Linear: mm), on the weights W by printed name (rows 1-D)."""
    b, n = x.shape
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
    h = F.embedding(x, W["E"]) + W["P"]
    for i in range(BLOCKS):
        a = F.layer_norm(h, (D,), W["g1_%d" % i])
        weight = torch.cat([W["%s_%d_%d" % (m, i, j)] for m in "QKV" for j in range(HEADS)], 0)
        q, k, v = F.linear(a, weight).split(HEADS * K, dim=2)
        q, k, v = (z.view(b, n, HEADS, K).transpose(1, 2) for z in (q, k, v))
        att = ((q @ k.transpose(-2, -1)) * K ** -0.5).masked_fill(mask, float("-inf")).softmax(dim=-1)
        out = (att @ v).transpose(1, 2).reshape(b, n, HEADS * K)
        proj = torch.cat([W["O_%d_%d" % (i, j)] for j in range(HEADS)], 0)
        h = h + F.linear(out, proj.T)
        a = F.layer_norm(h, (D,), W["g2_%d" % i])
        h = h + F.linear(F.gelu(F.linear(a, W["W1_%d" % i].T)), W["W2_%d" % i].T)
    logits = F.linear(F.layer_norm(h, (D,), W["gf"]), W["E"])
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), reduction="sum")


def test_nanogpt_on_ids_under_autocast_agrees_with_autograd_to_bfloat16():
    m = _nanogpt_module()
    model = m.Model(dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, V, (3, N), generator=g) for _ in range(2))
    weights = {name: p.detach().clone().requires_grad_() for name, p in model.named_weights()}

    def reference(autocast):
        with torch.autocast("cpu", dtype=BF16, enabled=autocast):
            loss = _nanogpt(weights, x, y)
        return loss.detach(), torch.autograd.grad(loss, list(weights.values()))

    def ours(autocast):
        model.zero_grad()
        with torch.autocast("cpu", dtype=BF16, enabled=autocast):
            loss = model(X=x, Y=y)
        loss.backward()
        return loss.detach(), [p.grad for _, p in model.named_weights()]

    loss32, grads32 = ours(False)  # the reference is the model: float32 to float32's roundoff
    want32, wgrads32 = reference(False)
    assert abs(float(loss32) - float(want32)) <= 1e-5 * abs(float(want32))
    assert float((_flat(grads32) - _flat(wgrads32)).norm()) <= 1e-5 * float(_flat(wgrads32).norm())
    loss, grads = ours(True)
    want, wgrads = reference(True)
    assert loss.dtype == torch.float32 and {gr.dtype for gr in grads} == {torch.float32}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    _agree(loss, grads, want, wgrads)
    assert float(loss) != float(loss32)  # bfloat16 products, not float32 ones


# ---- the dtype rules --------------------------------------------------------------------------


def test_bfloat16_inputs_compute_in_bfloat16_never_in_float64():
    m = _nanogpt_module()
    model = m.Model(dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(2)
    x, y = (torch.randint(0, V, (2, N), generator=g) for _ in range(2))
    values = {name: p.detach().reshape(m.SHAPES[name]) for name, p in model.named_weights()}  # rows 1 x d
    _, want = m.grads_and_loss(dict(values, X=x, Y=y))
    low = {name: v.to(BF16) for name, v in values.items()}
    ops = _Ops()
    with ops:
        grads, loss = m.grads_and_loss(dict(low, X=x, Y=y))
    assert loss.dtype == BF16 and {gr.dtype for gr in grads.values()} == {BF16}
    assert torch.float64 not in {d for _, dtypes in ops.calls for d in dtypes}
    assert abs(float(loss) - float(want)) <= LOSS_TOL * abs(float(want))
    # mixed with float32: torch's promotion, float32; under autocast float32 with bfloat16 products
    mixed = dict(values, E=low["E"], X=x, Y=y)
    assert m.grads_and_loss(mixed)[1].dtype == torch.float32
    with torch.autocast("cpu", dtype=BF16):
        grads, loss = m.grads_and_loss(dict(low, X=x, Y=y))
    assert loss.dtype == torch.float32 and {gr.dtype for gr in grads.values()} == {torch.float32}
    # a bfloat16 Model trains as torch trains one: its gradients bfloat16
    model16 = m.Model(dtype=BF16, generator=torch.Generator().manual_seed(0))
    model16(X=x, Y=y).backward()
    assert {p.grad.dtype for p in model16.parameters()} == {BF16}
