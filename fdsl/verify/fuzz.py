"""The differential fuzzer: random well-shaped programs, as a user writes them, each checked every
way fdsl computes gradients (``fdsl.verify.differential``), shrunk by Hypothesis when one disagrees.

Vocabulary
----------
program     fdsl source text: ``dim`` sizes, declarations, definitions with ``=`` and ``:=``, a
            function ``f(i, Z)`` over an indexed family, the model ``F``, its error ``E = Y - F``, the
            loss ``L = trace(E^t E) / 2`` and a 1-form ``w`` (``form(E)``, ``trace(E^t d(E))``,
            ``d(L)`` or a multiple: the ``sign`` in ``w = sign d(L)``). It goes through the real
            front end, so it keeps meaning the same thing while the internals change.
side        a side of a shape: the dims ``n``, ``d``, ``k`` (sizes 1 to 4, so dims of 1 occur) or the
            number 1 (row and column vectors).
kind        how an expression of a wanted shape is made: a leaf (weight, family member ``W[0]``,
            input, definition, ones, identity, zeros, the parameter ``Z``), a product (two factors,
            a constant scalar between them, a vector of ones on the right or the left, a column of
            ones times a row: a broadcast bias), a scalar multiple (numbers, ``s = k^(-1/2)``,
            dims as numbers, ``-A``, ``A / 2``, ``trace(S) A``), ``+``, ``-``, Hadamard ``*``, a
            transpose of a leaf or of a composite, an application ``f(j, A)`` (a residual when A is
            shared), every function-style operator of the operator table, and the uses of a
            onehot constant (below).
onehot      a constant ``Yrv : r x v onehot`` (v one of the dims: its vocabulary), given as ids, used
            as the lowering computes it without its one-hot matrix (``fdsl.codegen.onehot``):
            ``Yrv A`` (an embedding lookup; the gradient of a weight in A is a scatter),
            ``A Yrv^t``, ``Yvr^t A`` (a scatter), ``A + Yrv`` and ``A - Yrv`` (1 added at the ids),
            ``trace(Yrv^t A) B`` (a gather), ``rowsum(Yrv)`` (a column of ones), and the loss
            ``L = -trace(Yrv^t logsoftmax(F))``, a cross-entropy over ids, in place of ``E``'s; and
            ``Yrv * A``, which only the one-hot matrix computes (made from the ids for it).
            ``fdsl.verify.differential`` checks them on ids against the same program with their
            one-hot matrices. ``bench/fuzz.py --no-ids`` turns them off (``IDS``).
operators   read from ``fdsl.core.ops.OPS`` (after loading ``RULE_FILES``, whose operators programs use
            with a ``rules`` line): an operator whose shape rule keeps one common shape is
            generated with arguments of that shape; one the rules cannot differentiate (no d rule:
            ``d(op(W))`` stays after ``expandAll``) only with constant arguments. ``uncovered()``
            lists operators the fuzzer does not generate, with the reason: a new operator with a
            new kind of shape rule shows up there (and fails a test) until it is taught here.
case        one program and its seed for the values; a failure is a disagreement beyond the
            tolerances of ``fdsl.verify.differential`` or any exception.

``run(cases, seed)`` checks that many distinct programs, and for each failure lets Hypothesis shrink
it to a small program, which it returns (and prints, with ``bench/fuzz.py``). Hypothesis is a
dependency of this module only (``pip install hypothesis``, in the ``test`` extra).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Callable, Optional

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ..core import terms as T
from ..core.ops import OPS
from ..lang.program import parse
from .differential import Report, check

DIMS = ("n", "d", "k")
SIDES = DIMS + (1,)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: rule files whose operators the programs use (relative to EXAMPLES), when they are there
RULE_FILES = ("softplus.rules",)
#: operators that are never generated as function calls, and why
EXCLUDED = {
    "d": "the differential: programs differentiate only through the 1-form w",
    "trace": "generated as a scalar factor trace(S) A (its shape rule makes a scalar)",
    "onescol": "a constant made from its argument's shape alone (generated as ones)",
    "onesrow": "a constant made from its argument's shape alone (generated as ones)",
    "cols": "a constant made from its argument's shape alone (generated as dims used as numbers)",
    "eyerows": "a constant made from its argument's shape alone (generated as identities)",
}
#: constant scalars, as a user writes them before a factor
CONSTANTS = ("2", "(1/2)", "s", "n", "(-3)", "(2/3)", "k")
MAX_DEPTH = 4
#: whether ``trace(S) A`` may have weights in S: the differential then ends up in a scalar factor,
#: trace(X dU) trace(E^t X), which the stdlib's scalar-in-d brings into one trace.
#: ``bench/fuzz.py --no-weight-traces`` turns it off.
WEIGHT_TRACES = True
#: whether programs use onehot constants given as ids (see the module doc); ``bench/fuzz.py --no-ids``
#: turns it off (the programs of the runs before 2027-01)
IDS = True


# ---- the operator table ---------------------------------------------------------------------------


@dataclass
class OpInfo:
    name: str
    arity: int
    differentiable: bool
    rules: Optional[str] = None  # the rule file that declares it
    rows: bool = False  # a row reduction: (r x c) -> (r x 1)
    positive: tuple = ()  # argument positions that must be positive (log, sqrt): given 1 + A * A


_OPS: Optional[dict] = None
_UNCOVERED: dict = {}


def operators() -> dict:
    """Name -> OpInfo of every function-style operator the programs use (loads RULE_FILES once)."""
    global _OPS
    if _OPS is not None:
        return _OPS
    origin: dict = {}
    for name in RULE_FILES:
        path = EXAMPLES / name
        if not path.exists():
            continue
        for op in parse('rules "%s"\n' % name, "<fuzz>", EXAMPLES).rulebook.operators.values():
            origin.setdefault(op, name)  # (a file the earlier ones import declared it first)
    probe = parse("".join('rules "%s"\n' % f for f in sorted(set(origin.values()))) +
                  "dim p = 2, q = 3\nweight P : p x q\n", "<fuzz>", EXAMPLES)
    weight = probe.symbols["P"]
    found = {}
    own = set(probe.rulebook.operators.values())  # (other programs' operators are not the probe's)
    for op, spec in OPS.items():
        if spec.kind != "function" or op in EXCLUDED or (spec.user and op not in own):
            continue
        if spec.numpy is None:
            _UNCOVERED[op] = "no numpy implementation"
            continue
        arity = spec.arity
        if spec.rows and arity == 1:
            found[op] = OpInfo(spec.shown, 1, True, origin.get(op), rows=True)
            continue
        if arity is None or not _keeps_shape(spec, weight, arity):
            _UNCOVERED[op] = "its shape rule does not keep one common shape: teach fdsl/verify/fuzz.py its shapes"
            continue
        term = T.make(op, [weight] * arity)
        expanded = probe.apply_rules("expandAll", T.d(term))
        differentiable = not any(n.op == "d" and n.args[0].op != "sym" for n in T.postorder(expanded))
        found[op] = OpInfo(spec.shown, arity, differentiable, origin.get(op), positive=spec.positive)
    _OPS = found
    return found


def _keeps_shape(spec, weight, arity) -> bool:
    try:
        return spec.shape([weight] * arity) == (weight.shape, False)
    except Exception:  # a shape rule that refuses the same shape everywhere: not of this kind
        return False


def uncovered() -> dict:
    """Operators of the table that the fuzzer does not generate: name -> reason."""
    operators()
    out = dict(EXCLUDED)
    out.update(_UNCOVERED)
    return {op: why for op, why in out.items() if op in OPS}


# ---- programs -------------------------------------------------------------------------------------


@dataclass
class Case:
    """A generated program and what it claims: ``w = sign d(L)``."""

    source: str
    sign: Fraction
    seed: int
    rules: tuple = ()

    def __str__(self) -> str:
        return "# values: seed %d; w = %s d(L)\n%s" % (self.seed, self.sign, self.source)


@dataclass
class _Context:
    draw: Callable
    sizes: dict
    weights: set = field(default_factory=set)  # shapes of plain weights Uab
    families: set = field(default_factory=set)  # shapes of families Wab[i]
    inputs: set = field(default_factory=set)
    ones: set = field(default_factory=set)  # shapes of ones matrices Jab (vectors included)
    identities: set = field(default_factory=set)
    onehots: set = field(default_factory=set)  # shapes (rows, vocabulary) of onehot constants Yrv
    defs: list = field(default_factory=list)  # (name, shape)
    rules: set = field(default_factory=set)
    layer: Optional[tuple] = None  # the shape of f(i, Z)
    in_layer: bool = False  # generating f's body: Z and W[i] are in scope
    const: bool = False  # no weights (arguments of operators without a d rule)
    scalars: bool = False  # s = k^(-1/2) is used


def _code(side) -> str:
    return str(side)


def _name(prefix, shape) -> str:
    return prefix + _code(shape[0]) + _code(shape[1])


def _paren(text: str) -> str:
    return text if text.replace("_", "").isalnum() else "(%s)" % text


def _leaf(ctx: _Context, shape) -> str:
    # weights first (Hypothesis shrinks towards the first choice) and most often: a program
    # without weights checks nothing; zeros are rare (they make terms vanish)
    options = []
    if not ctx.const:
        options += ["weight", "family", "weight"]
        options += ["def", "def"] * bool([n for n, s in ctx.defs if s == shape])
        options += ["Z", "Z"] * (ctx.in_layer and shape == ctx.layer)
    options += ["input", "input", "ones"] + ["identity"] * (shape[0] == shape[1])
    kind = ctx.draw(st.sampled_from(options + ["zeros"] * (ctx.draw(st.integers(0, 15)) == 15)))
    if kind == "weight":
        ctx.weights.add(shape)
        return _name("U", shape)
    if kind == "family":
        ctx.families.add(shape)
        index = "i" if ctx.in_layer else str(ctx.draw(st.integers(0, 1)))
        return "%s[%s]" % (_name("W", shape), index)
    if kind == "input":
        ctx.inputs.add(shape)
        return _name("X", shape)
    if kind == "def":
        return ctx.draw(st.sampled_from([n for n, s in ctx.defs if s == shape]))
    if kind == "Z":
        return "Z"
    if kind == "ones":
        ctx.ones.add(shape)
        return _name("J", shape)
    if kind == "identity":
        side = shape[0]
        if ctx.draw(st.booleans()):
            ctx.identities.add(side)
            return "I%s" % _code(side)
        return "eye(%s)" % side
    return "zeros(%s, %s)" % shape


def _side(ctx: _Context):
    return ctx.draw(st.sampled_from(SIDES))


def _constant(ctx: _Context) -> str:
    c = ctx.draw(st.sampled_from(CONSTANTS))
    ctx.scalars |= c == "s"
    return c


def _kinds(ctx: _Context, shape, depth) -> list:
    if depth <= 0:
        return ["leaf"]
    kinds = ["leaf", "product", "scaled", "sum", "difference", "negation", "hadamard", "transpose",
             "scalar-between", "divided", "trace-scaled"]
    if shape[1] == 1:
        kinds.append("ones-right")
    if shape[0] == 1:
        kinds.append("ones-left")
    if shape[0] != 1:
        kinds.append("broadcast")
    if ctx.layer == shape and not ctx.in_layer and not ctx.const:
        kinds.append("layer")
    one_column = ctx.sizes.get(shape[1], shape[1]) == 1
    for op, info in sorted(operators().items()):
        if one_column and OPS[op].one_column:
            continue  # refused: a row-wise operator of one column is a constant (a(x) = 1)
        if not info.rows or shape[1] == 1:  # a row reduction makes a column
            kinds.append("op:" + op)
    if IDS:  # last: Hypothesis shrinks towards the kinds above
        kinds += ["ids-lookup", "ids-lookup-right", "ids-trace"]
        if shape[0] in DIMS:
            kinds.append("ids-scatter")
        if shape[1] in DIMS:
            kinds += ["ids-add", "ids-had"]
        if shape[1] == 1:
            kinds.append("ids-rowsum")
    return kinds


def _onehot(ctx: _Context, rows, vocab) -> str:
    """The name of the onehot constant of ``rows`` ids in [0, ``vocab``) (declared at the end)."""
    ctx.onehots.add((rows, vocab))
    return _name("Y", (rows, vocab))


def _ids_expression(ctx: _Context, kind: str, shape, sub) -> str:
    """An expression of ``shape`` that uses a onehot constant as the lowering computes it (see the
    module doc)."""
    r, c = shape
    if kind == "ids-lookup":  # X A: the rows of A at the ids
        vocab = ctx.draw(st.sampled_from(DIMS))
        return "%s %s" % (_onehot(ctx, r, vocab), sub((vocab, c)))
    if kind == "ids-lookup-right":  # A X^t = (X A^t)^t
        vocab = ctx.draw(st.sampled_from(DIMS))
        return "%s %s^t" % (sub((r, vocab)), _onehot(ctx, c, vocab))
    if kind == "ids-scatter":  # X^t A: the rows of A added at the ids
        rows = _side(ctx)
        return "%s^t %s" % (_onehot(ctx, rows, r), sub((rows, c)))
    if kind == "ids-add":  # A + X, A - X: 1 added (taken) at the ids
        y = _onehot(ctx, r, c)
        return ctx.draw(st.sampled_from(["%s + %s", "%s - %s", "%s + %s"])) % (
            (sub(shape), y) if ctx.draw(st.booleans()) else (y, sub(shape)))
    if kind == "ids-had":  # X * A: a use only the one-hot matrix computes (made from the ids for it)
        y = _onehot(ctx, r, c)
        return "(%s * %s)" % ((sub(shape), y) if ctx.draw(st.booleans()) else (y, sub(shape)))
    if kind == "ids-rowsum":  # a column of ones, whatever the ids
        return "rowsum(%s)" % _onehot(ctx, r, ctx.draw(st.sampled_from(DIMS)))
    # ids-trace: trace(X^t A) B, the sum of A's entries at the ids (the cross-entropy's gather)
    rows, vocab = _side(ctx), ctx.draw(st.sampled_from(DIMS))
    const = ctx.const
    ctx.const = const or not WEIGHT_TRACES  # see WEIGHT_TRACES
    try:
        picked = _paren(expression(ctx, (rows, vocab), 0 if ctx.const else 1))
    finally:
        ctx.const = const
    return "trace(%s^t %s) %s" % (_onehot(ctx, rows, vocab), picked, sub(shape))


def expression(ctx: _Context, shape, depth: int) -> str:
    """Text of a random well-shaped expression of ``shape``."""
    kind = ctx.draw(st.sampled_from(_kinds(ctx, shape, depth)))
    sub = lambda s: _paren(expression(ctx, s, depth - 1))  # noqa: E731
    r, c = shape
    if kind == "leaf":
        return _leaf(ctx, shape)
    if kind == "product":
        inner = _side(ctx)
        return "%s %s" % (sub((r, inner)), sub((inner, c)))
    if kind == "scalar-between":
        inner = _side(ctx)
        return "%s %s %s" % (sub((r, inner)), _constant(ctx), sub((inner, c)))
    if kind == "scaled":
        return "%s %s" % (_constant(ctx), sub(shape))
    if kind == "divided":
        return "%s / %s" % (sub(shape), _constant(ctx))
    if kind == "negation":
        return "-%s" % sub(shape)
    if kind == "sum":
        return "%s + %s" % (sub(shape), sub(shape))
    if kind == "difference":
        return "%s - %s" % (sub(shape), sub(shape))
    if kind == "hadamard":
        return "%s * %s" % (sub(shape), sub(shape))
    if kind == "transpose":
        return "%s^t" % sub((c, r))
    if kind == "trace-scaled":
        side = _side(ctx)
        const = ctx.const
        ctx.const = const or not WEIGHT_TRACES  # see WEIGHT_TRACES
        try:
            scalar = expression(ctx, (side, side), depth - 1)
        finally:
            ctx.const = const
        return "trace(%s) %s" % (scalar, sub(shape))
    if kind == "ones-right":
        inner = _side(ctx)
        ctx.ones.add((inner, 1))
        return "%s %s" % (sub((r, inner)), _name("J", (inner, 1)))
    if kind == "ones-left":
        inner = _side(ctx)
        if ctx.draw(st.booleans()):
            ctx.ones.add((inner, 1))
            return "%s^t %s" % (_name("J", (inner, 1)), sub((inner, c)))
        ctx.ones.add((1, inner))
        return "%s %s" % (_name("J", (1, inner)), sub((inner, c)))
    if kind == "broadcast":
        ctx.ones.add((r, 1))
        return "%s %s" % (_name("J", (r, 1)), sub((1, c)))
    if kind == "layer":
        return "f(%d, %s)" % (ctx.draw(st.integers(0, 1)), expression(ctx, shape, depth - 1))
    if kind.startswith("ids-"):
        return _ids_expression(ctx, kind, shape, sub)
    info = operators()[kind[3:]]
    if info.rules:
        ctx.rules.add(info.rules)
    const = ctx.const
    ctx.const = const or not info.differentiable
    try:
        if info.rows:
            args = [expression(ctx, (r, _side(ctx)), depth - 1)]
        else:
            args = [expression(ctx, shape, depth - 1) for _ in range(info.arity)]
    finally:
        ctx.const = const
    for i in info.positive:  # log, sqrt: an argument of the form 1 + A * A
        args[i] = "1 + %s * %s" % (_paren(args[i]), _paren(args[i]))
    return "%s(%s)" % (info.name, ", ".join(args))


_LOSSES = (  # (w, sign): w = sign d(L) with L = trace(E^t E) / 2
    ("form(E)", Fraction(-1)),
    ("trace(E^t d(E))", Fraction(1)),
    ("d(L)", Fraction(1)),
    ("trace(d(E)^t E) / 2 - form(E) / 2", Fraction(1)),
    ("3 form(E)", Fraction(-3)),
)
_CROSS_ENTROPY = (  # (w, sign): w = sign d(L) with L = -trace(Y^t logsoftmax(F))
    ("d(L)", Fraction(1)),
    ("-d(L)", Fraction(-1)),
    ("2 d(L)", Fraction(2)),
)


@st.composite
def programs(draw) -> Case:
    """A random program (see the module doc)."""
    sizes = {name: draw(st.integers(1, 4)) for name in DIMS}
    ctx = _Context(draw, sizes)
    lines = []
    if draw(st.booleans()):  # a function over an indexed family, applied in the model
        ctx.layer = (draw(st.sampled_from(SIDES)), draw(st.sampled_from(SIDES)))
        ctx.in_layer = True
        body = expression(ctx, ctx.layer, draw(st.integers(1, 3)))
        ctx.in_layer = False
        residual = draw(st.booleans())
        lines.append("f(i, Z) = %s" % (("Z + " + _paren(body)) if residual else body))
    for j in range(draw(st.integers(0, 3))):
        shape = (draw(st.sampled_from(SIDES)), draw(st.sampled_from(SIDES)))
        body = expression(ctx, shape, draw(st.integers(1, 3)))
        name = "H%d" % j
        lines.append("%s %s %s" % (name, draw(st.sampled_from([":=", "="])), body))
        ctx.defs.append((name, shape))
    # the cross-entropy over ids last (Hypothesis shrinks towards the squared error)
    cross_entropy = IDS and draw(st.sampled_from([False, False, True]))
    shape = (draw(st.sampled_from(SIDES)), draw(st.sampled_from(DIMS if cross_entropy else SIDES)))
    if cross_entropy and sizes[shape[1]] == 1:  # logsoftmax of one column: refused (it is 0)
        cross_entropy = False
    lines.append("F = %s" % expression(ctx, shape, draw(st.integers(1, MAX_DEPTH))))
    if cross_entropy:  # the loss of a language model: the next tokens as ids
        lines.append("L = -trace(%s^t logsoftmax(F))" % _onehot(ctx, *shape))
        w, sign = draw(st.sampled_from(_CROSS_ENTROPY))
    else:
        ctx.inputs.add(shape)
        lines.append("E %s %s" % (draw(st.sampled_from([":=", "="])),
                                  draw(st.sampled_from(["%s - F", "F - %s"])) % _name("X", shape)))
        lines.append("L = trace(E^t E) / 2")
        w, sign = draw(st.sampled_from(_LOSSES))
    lines.append("w = %s" % w)
    head = ['rules "%s"' % f for f in sorted(ctx.rules)]
    head.append("dim " + ", ".join("%s = %d" % kv for kv in sizes.items()))
    if ctx.scalars:
        head.append("scalar s = k^(-1/2)")
    head += ["const %s : %s x %s" % ((_name("X", s),) + s) for s in sorted(ctx.inputs, key=str)]
    head += ["const %s : %s x %s onehot" % ((_name("Y", s),) + s) for s in sorted(ctx.onehots, key=str)]
    head += ["const %s : %s x %s = ones" % ((_name("J", s),) + s) for s in sorted(ctx.ones, key=str)]
    head += ["const I%s : %s x %s = identity" % (s, s, s) for s in sorted(ctx.identities, key=str)]
    head += ["weight %s : %s x %s" % ((_name("U", s),) + s) for s in sorted(ctx.weights, key=str)]
    head += ["weight %s[i] : %s x %s" % ((_name("W", s),) + s) for s in sorted(ctx.families, key=str)]
    return Case("\n".join(head + lines) + "\n", sign, draw(st.integers(0, 2 ** 16)), tuple(sorted(ctx.rules)))


# ---- checking and running -------------------------------------------------------------------------


class Disagreement(AssertionError):
    """A case whose methods disagree (the report says how)."""


def check_case(case: Case, **options) -> Report:
    """``fdsl.verify.differential.check`` of a generated case; raises Disagreement when it fails."""
    report = check(case.source, sign=case.sign, seed=case.seed, base_dir=EXAMPLES, **options)
    if not report.ok:
        raise Disagreement("%s\n%s" % (case, report.describe()))
    return report


@dataclass
class Failure:
    case: Case  # shrunk
    error: BaseException

    def __str__(self) -> str:
        if isinstance(self.error, Disagreement):  # its message starts with the case
            return str(self.error)
        return "%s\n%s: %s" % (self.case, type(self.error).__name__, self.error)


@dataclass
class Summary:
    cases: int = 0
    failures: list = field(default_factory=list)
    fd_checked: int = 0
    fd_refined: int = 0  # of those, weights whose finite difference needed a finer step
    skipped: dict = field(default_factory=dict)  # reason -> count
    worst: float = 0.0  # the largest disagreement seen among passing cases (relative to the scale)
    seconds: float = 0.0


_SETTINGS = dict(deadline=None, database=None, print_blob=False, report_multiple_bugs=False,
                 suppress_health_check=list(HealthCheck))


def run(cases: int, seed: int = 0, batch: int = 500, shrink: int = 5, progress=None,
        check_options: Optional[dict] = None) -> Summary:
    """Check ``cases`` distinct programs. Every failure is kept; the first ``shrink`` of them are
    shrunk by Hypothesis first (a broken lowering fails nearly every program: shrinking them all
    would take long and print the same small program many times)."""
    summary = Summary()
    start = time.perf_counter()
    options = check_options or {}
    seen: set = set()  # sources checked (each counts once)
    known: set = set()  # sources of failures already reported: later rounds pass over them
    round_ = 0
    while summary.cases < cases:
        last: dict = {}
        before = summary.cases

        def test(case):
            if last.get("failed"):  # Hypothesis is shrinking the failure: nothing is counted
                last["case"] = case
                check_case(case, **options)
                return
            if case.source in known or summary.cases >= cases:
                return  # a failure already reported, or enough programs checked
            last["case"] = case
            if case.source not in seen:
                seen.add(case.source)
                summary.cases += 1
            try:
                report = check_case(case, **options)
            except BaseException:
                last["failed"] = True  # generation stops at the first failure; shrinking follows
                raise
            summary.fd_checked += report.checked_fd
            summary.fd_refined += report.refined_fd
            if not any(method == "every method" for method, _ in report.skipped):  # a kink: not compared
                summary.worst = max(summary.worst, _closeness(report))
            for method, _ in report.skipped:
                summary.skipped[method] = summary.skipped.get(method, 0) + 1

        phases = [Phase.generate] + [Phase.shrink] * (len(summary.failures) < shrink)
        runner = settings(max_examples=max(batch, 1), phases=phases, **_SETTINGS)(given(programs())(test))
        try:
            _seeded(runner, seed * 1000003 + round_)()
        except Exception as error:  # Hypothesis ends with the last (shrunk) failing program
            known.add(last["case"].source)
            summary.failures.append(Failure(last["case"], error))
            if progress:
                progress(summary, summary.failures[-1])
        else:
            if progress:
                progress(summary, None)
        if summary.cases == before and round_ > cases + 10:
            break  # no new programs: the stream is exhausted
        round_ += 1
    summary.seconds = time.perf_counter() - start
    return summary


def _seeded(test, seed):
    from hypothesis import seed as hseed

    return hseed(seed)(test)


def _closeness(report: Report) -> float:
    """The largest difference of any exact method from the reference, relative to the scale."""
    import numpy as np

    ref = report.gradients[report.reference]
    worst = max(report.batch_closeness.values(), default=0.0)
    for grads in report.gradients.values():
        for n, g in grads.items():
            if g.size:
                worst = max(worst, float(np.max(np.abs(g - ref[n]))) / report.scale)
    return worst

