"""The kernel of the torch runtime's float32 products on a CPU (``_GEMM``, ``FDSL_MATMUL``): torch's
own through its BLAS, or oneDNN's matmul where that is the faster (on an AMD CPU MKL's sgemm takes
its generic code path, and oneDNN's is some 2x faster). Whichever runs, a product is A @ B to
float32's precision against float64 for every layout the sweep hands it (transposed, strided views
of a grouped product, a batch, a bias row, a residual added, a seed's alpha); a Model's gradients
agree between the two and with float64; float64, a tensor whose graph autograd records, and a
product too small to pay stay torch's; under torch.compile the product is one opaque op of the
traced graph. Each test that says "on oneDNN" counts the oneDNN op's calls, so it fails when the
runtime stops using it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import fdsl  # noqa: E402
from fdsl.calculus.gradients import loss_of  # noqa: E402
from fdsl.codegen.generated import compile_namespace, gradients_source  # noqa: E402

ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
needs_onednn = pytest.mark.skipif(not ONEDNN, reason="this torch build has no oneDNN matmul")

PROGRAM = """
dim n = 64, d = 64, f = 256, v = 32
const X : n x v onehot
const Y : n x v onehot
const C : n x 1 = ones
weight E : v x d, W1 : d x f, W2 : f x d, g : 1 x d
H := X E + gelu((layernorm(X E) * (C g)) W1) W2
L = -trace(Y^t logsoftmax(H E^t))
w = -d(L)
"""


@pytest.fixture(scope="module")
def module():
    p = fdsl.parse(PROGRAM)
    w = p["w"]
    return compile_namespace(gradients_source(p.normal_form(w), p.dims, "test", "torch", loss=loss_of(w)))


class _Calls(TorchDispatchMode):
    """The ops a computation dispatches, by name."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))

    def count(self, part: str) -> int:
        return sum(part in name for name in self.names)


def _on(module, library):
    module["_GEMM"][0] = library


@pytest.fixture(autouse=True)
def _restore(module):
    saved = module["_GEMM"][0]
    yield
    module["_GEMM"][0] = saved


def _rel(a, b) -> float:
    return float((a.double() - b).abs().max() / b.abs().max())


def _operand(shape, layout, g):
    """A float32 tensor of ``shape`` laid out as ``layout``: "c" contiguous, "t" the transpose of a
    contiguous one, "v" columns of a wider matrix (a grouped product's view)."""
    if layout == "t":
        return torch.randn(*shape[:-2], shape[-1], shape[-2], generator=g).mT
    if layout == "v":
        wide = torch.randn(*shape[:-1], 3 * shape[-1], generator=g)
        return wide[..., shape[-1]:2 * shape[-1]]
    return torch.randn(*shape, generator=g)


@needs_onednn
@pytest.mark.parametrize("la", ["c", "t", "v"])
@pytest.mark.parametrize("lb", ["c", "t", "v"])
@pytest.mark.parametrize("batch", [None, 3])
def test_a_product_on_onednn_is_a_times_b(module, la, lb, batch):
    _on(module, "onednn")
    g = torch.Generator().manual_seed(7)
    A = _operand((batch, 96, 80) if batch else (96, 80), la, g)
    B = _operand((80, 112), lb, g)
    exact = A.double() @ B.double()
    with _Calls() as calls:
        got = module["_matmul"](A, B)
    assert calls.count("mkldnn") == 1 and calls.count("aten.mm") == calls.count("aten.addmm") == 0
    assert got.shape == exact.shape and got.dtype == torch.float32
    assert _rel(got, exact) < 1e-5


@needs_onednn
def test_a_bias_a_residual_and_a_seed_are_added_as_torch_adds_them(module):
    _on(module, "onednn")
    g = torch.Generator().manual_seed(8)
    A, B = torch.randn(2, 96, 80, generator=g), torch.randn(112, 80, generator=g).mT
    row, residual = torch.randn(1, 112, generator=g), torch.randn(2, 96, 112, generator=g)
    product = A.double() @ B.double()
    cases = [
        (lambda: module["_addmm"](row, A, B), product + row.double()),
        (lambda: module["_addmm"](residual, A, B), product + residual.double()),
        (lambda: module["_addmm"](residual[0], A[0], B), product[0] + residual[0].double()),
        (lambda: module["_addmm"](residual[0].mT.contiguous().mT, A[0], B), product[0] + residual[0].double()),
        (lambda: module["_addmm"](row.expand(96, 112), A[0], B), product[0] + row.double()),
        (lambda: module["_product"](A[0], B, 0.25), 0.25 * product[0]),
        (lambda: module["_product"](A[0], B, torch.tensor(-3.0)), -3.0 * product[0]),
        (lambda: module["_matmul_total"](A.mT, A @ B, 2), (A.double().mT @ (A.double() @ B.double())).sum(0)),
    ]
    for make, exact in cases:
        residual_before = residual.clone()
        with _Calls() as calls:
            got = make()
        assert calls.count("mkldnn") == 1
        assert _rel(got, exact) < 1e-5
        assert torch.equal(residual, residual_before)  # (the residual is read, not written)


def test_what_stays_torchs_own(module):
    """float64, a product too small to pay for a call, and tensors whose graph autograd records
    (oneDNN's op has no derivative) are torch's products, whatever the library."""
    _on(module, "onednn")
    g = torch.Generator().manual_seed(9)
    big = torch.randn(96, 80, generator=g), torch.randn(80, 112, generator=g)
    small = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)
    W = big[1].clone().requires_grad_()
    for A, B in ((big[0].double(), big[1].double()), small):
        with _Calls() as calls:
            module["_matmul"](A, B)
        assert calls.count("mkldnn") == 0
    with _Calls() as calls:
        out = module["_matmul"](big[0], W)
    assert calls.count("mkldnn") == 0
    out.sum().backward()
    assert torch.allclose(W.grad, big[0].sum(0, keepdim=True).mT.expand(80, 112), rtol=1e-5)


def test_the_library_is_chosen_from_the_environment(module, monkeypatch):
    monkeypatch.setenv("FDSL_MATMUL", "blas")
    assert module["_gemm_library"]() == "blas"
    monkeypatch.setenv("FDSL_MATMUL", " oneDNN ")
    assert module["_gemm_library"]() == ("onednn" if ONEDNN else "blas")
    monkeypatch.setenv("FDSL_MATMUL", "auto")
    assert module["_gemm_library"]() in ("blas", "onednn")
    monkeypatch.setitem(module, "_GEMM_OP", False)  # (no oneDNN, or no custom op: an older torch)
    for choice in ("onednn", "auto"):
        monkeypatch.setenv("FDSL_MATMUL", choice)
        assert module["_gemm_library"]() == "blas"
    monkeypatch.setenv("FDSL_MATMUL", "fastest")
    with pytest.raises(ValueError, match="FDSL_MATMUL='fastest': expected one of auto, blas, onednn"):
        module["_gemm_library"]()


def test_the_probe_keeps_torchs_products_where_onednn_answers_wrong(module, monkeypatch):
    """The probe checks oneDNN's answer before timing it: an op that computes something else is
    never chosen, however fast."""
    monkeypatch.setitem(module, "_onednn_linear", lambda A, W, bias, other: torch.zeros(A.shape[0], W.shape[0]))
    assert module["_probe_gemm"]() == "blas"


def _step(module, library, dtype, seed=3):
    _on(module, library)
    model = module["Model"](generator=torch.Generator().manual_seed(0)).to(dtype)
    g = torch.Generator().manual_seed(seed)
    data = {"X": torch.randint(0, 32, (2, 64), generator=g), "Y": torch.randint(0, 32, (2, 64), generator=g)}
    with _Calls() as calls:
        loss = model(**data)
        loss.backward()
    return float(loss.detach()), {name: p.grad.double() for name, p in model.named_weights()}, calls


@needs_onednn
def test_a_models_gradients_agree_on_either_library(module):
    exact_loss, exact, calls64 = _step(module, "onednn", torch.float64)
    assert calls64.count("mkldnn") == 0  # float64 is torch's
    results = {lib: _step(module, lib, torch.float32) for lib in ("onednn", "blas")}
    assert results["onednn"][2].count("mkldnn") >= 6 and results["blas"][2].count("mkldnn") == 0
    for lib, (loss, grads, _) in results.items():
        assert abs(loss - exact_loss) <= 1e-5 * abs(exact_loss), lib
        for name, g in exact.items():
            assert float((grads[name] - g).abs().max()) <= 1e-4 * float(g.abs().max()), (lib, name)


def _compiled(module, backend=None):
    """The gradients of one float32 step of a Model under torch.compile (``backend``: its own,
    None: inductor), the products on oneDNN."""
    _on(module, "onednn")
    model = module["Model"](generator=torch.Generator().manual_seed(0)).float()
    g = torch.Generator().manual_seed(3)
    data = {"X": torch.randint(0, 32, (2, 64), generator=g), "Y": torch.randint(0, 32, (2, 64), generator=g)}
    torch._dynamo.reset()
    loss = (torch.compile(model, backend=backend) if backend else torch.compile(model))(**data)
    loss.backward()
    return {name: p.grad.double() for name, p in model.named_weights()}


def _agree(grads, eager):
    for name, g in eager.items():
        assert float((grads[name] - g).abs().max()) <= 1e-5 * float(g.abs().max()), name


@needs_onednn
def test_under_torch_compile_the_product_is_one_opaque_op_of_the_graph(module):
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    _, eager, _ = _step(module, "onednn", torch.float32)
    grads = _compiled(module, backend)
    ops = [str(node.target) for gm in graphs for node in gm.graph.nodes if node.op == "call_function"]
    assert sum("fdsl.onednn_linear" in op for op in ops) >= 6
    assert not any("_linear_pointwise" in op for op in ops)
    _agree(grads, eager)


@needs_onednn
# (the first test of a session to compile with inductor imports it, and inductor imports
# torch.utils.mkldnn, whose TorchScript class warns of torch.jit.script_method's deprecation)
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_inductor_compiles_the_product_and_the_step_agrees(module):
    """With torch.compile's own backend (inductor), which lowers oneDNN's op itself only for the
    constant weights of inference: the custom op is called as it stands."""
    _, eager, _ = _step(module, "onednn", torch.float32)
    _agree(_compiled(module), eager)


@needs_onednn
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_inductors_reordering_for_locality_moves_no_product(module, monkeypatch):
    """A product read by the graph's output alone (a weight's gradient) would be moved by
    inductor's reordering for locality to the end of the graph, keeping what it reads (a layer's
    activations) alive until then; read through a getitem, it stays where the sweep makes it."""
    from torch._inductor.fx_passes import post_grad

    moved = []
    real = post_grad.reorder_for_locality

    def spy(graph):
        def positions():
            return {n: i for i, n in enumerate(graph.nodes) if "onednn_linear" in str(n.target)}

        before = positions()
        real(graph)
        after = positions()
        moved.append((len(before), max(after[n] - i for n, i in before.items()) / len(graph.nodes)))

    monkeypatch.setattr(post_grad, "reorder_for_locality", spy)
    from torch._inductor import config  # (a graph compiled before, and cached, runs no pass)

    monkeypatch.setattr(config, "fx_graph_cache", False)
    monkeypatch.setattr(torch._functorch.config, "enable_autograd_cache", False)
    _, eager, _ = _step(module, "onednn", torch.float32)
    _agree(_compiled(module), eager)
    assert moved and all(count >= 6 for count, _ in moved)
    assert all(later < 0.05 for _, later in moved), moved  # (earlier, as their readers move, is fine)
