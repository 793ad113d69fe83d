"""Evaluate terms with numpy: the operator table lowered to numpy, and the values of symbols.

Vocabulary
----------
lowering    the numpy function of an operator, compiled once from its template in the operator
            table (``OPS[op].numpy``, e.g. ``np.maximum({0}, 0.0)``). Placeholders: ``{0}``,
            ``{1}``... the argument values; ``{args}``, ``{args_sum}``, ``{args_had}`` all the
            arguments joined by ``, ``, `` + `` and `` * `` (for n-ary operators); ``{value}`` and
            ``{exponent}`` the number a node carries (``num``, ``pow``). Templates may call ``np``
            and the helpers of ``fdsl.backends.numpy_runtime`` (``_softmax``, ``_mm``, ``_aa``,
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
import re
import zipfile
import zlib
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Optional

import numpy as np

from . import numpy_runtime
from ..errors import FdslError
from ..functions import as_term, function
from ..inputs import check_allocation, regular_file
from ..ops import OPS, shape_str
from ..printers import text
from ..statements import Write
from ..terms import Symbol, Term, postorder, sym, tree_size

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
    return "%s(...)" % t.op if t.op not in ("add", "mul", "had") else "a %s of %d terms" % (
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
                                                "point)" % (_short(arg), n.op, 2 * h))
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
                            % (node.op, out.shape, expected, _short(node)))

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
        if isinstance(self.values, Values) and self.values.seed is not None:
            return self.values.generate(symbol, self.shape(shape, "drawing random values for %s" % name))
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


class Values(dict):
    """The values of a program's symbols by printed name (``program.values``).

    Holds the arrays given by files and those drawn at random so far. With a seed, looking up a
    symbol that has no value yet (``values["Q_7"]``) draws it, so family members that a program
    reaches get values without being listed anywhere.
    """

    def __init__(self, program):
        super().__init__()
        self.program = program
        self.seed: Optional[int] = None
        self.sources: dict = {}  # name -> file it was read from, for messages
        self.generated: set = set()

    def __missing__(self, name):
        if self.seed is None:
            raise KeyError(name)
        term = symbol_term(self.program, name)
        if term is None or term.op != "sym" or term.data[0].value is not None:
            raise KeyError(name)
        symbol, shape = term.data
        dims, origin = self.dims()
        ev = Evaluator(self, dims, origin)
        return self.generate(symbol, ev.shape(shape, "drawing random values for %s" % name))

    def generate(self, symbol: Symbol, shape: tuple) -> np.ndarray:
        """Draw the random value of ``symbol``: normal entries, weights scaled by 1/sqrt(rows)."""
        name = symbol.printed()
        check_allocation(8 * int(np.prod(shape, dtype=object)), "random values for %s, %s floats,"
                         % (name, " x ".join(map(str, shape))))
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
        array = rng.standard_normal(shape)
        if symbol.kind == "weight":
            array /= np.sqrt(shape[0])
        self[name] = array
        self.generated.add(name)
        return array

    def dims(self) -> tuple:
        """The program's dim sizes, with those of dims without one read off the given arrays;
        checks every given array against its declaration. Returns (dims, origin)."""
        program = self.program
        dims = {k: v for k, v in program.dims.items() if v is not None}
        origin: dict = {}
        unknown = []
        for name in [n for n in self if n not in self.generated]:
            source = self.sources.get(name)  # errors lead with the file, unless a statement is at fault
            term = symbol_term(program, name)
            if term is None:
                unknown.append(name)
                continue
            if term.op != "sym" or term.data[0].kind == "dim":
                raise FdslError("%s (in %s) is a dim, not a symbol: its size comes from its declaration "
                                "or from the shapes of the arrays" % (name, source or "the values"), file=source)
            symbol, shape = term.data
            if symbol.value is not None:
                raise FdslError("%s (in %s) has a value in its declaration (%s); it cannot also be given"
                                % (name, source or "the values",
                                   symbol.value if isinstance(symbol.value, str) else text(symbol.value)),
                                file=source)
            try:
                self[name] = conform(name, self[name], symbol, shape, dims, origin, source or "")
            except FdslError as e:
                e.file = e.file or source
                raise
        if unknown:
            files = sorted({self.sources.get(n, "the values") for n in unknown})
            raise FdslError("%s in %s match%s no declared symbol (declared: %s)"
                            % (", ".join(unknown), ", ".join(files), "" if len(unknown) > 1 else "es",
                               _declared_names(program)), file=self.sources.get(unknown[0]))
        return dims, origin


def _declared_names(program) -> str:
    names = [n for n, t in program.symbols.items() if t.data[0].value is None]
    names += ["%s[%s]" % (n, ", ".join(f.indices)) for n, f in program.families.items() if f.value is None]
    return ", ".join(names) or "nothing"


_MEMBER = re.compile(r"(.+?)((?:_\d+)+)")


def symbol_term(program, name: str) -> Optional[Term]:
    """The symbol leaf a printed name stands for (``Q_0`` for the family ``Q``), or None."""
    if name in program.symbols:
        return program.symbols[name]
    if name in program.dims:
        return program.dim_term(name)
    m = _MEMBER.fullmatch(name)
    if m and m.group(1) in program.families:
        family = program.families[m.group(1)]
        index = tuple(int(i) for i in m.group(2).split("_")[1:])
        if len(index) == len(family.indices):
            return sym(Symbol(m.group(1), index, family.kind, family.value, family.scalar), family.shape)
    return None


def program_values(program) -> Values:
    """The program's ``Values``, made on first use."""
    if program.values is None:
        program.values = Values(program)
    return program.values


def _declares_anything(program) -> bool:
    return bool(program.symbols or program.families or program.dims)


def load_values(program, path) -> None:
    """Take symbol values from an .npz file (arrays keyed by printed name: ``X``, ``Q_0``)."""
    path = Path(path)
    arrays = read_npz(path)
    store = program_values(program)
    for name, array in arrays.items():
        store[name] = array
        store.sources[name] = str(path)
        store.generated.discard(name)
    # when the program is read after its values (fdsl run --values), nothing is declared yet:
    # the arrays are then checked when they are first used, and by check_values
    if _declares_anything(program):
        store.dims()


def _check_npz(path: Path) -> None:
    """Before anything is read: a regular file that fits in memory, and a zip archive whose arrays'
    headers (shape and type, read without their data) are real matrices that fit in memory too
    (a compressed archive can unpack to far more than its size)."""
    st = regular_file(path, "values file")
    check_allocation(st.st_size, "reading this values file")
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        raise FdslError("this values file holds one unnamed array (an .npy file); values need names: "
                        "write them with np.savez(path, X=..., Q_0=...)", file=str(path))
    if not zipfile.is_zipfile(path):
        raise FdslError("not an .npz archive of arrays (write one with np.savez(path, X=..., Q_0=...))",
                        file=str(path))
    total = 0
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            if dtype.kind not in "biuf":
                raise FdslError("%s in this values file must hold real numbers, not %s" % (name, dtype), file=str(path))
            if len(shape) > 3:  # 3: a batch of examples of a constant (checked against its declaration)
                raise FdslError("%s in this values file has shape %s; values are matrices (or batches of them, "
                                "(batch, rows, cols), for constants)" % (name, shape), file=str(path))
            total += int(np.prod(shape, dtype=object)) * max(dtype.itemsize, 8)  # read, then made float64
    try:
        check_allocation(total, "the arrays of this values file")
    except FdslError as e:
        raise FdslError(e.message, file=str(path)) from None


def read_npz(path: Path) -> dict:
    """The arrays of an .npz file; an FdslError naming the file if it cannot be read as one."""
    try:
        _check_npz(path)
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise FdslError("cannot read this values file: no such file", file=str(path)) from None
    except OSError as e:
        raise FdslError("cannot read this values file: %s" % (e.strerror or e), file=str(path)) from None
    except FdslError:
        raise
    except Exception as e:  # numpy raises several kinds for a file that is not an array file
        raise FdslError("not an .npz archive of arrays (%s)" % _reason(e), file=str(path)) from None
    if isinstance(data, np.ndarray):
        raise FdslError("this values file holds one unnamed array (an .npy file); values need names: "
                        "write them with np.savez(path, X=..., Q_0=...)", file=str(path))
    try:
        with data:
            arrays = {name: data[name] for name in data.files}
    except Exception as e:
        raise FdslError("this values file is damaged (%s)" % _reason(e), file=str(path)) from None
    for name, array in arrays.items():
        if array.dtype.kind not in "biuf":
            raise FdslError("%s in this values file must hold real numbers, not %s" % (name, array.dtype),
                            file=str(path))
    return arrays


def _reason(e: Exception) -> str:
    return str(e) or type(e).__name__


def random_values(program, seed: int) -> None:
    """Give every symbol without a value random ones on demand: normal entries, weights / sqrt(rows)."""
    if not isinstance(seed, int) or seed < 0:
        raise FdslError("a seed must be a whole number >= 0, not %s" % seed, file="--random")
    store = program_values(program)
    for name in store.generated:  # values drawn with an earlier seed
        del store[name]
    store.generated.clear()
    store.seed = seed
    if _declares_anything(program):
        dims, origin = store.dims()
        missing = [name for name, size in program.dims.items() if size is None and name not in dims]
        if missing:
            raise FdslError("random values need the size of every dim, and %s ha%s none: declare %s "
                            "(dim %s = 8) or give values whose shapes have %s"
                            % (", ".join(missing), "ve" if len(missing) > 1 else "s",
                               "sizes" if len(missing) > 1 else "one", missing[0],
                               "them" if len(missing) > 1 else "it"))


def check_values(program) -> None:
    """Check the program's given values against its declarations (unknown names, shapes)."""
    if program.values is not None:
        program.values.dims()


def evaluate_in(program, term: Term, evaluator: Optional[Evaluator] = None) -> np.ndarray:
    """The value of ``term`` with the program's values and dims."""
    if evaluator is None:
        evaluator = program_evaluator(program)
    return evaluator.value(term)


def program_evaluator(program) -> Evaluator:
    """An evaluator over the program's current values (share one to evaluate many terms)."""
    if program.values is None:
        return Evaluator({}, program.dims)
    dims, origin = program.values.dims()
    return Evaluator(program.values, dims, origin)


# ---- the language: eval(E) and save ----------------------------------------------------------------


class Numeric:
    """A numeric result: ``show`` prints it as a number (scalars) or an array."""

    def __init__(self, array: np.ndarray, term: Optional[Term] = None):
        self.array = array
        self.term = term

    @property
    def scalar(self) -> bool:
        return self.array.shape == (1, 1) and (self.term is None or self.term.scalar)

    def show(self) -> str:
        if self.scalar:
            return "%.10g" % self.array[0, 0]
        return np.array2string(self.array, precision=6, max_line_width=120)

    def __array__(self, dtype=None, copy=None):
        return self.array if dtype is None else self.array.astype(dtype)

    def __repr__(self):
        return "Numeric(%s)" % self.show()


@function("eval(E)", "the numeric value of E, from 'values \"FILE.npz\"' or 'random SEED'")
def _eval(program, e):
    term = as_term(e, "the argument of eval")
    return Numeric(evaluate_in(program, term), term)


def _key(term: Term) -> str:
    """The name an evaluated term is saved under: its symbol's or binding's name, else ``value``."""
    if term.op == "sym":
        return term.data[0].printed()
    if term.op == "let":
        name, index = term.data
        return name + "".join("_%d" % i for i in index)
    return "value"


def _to_array(program, value, evaluator) -> tuple:
    """(name, array) for one value to save."""
    if isinstance(value, Numeric):
        return (_key(value.term) if value.term is not None else "value"), value.array
    if isinstance(value, np.ndarray):
        return "value", np.asarray(value, dtype=np.float64)
    if isinstance(value, (Term, int, Fraction)) and not isinstance(value, bool):
        term = as_term(value, "the value to save")
        return _key(term), evaluate_in(program, term, evaluator)
    raise FdslError("save writes matrices, not %s" % type(value).__name__)


def save_effect(program, path, value) -> Write:
    """The effect of ``save "FILE.npz" EXPR``: the value is computed now (so errors point at the
    statement) and written, atomically, only when the whole program has run."""
    evaluator = None
    if isinstance(value, dict):
        arrays = {}
        for name, item in value.items():
            if isinstance(item, (Term, int, Fraction)) and evaluator is None:
                evaluator = program_evaluator(program)
            arrays[str(name)] = _to_array(program, item, evaluator)[1]
    else:
        if isinstance(value, (Term, int, Fraction)):
            evaluator = program_evaluator(program)
        name, array = _to_array(program, value, evaluator)
        arrays = {name: array}

    def write(tmp: Path):
        with open(tmp, "wb") as f:  # a file object: np.savez would append .npz to a bare name
            np.savez(f, **arrays)

    return Write(Path(path), write)
