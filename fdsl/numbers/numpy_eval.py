"""Evaluate terms with numpy: the operator table lowered to numpy, and the values of symbols.

Vocabulary
----------
lowering    the numpy function of an operator, compiled once from its template in the operator
            table (``OPS[op].numpy``, e.g. ``np.maximum({0}, 0.0)``). Placeholders: ``{0}``,
            ``{1}``... the argument values; ``{args}``, ``{args_sum}``, ``{args_had}`` all the
            arguments joined by ``, ``, `` + `` and `` * `` (for n-ary operators); ``{value}`` and
            ``{exponent}`` the number a node carries (``num``, ``pow``). Templates may call ``np``
            and the helpers of ``fdsl.numbers.numpy_runtime`` (``_softmax``, ``_mm``, ``_aa``,
            ``_mul``).
leaf        ``sym``, ``zero``, ``eye``: their values come from the symbol values and the dims,
            not from a template. ``let`` evaluates as its body; ``d`` has no numeric value, except
            along a tangent (below).
tangent     a direction in weight space (arrays by printed name; weights not named stay put).
            An evaluator given one evaluates ``d(T)`` as the derivative of T along it, by central
            finite differences in float64 (fourth order, step ``step``): T is re-evaluated with the
            weights moved, so the result depends on evaluation alone, never on the rules. This is
            the independent oracle of ``fdsl rules --check`` and the property tests; a stencil
            that crosses a kink of relu (a sign of an argument of ``m`` or ``mm`` changes) raises
            ``NotDifferentiable`` instead of returning a meaningless number.
values      numeric values of symbols keyed by printed name (``X``, ``Q_0``): a plain dict, or a
            program's ``Values``, a dict that also creates random values on demand (``random``).
dims        sizes of dims by name; a dim declared without a size (``dim n``) takes it from the
            shapes of the given arrays.
evaluation  one pass over the shared term graph, children first: each distinct node is computed
            once (``encoder(30)`` costs 30 layers of work, not 3^30), in float64, with scalars as
            1 x 1 arrays.

Symbols with a value in their declaration (``C = ones``, ``scalar s = k^(-1/2)``, dims) evaluate
to it; every other symbol needs a value from a file (``values "f.npz"``, ``fdsl run --values``) or
a seed (``random SEED``, ``fdsl run --random``). Random values are drawn per symbol from a
generator seeded by (seed, crc32 of the printed name), so ``Q_7`` gets the same value whichever
symbols were drawn before it, and symbols are drawn only when an evaluation reaches them.
"""

from __future__ import annotations

import inspect
from fractions import Fraction
from functools import lru_cache
from typing import Mapping, Optional

import numpy as np

from ..base.errors import FdslError
from ..base.inputs import check_allocation
from ..core.ops import OPS, shape_str
from ..core.ops import shown as op_name
from ..core.printers import text
from ..core.terms import Symbol, Term, init_text, postorder, tree_size
from . import numpy_runtime


def initial_value(symbol: Symbol, shape: tuple, rng=None) -> np.ndarray:
    """The value of a weight declared with an initial value (``Symbol.init``: ones, zeros, identity,
    normal(mean, std)) of ``shape``, float64; a normal one is drawn from ``rng``."""
    kind = symbol.init[0]
    if kind == "ones":
        return np.ones(shape)
    if kind == "zeros":
        return np.zeros(shape)
    if kind == "identity":
        return np.eye(shape[0])
    mean, std = symbol.init[1:]
    return mean + std * rng.standard_normal(shape)


# ---- lowering: operator -> numpy function -----------------------------------------------------

_RUNTIME = {name: f for name, f in vars(numpy_runtime).items()
            if inspect.isfunction(f) and f.__module__ == numpy_runtime.__name__}
_LEAVES = ("sym", "zero", "eye", "ones", "let", "d")


def runtime_source() -> str:
    """The source of the runtime helpers, for copying into generated code."""
    return inspect.getsource(numpy_runtime)


@lru_cache(maxsize=None)
def _compile(op: str, nargs: int, template: str):
    names = ["x%d" % i for i in range(nargs)]
    try:
        expr = template.format(*names, args=", ".join(names), args_sum=" + ".join(names),
                               args_had=" * ".join(names), value="data", exponent="data")
    except (KeyError, IndexError) as e:
        raise FdslError("the numpy template of operator %s, %r, uses an unknown placeholder %s"
                        % (op, template, e)) from None
    source = "def lowered(%s):\n    return %s\n" % (", ".join(names + ["data"]), expr)
    namespace = {"np": np, **_RUNTIME}
    try:
        exec(compile(source, "<numpy lowering of %s>" % op, "exec"), namespace)
    except SyntaxError as e:
        raise FdslError("the numpy template of operator %s, %r, is not a Python expression: %s"
                        % (op, template, e.msg)) from None
    return namespace["lowered"]


def lowering(op: str, nargs: int):
    """The numpy function of ``op`` applied to ``nargs`` arguments: ``f(*arrays, data)``."""
    spec = OPS.get(op)
    if spec is None or spec.numpy is None:
        raise FdslError("operator %s has no numpy implementation, so terms using it cannot be evaluated" % op)
    return _compile(op, nargs, spec.numpy)


# ---- evaluation -----------------------------------------------------------------------------------


def _short(t: Term) -> str:
    """A term for a message: in full when small, else its head (terms can be exponentially long)."""
    if tree_size(t) <= 60:
        return text(t)
    return "%s(...)" % op_name(t.op) if t.op not in ("add", "mul", "had") else "a %s of %d terms" % (
        {"add": "sum", "mul": "product", "had": "Hadamard product"}[t.op], len(t.args))


class Evaluator:
    """Evaluates terms over a fixed set of values and dims, remembering every node it computed.

    ``evaluations`` counts the nodes computed: for a fresh evaluator and one term it is the number
    of distinct nodes of the term (``dag_size``).
    """

    def __init__(self, values: Optional[Mapping] = None, dims: Optional[Mapping] = None,
                 origin: Optional[dict] = None, tangent: Optional[Mapping] = None, step: float = 1e-3):
        self.values = values if values is not None else {}
        self.tangent = tangent  # printed weight name -> direction; enables d(...) (see the module doc)
        self.step = step
        self.dims = {k: v for k, v in (dims or {}).items() if v is not None}
        self.origin = dict(origin or {})  # dim -> symbol whose array gave its size, for messages
        self.memo: dict = {}
        self.evaluations = 0
        self._bound: dict = {}  # printed name -> the given array, checked against its declaration
        self._masks: set = set()  # nodes that may hold -inf by design (see _masked)

    def value(self, term: Term) -> np.ndarray:
        """The value of ``term``: a float64 array, 1 x 1 for scalars."""
        memo = self.memo
        self._bind(term)
        # numpy's overflow and invalid-value warnings are replaced by _check_finite's message
        with np.errstate(all="ignore"):
            for node in postorder(term, descend=lambda n: n not in memo):
                if node not in memo:
                    self._check_size(node)
                    memo[node] = out = self._node(node)
                    self.evaluations += 1
                    _check_finite(node, out, self._masked(node))
        return memo[term]

    def _masked(self, node: Term) -> bool:
        """Whether ``node`` may hold -inf by design: a causal mask, or a sum or transpose with one in
        it (``S + M``, which softmax turns into finite numbers)."""
        masks = self._masks
        if (node.op == "sym" and node.data[0].value == "causal") or (
                node.op in ("add", "t") and any(a in masks for a in node.args)):
            masks.add(node)
            return True
        return False

    def _check_size(self, node: Term) -> None:
        """Refuse, before computing it, a value that would not fit in memory (dim n = 10^9)."""
        if node.shape is None:
            return
        sizes = [side if isinstance(side, int) else self.dims.get(side) for side in node.shape]
        if None not in sizes and 8 * sizes[0] * sizes[1] > (1 << 26):  # the message only when it may be needed
            check_allocation(8 * sizes[0] * sizes[1], "the value of %s, %d x %d floats," % (_short(node), *sizes))

    # -- nodes

    def _node(self, node: Term) -> np.ndarray:
        op = node.op
        if op == "sym":
            return self._symbol(node)
        if op == "zero":
            return np.zeros(self.shape(node.data, "the zero matrix"))
        if op == "eye":
            return np.eye(self.size(node.data, "the identity matrix"))
        if op == "ones":
            return np.ones(self.shape(node.data, "the matrix of ones"))
        if op == "let":
            return self.memo[node.args[0]]
        if op == "d" and self.tangent is not None:
            return self._differential(node)
        if op == "d":
            raise FdslError("cannot evaluate %s: a differential is a matrix of 1-forms, not of numbers; "
                            "evaluate a coefficient instead (coeff or grad)" % _short(node))
        data = float(node.data) if isinstance(node.data, Fraction) else node.data
        out = lowering(op, len(node.args))(*(self.memo[a] for a in node.args), data)
        out = np.asarray(out, dtype=np.float64)
        if out.ndim == 0:
            out = out.reshape(1, 1)
        self._check_result(node, out)
        return out

    def _differential(self, node: Term) -> np.ndarray:
        """d(T) along the tangent: (8 (T(h) - T(-h)) - (T(2h) - T(-2h))) / 12h, where T(t) is T
        with every weight W moved to W + t tangent[W]. T itself is already in the memo (children
        first), so the signs of its relu arguments at t = 0 are known to compare with."""
        arg = node.args[0]
        base, moving = {}, []
        for leaf in postorder(arg):
            if leaf.op != "sym":
                continue
            symbol = leaf.data[0]
            if symbol.kind == "dim" or symbol.value is not None:
                continue  # built-in values: the sub-evaluators compute them themselves
            name = symbol.printed()
            base[name] = self.memo[leaf]
            if symbol.onehot:  # the memo holds its one-hot rows; the sub-evaluators take its ids
                base[name] = np.argmax(base[name], axis=-1)
            if symbol.kind == "weight" and name in self.tangent:
                moving.append(name)
        h = self.step

        def at(t):
            values = dict(base)
            for name in moving:
                values[name] = base[name] + t * np.asarray(self.tangent[name], dtype=np.float64)
            sub = Evaluator(values, self.dims, self.origin, self.tangent, h)
            out = sub.value(arg)
            for n in sub.memo:
                if n.op in ("m", "mm"):
                    x = n.args[0]
                    if not np.array_equal(sub.memo[x] > 0, self.memo[x] > 0):
                        raise NotDifferentiable("the finite difference of %s crosses a kink of relu "
                                                "(an argument of %s changes sign within %g of the "
                                                "point)" % (_short(arg), op_name(n.op), 2 * h))
            return out

        if not moving:
            return np.zeros_like(self.memo[arg])
        return (8.0 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12.0 * h)

    def _check_result(self, node, out):
        # the template is trusted for the numbers but not for the shape: a broadcast that
        # silently changes a shape would make every later number wrong
        rows, cols = node.shape
        for side, got in ((rows, out.shape[0]), (cols, out.shape[1] if out.ndim > 1 else None)):
            if isinstance(side, str) and side not in self.dims and got is not None:
                self.dims[side] = got  # e.g. C = ones is n x 1: a computed value may tell n
        expected = self.shape(node.shape, "a result")
        if out.shape != expected:
            raise FdslError("the numpy lowering of %s gave shape %s, not %s, for %s"
                            % (op_name(node.op), out.shape, expected, _short(node)))

    def _symbol(self, node: Term) -> np.ndarray:
        symbol, shape = node.data
        if symbol.kind == "dim":
            size = symbol.value if isinstance(symbol.value, int) else self.size(symbol.name, "dim %s" % symbol.name)
            return np.full((1, 1), float(size))
        if symbol.value == "ones":
            return np.ones(self.shape(shape, symbol.printed()))
        if symbol.value == "identity":
            return np.eye(self.size(shape[0], symbol.printed()))
        if symbol.value == "causal":
            return numpy_runtime._causal(self.size(shape[0], symbol.printed()))
        if isinstance(symbol.value, Term):  # a scalar with a value expression, e.g. k^(-1/2)
            return Evaluator(self.values, self.dims, self.origin).value(symbol.value)
        name = symbol.printed()
        if name in self._bound:
            return self._bound[name]
        if getattr(self.values, "seed", None) is not None:  # a program's Values draws on demand
            drawn = self.values.generate(symbol, self.shape(shape, "drawing random values for %s" % name))
            return one_hot(drawn, self.size(shape[1], name)) if symbol.onehot else drawn
        if symbol.init is not None and symbol.init[0] != "normal":  # ones, zeros, identity: no seed needed
            value = self._bound[name] = initial_value(symbol, self.shape(shape, name))
            return value
        if symbol.init is not None:
            raise FdslError("%s has no value: its initial value %s is drawn by 'random SEED' (or fdsl run "
                            "--random), or give it with 'values \"FILE.npz\"'" % (name, init_text(symbol.init)))
        raise FdslError("%s has no value: give values with 'values \"FILE.npz\"' (or fdsl run --values), "
                        "or random ones with 'random SEED' (or fdsl run --random)" % name)

    # -- shapes and sizes

    def size(self, dim, what: str) -> int:
        """The size of a dim (a name or a number)."""
        if isinstance(dim, int):
            return dim
        size = self.dims.get(dim)
        if size is None:
            raise FdslError("%s needs the size of dim %s, which has none: declare it with one "
                            "(dim %s = 8) or give a value whose shape has it" % (what, dim, dim))
        return size

    def shape(self, shape, what: str) -> tuple:
        return tuple(self.size(side, what) for side in shape)

    def _bind(self, term: Term):
        """Check the given arrays of the symbols under ``term`` against their declared shapes,
        learning the sizes of dims declared without one."""
        for node in postorder(term, descend=lambda n: n not in self.memo):
            if node.op != "sym" or node in self.memo:
                continue
            symbol, shape = node.data
            name = symbol.printed()
            if symbol.kind == "dim" or symbol.value is not None or name in self._bound:
                continue
            if name in self.values:
                self._bound[name] = conform(name, self.values[name], symbol, shape, self.dims, self.origin)
                if symbol.onehot:  # ids: the interpreter computes with their one-hot rows
                    ids = self._bound[name]
                    if ids.ndim == 2:
                        raise FdslError("%s holds a batch of %d examples: eval works on one example (give "
                                        "%d ids); grad, train and generated code take batches"
                                        % (name, ids.shape[0], ids.shape[1]))
                    self._bound[name] = one_hot(ids, self.size(shape[1], name))
                if self._bound[name].ndim == 3:
                    raise FdslError("%s holds a batch of %d examples: eval works on one example (give a %s "
                                    "array); grad, train and generated code take batches"
                                    % (name, self._bound[name].shape[0], shape_str(self._bound[name].shape[1:])))


class NotDifferentiable(FdslError):
    """A finite difference whose stencil crosses a kink of relu: resample the point."""


class NonFinite(FdslError):
    """The first value of an evaluation that is infinite or not a number, and the term that made it."""


def first_non_finite(array) -> Optional[str]:
    """``nan at [2, 0]`` for the first entry of ``array`` that is not finite, or None."""
    bad = ~np.isfinite(array)
    if not bad.any():
        return None
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    return "%s at %s" % (array[index], list(index))


def _check_finite(node: Term, out, masked: bool = False) -> None:
    """Evaluation is children first, so the first node whose value is not finite is the one that
    made it (its operands were finite): the message names it. A masked value (a causal mask, and
    sums holding one) may hold -inf."""
    bad = first_non_finite(np.where(np.isneginf(out), 0.0, out) if masked else out)
    if bad is not None:
        if node.op == "sym":
            raise NonFinite("the value of %s is not finite: %s" % (node.data[0].printed(), bad))
        raise NonFinite("%s is not finite (%s) though its operands are: the first non-finite value of "
                        "this evaluation" % (_short(node), bad))


def conform(name: str, array, symbol: Symbol, shape, dims: dict, origin: dict, source: str = "") -> np.ndarray:
    """``array`` as the value of ``symbol``: float64, 2-d, of its declared ``shape``; learns the
    sizes of dims without one into ``dims`` (and who gave them into ``origin``)."""
    where = " in %s" % source if source else ""
    if symbol.onehot:
        return conform_ids(name, array, shape, dims, origin, where)
    try:
        array = np.asarray(array)
    except Exception:  # e.g. a ragged list: whatever numpy says, it is not a matrix
        raise FdslError("the value of %s%s is not a matrix of numbers" % (name, where)) from None
    if array.dtype.kind not in "biuf":
        raise FdslError("the value of %s%s must hold real numbers, not %s" % (name, where, array.dtype))
    if array.size == 0:  # numpy reduces an empty matrix (a softmax's max) to no value at all
        raise FdslError("the value of %s%s is empty (shape %s): a matrix has at least one row and one "
                        "column" % (name, where, " x ".join(map(str, array.shape))))
    array = array.astype(np.float64)
    bad = first_non_finite(array)
    if bad is not None:
        raise FdslError("the value of %s%s is not finite: %s" % (name, where, bad))
    rows, cols = shape
    if array.ndim == 0 and rows == 1 and cols == 1:
        array = array.reshape(1, 1)
    elif array.ndim == 1 and rows == 1:  # a row vector given flat
        array = array.reshape(1, -1)
    elif array.ndim == 1 and cols == 1:
        array = array.reshape(-1, 1)
    if array.ndim == 3 and symbol.kind == "const" and array.shape[0] > 0:
        # a batch of examples, (batch, rows, cols): generated code (grad, train, codegen) sums the
        # gradients over it; the rows and columns are checked as for one example
        try:
            conform(name, array[0], symbol, shape, dims, origin, source)
        except FdslError as e:
            raise FdslError("%s (a batch of %d examples, shape %s)" % (e.message, array.shape[0], array.shape),
                            e.file) from None
        return array
    if array.ndim != 2:
        raise FdslError("the value of %s%s has shape %s, but %s is declared %s: values are matrices"
                        % (name, where, array.shape, name, _declared(shape, dims)))
    learned = []
    for side, got in zip(shape, array.shape):
        if isinstance(side, str) and dims.get(side) is None:
            dims[side] = got
            learned.append(side)
    expected = tuple(dims[s] if isinstance(s, str) else s for s in shape)
    if array.shape != expected:
        told = ["%s = %d read off the value of %s" % (s, dims[s], origin[s])
                for s in dict.fromkeys(shape) if isinstance(s, str) and s in origin and s not in learned]
        raise FdslError("shape mismatch for %s: the value%s has shape %s, but %s is declared %s%s"
                        % (name, where, shape_str(array.shape), name, _declared(shape, dims),
                           " (%s)" % "; ".join(told) if told else ""))
    for side in learned:
        origin.setdefault(side, name)
    return array


def conform_ids(name: str, array, shape, dims: dict, origin: dict, where: str = "") -> np.ndarray:
    """The ids of a const declared ``n x v onehot`` (see ``Symbol.onehot``): int64, shape (n,) or
    (batch, n), every id in [0, v); learns n. A matrix, non-integer numbers or an id out of range
    is an FdslError that says which, where."""
    rows, vocab = shape
    declared = "%s is declared %s x %s onehot, so its value is its ids, one integer in [0, %s) per row" % (
        name, rows, vocab, vocab)
    try:
        array = np.asarray(array)
    except Exception:
        raise FdslError("the value of %s%s is not an array of ids (%s)" % (name, where, declared)) from None
    size = dims.get(vocab) if isinstance(vocab, str) else vocab
    known_rows = dims.get(rows, rows) if isinstance(rows, str) else rows
    if array.ndim >= 2 and size is not None and array.shape[-1] == size and array.shape[-2] in (known_rows, None):
        raise FdslError("the value of %s%s is a matrix of shape %s, where ids are declared: %s (the one-hot "
                        "matrix's ids are its argmax along the rows)" % (name, where, shape_str(array.shape), declared))
    if array.dtype.kind not in "iu":
        raise FdslError("the value of %s%s must hold integer ids, not %s (%s)" % (name, where, array.dtype, declared))
    if array.ndim not in (1, 2) or array.size == 0:
        raise FdslError("the value of %s%s has shape %s: %s, shape (%s,) or (batch, %s)"
                        % (name, where, array.shape, declared, rows, rows))
    if size is None:
        raise FdslError("%s needs the size of dim %s to check its ids: declare it with one (dim %s = 8)"
                        % (name, vocab, vocab))
    bad = np.flatnonzero((array < 0) | (array >= size))
    if bad.size:
        at = np.unravel_index(bad[0], array.shape)
        raise FdslError("the value of %s%s has the id %d at %s, outside [0, %s) = [0, %d) (%s)"
                        % (name, where, array.flat[bad[0]], tuple(int(i) for i in at), vocab, size, declared))
    if isinstance(rows, str) and dims.get(rows) is None:
        dims[rows] = array.shape[-1]
        origin.setdefault(rows, name)
    expected = dims[rows] if isinstance(rows, str) else rows
    if array.shape[-1] != expected:
        raise FdslError("shape mismatch for %s: the value%s has %d ids, but %s is declared %s (%s = %d)"
                        % (name, where, array.shape[-1], name, shape_str(shape), rows, expected))
    return array.astype(np.int64, copy=False)


def one_hot(ids: np.ndarray, vocab: int) -> np.ndarray:
    """The one-hot rows of ``ids``: for the interpreter (``eval``, the oracles) only; generated
    code computes from the ids themselves and never makes this array."""
    out = np.zeros(ids.shape + (vocab,))
    np.put_along_axis(out, ids[..., None], 1.0, axis=-1)
    return out


def _declared(shape, dims) -> str:
    """``(n x d) = (8 x 6)``: a declared shape and its sizes, as far as they are known."""
    sizes = tuple(side if isinstance(side, int) else dims.get(side, "?") for side in shape)
    if sizes == tuple(shape):
        return shape_str(shape)
    return "%s = %s" % (shape_str(shape), shape_str(sizes))


def evaluate(term: Term, values: Optional[Mapping] = None, dims: Optional[Mapping] = None) -> np.ndarray:
    """The value of ``term`` as a float64 array (1 x 1 for scalars); ``values`` by printed name."""
    return Evaluator(values, dims).value(term)


# ---- a program's values -------------------------------------------------------------------------
