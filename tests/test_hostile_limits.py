"""Hostile input, round 4 (issue 30, items 6, 8 and 9): limits that name themselves, time limits
that hold, caches keyed by content, names Python or torch use themselves.

Each command runs ``python -m fdsl.cli`` in a subprocess under a CPU-time and address-space cap
(``resource.setrlimit`` in ``preexec_fn``), as tests/test_hostile.py does: an input that used to
run for minutes must now stop, with exit 2 and a message naming the limit and the flag that raises
it, well within the cap. Wall-clock timeouts are generous (a busy machine cannot trip them); the
time limits under test are tiny (half a second) on work that would take minutes or hours.
"""

from __future__ import annotations

import importlib.util
import io
import os
import resource
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
CPU_SECONDS = 60
MEMORY_BYTES = 4 << 30
HEAD = "dim n = 2\nconst X : n x n\nweight W : n x n\n"


def _limits():
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def fdsl(folder: Path, *argv) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONIOENCODING="utf-8", XDG_CACHE_HOME=str(folder / "cache"))
    return subprocess.run([sys.executable, "-m", "fdsl.cli", *argv], cwd=folder, env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, preexec_fn=_limits, timeout=8 * CPU_SECONDS)


def refused(proc, pattern: str) -> str:
    """The message of a refusal: exit 2, no traceback, ``pattern`` in the first line of stderr."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    first = proc.stderr.splitlines()[0]
    assert pytest.importorskip("re").search(pattern, first), first
    return first


# ---- item 9: round 3's remainder ------------------------------------------------------------------


def test_a_definition_that_doubles_its_calls_stops_at_the_call_limit(tmp_path):
    (tmp_path / "p.fd").write_text("dim n = 2\nconst X : n x n\nf(0, Z) = Z\n"
                                   "f(k, Z) = f(k-1, m(Z)) + f(k-1, a(Z))\nshow f(40, X)\n")
    refused(fdsl(tmp_path, "run", "p.fd"),
            r"^p\.fd:4:\d+: f\(.*\): more than 40000 calls of definitions .*the call limit.*--step-limit N raises it")


def test_the_call_limit_follows_the_step_limit(tmp_path):
    (tmp_path / "p.fd").write_text("dim n = 2\nconst X : n x n\nf(0, Z) = Z\n"
                                   "f(k, Z) = f(k-1, m(Z)) + f(k-1, a(Z))\nshow nodes(f(8, X))\n")
    assert fdsl(tmp_path, "run", "p.fd").stdout == "512\n"  # legal: 511 calls, nodes as the earlier test counts
    refused(fdsl(tmp_path, "run", "p.fd", "--step-limit", "10000"), r"more than 200 calls of definitions")


def test_a_chain_of_20000_rule_files_stops_at_the_import_depth_limit(tmp_path):
    for i in range(20_000):
        (tmp_path / ("r%d.rules" % i)).write_text('import "r%d.rules"\n' % (i + 1) if i < 19_999 else
                                                  "ruleset last\nrule x: m(?A) => ?A\n")
    (tmp_path / "p.fd").write_text(HEAD + 'rules "r0.rules"\nshow X\n')
    refused(fdsl(tmp_path, "run", "p.fd"),
            r"^r99\.rules:1:1: cannot import 'r100\.rules': rule files import each "
            r"other more than 100 deep \(the import depth limit\), starting at r0\.rules")


def test_a_short_chain_of_rule_files_loads(tmp_path):
    for i in range(20):
        (tmp_path / ("r%d.rules" % i)).write_text('import "r%d.rules"\n' % (i + 1) if i < 19 else
                                                  "ruleset last\nrule x: m(?A) => ?A\n")
    (tmp_path / "p.fd").write_text(HEAD + 'rules "r0.rules"\nshow last(m(X))\n')
    proc = fdsl(tmp_path, "run", "--unchecked", "p.fd")  # the rule is unsound on purpose
    assert proc.returncode == 0 and proc.stdout == "X\n", proc.stderr


def test_the_forms_of_the_encoder_at_depth_20_are_refused_before_they_are_expanded(tmp_path):
    (tmp_path / "m.fd").write_text((EXAMPLES / "manual.fd").read_text() + "H := Y - encoder(20)\nshow len(forms(H))\n")
    refused(fdsl(tmp_path, "run", "m.fd"),
            r"^m\.fd:\d+:\d+: forms\(H\): its expansion would have up to about .*e\+\d+ summands, more than the "
            r"1000000 one sum may hold .*--size-limit N raises it")


def test_forms_the_size_limit_allows_are_expanded(tmp_path):
    (tmp_path / "m.fd").write_text((EXAMPLES / "manual.fd").read_text() + "show len(forms(3))\n")
    proc = fdsl(tmp_path, "run", "m.fd")
    assert proc.returncode == 0 and proc.stdout.endswith("\n398\n"), proc.stderr[-2000:]


def _duplicates(path: Path, count: int):
    buf = io.BytesIO()
    np.save(buf, np.zeros((2, 2)))
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as z:
        warnings.simplefilter("ignore")  # zipfile warns of every duplicate name
        for _ in range(count):
            z.writestr("X.npy", buf.getvalue())


def test_a_values_file_of_300000_duplicate_members_stops_at_the_member_limit(tmp_path):
    _duplicates(tmp_path / "v.npz", 300_000)
    (tmp_path / "p.fd").write_text(HEAD + "show eval(X)\n")
    refused(fdsl(tmp_path, "run", "p.fd", "--values", "v.npz"),
            r"^v\.npz: this values file holds at least 65535 arrays, more than the 10000 a values file may hold "
            r"\(the member limit\)")


def test_a_values_file_of_12000_members_stops_at_the_member_limit(tmp_path):
    _duplicates(tmp_path / "v.npz", 12_000)
    (tmp_path / "p.fd").write_text(HEAD + "show eval(X)\n")
    refused(fdsl(tmp_path, "run", "p.fd", "--values", "v.npz"), r"^v\.npz: this values file holds 12000 arrays")


@pytest.mark.parametrize("second", ["X", "X.npy"])
def test_a_values_file_with_two_members_for_one_name_names_both(tmp_path, second):
    buf = io.BytesIO()
    np.save(buf, np.ones((2, 2)))
    with warnings.catch_warnings(), zipfile.ZipFile(tmp_path / "v.npz", "w") as z:
        warnings.simplefilter("ignore")
        z.writestr("X.npy", buf.getvalue())
        z.writestr(second, buf.getvalue())
    (tmp_path / "p.fd").write_text(HEAD + "show eval(X)\n")
    both = "two members named X.npy" if second == "X.npy" else "both X.npy and X"
    refused(fdsl(tmp_path, "run", "p.fd", "--values", "v.npz"), r"^v\.npz: this values file gives X twice: " + both)


def test_a_scalar_of_4800_digits_is_a_located_refusal(tmp_path):
    (tmp_path / "p.fd").write_text(HEAD + "scalar s = %s\nshow s X\n" % ("7" * 4800))
    refused(fdsl(tmp_path, "run", "p.fd"), r"^p\.fd:4:12: the number 7{20}\.\.\. \(4800 digits\) is out of range")


def test_float64_subnormal_numbers_are_numbers(tmp_path):
    (tmp_path / "p.fd").write_text(HEAD + "random 0\nshow eval(1e-308 eye(n))\nshow eval(5e-324 eye(n))\n"
                                   "scalar s = 4.9406564584124654e-324\nshow eval(s eye(n))\nshow (1/2)^1074 X\n")
    proc = fdsl(tmp_path, "run", "p.fd")
    assert proc.returncode == 0, proc.stderr
    shown = proc.stdout.splitlines()
    assert shown[0] == "[[1.e-308 0.e+000]" and shown[2] == "[[5.e-324 0.e+000]" and shown[4] == shown[2]


@pytest.mark.parametrize("number", ["1e-330", "2e-324", "(1/2)^1075"])
def test_numbers_float64_rounds_to_zero_are_refused_saying_so(tmp_path, number):
    (tmp_path / "p.fd").write_text(HEAD + "show %s X\n" % number)
    first = refused(fdsl(tmp_path, "run", "p.fd"), r"^p\.fd:4:6: .*out of range")
    assert "at least about 4.9e-324" in first and "below 1e-308" not in first


# ---- item 6: time limits that hold -----------------------------------------------------------------

GAUSS_NEWTON = ("dim n = 200\nconst X : n x n\nweight W : n x n\nE := X - W W W\n"
                "metric gaussnewton(E, 0, 1e-15)\nw = form(E)\n")  # 80,050 iterations allowed, each ~1 ms+


def test_fdsl_flow_estimates_the_iterations_a_metric_implies(tmp_path):
    (tmp_path / "p.fd").write_text(GAUSS_NEWTON)
    refused(fdsl(tmp_path, "flow", "p.fd", "--form", "w", "--random", "0", "--out", "f.npz", "--time-limit", "0.5"),
            r"^p\.fd: gaussnewton\(E, 0\) \(at most 2N \+ 50 iterations for its N = 40000 coordinates\) would take "
            r"about .*: 80050 iterations .*more than the time limit of 500 ms \(--time-limit SECONDS raises it")
    assert not (tmp_path / "f.npz").exists()


def test_show_flow_in_a_program_obeys_the_time_limit(tmp_path):
    (tmp_path / "p.fd").write_text(GAUSS_NEWTON + "random 0\nshow flow(w)\n")
    refused(fdsl(tmp_path, "run", "p.fd", "--time-limit", "0.5"),
            r"^p\.fd:8:6: .*gaussnewton\(E, 0\).* more than the time limit of 500 ms \(--time-limit SECONDS")


def test_train_in_a_program_obeys_the_time_limit(tmp_path):
    (tmp_path / "p.fd").write_text(GAUSS_NEWTON + "random 0\nr = train(w, 1000, 1/1000)\nshow r\n")
    refused(fdsl(tmp_path, "run", "p.fd", "--time-limit", "0.5"),
            r"^p\.fd:8:5: .*time limit of 500 ms \(--time-limit SECONDS raises it")


class _Ticking:
    """A clock that moves one second every time it is read: a run's time without a run's wait."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1.0
        return self.t


def _tick_at_every_look(monkeypatch, module):
    """``module``'s run clocks read a ``_Ticking`` time."""
    from fdsl.base import estimate

    class Clock(estimate.Clock):
        def __init__(self, what, limit=None, now=None):
            super().__init__(what, limit, _Ticking())

    monkeypatch.setattr(module, "Clock", Clock)


def test_a_training_run_is_timed_as_it_goes_at_every_step_and_iteration(monkeypatch):
    """Whatever the estimate says, the run's clock stops it once past the limit: here a clock that
    gains a second at every look, so a 30-second limit stops a 1000-step run within its first steps,
    inside the conjugate gradients of a step."""
    import fdsl as api
    from fdsl.base.errors import FdslError
    from fdsl.learn import train

    _tick_at_every_look(monkeypatch, train)
    with pytest.raises(FdslError) as e:
        api.parse("dim n = 4\nconst X : n x n\nweight W : n x n\nE := X - W W\nmetric gaussnewton(E, 1/10)\n"
                  "w = form(E)\nrandom 0\nr = train(w, 1000, 1/100)\n", time_limit=30).run()
    assert "training 1000 steps stopped at step " in e.value.message
    assert "gaussnewton(E, 0.1): conjugate gradients at iteration" in e.value.message
    assert "past the time limit of 30 s (--time-limit SECONDS raises it)" in e.value.message


def test_a_flow_is_timed_as_it_goes(monkeypatch):
    import fdsl as api
    from fdsl.base.errors import FdslError
    from fdsl.learn import flow

    _tick_at_every_look(monkeypatch, flow)
    with pytest.raises(FdslError) as e:
        api.parse("dim n = 4\nconst X : n x n\nweight W : n x n\nE := X - W W\nmetric gaussnewton(E, 0, 1e-15)\n"
                  "w = form(E)\nrandom 0\nshow flow(w)\n", time_limit=5).run()
    assert "the flow of the first argument of flow stopped (gaussnewton(E, 0): conjugate gradients at iteration" \
        in e.value.message and "past the time limit of 5 s" in e.value.message


# ---- item 8: caches keyed by content, names of Python's and torch's own, the tables -----------------


def test_a_rule_file_replaced_with_the_same_time_takes_its_new_meaning(tmp_path):
    import fdsl as api

    rules = tmp_path / "a.rules"
    text = HEAD + 'rules "a.rules"\n'
    rules.write_text("ruleset r\nrule x: m(?A) => a(?A)\n")  # (unsound rules, on purpose: loaded unchecked)
    stamp = rules.stat()
    assert str(api.parse(text, base_dir=tmp_path, unchecked=True).expr("r(m(X))")) == "a(X)"
    rules.write_text("ruleset r\nrule x: m(?A) => ?A   \n")  # same length, as tar x or cp -p leaves it
    os.utime(rules, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert rules.stat().st_mtime_ns == stamp.st_mtime_ns and rules.stat().st_size == stamp.st_size
    assert str(api.parse(text, base_dir=tmp_path, unchecked=True).expr("r(m(X))")) == "X"


def test_a_fifo_in_place_of_the_parser_tables_is_not_waited_on(tmp_path):
    fifo = tmp_path / "fdsl.tables.json"
    os.mkfifo(fifo)
    code = ("import sys\nfrom fdsl.lang import tables\nfrom pathlib import Path\n"
            "tables.tables_file = lambda grammar: Path(sys.argv[1])\n"
            "assert tables._from_tables('fdsl.lark', 'start', {}) is None\n"
            "print(tables.load('fdsl.lark', 'start').parse('show 1\\n').data)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=8 * CPU_SECONDS)
    assert proc.returncode == 0 and proc.stdout == "start\n", proc.stderr[-2000:]


NAMES = ("dim n = 3, k = 2\nconst self, torch, np, F, values, ctx, data, math, X : n x k\n"
         "weight def, class, lambda, nn, sum, W, scalars, loss, None, True, print : k x k\n"
         "E = self torch^t X - np W def nn + F + values class lambda + ctx sum scalars + data loss None True print"
         " + math W\nw = form(E)\n")


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_python_and_torch_names_as_fdsl_names_in_generated_code(tmp_path, target):
    """Constants and weights named self, torch, np, F, def, class, None, print, ...: the generated
    module runs, under the printed names, and its gradients are fdsl grad's."""
    if target == "torch":
        torch = pytest.importorskip("torch")
    (tmp_path / "p.fd").write_text(NAMES)
    proc = fdsl(tmp_path, "grad", "p.fd", "--form", "w", "--random", "0", "--out", "g.npz")
    assert proc.returncode == 0, proc.stderr
    proc = fdsl(tmp_path, "codegen", "p.fd", "--form", "w", "--target", target, "-o", "m.py")
    assert proc.returncode == 0, proc.stderr
    rng = np.random.default_rng(1)
    consts = ["self", "torch", "np", "F", "values", "ctx", "data", "math", "X"]
    weights = ["def", "class", "lambda", "nn", "sum", "W", "scalars", "loss", "None", "True", "print"]
    values = {c: rng.standard_normal((3, 2)) for c in consts}
    values.update({w: rng.standard_normal((2, 2)) for w in weights})
    np.savez(tmp_path / "v.npz", **values)
    proc = fdsl(tmp_path, "grad", "p.fd", "--form", "w", "--values", "v.npz", "--out", "g.npz")
    assert proc.returncode == 0, proc.stderr
    expected = dict(np.load(tmp_path / "g.npz"))
    assert str(expected.pop("_sign")).startswith("-dL/dW")  # G_W^t, as the generated grads give them
    assert sorted(expected) == sorted(weights)
    module = _module(tmp_path / "m.py")
    if target == "numpy":
        got = module.grads(values)
        for name in weights:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-10, atol=1e-12)
        return
    given = {k: torch.tensor(v, dtype=torch.float64) for k, v in values.items()}
    got = module.grads(given)
    for name in weights:
        np.testing.assert_allclose(got[name].numpy(), expected[name], rtol=1e-10, atol=1e-12)
    model = module.Model({w: values[w] for w in weights})
    loss = model({c: given[c] for c in consts})  # self, torch, np, ... in one dict (self=... torch refuses)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(float(module.grads_and_loss(given)[1]), rel=1e-12)
    with torch.no_grad():  # and as keywords, all but self
        keywords = model({"self": given["self"]}, **{c: given[c] for c in consts if c != "self"})
    assert float(keywords) == pytest.approx(float(loss.detach()), rel=1e-12)
    assert sorted(k for k, _ in model.named_weights()) == sorted(weights)
    for name, g in model.gradients().items():  # dL/dW = -G_W^t
        np.testing.assert_allclose(-g.numpy(), expected[name], rtol=1e-10, atol=1e-12)
    assert {"def", "class", "None", "print", "sum", "nn"} <= set(model.state_dict())
