"""The torch target (``fdsl codegen --target torch``): the generated module is imported as a user
would import it and held against torch autograd of the same encoder, written independently here
(float64 to 1e-10; float32 to float32 accuracy), one example and batches of them; its autograd
Function and Module drop into a torch training step; and a two-process torch.distributed
data-parallel run (gloo, this machine) gives the gradients of one process over the whole batch.
"""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_codegen import HEADER, import_module, program, shared  # noqa: E402

import fdsl  # noqa: E402
from fdsl.base.errors import FdslError  # noqa: E402
from fdsl.calculus.gradients import error_of  # noqa: E402
from fdsl.codegen import generated as codegen  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TIGHT = 1e-10  # float64: the same math in two bracketings
LOOSE = 2e-4  # float32 against float64
FLOOR = 1e-3


def torch_module(tmp_path, L, target="torch", dtype=None, header=HEADER, name="fdsl_torch_grads"):
    p = program(L, header)
    w = shared(p)
    path = tmp_path / ("%s_%d_%s.py" % (name, L, dtype))
    path.write_text(codegen.gradients_source(w, p.dims, "encoder(%d)" % L, target, dtype, error_of(p["w"])))
    return import_module(path, "%s_%d_%s" % (name, L, dtype)), p


def sizes(p):
    return {k: v for k, v in p.dims.items() if isinstance(v, int)}


def draw(p, L, batch=None, seed=0, dtype=torch.float64):
    """Random values: data normal (with a leading batch axis when ``batch``), weights / sqrt(rows)."""
    g = torch.Generator().manual_seed(seed)
    n, d, k, h = (sizes(p)[x] for x in "ndkh")
    lead = (batch,) if batch else ()
    values = {"X0": torch.randn(lead + (n, d), generator=g, dtype=dtype),
              "Y": torch.randn(lead + (n, d), generator=g, dtype=dtype)}
    for i in range(L):
        for name, shape in {"Q": (d, k), "K": (d, k), "V": (d, h), "W": (h, d), "b": (1, h), "f": (1, d)}.items():
            values["%s_%d" % (name, i)] = torch.randn(shape, generator=g, dtype=dtype) / shape[0] ** 0.5
    return values


def autograd_loss(values, L):
    """1/2 ||Y - X_L||^2 of the encoder, summed over a batch: torch's own ops, no fdsl."""
    X = values["X0"]
    s = values["Q_0"].shape[1] ** -0.5
    for i in range(L):
        Q, K, V, W = (values["%s_%d" % (c, i)] for c in "QKVW")
        S = torch.softmax(s * (X @ Q) @ (X @ K).mT, dim=-1)
        X = torch.relu(S @ X @ V + values["b_%d" % i]) @ W + values["f_%d" % i]
    return 0.5 * ((values["Y"] - X) ** 2).sum()


def autograd_grads(values, L):
    weights = {k: v.detach().clone().requires_grad_(True) for k, v in values.items() if k not in ("X0", "Y")}
    loss = autograd_loss(dict(values, **weights), L)
    loss.backward()
    return {k: v.grad for k, v in weights.items()}, loss.detach()


def rel(a, b):
    return float(torch.linalg.norm(a - b) / max(float(torch.linalg.norm(b)), 1e-300))


def check_against_autograd(got: dict, want: dict, tol: float):
    """fdsl's G_W^t is -dL/dW: for the whole gradient, and for every weight against its own size or
    FLOOR times the largest one's when it is smaller (without residual connections the attention
    of a deep encoder collapses, and some gradients are 1e-7 of others: both sides' rounding
    errors, 1e-16 of the largest, are then large next to them)."""
    assert set(got) == set(want)
    total = sum(float(torch.linalg.norm(got[k] + want[k])) ** 2 for k in want) ** 0.5
    assert total <= tol * sum(float(torch.linalg.norm(v)) ** 2 for v in want.values()) ** 0.5
    floor = FLOOR * max(float(torch.linalg.norm(v)) for v in want.values())
    for name in want:
        err = float(torch.linalg.norm(got[name] + want[name])) / max(float(torch.linalg.norm(want[name])), floor)
        assert err <= tol, (name, err)


@pytest.mark.parametrize("L", [1, 3])
def test_grads_agree_with_torch_autograd_in_float64(tmp_path, L):
    module, p = torch_module(tmp_path, L)
    values = draw(p, L, seed=L)
    want, want_loss = autograd_grads(values, L)
    got, loss = module.grads_and_loss(values)
    check_against_autograd(got, want, TIGHT)
    assert abs(float(loss) - float(want_loss)) <= TIGHT * float(want_loss)
    assert all(g.dtype == torch.float64 for g in got.values())


def test_a_batch_gives_the_gradients_of_the_summed_loss(tmp_path):
    L, B = 2, 5
    module, p = torch_module(tmp_path, L)
    values = draw(p, L, batch=B, seed=7)
    want, want_loss = autograd_grads(values, L)
    got, loss = module.grads_and_loss(values)
    check_against_autograd(got, want, TIGHT)
    assert abs(float(loss) - float(want_loss)) <= TIGHT * float(want_loss)
    singles = [module.grads(dict(values, X0=values["X0"][i], Y=values["Y"][i])) for i in range(B)]
    for name in got:
        assert rel(got[name], sum(s[name] for s in singles)) <= TIGHT


def test_float32_in_float32_out_and_dtype_forced(tmp_path):
    L = 2
    module, p = torch_module(tmp_path, L)
    values64 = draw(p, L, batch=3, seed=3)
    values32 = {k: v.float() for k, v in values64.items()}
    got32 = module.grads(values32)
    assert all(g.dtype == torch.float32 for g in got32.values())
    exact = module.grads({k: v.double() for k, v in values32.items()})
    for name in exact:
        assert rel(got32[name].double(), exact[name]) <= LOOSE, name
    forced, _ = torch_module(tmp_path, L, dtype="float64")
    assert all(g.dtype == torch.float64 for g in forced.grads(values32).values())


def test_the_function_and_the_module_train_like_autograd(tmp_path):
    L = 2
    module, p = torch_module(tmp_path, L)
    values = draw(p, L, batch=4, seed=11)
    data = {"X0": values["X0"], "Y": values["Y"]}
    weights = {k: v for k, v in values.items() if k not in data}
    ours = module.Model(weights)
    theirs = {k: torch.nn.Parameter(v.clone()) for k, v in weights.items()}

    def step(params):  # plain SGD (torch.optim would import half of torch for three steps)
        with torch.no_grad():
            for param in params:
                param -= 1e-3 * param.grad
                param.grad = None

    for _ in range(3):
        a = ours(**data)
        a.backward()
        b = autograd_loss(dict(data, **theirs), L)
        b.backward()
        assert abs(a.item() - b.item()) <= TIGHT * b.item()
        for name, param in theirs.items():
            assert rel(ours.gradients()[name], param.grad) <= TIGHT, name
        assert [n for n, _ in ours.named_parameters()] == list(module.WEIGHTS)  # a parameter a weight
        step(ours.parameters())
        step(theirs.values())
    # the loss scales the incoming gradient like any other: backward of 3 L gives 3 dL/dW
    ours.zero_grad()
    (3.0 * ours(**data)).backward()
    once, _ = autograd_grads(dict(data, **{k: ours.weight(k).clone() for k in weights}), L)
    assert rel(ours.gradients()["Q_0"], 3.0 * once["Q_0"]) <= TIGHT
    for name in weights:  # a weight is its parameter: the model's own numbers
        assert ours.weight(name) is dict(ours.named_weights())[name] is dict(ours.named_parameters())[name]
    with torch.no_grad():
        ours.weight("Q_0").zero_()
    assert float(ours.state_dict()["K_0"].abs().sum()) > 0 and float(ours.state_dict()["Q_0"].abs().sum()) == 0


def test_the_module_imports_only_torch(tmp_path):
    # and the standard library's ctypes, os and platform (the runtime's _keep_heap), time (its
    # choice of the products' kernel, _probe_gemm)
    module, p = torch_module(tmp_path, 1)
    tree = ast.parse(Path(module.__file__).read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [(a.name, a.asname) for n in imports for a in n.names] == [
        ("ctypes", None), ("os", None), ("platform", None), ("time", None), ("torch", None)]
    # (the data-parallel test below runs it in processes where fdsl cannot be imported)


def test_a_batched_weight_is_refused(tmp_path):
    module, p = torch_module(tmp_path, 1)
    values = draw(p, 1)
    values["Q_0"] = values["Q_0"].expand(2, -1, -1)
    with pytest.raises(ValueError, match="Q_0 has shape"):
        module.grads(values)


def _tanh_program(rules_text):

    source = (ROOT / "examples" / "softplus.fd").read_text()
    directory = Path(__import__("tempfile").mkdtemp())
    (directory / "softplus.rules").write_text(rules_text)
    (directory / "softplus.fd").write_text(source)
    p = fdsl.load(str(directory / "softplus.fd"))
    return p, p.apply_rules("normal", fdsl.form(p["E"]))


def test_a_rule_file_operator_runs_on_torch_when_torch_spells_it_alike(tmp_path):
    p, w = _tanh_program((ROOT / "examples" / "softplus.rules").read_text())
    path = tmp_path / "tanh_torch.py"
    path.write_text(codegen.gradients_source(w, p.dims, target="torch", error=p["E"]))
    module = import_module(path, "tanh_torch")
    g = torch.Generator().manual_seed(2)
    values = {"X": torch.randn(3, 5, 4, generator=g, dtype=torch.float64),
              "Y": torch.randn(3, 5, 4, generator=g, dtype=torch.float64),
              "U": torch.randn(4, 3, generator=g, dtype=torch.float64),
              "V": torch.randn(3, 4, generator=g, dtype=torch.float64)}
    U, V = (values[k].clone().requires_grad_(True) for k in "UV")
    (0.5 * ((values["Y"] - torch.nn.functional.softplus(values["X"] @ U) @ V) ** 2).sum()).backward()
    got = module.grads(values)
    assert rel(-got["U"], U.grad) <= TIGHT and rel(-got["V"], V.grad) <= TIGHT


@pytest.mark.parametrize("fn", sorted(__import__("fdsl.core.ops", fromlist=["NUMPY_FUNCTIONS"]).NUMPY_FUNCTIONS))
def test_every_numpy_function_of_rule_files_runs_on_torch(fn):
    from fdsl.codegen.targets import TARGETS
    from fdsl.core.ops import NUMPY_FUNCTIONS

    arity, template = NUMPY_FUNCTIONS[fn]
    code = TARGETS["torch"].template(type("Spec", (), {"numpy": template})(), "user")
    assert code is not None and "np." not in code.replace("_np.", "")
    runtime: dict = {}
    exec("\n".join(TARGETS["torch"].imports), runtime)  # (as a generated module imports them)
    exec(compile(TARGETS["torch"].runtime(), "<torch runtime>", "exec"), runtime)
    rng = np.random.default_rng(0)
    args = [rng.uniform(0.2, 2.0, (3, 4)) for _ in range(arity)]  # inside every function's domain
    want = eval(template.format(*("a%d" % i for i in range(arity))), {"np": np},
                {"a%d" % i: x for i, x in enumerate(args)})
    got = eval(code.format(*("a%d" % i for i in range(arity))), runtime,
               {"a%d" % i: torch.from_numpy(x) for i, x in enumerate(args)})
    assert np.allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


def test_an_operator_torch_cannot_spell_is_an_error(monkeypatch):
    # rule files name numpy functions from a fixed table, all of which the torch runtime has; an
    # operator added in Python with a template outside it is refused by name, not run wrongly
    from fdsl.core import ops

    op = ops.Op("spaced", 1, ops.same_shape_args("spaced"), numpy="np.spacing({0})", user=True, params=("A",))
    monkeypatch.setitem(ops.OPS, "spaced", op)
    p = fdsl.parse("dim n = 3\nconst X : n x n\nweight W : n x n\n")
    from fdsl.core import terms as T

    term = T.make("spaced", (T.mul(p.symbols["X"], p.symbols["W"]),))
    codegen.generate({"S": term}, p.dims)  # numpy: as written
    with pytest.raises(FdslError, match="spaced has no torch implementation"):
        codegen.Lowering({"S": term}, p.dims, target="torch").source("test")


# ---- torch.distributed: two processes, one machine -----------------------------------------------

DDP_SCRIPT = r'''
import sys, importlib.util
sys.modules["fdsl"] = None  # the generated module needs torch only: importing fdsl here would fail
import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

rank, world, port, module_path, data_path, out_path = sys.argv[1:7]
rank, world = int(rank), int(world)
spec = importlib.util.spec_from_file_location("fdsl_grads", module_path)
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank, world_size=world)
data = {k: torch.from_numpy(v) for k, v in np.load(data_path).items()}
weights = {k: v for k, v in data.items() if k not in ("X0", "Y")}
model = DistributedDataParallel(m.Model(weights))
share = data["X0"].shape[0] // world
mine = slice(rank * share, (rank + 1) * share)
loss = model(X0=data["X0"][mine], Y=data["Y"][mine])
loss.backward()  # DDP averages the gradients of the processes
if rank == 0:
    np.savez(out_path, **{k: world * g.numpy() for k, g in model.module.gradients().items()})
dist.barrier()  # both done before either tears gloo down (a rank leaving early can abort the other)
dist.destroy_process_group()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_data_parallel_on_two_processes_gives_the_gradients_of_one(tmp_path):
    L, B = 2, 4
    module, p = torch_module(tmp_path, L)
    values = draw(p, L, batch=B, seed=5)
    data_path = tmp_path / "data.npz"
    np.savez(data_path, **{k: v.numpy() for k, v in values.items()})
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    out = tmp_path / "ddp_grads.npz"
    errors = []
    for attempt in range(2):  # a port found free can be taken before gloo binds it: one more try
        port = str(_free_port())
        procs = [subprocess.Popen([sys.executable, str(script), str(rank), "2", port, module.__file__,
                                   str(data_path), str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for rank in range(2)]
        results = [proc.communicate(timeout=300) + (proc.returncode,) for proc in procs]
        errors = [err for _, err, code in results if code != 0]
        if not errors:
            break
    assert not errors, "\n".join(errors)
    got = {k: torch.from_numpy(v) for k, v in np.load(out).items()}
    want, _ = autograd_grads(values, L)  # one process, the whole batch
    for name in want:
        assert rel(got[name], want[name]) <= TIGHT, name


def test_the_training_example_runs_and_the_loss_falls(tmp_path):
    from fdsl.cli import main

    module = tmp_path / "deep_torch.py"
    assert main(["codegen", str(ROOT / "examples" / "deep.fd"), "--form", "form(E)", "--target", "torch",
                 "-o", str(module)]) == 0
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train_torch.py"), str(module), "--steps", "20",
                        "--every", "10", "--batch", "4"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    losses = [float(line.split()[-1]) for line in r.stdout.splitlines()]
    assert len(losses) == 3 and losses[-1] < 0.8 * losses[0]
    # issue 31: a step size that diverges used to print "loss nan" and exit 0
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train_torch.py"), str(module), "--steps", "200",
                        "--every", "100", "--batch", "4", "--lr", "10"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "training stopped: it diverges" in r.stderr, (r.stdout, r.stderr)
    assert "nan" not in r.stdout
