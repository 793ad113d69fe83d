"""Issue 29 item 3: the generated torch ``Model`` keeps PyTorch's conventions. Every weight is a
parameter of its own under its printed name (``named_parameters()``, ``state_dict()`` and
``load_state_dict()`` by those names), shaped as torch shapes its own (a row weight, a bias or a
gain, 1-D; a scalar weight 0-d), so parameter groups work: AdamW with decay on the weights of two
or more dimensions only trains the character GPT of examples/chargpt.fd as the same model written
the nanoGPT way does (bench/training.py's reference, float64, weights after 10 steps to 1e-10)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import fdsl  # noqa: E402
from fdsl.calculus.gradients import loss_of  # noqa: E402
from fdsl.codegen import generated as codegen  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _module(text: str):
    """The namespace of the torch module of ``w`` in the program ``text``."""
    p = fdsl.parse(text)
    w = p["w"]
    return codegen.compile_namespace(codegen.gradients_source(p.normal_form(w), p.dims, "test", "torch",
                                                              loss=loss_of(w)))


@pytest.fixture(scope="module")
def bench():
    """bench/training.py (the chargpt reference written the nanoGPT way) and the generated module of
    examples/chargpt.fd."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import training
    finally:
        sys.path.pop(0)
    return training, training.fdsl_module(None)


def _decay_groups(model, decay):
    """nanoGPT's groups: decay on the parameters of two or more dimensions, none on the others."""
    params = list(model.parameters())
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def test_named_parameters_are_the_weights_by_printed_name(bench):
    training, m = bench
    model = m.Model(generator=torch.Generator().manual_seed(0))
    named = dict(model.named_parameters())
    assert list(named) == list(m.WEIGHTS) == list(model.state_dict())
    assert len(m.WEIGHTS) == 53 and "Q_0_1" in named
    for name, p in named.items():
        declared = m.SHAPES[name]
        want = declared[1:] if declared[0] == 1 else declared  # a row is 1-D, as torch's biases
        assert tuple(p.shape) == want, (name, tuple(p.shape), declared)
        assert p is model.weight(name) is dict(model.named_weights())[name]
    assert tuple(named["Q_0_1"].shape) == (48, 12) and tuple(named["g1_0"].shape) == (48,)
    assert tuple(named["E"].shape) == (96, 48) and tuple(named["c1_1"].shape) == (192,)
    assert model.gradients() is None
    x, y = next(training.batches(training.corpus(), 2, 1, seed=0))
    model(X=training.one_hot(x, torch.float64), Y=training.one_hot(y, torch.float64)).backward()
    grads = model.gradients()
    assert list(grads) == list(m.WEIGHTS)
    assert all(grads[name] is p.grad and p.grad.shape == p.shape for name, p in named.items())


def test_the_state_dict_round_trips_by_name(bench, tmp_path):
    training, m = bench
    x, y = next(training.batches(training.corpus(), 3, 1, seed=5))
    X, Y = training.one_hot(x, torch.float64), training.one_hot(y, torch.float64)
    first = m.Model(generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(_decay_groups(first, 0.1), lr=1e-2)
    first(X=X, Y=Y).backward()
    opt.step()  # weights that are no model's initial ones
    torch.save(first.state_dict(), tmp_path / "ckpt.pt")
    second = m.Model(generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = float(first(X=X, Y=Y))
        assert float(second(X=X, Y=Y)) != want
        second.load_state_dict(torch.load(tmp_path / "ckpt.pt"))
        assert float(second(X=X, Y=Y)) == want
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
    with pytest.raises(RuntimeError, match="Missing key"):
        m.Model().load_state_dict({k: v for k, v in first.state_dict().items() if k != "U"})


def test_adamw_with_decay_on_matrices_only_trains_as_nanogpt(bench):
    # both sides group by p.dim() >= 2: fdsl's biases and gains are 1-D, as nn.Linear's and
    # nn.LayerNorm's; AdamW's decay and moments are entrywise, so fdsl's per-head Q, K, V and the
    # reference's fused QKV take the same steps
    training, m = bench
    ours, ref = training.pair(m, torch.float64)
    model = ours.model
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())
    groups = _decay_groups(model, 0.1)
    assert {p.numel() for p in groups[1]["params"]} == {48, 192}  # gains and biases only
    opts = [torch.optim.AdamW(_decay_groups(mod, 0.1), lr=1e-2, betas=(0.9, 0.95)) for mod in (ours, ref)]
    for x, y in training.batches(training.corpus(), 4, 10, seed=1):
        losses = []
        for mod, opt in zip((ours, ref), opts):
            opt.zero_grad(set_to_none=True)
            loss = mod(x, y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        assert abs(losses[0] - losses[1]) <= 1e-10 * abs(losses[1]), losses
    trained = training.Reference().to(torch.float64)
    training.copy_weights(model, trained)  # fdsl's weights after 10 steps, laid out as the reference's
    for (name, got), want in zip(trained.named_parameters(), ref.parameters()):
        err = float((got - want).detach().abs().max()) / float(want.detach().abs().max())
        assert err <= 1e-10, (name, err)
    # the groups matter: decay on the rows too (a 1 x d matrix taken for a 2-D weight) moves away
    other, _ = training.pair(m, torch.float64)
    opt = torch.optim.AdamW(other.model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    for x, y in training.batches(training.corpus(), 4, 10, seed=1):
        opt.zero_grad(set_to_none=True)
        other(x, y).backward()
        opt.step()
    assert float((other.model.weight("b1_0") - model.weight("b1_0")).detach().abs().max()) > 1e-6


SCALAR = """
dim n = 4, d = 3
const X : n x d, Y : n x d, C : n x 1 = ones
weight W : d x d, g : scalar, b : 1 x d
E := Y - g X W - C b
w = form(E)
"""


def test_scalar_weights_are_0d_parameters():
    ns = _module(SCALAR)
    model = ns["Model"](generator=torch.Generator().manual_seed(0))
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes == {"W": (3, 3), "b": (3,), "g": ()}, shapes
    g = torch.Generator().manual_seed(1)
    X, Y = (torch.randn(2, 4, 3, generator=g, dtype=torch.float64) for _ in range(2))
    loss = model(X=X, Y=Y)
    loss.backward()
    ref = {name: p.detach().clone().requires_grad_(True) for name, p in model.named_parameters()}
    want = 0.5 * ((Y - ref["g"] * X @ ref["W"] - ref["b"]) ** 2).sum()
    want.backward()
    assert abs(float(loss.detach()) - float(want.detach())) <= 1e-12 * float(want.detach())
    for name, p in model.named_parameters():
        assert p.grad.shape == p.shape, name
        assert float((p.grad - ref[name].grad).abs().max()) <= 1e-12 * float(ref[name].grad.abs().max()), name
    # a 0-d value, a 1 x 1 one (as value files allow) and a number are all the scalar weight
    for given in (torch.tensor(0.25), torch.tensor([[0.25]]), 0.25):
        other = ns["Model"]({"g": given, "W": model.W.detach(), "b": model.b.detach().reshape(1, 3)})
        assert other.g.shape == () and float(other.g.detach()) == 0.25 and other.b.shape == (3,)
    with pytest.raises(ValueError, match="W has shape"):
        ns["Model"]({"W": torch.zeros(2, 3)})
    torch.optim.AdamW(model.parameters(), lr=0.1, fused=True).step()  # 0-d parameters in a fused step


def test_a_name_torch_nn_module_uses_itself_gets_an_underscore():
    ns = _module("dim n = 3, k = 2\nconst X : n x k, Y : n x k\nweight training, to, to_, state : k x k\n"
                 "E := Y - X training to to_ state\nw = form(E)\n")
    model = ns["Model"](generator=torch.Generator().manual_seed(0))
    assert sorted(n for n, _ in model.named_parameters()) == ["state", "to_", "to__", "training_"]
    assert sorted(n for n, _ in model.named_weights()) == ["state", "to", "to_", "training"]
    assert model.weight("to") is model.to__ and model.weight("to_") is model.to_
    model.eval()
    assert model.training is False and model.to(torch.float32) is model
    x = torch.ones(3, 2)
    model(X=x, Y=x).backward()
    assert sorted(model.gradients()) == ["state", "to", "to_", "training"]


# programs whose sweep makes or reads numbers: a learned scalar (a temperature), a trace of one
# example's matrices, a scalar operator's value, a power of a scalar weight
NUMBERS = {
    "a learned scalar": SCALAR,
    "a trace of one example": """
dim n = 4, d = 3
const X : n x d, Y : n x d
weight W : d x d, V : d x d
E := Y - trace(X^t X W) X V
w = form(E)
""",
    "a scalar operator and a power": """
dim n = 4, d = 3
const X : n x d, Y : n x d
weight W : d x d, t : scalar
E := Y - exp(t^2 trace(W)) X W
w = form(E)
""",
}


def test_torch_compile_traces_the_sweep_once():
    """The module's constants (here C = ones) are made inside a traced graph, not stored by its first
    call: stored, they would change what the graph was traced against, and the second step would
    trace the whole sweep again (a second graph, held with the first)."""
    ns = _module(SCALAR.replace(", g : scalar", "").replace("g X W", "X W"))
    model = ns["Model"](generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    X, Y = (torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(k), dtype=torch.float64) for k in (1, 2))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            opt.zero_grad()
            compiled(X=X, Y=Y).backward()
            opt.step()
    assert ns["_CONSTANTS"] == {}  # (made in the graph each step)
    model(X=X, Y=Y)
    assert list(ns["_CONSTANTS"]) == [(torch.float64, torch.device("cpu"))]  # eager: made once


@pytest.mark.parametrize("batch", [None, 2])
@pytest.mark.parametrize("program", sorted(NUMBERS))
def test_torch_compile_keeps_the_sweeps_numbers_in_the_graph(program, batch):
    """A number the sweep reads or makes (a scalar weight, a trace of one example, a scalar
    operator's value) stays a 0-d tensor in a traced graph: read out as a Python number, it broke
    the graph and dynamo specialised the rest on its value, a recompile at every step that changed
    it. Three SGD steps compiled trace once and train as the eager Model does (float64, 1e-12)."""
    ns = _module(NUMBERS[program])
    model = ns["Model"](generator=torch.Generator().manual_seed(0))
    eager = ns["Model"]({name: p.detach().clone() for name, p in model.named_weights()})
    compiled = torch.compile(model, backend="aot_eager")
    lead = () if batch is None else (batch,)
    X, Y = (0.3 * torch.randn(*lead, 4, 3, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
            for k in (1, 2))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        _sgd_side_by_side(model, compiled, eager, X, Y, 3)
    for (name, a), b in zip(model.named_parameters(), eager.parameters()):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14), name


def _sgd_side_by_side(model, compiled, eager, X, Y, steps):
    """``steps`` SGD steps of the compiled Model and of the eager one, their losses equal at each
    (float64, 1e-12)."""
    opts = [torch.optim.SGD(m.parameters(), lr=1e-2) for m in (model, eager)]
    for _ in range(steps):
        losses = []
        for m, opt in zip((compiled, eager), opts):
            opt.zero_grad()
            loss = m(X=X, Y=Y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        assert abs(losses[0] - losses[1]) <= 1e-12 * abs(losses[1]), losses


def test_torch_compile_trains_the_model():
    ns = _module(SCALAR)
    model = ns["Model"](generator=torch.Generator().manual_seed(0))
    eager = ns["Model"]({name: p.detach() for name, p in model.named_weights()})
    compiled = torch.compile(model, backend="aot_eager")  # dynamo and AOTAutograd; inductor takes 30 s here
    g = torch.Generator().manual_seed(2)
    X, Y = (torch.randn(2, 4, 3, generator=g, dtype=torch.float64) for _ in range(2))
    _sgd_side_by_side(model, compiled, eager, X, Y, 2)
    for (name, a), b in zip(model.named_parameters(), eager.parameters()):
        assert a.shape == b.shape and torch.allclose(a.grad, b.grad, rtol=1e-12, atol=0), name
        assert torch.allclose(a, b, rtol=1e-12, atol=0), name
