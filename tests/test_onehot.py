"""Constants declared ``n x v onehot`` and given as ids (``fdsl.codegen.onehot``): the gradients and
the loss from ids equal those from the one-hot matrices (numpy and torch, one example and a batch,
float64 to 1e-12); each lowering rule leaves its op in the IR, so that switching it off fails here;
a use that only the one-hot matrix computes makes it from the ids (``onehot``), read by that use
alone; the located messages for ids out of range, non-integer ids and a matrix where ids are
declared; and no (n, v) one-hot tensor among the aten calls of a torch sweep."""

from __future__ import annotations

import numpy as np
import pytest
from test_codegen import import_module

import fdsl
from fdsl.base.errors import FdslError
from fdsl.calculus.gradients import gradient_terms, loss_of
from fdsl.cli import main
from fdsl.codegen import generated as codegen
from fdsl.codegen.lowering import Lowering
from fdsl.codegen.products import canon

EXACT = 1e-12
N, V, D = 5, 11, 3  # the vocabulary differs from every other size: an (n, v) array is the one-hot's shape

# a small language model: embedding, GELU, unembedding, next-token cross-entropy
LM = """dim n = %d, v = %d, d = %d
const X, Y : n x v%s
weight E : v x d, U : d x v
L = -trace(Y^t logsoftmax(gelu(X E) U))
w = -d(L)
""" % (N, V, D, "%s")


def lm(onehot: bool):
    return fdsl.parse(LM % (" onehot" if onehot else ""))


def source(p, target: str) -> str:
    w = p.normal_form(p["w"])
    return codegen.gradients_source(w, p.dims, "lm", target, None, loss_of(p["w"]))


def module(tmp_path, onehot: bool, target: str):
    path = tmp_path / ("lm_%s_%s.py" % ("ids" if onehot else "dense", target))
    path.write_text(source(lm(onehot), target))
    return import_module(path, path.stem)


def lowering(p, target="numpy") -> Lowering:
    w = p.normal_form(p["w"])
    low = Lowering(gradient_terms(w), p.dims, target, loss=loss_of(p["w"]))
    low.lower()
    return low


def draw(batch=None, seed=0):
    rng = np.random.default_rng(seed)
    lead = () if batch is None else (batch,)
    ids = {"X": rng.integers(0, V, lead + (N,)), "Y": rng.integers(0, V, lead + (N,))}
    weights = {"E": rng.standard_normal((V, D)), "U": rng.standard_normal((D, V))}
    return ids, weights


def one_hot(ids):
    return np.eye(V)[ids]


@pytest.mark.parametrize("target", ["numpy", "torch"])
@pytest.mark.parametrize("batch", [None, 4, 3000])  # 3000: numpy cuts it into pieces
def test_gradients_and_loss_from_ids_equal_those_from_one_hot_matrices(tmp_path, target, batch):
    if target == "torch":
        torch = pytest.importorskip("torch")
        convert = lambda d: {k: torch.as_tensor(v) for k, v in d.items()}  # noqa: E731
    else:
        convert = lambda d: d  # noqa: E731
    ids, weights = draw(batch)
    got, loss = module(tmp_path, True, target).grads_and_loss(convert({**ids, **weights}))
    want, want_loss = module(tmp_path, False, target).grads_and_loss(
        convert({**{k: one_hot(v) for k, v in ids.items()}, **weights}))
    assert abs(float(loss) - float(want_loss)) <= EXACT * abs(float(want_loss))
    for name in want:
        g, h = np.asarray(got[name]), np.asarray(want[name])
        assert g.shape == h.shape
        assert np.abs(g - h).max() <= EXACT * np.abs(h).max()


def test_each_rule_leaves_its_op_and_no_other_op_reads_ids():
    for target in ("numpy", "torch"):
        low = lowering(lm(True), target)
        kinds = [op.kind for op in low.sweep]
        # X E: a lookup; X^t G: a scatter summed over the batch; trace(Y^t logsoftmax(Z)): a gather;
        # Y - a(Z) rowsum(Y): 1 added at the ids
        assert kinds.count("lookup") == 1 and kinds.count("pick_sum") == 1 and kinds.count("add_ids") == 1
        scatter = [op for op in low.sweep if op.kind == "scatter"]
        assert len(scatter) == 1 and scatter[0].attrs.get("total")
        for op in low.sweep:
            if op.kind not in ("lookup", "scatter", "pick_sum", "add_ids"):
                assert not any(v.ids for v in op.values_read()), op
        # rowsum(Y) is a column of ones that multiplies nothing: no Hadamard product with it
        assert not [op for op in low.sweep if op.kind == "template" and op.attrs["op"] == "had"]
        assert not [op for op in low.sweep if op.kind == "sum_axis"]


def test_a_product_with_ids_on_the_right_is_the_transpose_of_a_lookup():
    p = fdsl.parse("""dim n = 4, v = 9, d = 3
const X : n x v onehot
const T : n x d
weight A : d x v
L = trace(T A X^t)
w = -d(L)
""")
    low = lowering(p)
    # A X^t = (X A^t)^t: a lookup of the rows of A^t; trace(T (A X^t)) then reads it
    lookups = [op for op in low.sweep if op.kind == "lookup"]
    assert len(lookups) == 1 and lookups[0].args[1].value.hint == "A" and lookups[0].args[1].t


def test_the_chain_order_counts_a_lookup_at_the_size_of_its_result():
    # X A B with n = 10, v = 100, d = 10, k = 1: as products, X (A B) is cheaper; as a lookup, (X A) B
    # is, and it looks up the rows of A rather than computing A B over the whole vocabulary
    p = fdsl.parse("""dim n = 10, v = 100, d = 10, k = 1
const X : n x v onehot
const T : k x n
weight A : v x d, B : d x k
L = trace(T X A B)
w = -d(L)
""")
    low = Lowering({"L": p["L"]}, p.dims)
    low.lower()
    lookup = next(op for op in low.sweep if op.kind == "lookup")
    assert lookup.args[1].value.hint == "A"


def test_eval_from_ids_equals_eval_from_the_one_hot_matrices():
    from fdsl.numbers.values import evaluate_in, program_values

    ids, weights = draw()
    a, b = lm(True), lm(False)
    program_values(a).update({**ids, **weights})
    program_values(b).update({**{k: one_hot(v) for k, v in ids.items()}, **weights})
    got, want = evaluate_in(a, a["L"])[0, 0], evaluate_in(b, b["L"])[0, 0]
    assert abs(got - want) <= EXACT * abs(want)


def _values_file(path, values):
    np.savez(path, **values)
    return str(path)


@pytest.mark.parametrize("bad, said", [
    (lambda ids: dict(ids, X=np.where(np.arange(N) == 3, V + 2, ids["X"])),
     "the value of X in %s has the id 13 at (3,), outside [0, v) = [0, 11)"),
    (lambda ids: dict(ids, X=ids["X"].astype(float)), "the value of X in %s must hold integer ids, not float64"),
    (lambda ids: dict(ids, X=one_hot(ids["X"])), "the value of X in %s is a matrix of shape (5 x 11), where ids "
                                                 "are declared"),
])
def test_bad_ids_get_a_located_message_and_exit_2(tmp_path, capsys, bad, said):
    fd = tmp_path / "lm.fd"
    fd.write_text(LM % " onehot")
    ids, weights = draw()
    path = _values_file(tmp_path / "bad.npz", {**bad(ids), **weights})
    for args in (["grad", str(fd), "--form", "w", "--out", str(tmp_path / "g.npz")],
                 ["train", str(fd), "--form", "w", "--steps", "1", "--lr", "0.1"],
                 ["run", str(fd), "-e", "show eval(L)"]):
        capsys.readouterr()
        assert main(args + ["--values", path]) == 2
        err = capsys.readouterr().err
        assert said % path in err, err
        assert err.startswith(path + ": ") or ":1:" in err  # the file, or the statement that read it
    assert not (tmp_path / "g.npz").exists()


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_the_generated_module_says_which_ids_are_wrong(tmp_path, target):
    if target == "torch":
        pytest.importorskip("torch")
    grads = module(tmp_path, True, target).grads
    ids, weights = draw()
    with pytest.raises(ValueError, match=r"X has the id 11 at \(2,\), outside \[0, 11\)"):
        grads({**ids, **weights, "X": np.where(np.arange(N) == 2, V, ids["X"])})
    with pytest.raises(ValueError, match=r"X is a matrix of shape \(5, 11\), where ids are declared"):
        grads({**ids, **weights, "X": one_hot(ids["X"])})
    with pytest.raises(ValueError, match="X holds .*float.*, not integer ids"):
        grads({**ids, **weights, "X": ids["X"].astype(np.float64)})


@pytest.mark.parametrize("target", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", ["uint8", "int16", "int32", "int64"])
def test_ids_of_any_integer_dtype_give_the_same_gradients(tmp_path, target, dtype):
    """Ids as a dataset may hold them (uint8, int16, int32): the gradients of int64 ids, for the
    lookups and gathers and for the one-hot matrix (torch's embedding refused uint8 and int16 with
    a RuntimeError, its gather and one_hot int32)."""
    from fdsl.numbers.values import program_values, random_values

    torch = pytest.importorskip("torch") if target == "torch" else None
    convert = (lambda x: torch.as_tensor(x)) if torch else (lambda x: x)  # noqa: E731
    for source in (LM % " onehot", MATRIX_USES["both, beside a lookup"]):
        p = fdsl.parse(source)
        path = tmp_path / ("m%d_%s.py" % (len(list(tmp_path.iterdir())), target))
        path.write_text(codegen.gradients_source(p.normal_form(p["w"]), p.dims, "ids", target, None,
                                                 loss_of(p["w"])))
        mod = import_module(path, path.stem)
        random_values(p, 4)
        store = program_values(p)
        values = {name: np.asarray(store[name]) for name in mod.INPUTS}
        assert all(values[name].dtype == np.int64 for name in mod.IDS)
        want, want_loss = mod.grads_and_loss({k: convert(v) for k, v in values.items()})
        got, loss = mod.grads_and_loss({k: convert(v.astype(dtype) if k in mod.IDS else v)
                                        for k, v in values.items()})
        assert float(loss) == float(want_loss)
        for name in want:
            assert np.array_equal(np.asarray(got[name]), np.asarray(want[name])), name


MATRIX_USES = {  # uses of a onehot constant that none of the kinds of ids computes
    "an operator of it": """dim n = 4, v = 9
const X : n x v onehot
weight A : n x v
L = trace(A^t gelu(X))
w = -d(L)
""",
    # the derivative of trace(Y^t exp(U)) is Y o exp(U): a Hadamard product with it
    "a Hadamard product with it": """dim n = 4, v = 9
const Y : n x v onehot
weight U : n x v
L = trace(Y^t exp(U))
w = -d(L)
""",
    "both, beside a lookup": """dim n = 4, v = 9, d = 3
const X : n x v onehot, Y : n x v onehot
weight E : v x d, W : d x v
Z := X E W
L = trace(Y^t (Z * Z)) + trace(X^t tanh(Z))
w = -d(L)
""",
}


@pytest.mark.parametrize("use", sorted(MATRIX_USES))
def test_a_use_that_only_the_matrix_computes_makes_it_from_the_ids(use):
    """One ``onehot`` op a constant, read by the ops of that use alone; the gradients agree with the
    program on the one-hot matrices, torch autograd and finite differences (numpy, torch, a batch)."""
    source = MATRIX_USES[use]
    for target in ("numpy", "torch"):
        low = lowering(fdsl.parse(source), target)
        made = [op for op in low.sweep if op.kind == "onehot"]
        assert made and len({op.args[0].value for op in made}) == len(made)
        for op in low.sweep:
            if op.kind not in ("lookup", "scatter", "pick_sum", "add_ids", "aa_ids", "scatter_into", "onehot"):
                assert not any(v.ids for v in op.values_read()), op
    _agree(source)


def test_onehot_is_for_plain_constants():
    with pytest.raises(FdslError, match="only a const without indices or a value can be declared onehot"):
        fdsl.parse("dim n = 2, v = 3\nweight W : n x v onehot\n")
    with pytest.raises(FdslError, match="W is a family"):
        fdsl.parse("dim n = 2, v = 3\nconst W[i] : n x v onehot\n")


def test_modules_without_ids_carry_no_helpers_of_ids():
    dense, ids = source(lm(False), "numpy"), source(lm(True), "numpy")
    assert "def _lookup" not in dense and "def _lookup" in ids


def test_no_one_hot_tensor_among_the_aten_calls_of_a_torch_sweep(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    seen.append((str(func), t.detach().clone()))
            return out

    m = module(tmp_path, True, "torch")
    ids, weights = draw(batch=4)
    values = {k: torch.as_tensor(v) for k, v in {**ids, **weights}.items()}
    with Record():
        m.grads_and_loss(values)
    names = {name for name, _ in seen}
    assert not [n for n in names if "one_hot" in n]
    assert any("embedding" in n for n in names) and any("index_add" in n for n in names)
    assert any("gather" in n for n in names) and any("scatter_add" in n for n in names)
    for name, t in seen:
        if t.dim() >= 2 and tuple(t.shape[-2:]) == (N, V) and t.is_floating_point():
            ones = (t == 1).sum(-1)
            assert not (((t == 0) | (t == 1)).all() and (ones == 1).all()), "%s made a one-hot tensor" % name


def test_rowsum_of_ids_is_a_column_of_ones(tmp_path):
    p = fdsl.parse("""dim n = 4, v = 9
const X : n x v onehot
weight A : n x v, B : n x 1
L = trace(A^t X) + 3 trace(B^t rowsum(X))
""")
    low = Lowering({"L": p["L"]}, p.dims)
    namespace = codegen.compile_namespace(low.source("rowsum of ids"))
    assert [op for op in low.module_consts if op.attrs["make"] == "ones"]
    rng = np.random.default_rng(2)
    x, A, B = rng.integers(0, 9, 4), rng.standard_normal((4, 9)), rng.standard_normal((4, 1))
    got = namespace["grads"]({"X": x, "A": A, "B": B})["L"]
    assert abs(float(np.asarray(got).reshape(-1)[0]) - (np.sum(A * np.eye(9)[x]) + 3 * B.sum())) <= EXACT * 10


# ---- each rule of fdsl.codegen.onehot, and a check that fails when the rule is switched off ----------
# A rule switched off (monkeypatched to decline) leaves its use of the ids to the ordinary ops: the
# lowering then refuses the program (check_ids), or, for the rules that only save work, the check
# sees the work done (a Hadamard product with ones, a (batch, v, d) scatter, the dense chain order).

SCALED = """dim n = 4, v = 7, d = 3
const X : n x v onehot
weight U : n x v, E : v x d, A : d x v
F = trace(X^t U) U + X E A
L = -trace(X^t logsoftmax(F))
w = d(L)
"""  # the gradient of U holds trace(X^t F') X: a number of each example times X (add_ids with a scalar)

ALONE = """dim n = 3, v = 5
const X : n x v onehot
weight U, W : n x v, B : n x 1
L = 2 trace(U^t X) + trace(X^t U) trace(B^t B) + 3 trace(W^t X)
w = -d(L)
"""  # the gradient of W is -3 X: c X alone is zeros with c added at the ids; U's, -2 X - trace(B^t B) X:
# two onehot summands added into zeros


PROBABILITY = """dim n = 4, v = 6
const X : n x v onehot
weight U : n x v
L = trace(X^t a(U)) + trace(X^t a(U)) trace(X^t a(U))
w = d(L)
"""  # the gradient of the probability of the ids holds aa(U, X)


SCALED_RIGHT = """dim n = 3, k = 4
const Y : k x n onehot
const T : 1 x n
weight A : 1 x k
F = 2 A Y
E = T - F
L = trace(E^t E) / 2
w = d(L)
"""  # 2 A Y: the result (1 x n) is smaller than A (1 x k), but the scale goes on A: (Y^t (2 A^t))^t, a scatter


def _kinds(source, target="numpy"):
    p = fdsl.parse(source)
    low = lowering(p, target) if "w =" in source else Lowering({"L": p["L"]}, p.dims, target)
    if "w =" not in source:
        low.lower()
    return low


def _agree(source):
    """Every way fdsl computes the gradients of ``source`` (ids; numpy, torch, a batch) agrees with
    the same program on the one-hot matrices, torch autograd and finite differences."""
    from fdsl.verify import differential

    report = differential.check(source, sign=1 if "w = d(L)" in source else -1, seed=3)
    assert report.ok, report.describe()
    assert "dense[shared]" in report.gradients and "code[shared]" in report.gradients
    return report


def check_lookup():  # X E: the rows of E at the ids
    for target in ("numpy", "torch"):
        low = lowering(lm(True), target)
        assert [op.args[1].value.hint for op in low.sweep if op.kind == "lookup"] == ["E"]


def check_scatter():  # X^t G: the gradient of E, G's rows added at the ids
    for target in ("numpy", "torch"):
        low = lowering(lm(True), target)
        assert len([op for op in low.sweep if op.kind == "scatter"]) == 1


def check_summed_scatter():  # the gradient of E summed over the batch in its scatter: no (batch, v, d) array
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    for target in ("numpy", "torch"):
        assert [op.attrs.get("total") for op in lowering(lm(True), target).sweep if op.kind == "scatter"] == [True]
    shapes = set()

    class Shapes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    shapes.add(tuple(t.shape))
            return out

    ns = codegen.compile_namespace(source(lm(True), "torch"))
    ids, weights = draw(batch=6)
    with Shapes():
        ns["grads"]({k: torch.as_tensor(v) for k, v in {**ids, **weights}.items()})
    assert (V, D) in shapes and (6, V, D) not in shapes


def check_pick_sum():  # trace(Y^t logsoftmax(Z)): a gather of the log-probabilities
    for target in ("numpy", "torch"):
        assert [op.kind for op in lowering(lm(True), target).sweep].count("pick_sum") == 1


def check_add_ids():  # Y - a(Z) rowsum(Y): -a(Z) with 1 added at the ids
    for target in ("numpy", "torch"):
        adds = [op for op in lowering(lm(True), target).sweep if op.kind == "add_ids"]
        assert [(op.attrs["sign"], len(op.args)) for op in adds] == [(1.0, 2)]


def check_scaled_add_ids():  # c s X in a gradient: the number and the scalars added at the ids
    for target in ("numpy", "torch"):
        adds = [op for op in _kinds(SCALED, target).sweep if op.kind == "add_ids"]
        assert any(len(op.args) == 3 and op.args[2].scalar for op in adds)
    report = _agree(SCALED)
    assert "torch-batch[shared]" in report.batch_closeness or not torch_available()


def check_transposed_sum():  # G^t = -2 X^t - c X^t: computed as its transpose (X's rows), read transposed
    for target in ("numpy", "torch"):
        low = _kinds(ALONE, target)
        refs = [low.refs[canon(term)[0]] for term in low.outputs.values()]  # G_U, G_W (B's: a scale)
        flipped = [ref for ref in refs if ref.flip and low.sweep.maker[ref.var].kind == "add_ids"]
        assert len(flipped) == 2
    _agree(ALONE)


def check_alone():  # -3 X alone: zeros with -3 added at the ids
    low = _kinds(ALONE)
    signs = [op.attrs["sign"] for op in low.sweep if op.kind == "add_ids"]
    assert sorted(signs) == [-3.0, -2.0, -1.0], signs
    _agree(ALONE)


def check_aa_ids():  # aa(U, X): -p S with p (1 - p) at the ids, p the entries of S = a(U) at the ids
    for target in ("numpy", "torch"):
        assert "aa_ids" in [op.kind for op in _kinds(PROBABILITY, target).sweep]
    _agree(PROBABILITY)


def check_scaled_right():  # 2 A Y: the transpose of a scatter, the scale on A (a scatter has no out_scale)
    for target in ("numpy", "torch"):
        assert "scatter" in [op.kind for op in _kinds(SCALED_RIGHT, target).sweep]
    _agree(SCALED_RIGHT)


def check_rowsum():  # rowsum(X) of ids: a column of ones
    p = fdsl.parse("dim n = 4, v = 9\nconst X : n x v onehot\nweight B : n x 1\nL = trace(B^t rowsum(X))\n")
    low = Lowering({"L": p["L"]}, p.dims)
    low.lower()
    assert [op.attrs["make"] for op in low.module_consts] == ["ones"]


def check_ones_column():  # a(Z) rowsum(Y) 1^t: the column of ones multiplies nothing (no Hadamard product)
    for target in ("numpy", "torch"):
        assert not [op for op in lowering(lm(True), target).sweep if op.kind == "template" and op.attrs["op"] == "had"]


def check_chain_order():
    test_the_chain_order_counts_a_lookup_at_the_size_of_its_result()


def check_ids_on_the_right():  # A X^t = (X A^t)^t
    test_a_product_with_ids_on_the_right_is_the_transpose_of_a_lookup()


def check_onehot_matrix():  # Y o exp(U): the one-hot matrix made from the ids for it
    source = MATRIX_USES["a Hadamard product with it"]
    assert [op.kind for op in lowering(fdsl.parse(source)).sweep].count("onehot") == 1
    _agree(source)


def _refusing():
    """check_ids as it was before the one-hot matrix: a refusal."""
    from fdsl.codegen.onehot import OneHot

    def refuse(self):
        for op in self.sweep:
            if op.kind not in ("lookup", "scatter", "pick_sum", "add_ids", "aa_ids", "scatter_into") \
                    and any(getattr(v, "ids", False) for v in op.values_read()):
                raise FdslError("refused")

    return OneHot, "check_ids", refuse


def torch_available():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _decline(name, when=lambda *a: True):
    """OneHot's method ``name`` switched off: None (False) where ``when`` holds of its arguments."""
    from fdsl.codegen.onehot import OneHot

    rule = getattr(OneHot, name)
    nothing = {"_ones_column": False, "_onehot_split": False, "_onehot_unscaled": ()}.get(name)

    def off(self, *args):
        return nothing if when(*args) else rule(self, *args)

    return OneHot, name, off


RULES = {  # rule -> (its check, (object, attribute, replacement): the rule switched off)
    "lookup": (check_lookup, lambda: _decline("_onehot_product", lambda lhs, rhs, lw, rw: not lw[0][1])),
    "scatter": (check_scatter, lambda: _decline("_onehot_product", lambda lhs, rhs, lw, rw: lw[0][1])),
    "summed_scatter": (check_summed_scatter, lambda: (codegen_lowering(), "summed_scatter", lambda s, v: False)),
    "pick_sum": (check_pick_sum, lambda: _decline("_onehot_trace")),
    "add_ids": (check_add_ids, lambda: _decline("_onehot_sum")),
    "scaled_add_ids": (check_scaled_add_ids, lambda: _decline("_onehot_term", lambda bc, t: canon(t)[0].op == "mul")),
    "transposed_sum": (check_transposed_sum, lambda: _decline("_onehot_term", lambda bc, t: canon(t)[1] or (
        canon(t)[0].op == "mul" and any(f.op == "t" for f in canon(t)[0].args)))),
    "alone": (check_alone, lambda: _decline("_onehot_scaled")),
    "aa_ids": (check_aa_ids, lambda: _decline("_onehot_aa")),
    "scaled_right": (check_scaled_right, lambda: _decline("_onehot_unscaled")),
    "rowsum": (check_rowsum, lambda: _decline("_rowsum_onehot")),
    "ones_column": (check_ones_column, lambda: _decline("_ones_column")),
    "chain_order": (check_chain_order, lambda: _decline("_onehot_split")),
    "ids_on_the_right": (check_ids_on_the_right, lambda: _decline("_onehot_side", lambda lw, rw: True)),
    "onehot_matrix": (check_onehot_matrix, _refusing),
}


def codegen_lowering():
    import fdsl.codegen.lowering as module

    return module


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_rule_has_a_check_that_holds(rule, monkeypatch):
    monkeypatch.setattr(codegen, "_COMPILED", {})
    RULES[rule][0]()


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_check_fails_when_its_rule_is_switched_off(rule, monkeypatch):
    check, off = RULES[rule]
    if rule == "summed_scatter":
        pytest.importorskip("torch")
    monkeypatch.setattr(codegen, "_COMPILED", {})  # nothing compiled with the rule on
    monkeypatch.setattr(*off())
    with pytest.raises((AssertionError, FdslError)):
        check()


def test_a_finite_difference_of_a_program_with_ids_equals_that_with_the_one_hot_matrices():
    # the tangent evaluation (d(L) on numbers) hands its sub-evaluators the values it read: the ids
    # of a onehot constant, not the one-hot rows it computes with (refused as a matrix given for ids)
    from fdsl.numbers.numpy_eval import Evaluator

    ids, weights = draw(seed=4)
    tangent = {"E": np.random.default_rng(5).standard_normal((V, D))}
    def fd(onehot, values):
        p = lm(onehot)
        return Evaluator(values, p.dims, tangent=tangent, step=1e-3).value(fdsl.core.terms.d(p["L"]))[0, 0]

    got = fd(True, {**ids, **weights})
    want = fd(False, {**{k: one_hot(v) for k, v in ids.items()}, **weights})
    assert abs(got - want) <= EXACT * max(1.0, abs(want))


@pytest.mark.parametrize("program", [SCALED, ALONE], ids=["scaled", "alone"])
def test_a_scaled_one_hot_matrix_in_a_gradient_is_added_at_the_ids_and_nothing_else_is_made(program):
    # c s X in a gradient (s a number of each example): no (n, v) array is computed for it on its
    # own (the sum's statement reads X and s, not c s X)
    for target in ("numpy", "torch"):
        low = _kinds(program, target)
        adds = [op for op in low.sweep if op.kind == "add_ids"]
        assert adds and all(low.sweep.readers.get(op.outs[0]) or op.outs[0] in
                            {low.refs[canon(t)[0]].var for t in low.outputs.values()} for op in adds)
    _agree(program)


def test_the_oracles_program_strikes_every_onehot_of_a_declaration():
    """The differential check's program on the one-hot matrices (``without_onehot``) strikes each
    onehot of a line, not the first alone, and leaves comments as they are."""
    from fdsl.verify.differential import without_onehot

    got = without_onehot("dim n = 4, v = 9\nconst X : n x v onehot, Y : n x v onehot  # onehot ids\n"
                         "  const Z : n x v onehot\nweight onehot_W : n x v\n")
    assert got == ("dim n = 4, v = 9\nconst X : n x v, Y : n x v  # onehot ids\n  const Z : n x v\n"
                   "weight onehot_W : n x v\n")
