"""Differential checking of gradients: one program, every way fdsl computes its gradients, and two
oracles that share nothing with the rules.

Vocabulary
----------
case        program text (parsed by the real front end) that defines a scalar loss ``L`` (no
            differentials) and a 1-form ``w`` with ``w = sign d(L)``: ``w = form(E)`` and
            ``L = trace(E^t E) / 2`` have sign -1, ``w = trace(E^t d(E))`` or ``w = d(L)`` sign +1.
            The gradients of w must then be ``sign dL/dW`` for every weight W.
method      one way of turning the case into gradient numbers, named in reports:
            ``eval[F]``    the numpy evaluation (``fdsl.numbers.numpy_eval``) of the gradient terms
                           ``G_W^t`` of the normal form F of w (``codegen.gradient_terms``),
            ``code[F]``    the generated code (``fdsl.codegen.generated``) of the normal form F,
            ``torch-code[F]`` the same for the torch target (its own lowering passes: stacked
                           heads, fused kernels, addmm), when torch is installed, and
            ``torch-batch[F]`` the torch target on a batch of two examples (the case's data and
                           a second draw of it), against torch autograd's gradients of each
                           example added (the gradient of the loss summed over the batch),
            ``code-batch[F]`` the numpy module on the same batch (its pieces, its sums over it),
            ``dense[F]``   for a case with onehot constants (given as ids to every method above):
                           the generated code of the same program with ``onehot`` struck out
                           of its declarations, given their one-hot matrices (plain products,
                           no lookups, scatters or gathers: a path that shares no rule of
                           ``fdsl.codegen.onehot``),
            ``grad(w)``    what a user gets: ``grad(w)`` in the program (the path of ``fdsl grad``,
                           the repl and ``train``),
            ``torch``      torch autograd of the plain term L (``fdsl.verify.torch_eval``), when
                           torch is installed,
            for each normal form F in ``FORMS``: ``shared`` (the strategy ``backprop``: named
            intermediates and adjoints) and ``expanded`` (the manual's verbs, every product
            multiplied out: ``expandforms`` then ``collect``).
finite      central finite differences of the plain evaluation of L along a random direction
            per weight (``numpy_eval``'s tangent evaluation: fourth order, float64). It checks
            the reference method's directional derivative ``<G_W, V>``; a stencil that crosses a
            kink of relu is skipped (and counted), never trusted. Its error is about C h^4: where
            the loss bends sharply (layernorm of a row of nearly equal entries) the step
            ``FD_STEPS[0]`` is too coarse, so a disagreement is first re-measured with the step
            halved, down to ``FD_STEPS[-1]`` (a truncation error shrinks 16-fold per halving; a
            wrong gradient does not shrink at all); the case counts among ``refined_fd``.
agreement   every method's gradients against the reference (torch when installed, else
            ``eval[shared]``): ``max |a - b| <= tol * scale`` with ``scale`` the largest entry of
            any reference gradient, at least ``FLOOR``: a gradient that is 0 in exact arithmetic
            (a dead relu; dlayernorm(U, ones), flat in U since layernorm ignores a constant added
            to a row) comes out as rounding noise, up to 1.1e-12 where layernorm at a constant row
            amplifies it by 1/sqrt(1e-5), and torch's noise is another (often exactly 0). So the
            agreement is 1e-8 of the largest gradient, or 1e-11 absolute when that is below 1e-3.
            Finite differences: ``|fd - <G, V>| <= fd_tol * scale * ||V||``.
kink        an argument of relu (``m``, ``mm``) that is 0 in exact arithmetic but not in floating
            point (``mm(ddlayernorm(X, X, ones), U)``: layernorm's second derivative along a
            constant row) is at a kink: no derivative exists there, and each implementation's
            mask follows the sign of its own rounding. Such a case (an entry below ``KINK`` in
            size, not 0) is computed every way but not compared, and reported as skipped.
ids         the value of a const declared ``n x v onehot``: integers in [0, v), one a row, drawn
            uniformly; torch autograd and ``dense[F]`` are given their one-hot matrices, every other
            method the ids (a batch stacks them: (2, n)).
overflow    a loss that is not finite at the drawn values (``exp(exp(exp(U)))``) has no numbers to
            compare: the case is reported as skipped. (A finite loss whose gradient is not, or
            any method that fails, is a failure.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..base.errors import FdslError
from ..calculus.forms import weights
from ..codegen import generated as codegen
from ..codegen.grads import gradients, symbol_leaves
from ..core import terms as T
from ..core.ops import shown as op_name
from ..lang.program import parse
from ..numbers.numpy_eval import Evaluator, NonFinite, NotDifferentiable, one_hot
from ..numbers.values import program_values
from ..verify import torch_eval

#: the normal forms every case is lowered from: name -> strategies applied in turn
FORMS = {"shared": ("backprop",), "expanded": ("expandforms", "collect")}
TOL = 1e-8
FD_TOL = 1e-6
#: the finite-difference steps, coarsest first (1e-3 halved down to 3.9e-6): the next is tried
#: only after a disagreement. exp(dlayernorm(sqrt(1 + U o U), X)) (fuzz seed 14) needed 1.5e-5.
FD_STEPS = tuple(1e-3 / 2 ** i for i in range(9))
FLOOR = 1e-3
KINK = 1e-9
#: an expanded normal form larger than this (distinct nodes) is not lowered (it is exponential)
MAX_EXPANDED = 20000


@dataclass
class Report:
    """What one case gave: the gradients of every method, and where they disagree."""

    source: str
    gradients: dict = field(default_factory=dict)  # method -> {weight: array}
    reference: str = ""
    scale: float = 0.0
    disagreements: list = field(default_factory=list)  # (method, weight, error / scale)
    skipped: list = field(default_factory=list)  # (method, reason)
    checked_fd: int = 0
    refined_fd: int = 0  # weights whose finite difference needed a step below FD_STEPS[0]
    batch_closeness: dict = field(default_factory=dict)  # torch-batch[F], code-batch[F] -> largest error / scale

    @property
    def ok(self) -> bool:
        return not self.disagreements

    def worst(self) -> float:
        """The largest disagreement of any method, relative to the scale."""
        return max((e for _, _, e in self.disagreements), default=0.0)

    def describe(self) -> str:
        lines = []
        for method, weight, err in self.disagreements:
            lines.append("%s disagrees with %s on %s: max |difference| = %.3g x the largest gradient"
                         % (method, self.reference, weight, err))
        for method, reason in self.skipped:
            lines.append("%s skipped: %s" % (method, reason))
        return "\n".join(lines)


def draw_values(leaves: dict, dims: dict, seed: int) -> dict:
    """Normal entries for every symbol that needs a value; weights scaled by 1/sqrt(rows); ids
    for a onehot constant."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, leaf in leaves.items():
        symbol, shape = leaf.data
        if symbol.kind == "scalar":
            out[name] = np.full((1, 1), rng.standard_normal())
            continue
        r, c = (dims[s] if isinstance(s, str) else s for s in shape)
        if symbol.onehot:
            out[name] = rng.integers(0, c, r)
            continue
        out[name] = rng.standard_normal((r, c)) / (np.sqrt(r) if symbol.kind == "weight" else 1.0)
    return out


def dense(values: dict, leaves: dict, dims: dict) -> dict:
    """``values`` with the ids of every onehot constant replaced by their one-hot matrices (a
    batch of ids by a batch of matrices)."""
    out = dict(values)
    for name, leaf in leaves.items():
        symbol, shape = leaf.data
        if symbol.onehot and name in out:
            out[name] = one_hot(np.asarray(out[name]), dims[shape[1]] if isinstance(shape[1], str) else shape[1])
    return out


#: ``onehot`` after a declared shape (``const Y : n x v onehot``), for ``dense[F]``
_CONST = re.compile(r"^\s*const\b[^\n#]*", re.M)  # a const declaration, up to a comment


def without_onehot(source: str) -> str:
    """The program ``source`` with ``onehot`` struck out of its declarations (every one of a line:
    ``const X : n x v onehot, Y : n x v onehot``): its constants take their one-hot matrices."""
    return _CONST.sub(lambda m: re.sub(r"\s+onehot\b", "", m.group(0)), source)


def normal_forms(program, w, forms=None) -> tuple:
    """(name -> normal form of w, [(name, reason)] for forms that could not be made)."""
    out, skipped = {}, []
    for name, strategies in (forms or FORMS).items():
        nf = w
        try:
            for s in strategies:
                nf = program.apply_rules(s, nf)
        except FdslError as e:
            skipped.append(("%s form" % name, str(e).splitlines()[0]))
            continue
        if name == "expanded" and T.dag_size(nf) > MAX_EXPANDED:
            skipped.append(("%s form" % name, "%d nodes" % T.dag_size(nf)))
            continue
        out[name] = nf
    return out, skipped


def check(source: str, *, loss: str = "L", form: str = "w", sign: int = 1, seed: int = 0,
          base_dir=None, use_torch: Optional[bool] = None, fd: bool = True, forms=None,
          tol: float = TOL, fd_tol: float = FD_TOL) -> Report:
    """Check the gradients of the case ``source`` every way (see the module doc)."""
    report = Report(source)
    program = parse(source, "<case>", base_dir)
    L, w = program.expr(loss), program.expr(form)
    if not isinstance(L, T.Term) or not L.scalar or L.has_d:
        raise FdslError("the loss %s must be a scalar term without differentials" % loss)
    nfs, report.skipped = normal_forms(program, w, forms)
    dims = dict(program.dims)
    everything = [L] + list(nfs.values())
    leaves = symbol_leaves(everything)
    values = draw_values(leaves, dims, seed)
    ids = any(leaf.data[0].onehot for leaf in leaves.values())
    names = sorted(n for n, leaf in leaves.items() if leaf.data[0].kind == "weight")
    try:
        Evaluator(values, dims).value(L)
    except NonFinite as e:  # float64 overflows before any gradient is taken
        report.skipped.append(("every method", "the loss is not finite at these values: %s"
                               % str(e).splitlines()[0]))
        return report

    def full(grads):  # every weight; one the form does not involve has gradient 0
        return {n: np.asarray(grads[n], dtype=np.float64) if n in grads else np.zeros_like(values[n])
                for n in names}

    got = report.gradients
    torch_grads: dict = {}  # normal form name -> the torch module's grads, compiled once
    if use_torch is None:
        use_torch = torch_eval.available()
    if use_torch:
        tg = torch_eval.TorchEvaluator(dense(values, leaves, dims), dims, names).gradients(L, names)
        got["torch"] = {n: float(sign) * g for n, g in tg.items()}
    if ids:  # the same program without onehot, on the one-hot matrices (see the module doc)
        plain = parse(without_onehot(source), "<case>", base_dir)
        matrices = dense(values, leaves, dims)
        plain_nfs, _ = normal_forms(plain, plain.expr(form), forms)
        for name, nf in plain_nfs.items():
            if weights(nf):
                got["dense[%s]" % name] = full(codegen.compile_gradients(nf, dims)(matrices))
    for name, nf in nfs.items():
        ev = Evaluator(values, dims)
        got["eval[%s]" % name] = full({W: ev.value(g) for W, g in codegen.gradient_terms(nf).items()})
        got["code[%s]" % name] = full(codegen.compile_gradients(nf, dims)(values) if weights(nf) else {})
        if use_torch and weights(nf):
            torch_grads[name] = codegen.compile_namespace(codegen.gradients_source(nf, dims, target="torch"))["grads"]
            got["torch-code[%s]" % name] = full(_torch_code(torch_grads[name], values))
    store = program_values(program)
    store.update(values)
    got["grad(w)"] = full(gradients(program, w))
    report.reference = "torch" if use_torch else ("eval[shared]" if "eval[shared]" in got else next(iter(got)))
    ref = got[report.reference]
    report.scale = max([FLOOR] + [float(np.max(np.abs(g))) for g in ref.values() if g.size])
    kink = _kink_at_the_point(L, values, dims)
    if kink is not None:  # no derivative: every method was run, none can be compared
        report.skipped.append(("every method", kink))
        return report
    for method, grads in got.items():
        for n in names:
            err = float(np.max(np.abs(grads[n] - ref[n]))) if ref[n].size else 0.0
            if not err <= tol * report.scale:  # also catches NaN
                report.disagreements.append((method, n, err / report.scale))
    if use_torch:
        numpy_grads = {name: codegen.compile_gradients(nf, dims) for name, nf in nfs.items() if weights(nf)}
        _batched_torch(report, torch_grads, numpy_grads, L, leaves, values, dims, names, ref, sign, seed, tol,
                       full)
    if fd:
        _finite_differences(report, L, values, dims, names, ref, sign, seed, fd_tol)
    return report


def _batched_torch(report, torch_grads, numpy_grads, L, leaves, values, dims, names, ref, sign, seed, tol, full):
    """``torch-batch[F]`` and ``code-batch[F]`` (see the module doc; the numpy module's on the same
    batch): skipped where the case has no data, or its second draw has no finite loss or sits at
    a kink."""
    data = [n for n, leaf in leaves.items() if leaf.data[0].kind == "const"]
    if not data or not torch_grads:
        return
    second = dict(values)
    second.update({k: v for k, v in draw_values(leaves, dims, seed + 7919).items() if k in data})
    try:
        Evaluator(second, dims).value(L)
    except NonFinite:
        return
    if _kink_at_the_point(L, second, dims) is not None:
        return
    tg = torch_eval.TorchEvaluator(dense(second, leaves, dims), dims, names).gradients(L, names)
    want = {n: ref[n] + float(sign) * tg[n] for n in names}
    scale = max([report.scale] + [float(np.max(np.abs(g))) for g in want.values() if g.size])
    batch = {k: np.stack([values[k], second[k]]) if k in data else v for k, v in values.items()}
    runs = [("torch-batch[%s]" % name, lambda g=grads: _torch_code(g, batch)) for name, grads in torch_grads.items()]
    runs += [("code-batch[%s]" % name, lambda g=grads: g(batch)) for name, grads in numpy_grads.items()]
    for method, run in runs:
        got = full(run())  # (not among report.gradients: another point)
        report.batch_closeness[method] = 0.0
        for n in names:
            err = float(np.max(np.abs(got[n] - want[n]))) if want[n].size else 0.0
            report.batch_closeness[method] = max(report.batch_closeness[method], err / scale)
            if not err <= tol * scale:
                report.disagreements.append((method, n, err / scale))


def _torch_code(grads, values) -> dict:
    """The gradients ``grads`` (a torch module's, as ``fdsl codegen --target torch`` writes it)
    gives at ``values``, in float64, as numpy arrays."""
    import torch

    given = {k: torch.as_tensor(np.asarray(v, dtype=np.int64 if np.asarray(v).dtype.kind in "iu" else np.float64))
             if np.ndim(v) else v for k, v in values.items()}  # ids stay integers
    return {k: np.asarray(v.detach().numpy() if torch.is_tensor(v) else v, dtype=np.float64)
            for k, v in grads(given).items()}


def _kink_at_the_point(L, values, dims) -> Optional[str]:
    """Why L has no derivative at ``values`` (an argument of relu is 0 up to rounding), or None."""
    ev = Evaluator(values, dims)
    ev.value(L)
    for node in list(ev.memo):
        if node.op in ("m", "mm"):
            x = ev.memo[node.args[0]]
            near = (np.abs(x) < KINK) & (x != 0)
            if near.any():
                return ("an argument of %s is 0 up to rounding (%.1g) at the point: no derivative there"
                        % (op_name(node.op), float(np.max(np.abs(x[near])))))
    return None


def _finite_differences(report, L, values, dims, names, ref, sign, seed, fd_tol):
    rng = np.random.default_rng(seed + 1)
    dL = T.d(L)
    for n in names:
        v = rng.standard_normal(values[n].shape)
        exact = float(np.sum(ref[n] * v)) / float(sign)  # ref is sign dL/dW
        for i, h in enumerate(FD_STEPS):
            try:
                fd = float(Evaluator(values, dims, tangent={n: v}, step=h).value(dL)[0, 0])
            except NotDifferentiable:
                report.skipped.append(("finite differences on %s" % n, "the stencil crosses a kink of relu"))
                break
            err = abs(fd - exact) / (np.linalg.norm(v) * report.scale)
            if err <= fd_tol or i == len(FD_STEPS) - 1:
                report.checked_fd += 1
                report.refined_fd += i > 0
                if not err <= fd_tol:  # also NaN
                    report.disagreements.append(("finite differences", n, err))
                break
