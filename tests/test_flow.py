"""Flows: 1-forms dualized against a metric, held against dense solves at small sizes.

- Euclidean: the flow is ``grad`` itself.
- kron(L, R): ``L^-1 G^t R^-1`` with G^t from central differences of the loss and L, R evaluated
  directly; and the defining property ``g(v, A) = w(A)`` for random A.
- gaussnewton(E, lambda): ``-(J^t J + lambda I)^-1 J^t vec(E)`` with J from finite differences
  (and ``torch.func.jacrev`` where torch is installed), to 1e-8.
- A linear reparametrization W = A W' leaves the Gauss-Newton step unchanged and changes the
  Euclidean one (a Hypothesis property).
"""

import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from oracle import ENCODER, central_difference, gradient, kink_margin, rel_error, weight_values

import fdsl
from fdsl.base.errors import FdslError
from fdsl.learn.flow import conjugate_gradients, flows_of
from fdsl.numbers.numpy_eval import evaluate
from fdsl.numbers.values import Values


def program_with(text, values):
    """A program from ``text`` whose symbols take ``values`` (a dict by printed name)."""
    program = fdsl.parse(textwrap.dedent(text))
    store = Values(program)
    store.update(values)
    program.values = store
    return program


def flows(program, name="w"):
    return flows_of(program, program.expr(name))


def names_of(weights):
    return [w.data[0].printed() for w in weights]


def jacobian_fd(program, e, values, names, h=1e-3):
    """dE/d(weights) column by column (row-major within each weight), by 4th-order central differences."""
    f = lambda vals: evaluate(e, vals, program.dims)
    cols = []
    for name in names:
        base = np.asarray(values[name])
        for index in np.ndindex(base.shape):
            step = np.zeros_like(base)
            step[index] = 1.0
            cols.append(np.asarray(central_difference(f, values, {name: step}, h)).reshape(-1))
    return np.stack(cols, axis=1)


def dense_gauss_newton(jac, e, lam):
    """-(J^t J + lambda I)^-1 J^t vec(E)."""
    return -np.linalg.solve(jac.T @ jac + lam * np.eye(jac.shape[1]), jac.T @ e.reshape(-1))


def split(vector, values, names):
    out, at = {}, 0
    for name in names:
        shape = np.shape(values[name])
        size = int(np.prod(shape))
        out[name] = vector[at:at + size].reshape(shape)
        at += size
    return out


# ---- one layer of the shared encoder --------------------------------------------------------------

LAYER = ENCODER + "X0 = X\nE := Y - layer(0, X0)\nw = form(E)\n"


@pytest.fixture(scope="module")
def layer():
    program = fdsl.parse(LAYER)
    weights = fdsl.calculus.forms.weights(program.apply_rules("normal", program["w"]))
    values = weight_values(program, weights, seed=3, inputs=("X", "Y"))
    assert kink_margin(program, program["E"], values) > 1e-2  # finite differences stay on one side of relu
    return program, names_of(weights), values


def test_the_euclidean_flow_is_grad(layer):
    program, names, values = layer
    p = program_with(LAYER, values)
    v = flows(p)
    g = p.expr("grad(w)")
    assert list(v) == names == list(g)
    for name in names:
        assert np.array_equal(v[name], g[name])
    assert v.metric == "euclidean on K_0, Q_0, V_0, W_0, b_0, f_0"
    # and both are -dL/dW, by finite differences of L = 1/2 ||E||^2
    loss = lambda vals: 0.5 * np.sum(evaluate(program["E"], vals, program.dims) ** 2)
    fd = gradient(loss, values, ["K_0", "b_0"], h=1e-3)
    assert rel_error(v["K_0"], -fd["K_0"]) < 1e-8 and rel_error(v["b_0"], -fd["b_0"]) < 1e-8


KRON = LAYER + textwrap.dedent("""\
    const Z : k x k
    metric Q[i], K[i] = kron(X^t X / 8 + eye(d) / 10, Z Z^t + eye(k))
    metric W[i] = kron(2, eye(d))
    """)


def test_kron_against_the_direct_product(layer):
    program, names, values = layer
    rng = np.random.default_rng(0)
    values = dict(values, Z=rng.standard_normal((4, 4)))
    p = program_with(KRON, values)
    v = flows(p)
    assert v.metric == ("kron((1/8) X^t X + (1/10) I_d, Z Z^t + I_k) on K_0, Q_0; euclidean on V_0, b_0, f_0; "
                        "kron(2, I_d) on W_0")
    loss = lambda vals: 0.5 * np.sum(evaluate(program["E"], vals, program.dims) ** 2)
    fd = {n: -g for n, g in gradient(loss, values, names, h=1e-3).items()}  # G^t = -dL/dW
    x = values["X"]
    left = x.T @ x / 8 + np.eye(6) / 10
    right = values["Z"] @ values["Z"].T + np.eye(4)
    for name in ("Q_0", "K_0"):
        direct = np.linalg.inv(left) @ fd[name] @ np.linalg.inv(right)
        assert rel_error(v[name], direct) < 1e-8
        # the defining property: g(v, A) = trace(v^t L A R) equals w(A) = <G^t, A> for every A
        a = rng.standard_normal(v[name].shape)
        assert np.trace(v[name].T @ left @ a @ right) == pytest.approx(np.sum(fd[name] * a), rel=1e-8)
    assert rel_error(v["W_0"], fd["W_0"] / 2) < 1e-8
    for name in ("V_0", "b_0", "f_0"):
        assert rel_error(v[name], fd[name]) < 1e-8


def test_gauss_newton_against_a_dense_solve(layer):
    program, names, values = layer
    lam = 0.1
    p = program_with(LAYER + "metric gaussnewton(E, 1/10, 1.0e-12)\n", values)
    v = flows(p)
    (solve,) = v.solves
    assert solve.residual <= 1e-12 and 0 < solve.iterations <= 2 * 119 + 50
    assert "conjugate gradients reached a relative residual of" in v.notes()[1]
    e = evaluate(program["E"], values, program.dims)
    jac = jacobian_fd(program, program["E"], values, names)
    assert jac.shape == (48, 119)
    dense = split(dense_gauss_newton(jac, e, lam), values, names)
    for name in names:
        assert rel_error(v[name], dense[name]) < 1e-8, name


def test_gauss_newton_against_torch_jacrev(layer):
    torch = pytest.importorskip("torch")
    from torch.func import jacrev

    program, names, values = layer
    lam = 0.01
    p = program_with(LAYER + "metric gaussnewton(E, 1/100, 1.0e-12, 2000)\n", values)
    v = flows(p)
    t = {k: torch.tensor(np.asarray(a), dtype=torch.float64) for k, a in values.items()}

    def error(*ws):
        q, k, vv, wo, b, f = ws
        z = t["X"]
        s = 4 ** -0.5
        att = torch.softmax(s * z @ q @ k.T @ z.T, dim=1)
        return t["Y"] - (torch.relu(att @ z @ vv + b) @ wo + f)

    order = ["Q_0", "K_0", "V_0", "W_0", "b_0", "f_0"]
    jac = jacrev(error, argnums=tuple(range(6)))(*(t[n] for n in order))
    columns = {n: j.reshape(48, -1).numpy() for n, j in zip(order, jac)}
    full = np.concatenate([columns[n] for n in names], axis=1)
    e = error(*(t[n] for n in order)).numpy()
    dense = split(dense_gauss_newton(full, e, lam), values, names)
    for name in names:
        assert rel_error(v[name], dense[name]) < 1e-8, name


def test_gauss_newton_block_with_other_metrics(layer):
    """Weights with a metric of their own stay out of the block: J has only the others' columns."""
    program, names, values = layer
    p = program_with(LAYER + "metric gaussnewton(E, 1/10, 1.0e-12)\nmetric b[i], f[i] = euclidean\n", values)
    v = flows(p)
    block = [n for n in names if n not in ("b_0", "f_0")]
    assert v.solves[0].weights == block
    e = evaluate(program["E"], values, program.dims)
    dense = split(dense_gauss_newton(jacobian_fd(program, program["E"], values, block), e, 0.1), values, block)
    g = p.expr("grad(w)")
    for name in names:
        assert rel_error(v[name], dense[name] if name in block else g[name]) < 1e-8, name


# ---- Gauss-Newton does not see a linear change of coordinates; Euclidean does -----------------------

PLAIN = """\
dim n = 12, d = 3, h = 2
const X : n x d, Y : n x h
const C : n x 1 = ones
weight W : d x h, b : 1 x h
E := Y - m(X W + C b)
w = form(E)
metric gaussnewton(E, 0, 1.0e-13, 500)
"""
REPARAMETRIZED = PLAIN.replace("weight W", "const A : d x d\nweight P").replace("X W", "X A P")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_gauss_newton_is_invariant_under_reparametrization(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((12, 3)), rng.standard_normal((12, 2))
    w, b = rng.standard_normal((3, 2)), rng.standard_normal((1, 2)) / 2
    pre = x @ w + b
    # every unit active on enough rows that J has full column rank, and no entry near the kink
    assume(((pre > 0).sum(axis=0) >= 5).all() and np.abs(pre).min() > 1e-3)
    a = rng.standard_normal((3, 3)) + 2 * np.eye(3)
    assume(np.linalg.cond(a) < 50)
    plain = program_with(PLAIN, dict(X=x, Y=y, W=w, b=b))
    reparam = program_with(REPARAMETRIZED, dict(X=x, Y=y, P=np.linalg.solve(a, w), A=a, b=b))
    v, u = flows(plain), flows(reparam)
    # the step in W' = A^-1 W, pushed forward by W = A W', is the step in W
    assert rel_error(a @ u["P"], v["W"]) < 1e-6
    assert rel_error(u["b"], v["b"]) < 1e-6
    # the Euclidean step is not: A grad_W' = A A^t grad_W
    ge, gr = plain.expr("grad(w)"), reparam.expr("grad(w)")
    assert rel_error(a @ a.T @ ge["W"], a @ gr["P"]) < 1e-10
    assert rel_error(a @ gr["P"], ge["W"]) > 1e-3


# ---- conjugate gradients and errors --------------------------------------------------------------


def test_conjugate_gradients_reports_what_it_reached():
    rng = np.random.default_rng(1)
    m = rng.standard_normal((30, 30))
    a = m @ m.T + 0.1 * np.eye(30)
    b = rng.standard_normal(30)
    x, iterations, residual, converged = conjugate_gradients(lambda p: a @ p, b, 1e-12, 200)
    assert converged and residual <= 1e-12 and iterations >= 10
    assert np.linalg.norm(b - a @ x) / np.linalg.norm(b) == pytest.approx(residual)
    x, iterations, residual, converged = conjugate_gradients(lambda p: a @ p, b, 1e-12, 3)
    assert not converged and iterations == 3 and residual > 1e-6


def test_an_iteration_limit_stops_with_its_reason(layer):
    program, names, values = layer
    p = program_with(LAYER + "metric gaussnewton(E, 1/1000, 1.0e-12, 3)\n", values)
    with pytest.raises(FdslError, match=r"relative residual of .*, not the tolerance 1e-12, within 3 "
                                        r"iterations \(the limit\): raise the limit or the tolerance"):
        flows(p)


@pytest.mark.parametrize("line, message", [
    ("metric Q[i] = kron(X^t X, eye(k))", r"L = X\^t X of the metric kron\(L, R\) on Q_0 is not positive definite"),
    ("metric Q[i] = kron(eye(d) - 2 eye(d), eye(k))", r"is not positive definite \(its smallest eigenvalue is -1\)"),
    ("const Z : d x d\nmetric Q[i] = kron(Z, eye(k))", r"L = Z of the metric kron\(L, R\) on Q_0 is not symmetric"),
])
def test_a_metric_that_is_not_spd_is_refused(layer, line, message):
    program, names, values = layer
    text = LAYER.replace("dim n = 8", "dim n = 4") + line + "\n"  # X^t X (6 x 6) has rank 4
    vals = dict(values, X=values["X"][:4], Y=values["Y"][:4])
    if "const Z" in line:
        vals["Z"] = np.arange(36.0).reshape(6, 6)
    with pytest.raises(FdslError, match=message):
        flows(program_with(text, vals))


@pytest.mark.parametrize("line, message", [
    ("metric Q[i] = kron(eye(k), eye(k))",
     r":13:20: kron\(L, R\) on Q\[i\] \(d x k\): I_k is \(k x k\), not square in its rows \(d\)"),
    ("metric X = euclidean",
     r"a metric is on a weight \(U, K\[1\]\) or a family of weights \(K\[i\]\), not the matrix expression X"),
    ("metric Q = euclidean", r"Q is an indexed family: write metric Q\[i\] = ... for all its members"),
    ("metric Q[i] = riemann", r"a metric is euclidean, kron\(L, R\) or gaussnewton\(E, lambda\), not 'riemann'"),
    ("metric gaussnewton(X, 1)", r"E of gaussnewton\(E, lambda\) must depend on weights"),
    ("metric gaussnewton(E, -1)", r"lambda must be a number >= 0, not the number -1"),
    ("metric kron(eye(d), eye(k))", r"kron\(L, R\) is the metric of one weight's shape: write metric W = kron\(L, R\)"),
    ("metric Q[i] + K[i] = euclidean", r"unexpected '\+'"),
])
def test_bad_metric_statements(line, message):
    with pytest.raises(FdslError, match=message):
        fdsl.parse(LAYER + line + "\n")


def test_metric_statements_override_in_order(layer):
    program, names, values = layer
    p = program_with(LAYER + "metric Q[i] = kron(2, 1)\nmetric Q[0] = kron(4, 1)\nmetric K[i] = kron(3, 1)\n"
                             "metric euclidean\nmetric V[i] = kron(5, 1)\n", values)
    v, g = flows(p), p.expr("grad(w)")
    assert rel_error(v["V_0"], g["V_0"] / 5) < 1e-14
    assert np.array_equal(v["Q_0"], g["Q_0"]) and np.array_equal(v["K_0"], g["K_0"])
    p = program_with(LAYER + "metric Q[i] = kron(2, 1)\nmetric Q[0] = kron(4, 1)\n", values)
    assert rel_error(flows(p)["Q_0"], g["Q_0"] / 4) < 1e-14


# ---- fdsl flow ------------------------------------------------------------------------------------


def test_fdsl_flow_writes_one_array_per_weight(run_fdsl, examples, tmp_path):
    fd = tmp_path / "gn.fd"
    fd.write_text((examples / "encoder2.fd").read_text() + "metric gaussnewton(E, 1/10)\n")
    out = tmp_path / "v.npz"
    r = run_fdsl("flow", fd, "--form", "w", "--random", "0", "--out", out)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "wrote %s: 12 flows (K_0, K_1, Q_0, Q_1, V_0, V_1, W_0, W_1, b_0, b_1, f_0, f_1)" % out
    assert lines[1] == "metric: gaussnewton(E, 0.1) on K_0, K_1, Q_0, Q_1, V_0, ... (12 weights)"
    assert "conjugate gradients reached a relative residual of" in lines[2]
    saved = dict(np.load(out))
    assert len(saved) == 12
    g = tmp_path / "g.npz"
    assert run_fdsl("grad", fd, "--form", "w", "--random", "0", "--out", g).returncode == 0
    grads = dict(np.load(g))
    assert str(grads.pop("_sign")).startswith("-dL/dW")  # the file says which sign it holds
    assert set(grads) == set(saved)
    # the Gauss-Newton step is a descent direction: <v, grad> > 0 (the gradient here is -dL/dW)
    assert sum(np.sum(saved[n] * grads[n]) for n in saved) > 0


def test_fdsl_flow_errors(run_fdsl, tmp_path):
    fd = tmp_path / "bad.fd"
    fd.write_text("dim n = 3\nweight U : n x n\nconst L : n x n\nmetric U = kron(L, 1)\nw = form(U)\n")
    out = tmp_path / "v.npz"
    r = run_fdsl("flow", fd, "--form", "w", "--random", "0", "--out", out)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "L = L of the metric kron(L, R) on U is not symmetric" in r.stderr
    assert not out.exists()
