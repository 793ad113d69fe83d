"""The operator table: every stage of fdsl reads what an operator is from here.

Vocabulary
----------
operator   a node label of the term graph: ``mul`` (matrix product, n-ary), ``add`` (sum, n-ary),
           ``had`` (Hadamard product ``A * B``), ``t`` (transpose ``A^t``), ``d`` (the differential),
           ``trace``, ``m`` (relu), ``a`` (row-wise softmax), ``mm``/``aa`` (their exact derivatives,
           linear in the second argument), ``pow`` (a scalar to a rational power), ``let`` (a named
           intermediate, ``E := ...``), and the leaves ``sym``, ``num``, ``zero``, ``eye``,
           ``ones``. Issue 12 adds ``div`` (``A / B``), the componentwise functions ``exp``,
           ``log``, ``sqrt``, ``tanh``, ``sigmoid``, ``gelu`` with their derivative operators
           (``dexp(A, B) = exp(A) o B``, ...), the row reductions ``rowsum``, ``rowmean``,
           ``rowvar``, and the shape constants ``onescol``, ``onesrow``, ``cols``, ``eyerows``.
key        the operator's entry in ``OPS``, which terms carry: its name, or for a user operator
           whose name another rule book gave another meaning in this process, ``name#k``
           (``user_operator``). Programs and rule files write names; each rule book maps its names
           to keys, and printers write ``Op.shown``, the name.
shape      ``(rows, cols)``; each side is a dim name (``"n"``) or an int. Scalars are 1 x 1 and
           additionally flagged ``scalar``: they commute with everything and are neutral in products.
linear     the argument positions in which an operator is linear: a zero there makes the result zero.
positive  argument positions where an operator is defined only for positive entries (log, sqrt,
           a divisor): ``fdsl rules --check`` draws positive values there.
opaque     rewriting does not look inside (a ``let`` keeps its body as it was defined).
numpy      an expression template over the argument values ``{0}``, ``{1}``, ...; the numpy backend
           compiles it for evaluation and copies it into generated code. The core never runs it.
           Templates are fdsl's own text only: the built-in ones below, those of ``NUMPY_FUNCTIONS``
           (the fixed table a rule file names with ``numpy tanh``), and the ones ``fdsl.lang.rules``
           composes from those for an operator defined by an fdsl expression. Nothing read from a
           rule file is ever a template.

Adding an operator is one ``Op`` entry here (or an ``operator`` line in a rule file, see
``fdsl.lang.rules``) plus its rules in a ``.rules`` file; no other Python changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Optional


class ShapeError(Exception):
    """Operands whose shapes do not fit. ``parts`` are the terms involved, for the message."""

    def __init__(self, template: str, *parts, sizes=()):
        super().__init__(template)
        self.template = template
        self.parts = parts
        self.sizes = sizes  # the two sizes that differ (a dim's name or a number), where one pair is to blame

    def __str__(self) -> str:
        from .printers import text  # lazy: printers import terms, terms raise ShapeError

        return self.template.format(*(str(p) if isinstance(p, (str, _Word)) else text(p) for p in self.parts))


def shape_str(shape) -> str:
    return "(%s x %s)" % shape if shape is not None else "(any)"


@dataclass(frozen=True)
class Op:
    """One operator: its arity, shape rule, algebraic properties, printing and numpy lowering."""

    name: str
    arity: Optional[int]  # None: n-ary (flat, at least two arguments)
    shape: Callable  # (args) -> (shape, scalar); raises ShapeError
    kind: str = "function"  # "function" prints as name(args); "struct" has its own notation
    associative: bool = False
    commutative: bool = False
    linear: tuple = ()
    opaque: bool = False
    differential: bool = False  # marks d: forms are sorted by the symbol under it
    numpy: Optional[str] = None
    latex: Optional[str] = None  # LaTeX name for function-style operators
    doc: str = ""
    user: bool = False  # declared by a rule file rather than built in
    params: tuple = field(default=())  # argument names, for documentation and rule files
    positive: tuple = ()  # argument positions where the operator is defined for positive entries only
    rows: bool = False  # a row reduction: (n x d) -> (n x 1)
    elementwise: bool = False  # entry by entry, so f(A^t, B^t) = f(A, B)^t (user operators all are)
    where: str = field(default="", compare=False)  # a user operator's declaration, file:line
    # a row-wise operator (it normalises along each row): its constant value on a single column,
    # which a program never means (the elaborator refuses it: fdsl.lang.elaborate)
    one_column: str = field(default="", compare=False)

    @property
    def shown(self) -> str:
        """The operator's name as programs write it: ``name`` less the ``#k`` of a user operator
        declared with another meaning elsewhere in the process (see ``user_operator``)."""
        return self.name.partition("#")[0]

    def meaning(self) -> tuple:
        """What terms built with this operator mean: their values, shapes, linearity, domain and
        printing. Two declarations of a user operator with the same meaning are one operator."""
        return (self.arity, self.linear, self.numpy, self.latex, self.positive, self.rows)


# ---- shape rules -------------------------------------------------------------------------------
# Each takes the argument terms and returns (shape, is_scalar). A None shape is a wildcard: it is
# only ever the shape of a zero standing in a linear argument.


def _same_as_first(args):
    a = args[0]
    return a.shape, a.scalar


def _common_shape(args, fits):
    """The shape the arguments share (wildcard ``None`` shapes skipped), and the first argument
    that does not ``fits(shape, arg)`` it, or None."""
    shape = None
    for x in args:
        if x.shape is None:
            continue
        if shape is None:
            shape = x.shape
        elif not fits(shape, x):
            return shape, x
    return shape, None


def _all_same(opname):
    def rule(args):
        # a scalar also fits a 1 x 1 matrix
        shape, bad = _common_shape(args, lambda s, x: x.shape == s or (x.scalar and s == (1, 1)))
        if bad is not None:
            raise ShapeError("{0}: %s %s %s: shapes differ%s" % (shape_str(shape), opname, shape_str(bad.shape),
                                                                 _broadcast_hint(opname, args, shape, bad)),
                             _rebuild_for_message(opname, args))
        return shape, all(x.scalar for x in args)

    return rule


def _broadcast_hint(opname, args, shape, bad) -> str:
    """What to write where numpy would broadcast a row (1 x d) or a column (n x 1) over a matrix:
    fdsl adds only equal shapes, so the row is spread with a column of ones, C b."""
    if opname not in ("+", "-", "*") or bad.shape is None:
        return ""
    first = next(x for x in args if x.shape == shape)
    for small, big in ((bad, first), (first, bad)):
        (r, c), (R, C) = small.shape, big.shape
        name = str(small)
        if r == 1 and c == C and R != 1:
            return ("; fdsl does not broadcast a row over the rows of a matrix as numpy does: write C %s, with "
                    "const C : %s x 1 = ones (C %s is (%s x %s))" % (_factor(name), R, _factor(name), R, C))
        if c == 1 and r == R and C != 1:
            return ("; fdsl does not broadcast a column over the columns of a matrix as numpy does: write %s C^t, "
                    "with const C : %s x 1 = ones (%s C^t is (%s x %s))" % (_factor(name), C, _factor(name), R, C))
    return ""


def _factor(text: str) -> str:
    return text if text.replace("_", "").isalnum() else "(%s)" % text


def _rebuild_for_message(opname, args):
    # A term cannot be built from mismatched arguments, so messages print a stand-in.
    return _Word(args, " %s " % opname)


def same_shape_args(name):
    """The shape rule of ``name(A, B, ...)`` whose arguments share one shape, which it keeps
    (mm, aa, and the elementwise operators that rule files declare)."""

    def rule(args):
        shape, bad = _common_shape(args, lambda s, x: x.shape == s)
        if bad is not None:
            raise ShapeError("%s(%s): %s: arguments must have the same shape"
                             % (name, ", ".join("{%d}" % i for i in range(len(args))),
                                " and ".join(shape_str(x.shape) for x in args)), *args)
        return shape, all(a.scalar for a in args)

    return rule


def _mul_shape(args):
    rows = cols = None
    left = []
    for x in args:
        if x.scalar:
            continue
        if x.shape is None:  # wildcard zero: shape follows from its neighbours
            left.append(x)
            cols = None
            continue
        r, c = x.shape
        if rows is None and not left:
            rows = r
        elif cols is not None and cols != r:
            raise ShapeError(
                "{0} {1}: %s%s: inner sizes %s and %s differ"
                % (shape_str(_word_shape(left)), shape_str(x.shape), cols, r),
                _Word(left),
                x,
                sizes=(cols, r),
            )
        left.append(x)
        cols = c
    if not left:
        return (1, 1), True
    return (rows, cols), False


def _word_shape(word):
    return (word[0].shape[0] if word[0].shape else "?", word[-1].shape[1] if word[-1].shape else "?")


class _Word:
    """A run of operands, printed in messages as the expression they would make."""

    def __init__(self, factors, sep=" "):
        self.factors, self.sep = factors, sep

    def __str__(self) -> str:
        from .printers import text

        return self.sep.join(text(f) for f in self.factors)


def _transpose_shape(args):
    (a,) = args
    if a.shape is None:
        return None, a.scalar
    return (a.shape[1], a.shape[0]), a.scalar


def _trace_shape(args):
    (a,) = args
    if a.shape is not None and a.shape[0] != a.shape[1]:
        raise ShapeError("trace({0}): %s is not square" % shape_str(a.shape), a)
    return (1, 1), True


def _scalar_only(name):
    def rule(args):
        a = args[0]
        if not a.scalar:
            raise ShapeError("{0}: %s of a %s matrix; only scalars have powers" % (name, shape_str(a.shape)), a)
        return (1, 1), True

    return rule


def _row_reduction(args):
    (a,) = args
    if a.shape is None:
        return None, a.scalar
    return (a.shape[0], 1), a.scalar


def _ones_column(args):
    (a,) = args
    return (a.shape[1], 1), a.shape[1] == 1


def _ones_row(args):
    (a,) = args
    return (1, a.shape[1]), a.shape[1] == 1


def _eye_rows(args):
    (a,) = args
    return (a.shape[0], a.shape[0]), a.shape[0] == 1


def _scalar_result(args):
    return (1, 1), True


def _leaf(args):  # leaves carry their shape in their data; terms.py fills it in
    raise AssertionError("leaf shapes are set by their constructors")


# ---- numpy functions a rule file may name ------------------------------------------------------
# ``operator tanh(A) numpy tanh`` picks an entry here by name: (arity, template). Elementwise only
# (the shape rule of user operators keeps their arguments' common shape).

NUMPY_FUNCTIONS: dict[str, tuple] = {
    **{f: (1, "np.%s({0})" % f) for f in (
        "tanh", "sinh", "cosh", "arctan", "arcsinh", "exp", "expm1", "log", "log1p", "sqrt", "cbrt",
        "abs", "sign", "sin", "cos", "square", "reciprocal", "negative")},
    "sigmoid": (1, "(0.5 + 0.5 * np.tanh(0.5 * {0}))"),  # 1 / (1 + exp(-x)), without overflow
    "softplus": (1, "np.logaddexp(0.0, {0})"),  # log(1 + exp(x)), without overflow
    "step": (1, "np.heaviside({0}, 0.0)"),  # 1 where positive, else 0
    # (log, sqrt: defined for positive entries only; NUMPY_POSITIVE below)
    **{f: (2, "np.%s({0}, {1})" % f) for f in (
        "maximum", "minimum", "multiply", "add", "subtract", "divide", "hypot", "arctan2", "logaddexp")},
}


# the numpy functions of the table defined only for positive entries (log1p: above -1, drawn
# positive all the same), and, for two arguments, the positions that must be: an operator declared
# with one of them is checked (fdsl rules --check) at positive values there
NUMPY_POSITIVE: dict[str, tuple] = {"log": (0,), "log1p": (0,), "sqrt": (0,), "reciprocal": (0,), "divide": (1,)}


# ---- the table ---------------------------------------------------------------------------------

OPS: dict[str, Op] = {}


def register(op: Op) -> Op:
    """Add a built-in operator to the table."""
    OPS[op.name] = op
    return op


# (name, meaning) -> the key of the user operator of that name and meaning in OPS
_USER: dict = {}


def user_operator(op: Op) -> Op:
    """The operator of the table for a user declaration ``op`` (``op.name`` the name the rule file
    writes). Operators are a rule book's, not the process's: two programs may each declare ``f``
    with their own meaning. Terms carry their operator's key, so each meaning has its own: the
    first the plain name, another ``f#2``, ``f#3``, ... (printed ``f``: see ``Op.shown``). The same
    declaration again, in any rule book, is the same operator."""
    key = _USER.get((op.name, op.meaning()))
    if key is not None:
        return OPS[key]
    key, k = op.name, 1
    while key in OPS:
        k += 1
        key = "%s#%d" % (op.name, k)
    registered = OPS[key] = replace(op, name=key)
    _USER[(op.name, op.meaning())] = key
    return registered


def shown(key: str) -> str:
    """How the operator of table key ``key`` is written (``f`` for ``f#2``)."""
    return key.partition("#")[0]


for _op in [
    Op("sym", 0, _leaf, kind="struct", doc="a declared symbol: const, scalar, weight or dim"),
    Op("num", 0, _leaf, kind="struct", doc="a rational number", numpy="{value}"),
    Op("zero", 0, _leaf, kind="struct", doc="the zero matrix of a shape"),
    Op("eye", 0, _leaf, kind="struct", doc="the identity matrix of a dim"),
    Op("add", None, _all_same("+"), kind="struct", associative=True, commutative=True,
       doc="sum", numpy="({args_sum})"),
    Op("mul", None, _mul_shape, kind="struct", associative=True, doc="matrix product; scalars commute",
       numpy="_mul({args})"),
    Op("had", None, _all_same("*"), elementwise=True, kind="struct", associative=True, commutative=True,
       doc="Hadamard (componentwise) product A * B", numpy="({args_had})"),
    Op("t", 1, _transpose_shape, kind="struct", linear=(0,), doc="transpose A^t", numpy="{0}.mT"),
    Op("pow", 1, _scalar_only("power"), kind="struct", doc="a scalar to a rational power",
       numpy="({0}) ** ({exponent})"),
    Op("d", 1, _same_as_first, linear=(0,), differential=True, latex=r"\mathrm{d}",
       doc="the differential: a matrix of 1-forms"),
    Op("trace", 1, _trace_shape, linear=(0,), latex=r"\operatorname{trace}", doc="trace",
       numpy="np.trace({0}, axis1=-2, axis2=-1)[..., None, None]"),
    Op("m", 1, _same_as_first, elementwise=True, latex="m", doc="relu: negative entries set to zero",
       numpy="np.maximum({0}, 0.0)"),
    Op("a", 1, _same_as_first, latex="a", doc="row-wise softmax", numpy="_softmax({0})", one_column="all ones"),
    Op("mm", 2, same_shape_args("mm"), elementwise=True, linear=(1,), latex=r"\operatorname{mm}",
       doc="mm(A, B) = [A > 0] o B, so d(m(A)) = mm(A, d(A))", numpy="_mm({0}, {1})"),
    Op("aa", 2, same_shape_args("aa"), linear=(1,), latex=r"\operatorname{aa}",
       doc="aa(A, B) = S o (B - rowsum(S o B) 1^t), S = a(A), so d(a(A)) = aa(A, d(A))",
       numpy="_aa({0}, {1})"),
    Op("let", 1, _same_as_first, kind="struct", opaque=True,
       doc="a named intermediate (E := ...): prints as its name, evaluates as its body"),
    # ---- elementwise functions and division (issue 12) ----
    Op("ones", 0, _leaf, kind="struct", doc="the matrix of ones of a shape: s + A is s ones(n, d) + A"),
    Op("div", 2, _all_same("/"), elementwise=True, kind="struct", linear=(0,), positive=(1,), numpy="({0} / {1})",
       doc="componentwise division A / B (B of A's shape; by a scalar it is a scalar multiple)"),
    Op("exp", 1, _same_as_first, elementwise=True, latex=r"\exp", numpy="np.exp({0})", doc="componentwise exponential"),
    Op("log", 1, _same_as_first, elementwise=True, latex=r"\log", numpy="np.log({0})", positive=(0,),
       doc="componentwise natural logarithm"),
    Op("sqrt", 1, _same_as_first, elementwise=True, latex=r"\operatorname{sqrt}", numpy="np.sqrt({0})", positive=(0,),
       doc="componentwise square root"),
    Op("tanh", 1, _same_as_first, elementwise=True, latex=r"\tanh", numpy="np.tanh({0})", doc="componentwise tanh"),
    Op("sigmoid", 1, _same_as_first, elementwise=True, latex=r"\sigma", numpy="_sigmoid({0})",
       doc="componentwise logistic function 1 / (1 + exp(-A))"),
    Op("gelu", 1, _same_as_first, elementwise=True, latex=r"\operatorname{GELU}", numpy="_gelu({0})",
       doc="componentwise GELU, exact: A o Phi(A), Phi the standard normal CDF (torch.nn.GELU())"),
    # their derivatives: f'(A) o B, linear in B, so d(f(A)) = df(A, d(A))
    Op("dexp", 2, same_shape_args("dexp"), elementwise=True, linear=(1,), numpy="np.exp({0}) * {1}",
       doc="dexp(A, B) = exp(A) o B, so d(exp(A)) = dexp(A, d(A))"),
    Op("dlog", 2, same_shape_args("dlog"), elementwise=True, linear=(1,), numpy="{1} / {0}", positive=(0,),
       doc="dlog(A, B) = B / A, so d(log(A)) = dlog(A, d(A))"),
    Op("dsqrt", 2, same_shape_args("dsqrt"), elementwise=True, linear=(1,), numpy="{1} / (2.0 * np.sqrt({0}))",
       positive=(0,),
       doc="dsqrt(A, B) = B / (2 sqrt(A)), so d(sqrt(A)) = dsqrt(A, d(A))"),
    Op("dtanh", 2, same_shape_args("dtanh"), elementwise=True, linear=(1,), numpy="_dtanh({0}, {1})",
       doc="dtanh(A, B) = (1 - tanh(A) o tanh(A)) o B, so d(tanh(A)) = dtanh(A, d(A))"),
    Op("dsigmoid", 2, same_shape_args("dsigmoid"), elementwise=True, linear=(1,), numpy="_dsigmoid({0}, {1})",
       doc="dsigmoid(A, B) = sigmoid(A) o (1 - sigmoid(A)) o B, so d(sigmoid(A)) = dsigmoid(A, d(A))"),
    Op("dgelu", 2, same_shape_args("dgelu"), elementwise=True, linear=(1,), numpy="_dgelu({0}, {1})",
       doc="dgelu(A, B) = (Phi(A) + A o phi(A)) o B, so d(gelu(A)) = dgelu(A, d(A))"),
    Op("ddgelu", 2, same_shape_args("ddgelu"), elementwise=True, linear=(1,), numpy="_ddgelu({0}, {1})",
       doc="ddgelu(A, B) = phi(A) o (2 - A o A) o B, gelu's second derivative: "
           "d(dgelu(A, B)) = dgelu(A, d(B)) + ddgelu(A, d(A) * B)"),
    # ---- layer norm and log-softmax (row-wise) ----
    Op("layernorm", 1, _same_as_first, latex=r"\operatorname{layernorm}", numpy="_layernorm({0})",
       one_column="all zeros",
       doc="row-wise (A - rowmean(A) 1^t) / (sqrt(rowvar(A) + 1e-5) 1^t), no affine part (torch's LayerNorm)"),
    Op("dlayernorm", 2, same_shape_args("dlayernorm"), linear=(1,), numpy="_dlayernorm({0}, {1})",
       doc="the row Jacobian of layernorm at A applied to B (symmetric), so d(layernorm(A)) = dlayernorm(A, d(A))"),
    Op("ddlayernorm", 3, same_shape_args("ddlayernorm"), linear=(1, 2), numpy="_ddlayernorm({0}, {1}, {2})",
       doc="layernorm's second derivative at A on U and B (symmetric in every slot): "
           "d(dlayernorm(A, B)) = dlayernorm(A, d(B)) + ddlayernorm(A, d(A), B)"),
    Op("logsoftmax", 1, _same_as_first, latex=r"\operatorname{logsoftmax}", numpy="_logsoftmax({0})",
       one_column="all zeros",
       doc="row-wise log(a(A)) = A - log(rowsum(exp(A))) 1^t, computed stably (the row maximum first)"),
    Op("dlogsoftmax", 2, same_shape_args("dlogsoftmax"), linear=(1,), numpy="_dlogsoftmax({0}, {1})",
       doc="dlogsoftmax(A, B) = B - rowsum(a(A) o B) 1^t, so d(logsoftmax(A)) = dlogsoftmax(A, d(A))"),
    # ---- row reductions ----
    Op("rowsum", 1, _row_reduction, linear=(0,), rows=True, latex=r"\operatorname{rowsum}",
       numpy="{0}.sum(axis=-1, keepdims=True)", doc="the sums of the rows: (n x d) -> (n x 1)"),
    Op("rowmean", 1, _row_reduction, linear=(0,), rows=True, latex=r"\operatorname{rowmean}",
       numpy="{0}.mean(axis=-1, keepdims=True)", doc="the means of the rows: (n x d) -> (n x 1)"),
    Op("rowvar", 1, _row_reduction, rows=True, latex=r"\operatorname{rowvar}", one_column="all zeros",
       numpy="{0}.var(axis=-1, keepdims=True)",
       doc="the biased variances of the rows (as torch's LayerNorm): (n x d) -> (n x 1)"),
    # ---- constants made from a shape alone (the argument is dropped when the term is built) ----
    Op("onescol", 1, _ones_column, doc="onescol(A) = ones(cols(A), 1): A onescol(A) = rowsum(A)"),
    Op("onesrow", 1, _ones_row, doc="onesrow(A) = ones(1, cols(A)): rowmean(A) onesrow(A) has A's shape"),
    Op("cols", 1, _scalar_result, doc="the number of columns of A, as a scalar"),
    Op("eyerows", 1, _eye_rows, doc="eyerows(A) = eye(rows(A)), the unit before A in a word: a scalar c "
       "there stands for c eyerows(A), which a sum needs (c + B would add c to every entry)"),
]:
    register(_op)
