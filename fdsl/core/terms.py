"""Terms: immutable, hash-consed matrices of differential forms.

Vocabulary
----------
Term       one node of the term graph: an operator (see ``fdsl.core.ops``), a tuple of argument Terms and
           a small hashable payload (``data``). Terms are interned: two equal terms are one object,
           so ``==`` and ``hash`` are identity and cost O(1), and a subterm that occurs many times
           is stored once. A term is a DAG, never expanded into a tree.
Symbol     the payload of a ``sym`` leaf: name, index tuple (``Q[0]`` is ``Symbol("Q", (0,))`` and
           prints ``Q_0``), kind (const, scalar, weight, dim), shape and optional built-in value;
           a weight may have an initial value instead (``init``: ones, zeros, normal(std)).
word       the factors of a product read left to right (a non-product term is a one-letter word).
scalar     a 1 x 1 term that commutes: numbers, declared scalars, dims used as numbers, traces,
           and products, sums and powers of those. In a product, scalars stand first.

Smart constructors (``mul``, ``add``, ``divide``, ``transpose``, ``make``) apply only the laws of
the representation: flattening of associative operators, units (``1``, identity matrices) and
zeros (a zero factor, summand or linear argument), a scalar beside matrices in a sum added to
every entry (``s + A`` is ``s ones(n, d) + A``, as numpy broadcasts), division by a scalar as a
scalar multiple, and the shape constants (``onescol``, ``onesrow``, ``cols``, ``eyerows``). Everything else
about the operators is in rules.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterator, Optional

from ..base import assembly
from ..base.limits import DEFAULT_SIZE_LIMIT, WIDTH_SHARE
from ..base.numbers import number_problem, power_problem
from .ops import OPS, ShapeError

_TABLE: dict = {}
_BUILT = [0]  # nodes and argument slots interned so far: what the size limit of a rewrite counts
# Interned terms live as long as the process, and a small node costs about 250 bytes, so the size
# limit (counted in cells) may allow more than the memory there is. Every _MEMORY_EVERY cells (at
# most about 70 MB of terms) the memory left is looked at, and building stops with a message while
# _MEMORY_RESERVE is still free for the message and the way out, not in a MemoryError.
_MEMORY_EVERY = 1 << 19
_MEMORY_RESERVE = 1 << 28
_NEXT_LOOK = [_MEMORY_EVERY]


class Term:
    """An interned node; build with the constructors below, never directly."""

    __slots__ = ("op", "args", "data", "shape", "scalar", "has_d", "has_weight", "__weakref__")

    def __init__(self, op, args, data, shape, scalar):
        self.op = op
        self.args = args
        self.data = data
        self.shape = shape
        self.scalar = scalar
        has_d = op == "d"
        has_weight = op == "sym" and data[0].kind == "weight"
        for a in args:  # a loop, not any(): this runs for every new node
            has_d = has_d or a.has_d
            has_weight = has_weight or a.has_weight
        self.has_d = has_d
        self.has_weight = has_weight

    # identity is equality: the interning table guarantees one object per distinct term
    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other

    def __repr__(self):
        from .printers import string

        return "Term(%s)" % string(self)

    def __str__(self):
        # what show prints: laid out on lines (a normal form one weight per line), with bindings
        from .printers import text_with_bindings

        return text_with_bindings(self)

    def _repr_latex_(self):
        from .printers import latex

        return "$%s$" % latex(self)

    def _repr_html_(self):
        from .printers import html

        return html(self)

    def __reduce__(self):
        raise TypeError("terms are interned; serialise them with fdsl.core.printers.string")

    # ---- Python operators: the language's, with its shape checks and messages -------------------
    # A + B, A - B, -A, A @ B (the product the language writes A B), A * B (Hadamard, as in the
    # language; a number or scalar scales), A / s, s ** e, A.T. Python numbers are exact scalars.

    def __add__(self, other):
        return _binary(add, self, other, zero_like=True)

    def __radd__(self, other):
        return _binary(add, other, self, zero_like=True)

    def __sub__(self, other):
        return _binary(sub, self, other, zero_like=True)

    def __rsub__(self, other):
        return _binary(sub, other, self, zero_like=True)

    def __neg__(self):
        return neg(self)

    def __matmul__(self, other):
        return _binary(mul, self, other)

    def __rmatmul__(self, other):
        return _binary(mul, other, self)

    def __mul__(self, other):
        return _binary(hadamard, self, other)

    def __rmul__(self, other):
        return _binary(hadamard, other, self)

    def __truediv__(self, other):
        return _binary(_divide, self, other)

    def __rtruediv__(self, other):
        return _binary(_divide, other, self)

    def __pow__(self, exponent):
        e = _number(exponent)
        if e is None:
            return NotImplemented
        return _checked(power, self, e.data)

    @property
    def T(self) -> "Term":
        """The transpose, ``A^t``."""
        return transpose(self)

    def diagram(self, **options):
        """The picture of this term (``fdsl.diagram``): shown inline in a notebook."""
        return assembly.picture("diagram")(self, **options)


@dataclass(frozen=True)
class Symbol:
    """A declared name: what a ``sym`` leaf stands for."""

    name: str
    index: tuple = ()
    kind: str = "const"  # const | scalar | weight | dim
    value: Optional[object] = None  # "ones", "identity", "causal", a Term (scalars), an int (dims)
    scalar: bool = False  # a weight declared ``weight g : scalar``: it commutes like a scalar
    # a const declared ``n x v onehot``: every row is one-hot, and its value is given as ids, one
    # integer in [0, v) per row ((n,), or (batch, n)); the terms and the normal form are the same
    onehot: bool = False
    # a weight's initial value, from its declaration (``weight g : 1 x d = ones``): ("ones",),
    # ("zeros",), ("identity",) or ("normal", mean, std); None: normal entries / sqrt(rows). Not a
    # value: the weight is still an input that values files give and training moves.
    init: Optional[tuple] = None

    def printed(self) -> str:
        """``Q_0`` for ``Q[0]``: the key of the symbol in value files and gradient files."""
        return self.name + "".join("_%d" % i for i in self.index)


def init_text(init: tuple) -> str:
    """An initial value as its declaration writes it: ``ones``, ``normal(0.02)``, ``normal(1, 0.5)``."""
    if init[0] != "normal":
        return init[0]
    return "normal(%s)" % ("%r" % init[2] if init[1] == 0 else "%r, %r" % init[1:])


def _intern(op, args, data, shape, scalar):
    key = (op, data, args)
    t = _TABLE.get(key)
    if t is None:
        t = _TABLE[key] = Term(op, args, data, shape, scalar)
        _BUILT[0] += 1 + len(args)
        if _BUILT[0] >= _NEXT_LOOK[0]:
            _look_at_memory()
    return t


def _look_at_memory() -> None:
    """A StepLimit if the terms built so far leave less than _MEMORY_RESERVE of memory."""
    from ..base.errors import StepLimit
    from ..base.inputs import memory_left, size_text

    _NEXT_LOOK[0] = _BUILT[0] + _MEMORY_EVERY
    left = memory_left()
    if left < _MEMORY_RESERVE:
        raise StepLimit("the terms built so far fill the memory (%s left, %d term cells built): a rule "
                        "that grows its term without end? (--size-limit N stops a rewrite sooner)"
                        % (size_text(left), _BUILT[0]))


# The most operands one flat sum, product or Hadamard product may have: a fiftieth of the size limit
# of the program (or API call) building it, which ``widest`` makes current, so that two programs of
# one process, or the repl and the API, each have their own --size-limit.
_MAX_WIDTH: ContextVar = ContextVar("fdsl_max_width", default=DEFAULT_SIZE_LIMIT // WIDTH_SHARE)


def _width(size_limit) -> int:
    return max(1000, (size_limit or DEFAULT_SIZE_LIMIT) // WIDTH_SHARE)


@contextmanager
def widest(size_limit):
    """For the block, one flat term may have ``size_limit / WIDTH_SHARE`` operands (at least 1,000;
    None: the default size limit's)."""
    token = _MAX_WIDTH.set(_width(size_limit))
    try:
        yield
    finally:
        _MAX_WIDTH.reset(token)


def max_width() -> int:
    """The most operands one flat term may have here and now."""
    return _MAX_WIDTH.get()


def _check_width(op: str, parts) -> None:
    """A StepLimit before flattening ``parts`` into one ``op`` of more operands than _MAX_WIDTH."""
    if len(parts) < 2 or (len(parts) == 2 and parts[0].op != op and parts[1].op != op):
        return
    width = 0
    for p in parts:
        width += len(p.args) if p.op == op else 1
    limit = _MAX_WIDTH.get()
    if width > limit:
        from ..base.errors import TooWide

        what = {"add": "sum of %d summands", "mul": "product of %d factors", "had": "Hadamard product of %d factors"}
        e = TooWide("this would build a %s, more than one term may hold (%d, a fiftieth of the size limit, "
                        "--size-limit N): a definition that doubles its term at every step?"
                        % (what[op] % width, limit))
        e.width = width
        raise e


def built() -> int:
    """How many term nodes (plus their argument slots) have been made so far in this process:
    a rewrite's growth is the difference between two readings."""
    return _BUILT[0]


# ---- leaves ------------------------------------------------------------------------------------


def sym(symbol: Symbol, shape) -> Term:
    scalar = symbol.kind in ("scalar", "dim") or symbol.scalar
    return _intern("sym", (), (symbol, shape), (1, 1) if scalar else shape, scalar)


# The last number built beyond float64's range (None: none since it was last taken). Numbers a
# program writes or folds are checked where they stand; the rewrite engine takes this after each
# rule builds its right side, so a rule that doubles a coefficient forever stops at 2^1024 with the
# rule's name instead of running on with ever longer exact numbers.
_OUT_OF_RANGE: list = [None]


def num(value) -> Term:
    value = Fraction(value)
    # (integers of at most 53 bits, the most common numbers, are in range: no Fraction comparisons)
    if (value.denominator != 1 or value.numerator.bit_length() > 53) and value and number_problem(value):
        _OUT_OF_RANGE[0] = value
    return _intern("num", (), value, (1, 1), True)


def take_out_of_range():
    """The last number built out of float64's range since the previous call, or None."""
    value, _OUT_OF_RANGE[0] = _OUT_OF_RANGE[0], None
    return value


def zero(shape) -> Term:
    """The zero matrix of ``shape``; the number 0 where the shape is scalar or unknown."""
    if shape is None or shape == (1, 1):
        return num(0)
    return _intern("zero", (), shape, shape, False)


def ones(shape) -> Term:
    """The matrix of ones of ``shape`` (the number 1 where the shape is scalar): ``s + A`` is
    ``s ones(n, d) + A``, and ``A ones(d, 1)`` sums the rows of A."""
    if shape is None or shape == (1, 1):
        return ONE
    return _intern("ones", (), tuple(shape), tuple(shape), False)


def eye(dim) -> Term:
    """The identity matrix of size ``dim`` (the unit of products; the empty word)."""
    if dim == 1:
        return num(1)
    return _intern("eye", (), dim, (dim, dim), False)


ZERO = num(0)
ONE = num(1)


def is_zero(t: Term) -> bool:
    return t.op == "zero" or (t.op == "num" and t.data == 0)


def is_unit(t: Term) -> bool:
    return t.op == "eye" or (t.op == "num" and t.data == 1)


def symbol_of(t: Term) -> Symbol:
    return t.data[0]


# ---- constructors ------------------------------------------------------------------------------


def make(op: str, args, data=None) -> Term:
    """Build ``op(args)``: checks arity and shapes, applies the zero law of linear arguments."""
    args = tuple(args)
    known = _TABLE.get((op, data, args))
    if known is not None:  # built before from these very arguments: the checks below passed then
        return known
    spec = OPS[op]
    if spec.associative:  # flat n-ary operators have their own constructors
        return {"mul": mul, "add": add, "had": hadamard}[op](*args)
    if op == "div":
        return divide(*args)
    if op == "pow" and len(args) == 1 and args[0].op == "num" and data is not None:
        folded = _fold_power(args[0], Fraction(data))
        if folded is not None:
            return folded
    if op in _SHAPE_CONSTANTS and len(args) == 1:
        return _SHAPE_CONSTANTS[op](args[0])
    if spec.arity is not None and len(args) != spec.arity:
        raise ShapeError("%s takes %d argument%s, not %d" % (op, spec.arity, "" if spec.arity == 1 else "s", len(args)))
    for i in spec.linear:
        if is_zero(args[i]):
            # a zero matrix keeps its shape (d(0_{n x d}) is 0_{n x d}, not the number 0); only the
            # number 0 stands for the zero of whatever shape fits
            wild = tuple(_WILD if j == i and a.op == "num" else a for j, a in enumerate(args))
            shape, _ = spec.shape(wild)
            return zero(shape)
    if op == "t" and args[0].scalar:
        return args[0]  # a scalar is its own transpose
    if op == "t" and args[0].op == "eye":
        return args[0]
    shape, scalar = spec.shape(args)
    return _intern(op, args, data, shape, scalar)


class _Wildcard:
    """Stands for a zero argument while the shape of the zero result is worked out."""

    op = "wild"
    shape = None
    scalar = False


_WILD = _Wildcard()


def mul(*factors: Term) -> Term:
    """The product of ``factors``: flat, numbers multiplied into one leading coefficient, scalars
    first (they commute), units dropped, zero if any factor is zero."""
    known = _TABLE.get(("mul", None, factors))
    if known is not None:  # already the factors of a product (the result is that product)
        return known
    _check_width("mul", factors)
    coeff = 1
    scalars, mats = [], []
    for g in factors:
        for f in (g.args if g.op == "mul" else (g,)):
            if f.op == "num":
                coeff *= f.data
            elif f.scalar:
                scalars.append(f)
            else:
                mats.append(f)
    shape, scalar = OPS["mul"].shape(mats) if mats else ((1, 1), True)
    if coeff == 0:
        return zero(shape)
    kept = []
    for f in mats:
        if f.op == "zero":
            return zero(shape)
        if f.op != "eye":
            kept.append(f)
    if mats and not kept:
        kept = [mats[0]]  # a product of identities is the identity
    out = ([num(coeff)] if coeff != 1 else []) + scalars + kept
    if not out:
        return ONE
    if len(out) == 1:
        return out[0]
    return _intern("mul", tuple(out), None, shape, scalar)


def add(*summands: Term) -> Term:
    """The sum of ``summands``: flat, in the given order, zeros dropped."""
    known = _TABLE.get(("add", None, summands))
    if known is not None:  # already the summands of a sum
        return known
    _check_width("add", summands)
    flat = []
    for s in summands:
        flat.extend(s.args if s.op == "add" else (s,))
    flat = _broadcast(flat)
    shape, scalar = OPS["add"].shape(flat) if flat else ((1, 1), True)
    kept = [s for s in flat if not is_zero(s)]
    # numbers are summed into one (the ring of scalars), kept where the first of them stood
    nums = [s for s in kept if s.op == "num"]
    if len(nums) > 1:
        total = num(sum(s.data for s in nums))
        first = kept.index(nums[0])
        kept = [s for s in kept if s.op != "num"]
        if total.data != 0:
            kept.insert(first, total)
    if not kept:
        return zero(shape)
    if len(kept) == 1:
        return kept[0]
    return _intern("add", tuple(kept), None, shape, scalar)


def _broadcast(flat: list) -> list:
    """Summands with the scalars among matrices added to every entry, as numpy does: the scalar
    summands become one term ``(s + t) ones(n, d)``, where the first of them stood."""
    matrix = next((x for x in flat if not x.scalar and x.shape is not None and x.shape != (1, 1)), None)
    if matrix is None:
        return flat
    scalars = [x for x in flat if x.scalar and not is_zero(x)]
    if not scalars:
        return flat
    position = sum(1 for x in flat[:flat.index(scalars[0])] if not x.scalar)
    rest = [x for x in flat if not x.scalar]
    rest.insert(position, mul(add(*scalars), ones(matrix.shape)))
    return rest


def divide(a: Term, b: Term) -> Term:
    """``a / b``: by a scalar, a scalar multiple; by a matrix, componentwise (a scalar ``a`` is
    divided by every entry)."""
    if b.scalar:
        return mul(a, power(b, -1))
    if a.scalar and b.shape is not None:
        a = mul(a, ones(b.shape))
    shape, _ = OPS["div"].shape((a, b))
    if is_zero(a):
        return zero(shape)
    return _intern("div", (a, b), None, shape, False)


def hadamard(*factors: Term) -> Term:
    """The componentwise product: flat, zero if any factor is zero. A scalar factor scales, so
    ``2 * A`` is ``2 A`` and ``2 * 3`` is 6 (componentwise, a scalar multiplies every entry)."""
    _check_width("had", factors)
    flat = []
    for f in factors:
        flat.extend(f.args if f.op == "had" else (f,))
    scalars = [f for f in flat if f.scalar]
    if scalars and len(scalars) < len(flat):
        return mul(*scalars, hadamard(*(f for f in flat if not f.scalar)))
    if scalars:
        return mul(*scalars)
    shape, scalar = OPS["had"].shape(flat)
    if any(is_zero(f) for f in flat):
        return zero(shape)
    if len(flat) == 1:
        return flat[0]
    return _intern("had", tuple(flat), None, shape, scalar)


def neg(t: Term) -> Term:
    return mul(num(-1), t)


def sub(a: Term, b: Term) -> Term:
    return add(a, neg(b))


def transpose(t: Term) -> Term:
    return make("t", (t,))


def d(t: Term) -> Term:
    return make("d", (t,))


def power(base: Term, exponent) -> Term:
    exponent = Fraction(exponent)
    if exponent == 1:
        return base
    return make("pow", (base,), exponent)


def _fold_power(base: Term, exponent: Fraction):
    """A number to a whole power as a number (None when it stays a power: 2^(1/2), 0^(-1))."""
    if exponent == 1:
        return base
    if exponent.denominator == 1 and (base.data != 0 or exponent >= 0) \
            and power_problem(base.data, int(exponent)) is None:  # 0^0 = 1, as the parser reads it
        return num(base.data ** int(exponent))  # (beyond float64 it stays a power, unexpanded)
    return None


def cols(t: Term) -> Term:
    """The number of columns of ``t`` as a scalar: a number, or the dim that names it."""
    c = t.shape[1] if t.shape is not None else 1
    if isinstance(c, int):
        return num(c)
    # trace(ones(1, d) ones(d, 1)) = d, made of the dim's name alone (a dim symbol would carry the
    # value its program gave it, which a term built from a shape cannot know)
    return make("trace", (mul(ones((1, c)), ones((c, 1))),))


# Operators that stand for a constant made from the shape of their argument only (the argument
# itself is dropped, so a differential inside it leaves nothing behind): rules write
# ``onescol(?A)`` for the column of ones that sums the rows of ?A, and ``?c... eyerows(?W)`` for
# the matrix a run of factors before ?W stands for (c I when the run is only scalars).
_SHAPE_CONSTANTS = {
    "eyerows": lambda t: eye(t.shape[0]),
    "onescol": lambda t: ones((t.shape[1], 1)),
    "onesrow": lambda t: ones((1, t.shape[1])),
    "cols": cols,
}


def let(name: str, index: tuple, body: Term) -> Term:
    """A named intermediate: prints as ``name``, differentiates and evaluates as ``body``."""
    return make("let", (body,), (name, tuple(index)))


def rebuild(t: Term, args) -> Term:
    """``t`` with its arguments replaced (the same object when nothing changed)."""
    args = tuple(args)
    if len(args) == len(t.args) and all(a is b for a, b in zip(args, t.args)):
        return t
    return make(t.op, args, t.data)


def renamed(t: Term, args: tuple) -> Term:
    """``t`` over ``args`` that differ from its own only by a renaming of leaves (the same shapes,
    scalars, weights and differentials: ``fdsl.core.alpha``). Interned as it is: the constructors'
    laws read only what a renaming keeps, so they would build this very node."""
    return _intern(t.op, args, t.data, t.shape, t.scalar)


# ---- words and views ---------------------------------------------------------------------------


def factors(t: Term) -> tuple:
    """The word of ``t``: its factors if it is a product, else ``(t,)``."""
    return t.args if t.op == "mul" else (t,)


def summands(t: Term) -> tuple:
    """The summands of ``t``: its arguments if it is a sum, else ``(t,)`` (none for zero)."""
    if is_zero(t):
        return ()
    return t.args if t.op == "add" else (t,)


def coefficient(t: Term):
    """Split a product into its rational coefficient and the rest: ``-2 A B`` -> (-2, A B)."""
    if t.op == "num":
        return t.data, ONE
    if t.op == "mul" and t.args[0].op == "num":
        return t.args[0].data, mul(*t.args[1:])
    return Fraction(1), t


# ---- traversal ---------------------------------------------------------------------------------


def postorder(root: Term, descend=None, children=None) -> Iterator[Term]:
    """Every distinct node under ``root`` once, children before parents, without recursion.

    ``descend(node)`` may return False to treat a node as a leaf (e.g. the body of a ``let``);
    ``children(node)`` gives what is under a node (default: its arguments).
    """
    seen = set()
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            yield node
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        if descend is None or descend(node):
            for child in reversed(node.args if children is None else children(node)):
                if child not in seen:
                    stack.append((child, False))


def dag_size(t: Term) -> int:
    """Number of distinct nodes of the shared term graph."""
    return sum(1 for _ in postorder(t))


def tree_size(t: Term) -> int:
    """Number of nodes the term would have written out as a tree (can be astronomically large)."""
    size = {}
    for node in postorder(t):
        size[node] = 1 + sum(size[c] for c in node.args)
    return size[t]


def symbols(t: Term) -> list:
    """The distinct symbol leaves under ``t``, in first-seen order."""
    return [n for n in postorder(t) if n.op == "sym"]


# ---- Python operands ---------------------------------------------------------------------------


def _number(x) -> Optional[Term]:
    """A Python number as an exact scalar term (a float by its shortest decimal), else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, float):
        if x != x or x in (float("inf"), float("-inf")):
            from ..base.errors import FdslError

            raise FdslError("%r is not a number fdsl can use: scalars are exact rationals" % x)
        x = Fraction(repr(x))
    if isinstance(x, (int, Fraction)):
        problem = number_problem(Fraction(x)) if x else None  # 10**400 from Python, as a literal would be
        if problem:
            from ..base.errors import FdslError

            raise FdslError(problem)
        return num(x)
    return None


def _binary(build, a, b, zero_like=False):
    a = a if isinstance(a, Term) else _number(a)
    b = b if isinstance(b, Term) else _number(b)
    if a is None or b is None:
        return NotImplemented
    if zero_like:  # the number 0 is the zero of every shape, as in the language: A + 0 is A
        a = zero(b.shape) if is_zero(a) and a.op == "num" and not b.scalar else a
        b = zero(a.shape) if is_zero(b) and b.op == "num" and not a.scalar else b
    return _checked(build, a, b)


def _divide(a: Term, b: Term) -> Term:
    if is_zero(b):
        raise ShapeError("division by zero")
    return divide(a, b)  # componentwise, as A / B in the language


def _checked(build, *args) -> Term:
    """Build a term; a shape mismatch, or a number folded beyond float64's range (1e200 X * 1e200),
    is an FdslError with the language's message."""
    from ..base.errors import FdslError

    take_out_of_range()  # (one left by earlier work is not this build's)
    try:
        t = build(*args)
    except ShapeError as e:
        raise FdslError(str(e)) from None
    bad = take_out_of_range()
    if bad is not None:
        raise FdslError(number_problem(bad) or "out of range")
    return t
