"""fdsl.codegen.remade: an elementwise value the forward reads and the backward reads again (an MLP's
gelu(U), read by the next product and by its weight's gradient) is made again from U in a traced
graph, so torch.compile's graph does not keep it to the backward; run eagerly it is the same array.
Both ways the loss and gradients are those of the module without the pass (float64, to 1e-12), and
the traced graph holds the operator twice, once without it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import fdsl  # noqa: E402
from fdsl.calculus.gradients import loss_of  # noqa: E402
from fdsl.codegen import lowering  # noqa: E402
from fdsl.codegen.generated import compile_namespace, gradients_source  # noqa: E402

PROGRAM = """
dim n = 5, d = 3, h = 7
const X : n x d, Y : n x d
weight W1 : d x h, W2 : h x d, V1 : d x h, V2 : h x d
H := X + %s(X W1) W2
E := Y - %s(H V1) V2
w = form(E)
"""


def _program(op="gelu"):
    return fdsl.parse(PROGRAM % (op, op))


def _source(p):
    w = p["w"]
    return gradients_source(p.normal_form(w), p.dims, "test", "torch", loss=loss_of(w))


def _batch(seed):
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(2, 5, 3, generator=g, dtype=torch.float64) for name in ("X", "Y")}


def _traced(module, data):
    """(the loss, the gradients by name, the FX graphs dynamo traced) of a Model of ``module``
    compiled with a backend that records the graphs and runs them as traced."""
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    model = module["Model"](generator=torch.Generator().manual_seed(0)).double()
    torch._dynamo.reset()
    loss = torch.compile(model, backend=backend)(**data)
    loss.backward()
    return float(loss.detach()), {name: p.grad.clone() for name, p in model.named_weights()}, graphs


def _eager(module, data):
    model = module["Model"](generator=torch.Generator().manual_seed(0)).double()
    loss = model(**data)
    loss.backward()
    return float(loss.detach()), {name: p.grad.clone() for name, p in model.named_weights()}


def _agree(*results, off):
    """Each (loss, gradients) is the pass-off module's to 1e-12."""
    off_loss, off_grads = off
    for loss, grads in results:
        assert abs(loss - off_loss) <= 1e-12 * abs(off_loss)
        for name, g in off_grads.items():
            assert float((grads[name] - g).abs().max()) <= 1e-12 * max(1.0, float(g.abs().max())), name


def _gelus(graphs) -> int:
    return sum(1 for gm in graphs for node in gm.graph.nodes if node.op == "call_function"
               and getattr(node.target, "__name__", "") == "gelu")


@pytest.mark.parametrize("op", ["gelu", "tanh"])
def test_the_backwards_reads_are_of_a_remade_value_and_only_those(op):
    """Each layer's f(X W) is remade once, for its weight's gradient; the forward reads it as made
    (the IR is checked after every pass: tests/conftest.py sets FDSL_CHECK_IR)."""
    seen = []
    real = lowering.remade_in_backward

    def spy(sweep, loss, kept):
        real(sweep, loss, kept)
        seen.append([op for op in sweep.ops if op.kind == "remade"])

    with pytest.MonkeyPatch.context() as m:
        m.setattr(lowering, "remade_in_backward", spy)
        body = _source(_program(op)).split("def grads_and_loss")[1]
    (remade,) = seen
    assert len(remade) == 2 and all(r.attrs["op"] == op for r in remade)
    assert body.count("if torch.compiler.is_compiling() else") == 2


def test_a_traced_graph_makes_gelu_again_and_the_gradients_agree(monkeypatch):
    p = _program()
    data = _batch(1)
    module = compile_namespace(_source(p))
    loss, grads, graphs = _traced(module, data)
    assert _gelus(graphs) == 4  # two layers: the forward's and the backward's
    eager_loss, eager_grads = _eager(module, data)
    monkeypatch.setattr(lowering, "remade_in_backward", lambda sweep, loss, kept: None)
    source = _source(p)
    assert "is_compiling() else" not in source.split("def grads_and_loss")[1]
    off_loss, off_grads, off_graphs = _traced(compile_namespace(source), data)
    assert _gelus(off_graphs) == 2
    _agree((loss, grads), (eager_loss, eager_grads), off=(off_loss, off_grads))


def test_nothing_is_remade_without_a_loss_or_where_the_forward_alone_reads_it():
    p = _program()
    w = p["w"]
    grads_only = gradients_source(p.normal_form(w), p.dims, "test", "torch")
    assert "is_compiling() else" not in grads_only.split("def grads")[1]
    # E := Y - gelu(X W): gelu(X W) is read by the forward's product and by W2's gradient, but
    # with W1 given (not a weight) nothing in the backward reads X W again: gelu is not remade
    q = fdsl.parse("""
dim n = 5, d = 3, h = 7
const X : n x d, Y : n x d, W1 : d x h
weight W2 : h x d
E := Y - gelu(X W1) W2
w = form(E)
""")
    assert "is_compiling() else" not in _source(q).split("def grads_and_loss")[1]


ATTENTION = """
dim n = 8, d = 6, k = 3
const X : n x d, Y : n x d
const M : n x n = causal
scalar s = k^(-1/2)
weight Q, K, V : d x k, O : k x d
Z := X + a(s X Q K^t X^t + M) X V O
E := Y - Z
w = form(E)
"""


def _softmaxes(graphs) -> int:
    return sum(1 for gm in graphs for node in gm.graph.nodes if node.op == "call_function"
               and getattr(node.target, "__name__", "") == "softmax")


def test_an_attentions_probabilities_are_made_again_for_the_backward(monkeypatch):
    """P = softmax(s X Q K^t X^t + M), read by the forward's P X V and by the backward's two
    products with it: a traced graph makes it again from the query and key stacks (a second
    softmax), eagerly it is the one kept; the gradients are the module's without the pass."""
    p = fdsl.parse(ATTENTION)
    data = {name: torch.randn(2, 8, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
            for name in ("X", "Y")}
    source = _source(p)
    body = source.split("def grads_and_loss")[1]
    assert body.count("_causal_softmax(") == 2 and "_causal_softmax(" in body.split("is_compiling() else")[0]
    module = compile_namespace(source)
    loss, grads, graphs = _traced(module, data)
    assert _softmaxes(graphs) == 2
    eager_loss, eager_grads = _eager(module, data)
    monkeypatch.setattr(lowering, "remade_in_backward", lambda sweep, loss, kept: None)
    off_loss, off_grads, off_graphs = _traced(compile_namespace(_source(p)), data)
    assert _softmaxes(off_graphs) == 1
    _agree((loss, grads), (eager_loss, eager_grads), off=(off_loss, off_grads))
