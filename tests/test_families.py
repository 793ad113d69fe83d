"""Issue 29: a generated Model holds the weights its sweep concatenates (a family: the heads' Q, K
and V of a block, their bias rows, the blocks of an output projection) as blocks of one tensor,
each weight still a parameter of its own under its printed name (fdsl.codegen.families). The
sweep's concatenations of them are then views (torch_runtime's ``_cat``), the weights' gradients
come out in the parameters' layout, and everything computes what the untied Model does."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fdsl.codegen import torch_runtime as rt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def m():
    """The generated module of examples/chargpt.fd (bench/training.py's)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import training
    finally:
        sys.path.pop(0)
    return training.fdsl_module(None)


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten calls made under it, counted by name."""

    def __init__(self):
        super().__init__()
        self.count = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


def _batch(m, seed=1):
    g = torch.Generator().manual_seed(seed)
    n, v = m.DATA["X"][0], m.SHAPES["E"][0]
    return {name: torch.randint(0, v, (3, n), generator=g) for name in ("X", "Y")} if m.DATA["X"] == (n,) else {
        name: torch.nn.functional.one_hot(torch.randint(0, v, (3, n), generator=g), v).double()
        for name in ("X", "Y")}


def _untied(m, monkeypatch, weights):
    """A Model of the same weights whose families are not held together."""
    monkeypatch.setitem(m.Model._tie.__globals__, "FAMILIES", ())
    try:
        return m.Model(weights)
    finally:
        monkeypatch.undo()


def test_the_families_are_the_concatenations_of_the_sweep(m):
    families = dict((names[0], (names, along)) for names, along in m.FAMILIES)
    qkv, along = families["Q_0_0"]
    assert along == "cols" and qkv == tuple("%s_0_%d" % (kind, j) for kind in "QKV" for j in range(4))
    o, along = families["O_0_0"]
    assert along == "rows" and o == tuple("O_0_%d" % j for j in range(4))
    every = [name for names, _ in m.FAMILIES for name in names]
    assert len(every) == len(set(every)) and set(every) <= set(m.WEIGHTS)


def test_a_model_holds_each_family_as_one_tensor_of_its_parameters(m):
    model = m.Model(generator=torch.Generator().manual_seed(0))
    given = {name: p.detach().clone() for name, p in model.named_weights()}
    assert list(dict(model.named_parameters())) == list(m.WEIGHTS)
    for names, along in m.FAMILIES:
        ps = [model.weight(name) for name in names]
        assert m._tied(ps, along), names
        if along == "cols" and ps[0].dim() == 2:  # each the transpose of a block of rows, as nn.Linear's
            assert ps[0].mT.is_contiguous() and not ps[0].is_contiguous()
        joined = rt._cat([p.detach() for p in ps], -1 if along == "cols" else -2)
        assert joined.data_ptr() == ps[0].data_ptr()  # a view, no copy
        assert torch.equal(joined, torch.cat([p.detach() for p in ps], -1 if along == "cols" else -2))
    # the values given are the values held
    again = m.Model(given)
    assert all(torch.equal(p, given[name]) for name, p in again.named_weights())


def test_a_step_concatenates_no_weight_and_computes_what_the_untied_model_does(m, monkeypatch):
    tied = m.Model(generator=torch.Generator().manual_seed(0))
    untied = _untied(m, monkeypatch, {name: p.detach() for name, p in tied.named_weights()})
    assert not m._tied([untied.weight(name) for name in m.FAMILIES[0][0]], m.FAMILIES[0][1])
    batch = _batch(m)
    counts = {}
    for name, model in (("tied", tied), ("untied", untied)):
        with _Ops() as ops:
            model(**batch).backward()
        counts[name] = ops.count["cat"]
    # each family concatenated in the forward and again, transposed, in the adjoint: copies of the
    # untied model's weights only
    assert counts["untied"] >= counts["tied"] + 2 * len(m.FAMILIES), counts
    for name, p in tied.named_weights():
        q = untied.weight(name)
        assert torch.allclose(p.grad, q.grad, rtol=1e-12, atol=1e-12), name
        assert p.grad.stride() == p.stride(), name  # the parameter's layout: put in .grad without a copy


def test_adamw_trains_the_tied_model_as_the_untied_one(m, monkeypatch):
    tied = m.Model(generator=torch.Generator().manual_seed(2))
    untied = _untied(m, monkeypatch, {name: p.detach() for name, p in tied.named_weights()})
    for model in (tied, untied):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
        for step in range(3):
            opt.zero_grad(set_to_none=True)
            model(**_batch(m, seed=step)).backward()
            opt.step()
    for name, p in tied.named_weights():
        assert torch.allclose(p, untied.weight(name), rtol=1e-12, atol=1e-12), name
    assert all(m._tied([tied.weight(n) for n in names], along) for names, along in m.FAMILIES)


def test_the_families_are_held_together_again_after_to_and_load_state_dict(m, tmp_path):
    model = m.Model(generator=torch.Generator().manual_seed(0))
    ids = [id(p) for p in model.parameters()]
    model.to(torch.float32)
    assert [id(p) for p in model.parameters()] == ids and model.weight("Q_0_0").dtype == torch.float32
    assert all(m._tied([model.weight(n) for n in names], along) for names, along in m.FAMILIES)
    torch.save(model.state_dict(), tmp_path / "w.pt")
    other = m.Model(dtype=torch.float32, generator=torch.Generator().manual_seed(9))
    other.load_state_dict(torch.load(tmp_path / "w.pt"))
    assert all(torch.equal(p, model.weight(name)) for name, p in other.named_weights())
    assert all(m._tied([other.weight(n) for n in names], along) for names, along in m.FAMILIES)


def test_neighbouring_blocks_are_joined_as_a_view_and_anything_else_copied():
    base = torch.arange(60.0).reshape(6, 10)
    rows = [base[0:2], base[2:3], base[3:6]]
    joined = rt._cat(rows, -2)
    assert joined.data_ptr() == base.data_ptr() and torch.equal(joined, base)
    cols = [base[:, 0:4], base[:, 4:10]]
    assert rt._cat(cols, -1).data_ptr() == base.data_ptr() and torch.equal(rt._cat(cols, -1), base)
    t = [x.mT for x in rows]  # blocks of rows read transposed: neighbouring columns
    assert rt._cat(t, -1).data_ptr() == base.data_ptr() and torch.equal(rt._cat(t, -1), base.mT)
    for xs, dim in (([base[2:3], base[0:2]], -2),  # out of order
                    ([base[0:2], base[3:6]], -2),  # a gap
                    ([base[0:2], base[2:4].clone()], -2)):  # another tensor
        got = rt._cat(xs, dim)
        assert torch.equal(got, torch.cat(xs, dim)) and got.data_ptr() != base.data_ptr()


def test_a_grouped_gradient_cut_by_columns_is_the_transpose_of_contiguous_blocks():
    g = torch.Generator().manual_seed(4)
    A, B = torch.randn(3, 5, 6, generator=g, dtype=torch.float64), torch.randn(3, 5, 8, generator=g,
                                                                                 dtype=torch.float64)
    parts = rt._split_total(A.mT, B, 3, 4, -1)
    want = (A.mT @ B).sum(0).chunk(4, -1)
    assert all(torch.allclose(p, w, rtol=1e-12, atol=1e-12) and p.mT.is_contiguous() for p, w in zip(parts, want))


def test_heads_given_as_rows_are_joined_as_one_view_and_transposed():
    # Q_j : k x d (nn.Linear's layout), the product A [Q_1^t ... Q_h^t]: with t=True the weights
    # go as they are, their join is a view of the family and its transpose the product's side
    g = torch.Generator().manual_seed(4)
    family = torch.randn(6 * 3, 8, generator=g, dtype=torch.float64)  # 3 kinds x 2 heads of k = 3
    Bs = [family[3 * i:3 * i + 3] for i in range(6)]
    bias = torch.randn(1, 18, generator=g, dtype=torch.float64)
    rows = [bias[:, 3 * i:3 * i + 3] for i in range(6)]
    A = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    for b in (None, rows):
        want = rt._grouped_heads(A, [B.mT for B in Bs], 2, bias=b)
        got = rt._grouped_heads(A, Bs, 2, bias=b, t=True)
        assert all(torch.equal(x, y) for x, y in zip(got, want))
    assert rt._cat(Bs, -2).data_ptr() == family.data_ptr()  # (the join: the family itself, no copy)
